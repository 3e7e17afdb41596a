"""The 2026-07-28 leg of the endpoint: stateless requests, and tools that run as tasks (docs/decisions/0012).

A request whose ``_meta`` carries the modern protocol fields is served here, on the same endpoint as the
legacy sessions (:func:`is_modern`); ``initialize`` keeps selecting the legacy leg, unchanged. Every request
stands alone: no session is minted, nothing is resumable, and a client that closes the response has
cancelled the request (the legacy leg keeps running the tool). Durable work goes through the tasks
extension instead: a tool declared ``task=True``, called by a client that declared the extension, is stored
as a task before ``CreateTaskResult`` is sent, runs detached from the request, and is polled with
``tasks/get``. Every task request is decided by :func:`mcp_lossless.core.tasks.decide_poll` against the
token of that request: another principal's task is answered like an unknown id, and the owner's task whose
tool the token no longer covers gets a 403 with the same challenge a refused call gets and the resumable
:data:`~mcp_lossless.core.errors.TASK_DENIED` error, never its result.

A ``tools/call`` carrying an idempotency key (SEP-3182, docs/decisions/0029) is the exception to "closing
cancels": its key is recorded before it runs, it runs detached from its request, and its answer is stored as the
key's outcome, so the retry under the same key finds it running or answered (:meth:`ModernLeg._keyed_call`).
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import logging
import re
import secrets
from base64 import b64decode
from collections.abc import Callable, Coroutine, Generator, Iterable
from typing import Any, NoReturn, assert_never

from .. import __version__, tracing
from ..asgi import Receive, Send, respond
from ..core import denials, errors, frames, mrtr, param_headers, protocol
from ..core.eventids import EventIdCodec
from ..core.events import Loss, PendingRequest, RequestId, StoredEvent, StreamKind, StreamRecord
from ..core.idempotency import CAPABILITY, InvalidKey, key_of
from ..core.limits import LimitExceeded, new_running_task
from ..core.principal import Grant
from ..core.resources import describe, requirement, resources_in, scopes_in
from ..core.task_stream import STREAM_EXTENSION, EventType, StreamDenied, stream_denial_error
from ..core.tasks import (
    EXTENSION,
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
    extension_required,
    lost,
    new_task,
    task_view,
)
from ..stores.base import StoreUnavailable
from ..stores.tasks import TaskLimitReached, TaskStore
from . import metadata
from .errors import Refused
from .idempotency import Keys
from .keys import stream_key
from .observability import log_decision, now
from .state import ServerState
from .task_stream import TaskEvents, TaskStreams
from .tools import (
    InputRequests,
    InputRequired,
    MethodError,
    RegisteredTool,
    ToolContext,
    ToolError,
    ToolInputError,
    content_of,
)
from .writer import SSE_HEADERS

log = logging.getLogger("mcp_lossless.modern")

TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
REMOVED = frozenset(
    {
        "initialize",
        "ping",
        "logging/setLevel",
        "resources/subscribe",
        "resources/unsubscribe",
        "tasks/result",
        "tasks/list",
    }
)
"""Removed by 2026-07-28 or by the tasks extension: ``-32601`` (404), like any method this leg does not serve."""
CACHEABLE = frozenset({"tools/list", "prompts/list", "resources/list", "resources/templates/list", "resources/read"})
"""Results that carry the caching hints ``ttlMs`` and ``cacheScope`` (SEP-2549; ``server/discover`` too)."""
CACHE_HINTS = {"ttlMs": 0, "cacheScope": "private"}
"""Never reuse without asking again, never share: what a principal may see depends on its token."""
PURGE_EVERY_SECONDS = 60.0
INPUT_CAPABILITY = {"sampling/createMessage": "sampling", "elicitation/create": "elicitation", "roots/list": "roots"}
"""The client capability each server-to-client request needs."""
KEEPALIVE_SECONDS = 15.0
SHUTDOWN_SECONDS = 5.0
STORE_ATTEMPTS = 8
"""Tries to store a task's outcome (backing off to 5 s between them) before giving up on it."""
MAX_LISTENERS = 1024
"""Open ``subscriptions/listen`` streams per process; one more is refused with 503."""
MAX_WATCHED_TASKS = 100
"""Task ids one listen stream may watch; the acknowledgement agrees to the first this many it may see."""
PUSH_POLL_SECONDS = 1.0
"""A listen stream watching tasks re-reads them this often besides being woken: a task changed by another
replica is pushed within this long."""
INPUT_POLL_SECONDS = 1.0
"""A task waiting for input looks at the store this often besides being woken: ``tasks/update`` may reach
another replica, which can only leave the answers in the store."""
DESCRIBE_EVERY_SECONDS = 0.1
CLOSE_STREAM_REFUSED = (
    f"close_stream: a {protocol.STATELESS} response cannot be resumed; a tool that frees its connection while it "
    "works runs as a task there (task=True), which the client polls"
)
"""A running task's progress is stored as its status message at most this often (a store write each time)."""


