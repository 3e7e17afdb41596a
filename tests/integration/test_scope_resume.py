"""Per-tool scopes end to end, in every store: the seed's hazard with a refresh that narrows scopes instead
of the audience. A scope-protected call is cut mid-stream; resuming with a token whose ``scope`` lacks the
tool's scope is refused before any byte (403, the missing scope named, the cursor unchanged); a covering
token then receives the rest exactly once. Admission of a call is checked the same way."""

from __future__ import annotations

import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
import httpx
import pytest

from mcp_lossless.audit.tokens import unverified_claims
from mcp_lossless.client import OAuth
from mcp_lossless.core.errors import DELIVERY_REFUSED
from mcp_lossless.core.protocol import SCOPES_META_KEY
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.tools import ToolContext, ToolRegistry
from mcp_lossless.stores.base import EventStore
from mcp_lossless.stores.memory import MemoryStore
from mcp_lossless.stores.redis import RedisStore
from mcp_lossless.stores.sqlite import SqliteStore
from tests.support.mcp_http import Peer, call, parse_sse
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio

CLIENT = ("scoped-app", "scoped-secret")


@dataclass
class Gates:
    """``progressed``: every progress event of ``read_file`` is stored; ``release``: it may answer;
    ``go``: a call with ``hold_after`` may go on past that step."""

    progressed: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    go: threading.Event = field(default_factory=threading.Event)


@dataclass
class Scoped:
    url: str
    gates: Gates


def scoped_tools(gates: Gates) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(scopes=("files:read",))
    async def read_file(ctx: ToolContext, path: str, steps: int = 4, hold_after: int = 0) -> str:
        """Read ``path``, reporting progress; answers once the test releases it."""
        for step in range(1, steps + 1):
            await ctx.report_progress(step, steps)  # returns once the event is stored
            if step == hold_after:
                await anyio.to_thread.run_sync(gates.go.wait, 10)
        gates.progressed.set()
        await anyio.to_thread.run_sync(gates.release.wait, 10)
        return f"contents of {path}"

    @registry.tool(scopes=("files:read", "files:write"))
    async def write_file(path: str) -> str:
        return f"wrote {path}"

    @registry.tool()
    async def ping_tool() -> str:
        return "pong"

    return registry


@pytest.fixture(params=["memory", "sqlite", "redis"])
def scoped(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scoped]:
    store: EventStore
    if request.param == "memory":
        store = MemoryStore()
    elif request.param == "sqlite":
        store = SqliteStore(str(tmp_path / "scoped.db"))
    else:
        store = RedisStore(request.getfixturevalue("redis_url"), prefix=f"scoped-{uuid.uuid4().hex}")

    gates = Gates()

    def make(port: int) -> object:
        config = ServerConfig(port=port, store="memory", dev_clients=dict([CLIENT]), retry_ms=200)
        return create_app(config, scoped_tools(gates), store=store)

    with lossless_server(make) as url:
        try:
            yield Scoped(url, gates)
        finally:  # no tool is left waiting while the server stops
            gates.release.set()
            gates.go.set()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(timeout=10) as client:
        yield client


async def token(http: httpx.AsyncClient, base: str, scope: str) -> str:
    """A token for the whole server (the aggregate audience) holding ``scope``: one audience, scopes per tool,
    as most providers issue them."""
    form = [("grant_type", "client_credentials"), ("resource", f"{base}/mcp"), ("scope", scope)]
    response = await http.post(
        f"{base}/dev-as/token",
        content=urlencode(form),
        headers={"content-type": "application/x-www-form-urlencoded"},
        auth=CLIENT,
    )
    assert response.status_code == 200, response.text
    assert response.json()["scope"] == scope
    value: str = response.json()["access_token"]
    return value


def progress_of(messages: list[dict[str, Any]]) -> list[float]:
    return [m["params"]["progress"] for m in messages if m.get("method") == "notifications/progress"]


async def test_a_resume_with_a_narrower_scope_is_refused_then_a_covering_token_gets_the_rest_once(
    scoped: Scoped, http: httpx.AsyncClient
) -> None:
    server_url = scoped.url
    wide = await token(http, server_url, "files:read files:write")
    narrow = await token(http, server_url, "files:write")  # a refresh that dropped files:read
    peer = Peer(http, server_url, wide)
    await peer.initialize()
    first = await peer.post(call(1, "read_file", progress="p", path="/etc/motd", steps=4), stop_after=2)
    assert first.status == 200 and len(first.ids) == 2  # the priming event and progress 1, then the cut
    cursor = first.ids[-1]
    assert await anyio.to_thread.run_sync(scoped.gates.progressed.wait, 10)

    refused = await peer.resume(cursor, token=narrow)
    assert refused.status == 403 and refused.events == [], refused.events
    body = refused.json()
    assert body["error"] == "replay_refused"
    assert (body["requiredScopes"], body["requiredResources"]) == (["files:read"], [])
    assert body["lastEventId"] == cursor and body["resumable"] is True, "the cursor has not moved"
    assert "scope files:read" in body["error_description"]
    challenge = refused.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and 'scope="files:read"' in challenge
    assert f'resource_metadata="{server_url}/.well-known/oauth-protected-resource/mcp"' in challenge
    again = await peer.resume(cursor, token=narrow)
    assert again.status == 403 and again.json()["lastEventId"] == cursor, "still refused, nothing consumed"

    scoped.gates.release.set()
    rest = await peer.resume(cursor, token=await token(http, server_url, "files:read"))
    assert rest.status == 200
    assert rest.ids[0] == body["eventId"], "the refusal named the first event the narrow token would have received"
    ids = first.ids + rest.ids
    assert len(ids) == len(set(ids)), "no event delivered twice"
    assert progress_of(first.messages + rest.messages) == [1, 2, 3, 4]
    results = [m for m in first.messages + rest.messages if m.get("id") == 1]
    assert [r["result"]["content"][0]["text"] for r in results] == ["contents of /etc/motd"]


