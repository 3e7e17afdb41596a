"""HTTP-level protection, before a request reaches the ASGI app: the size and count of its head, a deadline for
its head and one for its body, and a bounded number of connections that displaces the oldest waiting one.

uvicorn with httptools offers none of these (``h11_max_incomplete_event_size`` applies to h11 only, and
``limit_concurrency`` answers 503 to the newcomer, who under slowloris is the honest client), so ``serve`` runs
a subclass of its httptools protocol that counts and times each connection; the verdicts are
:mod:`mcp_lossless.core.limits`'. A connection waiting for a request head (fresh, or idle after an answer) or for
a body sits in an insertion-ordered table; one sweep per server walks the tables from their oldest entry, so a
request costs a few dict operations, not a timer of its own. The sweep stays armed while any connection is open
(only an open connection has an entry), so a request does not arm it. The same sweep closes a keep-alive
connection left idle for ``keep_alive`` seconds after its answer, in place of the timer uvicorn arms and cancels
for each response. uvicorn's response-header checks are remembered per header text (:class:`KnownHeaders`), and a
response's head goes out in one write with its first body bytes (:class:`HeldHead`), and a response given whole
(:func:`..asgi.respond`) is written at once (:func:`send_whole`).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import types
from collections.abc import Callable
from http import HTTPStatus

import httptools
import orjson
from uvicorn._types import ASGI3Application
from uvicorn.protocols.http import httptools_impl
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from ..asgi.types import Headers
from ..core import limits as verdicts
from ..core.limits import LimitExceeded, Limits

SWEEP_SECONDS = (0.05, 1.0)
"""Bounds of the sweep interval: a quarter of the shortest deadline, within these."""
KEEP_ALIVE_SECONDS = 5
"""Seconds an answered connection may stay idle before it is closed: uvicorn's default ``timeout_keep_alive``."""
UNSENT_BYTES = 128 * 1024
"""Bytes a connection's kernel send queue takes beyond what is in flight (``TCP_NOTSENT_LOWAT``): past it a
write waits, so a client that does not read makes its stream's writer, then its tool, wait (docs/limits.md)
after this much rather than after the several megabytes the kernel's buffer grows to. What is in flight is
bounded by the client's receive window, so throughput on long links is unaffected."""
_NOTSENT_LOWAT = getattr(socket, "TCP_NOTSENT_LOWAT", None)
REQUEST_TASK = "http request"
"""The name of each request's task (uvicorn's ``run_asgi``)."""
HEADER_MEMO = (512, 256)
"""Header names and values whose check :class:`KnownHeaders` remembers at most, and the longest it remembers."""


class KnownHeaders(dict[bytes, "re.Match[bytes] | None"]):
    """uvicorn's check of each response header's name and value, a regex search (~370 ns; eight a response: the
    date and the writer's three headers), remembered by the text searched: nearly all are a server's constants,
    so each is searched once. Full, it starts afresh, so texts that vary (the date) do not grow it. A name or value
    must be ``bytes``, as ASGI has them (a ``bytearray``, unhashable, is refused where uvicorn's regex took it)."""

    __slots__ = ("_pattern",)

    def __init__(self, pattern: re.Pattern[bytes]) -> None:
        super().__init__()
        self._pattern = pattern

    def __missing__(self, text: bytes) -> re.Match[bytes] | None:
        found = self._pattern.search(text)
        if len(text) <= HEADER_MEMO[1]:
            if len(self) >= HEADER_MEMO[0]:
                self.clear()
            self[text] = found
        return found


def remember_header_checks() -> None:
    """Make uvicorn's two header checks :class:`KnownHeaders` (the same verdicts: a match refuses the header).
    Idempotent; a uvicorn without them is left alone."""
    for name in ("HEADER_RE", "HEADER_VALUE_RE"):
        pattern = getattr(httptools_impl, name, None)
        if isinstance(pattern, re.Pattern):
            setattr(httptools_impl, name, types.SimpleNamespace(search=KnownHeaders(pattern).__getitem__))


