"""Inline runs of the 2026-07-28 leg: a request answered on its own response, JSON or, once it sends a
notification, SSE; a client that closes the response has cancelled it (docs/decisions/0012).

The request's work runs *in the request's own task*: its first step here (all that a call answered at once
needs, no task, no watcher, no stream), the rest resumed in place (:class:`_Resumed`) beside a notification pump
and a disconnect watcher. :class:`RequestChannel` is the request's way back to the client; input it needs is
asked as multi round-trip requests (``input_required``), never on the stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Generator
from typing import Any, Protocol

from ...asgi import Receive, Send, disconnected, respond, sent_whole
from ...core import errors, frames, mrtr, protocol
from ...core.events import RequestId
from ...core.principal import Grant
from ..observability import log_decision, now
from ..requests import call_tool
from ..tools import (
    InputRequests,
    InputRequired,
    MethodError,
    RegisteredTool,
    ToolContext,
)
from ..writer import SSE_HEADERS

log = logging.getLogger("mcp_lossless.modern")

INPUT_CAPABILITY = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}
"""The client capability each server-to-client request needs."""
CLOSE_STREAM_REFUSED = (
    f"close_stream: a {protocol.STATELESS} response cannot be resumed; a tool that frees its connection while it "
    "works runs as a task there (task=True), which the client polls"
)


class LoopHolder(Protocol):
    """The part of the server's state an inline run or a listen stream reads: the loop it runs on (known once the
    server starts)."""

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...


class RequestChannel:
    """A modern request's way back: notifications on its own response (SSE), and input asked of the client as
    multi round-trip requests (:class:`~.tools.InputRequired`), never requests on the stream.

    Log messages go out only when the request's ``_meta`` set a ``logLevel``, and only at or above it.
    ``answers`` is what the request carried (its sealed earlier rounds and its ``inputResponses``): ``None`` for
    a method that may not be answered ``input_required``.
    """

    __slots__ = ("_queue", "answers", "binding", "capabilities", "detached", "min_level", "taken")

    def __init__(
        self,
        capabilities: dict[str, Any],
        log_level: object = None,
        answers: dict[str, dict[str, Any]] | None = None,
        binding: Callable[[], mrtr.Binding] | None = None,
    ) -> None:
        self.capabilities = capabilities
        levels = protocol.LOGGING_LEVELS
        self.min_level = None if log_level is None or log_level not in levels else levels.index(log_level)
        self._queue: asyncio.Queue[bytes] | None = None
        self.answers = answers
        self.binding = binding
        """What a ``requestState`` of this request is bound to (made only when one is read or issued)."""
        self.taken: dict[str, dict[str, Any]] = {}
        """The answers the tool used so far: the next round's ``requestState`` carries exactly these."""
        self.detached = False
        """The request's client left while its keyed call goes on: its notifications have nowhere to go."""

    @property
    def queue(self) -> asyncio.Queue[bytes]:
        """The notifications not yet on the stream (made at the first: most requests send none)."""
        if self._queue is None:
            self._queue = asyncio.Queue()
        return self._queue

    def quiet(self) -> bool:
        return self._queue is None or self._queue.empty()

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        if self.detached:
            return
        if method == "notifications/message":
            level = params.get("level")
            if (
                self.min_level is None
                or level not in protocol.LOGGING_LEVELS
                or protocol.LOGGING_LEVELS.index(level) < self.min_level
            ):
                return
        self.queue.put_nowait(frames.notification(method, params))

    def _check_capabilities(self, requests: InputRequests) -> None:
        """-32021 for input the client did not declare it can give: the server MUST NOT ask for it."""
        for method, _ in requests.values():
            needed = INPUT_CAPABILITY.get(method)
            if needed is None:
                raise MethodError(errors.INTERNAL_ERROR, f"{method} is not a request a server may send a client")
            if needed not in self.capabilities:
                raise MethodError(
                    errors.MISSING_REQUIRED_CLIENT_CAPABILITY,
                    "Missing required client capability",
                    {"requiredCapabilities": {needed: {}}},
                )

    def _take(self, requests: InputRequests) -> dict[str, dict[str, Any]]:
        answers = self.answers or {}
        got = {key: answers[key] for key in requests if key in answers}
        self.taken.update(got)
        return got

    async def ask(self, requests: InputRequests) -> dict[str, dict[str, Any]]:
        self._check_capabilities(requests)
        if self.answers is None:
            raise MethodError(
                errors.CLIENT_INPUT_UNAVAILABLE,
                f"only tools/call, prompts/get and resources/read may ask the client for input on {protocol.STATELESS}",
            )
        got = self._take(requests)
        if len(got) < len(requests):
            missing = {k: {"method": m, "params": p} for k, (m, p) in requests.items() if k not in got}
            raise InputRequired(missing, dict(self.taken))
        return got

    def close_stream(self) -> None:
        """Refused: a 2026-07-28 response cannot be resumed, so closing it would lose the answer, and keeping it
        open would hold the connection the tool meant to free (docs/decisions/0024)."""
        raise MethodError(errors.INTERNAL_ERROR, CLOSE_STREAM_REFUSED)


