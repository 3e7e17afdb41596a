"""One audit run: find the call's resource, run every check in order, collect the verdicts."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import httpx

from ..core.protocol import RESOURCE_META_KEY
from .context import Audit, AuditSettings, NotRun
from .probes import PROBES
from .redact import Redactor
from .report import AuditReport, CheckResult
from .tokens import Tokens, TokenSource, TokenUnavailable
from .wire import Exchange, HandshakeFailed, Wire, all_answered


class AuditError(Exception):
    """The audit cannot start: bad input or an unreachable / non-MCP target (exit status 2)."""


async def _discover_resource(wire: Wire, settings: AuditSettings, principal: Tokens | None) -> tuple[str, str]:
    """The call's resource indicator and where it came from (``--resource``, ``tools/list``, or the URL).

    Also the audit's first contact: a target that neither initializes nor answers a 2026-07-28 ``tools/list``,
    or does not offer the tool, stops it here. A 2026-only target is listed the modern way (the session checks
    then report why they could not run).
    """
    tool = settings.call.tool
    given = settings.tool_resources.get(tool)
    credential = None
    try:
        if principal is not None:
            resources = list(dict.fromkeys((given, *settings.narrow_resources))) if given else [settings.url]
            credential = await principal.credential(resources, "wide" if given else "server")
        session = await wire.open_session(credential, settings.version, "initialize (discovery)")
    except TokenUnavailable as exc:
        raise AuditError(f"no token to start with: {exc}") from None
    except HandshakeFailed as exc:
        request_id = wire.next_id()
        listing = await wire.modern(
            "tools/list", {}, credential=credential, label="tools/list at 2026-07-28", request_id=request_id
        )
        if listing.terminal_for(request_id) is None or not listing.ok:
            hint = ""
            if principal is None and listing.status == 401:
                hint = " (it asks for a token: give --token-endpoint URL --client ID:SECRET, or --token-command)"
            raise AuditError(
                f"{settings.url} did not complete initialize: {exc}; {_status_line(listing)}{hint}"
            ) from None
    else:
        request_id = wire.next_id()
        message = {"jsonrpc": "2.0", "id": request_id, "method": "tools/list"}
        listing = await wire.post(session, message, label="tools/list", stop=all_answered(request_id))
    answer = listing.terminal_for(request_id) or {}
    result = answer.get("result")
    tools = result.get("tools", []) if isinstance(result, dict) else []
    entry = next((t for t in tools if isinstance(t, dict) and t.get("name") == tool), None)
    if entry is None:
        raise AuditError(f"the server does not list a tool named {tool!r} ({_status_line(listing)})")
    if given is not None:
        return given, "--resource"
    meta = entry.get("_meta")
    resource = meta.get(RESOURCE_META_KEY) if isinstance(meta, dict) else None
    if isinstance(resource, str) and resource:
        return resource, "tools/list _meta"
    return settings.url, "the server URL (no per-tool resource published; pass --resource TOOL=URI)"


def _status_line(listing: Exchange) -> str:
    if listing.status is None:
        return f"tools/list failed: {listing.error}"
    return f"tools/list answered HTTP {listing.status}"


async def run_audit(
    settings: AuditSettings,
    http: httpx.AsyncClient,
    redactor: Redactor,
    principal: TokenSource | None = None,
    second: TokenSource | None = None,
) -> AuditReport:
    started = datetime.now(UTC).isoformat(timespec="seconds")
    wire = Wire(http, settings.url, read_seconds=settings.read_seconds)
    first_tokens = Tokens(principal, "principal", redactor) if principal is not None else None
    second_tokens = Tokens(second, "second principal", redactor) if second is not None else None
    resource, origin = await _discover_resource(wire, settings, first_tokens)
    if resource in settings.narrow_resources:
        raise AuditError(f"--narrow-resource includes the call's own resource {resource}: it would not narrow")
    audit = Audit(wire, settings, resource, first_tokens, second_tokens)
    results = [await _run_check(name, audit) for name in PROBES]
    summary = _settings_summary(settings, resource, origin, principal, second)
    return AuditReport(settings.url, started, summary, results, allow_not_run=settings.allow_not_run)


async def _run_check(name: str, audit: Audit) -> CheckResult:
    try:
        return await PROBES[name](audit)
    except NotRun as exc:
        return CheckResult(name, "not_run", exc.reason, exc.evidence)
    except TokenUnavailable as exc:
        return CheckResult(name, "not_run", f"no token: {exc}")
    except Exception as exc:  # one broken check must not hide the verdicts of the others
        return CheckResult(name, "not_run", f"the check failed: {type(exc).__name__}: {exc}")


def _settings_summary(
    settings: AuditSettings, resource: str, origin: str, principal: TokenSource | None, second: TokenSource | None
) -> dict[str, Any]:
    arguments = " ".join(f"{k}={v}" if isinstance(v, str) else f"{k}:={v}" for k, v in settings.call.arguments.items())
    return {
        "protocol_version": settings.version,
        "call": f"{settings.call.tool} {arguments}".strip(),
        "call_resource": resource,
        "call_resource_from": origin,
        "narrow_resources": list(settings.narrow_resources),
        "foreign_resource": settings.foreign_resource,
        "token_source": principal.description if principal is not None else "none",
        "second_principal": second.description if second is not None else "none",
        "read_seconds": settings.read_seconds,
        "open_seconds": settings.open_seconds,
        "allow_not_run": settings.allow_not_run,
    }