def is_modern(message: Any, index: dict[bytes, bytes]) -> bool:
    """Whether a POST opens the modern way: its ``_meta`` carries the protocol version, or it has no session and
    names a protocol version no legacy session could have (it is then answered by this leg's validation)."""
    if not isinstance(message, dict):
        return False
    params = message.get("params")
    meta = params.get("_meta") if isinstance(params, dict) else None
    if isinstance(meta, dict) and protocol.VERSION_META_KEY in meta:
        return True
    version = index.get(b"mcp-protocol-version")
    if version is None or b"mcp-session-id" in index:
        return False
    return version.decode("latin-1") not in protocol.HANDSHAKE_VERSIONS


def _refused(
    status: int, code: int, message: str, data: Any = None, headers: Iterable[tuple[bytes, bytes]] = ()
) -> Refused:
    """A modern request refused with a JSON-RPC error at an HTTP status; :meth:`ModernLeg.serve` adds the id."""
    return Refused.rpc(status, code, message, data=data, headers=headers)


_OUTSIDE_FIELD_VALUE = re.compile(rb"[^\x20-\x7e\t]")
"""A byte a plain header value may not hold: anything but visible ASCII, space and tab."""


def _over_limit(exceeded: LimitExceeded) -> Refused:
    """A limit of :mod:`mcp_lossless.core.limits` in this leg's error shape: its status, the code and data the
    legacy leg answers it with (``LIMIT_EXCEEDED`` naming the limit)."""
    body = exceeded.body()["error"]
    return _refused(exceeded.status, body["code"], body["message"], body["data"], exceeded.headers())


