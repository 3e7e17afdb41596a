"""The audit's idempotency checks find what they look for: our server with keys broken on purpose in front of it,
and our 2026-07-28 leg alone (the checks' stateless path) passing them.

Our server declares ``tools.idempotency`` (and passes every check, ``test_audit.py``). Here an ASGI layer in front of
it takes the key out of each ``tools/call``, so the server runs every call as new while still declaring the
capability: a server that ignores keys. With ``cache`` on, that layer also answers a key it has seen from one global
table, before anything else looks at the request (no principal, no authorization, no argument comparison): the
naive deduplication of a proxy, or of a tool that keeps ``idempotency_key -> response`` itself. Real HTTP over
loopback, real JWTs signed by the dev AS's keys, the real command in a subprocess.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from mcp_lossless.core.idempotency import KEY_PARAM
from tests.interop.test_audit import KEY_CHECKS, audit_two_principals, checks_of, exchange, texts

Receive = Any
Send = Any


def _answer_in(body: bytes, request_id: object) -> dict[str, Any] | None:
    """The result for ``request_id`` in a JSON body or an SSE stream's ``data:`` lines."""
    chunks = (
        [body]
        if body.lstrip().startswith(b"{")
        else [line[5:] for line in body.splitlines() if line.startswith(b"data:")]
    )
    for chunk in chunks:
        try:
            message = orjson.loads(chunk)
        except orjson.JSONDecodeError:
            continue
        if isinstance(message, dict) and message.get("id") == request_id and isinstance(message.get("result"), dict):
            return message["result"]
    return None


async def read_body(receive: Receive) -> bytes:
    """A request's whole body, read from ASGI ``receive`` by a front that must see it before the app does."""
    body, more = b"", True
    while more:
        part = await receive()
        body, more = body + part.get("body", b""), part.get("more_body", False)
    return body


def replaying(body: bytes, receive: Receive) -> Receive:
    """The ``receive`` the app behind such a front gets: ``body`` once, then whatever ``receive`` says next."""
    delivered = False

    async def replayed() -> dict[str, Any]:
        nonlocal delivered
        if delivered:
            return await receive()  # type: ignore[no-any-return]
        delivered = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed


class KeysBroken:
    """ASGI in front of our app: strips ``idempotencyKey`` from every ``tools/call``; with ``cache``, answers a key
    seen before from one table shared by every caller, before authorization and whatever the arguments."""

    def __init__(self, app: Any, cache: bool) -> None:
        self.app = app
        self.cache = cache
        self.results: dict[str, dict[str, Any]] = {}

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        try:
            message = orjson.loads(body)
        except orjson.JSONDecodeError:
            message = None
        params = message.get("params") if isinstance(message, dict) else None
        key = (
            params.pop(KEY_PARAM, None) if isinstance(params, dict) and message.get("method") == "tools/call" else None
        )
        if key is not None:
            if self.cache and key in self.results:
                reply = orjson.dumps({"jsonrpc": "2.0", "id": message["id"], "result": self.results[key]})
                headers = [(b"content-type", b"application/json")]
                await send({"type": "http.response.start", "status": 200, "headers": headers})
                await send({"type": "http.response.body", "body": reply})
                return
            body = orjson.dumps(message)
            length = str(len(body)).encode()
            scope = {**scope, "headers": [(k, length if k == b"content-length" else v) for k, v in scope["headers"]]}
        captured = bytearray()

        async def capture(event: dict[str, Any]) -> None:
            if event["type"] == "http.response.body":
                captured.extend(event.get("body", b""))
            await send(event)

        await self.app(scope, replaying(body, receive), capture)
        if key is not None and self.cache and (result := _answer_in(bytes(captured), message["id"])) is not None:
            self.results[key] = result