async def test_an_event_needing_a_scope_the_resuming_token_lacks_is_refused_in_band_after_commit(
    scoped: Scoped, http: httpx.AsyncClient
) -> None:
    """The resume is accepted (nothing after the cursor yet), then the tool's next event needs ``files:read``:
    a log notification and a -32041 for the call, without an SSE ``id:``, naming the scope; the rest once."""
    server_url = scoped.url
    scoped.gates.release.set()
    peer = Peer(http, server_url, await token(http, server_url, "files:read"))
    await peer.initialize()
    first = await peer.post(call(1, "read_file", progress="p", path="/b", steps=3, hold_after=1), stop_after=2)
    cursor = first.ids[-1]
    narrow = await token(http, server_url, "files:write")
    headers = peer.headers(narrow, **{"last-event-id": cursor, "accept": "text/event-stream"})
    headers.pop("content-type")
    async with http.stream("GET", peer.url, headers=headers) as response:
        assert response.status_code == 200, "committed: no event after the cursor needed a look yet"
        scoped.gates.go.set()  # now the tool produces progress 2: the narrow token does not cover it
        text = (await response.aread()).decode()
    events = parse_sse(text)
    assert all(e.id is None for e in events), "no id: line moves the cursor"
    messages = [e.message for e in events if e.message is not None]
    error = next(m for m in messages if m.get("id") == 1)["error"]
    assert error["code"] == DELIVERY_REFUSED
    assert (error["data"]["requiredScopes"], error["data"]["lastEventId"]) == (["files:read"], cursor)
    assert "scope files:read" in error["message"]
    assert not progress_of(messages), "nothing of the call leaked"
    rest = await peer.resume(cursor)
    assert progress_of(first.messages + rest.messages) == [1, 2, 3]
    assert [m["result"]["content"][0]["text"] for m in rest.messages if m.get("id") == 1] == ["contents of /b"]


async def test_a_call_is_admitted_only_with_every_scope_of_its_tool(scoped: Scoped, http: httpx.AsyncClient) -> None:
    server_url = scoped.url
    scoped.gates.release.set()
    read_only = await token(http, server_url, "files:read")
    peer = Peer(http, server_url, read_only)
    await peer.initialize()
    listed = await peer.post({"jsonrpc": "2.0", "id": 9, "method": "tools/list"})
    tools = {t["name"]: t for t in listed.messages[-1]["result"]["tools"]}
    assert tools["write_file"]["_meta"][SCOPES_META_KEY] == ["files:read", "files:write"]
    assert SCOPES_META_KEY not in tools["ping_tool"]["_meta"]

    forbidden = await peer.post(call(2, "write_file", path="/tmp/x"))
    assert forbidden.status == 403
    error = forbidden.json()["error"]
    envelope = error["data"].pop("authorization")  # SEP-2643's, beside our own fields (ADR 0031)
    assert error["data"].pop("_meta") == {"io.modelcontextprotocol/authorization": envelope}
    assert (envelope["reason"], envelope["remediation"]) == ("insufficient_authorization", "available")
    assert error["data"] == {"requiredResources": [], "requiredScopes": ["files:write"]}
    assert error["message"] == "token lacks scope files:write"
    challenge = forbidden.headers["www-authenticate"]
    assert 'scope="files:read files:write"' in challenge, "every scope the call needs, held or not, in one challenge"
    assert "resource=" not in challenge, "the audience covers the tool: only the scope is missing"

    allowed = await peer.post(call(3, "read_file", path="/a", steps=0))
    assert allowed.messages[-1]["result"]["content"][0]["text"] == "contents of /a"
    assert (await peer.post(call(4, "ping_tool"))).messages[-1]["result"]["content"][0]["text"] == "pong"

    metadata = (await http.get(f"{server_url}/.well-known/oauth-protected-resource/mcp")).json()
    assert metadata["scopes_supported"] == ["files:read", "files:write"]
    tool = (await http.get(f"{server_url}/.well-known/oauth-protected-resource/mcp/tools/read_file")).json()
    assert tool["scopes_supported"] == ["files:read"]


def test_a_tool_refuses_scopes_that_are_not_scope_tokens() -> None:
    registry = ToolRegistry()
    for bad in (("two words",), ("",), ('q"uote',), "files:read"):
        with pytest.raises(ValueError, match="scope tokens"):
            registry.tool(name=f"t{len(registry.tools)}", scopes=bad)(_noop)  # type: ignore[arg-type]


async def _noop() -> str:
    return ""


async def test_a_fresh_grant_asks_for_the_scopes_a_refusal_named_besides_those_asked_before(
    http: httpx.AsyncClient,
) -> None:
    """What the client does with an in-band refusal's ``requiredScopes`` (no challenge header carries them
    after commit): the fresh grant asks the real dev AS for the union, and the token it gets holds both."""

    def make(port: int) -> object:
        config = ServerConfig(port=port, store="memory", dev_clients=dict([CLIENT]))
        return create_app(config, scoped_tools(Gates()))

    with lossless_server(make) as base:
        auth = OAuth(*CLIENT, scope="files:write")
        auth.bind(http, f"{base}/mcp")
        before = await auth.token(frozenset())
        await auth.reauthorize(frozenset(), frozenset({"files:read"}))
        after = await auth.token(frozenset())
    assert before is not None and after is not None
    assert (unverified_claims(before) or {})["scope"] == "files:write"
    assert set((unverified_claims(after) or {})["scope"].split()) == {"files:read", "files:write"}
