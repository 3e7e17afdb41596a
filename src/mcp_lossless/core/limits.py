"""Every resource a client can make the server hold has a limit: the values, and the verdicts against them.

The values live in one typed dataclass, :class:`Limits` (filled from ``serve`` flags or the ``[limits]`` table
of the config file; defaults in docs/limits.md). Each verdict is a pure function answering ``None`` (within the
limit) or a :class:`LimitExceeded`, which the adapters render unchanged: its HTTP status, ``Retry-After`` when
waiting helps, and a JSON-RPC error whose ``data`` names the limit and its value. The name of a limit is its
field name here, in the config file, in the flag (``--max-header-bytes``) and in every refusal.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from .errors import LIMIT_EXCEEDED
from .frames import error_message

FD_RESERVE_MIN = 64
"""File descriptors kept free for everything but client connections (store files, Redis, JWKS fetches, logs)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Defaults that no honest client or fleet of clients reaches, and that bound what a hostile one can hold."""

    max_header_bytes: int = 32 * 1024
    """Request line and header fields of one request, in bytes (431 beyond; an unfinished head is cut there)."""
    max_headers: int = 100
    """Header fields in one request (431 beyond)."""
    header_timeout: float = 10.0
    """Seconds a connection has to send a request's complete head, from its opening or its previous answer."""
    body_timeout: float = 30.0
    """Seconds a request has to send its complete body once its head has arrived."""
    max_connections: int = 4096
    """Open client connections; also capped by the process's file descriptor limit less a reserve. At the cap,
    a new connection displaces the oldest one that has not sent a complete request head; with none, it gets 503."""
    sessions_per_principal: int = 2000
    """Sessions one principal (issuer, subject, client) holds at once (429 beyond)."""
    calls_per_principal: int = 1000
    """Requests of one principal running at once, across its sessions (429 beyond)."""
    streams_per_session: int = 1000
    """Streams of one session whose requests still run (429 beyond)."""
    stream_backlog: int = 1024
    """Events of one stream stored and not yet sent to its client (none reading, or one reading slower than its
    tool writes): past it the tool's next progress or notification waits until the client has read half of them
    (or resumes). What bounds a stream's memory; the events themselves are safe in the store meanwhile."""
    stream_backlog_bytes: int = 8 * 1024 * 1024
    """The same backlog's payload bytes: whichever of the two is reached first makes the tool wait."""
    running_tasks: int = 1000
    """Tasks (2026-07-28 tasks extension) this process runs at once, waiting for input included (503 beyond,
    whatever the task store: a task costs this process memory until it ends)."""
    stored_bytes_per_principal: int = 64 * 1024 * 1024
    """What one principal's sessions make the event store hold, in bytes: its retained events (payload and a fixed
    per-row cost) and streams, as the store counts them (:meth:`~mcp_lossless.stores.base.EventStore.stored_bytes`).
    Past it, a new POST is refused (429) and a running call's progress or answer is refused in-band, ending the
    call with this refusal; DELETE, idle expiry and the store's retention release what they remove."""
    idempotency_keys_per_principal: int = 100_000
    """Idempotency keys (SEP-3182) one principal holds, each kept ``idempotency_seconds`` after its first use: a
    POST whose keyed calls would record more is refused (429). At the default window (24 h), about 1.2 keyed
    calls a second, sustained, from one principal; a key repeated (a replay, "in progress") records nothing."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"limits.{f.name} = {value!r}: must be a positive number")


@dataclass(frozen=True, slots=True)
class LimitExceeded:
    """A refusal because of one limit: what the adapters send, whatever the layer that found it."""

    limit: str
    """The :class:`Limits` field: the name the client sees."""
    maximum: float
    status: int
    message: str
    retry_after: int | None = None
    """Seconds after which the same request may succeed; ``None`` when waiting does not help."""

    def data(self) -> dict[str, Any]:
        """The JSON-RPC error's ``data``: the same whether the refusal is an HTTP answer or a call's in-band error."""
        data: dict[str, Any] = {"limit": self.limit, "maximum": self.maximum}
        if self.retry_after is not None:
            data["retryAfter"] = self.retry_after
        return data

    def body(self) -> dict[str, Any]:
        return error_message(None, LIMIT_EXCEEDED, self.message, self.data())

    def headers(self) -> list[tuple[bytes, bytes]]:
        return [] if self.retry_after is None else [(b"retry-after", b"%d" % self.retry_after)]


def request_head(limits: Limits, size: int, count: int) -> LimitExceeded | None:
    """A request head of ``size`` bytes (so far) and ``count`` header fields."""
    if size > limits.max_header_bytes:
        return LimitExceeded(
            "max_header_bytes", limits.max_header_bytes, 431, f"request head exceeds {limits.max_header_bytes} bytes"
        )
    if count > limits.max_headers:
        return LimitExceeded(
            "max_headers", limits.max_headers, 431, f"request has more than {limits.max_headers} headers"
        )
    return None


def head_overdue(limits: Limits) -> LimitExceeded:
    return LimitExceeded(
        "header_timeout", limits.header_timeout, 408, f"request head not received within {limits.header_timeout:g} s"
    )


def body_overdue(limits: Limits) -> LimitExceeded:
    return LimitExceeded(
        "body_timeout", limits.body_timeout, 408, f"request body not received within {limits.body_timeout:g} s"
    )


def connection_cap(limits: Limits, fd_limit: int) -> int:
    """Connections this process can hold: the configured maximum, within its file descriptor limit less a reserve
    (an eighth of it, at least :data:`FD_RESERVE_MIN`), so accepting never fails for want of a descriptor."""
    reserve = max(FD_RESERVE_MIN, fd_limit // 8)
    return max(1, min(limits.max_connections, fd_limit - reserve))


def body_too_large(maximum: int) -> LimitExceeded:
    """A request body past ``max_body_bytes`` (a server setting beside :class:`Limits`)."""
    return LimitExceeded("max_body_bytes", maximum, 413, f"request body exceeds {maximum} bytes")


def batch(maximum: int, length: int) -> LimitExceeded | None:
    """A JSON-RPC batch of ``length`` messages against ``max_batch`` (a server setting beside :class:`Limits`)."""
    if length <= maximum:
        return None
    return LimitExceeded(
        "max_batch", maximum, 400, f"a batch holds at most {maximum} messages (max_batch); this one has {length}"
    )


def connections_full(limits: Limits, cap: int) -> LimitExceeded:
    return LimitExceeded(
        "max_connections", cap, 503, f"server holds its maximum of {cap} connections, all busy", retry_after=1
    )


SESSION_RETRY_SECONDS = 60
"""A principal at its session cap frees a slot by ending a session (DELETE) or letting one expire."""
CALL_RETRY_SECONDS = 1


def new_session(limits: Limits, held: int) -> LimitExceeded | None:
    """A principal holding ``held`` sessions opens another."""
    cap = limits.sessions_per_principal
    if held < cap:
        return None
    return LimitExceeded(
        "sessions_per_principal",
        cap,
        429,
        f"this principal holds {cap} sessions, the most allowed; end one (DELETE) or retry later",
        retry_after=SESSION_RETRY_SECONDS,
    )


def new_calls(limits: Limits, running: int, calls: int) -> LimitExceeded | None:
    """A principal with ``running`` requests at work starts ``calls`` more."""
    cap = limits.calls_per_principal
    if running + calls <= cap:
        return None
    return LimitExceeded(
        "calls_per_principal",
        cap,
        429,
        f"this principal would run more than {cap} requests at once",
        retry_after=CALL_RETRY_SECONDS,
    )


def new_stream(limits: Limits, open_streams: int) -> LimitExceeded | None:
    """A session with ``open_streams`` streams still at work opens another."""
    cap = limits.streams_per_session
    if open_streams < cap:
        return None
    return LimitExceeded(
        "streams_per_session",
        cap,
        429,
        f"this session has {cap} streams at work, the most allowed",
        retry_after=CALL_RETRY_SECONDS,
    )


def new_post_stream(limits: Limits, open_streams: int, running: int, calls: int) -> LimitExceeded | None:
    """A session with ``open_streams`` streams at work opens one more for ``calls`` tool calls, its principal
    running ``running``: :func:`new_stream`'s verdict, else :func:`new_calls`' when there are calls. Within both
    caps (every POST but a refused one) it answers without calling either."""
    if open_streams < limits.streams_per_session and (not calls or running + calls <= limits.calls_per_principal):
        return None
    exceeded = new_stream(limits, open_streams)
    return new_calls(limits, running, calls) if exceeded is None and calls else exceeded


TASK_RETRY_SECONDS = 5


def new_running_task(limits: Limits, running: int) -> LimitExceeded | None:
    """A process running ``running`` tasks creates another."""
    cap = limits.running_tasks
    if running < cap:
        return None
    return LimitExceeded(
        "running_tasks",
        cap,
        503,
        f"this server runs {cap} tasks, the most allowed; retry later",
        retry_after=TASK_RETRY_SECONDS,
    )


KEYS_RETRY_SECONDS = 60
"""A principal at its key bound frees room only as its oldest keys expire."""


def new_keys(limits: Limits, held: int, keys: int) -> LimitExceeded | None:
    """A principal holding ``held`` idempotency keys records ``keys`` more."""
    cap = limits.idempotency_keys_per_principal
    if held + keys <= cap:
        return None
    return LimitExceeded(
        "idempotency_keys_per_principal",
        cap,
        429,
        f"this principal holds {held} idempotency keys, at most {cap} allowed; retry later, as they expire",
        retry_after=KEYS_RETRY_SECONDS,
    )


STORAGE_RETRY_SECONDS = 60
"""A principal at its storage bound frees room by ending a session (DELETE), or as retention removes its old
streams (a SQLite sweep runs every 30 s by default)."""


def stored(limits: Limits, held: int, size: int) -> LimitExceeded | None:
    """A principal whose sessions make the store hold ``held`` bytes would store ``size`` more (``0``: a POST about
    to open a stream, which stores at least its answer). Refused once nothing more fits."""
    cap = limits.stored_bytes_per_principal
    if held + max(size, 1) <= cap:
        return None
    return LimitExceeded(
        "stored_bytes_per_principal",
        cap,
        429,
        f"this principal's sessions hold {held} bytes in the event store, at most {cap} allowed; "
        "end a session (DELETE) or retry later",
        retry_after=STORAGE_RETRY_SECONDS,
    )
