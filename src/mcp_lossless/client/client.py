"""The public async client: ``async with Client(url) as client: await client.call_tool(...)``.

Every ``call_tool`` ends in exactly one outcome within its deadline: a :class:`ToolResult`, or one of
the exceptions in :mod:`mcp_lossless.client.errors`.

Protocol revisions: the client offers 2025-11-25 (or the revision it is told to offer) and speaks
2025-11-25, 2025-06-18 and 2025-03-26, whichever the server answers with. It never sends 2026-07-28: the
handshake with a server that speaks only 2026-07-28 fails. :func:`mcp_lossless.client.modern.open_client`
picks this client or the 2026-07-28 one (:class:`~mcp_lossless.client.modern.ModernClient`) by the server's era.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from contextlib import AsyncExitStack, ExitStack
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import anyio
import httpx
import orjson

from ..core import idempotency, protocol
from ..core.actions import CallSpec, RecoveryPolicy
from ..core.idempotency import REPLAYED_META_KEY
from ..core.protocol import RESOURCE_META_KEY
from ..tracing import with_trace
from .catalog import CatalogReads
from .errors import CallMayHaveRun, McpClientError, RequestRejected, ToolFailed
from .handlers import InputHandler, checked, offered
from .journal import Journal, PendingCall, journaled, no_longer_keyed
from .oauth import Auth
from .paging import collect_pages
from .session import MessageCallback, ProgressCallback, ServerInfo, Session
from .transport import Backoff, HttpPool, HttpTransport, media_type

DEFAULT_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str | None
    input_schema: Mapping[str, Any]
    annotations: Mapping[str, Any]
    resource: str | None
    """The resource indicator a token must cover to call this tool, when the server publishes one."""

    @property
    def idempotent(self) -> bool:
        """Safe to run twice: annotated ``idempotentHint`` or ``readOnlyHint`` (no side effects at all)."""
        return self.annotations.get("idempotentHint") is True or self.annotations.get("readOnlyHint") is True

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Tool:
        meta = raw.get("_meta")
        resource = meta.get(RESOURCE_META_KEY) if isinstance(meta, dict) else None
        annotations = raw.get("annotations")
        return cls(
            name=str(raw["name"]),
            description=raw.get("description") if isinstance(raw.get("description"), str) else None,
            input_schema=raw.get("inputSchema") or {},
            annotations=annotations if isinstance(annotations, dict) else {},
            resource=resource if isinstance(resource, str) else None,
        )


@dataclass(frozen=True, slots=True)
class ToolResult:
    content: list[Mapping[str, Any]]
    structured: Mapping[str, Any] | None
    raw: Mapping[str, Any]

    @property
    def replayed(self) -> bool:
        """The server answered with the outcome it recorded for the call's idempotency key: the tool did not run
        again for this request (it ran once, for an earlier one whose answer was lost on the way)."""
        meta = self.raw.get("_meta")
        return isinstance(meta, dict) and meta.get(REPLAYED_META_KEY) is True

    def marked_replayed(self) -> ToolResult:
        """This result marked :attr:`replayed`: the outcome of a task a duplicate under its key was given again
        (the server marks the ``CreateTaskResult``; the task's result itself is the same for every poll)."""
        meta = self.raw.get("_meta")
        raw = {**self.raw, "_meta": {**(meta if isinstance(meta, dict) else {}), REPLAYED_META_KEY: True}}
        return ToolResult(self.content, self.structured, raw)

    @property
    def text(self) -> str:
        """The text parts of the content, joined by newlines."""
        return "\n".join(str(part.get("text", "")) for part in self.content if part.get("type") == "text")

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> ToolResult:
        content = raw.get("content")
        structured = raw.get("structuredContent")
        return cls(
            content=[c for c in content if isinstance(c, dict)] if isinstance(content, list) else [],
            structured=structured if isinstance(structured, dict) else None,
            raw=raw,
        )


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One call of :meth:`Client.call_tools`; the fields mean what :meth:`Client.call_tool`'s do."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    on_progress: ProgressCallback | None = None
    reissue: bool | None = None
    idempotency_key: str | None = None
    """The call's key when the server declares ``tools.idempotency`` (default a fresh UUID 4): give one kept from
    an earlier process to re-issue its call without running the tool twice."""


class Client(CatalogReads):
    """An MCP client over Streamable HTTP that never loses or mislabels a result.

    ``timeout`` is the default per-call deadline in seconds (``math.inf`` for none). ``policy`` says how
    hard to try before failing a call; re-issuing is automatic only for idempotent tools unless a call
    says otherwise. ``protocol_version`` is the revision offered in ``initialize`` (default the newest;
    offer ``"2025-03-26"`` to let :meth:`call_tools` send JSON-RPC batches). ``pool`` (an
    :class:`~.transport.HttpPool`, as a gateway keeps) carries the MCP requests instead of ``http``.
    ``input_handlers`` answer the server's requests for client input on a call's stream, by method
    (:mod:`~mcp_lossless.client.handlers`); the capabilities they declare are offered in ``initialize``, and
    those of ``input_methods`` too: methods the calls bring their own handlers for (``call_tool(input_handlers=)``,
    as a gateway's calls do), asked of nobody on a stream without such a call (method not found).
    """

    def __init__(
        self,
        url: str,
        *,
        auth: Auth | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        policy: RecoveryPolicy | None = None,
        backoff: Backoff | None = None,
        http: httpx.AsyncClient | None = None,
        idle_timeout: float = 300.0,
        client_info: Mapping[str, Any] | None = None,
        protocol_version: str = protocol.LATEST,
        pool: HttpPool | None = None,
        input_handlers: Mapping[str, InputHandler] | None = None,
        input_methods: Collection[str] = (),
        journal: Journal | None = None,
    ) -> None:
        if protocol_version not in protocol.HANDSHAKE_VERSIONS:
            spoken = ", ".join(protocol.HANDSHAKE_VERSIONS)
            raise ValueError(f"protocol version {protocol_version!r} is not one this client speaks ({spoken})")
        self.url = url
        self.protocol_version = protocol_version
        self.timeout = timeout
        self._auth = auth or Auth()
        self._policy = policy
        self._backoff = backoff
        self._http = http
        self._idle_timeout = idle_timeout
        self._client_info = client_info
        self._pool = pool
        self._input_handlers = input_handlers
        self._input_methods = tuple(input_methods)
        self._journal = journal
        """Where each keyed call is kept while pending, so a restarted process can re-issue it under its key."""
        offered(checked(input_handlers), self._input_methods)  # refused here, not at the first connection
        self._stack: AsyncExitStack | None = None
        self._session: Session | None = None
        self._tools: dict[str, Tool] | None = None

    async def __aenter__(self) -> Client:
        stack = AsyncExitStack()
        await stack.__aenter__()
        try:
            http = self._http
            if http is None:
                timeout = httpx.Timeout(10.0, read=self._idle_timeout)
                http = await stack.enter_async_context(httpx.AsyncClient(timeout=timeout, follow_redirects=False))
            self._auth.bind(http, self.url)
            session = Session(
                HttpTransport(self.url, http, pool=self._pool, auth=self._auth.request_auth()),
                self._auth,
                policy=self._policy,
                backoff=self._backoff,
                client_info=self._client_info,
                protocol_version=self.protocol_version,
                input_handlers=self._input_handlers,
                input_methods=self._input_methods,
            )
            tg = await stack.enter_async_context(anyio.create_task_group())
            stack.callback(tg.cancel_scope.cancel)
            with anyio.fail_after(self.timeout):
                await session.start(tg)
        except BaseException:
            await stack.__aexit__(None, None, None)
            raise
        self._stack = stack
        self._session = session
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        stack, self._stack = self._stack, None
        if stack is None:
            return
        try:
            if self._session is not None:
                await self._session.close()
        finally:
            # The caller's own exception is not handed to the task group: it would come back wrapped in
            # an ExceptionGroup. Python re-raises it unchanged after this method returns.
            await stack.__aexit__(None, None, None)

    @property
    def server(self) -> ServerInfo:
        info = self._require().server
        assert info is not None
        return info

    async def list_tools(self, *, timeout: float | None = None) -> list[Tool]:  # noqa: ASYNC109
        """Every tool the server offers (all pages); also remembers their annotations and resources."""
        tools = [Tool.from_wire(t) for t in await self._listing("tools", timeout) if "name" in t]
        self._tools = {t.name: t for t in tools}
        return tools

    async def _listing(self, kind: str, timeout: float | None, method: str | None = None) -> list[dict[str, Any]]:  # noqa: ASYNC109
        """Every page of ``<kind>/list`` (or ``method``), under one deadline per page."""
        listed = method or f"{kind}/list"

        async def page(params: dict[str, Any]) -> dict[str, Any]:
            return await self._read(listed, kind, params, timeout)

        return await collect_pages(page, kind)

    async def _read(self, method: str, name: str, params: dict[str, Any], timeout: float | None) -> dict[str, Any]:  # noqa: ASYNC109
        """Sent again when its response breaks, as an idempotent call is."""
        spec = CallSpec(method, with_trace(params), idempotent=True)
        return await self._require().request(spec, self._deadline(timeout))

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a per-call deadline the session enforces
        reissue: bool | None = None,
        on_message: MessageCallback | None = None,
        input_handlers: Mapping[str, InputHandler] | None = None,
        idempotency_key: str | None = None,
    ) -> ToolResult:
        """Call ``name`` and return its result; raise :class:`ToolFailed` if the tool reported failure.

        ``reissue=True`` lets the client run the tool again under a new id if its result is lost;
        ``False`` forbids it; ``None`` allows it only for idempotent tools. ``on_progress`` is called
        synchronously on the event loop, at most once per progress value; ``on_message`` likewise with every
        other notification on the call's stream (log messages, for a gateway to pass on). The first call lists the
        server's tools once, to learn each tool's annotations and resource indicator before sending.
        ``input_handlers`` answer the requests the server sends on this call's stream, over the client's own by
        method (the session knows the stream each request arrives on). When the server declares
        ``tools.idempotency`` the call carries ``idempotency_key`` (a fresh UUID 4 unless given) and a lost result is
        re-issued under it whatever the tool: the server runs the key once and replays its outcome
        (:attr:`ToolResult.replayed`).
        """
        if self._tools is None:
            await self.list_tools(timeout=timeout)
        spec = self._spec(ToolCall(name, arguments or {}, on_progress, reissue, idempotency_key))
        with journaled(self._journal, _pending(name, spec)):
            session = self._require()
            answer = await session.request(spec, self._deadline(timeout), on_progress, on_message, input_handlers)
            return _tool_result(name, answer)

    async def resume_pending(
        self,
        call: PendingCall,
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - the call's deadline, as for call_tool
        on_progress: ProgressCallback | None = None,
    ) -> ToolResult:
        """A call an earlier process left pending in its :class:`~.journal.Journal`, re-issued under its key: the
        server replays its outcome (or answers "in progress", and then replays) rather than running the tool
        again. :class:`CallMayHaveRun` when the server no longer declares ``tools.idempotency`` (a re-issue there
        could run the tool twice); a call that became a task is resumed by :class:`~.modern.ModernClient`."""
        if call.task_id is not None:
            raise ValueError(f"{call.tool} became task {call.task_id}: follow it with ModernClient.resume_pending")
        server = self._require().server
        if server is None or not idempotency.declared(server.capabilities):
            with journaled(self._journal, call):
                raise CallMayHaveRun(no_longer_keyed(call))
        return await self.call_tool(
            call.tool, call.arguments, idempotency_key=call.idempotency_key, timeout=timeout, on_progress=on_progress
        )

    async def listen(self, on_message: MessageCallback, on_open: Callable[[], None] | None = None) -> None:
        """Read the session's standalone GET stream, calling ``on_message`` with each server notification on it
        (``notifications/tools/list_changed``…), ``on_open`` once it is open; returns when the server ends it.
        A server's request on it (a ``ping``, a question of no call's) is answered as the session answers one on a
        call's stream that brought no handlers: from the client's ``input_handlers``, else method-not-found.

        A refusal (the server offers no such stream, or no longer knows the session) raises
        :class:`RequestRejected`; a broken connection, ``httpx.TransportError``. Either way notifications sent
        meanwhile are gone (the stream has no request to resume it by): a caller that re-listens re-reads the
        lists it cares about. The session itself is re-established by its next request, not by this one.
        """
        session = self._require()
        transport = session.transport
        async with transport.listen(await session.auth.token(frozenset())) as response:
            if response.status_code != 200 or media_type(response) != "text/event-stream":
                raise RequestRejected(f"no standalone stream: HTTP {response.status_code} on GET {transport.url}")
            if on_open is not None:
                on_open()
            async for events, _, _ in transport.events(response):
                for event in events:
                    try:
                        message = orjson.loads(event.data) if event.data else None
                    except orjson.JSONDecodeError:
                        continue  # not JSON-RPC: nothing a notification callback could take
                    if not isinstance(message, dict) or not isinstance(message.get("method"), str):
                        continue  # a response, or not JSON-RPC: nothing asked of this client
                    if "id" in message:
                        session.answer_standalone(message)
                    else:
                        on_message(message)

    async def call_tools(
        self,
        calls: Sequence[ToolCall],
        *,
        timeout: float | None = None,  # noqa: ASYNC109 - one deadline for the whole batch
    ) -> list[ToolResult | McpClientError]:
        """Run several calls at once; returns each call's one outcome, in order, instead of raising it.

        Under 2025-03-26 they go as one JSON-RPC batch on one stream, whose token must cover every call's
        resource; where no authorization server mints such a token, the client falls back to per-tool
        tokens (splitting a batch not yet run, re-issuing idempotent calls of one that ran). Under later
        revisions each call is its own POST, all in flight together.
        """
        if self._tools is None:
            await self.list_tools(timeout=timeout)
        specs = [self._spec(call) for call in calls]
        with ExitStack() as pending:
            for call, spec in zip(calls, specs, strict=True):
                pending.enter_context(journaled(self._journal, _pending(call.name, spec)))
            progress = [c.on_progress for c in calls]
            answers = await self._require().request_batch(specs, self._deadline(timeout), progress)
        outcomes: list[ToolResult | McpClientError] = []
        for call, answer in zip(calls, answers, strict=True):
            if isinstance(answer, McpClientError):
                outcomes.append(answer)
                continue
            try:
                outcomes.append(_tool_result(call.name, answer))
            except ToolFailed as exc:
                outcomes.append(exc)
        return outcomes

    def _spec(self, call: ToolCall) -> CallSpec:
        tool = (self._tools or {}).get(call.name)
        params: dict[str, Any] = {"name": call.name, "arguments": dict(call.arguments)}
        server = self._require().server
        key = None
        if server is not None and idempotency.declared(server.capabilities):
            key = params[idempotency.KEY_PARAM] = call.idempotency_key or str(uuid.uuid4())
        return CallSpec(
            "tools/call",
            with_trace(params),  # its caller's trace goes on
            resources=frozenset({tool.resource}) if tool is not None and tool.resource else frozenset(),
            idempotent=tool.idempotent if tool is not None else False,
            reissue=call.reissue,
            progress=call.on_progress is not None,
            idempotency_key=key,
        )

    def _deadline(self, timeout: float | None) -> float | None:
        value = self.timeout if timeout is None else timeout
        return None if math.isinf(value) else value

    def _require(self) -> Session:
        if self._session is None or self._stack is None:
            raise RuntimeError("use the client inside 'async with'")
        return self._session


def _pending(name: str, spec: CallSpec) -> PendingCall | None:
    """What a journal keeps of a keyed call (an unkeyed one has nothing a later process could re-issue safely)."""
    if spec.idempotency_key is None:
        return None
    return PendingCall(name, spec.params["arguments"], spec.idempotency_key)


def _tool_result(name: str, raw: Mapping[str, Any]) -> ToolResult:
    """The typed result, or :class:`ToolFailed` when the tool reported failure (``isError``)."""
    result = ToolResult.from_wire(raw)
    if result.raw.get("isError") is True:
        raise ToolFailed(result.text or f"tool {name} reported an error", result)
    return result