def progress_token(params: dict[str, Any]) -> str | int | None:
    meta = params.get("_meta")
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if isinstance(token, (str, int)) and not isinstance(token, bool) else None


def run_tool(tool: RegisteredTool, params: dict[str, Any], ctx: ToolContext) -> Coroutine[Any, Any, dict[str, Any]]:
    """A tool's ``CallToolResult`` (:func:`..requests.call_tool`); a crash is its ``isError`` result
    (:func:`..requests.tool_failed`), whatever it raised, logged here; a :class:`MethodError` for a JSON-RPC error
    (bad arguments, client input), which this leg answers as an error, and a cancellation go on up. A function
    returning ``call_tool``'s coroutine, not one awaiting it: one coroutine a call, not two."""
    return call_tool(tool, params, ctx, log)


def input_before_task(tool: RegisteredTool, params: dict[str, Any], ctx: ToolContext) -> InputRequired | None:
    """Run a task tool up to its first await of anything but an answered ask: the input it asks for first,
    when the call does not carry it yet (``None``: the task may be created, with the answers the call carried).

    The coroutine is stepped once by hand and closed: it never reaches real work here, which is the task's.
    """
    coro = run_tool(tool, params, ctx)
    try:
        coro.send(None)
    except InputRequired as asked:
        return asked
    except Exception:  # StopIteration among them
        return None  # it finished (or failed) without awaiting anything: the task runs it, and reports that
    finally:
        with contextlib.suppress(RuntimeError):
            coro.close()
    return None


_JSON = b"application/json"
"""The media type of every answer not streamed."""
_END_OF_NOTES = b""
"""Put behind a request's last notification: its pump stops there (a notification is never empty)."""


class RunOutcome:
    """How a request's work ended: its value, or what it raised (``pending`` while it runs)."""

    __slots__ = ("error", "pending", "value")

    def __init__(self) -> None:
        self.pending = False
        self.value: dict[str, Any] = {}
        self.error: BaseException | None = None

    def settle(self, error: BaseException | None, value: dict[str, Any] | None = None) -> None:
        self.pending = False
        if isinstance(error, StopIteration):
            self.value = error.value
        elif error is not None:
            self.error = error
        else:
            self.value = value if value is not None else {}

    def result(self) -> dict[str, Any]:
        if self.error is not None:
            raise self.error
        return self.value


class _Resumed:
    """Awaiting it goes on with a coroutine already stepped once by hand (which yielded ``yielded``), in the
    awaiting task, exactly as if that task had awaited the coroutine from its start: what the coroutine yields
    goes to the task, what the task sends or throws (a cancellation) goes to the coroutine."""

    __slots__ = ("coro", "yielded")

    def __init__(self, coro: Coroutine[Any, Any, dict[str, Any]], yielded: Any) -> None:
        self.coro = coro
        self.yielded = yielded

    def __await__(self) -> Generator[Any, Any, dict[str, Any]]:
        coro, yielded = self.coro, self.yielded
        while True:
            try:
                sent = yield yielded
            except BaseException as exc:
                try:
                    yielded = coro.throw(exc)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]
            else:
                try:
                    yielded = coro.send(sent)
                except StopIteration as stop:
                    return stop.value  # type: ignore[no-any-return]


