"""The request core both protocol eras share (docs/decisions/0034): which era serves a request, decided once.

The legacy leg (:mod:`.transport`, :mod:`.dispatch`: sessions, streams, resumption) and the 2026-07-28 leg
(:mod:`.modern`: statelessness, tasks, multi round-trip input) keep what is theirs; what a request means in
either lives here once, as uvicorn's two HTTP implementations share ``flow_control``.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Collection, Container, Iterable, Sequence
from typing import Any, Final, Literal, NamedTuple

from ..core import denials, errors, protocol
from ..core.resources import describe, resources_in
from . import metadata
from .observability import Metrics
from .tools import MethodError, RegisteredTool, ToolContext, ToolError, ToolInputError, content_of


class Leg(enum.Enum):
    """The era a POST opens when it is not the legacy one (whose revision is a string, or ``None``)."""

    MODERN = protocol.STATELESS
    """Served statelessly by the 2026-07-28 leg: no session, per-request ``_meta``."""


STATELESS_LEG: Final = Leg.MODERN
"""The member itself, bound once: reading ``Leg.MODERN`` goes through the enum's class (about 100 ns, twice per
request on the hot path); a module global is a dictionary read."""

Requested = Literal[Leg.MODERN] | str | None
"""What :func:`era` decides: the modern leg, or the revision a legacy request asks for (``None``: its session's)."""


def era(index: dict[bytes, bytes], first: dict[str, Any] | None, alone: bool) -> Requested:
    """Which era serves a request, from its headers and its first message (``None`` for a GET), asked once per
    request. A message alone in its POST opens the modern way when its ``_meta`` carries the protocol version, or
    when it has no session and names a version no legacy session could have (the modern leg's validation then
    answers it). Otherwise it is legacy, asking for the ``MCP-Protocol-Version`` header's revision, else its
    ``_meta``'s (:func:`.checks.served_revision` refuses one not served; ``initialize`` negotiates instead).
    """
    raw = index.get(b"mcp-protocol-version")
    meta = None
    if first is not None:
        params = first.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if alone:
            if isinstance(meta, dict) and protocol.VERSION_META_KEY in meta:
                return STATELESS_LEG  # its header is the modern leg's to decode and check
            if (
                raw is not None
                and b"mcp-session-id" not in index
                and raw.decode("latin-1") not in protocol.HANDSHAKE_VERSIONS
            ):
                return STATELESS_LEG
    if raw is not None:
        return raw.decode("latin-1")
    if isinstance(meta, dict):
        value = meta.get(protocol.VERSION_META_KEY)
        return value if isinstance(value, str) else None
    return None


# -- the method table -----------------------------------------------------------------------------------------

Handling = Literal["call", "list_tools", "ping", "set_log_level", "discover", "listen", "task", "task_stream", "extra"]
"""How a request is served: each router (:meth:`.dispatch.Dispatcher._route`, :meth:`.modern.ModernLeg.serve`)
carries out each kind its era serves, looked up in its view of :data:`METHODS`, else :func:`extra`. Strings, not an
enum: compared once per request, on the hot path."""

METHODS: dict[str, tuple[Handling, bool, bool]] = {
    "tools/call": ("call", True, True),
    "tools/list": ("list_tools", True, True),
    "ping": ("ping", True, False),
    "logging/setLevel": ("set_log_level", True, False),
    "server/discover": ("discover", False, True),
    "subscriptions/listen": ("listen", False, True),
    "tasks/get": ("task", False, True),
    "tasks/update": ("task", False, True),
    "tasks/cancel": ("task", False, True),
    "tasks/stream": ("task_stream", False, True),
}
"""The built-in methods: how each is served, and whether the legacy leg and the 2026-07-28 leg serve it. The one
method table both routers read; an extra method (:attr:`.state.ServerState.methods`) is served by its handler."""
NEVER_STATELESS = frozenset(
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
"""Removed by 2026-07-28 or by the tasks extension: ``-32601`` (404) there, even when an extra handler has the name."""


LEGACY_METHODS: dict[str, Handling] = {method: kind for method, (kind, legacy, _) in METHODS.items() if legacy}
""":data:`METHODS` as the legacy leg reads it: one lookup per request."""
STATELESS_METHODS: dict[str, Handling] = {method: kind for method, (kind, _, modern) in METHODS.items() if modern}
""":data:`METHODS` as the 2026-07-28 leg reads it."""


def extra(method: str, modern: bool, extras: Container[str]) -> Handling | None:
    """How a method no built-in of the era serves is served: by its extra handler (``"extra"``), unless the
    2026-07-28 revision removed it; ``None``: not found there. A built-in wins over an extra of the same name:
    each router asks this only when its view of :data:`METHODS` has no entry."""
    if method in extras and not (modern and method in NEVER_STATELESS):
        return "extra"
    return None


# -- the coverage refusal -------------------------------------------------------------------------------------


class Uncovered(NamedTuple):
    """A request its token does not cover, refused 403 before any byte: what each era's error carries (its own
    code: ``FORBIDDEN`` on the legacy leg, ``TOOL_FORBIDDEN`` on the modern one) and the challenge it is sent with."""

    description: str
    """The error's message, and the challenge's ``error_description``."""
    data: dict[str, Any]
    """``requiredResources``, ``requiredScopes`` and the SEP-2643 envelope (:func:`.denials.refusal_fields`)."""
    challenge: list[tuple[bytes, bytes]]
    """``WWW-Authenticate`` naming what a new token must hold (:func:`.metadata.insufficient_scope`)."""


def coverage_description(missing: Collection[str]) -> str:
    """What a token lacks, in words: its audience, when a resource is missing; else (scopes only) the scopes."""
    lacks = "audience does not cover" if resources_in(missing) else "lacks"
    return f"token {lacks} {describe(missing)}"


def uncovered(missing: Sequence[str], needed: Iterable[str], prm_url: str, metrics: Metrics) -> Uncovered:
    """The refusal of a request (a tool call, an extra method's request, a batch's calls) whose token lacks
    ``missing`` (sorted) of the tags it ``needed``; counted once, whichever era refuses."""
    metrics.refusals.labels("insufficient_audience", "call").inc()
    needed = sorted(needed)
    description = coverage_description(missing)
    data = denials.refusal_fields(" ".join(needed), missing)
    challenge = metadata.insufficient_scope(description, prm_url, missing, needed)
    return Uncovered(description, data, [(b"www-authenticate", challenge)])


# -- running a tool --------------------------------------------------------------------------------------------


def unnamed(method: str, field: str) -> str:
    """The ``-32602`` of a request of ``method`` whose params are not an object with a string ``field`` (the tool's
    name, the task's id: what the request is about), in both eras."""
    return f"{method} params must be an object with a string {field}"


CALL_PARAMS: Final = unnamed("tools/call", "name")


def unknown_tool(params: object) -> str:
    """Why a ``tools/call`` names no tool of the server, in either era's ``-32602``: its params are not an object
    with a string ``name`` (a malformed request, said as such), or the name is no tool's."""
    name = params.get("name") if isinstance(params, dict) else None
    if not isinstance(name, str):
        return CALL_PARAMS
    return f"unknown tool {name!r}"


async def call_tool(
    tool: RegisteredTool, params: dict[str, Any], ctx: ToolContext, crashes: logging.Logger | None = None
) -> dict[str, Any]:
    """Run ``tool`` for a ``tools/call`` with ``params`` and shape its ``CallToolResult``, in either era: its
    return value as content, a :class:`.ToolError` as an ``isError`` result, arguments that do not bind as a
    ``-32602`` :class:`.MethodError`. Anything else it raises goes to the era, which knows what it means there
    (a store outage is execution lost on a legacy stream; either era answers a crash :func:`tool_failed`), unless
    the era gives ``crashes``: then any other :class:`Exception` is a crash, logged there and answered
    :func:`tool_failed` here (the 2026-07-28 leg's, in this coroutine: no coroutine of the era's around it)."""
    try:
        ctx.params = params  # its idempotency key, read only by a tool that asks (a gateway's)
        try:
            kwargs = tool.bind(params.get("arguments"))
        except ToolInputError as exc:
            raise MethodError(errors.INVALID_PARAMS, f"invalid arguments for {tool.name}: {exc}") from None
        if tool.context_param is not None:
            kwargs[tool.context_param] = ctx
        return content_of(await tool.fn(**kwargs))
    except ToolError as exc:
        return tool_error(str(exc))
    except MethodError:
        raise
    except Exception:
        if crashes is None:
            raise
        crashes.exception("tool %s failed", tool.name)
        return tool_failed(tool.name)


def tool_error(text: str) -> dict[str, Any]:
    """A tool's own failure, reported to the model as its result (``isError``), not as a protocol error."""
    return {"content": [{"type": "text", "text": text}], "isError": True}


def tool_failed(name: str) -> dict[str, Any]:
    """The result of a tool that crashed: that it failed, never why (its exception is the server's log's)."""
    return tool_error(f"tool {name} failed")
