"""The 2026-07-28 client: stateless requests, and tasks followed to their one outcome (docs/decisions/0012, 0031).

Every request is a POST of its own carrying ``_meta`` (version, capabilities with the tasks extension) and the
mirrored headers. A call whose server answers with a task is followed with ``tasks/stream`` (SEP-2694) when the
server's ``server/discover`` declares it: each event handed on once and in order, resumed after the last one
delivered when the stream breaks, re-authorized on a denial, ``events_gone`` told to the caller and the outcome
then polled (:mod:`.task_follow` decides each step). Otherwise it is polled with ``tasks/get`` (the server's
``pollIntervalMs``, growing while nothing changes) until it is terminal. A denial of the task's poll (403
with :data:`~mcp_lossless.core.errors.TASK_DENIED`, the token no longer covers the tool) is repaired with a
fresh grant for the union of what the call needed and what the denial names (a refresh cannot widen), and the
same task id is polled again; an unknown task id, or a server that stopped answering the polls until the deadline
passed, ends the call as may-have-run. A tool's ``x-mcp-header``
parameters are mirrored into ``Mcp-Param-*`` headers on each of its calls, and a tool published with a malformed
annotation is left out of :meth:`ModernClient.list_tools` and never called (:mod:`..core.param_headers`). A
request refused as ``UNSUPPORTED_PROTOCOL_VERSION`` by a server that lists 2026-07-28 is sent once more.
Input the server asks for (an ``input_required`` answer, re-sent with the answers and the sealed
``requestState``; a task waiting ``input_required``, answered with ``tasks/update``) comes from the user's
handlers (:mod:`.handlers`), within :data:`~.MAX_INPUT_ROUNDS` rounds per call (docs/decisions/0015). A broken
response on a call that runs within its request cancelled it (the server must treat a disconnect so): it is
re-issued under a new id only for idempotent tools, else it ends as :class:`CallMayHaveRun`.

:func:`open_client` probes the server's era once per origin (``server/discover`` first, ``initialize`` when the
answer is not a modern one) and returns this client or the legacy :class:`~mcp_lossless.client.Client`.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import random
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import anyio
import httpx
import orjson

from ..core import denials, errors, idempotency, protocol
from ..core.actions import RecoveryPolicy
from ..core.param_headers import InvalidAnnotation, Mirrored, header_safe, mirrored_params, param_headers
from ..core.sse import SseDecoder
from ..core.task_stream import STREAM_EXTENSION, EventType
from ..core.tasks import EXTENSION
from ..tracing import inject
from .catalog import CatalogReads
from .client import Client, Tool, ToolResult, _tool_result
from .errors import (
    AuthorizationFailed,
    CallMayHaveRun,
    ConnectionFailed,
    DeadlineExceeded,
    InputUnanswered,
    McpClientError,
    ProtocolViolation,
    RemoteError,
    RequestRejected,
    describe_failure,
    unreachable,
)
from .handlers import MAX_INPUT_ROUNDS, InputHandler, answer_input, capabilities, checked, for_call
from .journal import Journal, PendingCall, journaled, no_longer_keyed
from .oauth import Auth, parse_challenge
from .paging import collect_pages
from .session import NOT_SENT_ERRORS, MessageCallback, ProgressCallback, ProgressUpdate
from .task_follow import (
    Cut,
    Ended,
    Event,
    Fail,
    Finish,
    Following,
    Gone,
    HandOn,
    Poll,
    Regrant,
    ResumeAfter,
    Said,
    Skip,
    Step,
    StreamRefusal,
    follow,
)
from .transport import REISSUE_BACKOFF, VERSION_HEADER, Backoff, HttpPool, ReconnectWindow, Response, media_type

MODERN = protocol.STATELESS
MAX_AUTHORIZATIONS = 2
"""Fresh grants per request before the refusal is final (the server may name more on a second try)."""
MAX_REISSUES = 3
POLL_CEILING_SECONDS = 5.0

_log = logging.getLogger(__name__)

TaskHook = Callable[[str, str], None]
"""Called with (task id, tool name) once a call became a task: persist it to resume polling after a restart."""


@dataclass(frozen=True, slots=True)
class MissedEvents:
    """The server could not deliver a task's events after ``after`` (SEP-2694 ``events_gone``, or a stream that
    skipped ahead): what the caller was shown of the task has a hole from there; its outcome still comes."""

    after: int | None
    earliest: int | None
    """The first seq the server still holds, when it said."""


@dataclass(frozen=True, slots=True)
class TaskUpdate:
    """What the server said of a call's task: on creation, then each time a poll or the task's event stream shows
    a new status or message, and once if its events are gone (``missed``)."""

    task_id: str
    status: str
    message: str | None
    """The task's ``statusMessage`` (the server's progress description while it works), if any."""
    missed: MissedEvents | None = None


TaskUpdateCallback = Callable[[TaskUpdate], None]

_eras: dict[str, str] = {}
"""The era of each origin this process has probed (``"modern"`` or ``"legacy"``): a property of the server."""


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _headers(message: Mapping[str, Any], token: str | None) -> dict[str, str]:
    """The headers of a POST of ``message``: the revision and the mirrored method and name (SEP-2243)."""
    headers = {"accept": protocol.ACCEPT_POST, "content-type": "application/json", VERSION_HEADER: MODERN}
    headers["mcp-method"] = message["method"]
    field = protocol.NAME_PARAMS.get(message["method"])
    if field is not None:
        headers["mcp-name"] = header_safe(str(message["params"][field]))
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    return headers


def _remedy(answer: Mapping[str, Any] | None) -> denials.Remedy:
    """What a refusal's error ``data`` says a new grant can do (``TASK_DENIED``, ``TOOL_FORBIDDEN``): the SEP-2643
    envelope where the server sent one, its own ``requiredResources``/``requiredScopes`` where not."""
    error = answer.get("error") if answer is not None else None
    return denials.remedy(error.get("data") if isinstance(error, dict) else None)


def request_meta(capabilities: Mapping[str, Any], client_info: Mapping[str, Any]) -> dict[str, Any]:
    """The ``_meta`` every 2026-07-28 request carries, on any transport: the revision, the client's capabilities
    and its identity (there is no handshake to say them once)."""
    return {
        protocol.VERSION_META_KEY: MODERN,
        protocol.CAPABILITIES_META_KEY: capabilities,
        protocol.CLIENT_INFO_META_KEY: client_info,
    }


def modern_refusal(code: int, data: object) -> bool:
    """Whether an error answering ``server/discover`` comes from a modern server (``UNSUPPORTED_PROTOCOL_VERSION``
    naming 2026-07-28 among those it supports): an error to surface. Any other error is a legacy server's."""
    supported = data.get("supported") if isinstance(data, dict) else None
    return code == errors.UNSUPPORTED_PROTOCOL_VERSION and isinstance(supported, list) and MODERN in supported