def refusal_bytes(exceeded: LimitExceeded) -> bytes:
    """A complete HTTP/1.1 response for ``exceeded`` that closes the connection."""
    body = orjson.dumps(exceeded.body())
    head = [
        b"HTTP/1.1 %d %s\r\n" % (exceeded.status, HTTPStatus(exceeded.status).phrase.encode()),
        b"content-type: application/json\r\n",
        b"content-length: %d\r\n" % len(body),
        b"connection: close\r\n",
        *(name + b": " + value + b"\r\n" for name, value in exceeded.headers()),
        b"\r\n",
    ]
    return b"".join(head) + body


class ConnectionGuard:
    """The connections of one server: who waits for a head or a body since when, and the sweep that times them."""

    def __init__(
        self,
        limits: Limits,
        cap: int,
        on_refusal: Callable[[str], None] = lambda limit: None,
        keep_alive: float = KEEP_ALIVE_SECONDS,
    ) -> None:
        self.limits = limits
        self.cap = cap
        """Connections held at most (:func:`mcp_lossless.core.limits.connection_cap`)."""
        self.on_refusal = on_refusal
        self.keep_alive = keep_alive
        """Seconds an answered connection may wait for its next request's first byte (uvicorn's
        ``timeout_keep_alive``, which this guard enforces instead of uvicorn's timer per response)."""
        self.heads: dict[GuardedHttpToolsProtocol, float] = {}
        """Connections with no request at work, by the moment they began waiting for a head: oldest first."""
        self.late: dict[GuardedHttpToolsProtocol, float] = {}
        """Connections of ``heads`` still waiting past ``keep_alive`` that are not idle (a head begun, or a new
        connection, which keep-alive does not concern): moved here by the sweep, so that it does not walk them
        again each time; the head deadline still counts from the same moment. All older than those of ``heads``."""
        self.bodies: dict[GuardedHttpToolsProtocol, float] = {}
        """Requests whose head arrived and whose body has not, by the moment the head arrived."""
        self.held_heads: list[HeldHead] = []
        """Response heads held this loop turn (:class:`HeldHead`)."""
        self.held = 0
        """Connections open now (refused ones until they are lost): the sweep runs while there are any."""
        self._sweep: asyncio.TimerHandle | None = None
        shortest = min(limits.header_timeout, limits.body_timeout, keep_alive) / 4
        self._interval = min(max(shortest, SWEEP_SECONDS[0]), SWEEP_SECONDS[1])

    def watch(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._sweep is None:
            self._sweep = loop.call_later(self._interval, self.sweep, loop)

    def sweep(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweep = None
        now = loop.time()
        heads, limits = self.heads, self.limits
        first = min(limits.header_timeout, self.keep_alive)
        while heads:
            protocol, since = next(iter(heads.items()))
            if now - since < first:
                break
            del heads[protocol]
            if now - since >= limits.header_timeout:
                protocol.refuse(verdicts.head_overdue(limits))
            elif protocol.idle():
                protocol.timeout_keep_alive_handler()  # uvicorn's own: closed without an answer
            else:
                self.late[protocol] = since
        for table, timeout, overdue in (
            (self.late, self.limits.header_timeout, verdicts.head_overdue),
            (self.bodies, self.limits.body_timeout, verdicts.body_overdue),
        ):
            while table:
                protocol, since = next(iter(table.items()))
                if now - since < timeout:
                    break
                del table[protocol]
                protocol.refuse(overdue(self.limits))
        if self.held:
            self.watch(loop)

    def make_room(self, newcomer: GuardedHttpToolsProtocol, held: int) -> bool:
        """Whether ``newcomer``, making ``held`` connections, may stay: at the cap, the oldest connection that
        waits for a head is closed in its favour (an honest client sends its head at once; slowloris never)."""
        if held <= self.cap:
            return True
        for table in (self.late, self.heads):  # oldest first
            for victim in table:
                if victim is not newcomer:
                    del table[victim]
                    victim.shed()
                    return True
        return False


class _HeadRefused(Exception):
    """Raised in the parser's callback to stop it after a refused head (httptools then raises its own error)."""


_FRAMING = frozenset({b"content-length", b"transfer-encoding", b"connection"})
"""Response headers that change how uvicorn frames or ends a response: one given leaves it to uvicorn's ``send``."""


def send_whole(cycle: RequestResponseCycle, status: int, headers: Headers, body: bytes) -> bool:
    """Write ``cycle``'s response whole at once (:data:`..asgi.send.WHOLE`, which the cycle's transport, a
    :class:`HeldHead`, offers): the head (the server's default headers encoded once per list, as uvicorn replaces
    it each second) and the body in one write, with uvicorn's checks of every header and its end of a response
    (the request's event, a close when not kept alive, the protocol's ``on_response``). Whatever uvicorn's ``send``
    would treat otherwise (a paused write, a ``HEAD``, an access log, a framing header, a header its checks refuse)
    is left to the messages (``False``). A function of the cycle, not a subclass of it: an instance whose class is
    swapped after uvicorn made it loses CPython's specialised attribute access, which cost a streamed (legacy) call
    some 16,000 instructions and a modern one more than the whole write saves (ADR 0042)."""
    if cycle.response_started or cycle.flow.write_paused or cycle.access_log or cycle.scope["method"] == "HEAD":
        return False
    if cycle.disconnected:
        return True  # uvicorn's send drops what comes after a disconnect
    defaults = _default_head(cycle.default_headers)
    if defaults is None:
        return False
    content = [httptools_impl.STATUS_LINE[status], defaults]
    name_check, value_check = httptools_impl.HEADER_RE.search, httptools_impl.HEADER_VALUE_RE.search
    for raw, value in headers:
        if name_check(raw) or value_check(value):
            return False  # uvicorn's send raises its own error for it
        name = raw.lower()
        if name in _FRAMING:
            return False
        content += (name, b": ", value, b"\r\n")
    content.append(b"content-length: %d\r\n" % len(body))
    keep_alive = cycle.keep_alive
    if not keep_alive:
        content.append(b"connection: close\r\n")
    content += (b"\r\n", body)
    cycle.response_started = True
    cycle.waiting_for_100_continue = False
    cycle.chunked_encoding = False
    transport = cycle.transport
    transport.write_whole(b"".join(content))  # type: ignore[attr-defined]  # the connection's HeldHead
    cycle.response_complete = True
    cycle.message_event.set()
    if not keep_alive:
        transport.close()
    cycle.on_response()
    return True


class HeldHead:
    """What a request's cycle writes through: a response's head is held until its first body bytes, so the two go
    out in one system call (uvicorn writes each ``send`` at once: two writes a response, the second costing some
    6 us of kernel time on loopback, measured). A head the app sends alone is written at the end of the loop turn
    in which it was held, so holding never delays it past that turn; the connections of a server share one
    callback a turn for it (``held``: the server's heads held this turn). An interim ``100 Continue`` is not held."""

    __slots__ = ("_head", "_held", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop, held: list[HeldHead]) -> None:
        self._transport = transport
        self._loop = loop
        self._held = held
        self._head: bytes | None = None

    def write(self, data: bytes) -> None:
        head = self._head
        if head is not None:
            self._head = None
            self._transport.write(head + data)
        elif data[:9] == b"HTTP/1.1 " and data[9:10] != b"1":
            self._head = data
            held = self._held
            held.append(self)
            if len(held) == 1:
                self._loop.call_soon(_write_held, held)
        else:
            self._transport.write(data)

    send_whole = staticmethod(send_whole)
    """The whole write a bound ``send`` finds through its cycle's transport (:data:`..asgi.send.WHOLE`)."""

    def write_whole(self, response: bytes) -> None:
        """A complete response (head and body): nothing to hold, written at once."""
        self._transport.write(response)

    def flush(self) -> None:
        head = self._head
        if head is not None:
            self._head = None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()


_DEFAULT_HEADS: list[tuple[list[tuple[bytes, bytes]], bytes | None]] = [([], b"")]
"""The last default-header list :func:`_default_head` encoded (kept, so its identity is not reused), and its text."""


def _default_head(defaults: list[tuple[bytes, bytes]]) -> bytes | None:
    """The server's default headers (``date``, ``server``, ``--header``) as uvicorn's ``send`` writes them; ``None``
    when one of them frames the response or fails uvicorn's checks (its ``send`` then decides)."""
    last, known = _DEFAULT_HEADS[0]
    if last is defaults:
        return known
    lines: list[bytes] = []
    text = None
    for raw, value in defaults:
        name = raw.lower()
        if httptools_impl.HEADER_RE.search(raw) or httptools_impl.HEADER_VALUE_RE.search(value) or name in _FRAMING:
            break
        lines += (name, b": ", value, b"\r\n")
    else:
        text = b"".join(lines)
    _DEFAULT_HEADS[0] = (defaults, text)
    return text


def _write_held(held: list[HeldHead]) -> None:
    """The end of the turn in which heads were held: those still waiting for their body go out alone."""
    for head in held:
        head.flush()
    held.clear()


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol, with the limits of :class:`ConnectionGuard` (set by :func:`guarded_protocol`).

    The callbacks that run per request call their base explicitly (``super()`` inspects the caller's frame on each
    call). Three are this guard's own rather than extensions of uvicorn's: ``data_received`` (counts the head's
    bytes and stops at a refused head), ``on_response_complete`` (an idle connection waits for the sweep, not for a
    keep-alive timer armed per response) and ``_start_asgi_task`` (the request's task made directly); each request
    cycle writes through the connection's :class:`HeldHead` (which offers :func:`send_whole`); the rest is
    uvicorn's, called, not copied. ``test_the_guarded_protocol_gives_the_app_what_uvicorns_own_gives_it``
    (tests/integration/test_http_limits.py) compares what the app gets and what the client receives with uvicorn's
    own protocol, so an upgrade of uvicorn that these overrides no longer match fails there. The guard's own fields
    are slots: uvicorn's instance holds 28 attributes, and five more overflow CPython's shared-key layout for
    instance attributes, which makes every attribute access of uvicorn's and ours a dict lookup (~2.7k
    instructions a request).
    """

    __slots__ = ("_carried", "_chunk_bytes", "_head_bytes", "_held_head", "_in_head", "_refusal")
    guard: ConnectionGuard

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        sock = transport.get_extra_info("socket")
        if sock is not None and _NOTSENT_LOWAT is not None:
            with contextlib.suppress(OSError):  # not TCP (a Unix socket): its buffer is small already
                sock.setsockopt(socket.IPPROTO_TCP, _NOTSENT_LOWAT, UNSENT_BYTES)
        self._head_bytes = 0
        """Bytes received since the head began to be awaited, counted a packet at a time (so past the limit, an
        unfinished head is refused before it is complete)."""
        self._chunk_bytes = 0
        """Bytes of the packet being parsed."""
        self._carried = 0
        """Bytes of the packet in which the previous request ended: the next head may have begun anywhere in it,
        and ``_head_bytes`` does not count them."""
        self._in_head = True
        self._refusal: LimitExceeded | None = None
        self._held_head = HeldHead(transport, self.loop, self.guard.held_heads)
        """What every request cycle of this connection writes through."""
        guard = self.guard
        guard.held += 1
        guard.watch(self.loop)
        if not guard.make_room(self, len(self.connections)):
            self.refuse(verdicts.connections_full(guard.limits, guard.cap))
            return
        guard.heads[self] = self.loop.time()

    def connection_lost(self, exc: Exception | None) -> None:
        guard = self.guard
        guard.held -= 1
        guard.heads.pop(self, None)
        guard.late.pop(self, None)
        guard.bodies.pop(self, None)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        """Feeds the parser, counting the head's bytes a packet at a time (a head past the limit is refused before
        it ends); a refused head stops the parser (``on_headers_complete`` raises), so nothing after it is served.
        No keep-alive timer to cancel: this protocol arms none."""
        if self._refusal is not None:
            return
        self._chunk_bytes = len(data)
        if self._in_head:
            self._head_bytes += self._chunk_bytes
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:
            if self._refusal is None:
                msg = "Invalid HTTP request received."
                self.logger.warning(msg)
                self.send_400_response(msg)
                return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
        if self._refusal is None and self._in_head and self._head_bytes > self.guard.limits.max_header_bytes:
            self._refusal = verdicts.request_head(self.guard.limits, self._head_bytes, 0)
        if self._refusal is not None:
            self.refuse(self._refusal)

    def on_headers_complete(self) -> None:
        self._in_head = False
        guard = self.guard
        if guard.heads.pop(self, None) is None:
            guard.late.pop(self, None)
        head = self.headers
        # The head came in the packet where the previous request ended and those counted since: when those bytes
        # are within the limit, so is the head, and its exact size need not be summed.
        size = self._head_bytes + self._carried
        limits = guard.limits
        if size > limits.max_header_bytes:
            size = len(self.url)
            for name, value in head:  # a plain loop: a generator or map costs more per header
                size += len(name) + len(value)
        # The verdict asked only of a head past a bound (nearly every head is within both, and passes)
        if size > limits.max_header_bytes or len(head) > limits.max_headers:
            self._refusal = verdicts.request_head(limits, size, len(head))
        if self._refusal is not None:
            # No request cycle, nothing of it reaches the app, and the parser stops here: neither this request's
            # body nor a request after it in the same packet is read (its answer would pass for this one's).
            raise _HeadRefused
        HttpToolsProtocol.on_headers_complete(self)
        cycle = self.cycle
        if cycle is not None:  # None: the first request asked for an upgrade, which has no cycle
            cycle.transport = self._held_head  # type: ignore[assignment]
        guard.bodies[self] = self.loop.time()

    def on_message_complete(self) -> None:
        self.guard.bodies.pop(self, None)
        self._in_head = True
        self._head_bytes = 0
        self._carried = self._chunk_bytes
        HttpToolsProtocol.on_message_complete(self)

    def on_response_complete(self) -> None:
        """Starts a pipelined request, or leaves the idle connection in ``heads``, where the sweep closes it after
        ``keep_alive``: a timer armed and cancelled per response, as uvicorn does it, cost ~7k instructions."""
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        elif self.cycle is None or self.cycle.response_complete:
            self.guard.heads[self] = self.loop.time()

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        """The request's task made directly and named: through uvloop's ``create_task`` a task is named
        ``Task-<n>`` by formatting first (and renamed after), and its keyword arguments are packed twice."""
        if getattr(self.config, "reset_contextvars", False) or self.loop.get_task_factory() is not None:
            HttpToolsProtocol._start_asgi_task(self, cycle, app)
            return
        task = asyncio.Task(cycle.run_asgi(app), loop=self.loop, name=REQUEST_TASK)
        task.add_done_callback(self.tasks.discard)
        self.tasks.add(task)

    def idle(self) -> bool:
        """Whether this connection was answered and has received nothing since (as uvicorn's timer, cancelled by
        the next packet, a new connection is not idle: only the head deadline bounds its wait)."""
        return self.cycle is not None and self._head_bytes == 0

    def shed(self) -> None:
        """Closed to make room for a newer connection (this one had no request at work)."""
        self.guard.on_refusal("max_connections")
        self.transport.close()

    def refuse(self, exceeded: LimitExceeded) -> None:
        """Answer ``exceeded`` and close; close without an answer when one is under way or nothing was asked."""
        self._refusal = exceeded
        guard = self.guard
        guard.heads.pop(self, None)
        guard.late.pop(self, None)
        guard.bodies.pop(self, None)
        transport = self.transport
        if transport.is_closing():
            return
        self.guard.on_refusal(exceeded.limit)
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            if exceeded.limit != "body_timeout" or cycle.response_started:
                transport.close()  # a response is under way (or another request's): it cannot be answered over
                return
            cycle.disconnected = True  # the app's receive() now reports a disconnect, its sends go nowhere
            cycle.message_event.set()
        elif exceeded.limit == "body_timeout" or (exceeded.limit == "header_timeout" and self._head_bytes == 0):
            transport.close()  # the request was answered already, or nothing was asked: nothing to answer
            return
        transport.write(refusal_bytes(exceeded))
        transport.close()


def guarded_protocol(guard: ConnectionGuard) -> type[GuardedHttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` whose connections share ``guard``."""
    remember_header_checks()
    return type("GuardedHttpToolsProtocol", (GuardedHttpToolsProtocol,), {"guard": guard})