@pytest.mark.parametrize(
    ("cache", "findings"),
    [
        (
            False,
            {
                "idempotency_duplicate_runs",
                "idempotency_concurrent_runs",
                "idempotency_conflict_accepted",
                "idempotency_replay_narrowed",
            },
        ),
        (
            True,
            {
                "idempotency_concurrent_runs",
                "idempotency_conflict_accepted",
                "idempotency_replay_narrowed",
                "idempotency_other_principal",
            },
        ),
    ],
    ids=["ignores-keys", "global-cache-before-auth"],
)
def test_the_idempotency_checks_find_a_server_that_ignores_keys_or_shares_them(
    tmp_path: Path, cache: bool, findings: set[str]
) -> None:
    _, (status, table, report, markdown) = audit_two_principals(tmp_path, lambda app: KeysBroken(app, cache))
    assert status == 1 and set(report["findings"]) == findings, table
    assert report["not_run"] == [] and report["not_applicable"] == [], table
    checks = checks_of(report)
    assert {name for name in KEY_CHECKS if checks[name]["outcome"] == "ok"} == set(KEY_CHECKS) - findings
    for name in findings:
        assert f"## {name}: FINDING" in markdown
    summary = {name: checks[name]["summary"] for name in KEY_CHECKS}
    assert "ran the tool a second time" in summary["idempotency_concurrent_runs"], "it records only once answered"
    if not cache:
        assert "it ran the tool again: 4 progress notification(s)" in summary["idempotency_duplicate_runs"]
        assert "the tool ran with the other arguments under the used key" in summary["idempotency_conflict_accepted"]
        assert "the refusal cost the key" in summary["idempotency_replay_narrowed"]
        denied = exchange(checks["idempotency_replay_narrowed"], "narrowed token")["response"]
        assert denied["status"] == 403, "the server's own admission still refuses the narrowed token"
    else:
        assert "without a run" in summary["idempotency_conflict_accepted"]
        assert "got the key's recorded outcome" in summary["idempotency_replay_narrowed"]
        leaked = exchange(checks["idempotency_replay_narrowed"], "narrowed token")["response"]
        assert leaked["status"] == 200 and "contents of https://example.com/report" in leaked["body"]
        assert "got the first principal's recorded outcome" in summary["idempotency_other_principal"]
        theirs = exchange(checks["idempotency_other_principal"], "key A, the same arguments")
        assert theirs["request"]["headers"]["authorization"] == "Bearer [redacted second principal wide token]"
        assert "contents of https://example.com/report" in (theirs["response"].get("body") or texts(theirs))


class NoSessions:
    """ASGI in front of our app refusing ``initialize``: the audit meets a server of 2026-07-28 alone."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        body = await read_body(receive)
        if b'"method":"initialize"' in body:
            refusal = b'{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"no sessions here"}}'
            await send(
                {"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]}
            )
            await send({"type": "http.response.body", "body": refusal})
            return
        await self.app(scope, replaying(body, receive), send)


def test_the_idempotency_checks_pass_statelessly_on_our_2026_leg(tmp_path: Path) -> None:
    """Without sessions the keyed calls go as 2026-07-28 requests (no tasks extension: answered inline), the
    capability comes from ``server/discover``, and our modern leg passes all five."""
    _, (_, table, report, _) = audit_two_principals(tmp_path, NoSessions)
    checks = checks_of(report)
    assert {name: checks[name]["outcome"] for name in KEY_CHECKS} == dict.fromkeys(KEY_CHECKS, "ok"), table
    assert report["findings"] == [], table
    first = exchange(checks["idempotency_conflict_accepted"], "the call under a fresh")
    assert first["request"]["headers"]["mcp-protocol-version"] == "2026-07-28"
    assert "io.modelcontextprotocol/tasks" not in first["request"]["body"], "answered inline, not as a task"
    duplicate = exchange(checks["idempotency_duplicate_runs"], "duplicate")["response"]
    assert '"io.github.mcp-lossless/replayed":true' in duplicate["body"]
    denied = exchange(checks["idempotency_replay_narrowed"], "narrowed token")["response"]
    assert denied["status"] == 403 and "contents of" not in denied["body"]
    running = exchange(checks["idempotency_concurrent_runs"], "while the first still runs")["response"]
    assert '"type":"idempotency_key_in_progress"' in running["body"]