def modern_discovery(result: dict[str, Any]) -> dict[str, Any]:
    """A ``server/discover`` result, or :class:`NotModern` when it does not list 2026-07-28."""
    versions = result.get("supportedVersions")
    if not isinstance(versions, list) or MODERN not in versions:
        raise NotModern("the server does not list 2026-07-28")
    return result


def _version_refused(answer: Mapping[str, Any] | None) -> bool:
    """An ``UNSUPPORTED_PROTOCOL_VERSION`` error whose ``supported`` list names the revision this client sent."""
    error = answer.get("error") if answer is not None else None
    data = error.get("data") if isinstance(error, dict) else None
    if not isinstance(error, dict) or not isinstance(data, dict):
        return False
    if error.get("code") != errors.UNSUPPORTED_PROTOCOL_VERSION:
        return False
    supported = data.get("supported")
    return isinstance(supported, list) and MODERN in supported


NoteCallback = Callable[[dict[str, Any]], None]
"""Called with each notification on a request's own stream."""


def _notes(on_progress: ProgressCallback | None, on_message: MessageCallback | None) -> NoteCallback:
    """A call's notifications: progress to ``on_progress``, any other to ``on_message``."""

    def note(frame: dict[str, Any]) -> None:
        params = frame.get("params")
        if frame.get("method") == "notifications/progress":
            if on_progress is not None and isinstance(params, dict):
                on_progress(ProgressUpdate(params.get("progress", 0), params.get("total"), params.get("message")))
        elif on_message is not None:
            on_message(frame)

    return note


class NotModern(Exception):
    """The server's answer to a modern request was not a modern one: it speaks a legacy revision."""


