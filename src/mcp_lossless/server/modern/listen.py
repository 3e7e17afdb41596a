"""``subscriptions/listen`` on the 2026-07-28 leg: one open stream per subscription, carrying the task state
and tool-list changes it asked for, authorized like a poll at every push."""

from __future__ import annotations

import asyncio
from typing import Any, assert_never

from ...asgi import Receive, Send, disconnected
from ...core import errors, frames, protocol
from ...core.events import RequestId
from ...core.principal import Grant
from ...core.tasks import Deliver, Denied, Purpose, Unknown, detailed_task
from ..observability import now
from ..writer import SSE_HEADERS
from .inline import LoopHolder
from .replies import missing_extension, refused
from .tasks import Tasks

KEEPALIVE_SECONDS = 15.0
MAX_LISTENERS = 1024
"""Open ``subscriptions/listen`` streams per process; one more is refused with 503."""
MAX_WATCHED_TASKS = 100
"""Task ids one listen stream may watch; the acknowledgement agrees to the first this many it may see."""
PUSH_POLL_SECONDS = 1.0
"""A listen stream watching tasks re-reads them this often besides being woken: a task changed by another
replica is pushed within this long."""


class Listeners:
    """The open listen streams of this process, and whom to wake when a task or the tool list changes."""

    def __init__(self, state: LoopHolder, tasks: Tasks, tools_change: bool) -> None:
        self.state = state
        self.tasks = tasks
        self.tools_change = tools_change
        """The server announces ``tools.listChanged`` (a gateway): ``toolsListChanged`` is honoured."""
        self.count = 0
        self._tool_listeners: set[asyncio.Event] = set()
        """Open listen streams that asked for ``toolsListChanged`` (only honoured when tools may change)."""

    async def listen(
        self, receive: Receive, send: Send, grant: Grant, rid: RequestId, params: dict[str, Any], declared: bool
    ) -> None:
        """``subscriptions/listen``: the acknowledgement, then an open stream until the client leaves.

        Task state is pushed (``notifications/tasks``, the ``DetailedTask`` a ``tasks/get`` would answer) for the
        ``taskIds`` this stream's token may see, decided by :func:`~mcp_lossless.core.tasks.decide_poll` exactly as
        a poll with that token, at subscription and again at every push: another principal's id, an unknown one
        and one whose tool the token does not cover are left out of the acknowledgement (a poll tells the last
        apart: 403 ``TASK_DENIED``), and a task the token stops covering is no longer pushed. A push does not
        restart the task's TTL; only polls do. A server whose tools change (a gateway, which announces
        ``tools.listChanged``) honours ``toolsListChanged``: each change is one
        ``notifications/tools/list_changed`` on the stream (changes while one is being written coalesce).
        Anything else it agrees not to send, and the stream carries keep-alives.
        """
        wanted = params.get("notifications")
        task_ids = wanted.get("taskIds") if isinstance(wanted, dict) else None
        if task_ids is not None and not declared:
            raise missing_extension()
        if task_ids is not None and not (isinstance(task_ids, list) and all(isinstance(t, str) for t in task_ids)):
            raise refused(400, errors.INVALID_PARAMS, "notifications.taskIds must be a list of task id strings")
        if self.count >= MAX_LISTENERS:
            raise refused(503, errors.INTERNAL_ERROR, f"{MAX_LISTENERS} listen streams are open, the limit")
        meta = {protocol.SUBSCRIPTION_META_KEY: rid}
        tools = self.tools_change
        tools = tools and isinstance(wanted, dict) and wanted.get("toolsListChanged") is True
        watched: dict[str, tuple[object, ...] | None] = {}
        """Each watched task, with what its last push said (``None``: nothing pushed yet)."""
        for task_id in list(dict.fromkeys(task_ids or ()))[:MAX_WATCHED_TASKS]:
            if isinstance(await self.tasks.look(grant, task_id, Purpose.WATCH), Deliver):
                watched[task_id] = None
        agreed: dict[str, Any] = {"toolsListChanged": True} if tools else {}
        if task_ids is not None:
            agreed["taskIds"] = list(watched)
        ack = {"notifications": agreed, "_meta": meta}
        changed, tasks_changed = asyncio.Event(), asyncio.Event()
        if tools:
            self._tool_listeners.add(changed)
        for task_id in watched:
            self.tasks.watchers.setdefault(task_id, set()).add(tasks_changed)
        self.count += 1
        gone = self.state.loop.create_task(disconnected(receive))
        try:
            await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
            body = frames.sse(None, frames.notification("notifications/subscriptions/acknowledged", ack))
            await send({"type": "http.response.body", "body": body, "more_body": True})
            quiet_since = now()
            while True:
                if watched:
                    for note in await self._task_pushes(grant, watched, meta):
                        await send({"type": "http.response.body", "body": frames.sse(None, note), "more_body": True})
                        quiet_since = now()
                wakers = {
                    self.state.loop.create_task(changed.wait()),
                    self.state.loop.create_task(tasks_changed.wait()),
                }
                try:
                    timeout = PUSH_POLL_SECONDS if watched else KEEPALIVE_SECONDS
                    done, _ = await asyncio.wait({gone, *wakers}, timeout=timeout, return_when="FIRST_COMPLETED")
                finally:
                    for waker in wakers:
                        waker.cancel()
                if gone in done:
                    break
                tasks_changed.clear()
                if changed.is_set():
                    changed.clear()
                    note = frames.notification("notifications/tools/list_changed", {"_meta": meta})
                    await send({"type": "http.response.body", "body": frames.sse(None, note), "more_body": True})
                    quiet_since = now()
                elif now() - quiet_since >= KEEPALIVE_SECONDS:
                    await send({"type": "http.response.body", "body": b":\n\n", "more_body": True})
                    quiet_since = now()
        finally:
            gone.cancel()
            self._tool_listeners.discard(changed)
            for task_id in watched:
                listeners = self.tasks.watchers.get(task_id)
                if listeners is not None:
                    listeners.discard(tasks_changed)
                    if not listeners:
                        del self.tasks.watchers[task_id]
            self.count -= 1

    async def _task_pushes(
        self, grant: Grant, watched: dict[str, tuple[object, ...] | None], meta: dict[str, Any]
    ) -> list[bytes]:
        """The ``notifications/tasks`` a listen stream owes: each watched task whose state changed since its last
        push, authorized now against the stream's token like a poll; a terminal task is pushed once, then
        forgotten, as is one the token may no longer see."""
        notes = []
        for task_id, last in list(watched.items()):
            match await self.tasks.look(grant, task_id, Purpose.PUSH):
                case Unknown() | Denied():
                    del watched[task_id]
                    continue
                case Deliver(record=record):
                    pass
                case unreachable:
                    assert_never(unreachable)
            state = (record.status, record.updated_at, tuple(record.input_requests))
            if state != last:
                watched[task_id] = state
                params = {**detailed_task(record, self.tasks.poll_ms), "_meta": meta}
                notes.append(frames.notification("notifications/tasks", params))
            if record.status.terminal:
                del watched[task_id]
        return notes

    def tools_changed(self) -> None:
        """The tool list changed: every listener that asked for ``toolsListChanged`` is told."""
        for changed in self._tool_listeners:
            changed.set()
