"""Issue 29 acceptance 1-3 over real HTTP with real signed JWTs: ``tasks/stream`` (SEP-2694) replays and follows a
task's events under the token of the request, exactly once each, and ends explicitly (docs/decisions/0031)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from mcp_lossless.core.errors import INVALID_PARAMS, TASK_DENIED, TASK_EXECUTION_LOST
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.stores.base import EventStore
from mcp_lossless.stores.memory import MemoryStore
from tests.integration.conftest import CLIENTS
from tests.support.mcp_http import StreamRead, dev_token, parse_sse
from tests.support.modern_http import ModernPeer, answer, poll_until_settled
from tests.support.processes import cli_server
from tests.support.stores import KINDS, store_of_kind
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio
PROGRESS = "io.github.mcp-lossless.task.progress"
OUTCOME = "io.github.mcp-lossless.task.outcome"


def serve(store: EventStore) -> Iterator[str]:
    def make(port: int) -> object:
        return create_app(ServerConfig(port=port, store="memory", dev_clients=CLIENTS), store=store)

    with lossless_server(make) as url:
        yield url


@pytest.fixture(params=KINDS)
def any_store_base(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    yield from serve(store_of_kind(request, tmp_path, "ts"))


async def stream(peer: ModernPeer, task_id: str, after: int | None = None, *, token: str | None = None,
                 cut_after_progress: int | None = None) -> StreamRead:  # fmt: skip
    """``tasks/stream``; with ``cut_after_progress`` the connection is dropped once that many progress events came."""
    params: dict[str, Any] = {"taskId": task_id}
    if after is not None:
        params["after"] = after
    message = peer.message("tasks/stream", params)
    headers = peer.headers(message, token)
    async with peer.http.stream("POST", peer.url, content=orjson.dumps(message), headers=headers) as response:
        read = StreamRead(response.status_code, headers=response.headers)
        if not response.headers.get("content-type", "").startswith("text/event-stream"):
            read.body = await response.aread()
            return read
        text, seen = "", 0
        async for chunk in response.aiter_text():
            text += chunk
            read.events = parse_sse(text[: text.rfind("\n\n") + 2])
            seen = sum(1 for m in read.messages if m.get("params", {}).get("type") == PROGRESS)
            if cut_after_progress is not None and seen >= cut_after_progress:
                break  # the cut: the client leaves mid-stream
        return read


def events_of(read: StreamRead) -> list[dict[str, Any]]:
    return [m["params"] for m in read.messages if m.get("method") == "notifications/tasks/event"]


async def test_a_narrowed_resume_is_denied_then_a_covering_one_gets_the_rest_once(
    http: httpx.AsyncClient, any_store_base: str
) -> None:
    """Acceptance 1, on every store."""
    base = any_store_base
    mcp = f"{base}/mcp"
    aggregate = await dev_token(http, base, mcp)
    narrowed = await dev_token(http, base, f"{mcp}/tools/search")
    peer = ModernPeer(http, base, aggregate)
    created = answer(await peer.call("fetch", url="https://example.com/a", steps=6, delay_ms=50))["result"]
    task_id = created["taskId"]

    first = await stream(peer, task_id, cut_after_progress=2)
    seen = events_of(first)
    assert [e["seq"] for e in seen] == list(range(len(seen))), "seq from 0, +1 each"
    assert all(e["taskId"] == task_id and e["_meta"]["io.modelcontextprotocol/related-task"] == {"taskId": task_id}
               for e in seen)  # fmt: skip
    cursor = seen[-1]["seq"]

    denied = await stream(peer, task_id, cursor, token=narrowed)
    assert denied.status == 403 and f'resource="{mcp}/tools/fetch"' in denied.headers["www-authenticate"]
    assert b"fetch step" not in denied.body and b"contents of" not in denied.body, "0 fetch events"
    error = orjson.loads(denied.body)["error"]
    assert error["code"] == TASK_DENIED
    assert error["data"]["taskId"] == task_id and error["data"]["lastSeq"] == cursor
    assert error["data"]["requiredResources"] == [f"{mcp}/tools/fetch"] and error["data"]["resumable"] is True
    assert error["data"]["authorization"]["reason"] == "insufficient_authorization"

    rest = await stream(peer, task_id, cursor)
    tail = events_of(rest)
    assert [e["seq"] for e in tail] == list(range(cursor + 1, cursor + 1 + len(tail))), "each remaining seq once"
    assert [e["type"] for e in tail].count(PROGRESS) == 6 - 2
    assert tail[-1]["type"] == OUTCOME and tail[-1]["payload"]["status"] == "completed"
    assert tail[-1]["payload"]["result"]["content"][0]["text"] == "contents of https://example.com/a: 21 bytes"
    assert rest.messages[-1]["result"] == {"resultType": "complete"}, "then the end"

    again = await stream(peer, task_id, tail[-1]["seq"])
    assert events_of(again) == [] and again.messages[-1]["result"] == {"resultType": "complete"}


async def test_cursor_problems_and_a_second_stream(http: httpx.AsyncClient, any_store_base: str) -> None:
    """A malformed or foreign cursor, another principal's task: the unknown-task answer, byte for byte."""
    base = any_store_base
    mcp = f"{base}/mcp"
    peer = ModernPeer(http, base, await dev_token(http, base, mcp))
    task_id = answer(await peer.call("fetch", url="https://example.com/b", steps=1, delay_ms=0))["result"]["taskId"]
    await poll_until_settled(peer, task_id)
    mallory = ModernPeer(http, base, await dev_token(http, base, mcp, client=("mallory", CLIENTS["mallory"])))
    unknown = (await stream(mallory, uuid.uuid4().hex)).body
    assert orjson.loads(unknown)["error"]["code"] == INVALID_PARAMS
    for who, after in ((mallory, None), (peer, -1), (peer, 10_000)):
        read = await stream(who, task_id, after) if after != -1 else await _raw(who, task_id, -1)
        assert _without_id(read.body) == _without_id(unknown)


