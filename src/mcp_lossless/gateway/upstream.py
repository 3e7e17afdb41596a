"""What every upstream offers the gateway, whatever its transport: its tools, calls, and how a call can fail.

An upstream call ends in exactly one of: the upstream's ``CallToolResult`` (``isError`` included), the
upstream's JSON-RPC error (:class:`UpstreamRpcError`), or an :class:`UpstreamFailure` saying why no answer
came (``reason``) and whether the tool may have run. The gateway turns the last two into the one answer
its own client gets; nothing here decides authorization.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import orjson

from .. import __version__
from ..client.handlers import InputRefused
from ..core import errors
from ..core.principal import Principal
from ..server.tools import MethodError

CLIENT_INFO = {"name": "mcp-lossless-gateway", "version": __version__}


def counted(n: int, noun: str) -> str:
    """``1 tool``, ``3 tools``: the upstreams' start lines are read by people."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


"""How the gateway names itself to every upstream, in both transports."""

UPSTREAM_KEY_PREFIX = "gw1."
"""Marks a key the gateway derived (:func:`upstream_key`), and its derivation's version."""


def upstream_key(principal: Principal, key: str) -> str:
    """The idempotency key the gateway sends upstream for its client's ``key`` (ADR 0033).

    Upstream, every call is the gateway's (its own credentials): a key passed on verbatim would be one key for all
    of the gateway's clients there, so one principal's key string would replay another's outcome. The derived key
    is bound to the client's principal as the gateway's own record of the key is, the same on every gateway
    process (a replica, a restart) so the upstream recognizes a re-issue, and reveals neither the subject nor the
    key: a SHA-256 of the principal and the key, 47 characters."""
    material = orjson.dumps([principal.issuer, principal.subject, principal.client_id, key])  # unambiguous
    digest = base64.urlsafe_b64encode(hashlib.sha256(material).digest()).rstrip(b"=").decode()
    return UPSTREAM_KEY_PREFIX + digest


CatalogKind = Literal["prompts", "resources"]
ListKind = Literal["prompts", "resources", "templates"]
"""What an upstream lists besides tools: its prompts, resources and resource templates."""
LIST_METHODS: dict[ListKind, tuple[str, str]] = {
    "prompts": ("prompts/list", "prompts"),
    "resources": ("resources/list", "resources"),
    "templates": ("resources/templates/list", "resourceTemplates"),
}
"""Each list's method and the key of its entries in a page."""
CatalogRead = Literal["prompts/get", "resources/read", "completion/complete"]
FailureReason = Literal[
    "execution_lost", "deadline", "unreachable", "rejected", "unauthorized", "exchange_refused", "protocol", "closed"
]


@dataclass(frozen=True, slots=True)
class UpstreamTool:
    """One tool as the upstream lists it: name, description, raw JSON input schema, annotations."""

    name: str
    description: str
    input_schema: Mapping[str, Any]
    annotations: Mapping[str, Any]

    @property
    def annotated_idempotent(self) -> bool:
        return self.annotations.get("idempotentHint") is True or self.annotations.get("readOnlyHint") is True

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> UpstreamTool | None:
        """A ``tools/list`` entry, or ``None`` when it is not a usable tool (no name, no object schema)."""
        name, schema = raw.get("name"), raw.get("inputSchema")
        if not isinstance(name, str) or not name or not isinstance(schema, dict):
            return None
        description = raw.get("description")
        annotations = raw.get("annotations")
        return cls(
            name=name,
            description=description if isinstance(description, str) else "",
            input_schema=schema,
            annotations=annotations if isinstance(annotations, dict) else {},
        )


class UpstreamFailure(Exception):
    """No answer from the upstream: ``reason`` says why, ``may_have_run`` whether the tool may have run."""

    def __init__(self, reason: FailureReason, detail: str, *, may_have_run: bool) -> None:
        super().__init__(detail)
        self.reason: FailureReason = reason
        self.detail = detail
        self.may_have_run = may_have_run


