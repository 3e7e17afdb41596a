"""The public async client: ``async with Client(url) as client: await client.call_tool(...)``.

Every ``call_tool`` ends in exactly one outcome within its deadline: a :class:`ToolResult`, or one of
the exceptions in :mod:`mcp_lossless.client.errors`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import anyio
import httpx

from ..core.ledger import CallSpec, RecoveryPolicy
from .errors import ToolError
from .oauth import Auth
from .session import ProgressCallback, ServerInfo, Session
from .transport import Backoff, HttpTransport

RESOURCE_META_KEY = "io.github.mcp-lossless/resource"
"""Where an mcp-lossless server publishes each tool's RFC 8707 resource indicator in ``tools/list``."""
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


class Client:
    """An MCP client over Streamable HTTP that never loses or mislabels a result.

    ``timeout`` is the default per-call deadline in seconds (``math.inf`` for none). ``policy`` says how
    hard to try before failing a call; re-issuing is automatic only for idempotent tools unless a call
    says otherwise.
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
    ) -> None:
        self.url = url
        self.timeout = timeout
        self._auth = auth or Auth()
        self._policy = policy
        self._backoff = backoff
        self._http = http
        self._idle_timeout = idle_timeout
        self._client_info = client_info
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
                HttpTransport(self.url, http),
                self._auth,
                policy=self._policy,
                backoff=self._backoff,
                client_info=self._client_info,
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
        tools: list[Tool] = []
        cursor: str | None = None
        while True:
            params = {"cursor": cursor} if cursor is not None else {}
            spec = CallSpec("tools/list", params, idempotent=True)
            result = await self._require().request(spec, self._deadline(timeout))
            tools += [Tool.from_wire(t) for t in result.get("tools", []) if isinstance(t, dict) and "name" in t]
            cursor = result.get("nextCursor") if isinstance(result.get("nextCursor"), str) else None
            if cursor is None:
                break
        self._tools = {t.name: t for t in tools}
        return tools

    async def call_tool(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        on_progress: ProgressCallback | None = None,
        timeout: float | None = None,  # noqa: ASYNC109 - a per-call deadline the session enforces
        reissue: bool | None = None,
    ) -> ToolResult:
        """Call ``name`` and return its result; raise :class:`ToolError` if the tool reported failure.

        ``reissue=True`` lets the client run the tool again under a new id if its result is lost;
        ``False`` forbids it; ``None`` allows it only for idempotent tools. ``on_progress`` is called
        synchronously on the event loop, at most once per progress value. The first call lists the
        server's tools once, to learn each tool's annotations and resource indicator before sending.
        """
        if self._tools is None:
            await self.list_tools(timeout=timeout)
        tool = (self._tools or {}).get(name)
        spec = CallSpec(
            "tools/call",
            {"name": name, "arguments": dict(arguments or {})},
            resources=frozenset({tool.resource}) if tool is not None and tool.resource else frozenset(),
            idempotent=tool.idempotent if tool is not None else False,
            reissue=reissue,
            progress=on_progress is not None,
        )
        result = ToolResult.from_wire(await self._require().request(spec, self._deadline(timeout), on_progress))
        if result.raw.get("isError") is True:
            raise ToolError(result.text or f"tool {name} reported an error", result)
        return result

    def _deadline(self, timeout: float | None) -> float | None:
        value = self.timeout if timeout is None else timeout
        return None if math.isinf(value) else value

    def _require(self) -> Session:
        if self._session is None or self._stack is None:
            raise RuntimeError("use the client inside 'async with'")
        return self._session
