"""HTTP-level limits on a real uvicorn with the guarded protocol, over real sockets: head size and count, head and
body deadlines, the connection cap, /metrics behind the Host check and its token.

Each test waits on the server's own answer (a socket read bounded by a timeout), never on a sleep.
"""

from __future__ import annotations

import asyncio
import re
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import unquote_to_bytes

import httpx
import orjson
import pytest

from mcp_lossless.asgi import respond, sent_whole
from mcp_lossless.asgi.send import WHOLE
from mcp_lossless.core.limits import Limits
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.connections import HEADER_MEMO, REQUEST_TASK, ConnectionGuard, KnownHeaders
from tests.support.mcp_http import Peer, call
from tests.support.processes import free_port, started_cli_server
from tests.support.uvicorn_server import guarded_server, read_body, serve_app, serve_guarded

HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"


def _rss_mib() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _serve(limits: Limits, fd_limit: int | None = None, **settings: Any) -> Any:
    def make(port: int) -> object:
        return create_app(ServerConfig(port=port, store="memory", issuer=None, limits=limits, **settings))

    return guarded_server(make, fd_limit)


LOOP_CLOCK_SLACK = 0.005
"""How much earlier than its deadline by this test's clock a connection may be closed: the guard stamps a
connection with the loop's time (uvloop's: whole milliseconds, read once per loop iteration), which can lag the
moment the client's connect returned (seen: closed after 0.39996 s of a 0.4 s deadline)."""


@pytest.fixture(scope="module")
def quick() -> Iterator[tuple[str, Any]]:
    """Short deadlines, so that the tests that wait for one are quick."""
    with _serve(Limits(header_timeout=0.4, body_timeout=0.4)) as served:
        yield served


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _connect(url: str) -> socket.socket:
    sock = socket.create_connection(_address(url), timeout=10)
    return sock


