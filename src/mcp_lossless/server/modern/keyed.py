"""Keyed calls of the 2026-07-28 leg (SEP-3182, docs/decisions/0029): the exception to "closing cancels".

A ``tools/call`` carrying an idempotency key has its key recorded before it runs, runs detached from its request,
and has its answer stored as the key's outcome, so the retry under the same key finds it running or answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Coroutine
from typing import Any, Protocol

from ...asgi import Receive, Send, disconnected, respond
from ...core import errors, frames
from ...core.eventids import EventIdCodec
from ...core.events import Loss, PendingRequest, RequestId, StoredEvent, StreamKind, StreamRecord
from ...core.principal import Grant
from ...stores.base import EventStore, StoreUnavailable
from ..errors import Refused
from ..idempotency import Keys
from ..keys import stream_key
from ..observability import log_decision
from ..sessions import SessionRegistry
from ..tools import InputRequired, RegisteredTool, ToolContext
from ..writer import SSE_HEADERS
from .inline import InlineRuns, RequestChannel, RunOutcome, input_before_task, progress_token, run_tool
from .replies import refused
from .tasks import TaskChannel, Tasks

log = logging.getLogger("mcp_lossless.modern")


class KeyedState(Protocol):
    """The part of the server's state a keyed call reads: where its answer is stored and under whose cap."""

    instance: str
    store: EventStore
    sessions: SessionRegistry
    tool_tags: dict[str, frozenset[str]]

    @property
    def codec(self) -> EventIdCodec: ...

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...


