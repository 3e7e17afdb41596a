"""Sessions bound to their principal, held in process and recorded in the store.

A request of another principal on a session gets the same 404 as an unknown session, so a session id
alone is worth nothing to anyone else. After a restart, a session is loaded back from the store.

Each principal's sessions are also indexed by principal, for its caps (docs/limits.md): sessions held, requests
running across them, streams per session. The counts are this process's: replicas sharing a store each apply
the caps to the sessions they hold.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from operator import itemgetter
from typing import Any

from ..core import limits as verdicts
from ..core.eventids import new_key
from ..core.limits import LimitExceeded, Limits
from ..core.principal import Principal
from ..stores.base import EventStore, SessionRecord
from .errors import Refused
from .streams import LiveStream
from .tools import ToolContext

TOUCH_SECONDS = 60.0
"""A session's activity is recorded in the store at most this often (what its idle expiry reads)."""
_request_id = itemgetter(0)
"""A :class:`~..core.events.PendingRequest`'s id, without a Python frame per request."""


class ServerSession:
    """A client's session on this server: the requests it runs and the streams this process produces for it.

    Bound to the principal that created it (:class:`SessionRegistry` answers another principal as if it did not
    exist). What survives this process is in the store (its record, its streams' events); this object holds what
    only a running process has: tasks, cancellable contexts, outstanding server-to-client requests, live streams.
    """

    __slots__ = (
        "closing",
        "contexts",
        "get_stream",
        "held",
        "id",
        "last_touch",
        "live",
        "outbound",
        "principal",
        "tasks",
        "version",
    )

    def __init__(self, session_id: str, principal: Principal, version: str) -> None:
        self.id = session_id
        self.principal = principal
        self.version = version
        self.live: dict[str, LiveStream] = {}
        self.tasks: dict[str | int, asyncio.Task[None]] = {}
        """Requests at work, by id: changed through :meth:`start_task` and :meth:`end_task` only."""
        self.held: Held | None = None
        """The principal's entry in the registry that holds this session (``None`` once forgotten)."""
        self.contexts: dict[str | int, ToolContext] = {}
        """Requests whose work still runs: the cancellable ones (``tasks`` also holds those recording an answer)."""
        self.outbound: dict[str, asyncio.Future[dict[str, Any]]] = {}
        """Server-to-client requests awaiting the client's response, by their id."""
        self.get_stream: str | None = None
        """Key of the standalone GET stream, once opened."""
        self.last_touch = 0.0
        self.closing: str | None = None
        """Why the session's calls are being cancelled: ``deleted``, ``expired`` or ``shutdown``."""

    def start_task(self, request_id: str | int, task: asyncio.Task[None]) -> None:
        """``task`` works on request ``request_id`` until :meth:`end_task`; it counts against the principal's cap."""
        tasks = self.tasks
        held = self.held
        if held is not None and request_id not in tasks:
            held.running += 1
        tasks[request_id] = task

    def end_task(self, request_id: str | int) -> None:
        if self.tasks.pop(request_id, None) is not None and self.held is not None:
            self.held.running -= 1

    async def close(self, reason: str) -> None:
        """Cancel running calls and wait for them (and for answers being recorded) to record their outcome."""
        self.closing = reason
        tasks = list(self.tasks.values())
        for request_id, task in self.tasks.items():
            if request_id in self.contexts:  # still working: answers being recorded are not cut short
                task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        for live in self.live.values():
            live.end()

    def forget_if_finished(self, live: LiveStream) -> None:
        """Forget a finished stream once no request of it still runs; later resumes read it from the store.

        The one rule for dropping a live stream: its last request's task and its POST (which may be the same
        task, ADR 0008) both apply it, whichever finishes last forgets it.
        """
        stream = live.record.stream
        if live.done and stream in self.live and self.tasks.keys().isdisjoint(map(_request_id, live.record.requests)):
            del self.live[stream]  # (the second to apply it finds it gone at once)


class Held:
    """One principal's sessions in this process, and its requests at work across them and without a session.

    ``running`` is what the cap of concurrent calls counts, kept in step where a request starts and ends
    (:meth:`ServerSession.start_task`, :meth:`SessionRegistry.hold_call`): admitting a call costs no walk over the
    principal's sessions.
    """

    __slots__ = ("running", "sessions")

    def __init__(self) -> None:
        self.sessions: dict[str, ServerSession] = {}
        self.running = 0