def _read_all(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection (the socket timeout bounds the wait)."""
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except ConnectionResetError:
        pass
    return b"".join(chunks)


def _refusal(raw: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"connection: close" in head.lower()
    return status, orjson.loads(body)["error"]


def test_a_head_over_the_size_limit_gets_431_naming_it(quick: tuple[str, Any]) -> None:
    url, _ = quick
    with _connect(url) as sock:
        sock.sendall(HEAD + b"x-big: " + b"a" * (Limits().max_header_bytes + 1) + b"\r\n\r\n")
        status, error = _refusal(_read_all(sock))
    assert status == 431
    assert error["data"] == {"limit": "max_header_bytes", "maximum": Limits().max_header_bytes}


def test_a_pipelined_head_over_the_size_limit_gets_431_though_it_began_in_the_previous_requests_packet(
    quick: tuple[str, Any],
) -> None:
    """The second head's first 31,000 bytes come in the packet that ends the first request, its last 2,000 only
    once the first is answered: the size is bounded by the bytes that carried it, both packets counted."""
    url, _ = quick
    limit = Limits().max_header_bytes
    second = HEAD + b"x-big: " + b"a" * (limit + 1) + b"\r\n\r\n"
    with _connect(url) as sock:
        sock.sendall(HEAD + b"\r\n" + second[:31_000])
        first = b""
        while b"\r\n\r\n" not in first:
            first += sock.recv(65536)
        head, _, body = first.partition(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ", 1)[1].split(b"\r\n", 1)[0])
        while len(body) < length:
            body += sock.recv(65536)
        assert head.startswith(b"HTTP/1.1 200 ")
        sock.sendall(second[31_000:])
        status, error = _refusal(body[length:] + _read_all(sock))
    assert status == 431
    assert error["data"] == {"limit": "max_header_bytes", "maximum": limit}


def test_too_many_header_fields_get_431_naming_the_count_limit(quick: tuple[str, Any]) -> None:
    url, _ = quick
    fields = b"".join(b"x-%d: 1\r\n" % i for i in range(Limits().max_headers + 1))
    with _connect(url) as sock:
        sock.sendall(HEAD + fields + b"\r\n")
        status, error = _refusal(_read_all(sock))
    assert status == 431
    assert error["data"]["limit"] == "max_headers"


def test_a_refused_head_ends_the_connection_though_a_valid_request_follows_in_the_same_packet(
    quick: tuple[str, Any],
) -> None:
    """The request after a refused head is never read: its answer would be taken for the refused one's."""
    url, _ = quick
    fields = b"".join(b"x-%d: 1\r\n" % i for i in range(Limits().max_headers + 1))
    with _connect(url) as sock:
        sock.sendall(HEAD + fields + b"\r\n" + HEAD + b"\r\n")
        answer = _read_all(sock)
    status, error = _refusal(answer)
    assert status == 431
    assert error["data"]["limit"] == "max_headers"
    assert answer.count(b"HTTP/1.1 ") == 1, answer


def test_a_head_at_the_limits_is_served(quick: tuple[str, Any]) -> None:
    url, _ = quick
    limits = Limits()
    fields = b"".join(b"x-%d: 1\r\n" % i for i in range(limits.max_headers - 2))  # + host + connection
    with _connect(url) as sock:
        sock.sendall(HEAD + fields + b"connection: close\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 200 ")
    big = {"x-big": "a" * (limits.max_header_bytes - 200)}
    assert httpx.get(f"{url}/metrics", headers=big, timeout=10).status_code == 200


def test_sixteen_unfinished_32_mb_heads_are_cut_off_and_memory_stays_flat(quick: tuple[str, Any]) -> None:
    url, _ = quick
    before = _rss_mib()
    outcomes: list[str] = []

    def flood() -> None:
        with _connect(url) as sock:
            sock.sendall(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nx-big: ")
            chunk, sent = b"a" * 65536, 0
            try:
                while sent < 32 << 20:
                    sock.sendall(chunk)
                    sent += len(chunk)
            except (BrokenPipeError, ConnectionResetError):
                pass
            answer = _read_all(sock)
            outcomes.append("431" if answer.startswith(b"HTTP/1.1 431") else "closed" if not answer else "other")
            assert sent < 32 << 20, "the server read a whole 32 MB head"

    threads = [threading.Thread(target=flood) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(set(outcomes)) <= ["431", "closed"] and len(outcomes) == 16, outcomes
    assert _rss_mib() - before < 20


def test_an_unfinished_head_is_answered_408_at_its_deadline(quick: tuple[str, Any]) -> None:
    url, _ = quick
    with _connect(url) as sock:
        started = time.monotonic()
        sock.sendall(HEAD + b"x-slow: 1")
        status, error = _refusal(_read_all(sock))
        waited = time.monotonic() - started
    assert status == 408
    assert error["data"] == {"limit": "header_timeout", "maximum": 0.4}
    assert 0.4 - LOOP_CLOCK_SLACK <= waited < 5


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(quick: tuple[str, Any]) -> None:
    url, _ = quick
    with _connect(url) as sock:
        started = time.monotonic()
        assert _read_all(sock) == b""
        assert 0.4 - LOOP_CLOCK_SLACK <= time.monotonic() - started < 5


def test_an_unfinished_body_is_answered_408_at_its_deadline(quick: tuple[str, Any]) -> None:
    url, _ = quick
    with _connect(url) as sock:
        sock.sendall(
            b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
            b"accept: application/json, text/event-stream\r\ncontent-length: 100\r\n\r\n{"
        )
        status, error = _refusal(_read_all(sock))
    assert status == 408
    assert error["data"]["limit"] == "body_timeout"


@pytest.mark.anyio
async def test_deadlines_do_not_cut_keep_alive_requests_or_a_stream_outliving_them(quick: tuple[str, Any]) -> None:
    url, _ = quick
    async with httpx.AsyncClient(timeout=10) as http:
        peer = Peer(http, url)
        await peer.initialize()
        for request_id in range(5):  # one keep-alive connection, requests spread over more than a deadline
            read = await peer.post(call(request_id, "search", query="q", steps=1, delay_ms=150))
            assert read.status == 200
            assert read.messages[-1]["result"]["isError"] is False
        read = await peer.post(call(9, "fetch", progress="p", url="u", steps=3, delay_ms=400))  # 1.2 s > 0.4 s
    assert read.status == 200
    assert [m.get("method") for m in read.messages] == ["notifications/progress"] * 3 + [None]
    assert read.messages[-1]["result"]["isError"] is False


async def _ok(scope: dict[str, Any], receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"ok"})


def _answered(sock: socket.socket) -> None:
    """Send a request on ``sock`` (kept alive) and read its whole answer from ``_ok``."""
    sock.sendall(HEAD + b"\r\n")
    answer = b""
    while not answer.endswith(b"\r\n\r\nok"):
        chunk = sock.recv(65536)
        assert chunk, answer
        answer += chunk
    assert answer.startswith(b"HTTP/1.1 200 ")


async def _header_from_query(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers with the header the query names: ``?name=value`` (percent-decoded)."""
    name, _, value = unquote_to_bytes(scope["query_string"]).partition(b"=")
    headers = [(b"content-length", b"2"), (name, value)]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": b"ok"})


def test_response_headers_are_still_checked_once_their_checks_are_remembered() -> None:
    """uvicorn refuses a response header with a bad name or value (the connection closes, nothing of the answer
    sent); the guarded protocol remembers each check (``KnownHeaders``), the verdicts with it, however often the
    same header is sent."""

    def answer(url: str, query: bytes) -> bytes:
        with _connect(url) as sock:
            sock.sendall(b"GET /?" + query + b" HTTP/1.1\r\nHost: 127.0.0.1\r\nconnection: close\r\n\r\n")
            return _read_all(sock)

    with serve_guarded(_header_from_query, ConnectionGuard(Limits(), cap=16)) as url:
        for _ in range(3):
            assert answer(url, b"x-fine=no-cache,%20no-transform").startswith(b"HTTP/1.1 200 ")
            assert answer(url, b"x-bad=1%0D%0Ainjected:%20yes") == b""
            assert answer(url, b"x%20bad=1") == b""
            assert answer(url, b"x-bad=%00") == b""


def test_remembered_header_checks_stay_bounded() -> None:
    known = KnownHeaders(re.compile(b"[\x00-\x08\x0a-\x1f\x7f]"))
    assert known[b"fine"] is None and known[b"a\nb"] is not None and known[b"a\nb"] is not None
    for n in range(3 * HEADER_MEMO[0]):
        assert known[b"%d" % n] is None
    assert len(known) <= HEADER_MEMO[0]
    assert known[b"\x00" * (HEADER_MEMO[1] + 1)] is not None
    assert b"\x00" * (HEADER_MEMO[1] + 1) not in known


async def _head_then_echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Sends its head before reading the request's body, then the body back."""
    await send({"type": "http.response.start", "status": 200, "headers": []})
    body = await read_body(receive)
    await send({"type": "http.response.body", "body": body})


def test_a_head_sent_before_the_body_reaches_the_client_without_waiting_for_the_body() -> None:
    """The guarded protocol holds a response head to send it with its first body bytes, but never past the loop
    turn: a client that waits for the head before it sends the rest of its request is answered."""
    with serve_guarded(_head_then_echo, ConnectionGuard(Limits(), cap=16)) as url, _connect(url) as sock:
        sock.settimeout(5)
        sock.sendall(b"POST / HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-length: 5\r\n\r\n")
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = sock.recv(65536)
            assert chunk, head
            head += chunk
        assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head
        sock.sendall(b"hello")
        rest = head.partition(b"\r\n\r\n")[2]
        while not rest.endswith(b"0\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, rest
            rest += chunk
        assert rest == b"5\r\nhello\r\n0\r\n\r\n"


async def _task_name(scope: dict[str, Any], receive: Any, send: Any) -> None:
    name = asyncio.current_task().get_name().encode()  # type: ignore[union-attr]
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(name))]})
    await send({"type": "http.response.body", "body": name})


