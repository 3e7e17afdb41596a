"""Declaring tools: a typed function becomes an MCP tool with an input schema and a resource indicator.

Each tool names the RFC 8707 resource a token must cover to call it (by default
``<canonical server URI>/tools/<name>``, :func:`~mcp_lossless.core.resources.tool_resource`); it may name OAuth
scopes the token must hold as well; ``tools/list`` publishes them under
:data:`~mcp_lossless.core.protocol.RESOURCE_META_KEY` and :data:`~mcp_lossless.core.protocol.SCOPES_META_KEY`.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_type_hints

import pydantic

from ..core.idempotency import KEY_PARAM, key_of
from ..core.principal import Grant, Principal
from .arguments_schema import JSON_STRICT, json_typed
from .errors import ServerError

ToolReturn = str | dict[str, Any]
"""What a tool function may return: text, or structured content (the client's ``ToolResult`` is what arrives)."""
TaskSupport = Literal["optional", "required"]
"""How a tool runs for 2026-07-28 clients: as a task for those that declared the tasks extension, within the
request for the others (``optional``), or only as a task, refusing the others with -32021 (``required``)."""


InputRequests = Mapping[str, tuple[str, dict[str, Any]]]
"""Requests to the client by key: ``{key: (method, params)}`` (``elicitation/create``, ``sampling/createMessage``,
``roots/list``)."""


class Channel(Protocol):
    """How a running request talks back: messages on its own stream, requests to the client, closing."""

    def notify(self, method: str, params: dict[str, Any]) -> Awaitable[object]:
        """Send a notification on the request's stream; awaited. A channel may return its stream's own append
        (a coroutine fewer per progress event) and raise a refusal before it."""
        ...

    async def ask(self, requests: InputRequests) -> dict[str, dict[str, Any]]: ...
    def close_stream(self) -> None: ...


class InputRequired(BaseException):
    """A 2026-07-28 request's tool asked the client for input it does not have yet: the request is answered
    with an ``InputRequiredResult`` carrying ``requests`` (multi round-trip requests, docs/decisions/0015).

    A ``BaseException`` so that a tool's ``except Exception`` does not swallow it; tools never raise it.
    """

    def __init__(self, requests: dict[str, dict[str, Any]], answers: dict[str, dict[str, Any]]) -> None:
        super().__init__(sorted(requests))
        self.requests = requests
        """The unanswered requests, ``{key: {"method": ..., "params": ...}}``."""
        self.answers = answers
        """The answers the tool took before it asked: what the next round's ``requestState`` carries."""


class ToolContext:
    """What a running tool (or method handler) may use: its caller, progress, logs, client requests, cancellation."""

    __slots__ = ("_asked", "_channel", "_progress_token", "cancelled", "grant", "params", "request_id")

    def __init__(self, grant: Grant, request_id: str | int, progress_token: str | int | None, channel: Channel) -> None:
        self.grant = grant
        self.request_id = request_id
        self.cancelled = False
        """The client cancelled this request (the tool sees it as ``asyncio.CancelledError`` at its next await)."""
        self.params: Mapping[str, Any] | None = None
        """The ``tools/call`` params (set when the tool runs), for :attr:`idempotency_key`."""
        self._progress_token = progress_token
        self._channel = channel
        self._asked = 0

    @property
    def idempotency_key(self) -> str | None:
        """The call's SEP-3182 key as its client sent it: the server has already recorded it (and answered an
        invalid one before anything ran); a gateway passes it on to an upstream that dedups keys itself (ADR 0033).
        Read from the params when asked (a gateway's tool only), not for every call (~2,000 instructions)."""
        params = self.params
        return None if params is None or KEY_PARAM not in params else key_of(params)

    @property
    def principal(self) -> Principal:
        return self.grant.principal

    @property
    def wants_progress(self) -> bool:
        """Whether the caller asked for progress (a request ``progressToken``): else it is not sent."""
        return self._progress_token is not None

    async def report_progress(self, progress: float, total: float | None = None, message: str | None = None) -> None:
        """Send ``notifications/progress`` when the caller asked for it (a request ``progressToken``)."""
        if self._progress_token is None:
            return
        params: dict[str, Any] = {"progressToken": self._progress_token, "progress": progress}
        if total is not None:
            params["total"] = total
        if message is not None:
            params["message"] = message
        await self._channel.notify("notifications/progress", params)

    async def log(self, level: str, data: Any, logger: str | None = None) -> None:
        """A ``notifications/message`` log entry on this request's stream."""
        params: dict[str, Any] = {"level": level, "data": data}
        if logger is not None:
            params["logger"] = logger
        await self._channel.notify("notifications/message", params)

    async def notify(self, method: str, params: dict[str, Any]) -> None:
        await self._channel.notify(method, params)

    async def request(self, method: str, params: dict[str, Any], *, key: str | None = None) -> dict[str, Any]:
        """Ask the client (``sampling/createMessage``, ``elicitation/create``, ``roots/list``) and await its answer.

        On a legacy session the request goes out on the call's stream, bounded by the server's
        ``client_request_seconds`` (wrap in ``asyncio.timeout`` for less). On 2026-07-28 it is a multi round-trip
        request (docs/decisions/0015): the call is answered ``input_required`` and the client's retry runs the
        tool again *from its start*, this time with the answer, so what a tool does before it asks must bear
        being done once per round (ask first, or run as a task). In a task, the task waits ``input_required``
        until ``tasks/update`` answers. ``key`` names the request on the wire (default ``input-<n>``, counted
        per call); a task never reuses one.
        """
        if key is None:
            self._asked += 1
            key = f"input-{self._asked}"
        return (await self.ask({key: (method, params)}))[key]

    async def ask(self, requests: InputRequests) -> dict[str, dict[str, Any]]:
        """Several requests to the client at once (as :meth:`request`), answered by key: the client sees them all
        together (one ``InputRequiredResult``, one ``input_required`` task state), not one after the other."""
        return await self._channel.ask(requests)

    def close_stream(self) -> None:
        """Close the SSE connection now (SEP-1699 polling); the client resumes with GET + Last-Event-ID.

        On 2026-07-28, which has no resumption, a task needs nothing (its client polls) and a request answered
        in its own response is refused with ``MethodError`` (-32603): declare the tool ``task=True`` there
        (docs/decisions/0024)."""
        self._channel.close_stream()


class ToolError(ServerError):
    """Raise from a tool to return an ``isError`` result whose text the caller may see."""


class MethodError(ServerError):
    """Raise from a method handler to answer with a JSON-RPC error."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data


MethodHandler = Callable[[ToolContext, dict[str, Any]], Awaitable[dict[str, Any]]]
"""An extra JSON-RPC method (``resources/read``, ``prompts/get`` …): params in, result out."""

MethodTags = Callable[[dict[str, Any]], frozenset[str]]
"""What a request of an extra method needs of a token, from its params: a tag set as a tool's
(:func:`~mcp_lossless.core.resources.requirement`), checked before the handler runs and carried by the request's
events, exactly as a tool call's; empty: any admitted token (what an extra method without one gets)."""


class ToolInputError(ServerError, ValueError):
    pass


RawToolHandler = Callable[[ToolContext, dict[str, Any]], Awaitable[ToolReturn]]
"""A tool declared by its JSON Schema instead of a signature: the context and the arguments object in, a result out.

The arguments reach it as the client sent them (an object); checking them against the schema is its own job
(a gateway's upstream does it).
"""


@dataclass(slots=True)
class RegisteredTool:
    """A tool as the registry holds it: the function and what the server publishes about it (``tools/list``).

    Named apart from the client's :class:`mcp_lossless.client.Tool`, which is a tool as a server lists it.
    """

    name: str
    description: str
    fn: Callable[..., Awaitable[ToolReturn]]
    arguments: type[pydantic.BaseModel] | None
    """Validates the call's arguments; ``None`` for a raw tool, which receives the object as ``arguments``."""
    context_param: str | None
    annotations: dict[str, Any] = field(default_factory=dict)
    resource: str | None = None
    """Explicit resource indicator; ``None`` means ``<canonical>/tools/<name>``."""
    scopes: tuple[str, ...] = ()
    """OAuth scopes a token must hold, besides covering the resource, to call the tool and receive its events."""
    schema: dict[str, Any] | None = None
    """Published instead of the schema derived from the signature (for JSON Schema type hints cannot express)."""
    task: TaskSupport | None = None
    """Whether it runs as a task for 2026-07-28 clients (``None``: always within the request)."""
    input_before_task: bool = False
    """A task tool whose first asks of the client come before its first other await: on 2026-07-28 they are
    answered by multi round-trip requests on the ``tools/call`` itself, before the task is created."""
    dedups_keys: Callable[[], bool] | None = None
    """Whether, now, the tool's work passes the call's idempotency key on to something that dedups it itself (a
    gateway's HTTP upstream declaring ``tools.idempotency``): then a key whose first run was lost is run again
    under it, unrecorded, and that upstream answers it from its own record (ADR 0033)."""
    plain: PlainArguments | None = field(init=False, repr=False, compare=False)
    """The shortcut of :meth:`bind` for arguments its model would take as they are (:func:`plain_arguments`)."""

    def __post_init__(self) -> None:
        self.plain = None if self.arguments is None else plain_arguments(self.arguments)

    def input_schema(self) -> dict[str, Any]:
        if self.schema is not None:
            return self.schema
        assert self.arguments is not None, "a raw tool always has its schema"
        schema = self.arguments.model_json_schema()
        schema.pop("title", None)
        return schema

    def bind(self, raw: object) -> dict[str, Any]:
        """Validate call arguments; a :class:`ToolInputError` says which argument is wrong."""
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ToolInputError("arguments must be an object")
        if self.arguments is None:
            return {"arguments": raw}
        plain = self.plain
        if plain is not None:
            kinds, defaults, required = plain
            for name, value in raw.items():
                if type(value) is not kinds.get(name):  # an unknown name gets None: not a value's type
                    break
            else:
                if raw.keys() >= required:
                    return {**defaults, **raw}
        try:  # the model's own validator: ``model_validate`` around it costs as much again per call
            model: pydantic.BaseModel = self.arguments.__pydantic_validator__.validate_python(raw)
        except pydantic.ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['msg']}" for e in exc.errors())
            raise ToolInputError(problems) from None
        return model.__dict__.copy()  # the fields, and only them (``extra="forbid"``)


