"""The gateway: an mcp-lossless server whose tools happen to call upstreams.

Every exposed tool is registered in an ordinary :class:`~..server.tools.ToolRegistry` from the upstream's
raw JSON schema, so the server's guarantees apply unchanged: per-tool resource indicators, replay
authorization against the resuming token, principal-bound sessions and ids, explicit resumable
refusals, limits. This module only holds the upstream connections, the exposed-tool table and their
supervision, and turns an upstream's failure into the one explicit answer the client gets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from .. import tracing
from ..asgi import Receive, Scope, Send, run_lifespan
from ..core import errors
from ..core.resources import canonical_resource
from ..core.tasks import extension_required
from ..server.app import STARTUP_FAILURES, LosslessApp, create_app
from ..server.auth import TokenVerifier
from ..server.config import ServerConfig
from ..server.observability import log_decision
from ..server.tools import InputRequired, MethodError, RawToolHandler, ToolContext, ToolRegistry, ToolReturn
from ..stores.base import EventStore
from .catalog import Catalog
from .config import GatewayConfigError, UpstreamConfig
from .http import HttpUpstream
from .stdio import StdioUpstream
from .table import ExposedTool, expose
from .upstream import Upstream, UpstreamFailure, UpstreamRpcError, upstream_key
from .vetting import Verdicts

log = logging.getLogger("mcp_lossless.gateway")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
RECONNECT_MAX_SECONDS = 30.0


def open_upstream(config: UpstreamConfig) -> HttpUpstream | StdioUpstream:
    return HttpUpstream(config) if config.url is not None else StdioUpstream(config)


class _Metrics:
    def __init__(self, app: LosslessApp) -> None:
        r = app.state.metrics.registry
        self.calls = Counter(
            "mcp_lossless_gateway_calls_total",
            "Upstream calls by outcome (ok, tool_error, rpc_error, cancelled, or the failure reason)",
            ["upstream", "outcome"],
            registry=r,
        )
        self.latency = Histogram(
            "mcp_lossless_gateway_call_seconds",
            "Upstream call latency",
            ["upstream"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.restarts = Counter(
            "mcp_lossless_gateway_restarts_total",
            "Upstream restarts (stdio children respawned)",
            ["upstream"],
            registry=r,
        )
        self.up = Gauge(
            "mcp_lossless_gateway_upstream_up", "1 when the upstream is connected", ["upstream"], registry=r
        )
        self.era = Gauge(
            "mcp_lossless_gateway_upstream_era",
            "1 for the protocol era the upstream is spoken to in (negotiated or configured), 0 for the other",
            ["upstream", "era"],
            registry=r,
        )
        self._counted: dict[tuple[str, str], Any] = {}
        self._timed: dict[str, Any] = {}

    def speaks(self, upstream: HttpUpstream | StdioUpstream) -> None:
        """Record the era ``upstream`` negotiated at its last (re)start."""
        for era in ("modern", "legacy"):
            self.era.labels(upstream.name, era).set(1 if upstream.era == era else 0)

    def called(self, upstream: str, outcome: str, seconds: float) -> None:
        """Count one upstream call and its latency (each label set's child looked up once: it is the hot path)."""
        counter = self._counted.get((upstream, outcome))
        if counter is None:
            counter = self._counted[upstream, outcome] = self.calls.labels(upstream, outcome)
        counter.inc()
        timer = self._timed.get(upstream)
        if timer is None:
            timer = self._timed[upstream] = self.latency.labels(upstream)
        timer.observe(seconds)


class Gateway:
    """ASGI app: ``create_gateway(...)``; serve with any ASGI server with lifespan on (the CLI uses uvicorn)."""

    def __init__(
        self,
        server: ServerConfig,
        upstreams: Sequence[UpstreamConfig],
        *,
        store: EventStore | None = None,
        verifier: TokenVerifier | None = None,
        lenient_config: bool = False,
    ) -> None:
        self.registry = ToolRegistry()
        self.configs = {u.name: u for u in upstreams}
        self.upstreams: dict[str, HttpUpstream | StdioUpstream] = {u.name: open_upstream(u) for u in upstreams}
        self.verdicts = Verdicts(self.configs, lenient=lenient_config)
        """Each upstream's configuration checked against its listings (:mod:`.vetting`): what it is exposed under."""
        self.catalog = Catalog(canonical_resource(server.canonical_uri), self.configs, self.upstreams, self.verdicts)
        # Its tools change with its upstreams': clients are told (``tools.listChanged``, both eras). Its prompts
        # and resources are listed anew on every list: there is no change to announce.
        capabilities: dict[str, Any] = {"tools": {"listChanged": True}}
        capabilities |= {kind: {"listChanged": False} for kind in ("prompts", "resources") if self.catalog.offers(kind)}
        if self.catalog.offers("prompts") or self.catalog.offers("resources"):
            capabilities["completions"] = {}
        self.app = create_app(
            server,
            self.registry,
            store=store,
            verifier=verifier,
            methods=self.catalog.methods(),
            capabilities=capabilities,
            method_tags=self.catalog.tags(),
            method_scopes=self.catalog.scopes(),
        )
        self.state = self.app.state
        self.exposed: dict[str, ExposedTool] = {}
        self.metrics = _Metrics(self.app)
        self._keepers: set[asyncio.Task[None]] = set()
        self.app.readiness_checks["upstreams"] = self.readiness
        for name, upstream in self.upstreams.items():
            if isinstance(upstream, StdioUpstream):
                upstream.on_restart = self._restarted(upstream)
            upstream.on_reachability = self._reachability(name)
            self.metrics.up.labels(name).set(0)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await run_lifespan(receive, send, self.startup, self.shutdown, (*STARTUP_FAILURES, GatewayConfigError))
        else:
            await self.app(scope, receive, send)

    async def startup(self) -> None:
        """The server first (store, keys), then every upstream once; one that is down is retried in the background."""
        await self.app.startup()
        names = list(self.upstreams)
        outcomes = await asyncio.gather(*(self._connect(name) for name in names), return_exceptions=True)
        for name, outcome in zip(names, outcomes, strict=True):
            if isinstance(outcome, BaseException):
                if not isinstance(outcome, UpstreamFailure):
                    raise outcome
                log.error("upstream %s is not available yet (%s); retrying in the background", name, outcome.detail)
                task = asyncio.create_task(self._keep_trying(name))
                self._keepers.add(task)
                task.add_done_callback(self._keepers.discard)

    async def shutdown(self) -> None:
        for task in list(self._keepers):
            task.cancel()
        await self.app.shutdown()  # running calls end (execution lost) before their upstreams go
        for upstream in self.upstreams.values():
            await upstream.close()

    def _restarted(self, upstream: StdioUpstream) -> Callable[[], None]:
        restarts = self.metrics.restarts.labels(upstream.name)

        def restarted() -> None:
            restarts.inc()
            self.metrics.speaks(upstream)  # a child whose predecessor's era failed it was probed again

        return restarted

    def _reachability(self, name: str) -> Callable[[bool, str], None]:
        """``upstream_up`` follows what the upstream's probes, streams and calls find, not only its first connect."""
        up = self.metrics.up.labels(name)

        def changed(reachable: bool, why: str) -> None:
            up.set(1 if reachable else 0)
            log_decision("upstream_reachable" if reachable else "upstream_unreachable", upstream=name, why=why)

        return changed

    def readiness(self) -> str:
        """``/readyz``'s upstreams check: ``ok`` when every upstream is up and its configuration checked out
        against its listing, else which are not and why (a probe routes no traffic to a gateway whose tools are
        missing or failing)."""
        problems = [
            f"{name} {'down' if not upstream.up else 'not exposed: its configuration does not check out'}"
            for name, upstream in self.upstreams.items()
            if not upstream.up or not self.verdicts.exposed(name)
        ]
        return "ok" if not problems else "; ".join(problems)

    async def _connect(self, name: str) -> None:
        upstream = self.upstreams[name]
        await upstream.start(lambda: self._register(name))
        self.metrics.speaks(upstream)
        await self.catalog.check(name)  # its prompt and resource names too, before anything of it is exposed
        self._register(name)

    async def _keep_trying(self, name: str) -> None:
        attempt = 0
        while True:
            attempt += 1
            await asyncio.sleep(min(RECONNECT_MAX_SECONDS, 0.5 * 2**attempt))
            try:
                await self._connect(name)
            except UpstreamFailure as exc:
                log.warning("upstream %s still not available: %s", name, exc.detail)
                continue
            log_decision("upstream_connected", upstream=name, attempts=attempt + 1)
            return

    def _register(self, name: str) -> None:
        """(Re)build ``name``'s part of the table from its current tool list, checked against its configuration
        (withheld while that names what the list lacks, unless lenient), then republish the server's tools."""
        for exposed in [e for e in self.exposed.values() if e.upstream == name]:
            self.registry.remove(exposed.name)
            del self.exposed[exposed.name]
        upstream = self.upstreams[name]
        tools = upstream.tools()
        self.verdicts.tools_listed(name, {tool.name for tool in tools})
        config = self.verdicts.effective(name)
        for exposed in expose(config, tools, taken=self.exposed) if config is not None else ():
            annotations = dict(exposed.tool.annotations)
            if exposed.idempotent:
                annotations["idempotentHint"] = True
            self.registry.add_raw(
                exposed.name,
                self._handler(exposed),
                dict(exposed.tool.input_schema),
                description=exposed.tool.description,
                annotations=annotations,
                scopes=exposed.scopes,
                # What may not run twice must outlive its request: 2026-07-28 clients get it as a task.
                task=None if exposed.idempotent else "optional",
                # A stdio child is not trusted to: a gateway's restart brings a new child, its keys gone.
                dedups_keys=upstream.dedups_keys if isinstance(upstream, HttpUpstream) else None,
            )
            self.exposed[exposed.name] = exposed
        self.app.tools_changed()
        log_decision(
            "upstream_tools", upstream=name, exposed=sorted(e.name for e in self.exposed.values() if e.upstream == name)
        )

    def _handler(self, exposed: ExposedTool) -> RawToolHandler:
        async def run(ctx: ToolContext, arguments: dict[str, Any]) -> ToolReturn:
            return await self._call(exposed, ctx, arguments)

        return run

    async def _call(self, exposed: ExposedTool, ctx: ToolContext, arguments: dict[str, Any]) -> ToolReturn:
        """The upstream call in a client span of its own: the upstream request carries its trace context (our
        clients write it into ``_meta``), so the upstream's spans join the caller's trace."""
        upstream = exposed.upstream
        named = {
            "mcp.method.name": "tools/call",
            "gen_ai.tool.name": exposed.tool.name,
            "mcp_lossless.upstream": upstream,
        }
        with tracing.span(f"tools/call {exposed.tool.name}", named, kind="client"):
            return await self._call_upstream(exposed, ctx, arguments)

    async def _call_upstream(self, exposed: ExposedTool, ctx: ToolContext, arguments: dict[str, Any]) -> ToolReturn:
        name = exposed.upstream
        upstream: Upstream = self.upstreams[name]
        started = time.perf_counter()
        outcome = "ok"
        try:
            key = None if ctx.idempotency_key is None else upstream_key(ctx.principal, ctx.idempotency_key)
            result = await upstream.call(exposed.tool.name, arguments, ctx, idempotent=exposed.idempotent, key=key)
            if result.get("isError") is True:
                outcome = "tool_error"
            return result
        except UpstreamRpcError as exc:
            outcome = "rpc_error"
            raise MethodError(exc.code, exc.message, exc.data) from None
        except UpstreamFailure as exc:
            outcome = exc.reason
            raise _as_method_error(name, exc, ctx.request_id) from None
        except asyncio.CancelledError:
            outcome = "cancelled"
            raise
        except InputRequired:
            outcome = "input_required"
            if exposed.idempotent:
                raise  # the client's round runs the call again, its answer given: safe for this tool
            raise MethodError(
                errors.MISSING_REQUIRED_CLIENT_CAPABILITY,
                f"{exposed.name} asks for input, and a tool that may not run twice gets it in a task only",
                extension_required(),
            ) from None
        finally:
            seconds = time.perf_counter() - started
            self.metrics.called(name, outcome, seconds)
            principal = ctx.principal
            log_decision(
                "upstream_call",
                upstream=name,
                tool=exposed.tool.name,
                exposed=exposed.name,
                outcome=outcome,
                seconds=round(seconds, 4),
                issuer=principal.issuer,
                subject=principal.subject,
                client_id=principal.client_id,
            )


def _as_method_error(upstream: str, failure: UpstreamFailure, request_id: str | int) -> MethodError:
    if failure.reason == "execution_lost":
        return MethodError(
            errors.EXECUTION_LOST,
            f"execution lost upstream ({upstream}): {failure.detail}",
            {"reason": "execution_lost", "requestId": request_id, "resumable": False, "upstream": upstream},
        )
    return MethodError(
        errors.UPSTREAM_FAILED,
        f"upstream {upstream}: {failure.reason}: {failure.detail}",
        {"reason": failure.reason, "upstream": upstream, "mayHaveRun": failure.may_have_run},
    )


def create_gateway(
    server: ServerConfig,
    upstreams: Sequence[UpstreamConfig],
    *,
    store: EventStore | None = None,
    verifier: TokenVerifier | None = None,
    lenient_config: bool = False,
) -> Gateway:
    return Gateway(server, upstreams, store=store, verifier=verifier, lenient_config=lenient_config)
