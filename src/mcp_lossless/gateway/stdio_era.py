"""Which era a stdio child speaks, and what speaking it means on the pipe: 2026-07-28 first, legacy fallback.

The 2026-07-28 stdio binding has no HTTP status to drive a fallback: a dual-era client probes with
``server/discover`` before any other request. A result listing 2026-07-28 is a modern server; a modern
refusal of the revision (``UNSUPPORTED_PROTOCOL_VERSION`` naming 2026-07-28) is a modern server that will not
talk, so the start fails; any other error, or no answer within :data:`PROBE_SECONDS` (legacy servers may
ignore a request before ``initialize``), is a legacy server, which then gets ``initialize`` on the same
process. A dual-era server picks its era from the first request it reads, so a probe answered late (a child
still importing when the probe's time ran out) has made the child modern: it then refuses ``initialize``,
and that refusal is read together with the late answer.

The era is a property of the server: a restarted child is spoken to in the era its predecessor negotiated
(no second probe, nor a second wait on a silent one), and probed again after a start in that era failed.

A modern child gets :func:`enveloped` params on every request (there is no handshake to state the revision
and the client once). Children are told the gateway can answer requests for input
(:data:`INPUT_CAPABILITIES`, :data:`LEGACY_INPUT_CAPABILITIES`): it asks its own client. A modern child's
``input_required`` answer names them (:func:`input_requests`); its final answer must be complete
(:func:`complete`): the gateway does not declare the tasks extension to it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ..client.handlers import CAPABILITIES
from ..client.modern import NotModern, modern_discovery, modern_refusal, request_meta
from ..core import protocol
from .config import Era
from .upstream import CLIENT_INFO, UpstreamFailure, UpstreamRpcError

PROBE_SECONDS = 10.0
"""How long the ``server/discover`` probe waits before the child is taken for a legacy server."""
INPUT_METHODS = frozenset(CAPABILITIES)
"""The requests for input a child may make of the gateway's client (what a server may ask of a client)."""
SpokenEra = Literal["modern", "legacy"]
Request = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]
Notify = Callable[[str], Awaitable[None]]


@dataclass(frozen=True, slots=True)
class Handshake:
    era: SpokenEra
    how: str
    """Why this era, for the upstream's log line (the probe's answer, the configuration, the last start)."""
    capabilities: Mapping[str, Any]
    """What the server says it offers: its ``server/discover`` or ``initialize`` answer's capabilities."""

    @property
    def announces_list_changes(self) -> bool:
        tools = self.capabilities.get("tools")
        return isinstance(tools, Mapping) and tools.get("listChanged") is True


INPUT_CAPABILITIES: dict[str, Any] = {capability: {} for capability in CAPABILITIES.values()}
"""What the gateway declares to a modern child: it passes each request for input, which a 2026-07-28 child makes
in its answer to one call, on to that call's client (which answers, or refuses, in its own era)."""
LEGACY_INPUT_METHODS = frozenset({"elicitation/create", "sampling/createMessage"})
"""What a legacy child may ask mid-call. Not ``roots/list``: a legacy child's roots are its session's, asked at any
time (server-everything asks as soon as it is initialized), and the gateway's one session serves many clients."""
LEGACY_INPUT_CAPABILITIES: dict[str, Any] = {CAPABILITIES[method]: {} for method in LEGACY_INPUT_METHODS}


