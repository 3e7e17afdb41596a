"""Servers that misbehave: every affected call still ends with an explicit, typed error within its deadline.

One raw ASGI server (real HTTP on loopback) plays a different misbehaviour per tool name; the event ids
it hands out name the scenario, so resumes (GET + Last-Event-ID) keep misbehaving the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import anyio
import orjson
import pytest

from mcp_lossless.asgi import header, read_body, respond, respond_json
from mcp_lossless.client import (
    AuthorizationFailed,
    CallMayHaveRun,
    Client,
    DeadlineExceeded,
    ProtocolViolation,
    RemoteError,
    SessionLost,
)
from mcp_lossless.client.transport import Backoff
from tests.support.uvicorn_server import serve_app

DEADLINE = 3.0
SCENARIOS = {
    "ok": "answers properly",
    "ok_json": "answers properly with application/json",
    "empty_resume": "primes, closes; every resume is an empty 200 event stream",
    "unknown_event": "primes, sends `event: error`, closes; resumes do the same",
    "foreign_id": "primes, answers with another id, closes; resumes do the same",
    "clean_close_loop": "primes, closes; every resume primes a new id and closes again, forever",
    "not_json_sse": "sends a data line that is not JSON, closes; resumes do the same",
    "not_json_body": "answers with application/json that is not JSON",
    "rpc_error": "answers with a JSON-RPC error",
    "gone_once": "answers 404 for the session the first time it is called",
}


class ScriptedServer:
    def __init__(self, version: str = "2025-11-25", require_auth: bool = False, max_sessions: int = 1000) -> None:
        self.version = version
        self.require_auth = require_auth
        self.max_sessions = max_sessions
        self.sessions = itertools.count(1)
        self.live_sessions: set[str] = set()
        self.ids = itertools.count(1)
        self.calls: list[str] = []
        self.protocol_headers: list[str | None] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        if self.require_auth and header(scope, b"authorization") is None:
            challenge = b'Bearer error="invalid_token", resource_metadata="http://127.0.0.1:9/prm"'
            await respond_json(send, 401, {"error": "invalid_token"}, [(b"www-authenticate", challenge)])
            return
        self.protocol_headers.append(header(scope, b"mcp-protocol-version"))
        if scope["method"] == "DELETE":
            await respond(send, 200)
        elif scope["method"] == "GET":
            await self._resume(send, header(scope, b"last-event-id") or "")
        else:
            await self._post(scope, send, orjson.loads(await read_body(receive, 1 << 20)))

    def _event_id(self, scenario: str) -> str:
        return f"{scenario}:{next(self.ids)}"

    async def _sse(self, send: Any, *frames: bytes) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for frame in frames:
            await send({"type": "http.response.body", "body": frame, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    def _priming(self, scenario: str) -> bytes:
        return f"id: {self._event_id(scenario)}\nretry: 20\ndata: \n\n".encode()

    async def _post(self, scope: Any, send: Any, message: dict[str, Any]) -> None:
        method = message.get("method")
        session = header(scope, b"mcp-session-id")
        if method == "initialize":
            number = next(self.sessions)
            if number > self.max_sessions:
                await respond_json(send, 503, {"error": "no more sessions"})
                return
            sid = f"s{number}"
            self.live_sessions.add(sid)
            result = {"protocolVersion": self.version, "capabilities": {"tools": {}}, "serverInfo": {"name": "bad"}}
            body = {"jsonrpc": "2.0", "id": message["id"], "result": result}
            await respond_json(send, 200, body, [(b"mcp-session-id", sid.encode())])
            return
        if session not in self.live_sessions:
            await respond_json(send, 404, {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "gone"}})
            return
        if "id" not in message:
            await respond(send, 202)
            return
        if method == "tools/list":
            tools = [
                {"name": name, "description": text, "inputSchema": {"type": "object"}}
                for name, text in SCENARIOS.items()
            ]
            await respond_json(send, 200, {"jsonrpc": "2.0", "id": message["id"], "result": {"tools": tools}})
            return
        name = message["params"]["name"]
        self.calls.append(name)
        rid = message["id"]
        answer = {"jsonrpc": "2.0", "id": rid, "result": {"content": [{"type": "text", "text": f"{name} done"}]}}
        if name == "ok":
            await self._sse(send, self._priming(name), b"data: " + orjson.dumps(answer) + b"\n\n")
        elif name == "ok_json":
            await respond_json(send, 200, answer)
        elif name == "not_json_body":
            await respond(send, 200, b"this is not json", b"application/json")
        elif name == "rpc_error":
            error = {"code": -32602, "message": "bad arguments", "data": {"field": "x"}}
            await respond_json(send, 200, {"jsonrpc": "2.0", "id": rid, "error": error})
        elif name == "gone_once" and self.calls.count(name) == 1:
            self.live_sessions.discard(session)
            await respond_json(send, 404, {"jsonrpc": "2.0", "id": None, "error": {"code": -32600, "message": "gone"}})
        elif name == "gone_once":
            await respond_json(send, 200, answer)
        else:
            await self._sse(send, self._priming(name), *self._misbehaviour(name))

    def _misbehaviour(self, scenario: str) -> list[bytes]:
        if scenario == "unknown_event":
            return [b'event: error\ndata: {"event_id": "e3", "required_resource": "x"}\n\n']
        if scenario == "foreign_id":
            foreign = {
                "jsonrpc": "2.0",
                "id": "someone-else",
                "result": {"content": [{"type": "text", "text": "SECRET"}]},
            }
            return [b"data: " + orjson.dumps(foreign) + b"\n\n"]
        if scenario == "not_json_sse":
            return [b"data: {{{ not json\n\n"]
        return []

    async def _resume(self, send: Any, cursor: str) -> None:
        scenario = cursor.split(":", 1)[0]
        if scenario == "empty_resume":
            await self._sse(send)
        elif scenario == "clean_close_loop":
            await self._sse(send, self._priming(scenario))
        else:
            await self._sse(send, *self._misbehaviour(scenario))


@pytest.fixture(scope="module")
def bad_server() -> Iterator[tuple[str, ScriptedServer]]:
    app = ScriptedServer()
    with serve_app(app) as base:
        yield f"{base}/mcp", app


def client(url: str, **options: Any) -> Client:
    return Client(url, timeout=DEADLINE, backoff=Backoff(initial=0.02, maximum=0.1), **options)


async def outcome_of(url: str, tool: str) -> BaseException | str:
    """The call's outcome, asserting it came before the deadline (plus slack for the handshake)."""
    async with client(url) as c:
        with anyio.fail_after(DEADLINE + 2):
            try:
                return (await c.call_tool(tool)).text
            except Exception as exc:
                return exc