def new_session_id() -> str:
    """32 random bytes, base64url: visible ASCII (0x21-0x7E) as the spec requires."""
    return new_key(os.urandom(32))


class SessionRegistry:
    """Every session of this process, found by id *and* principal, and kept in step with the store.

    Sessions outlive a process and are shared by replicas (a shared store): one not held here is loaded from its
    record; one deleted or expired elsewhere is closed here when next looked up.
    """

    def __init__(
        self, store: EventStore, limits: Limits | None = None, on_refusal: Callable[[str], None] = lambda limit: None
    ) -> None:
        self._store = store
        self._limits = limits or Limits()
        self._on_refusal = on_refusal
        self.stored_bytes = store.stored_bytes
        """What a principal's sessions make the store hold (:meth:`~..stores.base.EventStore.stored_bytes`)."""
        self.storage_cap = self._limits.stored_bytes_per_principal
        self._sessions: dict[str, ServerSession] = {}
        self._held: dict[Principal, Held] = {}
        """Each principal's sessions and requests at work in this process, for its caps; an entry goes with the
        principal's last session and request."""

    def __len__(self) -> int:
        return len(self._sessions)

    async def create(self, principal: Principal, version: str, now: float) -> ServerSession:
        """A new session for ``principal``; 429 when it holds its maximum already."""
        held = self._held.get(principal)
        self._check(verdicts.new_session(self._limits, len(held.sessions) if held else 0))
        session = ServerSession(new_session_id(), principal, version)
        await self._store.put_session(SessionRecord(session.id, principal, version, now, now))
        self._add(session)
        return session

    def admit(self, session: ServerSession, calls: int) -> None:
        """A POST about to open a stream on ``session`` carrying ``calls`` tool calls: 429 before anything is
        committed when the session holds its maximum of streams, the calls would take the principal past its
        cap of requests running across all its sessions (another principal's requests never count), or its
        sessions hold all the store may hold for it (every stream stores at least its answers)."""
        held = session.held
        running = self.running_calls(session.principal) if held is None else held.running
        exceeded = verdicts.new_post_stream(self._limits, len(session.live), running, calls)
        if exceeded is not None:
            self._check(exceeded)
        stored = self.stored_bytes(session.principal)
        if stored >= self.storage_cap:  # the verdict's frames only when refused
            self._check(verdicts.stored(self._limits, stored, 0))

    def storing(self, principal: Principal, size: int) -> LimitExceeded | None:
        """``principal`` is about to make the store hold ``size`` bytes more (``0``: a POST's new stream): the
        verdict past ``stored_bytes_per_principal``, counted as a refusal; the store answers from process memory
        (:meth:`~..stores.base.EventStore.stored_bytes`), so asking costs no round trip."""
        exceeded = verdicts.stored(self._limits, self.stored_bytes(principal), size)
        if exceeded is not None:
            self._on_refusal(exceeded.limit)
        return exceeded

    def running_calls(self, principal: Principal) -> int:
        """The principal's requests at work in this process, in both eras: what its cap of concurrent calls counts."""
        held = self._held.get(principal)
        return 0 if held is None else held.running

    def running_total(self) -> int:
        """Every request at work in this process, in both eras, tasks included: what a drain waits for."""
        return sum(held.running for held in self._held.values())

    def start_call(self, principal: Principal) -> LimitExceeded | None:
        """A sessionless (2026-07-28) call of ``principal`` starts: the verdict past its cap, else it is counted
        until :meth:`end_call` (the modern leg renders the verdict in its own error shape). :meth:`running_calls`
        and :meth:`hold_call` written out on one look-up: this runs once a 2026-07-28 call."""
        held = self._held.get(principal)
        exceeded = verdicts.new_calls(self._limits, 0 if held is None else held.running, 1)
        if exceeded is not None:
            self._on_refusal(exceeded.limit)
            return exceeded
        if held is None:
            held = self._held[principal] = Held()
        held.running += 1
        return None

    def hold_call(self, principal: Principal) -> None:
        """Count a call admitted already (a task taking over its request's place) until :meth:`end_call`."""
        held = self._held.get(principal)
        if held is None:
            held = self._held[principal] = Held()
        held.running += 1

    def end_call(self, principal: Principal) -> None:
        held = self._held.get(principal)
        if held is not None:
            held.running -= 1
            if not held.sessions and held.running <= 0:  # _drop_if_idle written out: once a 2026-07-28 call
                del self._held[principal]

    def _drop_if_idle(self, principal: Principal, held: Held) -> None:
        if not held.sessions and held.running <= 0:
            del self._held[principal]

    def _check(self, exceeded: LimitExceeded | None) -> None:
        if exceeded is not None:
            self._on_refusal(exceeded.limit)
            raise Refused.over(exceeded)

    def _add(self, session: ServerSession) -> None:
        self._sessions[session.id] = session
        held = self._held.get(session.principal)
        if held is None:
            held = self._held[session.principal] = Held()
        held.sessions[session.id] = session
        held.running += len(session.tasks)
        session.held = held

    def _forget(self, session_id: str) -> ServerSession | None:
        """Stop holding a session: its requests still at work (a closing session's) no longer count."""
        session = self._sessions.pop(session_id, None)
        if session is not None:
            held = session.held
            session.held = None
            if held is not None:
                del held.sessions[session_id]
                held.running -= len(session.tasks)
                self._drop_if_idle(session.principal, held)
        return session

    async def find(self, session_id: str, principal: Principal) -> ServerSession | None:
        """The session if it exists and belongs to ``principal``; ``None`` otherwise (same answer for both)."""
        session = self._sessions.get(session_id)
        if session is None or self._store.shared:
            record = await self._store.get_session(session_id)
            if record is None:
                if session is not None:  # deleted or expired by another replica
                    self._forget(session_id)
                    await session.close("deleted")
                return None
            # Another request of the session may have restored it while this one read the store: one object per
            # session, or a call's live stream registered on one is not found by a resume looking on the other.
            session = self._sessions.get(session_id)
            if session is None:
                session = ServerSession(record.session_id, record.principal, record.protocol_version)
                self._add(session)
        if session.principal is not principal and session.principal != principal:
            return None
        return session

    async def delete(self, session: ServerSession) -> None:
        self._forget(session.id)
        await session.close("deleted")
        await self._store.delete_session(session.id)

    async def expire(self, idle_before: float) -> int:
        gone = await self._store.expire_sessions(idle_before)
        for session_id in gone:
            session = self._forget(session_id)
            if session is not None:
                await session.close("expired")
        return len(gone)

    def recent(self, session_id: str, principal: Principal, now: float) -> ServerSession | None:
        """:meth:`find`'s answer without a coroutine, for a session held here for ``principal`` when the store is
        this process's own and the session's activity needs no recording (:meth:`stale`): nearly every request.
        ``None``: ask :meth:`find` (and :meth:`touch` when due)."""
        session = self._sessions.get(session_id)
        if (
            session is None
            or self._store.shared
            or now - session.last_touch >= TOUCH_SECONDS
            or (session.principal is not principal and session.principal != principal)
        ):
            return None
        return session

    @staticmethod
    def stale(session: ServerSession, now: float) -> bool:
        """Whether ``session``'s activity is due to be recorded (:meth:`touch`): at most once every
        :data:`TOUCH_SECONDS`, as a store write per request would sit on the hot path. Asked first, so a request
        that records nothing awaits nothing."""
        return now - session.last_touch >= TOUCH_SECONDS

    async def touch(self, session: ServerSession, now: float) -> None:
        """Record activity; its caller asks :meth:`stale` first."""
        session.last_touch = now
        await self._store.touch_session(session.id, now)

    def all(self) -> list[ServerSession]:
        return list(self._sessions.values())

    def live(self, session_id: str, stream: str) -> LiveStream | None:
        """``stream`` if this process produces it for the session it holds as ``session_id`` (a keyed POST's
        duplicate, which may come on another session, asks whether its first use still runs here)."""
        session = self._sessions.get(session_id)
        return None if session is None else session.live.get(stream)
