"""A key whose first use never ran, left in a server's store as a failover can leave it (docs/reliability.md,
finding 8): the key and its stream's record written, owned by the live server, and no call running there (the write
reached a primary that then died, the 503 refused the request, and the compare-and-delete found no primary)."""

from __future__ import annotations

import asyncio
from typing import Any

from mcp_lossless.core.events import PendingRequest, StreamKind, StreamRecord
from mcp_lossless.core.idempotency import KeyRecord, StreamTarget, argument_hash
from mcp_lossless.core.principal import Principal
from mcp_lossless.server.app import LosslessApp
from mcp_lossless.server.keys import stream_key
from mcp_lossless.server.observability import now


async def leave_orphan_key(
    app: LosslessApp, principal: Principal, key: str, tool: str, arguments: dict[str, Any], session_id: str | None
) -> str:
    """Store ``key`` with a stream owned by ``app``'s process that nothing there runs; its stream. ``session_id``:
    the legacy session the POST came on (``None``: a 2026-07-28 call's, whose stream is its own session)."""
    state = app.state
    stream = stream_key()
    pending = PendingRequest(1, "tools/call", tool, state.tool_tags[tool])
    record = StreamRecord(session_id or stream, stream, StreamKind.POST, state.instance, (pending,), 0)

    async def store() -> None:  # on the server's loop: a store's futures belong to it
        at = now()
        target = StreamTarget(stream, 1)
        keys = [KeyRecord(principal, key, tool, argument_hash(arguments), target, at, at + 3600)]
        await state.store.enqueue_open(record, keys)

    await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(store(), state.loop))
    return stream