def _header_value(raw: bytes) -> str:
    """A mirrored header's value without surrounding whitespace (RFC 9110 §5.5): plain ASCII, or the
    ``=?base64?…?=`` sentinel form (UTF-8 inside)."""
    raw = raw.strip(b" \t")
    if raw.startswith(b"=?base64?") and raw.endswith(b"?=") and len(raw) >= 11:
        try:
            return b64decode(raw[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise _refused(400, errors.HEADER_MISMATCH, "header value is not valid base64 UTF-8") from None
    if _OUTSIDE_FIELD_VALUE.search(raw) is not None:
        raise _refused(400, errors.HEADER_MISMATCH, "header value has characters outside visible ASCII")
    return raw.decode("ascii")


class _RequestChannel:
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
        self.min_level = protocol.LOGGING_LEVELS.index(log_level) if log_level in protocol.LOGGING_LEVELS else None
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


class _TaskChannel(_RequestChannel):
    """A task's way back: its tool's progress becomes the task's ``statusMessage`` (the extension's progress
    description), which its polls show; no log messages; input is taken from what its ``tools/call`` gathered,
    else asked through the task's own ``input_required`` state."""

    __slots__ = ("described_at", "leg", "task_id")

    def __init__(self, leg: ModernLeg, capabilities: dict[str, Any], answers: dict[str, dict[str, Any]]) -> None:
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


def _progress_token(params: dict[str, Any]) -> str | int | None:
    meta = params.get("_meta")
    token = meta.get("progressToken") if isinstance(meta, dict) else None
    return token if isinstance(token, (str, int)) and not isinstance(token, bool) else None


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


async def run_tool(tool: RegisteredTool, params: dict[str, Any], ctx: ToolContext) -> dict[str, Any]:
    """A tool's ``CallToolResult``; a :class:`MethodError` for a JSON-RPC error (bad arguments, client input)."""
    ctx.idempotency_key = key_of(params)  # valid: an invalid key was answered before anything ran
    try:
        kwargs = tool.bind(params.get("arguments"))
    except ToolInputError as exc:
        raise MethodError(errors.INVALID_PARAMS, f"invalid arguments for {tool.name}: {exc}") from None
    if tool.context_param is not None:
        kwargs[tool.context_param] = ctx
    try:
        return content_of(await tool.fn(**kwargs))
    except ToolError as exc:
        return {"content": [{"type": "text", "text": str(exc)}], "isError": True}
    except (MethodError, asyncio.CancelledError):
        raise
    except Exception:
        log.exception("tool %s failed", tool.name)
        return {"content": [{"type": "text", "text": f"tool {tool.name} failed"}], "isError": True}


class ModernLeg:
    def __init__(
        self, state: ServerState, tasks: TaskStore, *, task_ttl: float | None = 3600.0, poll_ms: int = 500
    ) -> None:
        self.s = state
        self.tasks = tasks
        self.task_ttl = task_ttl
        """Seconds a task is kept after its last status change or its owner's last poll (``None``: unlimited)."""
        self.poll_ms = poll_ms
        self.running: dict[str, asyncio.Task[None]] = {}
        self.in_request: set[asyncio.Task[Any]] = set()
        """The requests running a tool call within themselves (not as a task): what a drain's deadline ends."""
        """Tasks this process runs, by task id: a live task of this instance missing here was lost."""
        self.keys = Keys(state)
        """Idempotency keys between their decision and their record (ADR 0029), shared with the legacy leg."""
        self.keyed: set[asyncio.Task[bytes]] = set()
        """Keyed calls running detached from their request (:meth:`_run_keyed`)."""
        self.cancelling: set[str] = set()
        self.inboxes: dict[str, _Inbox] = {}
        self.listeners = 0
        self._tool_listeners: set[asyncio.Event] = set()
        self._task_listeners: dict[str, set[asyncio.Event]] = {}
        """Listen streams watching a task, woken when this process changes it (others find out by polling)."""
        """Open listen streams that asked for ``toolsListChanged`` (only honoured when tools may change)."""
        self._state_key = b""
        """The MAC key of ``requestState`` (:func:`.mrtr.state_key`), from the store's secret at :meth:`open`."""
        self._mirrors: dict[str, tuple[RegisteredTool, tuple[_Mirrored, ...]]] = {}
        self._purged_at = 0.0
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
        self.events = TaskEvents(state.store, state.instance)
        """Each running task's events, kept as a stream of the event store (SEP-2694, ADR 0031)."""
        self.streams = TaskStreams(self.events, state.policy)

    async def open(self) -> None:
        await self.tasks.open()
        self._state_key = mrtr.state_key(await self.s.store.secret())

    async def end_running(self) -> None:
        """A drain's deadline: each call running in its request answers execution lost on its stream, each task
        records itself lost (the process goes); waited for, so every outcome is out before connections close."""
        ending = [*self.in_request, *self.running.values()]
        for task in ending:
            task.cancel("server shutdown")
        if ending:
            await asyncio.wait(ending, timeout=SHUTDOWN_SECONDS)

    async def close(self) -> None:
        """Shutdown: each running task records itself lost (the process goes), then the store closes."""
        running: list[asyncio.Task[Any]] = [*self.running.values(), *self.keyed]
        for task in running:
            task.cancel("server shutdown")
        if running:
            await asyncio.wait(running, timeout=SHUTDOWN_SECONDS)  # a store that is down does not hold shutdown
        await self.tasks.close()

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
        rid: RequestId | None = message.get("id")
        try:
            await self._serve(receive, send, grant, index, message, connection)
        except Refused as refused:
            if isinstance(refused.body, dict) and refused.body.get("id") is None:
                refused.body["id"] = rid  # raised where found, which need not know the request's id
            raise
        except StoreUnavailable:
            raise Refused.rpc(
                503,
                errors.INTERNAL_ERROR,
                "task store unavailable; retry later",
                request_id=rid,
                headers=[(b"retry-after", b"1")],
            ) from None

    async def _serve(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        index: dict[bytes, bytes],
        message: dict[str, Any],
        connection: object = None,
    ) -> None:
        if "method" not in message:
            raise _refused(400, errors.INVALID_REQUEST, f"clients send no responses on {protocol.STATELESS}")
        method: str = message["method"]
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if "id" not in message:
            await respond(send, 202)  # this revision defines no client notifications over HTTP: accepted, ignored
            return
        capabilities = self._validate(index, method, params)
        rid: RequestId = message["id"]
        declared = isinstance(capabilities.get("extensions"), dict) and EXTENSION in capabilities["extensions"]
        if method == "tasks/stream":
            await self._task_stream(receive, send, grant, rid, params, declared, connection)
            return
        if method in TASK_METHODS:  # a poll needs no channel and no request state: straight to its decision
            await self._task_request(send, grant, rid, method, params, declared)
            return
        answers: dict[str, dict[str, Any]] | None = None
        bound: Callable[[], mrtr.Binding] | None = None
        if method in mrtr.MRTR_METHODS:

            def binding() -> mrtr.Binding:
                return mrtr.Binding(
                    grant.principal, method, params[protocol.NAME_PARAMS[method]], params.get("arguments")
                )

            answers, bound = {}, binding
            if "requestState" in params or "inputResponses" in params:  # a first round pays for no state
                try:
                    answers = mrtr.answers_of(self._state_key, params, binding(), now())
                except mrtr.BadInput as exc:
                    await respond(send, 200, frames.error(rid, errors.INVALID_PARAMS, str(exc)), b"application/json")
                    return
        channel = _RequestChannel(capabilities, params["_meta"].get(protocol.LOG_LEVEL_META_KEY), answers, bound)
        if method == "server/discover":
            await self._answer(send, rid, self._discover())
        elif method == "tools/list":
            await self._answer(send, rid, {"tools": self.s.tools_list, **CACHE_HINTS})
        elif method == "tools/call":
            await self._call(receive, send, grant, index, rid, params, declared, channel)
        elif method == "subscriptions/listen":
            await self._listen(receive, send, grant, rid, params, declared)
        elif method in self.s.methods and method not in REMOVED:
            handler = self.s.methods[method]
            tags = self.s.method_tags.get(method)
            if tags is not None:
                self._require(grant, tags(params))

            async def work(ctx: ToolContext) -> dict[str, Any]:
                try:
                    result = await handler(ctx, params)
                except MethodError as exc:
                    if exc.code == errors.RESOURCE_NOT_FOUND:
                        raise MethodError(errors.INVALID_PARAMS, exc.message, exc.data) from None
                    raise
                return {**result, **CACHE_HINTS} if method in CACHEABLE else result

            await self._run_now(receive, send, grant, rid, params, work, channel)
        else:
            raise _refused(404, errors.METHOD_NOT_FOUND, f"method {method!r} not found on {protocol.STATELESS}")

    def _validate(self, index: dict[bytes, bytes], method: str, params: dict[str, Any]) -> dict[str, Any]:
        """The per-request fields (``-32602``), the mirrored headers (``-32020``), the version (``-32022``)."""
        meta = params.get("_meta")
        version = meta.get(protocol.VERSION_META_KEY) if isinstance(meta, dict) else None
        capabilities = meta.get(protocol.CAPABILITIES_META_KEY) if isinstance(meta, dict) else None
        if not isinstance(version, str) or not isinstance(capabilities, dict):
            raise _refused(
                400,
                errors.INVALID_PARAMS,
                f"params._meta must carry {protocol.VERSION_META_KEY} (a string) and "
                f"{protocol.CAPABILITIES_META_KEY} (an object)",
            )
        header = index.get(b"mcp-protocol-version")
        if header is None:
            raise _refused(400, errors.HEADER_MISMATCH, "MCP-Protocol-Version header required")
        if header.decode("latin-1").strip(" \t") != version:
            raise _refused(
                400,
                errors.HEADER_MISMATCH,
                f"MCP-Protocol-Version header does not match {protocol.VERSION_META_KEY} {version!r}",
            )
        if version != protocol.STATELESS:
            raise _refused(
                400,
                errors.UNSUPPORTED_PROTOCOL_VERSION,
                "Unsupported protocol version",
                {"supported": list(protocol.SERVED_VERSIONS), "requested": version},
            )
        named = index.get(b"mcp-method")
        if named is None or _header_value(named) != method:
            raise _refused(400, errors.HEADER_MISMATCH, f"Mcp-Method header must be present and equal {method!r}")
        field = protocol.NAME_PARAMS.get(method)
        if field is not None:
            name = index.get(b"mcp-name")
            value = params.get(field)
            if name is None or not isinstance(value, str) or _header_value(name) != value:
                raise _refused(400, errors.HEADER_MISMATCH, f"Mcp-Name header must be present and equal params.{field}")
        return capabilities

    def _discover(self) -> dict[str, Any]:
        return {
            "supportedVersions": list(protocol.SERVED_VERSIONS),
            "capabilities": self.capabilities,
            "instructions": "Tool results are never lost or leaked: long or non-idempotent tools run as tasks.",
            "_meta": {protocol.SERVER_INFO_META_KEY: self.server_info},
            **CACHE_HINTS,
        }

    async def _answer(self, send: Send, rid: RequestId, result: dict[str, Any], kind: str = "complete") -> None:
        await respond(send, 200, frames.result(rid, {**result, "resultType": kind}), b"application/json")

    # -- tools/call ----------------------------------------------------------------------------------

    async def _call(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        index: dict[bytes, bytes],
        rid: RequestId,
        params: dict[str, Any],
        declared: bool,
        channel: _RequestChannel,
    ) -> None:
        s = self.s
        name = params.get("name")
        tool = s.tools.get(name) if isinstance(name, str) else None
        if tool is None:
            await respond(
                send, 200, frames.error(rid, errors.INVALID_PARAMS, f"unknown tool {name!r}"), b"application/json"
            )
            return
        _check_mirrored(index, params, self._mirrored(tool))
        self._require(grant, s.tool_tags[tool.name])
        if tool.task == "required" and not declared:
            raise self._missing_extension()
        try:
            key = key_of(params) if s.store.idempotency_keys else None
        except InvalidKey as exc:
            await respond(send, 200, frames.error(rid, errors.INVALID_PARAMS, str(exc)), b"application/json")
            return
        exceeded = s.sessions.start_call(grant.principal)  # one cap per principal, both eras counted
        if exceeded is not None:
            raise _over_limit(exceeded)
        meta = params.get("_meta")
        called = {"mcp.method.name": "tools/call", "gen_ai.tool.name": tool.name, "jsonrpc.request.id": str(rid)}
        with tracing.span(
            f"tools/call {tool.name}", called, carrier=meta if isinstance(meta, dict) else None, kind="server"
        ):
            try:  # whatever refuses the call below (a 503 included) comes after the count: the finally releases it
                if key is not None:
                    await self._keyed_call(receive, send, grant, rid, tool, params, declared, channel)
                    return
                if tool.task is not None and declared:
                    if tool.input_before_task:
                        asked = _input_before_task(tool, params, ToolContext(grant, rid, None, channel))
                        if asked is not None:
                            await self._answer(send, rid, self._input_required(asked, channel), "input_required")
                            return
                    task_channel = _TaskChannel(self, channel.capabilities, channel.answers or {})
                    await self._answer(send, rid, await self._create_task(grant, tool, params, task_channel), "task")
                    return

                async def work(ctx: ToolContext) -> dict[str, Any]:
                    return await run_tool(tool, params, ctx)

                me = asyncio.current_task()
                assert me is not None
                self.in_request.add(me)
                try:
                    await self._run_now(receive, send, grant, rid, params, work, channel)
                finally:
                    self.in_request.discard(me)
            finally:
                s.sessions.end_call(grant.principal)

    async def _keyed_call(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        rid: RequestId,
        tool: RegisteredTool,
        params: dict[str, Any],
        declared: bool,
        channel: _RequestChannel,
    ) -> None:
        """A keyed ``tools/call`` (ADR 0029): a duplicate is answered from the key's record; a first use records
        its key with a stream of its own (its own session id: no session holds it) before anything runs, and its
        answer, result or ``CreateTaskResult`` (a repeated key returns the same task), is that stream's one event,
        stored before it is sent. The work runs detached from the request (:meth:`_run_keyed`), so a broken
        connection does not cancel it: the retry finds it running or answered."""
        s = self.s
        creates_task = tool.task is not None and declared and not tool.input_before_task
        if creates_task:
            self._check_task_room()  # a refusal that waiting cures is not recorded as the key's outcome
        tags = s.tool_tags[tool.name]
        pending = PendingRequest(rid, "tools/call", tool.name, tags)
        stream = stream_key()
        record = StreamRecord(stream, stream, StreamKind.POST, s.instance, (pending,), 0)
        try:
            answers, _opened = await self.keys.open(
                None, grant, record, [{"params": params}], [pending], _over_limit, alone=True
            )
        except StoreUnavailable:
            raise _refused(503, errors.INTERNAL_ERROR, "the event store is unavailable") from None
        if 0 in answers:
            await respond(send, 200, answers[0], b"application/json")
            return
        if creates_task:
            task_channel = _TaskChannel(self, channel.capabilities, channel.answers or {})

            async def create() -> bytes:
                try:
                    created = await self._create_task(grant, tool, params, task_channel)
                except Refused as refused:  # the store refused the task (its own cap): that is the key's outcome
                    error = refused.body["error"]
                    return frames.error(rid, error["code"], error["message"], error.get("data"))
                return frames.result(rid, {**created, "resultType": "task"})

            await self._run_keyed(receive, send, grant, record, create(), channel)
            return
        ctx = ToolContext(grant, rid, _progress_token(params), channel)

        async def run() -> bytes:
            outcome = _Outcome()
            if tool.task is not None and declared:  # asks for its input before it becomes a task
                asked = _input_before_task(tool, params, ctx)
                if asked is not None:
                    return frames.result(rid, {**self._input_required(asked, channel), "resultType": "input_required"})
            try:
                outcome.settle(None, await run_tool(tool, params, ctx))
            except (Exception, InputRequired) as exc:  # a request for input is this round's answer, as unkeyed
                outcome.settle(exc)
            return self._outcome(rid, outcome, channel)[1]

        await self._run_keyed(receive, send, grant, record, run(), channel)

    async def _run_keyed(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        record: StreamRecord,
        work: Coroutine[Any, Any, bytes],
        channel: _RequestChannel,
    ) -> None:
        """Run a keyed call's ``work`` in a task of its own, counted under the principal's cap until it ends, and
        relay its notifications (SSE) and then its stored answer while the client stays. A client that leaves
        stops only the relay: the call goes on, its answer is stored, and the retry under its key gets it."""
        s = self.s
        loop = s.loop
        s.sessions.hold_call(grant.principal)
        job = loop.create_task(self._answer_keyed(record, work, grant))
        self.keyed.add(job)
        job.add_done_callback(self.keyed.discard)
        gone = loop.create_task(_disconnected(receive))
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
            answer = job.result()
            if streaming:
                await send({"type": "http.response.body", "body": frames.sse(None, answer)})
            else:
                await respond(send, 200, answer, b"application/json")
        finally:
            gone.cancel()

    async def _answer_keyed(self, record: StreamRecord, work: Coroutine[Any, Any, bytes], grant: Grant) -> bytes:
        """The keyed call's answer, stored as its stream's one event (the key's outcome) before it is returned. A
        call cut short by shutdown stores nothing: its stream stays open under this instance, which a later
        duplicate finds dead and settles as lost (execution lost naming the key)."""
        s = self.s
        request = record.requests[0]
        try:
            answer = await work
            mac = s.codec.stream_mac(record.session_id, record.stream)
            event = StoredEvent(
                record.session_id, record.stream, 1, EventIdCodec.encode(record.stream, 1, mac), answer,
                request.request_id, request.tool, request.resources, True,
            )  # fmt: skip
            try:
                await s.store.append(event, completes=True)
            except StoreUnavailable:  # the client still gets what ran; a duplicate will hear it may have run
                log.warning("the answer of keyed request %s could not be stored", request.request_id)
                with contextlib.suppress(StoreUnavailable):
                    await s.store.mark_lost(record.stream, s.instance, Loss.STORE)
            return answer
        finally:
            s.sessions.end_call(grant.principal)

    def _require(self, grant: Grant, tags: frozenset[str]) -> None:
        """403 naming what the token lacks of ``tags`` (a tool's, or an extra method request's), with its challenge."""
        s = self.s
        missing = sorted(s.policy.missing(grant.audience, tags, grant.scopes))
        if missing:
            s.metrics.refusals.labels("insufficient_audience", "call").inc()
            description = f"token does not cover {describe(missing)}"
            data = denials.refusal_fields(" ".join(sorted(tags)), missing)
            raise _refused(403, errors.TOOL_FORBIDDEN, description, data, self._challenge(description, missing, tags))

    def _mirrored(self, tool: RegisteredTool) -> tuple[_Mirrored, ...]:
        """The tool's ``x-mcp-header`` parameters, read from its schema once (again if the tool was replaced)."""
        cached = self._mirrors.get(tool.name)
        if cached is None or cached[0] is not tool:
            cached = (tool, tuple(_mirrored_params(tool.input_schema())))
            self._mirrors[tool.name] = cached
        return cached[1]

    def _input_required(self, asked: InputRequired, channel: _RequestChannel) -> dict[str, Any]:
        """The ``InputRequiredResult``: what the tool asks, and the answers it took so far, sealed."""
        assert channel.binding is not None, "only a multi round-trip method reaches here"
        state = mrtr.seal(self._state_key, channel.binding(), asked.answers, now())
        log_decision("input_required", keys=sorted(asked.requests))
        return {"inputRequests": asked.requests, "requestState": state}

    def _challenge(self, description: str, missing: Iterable[str], needed: Iterable[str]) -> list[tuple[bytes, bytes]]:
        """The challenge a refused call gets (:func:`.metadata.insufficient_scope`): what a new token must hold."""
        return [(b"www-authenticate", metadata.insufficient_scope(description, self.s.prm_url, missing, needed))]

    async def _run_now(
        self,
        receive: Receive,
        send: Send,
        grant: Grant,
        rid: RequestId,
        params: dict[str, Any],
        work: Callable[[ToolContext], Coroutine[Any, Any, dict[str, Any]]],
        channel: _RequestChannel,
    ) -> None:
        """Run a request within its response: JSON, or SSE once it sends a notification. A disconnect cancels it."""
        ctx = ToolContext(grant, rid, _progress_token(params), channel)
        coro = work(ctx)
        outcome = _Outcome()
        try:
            yielded = coro.send(None)  # its first step, here: all that a call answered at once needs
        except BaseException as exc:
            outcome.settle(exc)
            if channel.quiet():  # no task, no watcher, no stream: nothing else to wait for
                await respond(send, *self._outcome(rid, outcome, channel), b"application/json")
                return
            yielded = None
        else:
            outcome.pending = True
        await self._stream_while(receive, send, rid, coro, yielded, outcome, channel)

    async def _stream_while(
        self,
        receive: Receive,
        send: Send,
        rid: RequestId,
        coro: Coroutine[Any, Any, dict[str, Any]],
        yielded: Any,
        outcome: _Outcome,
        channel: _RequestChannel,
    ) -> None:
        """The rest of a request that did not answer in its first step: the tool goes on *in this task* (its
        timeouts and cancel scopes see the task they began in), its notifications stream as SSE from a pump
        beside it, and a watcher cancels it when the client disconnects (on this revision, a cancellation)."""
        loop = self.s.loop
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
            await _disconnected(receive)
            left = True
            if outcome.pending:
                me.cancel("client disconnected")

        pumping, watching = loop.create_task(pump()), loop.create_task(watch())
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
            status, answer = self._outcome(rid, outcome, channel)
            if streaming:
                await send({"type": "http.response.body", "body": frames.sse(None, answer)})
            else:
                await respond(send, status, answer, b"application/json")
        finally:
            pumping.cancel()
            watching.cancel()
            if outcome.pending:
                coro.close()

    def _outcome(self, rid: RequestId, outcome: _Outcome, channel: _RequestChannel) -> tuple[int, bytes]:
        """The finished request's answer, and its HTTP status if the response has not begun."""
        try:
            value = outcome.result()
        except InputRequired as asked:
            return 200, frames.result(rid, {**self._input_required(asked, channel), "resultType": "input_required"})
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
        return 200, frames.result(rid, {**value, "resultType": "complete"})

    async def _listen(
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
            raise self._missing_extension()
        if task_ids is not None and not (isinstance(task_ids, list) and all(isinstance(t, str) for t in task_ids)):
            raise _refused(400, errors.INVALID_PARAMS, "notifications.taskIds must be a list of task id strings")
        if self.listeners >= MAX_LISTENERS:
            raise _refused(503, errors.INTERNAL_ERROR, f"{MAX_LISTENERS} listen streams are open, the limit")
        meta = {protocol.SUBSCRIPTION_META_KEY: rid}
        tools = self.capabilities.get("tools", {}).get("listChanged") is True
        tools = tools and isinstance(wanted, dict) and wanted.get("toolsListChanged") is True
        watched: dict[str, tuple[object, ...] | None] = {}
        """Each watched task, with what its last push said (``None``: nothing pushed yet)."""
        for task_id in list(dict.fromkeys(task_ids or ()))[:MAX_WATCHED_TASKS]:
            if isinstance(await self._look(grant, task_id, Purpose.WATCH), Deliver):
                watched[task_id] = None
        agreed: dict[str, Any] = {"toolsListChanged": True} if tools else {}
        if task_ids is not None:
            agreed["taskIds"] = list(watched)
        ack = {"notifications": agreed, "_meta": meta}
        changed, tasks_changed = asyncio.Event(), asyncio.Event()
        if tools:
            self._tool_listeners.add(changed)
        for task_id in watched:
            self._task_listeners.setdefault(task_id, set()).add(tasks_changed)
        self.listeners += 1
        gone = self.s.loop.create_task(_disconnected(receive))
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
                wakers = {self.s.loop.create_task(changed.wait()), self.s.loop.create_task(tasks_changed.wait())}
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
                listeners = self._task_listeners.get(task_id)
                if listeners is not None:
                    listeners.discard(tasks_changed)
                    if not listeners:
                        del self._task_listeners[task_id]
            self.listeners -= 1

    async def _task_pushes(
        self, grant: Grant, watched: dict[str, tuple[object, ...] | None], meta: dict[str, Any]
    ) -> list[bytes]:
        """The ``notifications/tasks`` a listen stream owes: each watched task whose state changed since its last
        push, authorized now against the stream's token like a poll; a terminal task is pushed once, then
        forgotten, as is one the token may no longer see."""
        notes = []
        for task_id, last in list(watched.items()):
            match await self._look(grant, task_id, Purpose.PUSH):
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
                params = {**detailed_task(record, self.poll_ms), "_meta": meta}
                notes.append(frames.notification("notifications/tasks", params))
            if record.status.terminal:
                del watched[task_id]
        return notes

    async def _update(self, record: TaskRecord) -> TaskRecord | None:
        """Store a task's new state (:meth:`.TaskStore.update`) and wake the listen streams watching it here."""
        stored = await self.tasks.update(record)
        if stored is not None and record.task_id in self.running:  # this process produces the task's events
            await self.events.observe(stored)
        for listener in self._task_listeners.get(record.task_id, ()):
            listener.set()
        return stored

    def tools_changed(self) -> None:
        """The tool list changed: every listener that asked for ``toolsListChanged`` is told."""
        for changed in self._tool_listeners:
            changed.set()

    # -- tasks ---------------------------------------------------------------------------------------

    async def _create_task(
        self, grant: Grant, tool: RegisteredTool, params: dict[str, Any], channel: _TaskChannel
    ) -> dict[str, Any]:
        """Create and start the task; its ``CreateTaskResult`` (without ``resultType``)."""
        s = self.s
        self._check_task_room()
        at = now()
        if at - self._purged_at > PURGE_EVERY_SECONDS:
            self._purged_at = at
            await self.tasks.purge_expired(at)
        tags = s.tool_tags[tool.name]
        requirement = Requirement(frozenset(resources_in(tags)), frozenset(scopes_in(tags)))
        record = new_task(
            secrets.token_urlsafe(24), grant.principal, tool.name, requirement, s.instance, at, self.task_ttl
        )
        try:
            await self.tasks.create(record)  # durable before the client hears of it
        except TaskLimitReached as exc:
            raise _refused(503, errors.INTERNAL_ERROR, str(exc), headers=[(b"retry-after", b"5")]) from None
        await self.events.open(record)
        channel.task_id = record.task_id
        self.inboxes[record.task_id] = _Inbox()
        s.sessions.hold_call(grant.principal)  # the task takes its request's place under the principal's cap
        self.running[record.task_id] = s.loop.create_task(self._run_task(record, tool, params, grant, channel))
        log_decision("task_created", task=record.task_id[:8], tool=tool.name)
        return task_view(record, self.poll_ms)

    def _check_task_room(self) -> None:
        """503 past ``running_tasks``: a running task holds this process's memory, whatever the store."""
        s = self.s
        exceeded = new_running_task(s.config.limits, len(self.running))
        if exceeded is not None:
            s.metrics.limit_refusals.labels(exceeded.limit).inc()
            raise _over_limit(exceeded)

    async def _run_task(
        self, record: TaskRecord, tool: RegisteredTool, params: dict[str, Any], grant: Grant, channel: _TaskChannel
    ) -> None:
        ctx = ToolContext(grant, record.task_id, record.task_id, channel)  # progress always wanted: polls show it
        task_id = record.task_id
        try:
            try:
                settled = advance(record, TaskStatus.COMPLETED, now(), result=await run_tool(tool, params, ctx))
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
            self.s.sessions.end_call(grant.principal)

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
        record = await self.tasks.get(task_id)
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
            record = await self.tasks.get(task_id)
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
                record = await self.tasks.get(task_id)
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

    async def _task_request(
        self, send: Send, grant: Grant, rid: RequestId, method: str, params: dict[str, Any], declared: bool
    ) -> None:
        """``tasks/get``, ``tasks/update``, ``tasks/cancel``: the poll decision, then the method's own work."""
        if not declared:
            raise self._missing_extension()
        task_id: str = params["taskId"]  # checked against Mcp-Name in _validate: a string
        meta = params.get("_meta")
        polled = {"mcp.method.name": method, "mcp_lossless.task": task_id, "jsonrpc.request.id": str(rid)}
        with tracing.span(method, polled, carrier=meta if isinstance(meta, dict) else None, kind="server"):
            await self._task_request_traced(send, grant, rid, method, params, task_id)

    async def _task_request_traced(
        self, send: Send, grant: Grant, rid: RequestId, method: str, params: dict[str, Any], task_id: str
    ) -> None:
        match await self._look(grant, task_id, Purpose.POLL):
            case Unknown():
                await respond(send, 200, frames.error(rid, errors.INVALID_PARAMS, UNKNOWN_MESSAGE), b"application/json")
            case Denied() as denied:
                self._deny(denied)
            case Deliver(record=record):
                if method == "tasks/get":
                    await self._answer(send, rid, detailed_task(record, self.poll_ms))
                    return
                if method == "tasks/update":
                    try:
                        await self._deliver(task_id, params.get("inputResponses", {}))  # none sent: none delivered
                    except mrtr.BadInput as exc:
                        error = frames.error(rid, errors.INVALID_PARAMS, str(exc))
                        await respond(send, 200, error, b"application/json")
                        return
                elif not record.status.terminal:  # tasks/cancel
                    await self._cancel(record)
                await self._answer(send, rid, {})  # an empty acknowledgement: the next tasks/get shows the effect
            case unreachable:
                assert_never(unreachable)

    async def _look(self, grant: Grant, task_id: str, purpose: Purpose) -> Unknown | Denied | Deliver:
        """Answer what :func:`~mcp_lossless.core.tasks.decide_poll` asks about ``task_id`` and write what its
        outcome says (a lost task settled, the owner's poll noted): the store's part of every look at a task."""
        at = now()
        facts = PollFacts(task_id, await self.tasks.get(task_id), purpose)
        while True:
            match decide_poll(facts, grant, self.s.policy, at):
                case NeedRunner(owner=owner):
                    if owner == self.s.instance:
                        facts.runs = task_id in self.running
                    else:
                        facts.runs = await self.s.store.owner_alive(owner)
                case SettleLost(record=settled):
                    facts.record = await self._update(settled) or settled  # a purged task is answered as settled
                    await self.events.lost(task_id, settled.owner)
                    log_decision("task_lost", task=task_id[:8])
                case Unknown() as unknown:
                    return unknown
                case Denied(touch_at=touch_at) | Deliver(touch_at=touch_at) as outcome:
                    if touch_at is not None:
                        await self.tasks.touch(task_id, touch_at)
                    return outcome
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

    @staticmethod
    def _missing_extension() -> Refused:
        return _refused(
            400,
            errors.MISSING_REQUIRED_CLIENT_CAPABILITY,
            "Missing required client capability",
            extension_required(),
        )

    async def _task_stream(
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
            raise self._missing_extension()
        task_id: str = params["taskId"]  # checked against Mcp-Name in _validate: a string

        async def look() -> Unknown | Denied | Deliver:
            return await self._look(grant, task_id, Purpose.POLL)

        await self.streams.serve(receive, send, grant, rid, params, connection, look, self._refuse_stream)

    def _refuse_stream(self, denied: StreamDenied) -> Refused:
        """A task stream refused before any byte: the 403 with the challenge a refused call gets."""
        self.s.metrics.refusals.labels("insufficient_audience", "task").inc()
        log_decision("task_stream_denied", task=denied.task_id[:8], missing=list(denied.missing))
        error = stream_denial_error(denied)
        headers = self._challenge(error["message"], denied.missing, denied.missing)
        return _refused(403, error["code"], error["message"], error["data"], headers)

    def _deny(self, denied: Denied) -> NoReturn:
        self.s.metrics.refusals.labels("insufficient_audience", "task").inc()
        log_decision("task_denied", task=denied.task_id[:8], missing=list(denied.missing_resources))
        error = denial_error(denied)
        gap = requirement(denied.missing_resources, denied.missing_scopes)
        needed = requirement(denied.requirement.resources, denied.requirement.scopes)
        headers = self._challenge(denial_message(denied), gap, needed)
        raise _refused(403, error["code"], error["message"], error["data"], headers)


_Mirrored = tuple[tuple[str, ...], bytes]
"""An ``x-mcp-header`` parameter: its path of ``properties`` keys in the arguments, and its header's name."""


def _mirrored_params(schema: dict[str, Any]) -> Iterable[_Mirrored]:
    """The parameters a schema marks ``x-mcp-header`` with a non-empty name (the server's own tools: taken as
    written, not checked as a client checks a server's)."""
    for path, header, _ in param_headers.annotated(schema):
        if isinstance(header, str) and header:
            yield path, param_headers.PREFIX.encode() + header.lower().encode("latin-1")


def _same(text: str, value: object) -> bool:
    """A mirrored header's (decoded) text against the argument: integers compare as numbers, booleans as
    ``true``/``false``, strings exactly."""
    if isinstance(value, bool):
        return text == ("true" if value else "false")
    if isinstance(value, int):
        try:
            return float(text) == value
        except ValueError:
            return False
    return isinstance(value, str) and text == value


def _check_mirrored(index: dict[bytes, bytes], params: dict[str, Any], mirrored: tuple[_Mirrored, ...]) -> None:
    """Each ``x-mcp-header`` argument present in the body must come with its ``Mcp-Param-*`` header, equal
    after decoding (-32020/400); an absent or null argument expects no header."""
    arguments = params.get("arguments")
    for path, header in mirrored:
        value = param_headers.argument_at(arguments, path)
        if value is None:
            continue
        name = header.decode("latin-1")
        raw = index.get(header)
        if raw is None:
            raise _refused(400, errors.HEADER_MISMATCH, f"{name} header required: arguments.{'.'.join(path)} is set")
        if not _same(_header_value(raw), value):
            raise _refused(400, errors.HEADER_MISMATCH, f"{name} header does not match arguments.{'.'.join(path)}")


def _input_before_task(tool: RegisteredTool, params: dict[str, Any], ctx: ToolContext) -> InputRequired | None:
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


_END_OF_NOTES = b""
"""Put behind a request's last notification: its pump stops there (a notification is never empty)."""


class _Outcome:
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


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
