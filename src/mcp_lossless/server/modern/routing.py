"""The 2026-07-28 leg's routing: one modern request's validation (its ``_meta``, its mirrored headers, its
version), then the method table, each method handed to the part that serves it.

A request whose ``_meta`` carries the modern protocol fields is served here, on the same endpoint as the
legacy sessions (:func:`..requests.era` decides which); ``initialize`` keeps selecting the legacy leg, unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine
from typing import Any

from ... import __version__, tracing
from ...asgi import Receive, Send, respond
from ...core import denials, errors, mrtr, param_headers, protocol
from ...core.events import RequestId
from ...core.idempotency import CAPABILITY, KEY_PARAM, InvalidKey, key_of
from ...core.param_headers import HeaderMirror
from ...core.principal import Grant
from ...core.task_stream import STREAM_EXTENSION
from ...core.tasks import EXTENSION
from ...stores.base import StoreUnavailable
from ...stores.tasks import TaskStore
from ..errors import Refused
from ..idempotency import Keys
from ..observability import now
from ..requests import STATELESS_METHODS, extra, uncovered, unknown_tool, unnamed
from ..state import ServerState
from ..tools import MethodError, MethodHandler, RegisteredTool, ToolContext
from .inline import InlineRuns, RequestChannel, input_before_task, run_tool
from .keyed import KeyedCalls
from .listen import Listeners
from .replies import answer, invalid_params, missing_extension, refused
from .tasks import TaskChannel, Tasks

CACHEABLE = frozenset({"tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"})
"""Results that carry the caching hints ``ttlMs`` and ``cacheScope`` (SEP-2549; ``server/discover`` too)."""
CACHE_HINTS = {"ttlMs": 0, "cacheScope": "private"}
"""Never reuse without asking again, never share: what a principal may see depends on its token."""
SHUTDOWN_SECONDS = 5.0
"""How long a drain or a shutdown waits for the cancelled calls and tasks to record their outcome."""
HEADER_TEXTS = (256, 128)
"""Decoded ``Mcp-Method`` and ``Mcp-Name`` values :class:`HeaderTexts` remembers at most, and the longest."""


class HeaderTexts(dict[bytes, str]):
    """:func:`.param_headers.header_value` of the ``Mcp-Method`` and ``Mcp-Name`` values seen, by their bytes: a
    client sends the same few on every request, and decoding one (strip, the sentinel test, a regex search) costs
    ten times a look-up. A value that does not decode raises as :func:`~.param_headers.header_value` does and is not
    remembered; full, the table starts afresh, so values that vary do not grow it."""

    __slots__ = ()

    def __missing__(self, raw: bytes) -> str:
        text = param_headers.header_value(raw)
        if len(raw) <= HEADER_TEXTS[1]:
            if len(self) >= HEADER_TEXTS[0]:
                self.clear()
            self[raw] = text
        return text


class ModernLeg:
    """The 2026-07-28 leg: routes each request to its part (inline runs, tasks, keyed calls, listen streams)."""

    def __init__(
        self, state: ServerState, tasks: TaskStore, *, task_ttl: float | None = 3600.0, poll_ms: int = 500
    ) -> None:
        self.state = state
        capabilities = {k: v for k, v in state.capabilities.items() if k != "logging"}
        if state.store.idempotency_keys:  # keyed calls, inline or creating a task, are recorded here too
            capabilities["tools"] = {**capabilities.get("tools", {}), CAPABILITY: {}}
        extensions = {
            **capabilities.get("extensions", {}),
            EXTENSION: {},
            denials.DENIALS_EXTENSION: {},
            STREAM_EXTENSION: {},
        }
        self.capabilities = {**capabilities, "extensions": extensions}
        self.server_info = {"name": "mcp-lossless", "version": __version__}
        self.inline = InlineRuns(state)
        self.in_request = self.inline.in_request
        self.tasks = Tasks(state, tasks, ttl=task_ttl, poll_ms=poll_ms)
        self.listeners = Listeners(state, self.tasks, self.capabilities.get("tools", {}).get("listChanged") is True)
        self.keys = Keys(state)
        """Idempotency keys between their decision and their record (ADR 0029), shared with the legacy leg."""
        self.keyed = KeyedCalls(state, self.keys, self.tasks, self.inline)
        self._mirrors: dict[str, tuple[RegisteredTool, tuple[HeaderMirror, ...]]] = {}
        self._header_text = HeaderTexts().__getitem__

    async def open(self) -> None:
        await self.tasks.store.open()
        self.inline.state_key = mrtr.state_key(await self.state.store.secret())

    async def end_running(self) -> None:
        """A drain's deadline: each call running in its request answers execution lost on its stream (a keyed one
        too, while its client waits), each task records itself lost (the process goes); waited for, so every
        outcome is out before connections close. A keyed call whose answer is being stored is waited for, not
        cancelled: its write goes on regardless (SQLite's writer commits what was queued), so its commit, not the
        deadline, decides the key's outcome, and its client gets what a re-issue of the key gets."""
        ending = [*self.in_request, *self.keyed.running, *self.tasks.running.values()]
        storing = self.keyed.storing
        for task in ending:
            if task not in storing:
                task.cancel("server shutdown")
        if ending:
            await asyncio.wait(ending, timeout=SHUTDOWN_SECONDS)

    async def close(self) -> None:
        """Shutdown: each running task records itself lost (the process goes), then the store closes."""
        running: list[asyncio.Task[Any]] = [*self.tasks.running.values(), *self.keyed.running]
        for task in running:
            task.cancel("server shutdown")
        if running:
            await asyncio.wait(running, timeout=SHUTDOWN_SECONDS)  # a store that is down does not hold shutdown
        await self.tasks.store.close()

    def tools_changed(self) -> None:
        """The tool list changed: every listener that asked for ``toolsListChanged`` is told."""
        self.listeners.tools_changed()

    # -- the request ---------------------------------------------------------------------------------

    async def serve(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        index: dict[bytes, bytes],
        message: dict[str, Any],
        connection: object = None,
    ) -> None:
        """Answer one modern request; a refusal goes up to the transport, which renders it (ADR 0010).
        ``connection``: the client's address (ASGI ``client``), what "one stream per task per connection" counts by."""
        try:
            if "method" not in message:
                raise refused(400, errors.INVALID_REQUEST, f"clients send no responses on {protocol.STATELESS}")
            method: str = message["method"]
            params = message.get("params")
            params = params if isinstance(params, dict) else {}
            if "id" not in message:
                await respond(send, 202)  # this revision defines no client notifications over HTTP: accepted, ignored
                return
            capabilities = self._validate(index, method, params)
            rid: RequestId = message["id"]
            declared = isinstance(capabilities.get("extensions"), dict) and EXTENSION in capabilities["extensions"]
            kind = STATELESS_METHODS.get(method) or extra(method, True, self.state.methods)
            if kind == "task_stream":
                await self.tasks.stream(receive, send, grant, rid, params, declared, connection)
                return
            if kind == "task":  # a poll needs no channel and no request state: straight to its decision
                await self.tasks.request(send, grant, rid, method, params, declared)
                return
            answers: dict[str, dict[str, Any]] | None = None
            bound: Callable[[], mrtr.Binding] | None = None
            if method in mrtr.MRTR_METHODS:
                # A partial, not a closure: a nested function here would make cells of this method's variables on
                # every request.
                answers, bound = {}, functools.partial(_binding, grant, method, params)
                if "requestState" in params or "inputResponses" in params:  # a first round pays for no state
                    try:
                        answers = mrtr.answers_of(self.inline.state_key, params, bound(), now())
                    except mrtr.BadInput as exc:
                        await invalid_params(send, rid, str(exc))
                        return
            channel = RequestChannel(capabilities, params["_meta"].get(protocol.LOG_LEVEL_META_KEY), answers, bound)
            if kind == "call":
                called = self._call(receive, send, grant, index, rid, params, declared, channel)
                if called is not None:
                    await called
            elif kind == "discover":
                await answer(send, rid, self._discover())
            elif kind == "list_tools":
                await answer(send, rid, {"tools": self.state.tools_list, **CACHE_HINTS})
            elif kind == "listen":
                await self.listeners.listen(receive, send, grant, rid, params, declared)
            elif kind == "extra":
                tags = self.state.method_tags.get(method)
                if tags is not None:
                    self._require(grant, tags(params))
                work = functools.partial(_extra, self.state.methods[method], method, params)
                rest = self.inline.run_now(receive, send, grant, rid, params, work, channel)
                if rest is not None:
                    await rest
            else:
                raise refused(404, errors.METHOD_NOT_FOUND, f"method {method!r} not found on {protocol.STATELESS}")
        except Refused as exc:
            if isinstance(exc.body, dict) and exc.body.get("id") is None:
                exc.body["id"] = message.get("id")  # raised where found, which need not know the request's id
            raise
        except StoreUnavailable:
            raise Refused.rpc(
                503,
                errors.INTERNAL_ERROR,
                "task store unavailable; retry later",
                request_id=message.get("id"),
                headers=[(b"retry-after", b"1")],
            ) from None

    def _validate(self, index: dict[bytes, bytes], method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The per-request fields (``-32602``), the mirrored headers (``-32020``), the version (``-32022``)."""
        meta = params.get("_meta")
        version = meta.get(protocol.VERSION_META_KEY) if isinstance(meta, dict) else None
        capabilities = meta.get(protocol.CAPABILITIES_META_KEY) if isinstance(meta, dict) else None
        if not isinstance(version, str) or not isinstance(capabilities, dict):
            raise refused(
                400,
                errors.INVALID_PARAMS,
                f"params._meta must carry {protocol.VERSION_META_KEY} (a string) and "
                f"{protocol.CAPABILITIES_META_KEY} (an object)",
            )
        header = index.get(b"mcp-protocol-version")
        if header is None:
            raise refused(400, errors.HEADER_MISMATCH, "MCP-Protocol-Version header required")
        if header.decode("latin-1").strip(" \t") != version:
            raise refused(
                400,
                errors.HEADER_MISMATCH,
                f"MCP-Protocol-Version header does not match {protocol.VERSION_META_KEY} {version!r}",
            )
        if version != protocol.STATELESS:
            raise refused(
                400,
                errors.UNSUPPORTED_PROTOCOL_VERSION,
                "Unsupported protocol version",
                {"supported": list(protocol.SERVED_VERSIONS), "requested": version},
            )
        try:  # one handler for both headers' decoding: no call between the request and each decoder
            named = index.get(b"mcp-method")
            header_text = self._header_text
            if named is None or header_text(named) != method:
                raise refused(400, errors.HEADER_MISMATCH, f"Mcp-Method header must be present and equal {method!r}")
            field = protocol.NAME_PARAMS.get(method)
            if field is not None:
                name = index.get(b"mcp-name")
                value = params.get(field)
                if not isinstance(value, str):  # the body is wrong, whatever its header says
                    raise refused(400, errors.INVALID_PARAMS, unnamed(method, field))
                if name is None or header_text(name) != value:
                    raise refused(
                        400, errors.HEADER_MISMATCH, f"Mcp-Name header must be present and equal params.{field}"
                    )
        except param_headers.HeaderMismatch as undecodable:
            raise refused(400, errors.HEADER_MISMATCH, str(undecodable)) from None
        return capabilities

    def _discover(self) -> dict[str, Any]:
        return {
            "supportedVersions": list(protocol.SERVED_VERSIONS),
            "capabilities": self.capabilities,
            "instructions": "Tool results are never lost or leaked: long or non-idempotent tools run as tasks.",
            "_meta": {protocol.SERVER_INFO_META_KEY: self.server_info},
            **CACHE_HINTS,
        }

    # -- tools/call ----------------------------------------------------------------------------------

    def _call(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        index: dict[bytes, bytes],
        rid: RequestId,
        params: dict[str, Any],
        declared: bool,
        channel: RequestChannel,
    ) -> Coroutine[Any, Any, None] | None:
        """A ``tools/call``: its checks, then its run. A function, not a coroutine: an untraced call without key or
        task answered in its first step (nearly every call) makes no coroutine of this step's; otherwise what goes
        on is returned, for the caller to await at once."""
        s = self.state
        name = params.get("name")
        tool = s.tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return invalid_params(send, rid, unknown_tool(params))
        mirrors = self._mirrors.get(tool.name)  # _mirrored's answer at hand: a look-up, not a call
        mirrored = mirrors[1] if mirrors is not None and mirrors[0] is tool else self._mirrored(tool)
        if mirrored:  # most tools mirror no argument: nothing to check
            try:
                param_headers.check_mirrored(index, params.get("arguments"), mirrored)
            except param_headers.HeaderMismatch as exc:
                raise refused(400, errors.HEADER_MISMATCH, str(exc)) from None
        tags = s.tool_tags[tool.name]
        if s.policy.missing(grant.audience, tags, grant.scopes):  # _require's test, its refusal made only then
            self._require(grant, tags)
        if tool.task == "required" and not declared:
            raise missing_extension()
        try:
            key = key_of(params) if KEY_PARAM in params and s.store.idempotency_keys else None
        except InvalidKey as exc:
            return invalid_params(send, rid, str(exc))
        exceeded = s.sessions.start_call(grant.principal)  # one cap per principal, both eras counted
        if exceeded is not None:
            raise Refused.over(exceeded)
        meta = params.get("_meta")
        carrier = meta if isinstance(meta, dict) else None
        if tracing.silent(carrier):  # its name and attributes are made only for a span that is made
            if key is None and (tool.task is None or not declared):  # no span to enter, nothing but the inline run
                try:
                    rest = self._run_inline(receive, send, grant, rid, tool, params, channel)
                except BaseException:
                    s.sessions.end_call(grant.principal)
                    raise
                if rest is None:
                    s.sessions.end_call(grant.principal)
                    return None
                return self._ended(rest, grant)
            span = tracing.UNTRACED
        else:
            called = {"mcp.method.name": "tools/call", "gen_ai.tool.name": tool.name, "jsonrpc.request.id": str(rid)}
            span = tracing.span(f"tools/call {tool.name}", called, carrier=carrier, kind="server")
        return self._call_within(receive, send, grant, rid, tool, params, declared, channel, key, span)

    async def _ended(self, rest: Coroutine[Any, Any, None], grant: Grant) -> None:
        """The rest of an inline call, then its count ends (:meth:`_call`)."""
        try:
            await rest
        finally:
            self.state.sessions.end_call(grant.principal)

    async def _call_within(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        rid: RequestId,
        tool: RegisteredTool,
        params: dict[str, Any],
        declared: bool,
        channel: RequestChannel,
        key: str | None,
        span: contextlib.AbstractContextManager[Any],
    ) -> None:
        """A counted call within its span: keyed, creating a task, or run inline; its count ends with it."""
        s = self.state
        with span:
            try:  # whatever refuses the call below (a 503 included) comes after the count: the finally releases it
                if key is not None and await self.keyed.call(
                    receive, send, grant, rid, tool, params, declared, channel
                ):
                    return
                if tool.task is not None and declared:
                    if tool.input_before_task:
                        asked = input_before_task(tool, params, ToolContext(grant, rid, None, channel))
                        if asked is not None:
                            await answer(send, rid, self.inline.input_required(asked, channel), "input_required")
                            return
                    task_channel = TaskChannel(self.tasks, channel.capabilities, channel.answers or {})
                    await answer(send, rid, await self.tasks.create(grant, tool, params, task_channel), "task")
                    return

                rest = self._run_inline(receive, send, grant, rid, tool, params, channel)
                if rest is not None:  # not answered in its first step
                    await rest
            finally:
                s.sessions.end_call(grant.principal)

    def _run_inline(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        rid: RequestId,
        tool: RegisteredTool,
        params: dict[str, Any],
        channel: RequestChannel,
    ) -> Coroutine[Any, Any, None] | None:
        """A call run within its request (:meth:`.inline.InlineRuns.run_now`), held among the calls a drain's
        deadline ends from its first suspension (one answered at once never suspends)."""
        work = functools.partial(run_tool, tool, params)
        return self.inline.run_now(receive, send, grant, rid, params, work, channel, self.in_request)

    def _require(self, grant: Grant, tags: frozenset[str]) -> None:
        """403 naming what the token lacks of ``tags`` (a tool's, or an extra method request's), with its challenge."""
        s = self.state
        missing = s.policy.missing(grant.audience, tags, grant.scopes)
        if missing:
            refusal = uncovered(sorted(missing), tags, s.prm_url, s.metrics)
            raise refused(403, errors.TOOL_FORBIDDEN, refusal.description, refusal.data, refusal.challenge)

    def _mirrored(self, tool: RegisteredTool) -> tuple[HeaderMirror, ...]:
        """The tool's ``x-mcp-header`` parameters, read from its schema once (again if the tool was replaced)."""
        cached = self._mirrors.get(tool.name)
        if cached is None or cached[0] is not tool:
            cached = (tool, param_headers.server_mirrors(tool.input_schema()))
            self._mirrors[tool.name] = cached
        return cached[1]


def _binding(grant: Grant, method: str, params: dict[str, Any]) -> mrtr.Binding:
    """What a ``requestState`` of this request is bound to (:attr:`.inline.RequestChannel.binding`)."""
    return mrtr.Binding(grant.principal, method, params[protocol.NAME_PARAMS[method]], params.get("arguments"))


async def _extra(handler: MethodHandler, method: str, params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """An extra method's answer: a missing resource is this revision's ``-32602``; a list carries cache hints."""
    try:
        result = await handler(ctx, params)
    except MethodError as exc:
        if exc.code == errors.RESOURCE_NOT_FOUND:
            raise MethodError(errors.INVALID_PARAMS, exc.message, exc.data) from None
        raise
    return {**result, **CACHE_HINTS} if method in CACHEABLE else result