PlainArguments = tuple[dict[str, type], dict[str, Any], frozenset[str]]
"""A model's fields by name with their one type, the defaults of the optional ones, the names of the required ones."""
_PLAIN_TYPES: tuple[type, ...] = (str, int, float, bool)
"""The field types whose model takes a value of exactly that type as it is (``bool`` is not an ``int`` here)."""


def plain_arguments(model: type[pydantic.BaseModel]) -> PlainArguments | None:
    """What lets :meth:`RegisteredTool.bind` skip the model's validation of arguments it would take unchanged: each
    field's type when every field is a bare ``str``, ``int``, ``float`` or ``bool`` (no constraint, alias or
    validator; :data:`.arguments_schema.JSON_STRICT`'s strictness, which takes a value of exactly its type as it is,
    allowed) with no default or an immutable one, and the model forbids extra fields and has no other setting
    (``None`` otherwise, and the model validates every call). For such a model, arguments that name only its fields,
    each a value of exactly its type, and every required one, validate to themselves over the defaults; anything
    else (a missing or unknown name, a value to coerce or refuse) goes to the model, which decides and words the
    error. ``tests/unit/test_tool_arguments.py`` holds the shortcut to the model's answer."""
    decorators = model.__pydantic_decorators__
    if dict(model.model_config) != {"extra": "forbid"} or any(
        (
            decorators.validators,
            decorators.field_validators,
            decorators.root_validators,
            decorators.model_validators,
        )
    ):
        return None
    kinds: dict[str, type] = {}
    defaults: dict[str, Any] = {}
    required: set[str] = set()
    for name, info in model.model_fields.items():
        annotation: object = info.annotation
        plain = [kind for kind in _PLAIN_TYPES if kind is annotation]
        if (
            not plain
            or (info.metadata and info.metadata != list(JSON_STRICT[plain[0]]))
            or info.alias is not None
            or info.validation_alias is not None
            or info.default_factory is not None
        ):
            return None
        kinds[name] = plain[0]
        if info.is_required():
            required.add(name)
        elif info.default is None or type(info.default) in _PLAIN_TYPES:
            defaults[name] = info.default
        else:
            return None
    return kinds, defaults, frozenset(required)