@pytest.mark.anyio
async def test_sanity_proper_answers(bad_server: tuple[str, ScriptedServer]) -> None:
    url, _ = bad_server
    assert await outcome_of(url, "ok") == "ok done"
    assert await outcome_of(url, "ok_json") == "ok_json done"


@pytest.mark.anyio
async def test_empty_200_on_resume_is_an_explicit_error(bad_server: tuple[str, ScriptedServer]) -> None:
    url, _ = bad_server
    outcome = await outcome_of(url, "empty_resume")
    assert isinstance(outcome, CallMayHaveRun)
    assert "without a new event" in outcome.reason


@pytest.mark.anyio
async def test_unknown_sse_event_type_is_a_protocol_violation(bad_server: tuple[str, ScriptedServer]) -> None:
    url, _ = bad_server
    outcome = await outcome_of(url, "unknown_event")
    assert isinstance(outcome, ProtocolViolation)
    assert "unknown SSE event type 'error'" in outcome.reason


@pytest.mark.anyio
async def test_foreign_id_never_surfaces(bad_server: tuple[str, ScriptedServer]) -> None:
    url, _ = bad_server
    outcome = await outcome_of(url, "foreign_id")
    assert isinstance(outcome, ProtocolViolation)
    assert "SECRET" not in str(outcome)


@pytest.mark.anyio
async def test_endless_clean_close_loop_ends_at_the_deadline(bad_server: tuple[str, ScriptedServer]) -> None:
    url, _ = bad_server
    outcome = await outcome_of(url, "clean_close_loop")
    assert isinstance(outcome, DeadlineExceeded)


@pytest.mark.anyio
async def test_sse_data_that_is_not_json(bad_server: tuple[str, ScriptedServer]) -> None:
    url, _ = bad_server
    outcome = await outcome_of(url, "not_json_sse")
    assert isinstance(outcome, ProtocolViolation)
    assert "not JSON" in outcome.reason


@pytest.mark.anyio
async def test_json_body_that_is_not_json(bad_server: tuple[str, ScriptedServer]) -> None:
    url, _ = bad_server
    outcome = await outcome_of(url, "not_json_body")
    assert isinstance(outcome, ProtocolViolation)


@pytest.mark.anyio
async def test_json_rpc_error_is_a_remote_error(bad_server: tuple[str, ScriptedServer]) -> None:
    url, _ = bad_server
    outcome = await outcome_of(url, "rpc_error")
    assert isinstance(outcome, RemoteError)
    assert (outcome.code, outcome.message, outcome.data) == (-32602, "bad arguments", {"field": "x"})


@pytest.mark.anyio
async def test_404_on_post_starts_a_new_session_and_sends_again(bad_server: tuple[str, ScriptedServer]) -> None:
    url, app = bad_server
    assert await outcome_of(url, "gone_once") == "gone_once done"
    assert app.calls.count("gone_once") == 2


@pytest.mark.anyio
async def test_falls_back_to_the_version_the_server_speaks() -> None:
    app = ScriptedServer(version="2025-06-18")
    with serve_app(app) as base:
        async with client(f"{base}/mcp") as c:
            assert c.server.protocol_version == "2025-06-18"
            assert (await c.call_tool("ok_json")).text == "ok_json done"
    assert app.protocol_headers[0] is None  # initialize goes out before a version is agreed
    assert set(app.protocol_headers[1:]) == {"2025-06-18"}


@pytest.mark.anyio
async def test_unknown_server_version_is_refused() -> None:
    with serve_app(ScriptedServer(version="1999-01-01")) as base, pytest.raises(ProtocolViolation, match="1999"):
        async with client(f"{base}/mcp"):
            pass


@pytest.mark.anyio
async def test_server_requiring_auth_without_credentials() -> None:
    with serve_app(ScriptedServer(require_auth=True)) as base, pytest.raises(AuthorizationFailed):
        async with client(f"{base}/mcp"):
            pass


@pytest.mark.anyio
async def test_session_that_cannot_be_restarted_fails_calls_fast() -> None:
    """The session is lost and the server refuses a new one: the pending call and later calls fail at once."""
    app = ScriptedServer(max_sessions=1)
    with serve_app(app) as base:
        async with client(f"{base}/mcp") as c:
            with anyio.fail_after(DEADLINE):
                with pytest.raises(SessionLost, match="could not be re-established"):
                    await c.call_tool("gone_once")
                with pytest.raises(SessionLost, match="no session"):
                    await c.call_tool("ok")
    assert app.calls == ["gone_once"]