def enveloped(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` of a 2026-07-28 request: with the revision, the gateway's capabilities and identity."""
    meta = request_meta(INPUT_CAPABILITIES, CLIENT_INFO)
    extra = params.get("_meta")
    return {**params, "_meta": {**meta, **extra} if isinstance(extra, Mapping) else meta}


def complete(tool: str, result: dict[str, Any]) -> dict[str, Any]:
    """A modern child's final ``tools/call`` result, which must be complete: the tasks extension was not declared."""
    kind = result.get("resultType", "complete")
    if kind != "complete":
        raise UpstreamFailure(
            "protocol", f"{tool} answered resultType {kind!r}, which the gateway did not ask for", may_have_run=True
        )
    return result


def input_requests(tool: str, result: Mapping[str, Any]) -> dict[str, tuple[str, dict[str, Any]]]:
    """An ``input_required`` answer's ``inputRequests`` as ``{key: (method, params)}``; a malformed one breaks
    the protocol (the request it answered is over: nothing runs that could be cancelled)."""
    raw = result.get("inputRequests")
    if not isinstance(raw, Mapping) or not raw:
        raise UpstreamFailure("protocol", f"{tool} required input but named none", may_have_run=True)
    requests: dict[str, tuple[str, dict[str, Any]]] = {}
    for key, request in raw.items():
        method = request.get("method") if isinstance(request, Mapping) else None
        params = request.get("params", {}) if isinstance(request, Mapping) else None
        if not isinstance(method, str) or method not in INPUT_METHODS or not isinstance(params, dict):
            detail = f"{tool}: input request {key!r} is no request for input"
            raise UpstreamFailure("protocol", detail, may_have_run=True)
        requests[str(key)] = (method, params)
    return requests


def _capabilities(result: Mapping[str, Any]) -> Mapping[str, Any]:
    capabilities = result.get("capabilities")
    return capabilities if isinstance(capabilities, Mapping) else {}


async def negotiate_era(request: Request, notify: Notify, era: Era, last: SpokenEra | None) -> Handshake:
    """The era to speak to a freshly spawned child: ``era`` from the config, ``last`` what its predecessor spoke.

    ``request`` sends one request and returns its result (raising :class:`UpstreamRpcError` for an error
    answer); ``notify`` sends a notification. A child that speaks neither fails as :class:`UpstreamFailure`.
    """
    if era == "legacy":
        return await _initialize(request, notify, "configured")
    if era == "auto" and last == "legacy":
        return await _initialize(request, notify, "as at its last start")
    probe = asyncio.ensure_future(request("server/discover", enveloped({})))
    probe.add_done_callback(_retrieved)
    try:
        async with asyncio.timeout(PROBE_SECONDS):
            discovered = await asyncio.shield(probe)
    except TimeoutError:
        return await _fallback(request, notify, era, f"server/discover had no answer in {PROBE_SECONDS:g} s", probe)
    except UpstreamRpcError as exc:
        if modern_refusal(exc.code, exc.data):
            raise UpstreamFailure(
                "protocol", f"a 2026-07-28 server that refused the revision: {exc.message}", may_have_run=False
            ) from None
        return await _fallback(request, notify, era, f"server/discover refused ({exc.code} {exc.message})")
    try:
        modern_discovery(discovered)
    except NotModern as exc:
        return await _fallback(request, notify, era, f"server/discover answered, but {exc}")
    return Handshake("modern", "server/discover lists it", _capabilities(discovered))


async def _fallback(
    request: Request, notify: Notify, era: Era, why: str, probe: asyncio.Future[dict[str, Any]] | None = None
) -> Handshake:
    """The probe found no modern server: the legacy handshake, unless the config asked for 2026-07-28."""
    if era == "modern":
        raise UpstreamFailure("protocol", f"configured 2026-07-28, but {why}", may_have_run=False)
    return await _initialize(request, notify, why, probe)


async def _initialize(
    request: Request, notify: Notify, how: str, late_probe: asyncio.Future[dict[str, Any]] | None = None
) -> Handshake:
    params = {"protocolVersion": protocol.LATEST, "capabilities": LEGACY_INPUT_CAPABILITIES, "clientInfo": CLIENT_INFO}
    try:
        init = await request("initialize", params)
    except UpstreamRpcError:
        if late_probe is None:
            raise
        with contextlib.suppress(TimeoutError):  # its answer may come after the refusal it caused
            async with asyncio.timeout(PROBE_SECONDS):
                await asyncio.wait([late_probe])
        late = _late_discovery(late_probe)
        if late is None:
            raise
        return Handshake("modern", "server/discover answered late, and initialize was refused", _capabilities(late))
    if not isinstance(init.get("protocolVersion"), str):
        raise UpstreamFailure("protocol", "initialize answered without a protocolVersion", may_have_run=False)
    await notify("notifications/initialized")
    return Handshake("legacy", how, _capabilities(init))


def _late_discovery(probe: asyncio.Future[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The probe's answer, if it came after all and names 2026-07-28."""
    if probe is None or not probe.done() or probe.cancelled() or probe.exception() is not None:
        return None
    try:
        return modern_discovery(probe.result())
    except NotModern:
        return None


def _retrieved(probe: asyncio.Future[dict[str, Any]]) -> None:
    """A probe left unanswered ends with its child: its exception then is expected, not an unhandled one."""
    if not probe.cancelled():
        probe.exception()
