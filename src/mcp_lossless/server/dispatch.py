"""Running requests: built-in methods, tools and extra method handlers, each answered exactly once.

Every request gets one terminal event on its stream whatever happens to it: a result, a tool error, a
cancellation, or EXECUTION_LOST when the server shuts down under it.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import orjson

from .. import tracing
from ..core import errors, frames
from ..core.events import PendingRequest
from ..core.principal import Grant
from ..stores.base import StoreUnavailable
from .checks import is_request_id
from .requests import LEGACY_METHODS, call_tool, extra, tool_failed, unknown_tool
from .sessions import ServerSession, SessionRegistry
from .state import ServerState
from .streams import LiveStream
from .tools import InputRequests, MethodError, ToolContext

log = logging.getLogger("mcp_lossless.dispatch")
_outbound_ids = itertools.count(1)


Work = Callable[[ToolContext], Awaitable[dict[str, Any]]]
"""What answers a request that needs more than a lookup: a tool (:func:`.requests.call_tool`), or an extra
method's handler; its result becomes the request's answer."""


class StreamChannel:
    """A request's way back to its client: everything goes on the request's own stream, with its tags.

    Each event is first weighed against what its principal may make the store hold
    (``stored_bytes_per_principal``): past it, the tool's call raises the refusal as a :class:`MethodError`, which
    ends the call with it (:meth:`Dispatcher._run` also refuses an answer past the bound); every event stored
    before stays deliverable.
    """

    __slots__ = ("_cap", "_live", "_registry", "_reply_seconds", "_request", "_session", "_stored")

    def __init__(
        self,
        session: ServerSession,
        live: LiveStream,
        request: PendingRequest,
        reply_seconds: float,
        registry: SessionRegistry,
    ) -> None:
        self._session = session
        self._live = live
        self._request = request
        self._reply_seconds = reply_seconds
        """Longest wait for the client's answer to a server request."""
        self._registry = registry
        self._stored = registry.stored_bytes
        self._cap = registry.storage_cap
        """The bound and the figure, compared here: a progress event costs one call more, not a verdict's three."""

    def _refuse(self, size: int) -> None:
        exceeded = self._registry.storing(self._session.principal, size)
        if exceeded is not None:
            raise MethodError(errors.LIMIT_EXCEEDED, exceeded.message, exceeded.data())

    async def _emit(self, data: bytes) -> None:
        if self._stored(self._session.principal) + len(data) > self._cap:
            self._refuse(len(data))
        await self._live.progress(data, self._request)

    def notify(self, method: str, params: dict[str, Any]) -> Coroutine[Any, Any, object]:
        """Not a coroutine itself: it hands back the stream's append (never an answer, so :meth:`.LiveStream.progress`
        itself), so a progress event pays for one coroutine, not two; a refusal past the bound is raised here, before
        the caller awaits."""
        data = frames.notification(method, params)  # not via _emit: a frame per event
        if self._stored(self._session.principal) + len(data) > self._cap:
            self._refuse(len(data))
        return self._live.progress(data, self._request)

    async def ask(self, requests: InputRequests) -> dict[str, dict[str, Any]]:
        """Each request goes out on the stream at once; the answers are awaited together."""
        keys = list(requests)
        answers = await asyncio.gather(*(self._client_request(*requests[key]) for key in keys))
        return dict(zip(keys, answers, strict=True))

    async def _client_request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        outbound_id = f"s-{next(_outbound_ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._session.outbound[outbound_id] = future
        try:
            await self._emit(orjson.dumps({"jsonrpc": "2.0", "id": outbound_id, "method": method, "params": params}))
            answer = await asyncio.wait_for(future, self._reply_seconds)
        finally:
            self._session.outbound.pop(outbound_id, None)
        error = answer.get("error")
        if isinstance(error, dict):
            raise MethodError(int(error.get("code", errors.INTERNAL_ERROR)), str(error.get("message", "")))
        result = answer.get("result")
        return result if isinstance(result, dict) else {}

    def close_stream(self) -> None:
        self._live.request_close()


