"""The server's errors: one root, and the HTTP refusal that checks raise where they find a problem.

A refusal is raised by the check that finds it and rendered once, by :meth:`.transport.Transport.__call__`
(as Starlette renders an ``HTTPException``), so a request handler reads as the list of checks the protocol
makes, in the protocol's order (docs/decisions/0010). Nothing is raised once a response has started: after
that, what cannot be delivered is said in band (docs/decisions/0003).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..asgi import Send, respond_json
from ..core import frames
from ..core.events import RequestId
from ..core.limits import LimitExceeded


class ServerError(Exception):
    """Root of the errors the server raises on purpose."""


def rpc_error(code: int, message: str, request_id: RequestId | None = None, data: Any = None) -> dict[str, Any]:
    """The body of an HTTP-level refusal: a JSON-RPC error, so stock clients can read it."""
    return frames.error_message(request_id, code, message, data)


class Refused(ServerError):
    """An HTTP answer that refuses the request: status, JSON body, headers."""

    def __init__(self, status: int, body: Any, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        super().__init__(status, body)
        self.status = status
        self.body = body
        self.headers = list(headers)

    @classmethod
    def rpc(
        cls,
        status: int,
        code: int,
        message: str,
        *,
        data: Any = None,
        request_id: RequestId | None = None,
        headers: Iterable[tuple[bytes, bytes]] = (),
    ) -> Refused:
        """A refusal whose body is a JSON-RPC error (what an MCP client reads)."""
        return cls(status, rpc_error(code, message, request_id, data), headers)

    @classmethod
    def over(cls, exceeded: LimitExceeded) -> Refused:
        """A refusal past a limit (:mod:`mcp_lossless.core.limits`): its status, body and ``Retry-After``."""
        return cls(exceeded.status, exceeded.body(), exceeded.headers())

    async def render(self, send: Send) -> None:
        await respond_json(send, self.status, self.body, self.headers)