class ModernClient(CatalogReads):
    """A client for servers that speak 2026-07-28; ``timeout`` is the default per-call deadline (seconds)."""

    def __init__(
        self,
        url: str,
        *,
        auth: Auth | None = None,
        timeout: float = 60.0,
        http: httpx.AsyncClient | None = None,
        client_info: Mapping[str, Any] | None = None,
        on_task: TaskHook | None = None,
        pool: HttpPool | None = None,
        input_handlers: Mapping[str, InputHandler] | None = None,
        journal: Journal | None = None,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.url = url
        self.backoff = backoff or REISSUE_BACKOFF
        """Waits between re-issues of a call whose server answered and then stopped listening (restarting)."""
        self._rng = rng or random.SystemRandom()
        self._handlers = checked(input_handlers)
        """Answers to the server's requests for input, by method (``elicitation/create``, …)."""
        self._capabilities = {"extensions": {EXTENSION: {}}, **capabilities(self._handlers)}
        self._pool = pool
        """Where requests go when given (a gateway's pool); ``http`` still serves OAuth."""
        self.timeout = timeout
        self._auth = auth or Auth()
        self._http = http
        self._client_info = dict(client_info or {"name": "mcp-lossless", "version": "0"})
        self._on_task = on_task
        self._journal = journal
        """Where each keyed call is kept while pending, so a restarted process can re-issue it under its key."""
        self._stack: AsyncExitStack | None = None
        self._ids = itertools.count(1)
        self._tools: dict[str, Tool] | None = None
        self._mirrored: dict[str, tuple[Mirrored, ...]] = {}
        """Each listed tool's ``x-mcp-header`` parameters, mirrored on each of its calls (SEP-2243)."""
        self._excluded: dict[str, str] = {}
        """Listed tools left out for a malformed ``x-mcp-header``, with the reason: never called."""
        self._keyed = False
        """The server's ``server/discover`` declared ``tools.idempotency``: each call carries a key (SEP-3182)."""
        self._streams = False
        """The server's ``server/discover`` declared task event streams: a task is followed by ``tasks/stream``."""

    async def __aenter__(self) -> ModernClient:
        stack = AsyncExitStack()
        if self._http is None:
            self._http = await stack.enter_async_context(httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=300.0)))
        self._auth.bind(self._http, self.url)
        self._stack = stack
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            await stack.aclose()

    # -- requests ------------------------------------------------------------------------------------

    def _message(
        self, method: str, params: Mapping[str, Any], declared: Mapping[str, Any] | None = None
    ) -> dict[str, Any]:
        meta = request_meta(self._capabilities if declared is None else declared, self._client_info)
        inject(meta)  # the caller's trace context, per request (SEP-414)
        body = {**params, "_meta": {**meta, **params.get("_meta", {})}}
        return {"jsonrpc": "2.0", "id": f"m-{next(self._ids)}", "method": method, "params": body}

    def _stream(self, message: dict[str, Any], token: str | None) -> AbstractAsyncContextManager[Response]:
        """POST ``message``: the response, open for reading inside the block."""
        content, headers = orjson.dumps(message), _headers(message, token)
        if message["method"] == "tools/call":
            params = message["params"]
            headers |= param_headers(self._mirrored.get(params["name"], ()), params.get("arguments"))
        if self._pool is not None:
            return self._pool.stream("POST", self.url, content=content, headers=headers)
        assert self._http is not None, "use the client inside 'async with'"
        flow = self._auth.request_auth()  # DPoP: a fresh proof on every request with a bound token
        if flow is not None:
            return self._http.stream("POST", self.url, content=content, headers=headers, auth=flow)
        return self._http.stream("POST", self.url, content=content, headers=headers)

    async def _post(
        self, message: dict[str, Any], token: str | None, on_note: NoteCallback | None
    ) -> tuple[Response, dict[str, Any] | None]:
        """One POST; the response and its JSON-RPC answer (JSON, or the last message of its SSE stream)."""
        async with self._stream(message, token) as response:
            if media_type(response) != "text/event-stream":
                raw = await response.aread()
                try:
                    decoded = orjson.loads(raw) if raw else None
                except orjson.JSONDecodeError:
                    decoded = None
                return response, decoded if isinstance(decoded, dict) else None
            decoder = SseDecoder()
            async for chunk in response.aiter_bytes():
                for event in decoder.feed(chunk):
                    if not event.data:
                        continue
                    frame = orjson.loads(event.data)
                    if not isinstance(frame, dict):
                        continue
                    if frame.get("id") == message["id"] and ("result" in frame or "error" in frame):
                        return response, frame
                    if on_note is not None and isinstance(frame.get("method"), str) and "id" not in frame:
                        on_note(frame)
            raise httpx.RemoteProtocolError("the response stream ended before its answer")

    async def _request(
        self,
        method: str,
        params: Mapping[str, Any],
        resources: frozenset[str],
        on_note: NoteCallback | None = None,
        declared: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], frozenset[str]]:
        """The result of one request, authorizing as often as the server's challenges call for.

        Returns the result and the resources the token that got it was asked for (a denial may widen them).
        ``declared`` are the client capabilities it carries (default the client's: a call's own handlers differ).
        ``httpx.TransportError`` passes through: whether to send again is the caller's decision.
        """
        for _ in range(MAX_AUTHORIZATIONS + 1):
            token = await self._auth.token(resources)
            response, answer = await self._post(self._message(method, params, declared), token, on_note)
            if _version_refused(answer):
                # a server that lists 2026-07-28 yet refused it (e.g. one replica behind a balancer still
                # rolling out): the request did not run; sent once more under a new id, then the refusal stands
                response, answer = await self._post(self._message(method, params, declared), token, on_note)
            if response.status_code in (401, 403):
                challenge = parse_challenge(response.headers.get("www-authenticate"))
                if challenge is None:
                    raise AuthorizationFailed(f"HTTP {response.status_code} without a Bearer challenge")
                helps = _remedy(answer)
                if helps.reauthorize is False:
                    raise AuthorizationFailed(f"{method}: refused, and the server says a new grant cannot help")
                self._auth.challenged(challenge)
                resources = resources | frozenset(challenge.resources) | helps.resources
                await self._auth.reauthorize(resources, helps.scopes)
                if helps.context is not None:  # the SEP's retry echo: correlation only, never authorization
                    meta = {**params.get("_meta", {}), denials.CONTEXT_ECHO_META_KEY: helps.context}
                    params = {**params, "_meta": meta}
                continue
            if answer is None or (response.status_code >= 400 and "jsonrpc" not in answer):
                # e.g. a 404 from a URL with no MCP endpoint: refused, not a protocol breach (a legacy
                # server then gets its handshake, which names the status and body)
                raise RequestRejected(f"{method}: HTTP {response.status_code} without a JSON-RPC answer")
            error = answer.get("error")
            if isinstance(error, dict):
                raise RemoteError(
                    int(error.get("code", errors.INTERNAL_ERROR)), str(error.get("message")), error.get("data")
                )
            result = answer.get("result")
            if not isinstance(result, dict):
                raise ProtocolViolation(f"{method} answered with neither a result object nor an error")
            return result, resources
        raise AuthorizationFailed(f"{method} was still refused after {MAX_AUTHORIZATIONS} fresh grants")

    @property
    def keyed(self) -> bool:
        """Whether the server's last ``server/discover`` declared ``tools.idempotency``: calls carry keys."""
        return self._keyed

    async def discover(self) -> dict[str, Any]:
        """``server/discover``; :class:`NotModern` when the server's answer is not a modern one."""
        try:
            result, _ = await self._request("server/discover", {}, frozenset())
        except (*NOT_SENT_ERRORS, httpx.NetworkError, httpx.TimeoutException) as exc:
            # a reset or a silence before the first answer: a network failure (nothing ran), not a protocol breach
            raise unreachable(self.url, exc) from exc
        except httpx.HTTPError as exc:
            raise ProtocolViolation(f"server/discover to {self.url} failed: {describe_failure(exc)}") from exc
        except RemoteError as exc:
            if modern_refusal(exc.code, exc.data):
                raise  # a modern server that will not speak this revision: an error, not a fallback
            raise NotModern(exc.reason) from None
        except RequestRejected as exc:
            raise NotModern(exc.reason) from None
        discovered = modern_discovery(result)
        capabilities = discovered.get("capabilities")
        self._keyed = idempotency.declared(capabilities if isinstance(capabilities, dict) else {})
        extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
        self._streams = isinstance(extensions, dict) and STREAM_EXTENSION in extensions
        return discovered

    async def listen(
        self,
        notifications: Mapping[str, Any],
        on_message: Callable[[dict[str, Any]], None],
        on_open: Callable[[], None] | None = None,
    ) -> None:
        """``subscriptions/listen`` for ``notifications`` (e.g. ``{"toolsListChanged": True}``): ``on_open`` once
        the server acknowledged every one of them, then ``on_message`` with each notification on the stream;
        returns when the server ends it. :class:`RequestRejected` when the server refuses the stream or will
        not send one of them; a broken connection raises ``httpx.TransportError``. The stream has no
        resumption: what was sent while it was down is gone, so a caller that listens again re-reads.
        """
        message = self._message("subscriptions/listen", {"notifications": dict(notifications)})
        async with self._stream(message, await self._auth.token(frozenset())) as response:
            if response.status_code != 200 or media_type(response) != "text/event-stream":
                raise RequestRejected(f"subscriptions/listen refused: HTTP {response.status_code}")
            decoder = SseDecoder()
            async for chunk in response.aiter_bytes():
                for event in decoder.feed(chunk):
                    frame = orjson.loads(event.data) if event.data else None
                    if not isinstance(frame, dict):
                        continue
                    if frame.get("id") == message["id"]:
                        return  # the server closed the subscription on purpose (its final result or error)
                    params = frame.get("params")
                    if frame.get("method") == "notifications/subscriptions/acknowledged":
                        honored = params.get("notifications") if isinstance(params, dict) else None
                        granted = honored if isinstance(honored, dict) else {}
                        refused = [k for k in notifications if granted.get(k) in (None, False)]
                        if refused:
                            raise RequestRejected(f"subscriptions/listen: the server will not send {refused}")
                        if on_open is not None:
                            on_open()
                    elif isinstance(frame.get("method"), str) and "id" not in frame:
                        on_message(frame)

    # -- tools ---------------------------------------------------------------------------------------

    async def list_tools(self, *, timeout: float | None = None) -> list[Tool]:  # noqa: ASYNC109
        """Every tool the server offers (all pages), those with a malformed ``x-mcp-header`` left out."""
        tools = [Tool.from_wire(t) for t in await self._listing("tools", timeout) if "name" in t]
        kept: list[Tool] = []
        self._mirrored, self._excluded = {}, {}
        for tool in tools:
            try:
                self._mirrored[tool.name] = mirrored_params(tool.input_schema)
            except InvalidAnnotation as exc:
                self._excluded[tool.name] = str(exc)
                _log.warning("tool %r left out: %s", tool.name, exc)
            else:
                kept.append(tool)
        self._tools = {t.name: t for t in kept}
        return kept

    async def _listing(self, kind: str, timeout: float | None, method: str | None = None) -> list[dict[str, Any]]:  # noqa: ASYNC109
        """One deadline over all the pages."""
        listed = method or f"{kind}/list"
        with self._read_deadline(listed, timeout):
            return await collect_pages(self._reader(listed), kind)

    async def _read(self, method: str, name: str, params: dict[str, Any], timeout: float | None) -> dict[str, Any]:  # noqa: ASYNC109
        """One deadline over the read and the rounds of input it asks for."""
        with self._read_deadline(f"{method} {name}", timeout):
            return await self._answering(name, params, self._reader(method))

    @contextlib.contextmanager
    def _read_deadline(self, what: str, timeout: float | None) -> Iterator[None]:
        """One deadline over a read and its pages or input rounds (the client's ``timeout`` unless given):
        :class:`DeadlineExceeded` when it passes, as for a call (a read leaves nothing to cancel)."""
        try:
            with anyio.fail_after(self._deadline(timeout)):
                yield
        except TimeoutError:
            raise DeadlineExceeded(f"{what} did not finish within its deadline") from None

    def _reader(self, method: str) -> Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]:
        """Sends ``method``, a request that changes nothing on the server: sent again while its response breaks."""

        async def send(params: dict[str, Any]) -> dict[str, Any]:
            for attempt in range(MAX_REISSUES + 1):
                try:
                    result, _ = await self._request(method, params, frozenset())
                    return result
                except httpx.TransportError as exc:
                    if attempt == MAX_REISSUES:
                        raise ConnectionFailed(f"{method} to {self.url} failed: {describe_failure(exc)}") from None
            raise AssertionError("unreachable: the last attempt returns or raises")

        return send

    async def _answering(
        self,
        name: str,
        params: dict[str, Any],
        send: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
        handlers: Mapping[str, InputHandler] | None = None,
    ) -> dict[str, Any]:
        """The result of ``params`` once every round of client input it asks for is answered (SEP-2322)."""
        result = await send(params)
        for rounds in itertools.count(1):
            if result.get("resultType") != "input_required":
                return result
            if rounds > MAX_INPUT_ROUNDS:
                raise InputUnanswered(f"{name} asked for input more than {MAX_INPUT_ROUNDS} rounds")
            answers = await answer_input(
                self._handlers if handlers is None else handlers, result.get("inputRequests"), name
            )
            retry = {**params, "inputResponses": answers}
            state = result.get("requestState")
            if isinstance(state, str):
                retry["requestState"] = state
            result = await send(retry)
        raise AssertionError("unreachable: the loop returns or raises")

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a per-call deadline, cancelling the task on the server
        reissue: bool | None = None,
        on_task_update: TaskUpdateCallback | None = None,
        on_message: MessageCallback | None = None,
        log_level: str | None = None,
        input_handlers: Mapping[str, InputHandler] | None = None,
        idempotency_key: str | None = None,
    ) -> ToolResult:
        """Call ``name``: its result, :class:`~mcp_lossless.client.ToolFailed`, or another typed outcome.

        Once :meth:`discover` found ``tools.idempotency`` (as :func:`open_client` does), the call carries
        ``idempotency_key`` (a fresh UUID 4 unless given: one kept by an earlier process re-issues its call), and a
        broken response is sent again under it whatever the tool: the server runs the key once, answers "in
        progress" while it runs (sent again after ``retryAfter``) and then replays its outcome; a call that became a
        task gets the same task.

        ``reissue`` as for :meth:`Client.call_tool`: ``None`` re-issues a call whose response broke only for
        idempotent tools. ``on_progress`` gets the progress of a call that runs within its request;
        ``on_task_update`` the state of one the server runs as a task; a task's progress comes to ``on_progress``
        from its event stream where the server offers one (polled, its ``statusMessage`` describes its progress).
        ``on_message`` gets every other notification on the call's own stream (and the log events of its task's):
        log messages, which a server sends at ``log_level`` and above only when asked.
        Input the tool asks for comes from ``input_handlers`` (this call's), else the client's, by method; the call
        declares exactly their capabilities. :class:`~mcp_lossless.client.InputUnanswered` when none can give it.
        """
        if self._tools is None:
            await self.list_tools()
        if name in self._excluded:
            raise ProtocolViolation(f"{name} is not called: the server published it with {self._excluded[name]}")
        tool = (self._tools or {}).get(name)
        resources = frozenset({tool.resource}) if tool is not None and tool.resource else frozenset()
        may_reissue = reissue if reissue is not None else tool is not None and tool.idempotent
        params: dict[str, Any] = {"name": name, "arguments": dict(arguments or {})}
        if self._keyed:
            params[idempotency.KEY_PARAM] = idempotency_key or str(uuid.uuid4())
        meta: dict[str, Any] = {}
        if on_progress is not None:
            meta["progressToken"] = f"p-{next(self._ids)}"
        if log_level is not None:
            meta[protocol.LOG_LEVEL_META_KEY] = log_level
        if meta:
            params["_meta"] = meta
        on_note = _notes(on_progress, on_message) if on_progress or on_message else None
        task: list[str] = []
        watch: list[_TaskWatch] = []
        handlers = for_call(self._handlers, input_handlers)
        declared = {**self._capabilities, **capabilities(handlers)} if input_handlers else None

        async def send(round_params: dict[str, Any]) -> dict[str, Any]:
            nonlocal resources  # a refusal's fresh grant widens what the later rounds and polls ask for
            answer, resources = await self._send_call(name, round_params, resources, on_note, may_reissue, declared)
            return answer

        key = params.get(idempotency.KEY_PARAM)
        pending = PendingCall(name, params["arguments"], key) if key is not None else None
        with journaled(self._journal, pending) as became_task:
            try:
                with anyio.fail_after(self._deadline(timeout)):
                    result = await self._answering(name, params, send, handlers)
                    if result.get("resultType") != "task":
                        return _tool_result(name, result)
                    task.append(str(result["taskId"]))
                    became_task(task[0])
                    if self._on_task is not None:
                        self._on_task(task[0], name)
                    watch.append(_TaskWatch(task[0], on_task_update, on_progress, on_message))
                    watch[0].observe(result)
                    outcome = await self._follow_task(
                        name, task[0], resources, result.get("pollIntervalMs"), watch[0], handlers, declared
                    )
                    return outcome.marked_replayed() if ToolResult.from_wire(result).replayed else outcome
            except TimeoutError:
                if task:
                    await self._cancel_quietly(task[0], resources)
                    if watch and watch[0].unanswered is not None:
                        raise CallMayHaveRun(
                            f"task {task[0]} of {name}: the server stopped answering "
                            f"({watch[0].unanswered}) until the deadline passed; it may have run"
                        ) from None
                raise DeadlineExceeded(f"{name} did not finish within its deadline") from None

    async def resume_pending(
        self,
        call: PendingCall,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's deadline, as for call_tool
        on_progress: ProgressCallback | None = None,
        on_task_update: TaskUpdateCallback | None = None,
    ) -> ToolResult:
        """A call an earlier process left pending in its :class:`~.journal.Journal`: its task followed when it had
        become one, else re-issued under its key, so the server replays its outcome (or answers "in progress", and
        then replays) rather than running the tool again. :class:`CallMayHaveRun` when the server no longer
        declares ``tools.idempotency``: a re-issue there could run the tool twice."""
        if call.task_id is not None:
            with journaled(self._journal, call):
                return await self.resume_task(call.tool, call.task_id, timeout=timeout, on_task_update=on_task_update)
        if not self._keyed:
            await self.discover()
        if not self._keyed:
            with journaled(self._journal, call):
                raise CallMayHaveRun(no_longer_keyed(call))
        return await self.call_tool(
            call.tool,
            call.arguments,
            idempotency_key=call.idempotency_key,
            timeout=timeout,
            on_progress=on_progress,
            on_task_update=on_task_update,
        )

    async def _send_call(
        self,
        name: str,
        params: Mapping[str, Any],
        resources: frozenset[str],
        on_note: NoteCallback | None,
        may_reissue: bool,
        declared: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], frozenset[str]]:
        """One ``tools/call`` (one round of it), sent again while it could not have run or may run twice.

        A round carrying an idempotency key (not a continuation: the SEP leaves those out) is sent again under it
        for every tool, up to ``max_keyed_reissues`` times within the deadline; "in progress" after its
        ``retryAfter``. Once a try reached the server, one that finds it not listening (restarting) is followed by
        the next after a :class:`~.transport.ReconnectWindow`'s wait, until that window is spent. An execution-lost
        naming the key is final: the server never runs that key again."""
        keyed = idempotency.key_of(params) is not None
        bound = RecoveryPolicy().max_keyed_reissues if keyed else MAX_REISSUES
        reached = False  # an attempt reached the server: a tool that may not run twice may have run since
        reconnect = ReconnectWindow(self.backoff, self._rng)  # a server that answered may be restarting
        for attempt in range(bound + 1):
            try:
                return await self._request("tools/call", params, resources, on_note, declared)
            except httpx.ConnectError as exc:
                if not reached:  # a URL that never answered fails fast
                    if attempt == bound:
                        raise unreachable(self.url, exc) from None
                    continue
                wait = reconnect.next_wait(anyio.current_effective_deadline() - anyio.current_time())
                if wait is not None and attempt < bound:
                    await anyio.sleep(wait)
                    continue
                if not may_reissue:
                    raise CallMayHaveRun(
                        f"the response of {name} broke and the server could not be reached again "
                        f"({describe_failure(exc)}); the call may have run: re-issue it under idempotency key "
                        f"{idempotency.key_of(params)!r} for its outcome"
                    ) from None
                raise unreachable(self.url, exc) from None
            except httpx.TransportError as exc:
                reached = True
                reconnect.reset()
                if not (may_reissue or keyed) or attempt == bound:
                    why = f"the response of {name} broke ({describe_failure(exc)}); the call may have run"
                    raise CallMayHaveRun(why) from None
            except RemoteError as exc:
                if exc.code == errors.MISSING_REQUIRED_CLIENT_CAPABILITY:
                    raise _unanswered(name, exc.data) from None
                data = exc.data if isinstance(exc.data, dict) else {}
                reached = True
                reconnect.reset()
                if keyed and exc.code == errors.IDEMPOTENCY_IN_PROGRESS and attempt < bound:
                    wait = data.get("retryAfter")
                    await anyio.sleep(wait if isinstance(wait, int | float) and not isinstance(wait, bool) else 1)
                    continue
                if exc.code != errors.EXECUTION_LOST:
                    raise
                named = keyed and idempotency.KEY_PARAM in data  # the server never runs that key again
                if named and may_reissue and attempt < bound:  # safe to run twice: a new operation, a new key
                    params = {**params, idempotency.KEY_PARAM: f"{data[idempotency.KEY_PARAM]}.{attempt + 1}"}
                    continue
                if named or not (may_reissue or keyed) or attempt == bound:  # as the legacy client's ledger decides
                    error = {"code": exc.code, "message": exc.message, "data": exc.data}
                    raise CallMayHaveRun(f"the server lost the execution of {name}: {exc.message}", error) from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def resume_task(
        self,
        name: str,
        task_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - a deadline for the polling
        on_task_update: TaskUpdateCallback | None = None,
    ) -> ToolResult:
        """Poll a task this (or an earlier) process started, e.g. an id a :data:`TaskHook` persisted."""
        if self._tools is None:
            await self.list_tools()
        tool = (self._tools or {}).get(name)
        resources = frozenset({tool.resource}) if tool is not None and tool.resource else frozenset()
        try:
            with anyio.fail_after(self._deadline(timeout)):
                return await self._follow_task(name, task_id, resources, None, _TaskWatch(task_id, on_task_update))
        except TimeoutError:
            raise DeadlineExceeded(f"task {task_id} of {name} did not finish within the deadline") from None

    async def _follow_task(
        self,
        name: str,
        task_id: str,
        resources: frozenset[str],
        interval_ms: object,
        watch: _TaskWatch,
        handlers: Mapping[str, InputHandler] | None = None,
        declared: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        """A task to its outcome: by ``tasks/stream`` when the server declared it, each event handed on once and
        in order, else (and whenever the stream cannot settle the call) by polling ``tasks/get``.

        What follows each thing the stream says is :func:`~.task_follow.follow`'s; this only carries it out.
        """
        if not self._streams:
            return await self._poll(name, task_id, resources, interval_ms, watch, handlers, declared)
        state = Following(task_id)
        given: dict[str, dict[str, Any]] = {}
        rounds = 0
        echo: str | None = None
        """The last denial's ``authorizationContextId``, echoed on the stream that follows the fresh grant."""
        while True:
            params: dict[str, Any] = {"taskId": task_id}
            if state.cursor is not None:
                params["after"] = state.cursor
            if echo is not None:
                params["_meta"] = {denials.CONTEXT_ECHO_META_KEY: echo}
            step: Step | None = None
            try:
                async with contextlib.aclosing(self._task_events(params, resources, declared)) as said:
                    async for each in said:
                        state, step = follow(state, each)
                        if isinstance(step, HandOn):
                            watch.unanswered = None
                            if step.kind == EventType.INPUT_REQUIRED.value:
                                watch.observe({"status": "input_required"})
                                requests, rounds = step.payload.get("inputRequests"), rounds + 1
                                await self._give_input(
                                    name, task_id, resources, requests, given, rounds, handlers, declared
                                )
                            else:
                                watch.deliver(step.kind, step.payload)
                        elif not isinstance(step, Skip):
                            break
            except httpx.TransportError as exc:
                watch.unanswered = describe_failure(exc)  # the deadline's outcome says so (call_tool)
                state, step = follow(state, Cut(watch.unanswered))
            match step:
                case Finish(payload=payload):
                    watch.observe(payload)
                    settled = _settled(name, task_id, payload)
                    if settled is None:
                        status = payload.get("status")
                        raise ProtocolViolation(f"task {task_id} ended its events with status {status!r}")
                    return settled
                case ResumeAfter(delay=delay):
                    await anyio.sleep(delay)
                case Regrant(resources=wanted, scopes=scopes, context=context):
                    resources = resources | wanted
                    await self._auth.reauthorize(resources, scopes)
                    echo = context
                case Gone(after=after, earliest=earliest):
                    watch.missed(MissedEvents(after, earliest))
                    return await self._poll(name, task_id, resources, interval_ms, watch, handlers, declared)
                case Poll(why=why):
                    _log.info("task %s: %s; polling tasks/get", task_id, why)
                    return await self._poll(name, task_id, resources, interval_ms, watch, handlers, declared)
                case Fail(why=why):
                    raise AuthorizationFailed(why)
                case _:
                    raise AssertionError(f"unreachable: a stream ends with a step ({step!r})")

    async def _task_events(
        self, params: dict[str, Any], resources: frozenset[str], declared: Mapping[str, Any] | None
    ) -> AsyncGenerator[Said, None]:
        """One ``tasks/stream``, as what it says: its events, then its end or its refusal (a 401/403 with its
        challenge told to the authorization first). A stream that breaks before its answer raises
        ``httpx.TransportError``."""
        message = self._message("tasks/stream", params, declared)
        async with self._stream(message, await self._auth.token(resources)) as response:
            challenged: frozenset[str] | None = None
            if response.status_code in (401, 403):
                challenge = parse_challenge(response.headers.get("www-authenticate"))
                if challenge is not None:
                    self._auth.challenged(challenge)
                    challenged = frozenset(challenge.resources)
            if media_type(response) != "text/event-stream":
                raw = await response.aread()
                try:
                    answer = orjson.loads(raw) if raw else None
                except orjson.JSONDecodeError:
                    answer = None
                yield _said(answer if isinstance(answer, dict) else {}, response.status_code, challenged)
                return
            decoder = SseDecoder()
            async for chunk in response.aiter_bytes():
                for event in decoder.feed(chunk):
                    try:
                        frame = orjson.loads(event.data) if event.data else None
                    except orjson.JSONDecodeError:
                        continue  # an event lost so is a gap the next seq shows
                    if not isinstance(frame, dict):
                        continue
                    if frame.get("id") == message["id"]:
                        yield _said(frame, response.status_code, None)
                        return
                    note = frame.get("params")
                    if frame.get("method") == "notifications/tasks/event" and isinstance(note, dict):
                        seq, payload = note.get("seq"), note.get("payload")
                        if isinstance(seq, int) and not isinstance(seq, bool):
                            kind = str(note.get("type"))
                            yield Event(seq, kind, payload if isinstance(payload, dict) else {})
            raise httpx.RemoteProtocolError("the task's event stream ended before its answer")

    async def _poll(
        self,
        name: str,
        task_id: str,
        resources: frozenset[str],
        interval_ms: object,
        watch: _TaskWatch,
        handlers: Mapping[str, InputHandler] | None = None,
        declared: Mapping[str, Any] | None = None,
    ) -> ToolResult:
        """``tasks/get`` until terminal: at the server's interval, growing while the task is unchanged."""
        interval = interval_ms / 1000 if isinstance(interval_ms, int) and interval_ms > 0 else 0.5
        delay = interval
        given: dict[str, dict[str, Any]] = {}
        """Each input key answered so far: a key shown again (its answer still on its way) is sent as before."""
        updates = 0
        while True:
            await anyio.sleep(delay)
            try:
                task, resources = await self._request("tasks/get", {"taskId": task_id}, resources, None, declared)
            except httpx.TransportError as exc:
                watch.unanswered = describe_failure(exc)  # the deadline's outcome says so (call_tool)
                delay = min(POLL_CEILING_SECONDS, delay * 2)  # a pure read: polling again is always safe
                continue
            except RemoteError as exc:
                if exc.code == errors.INVALID_PARAMS:
                    raise CallMayHaveRun(
                        f"task {task_id} of {name} is gone (unknown or expired); it may have run"
                    ) from None
                raise
            watch.observe(task)
            settled = _settled(name, task_id, task)
            if settled is not None:
                return settled
            status = task.get("status")
            served = task.get("pollIntervalMs")
            interval = served / 1000 if isinstance(served, int) and served > 0 else interval
            delay = min(POLL_CEILING_SECONDS, max(interval, delay * 1.5))
            if status == "input_required":
                updates += 1
                await self._give_input(
                    name, task_id, resources, task.get("inputRequests"), given, updates, handlers, declared
                )
                delay = interval  # the answer moves the task on: look again at the server's pace

    async def _give_input(
        self,
        name: str,
        task_id: str,
        resources: frozenset[str],
        requests: object,
        given: dict[str, dict[str, Any]],
        updates: int,
        handlers: Mapping[str, InputHandler] | None = None,
        declared: Mapping[str, Any] | None = None,
    ) -> None:
        """Answer a task waiting ``input_required`` with ``tasks/update``; a task that cannot be answered is
        cancelled, so it does not wait for its TTL, and the call ends with why."""
        what = f"task {task_id} of {name}"
        try:
            if updates > MAX_INPUT_ROUNDS:
                raise InputUnanswered(f"{what} asked for input more than {MAX_INPUT_ROUNDS} times")
            answers = await answer_input(self._handlers if handlers is None else handlers, requests, what, given)
        except BaseException:
            await self._cancel_quietly(task_id, resources, declared)
            raise
        given.update(answers)
        # a lost update is told by the next poll: its keys still outstanding (sent again, not asked), or the task gone
        with contextlib.suppress(httpx.TransportError, RemoteError):
            await self._request(
                "tasks/update", {"taskId": task_id, "inputResponses": answers}, resources, None, declared
            )

    async def _cancel_quietly(
        self, task_id: str, resources: frozenset[str], declared: Mapping[str, Any] | None = None
    ) -> None:
        """``tasks/cancel``, best effort and briefly: the call is already ending with its own outcome, which a
        server that is gone or refuses must not replace."""
        with anyio.move_on_after(2, shield=True), contextlib.suppress(httpx.TransportError, McpClientError):
            await self._request("tasks/cancel", {"taskId": task_id}, resources, None, declared)

    def _deadline(self, timeout: float | None) -> float | None:
        value = self.timeout if timeout is None else timeout
        return None if math.isinf(value) else value


def _said(answer: Mapping[str, Any], status: int, challenged: frozenset[str] | None) -> Said:
    """A ``tasks/stream``'s answer as :mod:`.task_follow` reads it: its empty result, or its refusal."""
    error = answer.get("error")
    if isinstance(error, dict):
        code = error.get("code")
        message, data = str(error.get("message")), error.get("data")
        return StreamRefusal(code if isinstance(code, int) else None, message, data, challenged)
    if isinstance(answer.get("result"), dict) and status < 400:
        return Ended()
    return StreamRefusal(None, f"HTTP {status} without a JSON-RPC answer", None, challenged)


def _settled(name: str, task_id: str, task: Mapping[str, Any]) -> ToolResult | None:
    """The call's outcome from a task's state (a ``tasks/get`` result, or the payload of its outcome event): the
    tool's result, or the typed failure; ``None`` while the task is not terminal."""
    status = task.get("status")
    if status == "completed" and isinstance(task.get("result"), dict):
        return _tool_result(name, task["result"])
    if status == "failed":
        raw = task.get("error")
        error: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if error.get("code") in (errors.TASK_EXECUTION_LOST, errors.EXECUTION_LOST):  # a gateway's upstream
            raise CallMayHaveRun(f"task {task_id} of {name}: {error.get('message')}", error)
        if error.get("code") == errors.MISSING_REQUIRED_CLIENT_CAPABILITY:
            raise _unanswered(f"task {task_id} of {name}", error.get("data"))
        raise RemoteError(int(error.get("code", errors.INTERNAL_ERROR)), str(error.get("message")), error.get("data"))
    if status == "cancelled":
        raise CallMayHaveRun(f"task {task_id} of {name} was cancelled on the server; it may have partly run")
    if status not in ("working", "input_required"):
        raise ProtocolViolation(f"task {task_id} has status {status!r}")
    return None


def _unanswered(what: str, data: object) -> InputUnanswered:
    """The server would not ask for input this client declared no handler for (-32021)."""
    needed = data.get("requiredCapabilities") if isinstance(data, dict) else None
    named = sorted(needed) if isinstance(needed, dict) else "client input"
    return InputUnanswered(f"{what} needs {named} and no handler for it is registered")


class _TaskWatch:
    """What the caller hears of a task: its state whenever its status or message differs from the last one, and
    from its event stream its progress, its log messages and the news that events are gone."""

    __slots__ = ("callback", "last", "on_message", "on_progress", "task_id", "unanswered")

    def __init__(
        self,
        task_id: str,
        callback: TaskUpdateCallback | None,
        on_progress: ProgressCallback | None = None,
        on_message: MessageCallback | None = None,
    ) -> None:
        self.task_id = task_id
        self.callback = callback
        self.on_progress = on_progress
        self.on_message = on_message
        self.last: TaskUpdate | None = None
        self.unanswered: str | None = None
        """Why the latest poll or stream got no answer (the server unreachable, the connection broken), until one
        does."""

    def observe(self, task: Mapping[str, Any]) -> None:
        self.unanswered = None
        message = task.get("statusMessage")
        update = TaskUpdate(self.task_id, str(task.get("status")), message if isinstance(message, str) else None)
        if update != self.last and self.callback is not None:
            self.callback(update)
        self.last = update

    def deliver(self, kind: str, payload: Mapping[str, Any]) -> None:
        """One event of the task's stream; a type this client does not know is ignored, as the SEP asks."""
        if kind == EventType.STATUS.value:
            self.observe(payload)
        elif kind == EventType.PROGRESS.value and self.on_progress is not None:
            progress, total, message = payload.get("progress", 0), payload.get("total"), payload.get("message")
            self.on_progress(ProgressUpdate(progress, total, message if isinstance(message, str) else None))
        elif kind == EventType.LOG.value and self.on_message is not None:
            self.on_message({"jsonrpc": "2.0", "method": "notifications/message", "params": dict(payload)})

    def missed(self, gap: MissedEvents) -> None:
        """Events are gone: said once, explicitly, with the task's last known status."""
        after = "its start" if gap.after is None else f"seq {gap.after}"
        held = "" if gap.earliest is None else f" (the server holds them from seq {gap.earliest})"
        message = f"events after {after} are gone{held}; its outcome is read with tasks/get"
        status = self.last.status if self.last is not None else "working"
        _log.warning("task %s: %s", self.task_id, message)
        if self.callback is not None:
            self.callback(TaskUpdate(self.task_id, status, message, gap))


@asynccontextmanager
async def open_client(
    url: str,
    *,
    auth: Auth | None = None,
    timeout: float = 60.0,  # noqa: ASYNC109 - the clients' default per-call deadline
    http: httpx.AsyncClient | None = None,
    on_task: TaskHook | None = None,
    input_handlers: Mapping[str, InputHandler] | None = None,
    journal: Journal | None = None,
    **legacy: Any,
) -> AsyncIterator[ModernClient | Client]:
    """The client for ``url``'s era: 2026-07-28 when its ``server/discover`` answers as a modern server, else
    the legacy session client (``legacy`` holds that client's further options). The era is remembered per
    origin for the life of the process, and probed again if a cached modern verdict fails. ``input_handlers``
    answer the server's requests for client input, and ``journal`` keeps pending keyed calls, in either era."""
    origin = _origin(url)
    if _eras.get(origin) != "legacy":
        modern = ModernClient(
            url, auth=auth, timeout=timeout, http=http, on_task=on_task, input_handlers=input_handlers, journal=journal
        )
        async with modern:
            try:
                await modern.discover()
            except NotModern:
                _eras[origin] = "legacy"
            else:
                _eras[origin] = "modern"
                yield modern
                return
    async with Client(
        url, auth=auth, timeout=timeout, http=http, input_handlers=input_handlers, journal=journal, **legacy
    ) as client:
        yield client
