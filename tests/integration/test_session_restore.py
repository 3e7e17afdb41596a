"""A session restored from the store (after a restart, or on another replica) is one object in this process, however
many of its requests arrive at once: the fault schedules' SIGKILL restarts found two, a call's live stream registered
on one and a resume looking on the other, which settled the running call as "execution lost" by its own process."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from mcp_lossless.core.principal import Principal
from mcp_lossless.server.sessions import SessionRegistry
from mcp_lossless.stores.sqlite import SqliteStore

pytestmark = pytest.mark.anyio

PRINCIPAL = Principal("https://as.example", "alice", "client")


async def test_concurrent_lookups_of_a_restored_session_find_one_session(tmp_path: Path) -> None:
    path = str(tmp_path / "sessions.db")
    before = SqliteStore(path)
    await before.open()
    created = await SessionRegistry(before).create(PRINCIPAL, "2025-11-25", 0.0)
    await before.close()
    store = SqliteStore(path)  # the process restarted: it holds no session until a request names one
    await store.open()
    try:
        registry = SessionRegistry(store)
        found = await asyncio.gather(*(registry.find(created.id, PRINCIPAL) for _ in range(3)))
        assert found[0] is not None and all(session is found[0] for session in found)
        assert registry.all() == [found[0]]
    finally:
        await store.close()