def scope_tokens(owner: str, scopes: tuple[str, ...]) -> tuple[str, ...]:
    """``scopes`` sorted and deduplicated; ``ValueError`` naming ``owner`` unless each is an RFC 6749 scope token."""
    bad = [s for s in scopes if not isinstance(s, str) or not s or any(c <= " " or c in '"\\' or c > "~" for c in s)]
    if isinstance(scopes, str) or bad:
        raise ValueError(f"{owner}: scopes must be a tuple of RFC 6749 scope tokens, got {scopes!r}")
    return tuple(sorted(set(scopes)))


def _arguments_model(name: str, fn: Callable[..., Any]) -> tuple[type[pydantic.BaseModel], str | None]:
    hints = get_type_hints(fn, include_extras=True)  # keeps `Annotated` constraints (`Field(ge=0)`) on the field
    fields: dict[str, Any] = {}
    context_param = None
    for param in inspect.signature(fn).parameters.values():
        hint = hints.get(param.name, Any)
        if hint is ToolContext:
            context_param = param.name
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[param.name] = (json_typed(hint), default)  # held to the schema it publishes
    config = pydantic.ConfigDict(extra="forbid")
    model = pydantic.create_model(f"{name}_arguments", __config__=config, **fields)
    return model, context_param


class ToolRegistry:
    """The tools a server offers, in declaration order."""

    def __init__(self) -> None:
        self.tools: dict[str, RegisteredTool] = {}

    def tool(
        self,
        name: str | None = None,
        *,
        description: str | None = None,
        resource: str | None = None,
        scopes: tuple[str, ...] = (),
        idempotent: bool | None = None,
        read_only: bool | None = None,
        title: str | None = None,
        input_schema: dict[str, Any] | None = None,
        task: bool | TaskSupport = False,
        input_before_task: bool = False,
    ) -> Callable[[Callable[..., Awaitable[ToolReturn]]], Callable[..., Awaitable[ToolReturn]]]:
        """Register an async function as a tool. Parameters typed :class:`ToolContext` receive the context.

        ``input_schema`` replaces the published ``inputSchema``; calls are still validated against the signature.
        ``task=True`` (``"optional"``) or ``"required"``: for long-running or non-idempotent tools, whose result
        must outlive the request that started them (2026-07-28 clients with the tasks extension poll it with
        ``tasks/get``); see :data:`TaskSupport`. ``input_before_task``: the input such a tool asks for before
        its first other await is gathered on the ``tools/call`` (multi round-trip requests), and the task is
        created with the answers (the extension's advice); the tool's code up to that await runs once per round
        and once more in the task. Input asked later puts the task in ``input_required`` until ``tasks/update``.
        """

        def register(fn: Callable[..., Awaitable[ToolReturn]]) -> Callable[..., Awaitable[ToolReturn]]:
            tool_name = name or fn.__name__
            if tool_name in self.tools:
                raise ValueError(f"tool {tool_name!r} declared twice")
            if not inspect.iscoroutinefunction(fn):
                raise TypeError(f"tool {tool_name!r} must be an async function")
            checked = scope_tokens(f"tool {tool_name!r}", scopes)
            if input_before_task and not task:
                raise ValueError(f"tool {tool_name!r}: input_before_task is for tools that run as tasks")
            arguments, context_param = _arguments_model(tool_name, fn)
            annotations: dict[str, Any] = {}
            if title is not None:
                annotations["title"] = title
            if idempotent is not None:
                annotations["idempotentHint"] = idempotent
            if read_only is not None:
                annotations["readOnlyHint"] = read_only
            self.tools[tool_name] = RegisteredTool(
                name=tool_name,
                description=description or inspect.getdoc(fn) or "",
                fn=fn,
                arguments=arguments,
                context_param=context_param,
                annotations=annotations,
                resource=resource,
                scopes=checked,
                schema=input_schema,
                task="optional" if task is True else task or None,
                input_before_task=input_before_task,
            )
            return fn

        return register

    def add_raw(
        self,
        name: str,
        handler: RawToolHandler,
        input_schema: dict[str, Any],
        *,
        description: str = "",
        annotations: dict[str, Any] | None = None,
        resource: str | None = None,
        scopes: tuple[str, ...] = (),
        task: TaskSupport | None = None,
        dedups_keys: Callable[[], bool] | None = None,
    ) -> None:
        """Register a tool by its raw JSON ``input_schema``; ``handler(ctx, arguments)`` runs each call
        (``scopes`` and ``task`` as for :meth:`tool`; ``dedups_keys`` as :attr:`RegisteredTool.dedups_keys`)."""
        if name in self.tools:
            raise ValueError(f"tool {name!r} declared twice")
        checked = scope_tokens(f"tool {name!r}", scopes)

        async def fn(arguments: dict[str, Any], ctx: ToolContext) -> ToolReturn:
            return await handler(ctx, arguments)

        self.tools[name] = RegisteredTool(
            name=name,
            description=description,
            fn=fn,
            arguments=None,
            context_param="ctx",
            annotations=dict(annotations or {}),
            resource=resource,
            scopes=checked,
            schema=input_schema,
            task=task,
            dedups_keys=dedups_keys,
        )

    def remove(self, name: str) -> None:
        self.tools.pop(name, None)


def content_of(value: ToolReturn) -> dict[str, Any]:
    """A ``CallToolResult`` from what a tool returned: text for a string, as-is for a result dict."""
    if isinstance(value, str):
        return {"content": [{"type": "text", "text": value}], "isError": False}
    if "content" in value:
        return value
    return {
        "content": [{"type": "text", "text": pydantic.TypeAdapter(Any).dump_json(value).decode()}],
        "structuredContent": value,
        "isError": False,
    }