class UpstreamRpcError(Exception):
    """The upstream answered the call with a JSON-RPC error; passed on to the client as it came."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


class Reporter(Protocol):
    """Where a call's upstream notifications go: the client's stream (a :class:`~..server.tools.ToolContext`)."""

    @property
    def wants_progress(self) -> bool:
        """Whether the client asked for progress: an upstream is asked for it only then."""
        ...

    async def report_progress(
        self, progress: float, total: float | None = None, message: str | None = None
    ) -> None: ...
    async def log(self, level: str, data: Any, logger: str | None = None) -> None: ...
    async def request(self, method: str, params: dict[str, Any], *, key: str | None = None) -> dict[str, Any]:
        """Ask the client for input (``elicitation/create``, ``sampling/createMessage``, ``roots/list``) in its era."""
        ...

    async def ask(self, requests: Mapping[str, tuple[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
        """Several requests for input at once, answered by key."""
        ...


async def ask_client(reporter: Reporter, method: str, params: object) -> dict[str, Any]:
    """An upstream's request for input, asked of the call's client in its era: its answer, or
    :class:`~..client.handlers.InputRefused` when the client refused, cannot answer it (its capabilities) or did
    not in time, so the upstream tool is told. One mapping for HTTP and stdio upstreams."""
    try:
        return await reporter.request(method, params if isinstance(params, dict) else {})
    except MethodError as exc:
        raise InputRefused(exc.code, exc.message) from None
    except TimeoutError:
        raise InputRefused(errors.INTERNAL_ERROR, "the gateway's client did not answer in time") from None


class Upstream(Protocol):
    name: str

    async def start(self, on_tools_changed: Callable[[], None]) -> None:
        """Connect (spawn) and handshake; ``on_tools_changed`` is called when the upstream's list changes."""
        ...

    def tools(self) -> list[UpstreamTool]:
        """The tools listed at the last (re)connection or ``list_changed``."""
        ...

    async def call(
        self, tool: str, arguments: dict[str, Any], reporter: Reporter, *, idempotent: bool, key: str | None
    ) -> dict[str, Any]:
        """The upstream's answer to one call; ``key`` (:func:`upstream_key`) goes with it where the upstream
        declares ``tools.idempotency``, else it is not sent (the SEP: an undeclared key guarantees nothing)."""
        ...

    async def listing(self, kind: ListKind) -> list[dict[str, Any]]:
        """Every entry of the upstream's list of ``kind`` (all its pages), as it sent them, asked now."""
        ...

    async def read(self, method: CatalogRead, params: dict[str, Any]) -> dict[str, Any]:
        """The upstream's result of ``resources/read``, ``prompts/get`` or ``completion/complete`` (safe to send
        again: it changes nothing)."""
        ...

    async def close(self) -> None: ...


class Relay:
    """Upstream notifications, forwarded to the client's stream in the order they came.

    Upstream callbacks are synchronous (the client's ``on_progress``, the stdio reader); each puts a
    coroutine *factory* here, and one task, started at the first, awaits them one after another (a call
    without notifications starts none, and has no queue). ``async with relay:`` forwards while the block
    runs and drains what is queued before it ends (also when it fails, not when it is cancelled), so every
    progress event precedes the call's answer.
    """

    __slots__ = ("_queue", "_task")

    def __init__(self) -> None:
        self._queue: asyncio.Queue[Callable[[], Awaitable[None]] | None] | None = None
        self._task: asyncio.Task[None] | None = None

    def put(self, send: Callable[[], Awaitable[None]]) -> None:
        if self._queue is None:
            self._queue = asyncio.Queue()
            self._task = asyncio.get_running_loop().create_task(self._forward(self._queue))
        self._queue.put_nowait(send)

    @staticmethod
    async def _forward(queue: asyncio.Queue[Callable[[], Awaitable[None]] | None]) -> None:
        while (send := await queue.get()) is not None:
            await send()

    async def __aenter__(self) -> Relay:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, *_: object) -> None:
        task, queue = self._task, self._queue
        if task is None or queue is None:
            return
        if kind is None or issubclass(kind, Exception):
            queue.put_nowait(None)
            await task
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
