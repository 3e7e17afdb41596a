"""Tasks of the 2026-07-28 leg (the tasks extension, SEP-2663): created, run detached from their request, polled,
updated with input, cancelled, streamed (SEP-2694), and settled lost when their process is gone.

Every look at a task is :func:`~mcp_lossless.core.tasks.decide_poll` against the token of that request
(:meth:`Tasks.look`): another principal's task is answered like an unknown id, and the owner's task whose tool
the token no longer covers gets a 403 with the same challenge a refused call gets and the resumable
:data:`~mcp_lossless.core.errors.TASK_DENIED` error, never its result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, NoReturn, Protocol, assert_never

from ... import tracing
from ...asgi import Receive, Send
from ...core import errors, frames, mrtr
from ...core.events import RequestId
from ...core.limits import new_running_task
from ...core.principal import Grant
from ...core.resources import AudiencePolicy, requirement, resources_in, scopes_in
from ...core.task_stream import EventType, StreamDenied, stream_denial_error
from ...core.tasks import (
    UNKNOWN_MESSAGE,
    Deliver,
    Denied,
    IllegalTransition,
    NeedRunner,
    PollFacts,
    Purpose,
    Requirement,
    SettleLost,
    TaskRecord,
    TaskStatus,
    Unknown,
    advance,
    answered,
    awaiting_input,
    consumed,
    decide_poll,
    denial_error,
    denial_message,
    described,
    detailed_task,
    lost,
    new_task,
    task_view,
)
from ...stores.base import EventStore, StoreUnavailable
from ...stores.tasks import AppendingTaskStore, TaskLimitReached, TaskStore
from ..config import ServerConfig
from ..errors import Refused
from ..keys import stream_key
from ..observability import Metrics, log_decision, now
from ..sessions import SessionRegistry
from ..task_stream import TaskEvents, TaskStreams
from ..tools import InputRequests, MethodError, RegisteredTool, ToolContext
from .inline import RequestChannel, run_tool
from .replies import answer, invalid_params, missing_extension, refused, scope_challenge

log = logging.getLogger("mcp_lossless.modern")

PURGE_EVERY_SECONDS = 60.0
STORE_ATTEMPTS = 8
"""Tries to store a task's outcome (backing off to 5 s between them) before giving up on it."""
INPUT_POLL_SECONDS = 1.0
"""A task waiting for input looks at the store this often besides being woken: ``tasks/update`` may reach
another replica, which can only leave the answers in the store."""
DESCRIBE_EVERY_SECONDS = 0.1
"""A running task's progress is stored as its status message at most this often (a store write each time)."""


class TaskState(Protocol):
    """The part of the server's state the tasks read. Read at each use, not copied: a gateway re-indexes its
    tools (``tool_tags``, ``policy``) when an upstream's list changes."""

    config: ServerConfig
    instance: str
    metrics: Metrics
    sessions: SessionRegistry
    tool_tags: dict[str, frozenset[str]]
    policy: AudiencePolicy
    prm_url: str
    store: EventStore

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...


class TaskChannel(RequestChannel):
    """A task's way back: its tool's progress becomes the task's ``statusMessage`` (the extension's progress
    description), which its polls show; no log messages; input is taken from what its ``tools/call`` gathered,
    else asked through the task's own ``input_required`` state."""

    __slots__ = ("described_at", "leg", "task_id")

    def __init__(self, leg: Tasks, capabilities: dict[str, Any], answers: dict[str, dict[str, Any]]) -> None:
        super().__init__(capabilities, None, answers)
        self.leg = leg
        self.task_id = ""
        self.described_at = float("-inf")

    def close_stream(self) -> None:
        """Done already: a task holds no connection, its client polls (what the close asks a client to do)."""
        return None

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        if method == "notifications/message":
            await self.leg.events.emit(self.task_id, EventType.LOG, _picked(params, ("level", "logger", "data")))
        if method != "notifications/progress":
            return
        progress = _picked(params, ("progress", "total", "message"))
        await self.leg.events.emit(self.task_id, EventType.PROGRESS, progress)  # every one: the stream is the record
        at = now()
        if at - self.described_at < DESCRIBE_EVERY_SECONDS:
            return
        self.described_at = at
        await self.leg.describe(self.task_id, _progress_text(params))

    async def ask(self, requests: InputRequests) -> dict[str, dict[str, Any]]:
        self._check_capabilities(requests)
        got = self._take(requests)
        rest = {key: request for key, request in requests.items() if key not in got}
        if rest:
            got.update(await self.leg.await_input(self.task_id, rest))
        return got


