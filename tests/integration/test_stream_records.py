"""A call's stream record is queued with its first events (one SQLite transaction), yet no event id of the stream
reaches the client before the record is stored; a record that cannot be stored is an explicit in-band error
without any id. The real server over HTTP on a real SQLite file."""

from __future__ import annotations

import asyncio
import re
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from mcp_lossless.core.errors import DELIVERY_REFUSED
from mcp_lossless.server import ServerConfig, ToolContext, ToolRegistry, create_app
from mcp_lossless.stores.sqlite import SqliteStore
from tests.support.mcp_http import Peer, call
from tests.support.uvicorn_server import serve_app

pytestmark = pytest.mark.anyio

TURNS = 50
"""Loop turns the gated call gives the server before it lets the store write: a writer started for a working call
sends its first bytes within a few (it starts on the turn after the call suspends, then yields once)."""


class GatedStore(SqliteStore):
    """A SQLite store whose writer thread waits before each batch while ``gate`` is shut: the window in which a
    stream's record is queued but not yet stored, held open as long as the test needs."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.gate = threading.Event()
        self.gate.set()
        self.batches = 0
        """Batches with writes the thread ran (each one transaction)."""

    def _serve(self, db: sqlite3.Connection, batch: list[Any], loop: asyncio.AbstractEventLoop) -> bool:
        self.gate.wait()
        committed = super()._serve(db, batch, loop)
        self.batches += committed
        return committed


class Witness:
    """An ASGI wrapper that, each time the server sends bytes carrying an SSE ``id:``, asks the file (a connection of
    its own) whether it holds the record of every stream those ids name."""

    def __init__(self, app: Any, path: Path) -> None:
        self.app = app
        self.path = path
        self.sent: list[tuple[str, bool]] = []
        """Each id sent, and whether the file held its stream's record at that moment."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def witnessed(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.body":
                ids = re.findall(rb"(?m)^id: (\S+)$", message.get("body", b""))
                if ids:
                    witness = sqlite3.connect(self.path)
                    try:
                        held = {row[0] for row in witness.execute("SELECT stream FROM streams")}
                    finally:
                        witness.close()
                    for raw in ids:
                        event_id = raw.decode()
                        self.sent.append((event_id, any(event_id.startswith(f"{key}.") for key in held)))
            await send(message)

        await self.app(scope, receive, witnessed)


def tools_for(store: GatedStore) -> ToolRegistry:
    tools = ToolRegistry()

    @tools.tool()
    async def gated(ctx: ToolContext) -> str:
        """Lets the server run ``TURNS`` loop turns while the store is held, then lets it write and reports once."""
        for _ in range(TURNS):
            await asyncio.sleep(0)  # loop turns, not time: what a writer started meanwhile would send, it sends now
        store.gate.set()
        await ctx.report_progress(1, 1)
        return "done"

    @tools.tool()
    async def echo(text: str) -> str:
        """Answers at once."""
        return text

    return tools


@pytest.fixture
def gated(tmp_path: Path) -> Iterator[tuple[str, GatedStore, Witness]]:
    path = tmp_path / "records.db"
    store = GatedStore(str(path))
    witness = Witness(create_app(ServerConfig(store="memory", issuer=None), tools_for(store), store=store), path)
    with serve_app(witness, lifespan="on") as base:
        try:
            yield base, store, witness
        finally:
            store.gate.set()  # a failed test must not leave the writer thread waiting: the server could not stop


async def test_no_id_of_a_stream_is_sent_before_its_record_is_stored(
    gated: tuple[str, GatedStore, Witness], http: httpx.AsyncClient
) -> None:
    """The record is queued, not awaited, so the call runs while it is being written; a writer started for the
    working call holds the priming event (and everything after it) until the record is in the file."""
    base, store, witness = gated
    peer = Peer(http, base)
    await peer.initialize()
    store.gate.clear()  # from here the store writes nothing until the call lets it
    with anyio.fail_after(10):
        read = await peer.post(call(1, "gated", progress="p"))
    assert read.status == 200
    assert read.messages[-1]["result"]["content"][0]["text"] == "done"
    assert len(read.ids) == 3  # priming, progress, result
    assert [event_id for event_id, _held in witness.sent] == read.ids
    assert all(held for _event_id, held in witness.sent), f"ids sent before their stream's record: {witness.sent}"


async def test_a_call_answered_at_once_is_one_transaction(
    gated: tuple[str, GatedStore, Witness], http: httpx.AsyncClient
) -> None:
    """The stream's record and the answer go to the file in one write (two before: the record was awaited first)."""
    base, store, witness = gated
    peer = Peer(http, base)
    await peer.initialize()
    before = store.batches
    with anyio.fail_after(10):
        read = await peer.post(call(1, "echo", text="hi"))
    assert read.messages[-1]["result"]["content"][0]["text"] == "hi"
    assert store.batches - before == 1
    assert all(held for _event_id, held in witness.sent)


async def test_a_record_the_store_cannot_write_is_an_explicit_error_without_an_id(
    gated: tuple[str, GatedStore, Witness], http: httpx.AsyncClient, tmp_path: Path
) -> None:
    """Another process holds the file's write lock past the busy timeout: the record (and the answer queued with it)
    fail, and the response says so in band, per request, with no id at all (there is no stream to resume), instead
    of a priming id the store never held. The server goes on once the file is free."""
    base, _store, witness = gated
    peer = Peer(http, base)
    await peer.initialize()
    blocker = sqlite3.connect(tmp_path / "records.db", isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        with anyio.fail_after(10):
            read = await peer.post(call(1, "echo", text="hi"))
        blocker.execute("ROLLBACK")
    finally:
        blocker.close()
    assert read.status == 200
    assert read.ids == [] and witness.sent == []
    (error,) = read.messages
    assert error["id"] == 1 and error["error"]["code"] == DELIVERY_REFUSED
    assert error["error"]["data"]["reason"] == "store_unavailable"
    assert error["error"]["data"]["lastEventId"] is None
    assert "cannot be resumed" in error["error"]["message"]
    with anyio.fail_after(10):
        again = await peer.post(call(2, "echo", text="again"))
    assert again.messages[-1]["result"]["content"][0]["text"] == "again"
    assert all(held for _event_id, held in witness.sent)
