"""Sessions bound to their principal, held in process and recorded in the store.

A request of another principal on a session gets the same 404 as an unknown session, so a session id
alone is worth nothing to anyone else. After a restart, a session is loaded back from the store.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from ..core.eventids import new_key
from ..core.principal import Principal
from ..stores.base import EventStore, SessionRecord
from .streams import LiveStream
from .tools import ToolContext


class Session:
    __slots__ = (
        "closing",
        "contexts",
        "get_stream",
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
        self.contexts: dict[str | int, ToolContext] = {}
        """Requests whose work still runs: the cancellable ones (``tasks`` also holds those recording an answer)."""
        self.outbound: dict[str, asyncio.Future[dict[str, Any]]] = {}
        """Server-to-client requests awaiting the client's response, by their id."""
        self.get_stream: str | None = None
        """Key of the standalone GET stream, once opened."""
        self.last_touch = 0.0
        self.closing: str | None = None
        """Why the session's calls are being cancelled: ``deleted``, ``expired`` or ``shutdown``."""

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
            live.done = True
            live.notify()


def new_session_id() -> str:
    """32 random bytes, base64url: visible ASCII (0x21-0x7E) as the spec requires."""
    return new_key(os.urandom(32))


class SessionRegistry:
    def __init__(self, store: EventStore) -> None:
        self._store = store
        self._sessions: dict[str, Session] = {}

    def __len__(self) -> int:
        return len(self._sessions)

    async def create(self, principal: Principal, version: str, now: float) -> Session:
        session = Session(new_session_id(), principal, version)
        await self._store.put_session(SessionRecord(session.id, principal, version, now, now))
        self._sessions[session.id] = session
        return session

    async def find(self, session_id: str, principal: Principal) -> Session | None:
        """The session if it exists and belongs to ``principal``; ``None`` otherwise (same answer for both)."""
        session = self._sessions.get(session_id)
        if session is None or self._store.shared:
            record = await self._store.get_session(session_id)
            if record is None:
                if session is not None:  # deleted or expired by another replica
                    self._sessions.pop(session_id, None)
                    await session.close("deleted")
                return None
            session = self._sessions.setdefault(
                session_id, Session(record.session_id, record.principal, record.protocol_version)
            )
        if session.principal is not principal and session.principal != principal:
            return None
        return session

    async def delete(self, session: Session) -> None:
        self._sessions.pop(session.id, None)
        await session.close("deleted")
        await self._store.delete_session(session.id)

    async def expire(self, idle_before: float) -> int:
        gone = await self._store.expire_sessions(idle_before)
        for session_id in gone:
            session = self._sessions.pop(session_id, None)
            if session is not None:
                await session.close("expired")
        return len(gone)

    async def touch(self, session: Session, now: float) -> None:
        """Record activity at most once a minute: a store write per request would sit on the hot path."""
        if now - session.last_touch >= 60.0:
            session.last_touch = now
            await self._store.touch_session(session.id, now)

    def all(self) -> list[Session]:
        return list(self._sessions.values())