class Dispatcher:
    """Runs each request of a stream to exactly one terminal event on that stream.

    What needs only a lookup (``ping``, ``tools/list``, an unknown method or tool, a repeated id) is answered at
    once; a tool or an extra method runs as work, in a task of its own (:meth:`start`) or, for a POST carrying
    one request, in the POST's own task (:meth:`prepare_inline`, ADR 0008). Whatever happens to the work (its
    result, its error, a cancellation, the server going away) becomes its one answer (:meth:`_run`).
    """

    def __init__(self, state: ServerState) -> None:
        self.state = state

    async def start(
        self,
        session: ServerSession,
        live: LiveStream,
        grant: Grant,
        message: dict[str, Any],
        request: PendingRequest,
        *,
        repeated: bool = False,
        decided: bytes | None = None,
    ) -> None:
        """Answer ``message`` now, or start its work in a task of its own. ``repeated``: another request of the
        batch has its id, so each is answered with an error. ``decided``: its answer, found before (a repeated
        idempotency key's, ADR 0029)."""
        run = decided or self._route(session, live, grant, message, request, repeated)
        if isinstance(run, bytes):
            await live.append(run, request, terminal=True)
        else:
            session.start_task(request.request_id, asyncio.create_task(run))

    async def prepare_inline(
        self,
        session: ServerSession,
        live: LiveStream,
        grant: Grant,
        message: dict[str, Any],
        request: PendingRequest,
        decided: bytes | None = None,
    ) -> Coroutine[Any, Any, None] | None:
        """Answer ``message`` now (``None``), or return its work as a coroutine for the caller's own task to await:
        a POST carrying one request needs no task created and scheduled for a call that answers at once.
        ``decided``: as for :meth:`start`."""
        run = decided or self._route(session, live, grant, message, request, False)
        if isinstance(run, bytes):
            await live.append(run, request, terminal=True)
            return None
        task = asyncio.current_task(self.state.loop)
        assert task is not None, "inline work runs in the request's task"
        session.start_task(request.request_id, task)
        return run

    def _route(
        self,
        session: ServerSession,
        live: LiveStream,
        grant: Grant,
        message: dict[str, Any],
        request: PendingRequest,
        repeated: bool,
    ) -> bytes | Coroutine[Any, Any, None]:
        """The answer of a request that needs only a lookup; or, for one that needs work, the coroutine that runs
        the work to its one answer, with the request's context (its progress token, its channel) registered as
        cancellable."""
        state = self.state
        rid = request.request_id
        method = request.method
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        work: Work
        if repeated or rid in session.tasks:
            return frames.error(rid, errors.INVALID_REQUEST, f"request id {rid!r} is already in use in this session")
        kind = LEGACY_METHODS.get(method) or extra(method, False, state.methods)
        if kind == "call":
            if request.tool is None:
                return frames.error(rid, errors.INVALID_PARAMS, unknown_tool(message.get("params")))
            work = functools.partial(call_tool, state.tools[request.tool], params)
        elif kind == "list_tools":
            return frames.result(rid, {"tools": state.tools_list})
        elif kind == "extra":
            handler = state.methods[method]

            def work(ctx: ToolContext) -> Awaitable[dict[str, Any]]:
                return handler(ctx, params)

        elif kind in ("ping", "set_log_level"):
            return frames.result(rid, {})
        else:
            return frames.error(rid, errors.METHOD_NOT_FOUND, f"method {method!r} not found")
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        channel = StreamChannel(session, live, request, state.config.client_request_seconds, state.sessions)
        ctx = ToolContext(grant, rid, None if token is None or not is_request_id(token) else token, channel)
        session.contexts[rid] = ctx
        if request.tool is None:
            return self._run(session, live, request, ctx, work, True)
        # The call's span covers the tool and the commit of its answer, its parent the trace in the request's _meta:
        # asked once here, so an untraced call makes neither (nor the coroutine that would enter the first).
        carrier = meta if isinstance(meta, dict) else None
        if tracing.silent(carrier):
            return self._run(session, live, request, ctx, work, False)
        named = {"mcp.method.name": "tools/call", "gen_ai.tool.name": request.tool, "jsonrpc.request.id": str(rid)}
        return _traced(self._run(session, live, request, ctx, work, True), f"tools/call {request.tool}", named, carrier)

    async def _run(
        self,
        session: ServerSession,
        live: LiveStream,
        request: PendingRequest,
        ctx: ToolContext,
        work: Work,
        traced: bool,
    ) -> None:
        """Run ``work`` to the request's one answer and store it; ``traced``: as :meth:`.LiveStream.answer` takes it."""
        rid = request.request_id
        try:
            data = frames.result(rid, await work(ctx))
        except MethodError as exc:
            data = frames.error(rid, exc.code, exc.message, exc.data)
        except asyncio.CancelledError:
            task = asyncio.current_task(self.state.loop)
            if task is not None:
                task.uncancel()  # handled here: the task (maybe the request's own) goes on to record the answer
            if ctx.cancelled or session.closing in ("deleted", "expired"):
                why = "cancelled by client" if session.closing is None else f"session {session.closing}"
                data = frames.error(rid, errors.REQUEST_CANCELLED, f"request cancelled: {why}")
            else:  # the server is going away under the call (shutdown, or the ASGI server ending the request)
                data = frames.execution_lost(rid)
        except StoreUnavailable:
            data = frames.execution_lost(rid)
        except Exception:
            log.exception("request %s (%s) failed", rid, request.tool or request.method)
            if request.tool is not None:
                data = frames.result(rid, tool_failed(request.tool))
            else:
                data = frames.error(rid, errors.INTERNAL_ERROR, f"{request.method} failed")
        sessions = self.state.sessions
        if sessions.stored_bytes(session.principal) + len(data) > sessions.storage_cap:
            exceeded = sessions.storing(session.principal, len(data))
            if exceeded is not None:  # the answer would take its principal past its bound: the call ends refused
                data = frames.error(rid, errors.LIMIT_EXCEEDED, exceeded.message, exceeded.data())
        # The answer exists: from here on the request is not cancellable (a cancel now could only cut its
        # record short in a store that suspends), though a closing session still waits for it.
        session.contexts.pop(rid, None)
        try:
            await live.answer(data, request, traced)
        except StoreUnavailable:
            log.error("answer to request %s could not be stored; its stream reports the loss", rid)
            live.fail()
        finally:
            session.end_task(rid)
            session.forget_if_finished(live)

    def cancel(self, session: ServerSession, params: object) -> None:
        """``notifications/cancelled``: stop the request; it still gets its one (cancelled) answer."""
        if not isinstance(params, dict):
            return
        rid = params.get("requestId")
        ctx = session.contexts.get(rid) if is_request_id(rid) else None  # type: ignore[arg-type]
        if ctx is not None:  # still working; an answered request (or one being recorded) is left alone
            ctx.cancelled = True
            session.tasks[rid].cancel("cancelled by client")  # type: ignore[index]

    def deliver(self, session: ServerSession, message: dict[str, Any]) -> None:
        """A client's response to a server request (sampling, elicitation) wakes the request that asked."""
        future = session.outbound.get(message.get("id"))  # type: ignore[arg-type]
        if future is not None and not future.done():
            future.set_result(message)


async def _traced(
    run: Coroutine[Any, Any, None], name: str, attributes: dict[str, str], carrier: dict[str, Any] | None
) -> None:
    with tracing.span(name, attributes, carrier=carrier, kind="server"):
        await run