class KeyedCalls:
    """The keyed calls of this process: each recorded under its key, run detached, its answer stored."""

    def __init__(self, state: KeyedState, keys: Keys, tasks: Tasks, inline: InlineRuns) -> None:
        self.state = state
        self.keys = keys
        """Idempotency keys between their decision and their record (ADR 0029), shared with the legacy leg."""
        self.tasks = tasks
        self.inline = inline
        self.running: set[asyncio.Task[bytes]] = set()
        """Keyed calls running detached from their request (:meth:`_run`)."""
        self.storing: set[asyncio.Task[Any]] = set()
        """Those of :attr:`running` whose answer exists and is being stored: the drain's deadline lets them finish
        (:meth:`.ModernLeg.end_running`)."""

    async def call(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        rid: RequestId,
        tool: RegisteredTool,
        params: dict[str, Any],
        declared: bool,
        channel: RequestChannel,
    ) -> bool:
        """A keyed ``tools/call`` (ADR 0029): a duplicate is answered from the key's record; a first use records
        its key with a stream of its own (its own session id: no session holds it) before anything runs, and its
        answer, result or ``CreateTaskResult`` (a repeated key returns the same task), is that stream's one event,
        stored before it is sent. The work runs detached from the request (:meth:`_run`), so a broken
        connection does not cancel it: the retry finds it running or answered. ``False``: a lost key of a tool
        whose upstream dedups it, for the caller to run as an unkeyed call (ADR 0033)."""
        s = self.state
        creates_task = tool.task is not None and declared and not tool.input_before_task
        if creates_task:
            self.tasks.check_room()  # a refusal that waiting cures is not recorded as the key's outcome
        tags = s.tool_tags[tool.name]
        pending = PendingRequest(rid, "tools/call", tool.name, tags)
        stream = stream_key()
        record = StreamRecord(stream, stream, StreamKind.POST, s.instance, (pending,), 0)
        exceeded = s.sessions.storing(grant.principal, 0)  # its stream is the principal's, as a legacy POST's is
        if exceeded is not None:
            raise Refused.over(exceeded)
        running = self.keys.running
        running.add(stream)  # before its key is recorded: a duplicate never finds the key and the stream not held
        try:
            answers, opened = await self.keys.open(
                None, grant, record, [{"params": params}], [pending], Refused.over, alone=True
            )
        except StoreUnavailable:
            running.discard(stream)
            raise refused(503, errors.INTERNAL_ERROR, "the event store is unavailable") from None
        except BaseException:
            running.discard(stream)
            raise
        if 0 in answers or opened is None:
            running.discard(stream)  # a duplicate answered, or a lost key run again unrecorded: not this stream
        if 0 in answers:
            await respond(send, 200, answers[0], b"application/json")
            return True
        if opened is None:
            return False  # not recorded: run again, its upstream answering the key from its own record
        if creates_task:
            task_channel = TaskChannel(self.tasks, channel.capabilities, channel.answers or {})

            async def create() -> bytes:
                try:
                    created = await self.tasks.create(grant, tool, params, task_channel)
                except Refused as refused:  # the store refused the task (its own cap): that is the key's outcome
                    error = refused.body["error"]
                    return frames.error(rid, error["code"], error["message"], error.get("data"))
                return frames.result(rid, {**created, "resultType": "task"})

            await self._run(receive, send, grant, record, create(), channel)
            return True
        ctx = ToolContext(grant, rid, progress_token(params), channel)

        async def run() -> bytes:
            outcome = RunOutcome()
            if tool.task is not None and declared:  # asks for its input before it becomes a task
                asked = input_before_task(tool, params, ctx)
                if asked is not None:
                    return frames.result(
                        rid, {**self.inline.input_required(asked, channel), "resultType": "input_required"}
                    )
            try:
                outcome.settle(None, await run_tool(tool, params, ctx))
            except (Exception, InputRequired) as exc:  # a request for input is this round's answer, as unkeyed
                outcome.settle(exc)
            return self.inline.outcome(rid, outcome, channel)[1]

        await self._run(receive, send, grant, record, run(), channel)
        return True

    async def _run(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        record: StreamRecord,
        work: Coroutine[Any, Any, bytes],
        channel: RequestChannel,
    ) -> None:
        """Run a keyed call's ``work`` in a task of its own, and relay its notifications (SSE) and then its stored
        answer while the client stays. A client that leaves stops only the relay: the call goes on, its answer is
        stored, and the retry under its key gets it. The call counts once under the principal's cap: as its
        request while that runs, then (once it outlives it) in the request's place until it ends."""
        s = self.state
        loop = s.loop
        answered: list[bytes] = []
        job = loop.create_task(self._answer(record, work, answered))
        self.running.add(job)
        job.add_done_callback(self.running.discard)
        job.add_done_callback(lambda _job: self.keys.running.discard(record.stream))
        # One loop turn runs the job's first step: a call answered at once (nearly every one) has its answer then,
        # and is only storing it. Its response waits for that commit, with no watcher of the client and no relay
        # (they cost three tasks and an ``asyncio.wait`` a call): there is nothing left to cancel or to relay, and
        # a client that left meanwhile misses nothing it could still get. ``asyncio.wait``: never cancels the job.
        await asyncio.sleep(0)
        if answered and channel.quiet():
            try:
                await asyncio.wait((job,))
            finally:
                if not job.done():  # the request's count is released when it returns: the call takes its place
                    s.sessions.hold_call(grant.principal)
                    job.add_done_callback(lambda _job: s.sessions.end_call(grant.principal))
            await respond(send, 200, self._answer_of(job, record), b"application/json")
            return
        gone = loop.create_task(disconnected(receive))
        streaming = False
        try:
            while True:
                note = loop.create_task(channel.queue.get())
                await asyncio.wait((job, gone, note), return_when=asyncio.FIRST_COMPLETED)
                if note.done():
                    if not streaming:
                        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                        streaming = True
                    await send(
                        {"type": "http.response.body", "body": frames.sse(None, note.result()), "more_body": True}
                    )
                    continue
                note.cancel()
                if job.done():
                    break
                channel.detached = True  # the client left: the call goes on without it
                log_decision("modern_keyed_detached", request=str(record.requests[0].request_id))
                return
            while not channel.quiet():  # every notification is on the stream before the answer
                body = frames.sse(None, channel.queue.get_nowait())
                await send({"type": "http.response.body", "body": body, "more_body": True})
            answer = self._answer_of(job, record)
            if streaming:
                await send({"type": "http.response.body", "body": frames.sse(None, answer)})
            else:
                await respond(send, 200, answer, b"application/json")
        finally:
            gone.cancel()
            if not job.done():  # the request's count is released when it returns: the call takes its place
                s.sessions.hold_call(grant.principal)
                job.add_done_callback(lambda _job: s.sessions.end_call(grant.principal))

    @staticmethod
    def _answer_of(job: asyncio.Task[bytes], record: StreamRecord) -> bytes:
        """What the waiting client gets of a finished job: its answer, or execution lost when the drain's deadline
        cancelled it before it answered (:meth:`.ModernLeg.end_running`): one outcome on the open request, never a
        cut response. The key records nothing then (:meth:`_answer`); a retry finds its stream's owner gone and hears
        it lost."""
        if job.cancelled():
            return frames.execution_lost(record.requests[0].request_id)
        return job.result()

    async def _answer(self, record: StreamRecord, work: Coroutine[Any, Any, bytes], answered: list[bytes]) -> bytes:
        """The keyed call's answer, stored as its stream's one event (the key's outcome) before it is returned (and
        put in ``answered`` as soon as the work gave it: :meth:`_run` then only waits for its commit). A call cut
        short by shutdown stores nothing: its stream stays open under this instance, which a later duplicate finds
        dead and settles as lost (execution lost naming the key); one whose answer exists is let store it
        (:attr:`storing`)."""
        s = self.state
        request = record.requests[0]
        answer = await work
        answered.append(answer)
        mac = s.codec.stream_mac(record.session_id, record.stream)
        event = StoredEvent(
            record.session_id, record.stream, 1, EventIdCodec.encode(record.stream, 1, mac), answer,
            request.request_id, request.tool, request.resources, True,
        )  # fmt: skip
        job = asyncio.current_task(s.loop)
        assert job is not None, "a keyed call is stored by its own job (:meth:`_run`)"
        storing = self.storing
        storing.add(job)
        try:
            await s.store.append(event, completes=True)
        except StoreUnavailable:  # the client still gets what ran; a duplicate will hear it may have run
            log.warning("the answer of keyed request %s could not be stored", request.request_id)
            with contextlib.suppress(StoreUnavailable):
                await s.store.mark_lost(record.stream, s.instance, Loss.STORE)
        finally:
            storing.discard(job)
        return answer