def test_each_request_runs_in_a_task_of_its_own_named_for_it() -> None:
    with serve_guarded(_task_name, ConnectionGuard(Limits(), cap=16)) as url, httpx.Client(timeout=10) as client:
        assert [client.get(url).text for _ in range(2)] == [REQUEST_TASK] * 2


async def _scope_echo(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers with its scope (but for the addresses and the state) and the body it read."""
    body = await read_body(receive)
    shown = {k: v for k, v in scope.items() if k not in ("client", "server", "state")}
    answer = orjson.dumps({"scope": shown, "body": body.decode()}, default=lambda b: b.decode("latin-1"))
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(answer))]})
    await send({"type": "http.response.body", "body": answer})


PARITY_REQUESTS = [
    b"GET /a%20b/c?x=1&y=%2F HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nconnection: close\r\n\r\n",
    b"POST /mcp HTTP/1.0\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}",
    b"GET /kept HTTP/1.0\r\nHost: h\r\nconnection: keep-alive\r\n\r\n",  # uvicorn keeps no 1.0 alive
    b"GET /one HTTP/1.1\r\nHost: h\r\n\r\nGET /two?q HTTP/1.1\r\nHost: h\r\nconnection: close\r\n\r\n",
    b"POST /mcp HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\nconnection: close\r\n\r\nabc",
    b"PUT /x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nconnection: close\r\n\r\n2\r\nab\r\n0\r\n\r\n",
]


def test_the_guarded_protocol_gives_the_app_what_uvicorns_own_gives_it() -> None:
    """The guarded protocol overrides uvicorn's per-request callbacks (``data_received``, ``on_response_complete``,
    ``_start_asgi_task``): the scope, the body and the answers, pipelined, HTTP/1.0, ``Expect: 100-continue`` and
    chunked requests included, are uvicorn's own protocol's byte for byte (the date aside)."""

    def answers(url: str) -> list[bytes]:
        out = []
        for request in PARITY_REQUESTS:
            with _connect(url) as sock:
                sock.sendall(request)
                raw = _read_all(sock)
            out.append(b"".join(line for line in raw.splitlines(True) if not line.startswith(b"date: ")))
        return out

    with serve_app(_scope_echo, lifespan="off") as plain:
        expected = answers(plain)
    with serve_guarded(_scope_echo, ConnectionGuard(Limits(), cap=16)) as guarded:
        got = answers(guarded)
    assert all(b'"scope"' in answer for answer in expected), expected
    assert got == expected


WHOLE_TAKEN: list[str] = []
"""What :func:`_whole` found behind its ``send``: the class of the cycle's transport when it offers a whole
response."""


async def _whole(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Answers through :func:`..asgi.respond`: the status, headers and body a request's path names."""
    await read_body(receive)
    transport = getattr(getattr(send, "__self__", None), "transport", None)
    WHOLE_TAKEN.append(type(transport).__name__ if hasattr(transport, WHOLE) else "")
    path = scope["path"]
    if path == "/none":
        await respond(send, 204)
    elif path == "/framed":  # a framing header of the app's own: uvicorn's send decides
        await respond(send, 200, b"abc", b"text/plain", [(b"connection", b"close")])
    elif path == "/at-once":  # sent_whole, else (uvicorn's own protocol) the messages
        if not sent_whole(send, 200, b"[1]", b"application/json"):
            await respond(send, 200, b"[1]", b"application/json")
    else:
        await respond(send, 200, path.encode() * 3, b"application/json", [(b"X-Shown", b"a b"), (b"www-a", b"c=d")])