class InlineRuns:
    """The requests answered within their own response, and what seals their ``input_required`` rounds."""

    __slots__ = ("in_request", "state", "state_key")

    def __init__(self, state: LoopHolder) -> None:
        self.state = state
        self.state_key = b""
        """The MAC key of ``requestState`` (:func:`.mrtr.state_key`), from the store's secret at open."""
        self.in_request: set[asyncio.Task[Any]] = set()
        """The requests running a tool call within themselves (not as a task): what a drain's deadline ends."""

    def input_required(self, asked: InputRequired, channel: RequestChannel) -> dict[str, Any]:
        """The ``InputRequiredResult``: what the tool asks, and the answers it took so far, sealed."""
        assert channel.binding is not None, "only a multi round-trip method reaches here"
        state = mrtr.seal(self.state_key, channel.binding(), asked.answers, now())
        log_decision("input_required", keys=sorted(asked.requests))
        return {"inputRequests": asked.requests, "requestState": state}

    def run_now(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        rid: RequestId,
        params: dict[str, Any],
        work: Callable[[ToolContext], Coroutine[Any, Any, dict[str, Any]]],
        channel: RequestChannel,
        running: set[asyncio.Task[Any]] | None = None,
    ) -> Coroutine[Any, Any, None] | None:
        """Run a request within its response: JSON, or SSE once it sends a notification. A disconnect cancels it.

        Its first step runs here, in the caller's frame: ``None`` when that answered it whole already (nearly every
        call: no coroutine of this step's at all); else the rest, which the caller awaits (the answer's messages, or
        the work going on beside its stream). ``running``: where its task is held from its first suspension until it
        ends (:attr:`in_request`, for a tool call); a request answered in its first step never suspends, so nothing
        could end it there."""
        ctx = ToolContext(grant, rid, progress_token(params), channel)
        coro = work(ctx)
        try:
            yielded = coro.send(None)  # its first step, here: all that a call answered at once needs
        except BaseException as exc:
            queue = channel._queue  # RequestChannel.quiet written out: this runs once a request
            quiet = queue is None or queue.empty()  # no task, no watcher, no stream: nothing else to wait for
            if quiet and type(exc) is StopIteration:  # answered, nearly every call: framed at once, no outcome kept
                body = frames.result(rid, {**exc.value, **COMPLETE})
                return None if sent_whole(send, 200, body, _JSON) else respond(send, 200, body, _JSON)
            outcome = RunOutcome()
            outcome.settle(exc)
            if quiet:
                return respond(send, *self.outcome(rid, outcome, channel), _JSON)
            yielded = None
        else:
            outcome = RunOutcome()
            outcome.pending = True
        return self._stream_while(receive, send, rid, coro, yielded, outcome, channel, running)

    async def _stream_while(
        self,
        receive: Receive,
        send: Send,
        rid: RequestId,
        coro: Coroutine[Any, Any, dict[str, Any]],
        yielded: Any,
        outcome: RunOutcome,
        channel: RequestChannel,
        running: set[asyncio.Task[Any]] | None,
    ) -> None:
        """The rest of a request that did not answer in its first step: the tool goes on *in this task* (its
        timeouts and cancel scopes see the task they began in), its notifications stream as SSE from a pump
        beside it, and a watcher cancels it when the client disconnects (on this revision, a cancellation)."""
        loop = self.state.loop
        me = asyncio.current_task()
        assert me is not None
        streaming = False
        left = False

        async def pump() -> None:
            """Every notification in order, until the end mark the request puts behind the last one."""
            nonlocal streaming
            while (note := await channel.queue.get()) is not _END_OF_NOTES:
                if not streaming:
                    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
                    streaming = True
                await send({"type": "http.response.body", "body": frames.sse(None, note), "more_body": True})

        async def watch() -> None:
            nonlocal left
            await disconnected(receive)
            left = True
            if outcome.pending:
                me.cancel("client disconnected")

        pumping, watching = loop.create_task(pump()), loop.create_task(watch())
        if running is not None:
            running.add(me)
        try:
            if outcome.pending:
                try:
                    outcome.settle(None, await _Resumed(coro, yielded))
                except BaseException as exc:
                    if left and isinstance(exc, asyncio.CancelledError):
                        me.uncancel()
                        log_decision("modern_cancelled", request=str(rid))
                        return
                    outcome.settle(exc)
            watching.cancel()
            if left:
                if me.cancelling():
                    me.uncancel()
                return
            channel.queue.put_nowait(_END_OF_NOTES)
            await pumping  # every notification is on the stream before the answer
            status, answer = self.outcome(rid, outcome, channel)
            if streaming:
                await send({"type": "http.response.body", "body": frames.sse(None, answer)})
            else:
                await respond(send, status, answer, _JSON)
        finally:
            if running is not None:
                running.discard(me)
            pumping.cancel()
            watching.cancel()
            if outcome.pending:
                coro.close()

    def outcome(self, rid: RequestId, outcome: RunOutcome, channel: RequestChannel) -> tuple[int, bytes]:
        """The finished request's answer, and its HTTP status if the response has not begun."""
        try:
            value = outcome.result()
        except InputRequired as asked:
            return 200, frames.result(rid, {**self.input_required(asked, channel), "resultType": "input_required"})
        except asyncio.CancelledError:  # the server's drain ended it (a client that left was handled before)
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
            return 200, frames.execution_lost(rid)
        except MethodError as exc:
            # -32021 is a 400, as the revision asks, when the response has not begun yet
            status = 400 if exc.code == errors.MISSING_REQUIRED_CLIENT_CAPABILITY else 200
            return status, frames.error(rid, exc.code, exc.message, exc.data)
        except Exception:
            log.exception("request %s failed", rid)
            return 200, frames.error(rid, errors.INTERNAL_ERROR, "request failed")
        return 200, completed(rid, value)


COMPLETE = {"resultType": "complete"}
"""What the result of a request whose work returned marks it with."""


def completed(rid: RequestId, value: dict[str, Any]) -> bytes:
    """The answer of a request whose work returned ``value``."""
    return frames.result(rid, {**value, **COMPLETE})