async def _raw(peer: ModernPeer, task_id: str, after: object) -> StreamRead:
    return await peer.send(peer.message("tasks/stream", {"taskId": task_id, "after": after}))


def _without_id(body: bytes) -> dict[str, Any]:
    return _unnumbered(orjson.loads(body))


def _unnumbered(message: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in message.items() if key != "id"}


async def test_a_cursor_older_than_the_retained_events_is_events_gone(http: httpx.AsyncClient) -> None:
    """Acceptance 2: a store holding 4 events; a cursor before them is events_gone with earliestSeq,
    never a shorter stream; tasks/get then gives the terminal state."""

    def make(port: int) -> object:
        config = ServerConfig(port=port, store="memory", dev_clients=CLIENTS)
        return create_app(config, store=MemoryStore(max_events=4))

    with lossless_server(make) as base:
        peer = ModernPeer(http, base, await dev_token(http, base, f"{base}/mcp"))
        task_id = answer(await peer.call("fetch", url="https://example.com/c", steps=8, delay_ms=0))["result"]["taskId"]
        settled = await poll_until_settled(peer, task_id)
        gone = await stream(peer, task_id, 0)
        error = orjson.loads(gone.body)["error"]
        assert error["code"] == -32010 and error["data"]["reason"] == "events_gone"
        assert error["data"]["taskId"] == task_id and error["data"]["earliestSeq"] > 1
        assert b"notifications/tasks/event" not in gone.body, "never a shorter stream"
        last = await stream(peer, task_id, error["data"]["earliestSeq"] - 1)
        assert next(e["seq"] for e in events_of(last)) == error["data"]["earliestSeq"]
        assert settled["status"] == "completed", "the terminal state by tasks/get"