WHOLE_REQUESTS = [
    b"GET /a HTTP/1.1\r\nHost: h\r\n\r\nGET /none HTTP/1.1\r\nHost: h\r\n\r\nHEAD /h HTTP/1.1\r\nHost: h\r\n\r\n"
    b"POST /framed HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /b HTTP/1.0\r\nHost: h\r\nContent-Length: 2\r\n\r\n{}",
    b"POST /at-once HTTP/1.1\r\nHost: h\r\nContent-Length: 2\r\nconnection: close\r\n\r\n{}",
    b"POST /c HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 3\r\nconnection: close\r\n\r\nabc",
]


def test_a_whole_response_is_written_as_uvicorns_own_protocol_writes_its_two_messages() -> None:
    """:func:`..asgi.respond` (and :func:`..asgi.sent_whole`) through the guarded protocol writes a response whole
    (``connections.send_whole``): byte for byte what uvicorn's own protocol writes from the two messages (the date
    aside), a 204, a ``HEAD`` (no body), a framing header of the app's (left to uvicorn), HTTP/1.0 (closed) and
    ``Expect: 100-continue`` included, pipelined requests one after another."""

    def answers(url: str) -> list[bytes]:
        out = []
        for request in WHOLE_REQUESTS:
            with _connect(url) as sock:
                sock.sendall(request)
                raw = _read_all(sock)
            out.append(b"".join(line for line in raw.splitlines(True) if not line.startswith(b"date: ")))
        return out

    with serve_app(_whole, lifespan="off") as plain:
        expected = answers(plain)
    assert set(WHOLE_TAKEN) == {""}
    WHOLE_TAKEN.clear()
    with serve_guarded(_whole, ConnectionGuard(Limits(), cap=16)) as guarded:
        got = answers(guarded)
    assert WHOLE_TAKEN == ["HeldHead"] * 7
    assert b"x-shown: a b\r\n" in expected[0] and expected[0].count(b"HTTP/1.1 ") == 4
    assert got == expected


