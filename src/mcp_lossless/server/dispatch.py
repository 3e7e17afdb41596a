"""Running requests: built-in methods, tools and extra method handlers, each answered exactly once.

Every request gets one terminal event on its stream whatever happens to it: a result, a tool error, a
cancellation, or EXECUTION_LOST when the server shuts down under it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import orjson

from ..core import errors, frames
from ..core.events import PendingRequest
from ..core.principal import Grant
from ..stores.base import StoreUnavailable
from .checks import is_request_id
from .sessions import Session
from .state import ServerState
from .streams import LiveStream
from .tools import MethodError, ToolContext, ToolError, ToolInputError, content_of

log = logging.getLogger("mcp_lossless.dispatch")
_outbound_ids = itertools.count(1)


class StreamChannel:
    """A request's way back to its client: everything goes on the request's own stream, with its tags."""

    __slots__ = ("_live", "_request", "_session", "_state")

    def __init__(self, state: ServerState, session: Session, live: LiveStream, request: PendingRequest) -> None:
        self._state = state
        self._session = session
        self._live = live
        self._request = request

    async def _emit(self, data: bytes) -> None:
        await self._live.append(data, self._request)

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._emit(frames.notification(method, params))

    async def request(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        outbound_id = f"s-{next(_outbound_ids)}"
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._session.outbound[outbound_id] = future
        try:
            await self._emit(orjson.dumps({"jsonrpc": "2.0", "id": outbound_id, "method": method, "params": params}))
            answer = await asyncio.wait_for(future, self._state.config.client_request_seconds)
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
    def __init__(self, state: ServerState) -> None:
        self.s = state

    async def dispatch(
        self,
        session: Session,
        live: LiveStream,
        grant: Grant,
        message: dict[str, Any],
        request: PendingRequest,
        *,
        inline: bool = False,
        repeated: bool = False,
    ) -> Coroutine[Any, Any, None] | None:
        """Answer ``message`` now, or start its work: in a task of its own, or, with ``inline``, as a coroutine
        returned for the caller to await in its own task (a POST that carries one request: no task to create
        and schedule for a call that answers at once). ``repeated``: another request of the batch has its id."""
        s = self.s
        rid = request.request_id
        method = request.method
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if repeated or rid in session.tasks:
            text = f"request id {rid!r} is already in use in this session"
            await live.append(frames.error(rid, errors.INVALID_REQUEST, text), request, terminal=True)
        elif method == "tools/call":
            if request.tool is None:
                text = f"unknown tool {params.get('name')!r}"
                await live.append(frames.error(rid, errors.INVALID_PARAMS, text), request, terminal=True)
            else:
                return self._start(session, live, grant, request, params, self._tool_work(request, params), inline)
        elif method == "ping":
            await live.append(frames.result(rid, {}), request, terminal=True)
        elif method == "tools/list":
            await live.append(frames.result(rid, {"tools": s.tools_list}), request, terminal=True)
        elif method in s.methods:
            handler = s.methods[method]

            async def work(ctx: ToolContext) -> bytes:
                return frames.result(rid, await handler(ctx, params))

            return self._start(session, live, grant, request, params, work, inline)
        elif method == "logging/setLevel":
            await live.append(frames.result(rid, {}), request, terminal=True)
        else:
            text = f"method {method!r} not found"
            await live.append(frames.error(rid, errors.METHOD_NOT_FOUND, text), request, terminal=True)
        return None

    def _tool_work(self, request: PendingRequest, params: dict[str, Any]) -> Callable[[ToolContext], Awaitable[bytes]]:
        tool = self.s.tools[request.tool or ""]
        rid = request.request_id

        async def work(ctx: ToolContext) -> bytes:
            try:
                kwargs = tool.bind(params.get("arguments"))
            except ToolInputError as exc:
                return frames.error(rid, errors.INVALID_PARAMS, f"invalid arguments for {tool.name}: {exc}")
            if tool.context_param is not None:
                kwargs[tool.context_param] = ctx
            try:
                return frames.result(rid, content_of(await tool.fn(**kwargs)))
            except ToolError as exc:
                return frames.result(rid, {"content": [{"type": "text", "text": str(exc)}], "isError": True})

        return work

    def _start(
        self,
        session: Session,
        live: LiveStream,
        grant: Grant,
        request: PendingRequest,
        params: dict[str, Any],
        work: Callable[[ToolContext], Awaitable[bytes]],
        inline: bool,
    ) -> Coroutine[Any, Any, None] | None:
        meta = params.get("_meta")
        token = meta.get("progressToken") if isinstance(meta, dict) else None
        channel = StreamChannel(self.s, session, live, request)
        ctx = ToolContext(grant, request.request_id, token if is_request_id(token) else None, channel)
        run = self._run(session, live, request, ctx, work)
        session.contexts[request.request_id] = ctx
        if inline:
            task = asyncio.current_task(self.s.loop)
            assert task is not None, "inline work runs in the request's task"
            session.tasks[request.request_id] = task
            return run
        session.tasks[request.request_id] = asyncio.create_task(run)
        return None

    async def _run(
        self,
        session: Session,
        live: LiveStream,
        request: PendingRequest,
        ctx: ToolContext,
        work: Callable[[ToolContext], Awaitable[bytes]],
    ) -> None:
        rid = request.request_id
        try:
            data = await work(ctx)
        except MethodError as exc:
            data = frames.error(rid, exc.code, exc.message, exc.data)
        except asyncio.CancelledError:
            task = asyncio.current_task(self.s.loop)
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
                text = f"tool {request.tool} failed"
                data = frames.result(rid, {"content": [{"type": "text", "text": text}], "isError": True})
            else:
                data = frames.error(rid, errors.INTERNAL_ERROR, f"{request.method} failed")
        # The answer exists: from here on the request is not cancellable (a cancel now could only cut its
        # record short in a store that suspends), though a closing session still waits for it.
        session.contexts.pop(rid, None)
        try:
            await live.append(data, request, terminal=True)
        except StoreUnavailable:
            log.error("answer to request %s could not be stored; its stream reports the loss", rid)
            live.fail()
        finally:
            session.tasks.pop(rid, None)
            if live.done:
                session.live.pop(live.record.stream, None)

    def cancel(self, session: Session, params: object) -> None:
        """``notifications/cancelled``: stop the request; it still gets its one (cancelled) answer."""
        if not isinstance(params, dict):
            return
        rid = params.get("requestId")
        ctx = session.contexts.get(rid) if is_request_id(rid) else None  # type: ignore[arg-type]
        if ctx is not None:  # still working; an answered request (or one being recorded) is left alone
            ctx.cancelled = True
            session.tasks[rid].cancel("cancelled by client")  # type: ignore[index]

    def deliver(self, session: Session, message: dict[str, Any]) -> None:
        """A client's response to a server request (sampling, elicitation) wakes the request that asked."""
        future = session.outbound.get(message.get("id"))  # type: ignore[arg-type]
        if future is not None and not future.done():
            future.set_result(message)