def _picked(params: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """The fields of a notification a task event keeps (its ``_meta`` and token are the request's, not the task's)."""
    return {key: params[key] for key in keys if key in params}


def _progress_text(params: dict[str, Any]) -> str:
    """A progress notification as a status message: its own message, else ``progress/total``."""
    message = params.get("message")
    if isinstance(message, str) and message:
        return message
    progress, total = params.get("progress"), params.get("total")
    return f"{progress}/{total}" if total is not None else f"{progress}"


class _Inbox:
    """A running task's input: its lock (the task's record is read, changed and written under it in this
    process) and the event a local ``tasks/update`` sets."""

    __slots__ = ("lock", "wake")

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.wake = asyncio.Event()


class Tasks:
    """The tasks this process runs and every request about a task; the task store is their record."""

    def __init__(
        self,
        state: TaskState,
        store: TaskStore,
        *,
        ttl: float | None = 3600.0,
        poll_ms: int = 500,
    ) -> None:
        self.state = state
        self.store = store
        self.ttl = ttl
        """Seconds a task is kept after its last status change or its owner's last poll (``None``: unlimited)."""
        self.poll_ms = poll_ms
        self.running: dict[str, asyncio.Task[None]] = {}
        """Tasks this process runs, by task id: a live task of this instance missing here was lost."""
        self.cancelling: set[str] = set()
        self.inboxes: dict[str, _Inbox] = {}
        self._purged_at = 0.0
        self.watchers: dict[str, set[asyncio.Event]] = {}
        """Listen streams watching a task (:class:`.listen.Listeners`), woken when this process stores a change of
        it (others find out by polling)."""
        self.events = TaskEvents(state.store, state.instance)
        """Each running task's events, kept as a stream of the event store (SEP-2694, ADR 0031)."""
        self.streams = TaskStreams(self.events, state.policy)
        self._appending = store if isinstance(store, AppendingTaskStore) else None
        """The store, when it stores an outcome and its event in one write (SQLite): asked once, not per task."""

    async def _update(self, record: TaskRecord) -> TaskRecord | None:
        """Store a task's new state (:meth:`.TaskStore.update`) and wake the listen streams watching it here."""
        appending = self._appending
        if appending is not None and record.status.terminal and record.task_id in self.running:
            stored = await self.events.settle(record, appending)  # the outcome and its event in one write
        else:
            stored = await self.store.update(record)
            if stored is not None and record.task_id in self.running:  # this process produces the task's events
                await self.events.observe(stored)
        for watcher in self.watchers.get(record.task_id, ()):
            watcher.set()
        return stored

    async def create(
        self, grant: Grant, tool: RegisteredTool, params: dict[str, Any], channel: TaskChannel
    ) -> dict[str, Any]:
        """Create and start the task; its ``CreateTaskResult`` (without ``resultType``)."""
        s = self.state
        self.check_room()
        at = now()
        if at - self._purged_at > PURGE_EVERY_SECONDS:
            self._purged_at = at
            await self.store.purge_expired(at)
        tags = s.tool_tags[tool.name]
        requirement = Requirement(frozenset(resources_in(tags)), frozenset(scopes_in(tags)))
        # The id begins with its time (a stream key, 144 random bits after it): the task's rows and its stream's go at
        # the end of the SQLite file's B-trees, so the tasks created, settled and polled in one commit share a few
        # pages instead of each dirtying a random one (ADR 0039).
        record = new_task(stream_key(), grant.principal, tool.name, requirement, s.instance, at, self.ttl)
        try:
            await self._store_new(record)  # durable before the client hears of it
        except TaskLimitReached as exc:
            raise refused(503, errors.INTERNAL_ERROR, str(exc), headers=[(b"retry-after", b"5")]) from None
        channel.task_id = record.task_id
        self.inboxes[record.task_id] = _Inbox()
        s.sessions.hold_call(grant.principal)  # the task takes its request's place under the principal's cap
        self.running[record.task_id] = s.loop.create_task(self._run_task(record, tool, params, grant, channel))
        log_decision("task_created", task=record.task_id[:8], tool=tool.name)
        return task_view(record, self.poll_ms)

    async def _store_new(self, record: TaskRecord) -> None:
        """The task's record and its event stream, both stored before the client hears of the task. The record's
        write is asked for first and awaited last: a store that queues it at once (SQLite) commits it with the
        stream's session, one trip to its writer instead of two. A record the store refuses takes its stream along.
        """
        created = self.store.create(record)
        try:
            await self.events.open(record)
        finally:
            try:
                await created
            except Exception:
                await self.events.discard(record)
                raise

    def check_room(self) -> None:
        """503 past ``running_tasks``: a running task holds this process's memory, whatever the store."""
        s = self.state
        exceeded = new_running_task(s.config.limits, len(self.running))
        if exceeded is not None:
            s.metrics.limit_refusals.labels(exceeded.limit).inc()
            raise Refused.over(exceeded)

    async def _run_task(
        self, record: TaskRecord, tool: RegisteredTool, params: dict[str, Any], grant: Grant, channel: TaskChannel
    ) -> None:
        ctx = ToolContext(grant, record.task_id, record.task_id, channel)  # progress always wanted: polls show it
        task_id = record.task_id
        try:
            try:
                result = await run_tool(tool, params, ctx)  # awaited first: the clock is read when it ends
                settled = advance(record, TaskStatus.COMPLETED, now(), result=result)
            except MethodError as exc:
                error = frames.error_message(None, exc.code, exc.message, exc.data)["error"]
                settled = advance(record, TaskStatus.FAILED, now(), message=exc.message, error=error)
            except asyncio.CancelledError:
                if task_id in self.cancelling:
                    settled = advance(record, TaskStatus.CANCELLED, now(), message="cancelled by its owner")
                else:
                    settled = lost(record, now())
            await self._store_outcome(settled)
        finally:
            self.running.pop(task_id, None)
            self.inboxes.pop(task_id, None)
            self.cancelling.discard(task_id)
            self.state.sessions.end_call(grant.principal)

    async def await_input(self, task_id: str, requests: InputRequests) -> dict[str, dict[str, Any]]:
        """A running task's tool asks the client: the task shows ``input_required`` with ``requests`` (beside any
        still unanswered) until ``tasks/update`` answers them all, on this replica or another; then it works on.

        The wait lasts while the task lives: a task whose owner stops polling expires a TTL later and the tool
        gets ``TimeoutError``; a task cancelled or settled elsewhere stops its tool.
        """
        inbox = self.inboxes[task_id]
        wire = {key: {"method": method, "params": params} for key, (method, params) in requests.items()}
        keys = frozenset(requests)
        async with inbox.lock:
            record = await self._live_task(task_id)
            try:
                waiting = awaiting_input(record, wire, now())
            except IllegalTransition as exc:
                raise MethodError(errors.INTERNAL_ERROR, str(exc)) from None
            await self._update(waiting)
        log_decision("task_input_required", task=task_id[:8], keys=sorted(keys))
        while True:
            inbox.wake.clear()
            async with inbox.lock:
                record = await self._live_task(task_id)
                if keys <= record.input_responses.keys():
                    await self._update(consumed(record, keys))
                    return {key: record.input_responses[key] for key in requests}
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(inbox.wake.wait(), INPUT_POLL_SECONDS)

    async def _live_task(self, task_id: str) -> TaskRecord:
        """The stored task of a tool still running here: cancelled if the task ended elsewhere (a cancel from
        another replica), ``TimeoutError`` if it expired waiting for its owner."""
        record = await self.store.get(task_id)
        if record is None or record.expired(now()):
            raise TimeoutError(f"task {task_id} expired waiting for the client's input")
        if record.status.terminal:
            raise asyncio.CancelledError(f"task {task_id} ended elsewhere ({record.status.value})")
        return record

    async def _deliver(self, task_id: str, raw: object) -> None:
        """``tasks/update``: the answers reach the task's record (the store, so any replica's tool sees them);
        this replica's tool is woken at once."""
        responses = mrtr.input_responses(raw)
        inbox = self.inboxes.get(task_id)
        lock = inbox.lock if inbox is not None else asyncio.Lock()  # elsewhere, the store's write is the order
        async with lock:
            record = await self.store.get(task_id)
            fresh = None if record is None else answered(record, responses, now())
            if fresh is not record and fresh is not None:
                await self._update(fresh)
        if inbox is not None:
            inbox.wake.set()

    async def describe(self, task_id: str, message: str) -> None:
        """Store a running task's progress as its status message (under the task's lock, as its input is);
        advisory, so a store outage skips it."""
        inbox = self.inboxes.get(task_id)
        if inbox is None:
            return
        try:
            async with inbox.lock:
                record = await self.store.get(task_id)
                if record is not None and record.status is TaskStatus.WORKING:
                    await self._update(described(record, message, now()))
        except StoreUnavailable:
            log.warning("task %s: status message not stored (store unavailable)", task_id[:8])

    async def _store_outcome(self, settled: TaskRecord) -> None:
        """Store a task's outcome, retrying while the store is down: while this process lives, every replica
        sees the task as running, so an outcome that is never stored would leave it ``working`` there."""
        task_id = settled.task_id
        for attempt in range(STORE_ATTEMPTS):
            try:
                await self._update(settled)
            except StoreUnavailable:
                log.warning("task %s: outcome not stored (attempt %d), retrying", task_id[:8], attempt + 1)
                await asyncio.sleep(min(5.0, 0.1 * 2**attempt))
            else:
                log_decision("task_settled", task=task_id[:8], status=settled.status.value)
                return
        log.error("task %s: outcome not stored; once this process ends, polls report it lost", task_id[:8])

    async def request(
        self, send: Send, grant: Grant, rid: RequestId, method: str, params: dict[str, Any], declared: bool
    ) -> None:
        """``tasks/get``, ``tasks/update``, ``tasks/cancel``: the poll decision, then the method's own work."""
        if not declared:
            raise missing_extension()
        task_id: str = params["taskId"]  # checked against Mcp-Name in _validate: a string
        meta = params.get("_meta")
        polled = {"mcp.method.name": method, "mcp_lossless.task": task_id, "jsonrpc.request.id": str(rid)}
        with tracing.span(method, polled, carrier=meta if isinstance(meta, dict) else None, kind="server"):
            await self._task_request_traced(send, grant, rid, method, params, task_id)

    async def _task_request_traced(
        self, send: Send, grant: Grant, rid: RequestId, method: str, params: dict[str, Any], task_id: str
    ) -> None:
        match await self.look(grant, task_id, Purpose.POLL):
            case Unknown():
                await invalid_params(send, rid, UNKNOWN_MESSAGE)
            case Denied() as denied:
                self.deny(denied)
            case Deliver(record=record):
                if method == "tasks/get":
                    await answer(send, rid, detailed_task(record, self.poll_ms))
                    return
                if method == "tasks/update":
                    try:
                        await self._deliver(task_id, params.get("inputResponses", {}))  # none sent: none delivered
                    except mrtr.BadInput as exc:
                        await invalid_params(send, rid, str(exc))
                        return
                elif not record.status.terminal:  # tasks/cancel
                    await self._cancel(record)
                await answer(send, rid, {})  # an empty acknowledgement: the next tasks/get shows the effect
            case unreachable:
                assert_never(unreachable)

    async def look(self, grant: Grant, task_id: str, purpose: Purpose) -> Unknown | Denied | Deliver:
        """Answer what :func:`~mcp_lossless.core.tasks.decide_poll` asks about ``task_id`` and write what its
        outcome says (a lost task settled, the owner's poll noted): the store's part of every look at a task.

        The poll is noted in the read's own write (:meth:`.TaskStore.poll`, which asks the decision's first question,
        :func:`~mcp_lossless.core.tasks.owned`): on SQLite one trip to the writer thread per poll, not two."""
        at = now()
        if purpose is Purpose.POLL:  # the owner's poll noted with the read (one store write): the outcome's touch
            record = await self.store.poll(task_id, grant.principal, at)
        else:
            record = await self.store.get(task_id)
        facts = PollFacts(task_id, record, purpose)
        while True:
            match decide_poll(facts, grant, self.state.policy, at):
                case NeedRunner(owner=owner):
                    if owner == self.state.instance:
                        facts.runs = task_id in self.running
                    else:
                        facts.runs = await self.state.store.owner_alive(owner)
                case SettleLost(record=settled):
                    facts.record = await self._update(settled) or settled  # a purged task is answered as settled
                    await self.events.lost(task_id, settled.owner)
                    log_decision("task_lost", task=task_id[:8])
                case Unknown() as unknown:
                    return unknown
                case Denied() | Deliver() as outcome:
                    return outcome  # its touch_at, an owner's poll, was written by store.poll with the read
                case unreachable:
                    assert_never(unreachable)

    async def _cancel(self, record: TaskRecord) -> None:
        """``tasks/cancel`` of a live task: stop its tool here, or record the cancel for the replica running it."""
        running = self.running.get(record.task_id)
        if running is not None:
            self.cancelling.add(record.task_id)
            running.cancel("cancelled by its owner")
        else:  # another replica runs it: record the cancel; its own outcome can then no longer land
            await self._update(advance(record, TaskStatus.CANCELLED, now(), message="cancelled by its owner"))

    async def stream(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        rid: RequestId,
        params: dict[str, Any],
        declared: bool,
        connection: object,
    ) -> None:
        """``tasks/stream`` (SEP-2694): authorized as a poll is, then event by event (:mod:`.task_stream`)."""
        if not declared:
            raise missing_extension()
        task_id: str = params["taskId"]  # checked against Mcp-Name in _validate: a string

        async def look() -> Unknown | Denied | Deliver:
            return await self.look(grant, task_id, Purpose.POLL)

        await self.streams.serve(receive, send, grant, rid, params, connection, look, self._refuse_stream)

    def _refuse_stream(self, denied: StreamDenied) -> Refused:
        """A task stream refused before any byte: the 403 with the challenge a refused call gets."""
        self.state.metrics.refusals.labels("insufficient_audience", "task").inc()
        log_decision("task_stream_denied", task=denied.task_id[:8], missing=list(denied.missing))
        error = stream_denial_error(denied)
        headers = scope_challenge(self.state.prm_url, error["message"], denied.missing, denied.missing)
        return refused(403, error["code"], error["message"], error["data"], headers)

    def deny(self, denied: Denied) -> NoReturn:
        self.state.metrics.refusals.labels("insufficient_audience", "task").inc()
        log_decision("task_denied", task=denied.task_id[:8], missing=list(denied.missing_resources))
        error = denial_error(denied)
        gap = requirement(denied.missing_resources, denied.missing_scopes)
        needed = requirement(denied.requirement.resources, denied.requirement.scopes)
        headers = scope_challenge(self.state.prm_url, denial_message(denied), gap, needed)
        raise refused(403, error["code"], error["message"], error["data"], headers)