def test_an_idle_keep_alive_connection_is_closed_after_the_keep_alive_timeout() -> None:
    """uvicorn's ``timeout_keep_alive``, counted from the last answer; the guard's sweep enforces it."""
    with (
        serve_guarded(_ok, ConnectionGuard(Limits(header_timeout=30), cap=16, keep_alive=0.3)) as url,
        _connect(url) as sock,
    ):
        _answered(sock)
        _answered(sock)  # within the keep-alive: served on the same connection
        answered = time.monotonic()
        assert _read_all(sock) == b""
        waited = time.monotonic() - answered
    assert 0.25 <= waited < 5


def test_a_head_begun_after_an_answer_is_held_to_the_head_deadline_not_the_keep_alive() -> None:
    """A byte after the answer ends the idle wait (as it cancels uvicorn's timer): the head deadline, counted from
    the answer, decides."""
    with (
        serve_guarded(_ok, ConnectionGuard(Limits(header_timeout=1.0), cap=16, keep_alive=0.2)) as url,
        _connect(url) as sock,
    ):
        _answered(sock)
        answered = time.monotonic()
        sock.sendall(HEAD)
        status, error = _refusal(_read_all(sock))
        waited = time.monotonic() - answered
    assert status == 408
    assert error["data"] == {"limit": "header_timeout", "maximum": 1.0}
    assert 0.9 <= waited < 5


def test_a_new_connection_is_held_to_the_head_deadline_not_the_keep_alive() -> None:
    """Keep-alive concerns answered connections only (uvicorn arms its timer after an answer)."""
    with (
        serve_guarded(_ok, ConnectionGuard(Limits(header_timeout=1.0), cap=16, keep_alive=0.2)) as url,
        _connect(url) as sock,
    ):
        began = time.monotonic()
        assert _read_all(sock) == b""
        waited = time.monotonic() - began
    assert 1.0 <= waited < 5


def test_at_the_connection_cap_a_head_waiting_past_the_keep_alive_is_the_oldest_and_makes_room() -> None:
    """Unfinished heads older than the keep-alive wait apart from the newer connections (ConnectionGuard.late):
    still the first to make room."""
    with serve_guarded(_ok, ConnectionGuard(Limits(header_timeout=30), cap=3, keep_alive=0.1)) as url:
        slow = [_connect(url) for _ in range(2)]
        for sock in slow:
            sock.sendall(b"GET / HTTP/1.1\r\n")
        with _connect(url) as answered:  # closed by the sweep that also finds both heads past the keep-alive
            _answered(answered)
            assert _read_all(answered) == b""
        with _connect(url) as fresh, _connect(url) as newcomer:  # the fourth: one connection must go
            assert _read_all(slow[0]) == b"", "the oldest unfinished head was closed for the newcomer"
            _answered(fresh)
            _answered(newcomer)
        for sock in slow:
            sock.close()