async def test_a_killed_task_streams_its_events_then_execution_lost(tmp_path: Path) -> None:
    """Acceptance 3: SIGKILL during a running task (SQLite), restart: the stored events, then the execution-lost
    outcome, never a clean end without one."""
    args = ["--store", f"sqlite:{tmp_path / 'events.db'}"]
    async with httpx.AsyncClient(timeout=10) as http:
        with cli_server(args, tmp_path / "first.log") as first:
            mcp = f"{first.base}/mcp"
            peer = ModernPeer(http, first.base, await dev_token(http, first.base, mcp))
            created = answer(await peer.call("fetch", url="https://example.com/long", steps=600, delay_ms=100))
            task_id = created["result"]["taskId"]
            before = events_of(await stream(peer, task_id, cut_after_progress=2))
            first.kill()
        cursor = before[-1]["seq"]
        with cli_server(args, tmp_path / "second.log", port=first.port) as second:
            peer.token = await dev_token(http, second.base, mcp)
            after = await stream(peer, task_id, cursor)
            stored = events_of(after)
            assert [e["seq"] for e in stored] == list(range(cursor + 1, cursor + 1 + len(stored)))
            assert all(e["type"] == PROGRESS for e in stored), "what the killed process stored, nothing invented"
            end = after.messages[-1]
            assert "result" not in end, "never a clean end"
            assert end["error"]["code"] == TASK_EXECUTION_LOST and end["error"]["data"]["taskId"] == task_id
            again = await stream(peer, task_id, cursor)
            assert [_unnumbered(m) for m in again.messages] == [_unnumbered(m) for m in after.messages], "every time"


async def test_a_second_active_stream_of_a_task_on_one_connection_is_invalid_params(http: httpx.AsyncClient) -> None:
    """SEP-2694: one active ``tasks/stream`` per task per connection; a second is ``-32602``, and nothing of the
    task's events comes on it. The server counts a connection by the address its ASGI server reports (``client``).

    HTTP/1.1 carries one response at a time on a TCP connection, so two streams active at once on one connection
    exist only where the ASGI server multiplexes (HTTP/2) or reports one address for many (a trusted proxy's
    ``X-Forwarded-For``, which the test's uvicorn honours from loopback): the test takes the second way, two TCP
    connections the server sees as one. Another address gets its own stream of the same task at the same time.
    """

    def make(port: int) -> object:
        return create_app(ServerConfig(port=port, store="memory", dev_clients=CLIENTS), store=MemoryStore())

    with lossless_server(make) as base:
        peer = ModernPeer(http, base, await dev_token(http, base, f"{base}/mcp"))
        created = answer(await peer.call("fetch", url="https://example.com/two", steps=200, delay_ms=50))
        task_id = created["result"]["taskId"]
        one = {"x-forwarded-for": "203.0.113.7:4711"}
        message = peer.message("tasks/stream", {"taskId": task_id})
        headers = peer.headers(message) | one
        async with http.stream("POST", peer.url, content=orjson.dumps(message), headers=headers) as first:
            assert first.headers["content-type"].startswith("text/event-stream")
            chunks = first.aiter_text()
            assert "notifications/tasks/event" in await anext(chunks), "the first stream is active"
            second = await _raw_stream(peer, task_id, one)
            error = orjson.loads(second.body)["error"]
            assert second.status == 200 and error["code"] == INVALID_PARAMS and "already active" in error["message"]
            assert b"notifications/tasks/event" not in second.body
            other = {"x-forwarded-for": "203.0.113.8:4711"}
            third = await stream_head(peer, task_id, other)
            assert third.startswith("text/event-stream"), "another connection streams the same task meanwhile"
        await peer.task("tasks/cancel", task_id)


async def _raw_stream(peer: ModernPeer, task_id: str, headers: dict[str, str]) -> StreamRead:
    return await peer.send(peer.message("tasks/stream", {"taskId": task_id}), headers=headers)


async def stream_head(peer: ModernPeer, task_id: str, headers: dict[str, str]) -> str:
    """The content type of a ``tasks/stream`` response, read without waiting for the stream's end."""
    message = peer.message("tasks/stream", {"taskId": task_id})
    sent = peer.headers(message) | headers
    async with peer.http.stream("POST", peer.url, content=orjson.dumps(message), headers=sent) as response:
        return str(response.headers.get("content-type", ""))
