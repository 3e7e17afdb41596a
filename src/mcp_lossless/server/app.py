"""The ASGI application: the MCP endpoint, protected resource metadata, metrics and the dev AS, composed."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

import httpx

from ..asgi import HeaderIndex, Receive, Scope, Send, headers, respond, respond_json, run_lifespan
from ..core.resources import canonical_resource
from ..devauth.server import DevAuthServer
from ..stores import EventStore, StoreUnavailable, TaskStore, open_store, task_store_beside
from . import metadata
from .auth import (
    INTROSPECTION_AUTH_METHODS,
    PROFILES,
    DiscoveryError,
    IntrospectionVerifier,
    JwtVerifier,
    RemoteJwks,
    RoutingVerifier,
    StaticJwks,
    TokenVerifier,
    discover_jwks_uri,
)
from .config import LOOPBACK_HOSTS, ServerConfig
from .demo import demo_tools
from .errors import ServerError
from .modern import ModernLeg
from .observability import log_decision, now
from .state import ServerState
from .tools import MethodHandler, MethodTags, ToolRegistry
from .transport import Transport, rpc_error

log = logging.getLogger("mcp_lossless.app")
_VERDICTS_KEPT = 256


def _host_of(value: str) -> str:
    """``host`` of a ``Host`` header value or an origin URL, without port or brackets."""
    netloc = urlsplit(value).netloc if "://" in value else value
    if netloc.startswith("["):
        return netloc[1 : netloc.find("]")]
    return netloc.rsplit(":", 1)[0] if netloc.count(":") == 1 else netloc


NOT_STARTED = (
    "mcp-lossless app not started: its lifespan did not run. Mounted in Starlette or FastAPI, pass "
    "lifespan=app.lifespan (or enter `async with app.lifespan():` in your own); see docs/deploy.md"
)

READINESS_TIMEOUT = 2.0
"""Seconds ``/readyz`` waits for the store's answer: a probe must answer well within a prober's own timeout."""
READINESS_PROBE = "readyz-probe"
"""The session id ``/readyz`` reads: no session has it (ids are random keys), so the read is cheap, finds nothing,
and changes nothing, yet is a real round trip to the store."""

STARTUP_FAILURES = (ServerError, StoreUnavailable)
"""Start-up failures the message explains whole (an issuer without metadata, a store that will not open):
logged without a traceback."""


class LosslessApp:
    """Build with :func:`create_app`; serve with any ASGI server (the CLI uses uvicorn).

    The server must be started before it serves (the store opens, the event-id secret loads): an ASGI server
    does it through the lifespan protocol; an app that mounts this one (Starlette, FastAPI: a mounted app
    gets no lifespan events) passes :meth:`lifespan` as its own. Until then every request gets a 503 that
    says so.
    """

    def __init__(self, state: ServerState, dev_as: DevAuthServer | None, modern: ModernLeg) -> None:
        self.state = state
        self.config = state.config
        self.modern = modern
        self.transport = Transport(state, modern)
        self._serve_endpoint = self.transport.__call__
        """The transport's entry, bound once: calling the instance looks ``__call__`` up and binds it each time."""
        self.dev_as = dev_as
        self._endpoint = (self.config.path, self.config.path + "/")
        """The MCP endpoint's paths, with and without a trailing slash."""
        self._prm = {metadata.metadata_path(r): r for r in state.resources()}
        self._sweeper: asyncio.Task[None] | None = None
        self._http: httpx.AsyncClient | None = None
        self._verdicts: dict[tuple[bytes | None, bytes | None], str | None] = {}
        self._announcing: set[asyncio.Task[None]] = set()
        self.started = False
        self.readiness_checks: dict[str, Callable[[], str]] = {}
        """More checks of ``/readyz`` by name (the gateway's upstreams): each says ``ok`` or what is wrong."""

    @contextlib.asynccontextmanager
    async def lifespan(self, _app: object = None) -> AsyncIterator[None]:
        """Start the server for the duration of the block: ``Starlette(..., lifespan=app.lifespan)``."""
        await self.startup()
        try:
            yield
        finally:
            await self.shutdown()

    def tools_changed(self) -> None:
        """The registry changed (a gateway's upstream): re-derive what is published from it; when the server
        announces ``tools.listChanged``, tell its clients (legacy sessions on their standalone GET stream,
        2026-07-28 clients on their ``subscriptions/listen`` streams)."""
        self.state.index_tools()
        self._prm = {metadata.metadata_path(r): r for r in self.state.resources()}
        if self.started and self.state.capabilities.get("tools", {}).get("listChanged") is True:
            self.modern.tools_changed()
            task = asyncio.get_running_loop().create_task(self.transport.announce("notifications/tools/list_changed"))
            self._announcing.add(task)
            task.add_done_callback(self._announcing.discard)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if not self.started:
                await respond_json(send, 503, {"error": "not_started", "error_description": NOT_STARTED})
                return
            try:
                path: str = scope["path"]
                if path in self._endpoint:  # the MCP endpoint, nearly every request: no step between
                    await self._endpoint_request(scope, receive, send)
                else:
                    await self._http_request(path, scope, receive, send)
            except Exception:
                # Last resort: a bug must not hand the client a traceback; the fuzz tests keep this path cold.
                log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
                with contextlib.suppress(Exception):
                    await respond_json(send, 500, rpc_error(-32603, "internal error"))
        elif kind == "lifespan":
            await run_lifespan(receive, send, self.startup, self.shutdown, STARTUP_FAILURES)

    def _endpoint_request(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The MCP endpoint's request: the transport's own coroutine, awaited by the caller (no coroutine of this
        step in between), or the 403 of a foreign Origin or Host."""
        index = headers(scope)  # once, at the entry: the transport and its checks read this index
        problem = self._rebinding_problem(index)
        if problem is None:
            return self._serve_endpoint(scope, index, receive, send)
        return respond_json(send, 403, rpc_error(-32600, problem))

    async def _http_request(self, path: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Every path but the MCP endpoint's: metadata, metrics, health, the dev AS, else 404."""
        if path in self._prm and scope["method"] in ("GET", "HEAD"):
            resource = self._prm[path]
            await respond_json(
                send,
                200,
                metadata.metadata_document(
                    resource,
                    self.state.authorization_servers,
                    f"mcp-lossless {resource}",
                    self.state.scopes_for.get(resource, ()),
                    self.state.dpop_metadata,
                ),
                [(b"access-control-allow-origin", b"*")],
            )
        elif path == metadata.PRM_WELL_KNOWN and scope["method"] == "GET":
            await respond_json(
                send,
                200,
                metadata.metadata_document(
                    self.state.canonical,
                    self.state.authorization_servers,
                    "mcp-lossless",
                    self.state.scopes_for[self.state.canonical],
                    self.state.dpop_metadata,
                ),
            )
        elif path == "/metrics":
            await self._metrics(scope, send)
        elif path in ("/healthz", "/readyz") and scope["method"] in ("GET", "HEAD"):
            await self._health(path, scope, send)
        elif self.dev_as is not None and self.dev_as.handles(path):
            await self.dev_as(scope, receive, send)
        else:
            await respond_json(send, 404, {"error": "not_found", "error_description": f"no resource at {path}"})

    async def _metrics(self, scope: Scope, send: Send) -> None:
        """Counters and gauges for the operator: under the endpoint's Host/Origin check, and behind a bearer secret
        when one is configured (they tell sessions, resumes and refusals apart)."""
        problem = self._rebinding_problem(headers(scope))
        if problem is not None:
            await respond_json(send, 403, {"error": "forbidden", "error_description": problem})
            return
        secret = self.config.metrics_token
        if secret is not None:
            given = (headers(scope).get(b"authorization") or b"").removeprefix(b"Bearer ").removeprefix(b"bearer ")
            if not hmac.compare_digest(given, secret.encode()):
                await respond_json(
                    send,
                    401,
                    {"error": "invalid_token", "error_description": "/metrics requires its bearer token"},
                    [(b"www-authenticate", b'Bearer realm="metrics"')],
                )
                return
        await respond(send, 200, self.state.metrics.render(), b"text/plain; version=0.0.4")

    async def _health(self, path: str, scope: Scope, send: Send) -> None:
        """``/healthz``: the process serves (liveness). ``/readyz``: it can serve calls now (readiness): the store
        answers a read within :data:`READINESS_TIMEOUT` and the keys are loaded (the event-id secret, read from the
        store, and the token verifier), else 503 naming each check that failed. Under the Host/Origin check of the
        MCP endpoint, as ``/metrics``; no bearer: probes send none, and the answers tell nothing about calls."""
        problem = self._rebinding_problem(headers(scope))
        if problem is not None:
            await respond_json(send, 403, {"error": "forbidden", "error_description": problem})
            return
        if path == "/healthz":
            await respond_json(send, 200, {"status": "ok"})
            return
        checks = {"store": await self._store_check(), "keys": "ok" if self.state.keys_loaded else "not loaded"}
        checks |= {name: check() for name, check in self.readiness_checks.items()}
        ready = all(outcome == "ok" for outcome in checks.values())
        await respond_json(send, 200 if ready else 503, {"status": "ready" if ready else "not_ready", "checks": checks})

    async def _store_check(self) -> str:
        try:
            await asyncio.wait_for(self.state.store.get_session(READINESS_PROBE), READINESS_TIMEOUT)
        except StoreUnavailable as exc:
            return str(exc)
        except TimeoutError:
            return f"no answer within {READINESS_TIMEOUT:g} s"
        return "ok"

    def _rebinding_problem(self, index: HeaderIndex) -> str | None:
        """DNS-rebinding protection: Origin (and, on loopback, Host) must be ours (MCP transport MUST), judged
        from the request's header ``index``.

        Clients send the same pair on every request, so verdicts are remembered (a bounded table).
        """
        key = (index.get(b"origin"), index.get(b"host"))
        verdicts = self._verdicts
        if key in verdicts:
            return verdicts[key]
        if len(verdicts) >= _VERDICTS_KEPT:
            verdicts.clear()
        origin, host = (None if value is None else value.decode("latin-1") for value in key)
        verdict = verdicts[key] = self._judge(origin, host)
        return verdict

    def _judge(self, origin: str | None, host: str | None) -> str | None:
        config = self.config
        if origin is not None and origin != "null":
            allowed = (
                origin in config.allowed_origins
                or origin.rstrip("/") == config.base_url
                or (config.loopback and _host_of(origin) in LOOPBACK_HOSTS)
            )
            if not allowed:
                return f"origin {origin!r} is not allowed"
        if config.loopback and config.public_url is None and host is not None and _host_of(host) not in LOOPBACK_HOSTS:
            return f"host {host!r} is not allowed for a loopback server"
        return None

    async def startup(self) -> None:
        state = self.state
        await state.start()
        await state.store.register_instance(state.instance)  # replicas see this process alive by its lease
        await self.modern.open()
        issuer = self.config.issuer
        if state.verifier is None and issuer is not None and issuer != "dev":
            self._http = httpx.AsyncClient(timeout=10)
            state.verifier = await self._provider_verifier(issuer, self._http)
        self._sweeper = asyncio.create_task(self._sweep())
        self.started = True

    async def _provider_verifier(self, issuer: str, http: httpx.AsyncClient) -> TokenVerifier:
        """JWTs checked against the issuer's JWKS, shaped as ``token_profile`` says; opaque tokens introspected
        when an introspection endpoint is configured (then an issuer without a JWKS is fine)."""
        config = self.config
        profile = PROFILES[config.token_profile]
        aliases = {config.token_audience: self.state.canonical} if config.token_audience else {}
        opaque = None
        if config.introspection_endpoint is not None:
            assert config.introspection_client_id is not None and config.introspection_client_secret is not None
            opaque = IntrospectionVerifier(
                issuer,
                config.introspection_endpoint,
                config.introspection_client_id,
                config.introspection_client_secret,
                http=http,
                auth_method=config.introspection_auth,
                profile=profile,
                audience_aliases=aliases,
                leeway=config.leeway_seconds,
                cache_seconds=config.introspection_cache_seconds,
            )
        try:
            jwks_uri = await discover_jwks_uri(issuer, http)
        except DiscoveryError:
            if opaque is None:
                raise
            log.warning("no JWKS for %s: every token goes to introspection", issuer)
            return opaque
        jwt = JwtVerifier(
            issuer, RemoteJwks(jwks_uri, http=http), leeway=config.leeway_seconds, profile=profile,
            audience_aliases=aliases,
        )  # fmt: skip
        return jwt if opaque is None else RoutingVerifier(jwt, opaque)

    async def drain(self, seconds: float) -> None:
        """SIGTERM, once the server accepts no more connections: running calls and tasks get ``seconds`` to finish
        (requests on connections still open, a task's poll among them, are still answered); then each one left
        ends as execution lost — on its stream, or recorded for its poll — and the sessions' streams end, so that
        every client has its one outcome and no stream is cut when the process exits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        sessions = self.state.sessions
        log_decision(
            "draining", running=sessions.running_total(), tasks=len(self.modern.tasks.running), seconds=seconds
        )
        while (running := self._running()) and loop.time() < deadline:
            await asyncio.wait(running, timeout=deadline - loop.time())  # then again: calls may have started since
        left = sessions.running_total()
        log_decision("drained", execution_lost=left, seconds=round(seconds - max(0.0, deadline - loop.time()), 3))
        await self.modern.end_running()
        for session in sessions.all():
            await session.close("shutdown")

    def _running(self) -> set[asyncio.Task[Any]]:
        """The tasks of every call and task at work here: each session's, the modern leg's in-request, keyed (its
        client may have left) and tasks."""
        legacy = {task for session in self.state.sessions.all() for task in session.tasks.values()}
        return legacy | self.modern.in_request | self.modern.keyed.running | set(self.modern.tasks.running.values())

    async def shutdown(self) -> None:
        self.started = False
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        for session in self.state.sessions.all():
            await session.close("shutdown")
        await self.modern.close()
        await self.state.store.close()
        if self._http is not None:
            await self._http.aclose()

    async def _sweep(self) -> None:
        idle = self.config.session_idle_seconds
        while True:
            await asyncio.sleep(min(60.0, idle / 4))
            expired = await self.state.sessions.expire(now() - idle)
            if expired:
                log_decision("sessions_expired", count=expired)
                self.state.metrics.sessions.set(len(self.state.sessions))


def create_app(
    config: ServerConfig,
    tools: ToolRegistry | None = None,
    *,
    store: EventStore | None = None,
    verifier: TokenVerifier | None = None,
    methods: Mapping[str, MethodHandler] | None = None,
    capabilities: Mapping[str, Any] | None = None,
    task_store: TaskStore | None = None,
    method_tags: Mapping[str, MethodTags] | None = None,
    method_scopes: Iterable[str] = (),
) -> LosslessApp:
    """The server for ``config``. ``issuer="dev"`` mounts the embedded authorization server under /dev-as.

    ``method_tags``: what a token needs for a request of one of ``methods`` (:data:`.tools.MethodTags`);
    ``method_scopes``: the scopes those may name, published in the server's protected resource metadata.

    Tasks (2026-07-28) are kept beside the events (:func:`~mcp_lossless.stores.open.task_store_beside`)
    unless ``task_store`` says otherwise.
    """
    if config.token_profile not in PROFILES:
        raise ValueError(f"token_profile {config.token_profile!r} is not one of {', '.join(PROFILES)}")
    if config.introspection_endpoint is not None and not (
        config.introspection_client_id and config.introspection_client_secret
    ):
        raise ValueError("introspection_endpoint needs introspection_client_id and introspection_client_secret")
    if config.introspection_auth not in INTROSPECTION_AUTH_METHODS:
        raise ValueError(f"introspection_auth {config.introspection_auth!r} is not one of {INTROSPECTION_AUTH_METHODS}")
    registry = tools if tools is not None else demo_tools()
    store = store if store is not None else open_store(config.store)
    dev_as = None
    servers: list[str] = []
    if config.issuer == "dev":
        from ..devauth.keys import SigningKeys

        canonical = canonical_resource(config.canonical_uri)

        def tool_resources() -> Collection[str]:
            return state.tool_resource.values()  # read per request: a gateway's tools change

        dev_as = DevAuthServer(
            config.dev_issuer,
            resources=tool_resources,
            aggregate=canonical,
            clients=config.dev_clients,
            auto_approve=config.auto_approve,
            least_privilege=config.least_privilege,
            single_audience=config.single_audience,
            token_ttl=config.token_ttl,
            signing=SigningKeys.shared(config.dev_keys) if config.dev_keys else None,
            dpop_nonce=config.dpop_nonce,
            dpop_window=config.dpop_window_seconds,
        )
        if verifier is None:
            verifier = JwtVerifier(config.dev_issuer, StaticJwks(dev_as.keys), leeway=config.leeway_seconds)
        servers = [config.dev_issuer]
    elif config.issuer is not None:
        servers = [config.issuer]
    state = ServerState(config, registry, store, verifier, servers, methods, capabilities, method_tags, method_scopes)
    modern = ModernLeg(state, task_store if task_store is not None else task_store_beside(store))
    return LosslessApp(state, dev_as, modern)