def test_at_the_connection_cap_the_oldest_waiting_connection_makes_room() -> None:
    with _serve(Limits(max_connections=4)) as (url, server):
        assert server.guard.cap == 4
        slow = [_connect(url) for _ in range(4)]
        for sock in slow:
            sock.sendall(b"GET /metrics HTTP/1.1\r\n")  # heads that never finish
        response = httpx.get(f"{url}/metrics", timeout=10)
        assert response.status_code == 200
        assert _read_all(slow[0]) == b"", "the oldest unfinished head was closed for the newcomer"
        for sock in slow:
            sock.close()


def test_at_the_connection_cap_with_every_connection_busy_a_newcomer_gets_503() -> None:
    with _serve(Limits(max_connections=3)) as (url, _):
        busy = [_connect(url) for _ in range(3)]
        for sock in busy:  # complete heads, bodies still to come: requests at work, not to be displaced
            sock.sendall(
                b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                b"accept: application/json, text/event-stream\r\nexpect: 100-continue\r\ncontent-length: 10\r\n\r\n"
            )
        for sock in busy:  # the app asked for the body: each request is at work
            assert sock.recv(100).startswith(b"HTTP/1.1 100 Continue")
        with _connect(url) as newcomer:
            status, error = _refusal(_read_all(newcomer))
        for sock in busy:
            sock.close()
    assert status == 503
    assert error["data"] == {"limit": "max_connections", "maximum": 3, "retryAfter": 1}


def test_the_connection_cap_stays_inside_the_open_file_limit() -> None:
    with _serve(Limits(), fd_limit=1024) as (_, server):
        assert server.guard.cap == 1024 - 128


def test_metrics_are_under_the_host_check_and_behind_their_token() -> None:
    with _serve(Limits(), metrics_token="s3cret") as (url, _):
        assert httpx.get(f"{url}/metrics", headers={"host": "evil.example"}, timeout=10).status_code == 403
        origin = {"origin": "http://evil.example", "authorization": "Bearer s3cret"}
        assert httpx.get(f"{url}/metrics", headers=origin, timeout=10).status_code == 403
        missing = httpx.get(f"{url}/metrics", timeout=10)
        assert missing.status_code == 401
        assert missing.headers["www-authenticate"].startswith("Bearer")
        wrong = httpx.get(f"{url}/metrics", headers={"authorization": "Bearer nope"}, timeout=10)
        assert wrong.status_code == 401
        right = httpx.get(f"{url}/metrics", headers={"authorization": "Bearer s3cret"}, timeout=10)
        assert right.status_code == 200
        assert 'mcp_lossless_limit_refusals_total{limit="max_header_bytes"}' not in right.text
        with _connect(url) as sock:
            sock.sendall(HEAD + b"x-big: " + b"a" * 40000 + b"\r\n\r\n")
            _read_all(sock)
        counted = httpx.get(f"{url}/metrics", headers={"authorization": "Bearer s3cret"}, timeout=10).text
    assert 'mcp_lossless_limit_refusals_total{limit="max_header_bytes"} 1.0' in counted


def test_slowloris_past_the_open_file_limit_leaves_honest_requests_fast() -> None:
    """1,100 unfinished heads against a server whose open-file limit is 1,024 (soft and hard, as ``ulimit -n``):
    it holds no more connections than its descriptors allow and displaces the oldest unfinished head for each
    newcomer, so honest requests arriving meanwhile are answered at once."""
    port = free_port()
    args = ["--store", "memory", "--auth", "none", "--port", str(port)]
    with started_cli_server(args, nofile=1024) as (_, started):
        assert started["max_connections"] == 1024 - 128
        url = f"http://127.0.0.1:{port}"
        slow = []
        try:
            for _ in range(1100):
                sock = socket.create_connection(("127.0.0.1", port), timeout=10)
                sock.sendall(b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nx-slow: ")
                slow.append(sock)
            latencies = []
            with httpx.Client(timeout=10) as client:
                for _ in range(30):
                    began = time.monotonic()
                    response = client.get(
                        f"{url}/.well-known/oauth-protected-resource/mcp", headers={"connection": "close"}
                    )
                    latencies.append(time.monotonic() - began)
                    assert response.status_code == 200
        finally:
            for sock in slow:
                sock.close()
    assert max(latencies) < 1.0, latencies
