"""A Streamable HTTP upstream, reached through this project's own client (one pooled session per upstream).

The client already does what "no silent loss from upstream" needs: a broken stream is resumed with the
upstream's own ``Last-Event-ID``; an answer that cannot be recovered is re-issued under a new id when the
tool is idempotent (annotated, or listed in the config) and otherwise fails as may-have-run; a lost session
is re-established; the deadline ends the call and cancels it upstream. This module maps those outcomes onto
:class:`~.upstream.UpstreamFailure` and forwards progress to the gateway's client.

The upstream gets the gateway's own credentials for it (``auth`` in the config), never the client's token; with
``auth.exchange``, a token exchanged for the caller's (:mod:`.exchange`), asked for the scopes the tool, prompt or
resource needs.

An upstream's requests for input (elicitation, sampling, roots) are asked of the calling client in its era,
through the call's :class:`~.upstream.Reporter`, as a stdio child's are (docs/decisions/0019): the call brings
input handlers of its own (``call_tool(input_handlers=)``), which hand each request to the call's task, and that
task asks the reporter and hands the answer back. A legacy upstream's request names its call by the stream it
arrives on (the session knows it); a 2026-07-28 upstream's ``input_required`` rounds and tasks waiting for input
are answered by the modern client from the same handlers. The capabilities are declared to the upstream: a
legacy session offers elicitation and sampling (not the roots: a session's roots are asked at any time, and
one session serves many clients), a modern call all three.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Literal

import httpx

from ..client import (
    Auth,
    AuthorizationFailed,
    BearerToken,
    CallMayHaveRun,
    Client,
    ClientClosed,
    ConnectionFailed,
    DeadlineExceeded,
    McpClientError,
    OAuth,
    ProgressUpdate,
    RemoteError,
    RequestRejected,
    ToolFailed,
    ToolResult,
)
from ..client.errors import InputUnanswered, describe_failure
from ..client.handlers import InputHandler, InputRefused
from ..client.modern import ModernClient, NotModern, TaskUpdate
from ..client.transport import Backoff
from ..core import errors, idempotency
from .config import BearerFromEnv, ClientCredentialsFromEnv, TokenExchangeFromEnv, UpstreamConfig
from .exchange import ExchangeRefused, TokenExchange, needing
from .pool import UpstreamPool
from .stdio_era import INPUT_METHODS, LEGACY_INPUT_METHODS
from .upstream import (
    CLIENT_INFO,
    CatalogRead,
    FailureReason,
    ListKind,
    Relay,
    Reporter,
    UpstreamFailure,
    UpstreamRpcError,
    UpstreamTool,
    ask_client,
    counted,
)

log = logging.getLogger("mcp_lossless.gateway")
BACKOFF = Backoff(initial=0.2, maximum=2.0)
"""Reconnects and re-issues to an upstream that is coming back: prompt, since each call has a deadline."""
WATCH_MAX_SECONDS = 30.0
"""Longest pause before the list-change stream is opened again."""
RELIST_PROBE_SECONDS = 5.0
"""A probe (one ``tools/list``) of an upstream that may be down: longer than this, and it counts as down."""
PROBE_MAX_PAUSE = 5.0
"""Longest pause between background probes of a down upstream: it is seen back within this (or at once, by the
first call after it is back: a call to a down upstream probes it, unless a probe failed moments ago)."""
PROBE_MIN_PAUSE = 0.25
"""A call to a down upstream whose last probe failed less than this ago is answered at once, without probing
again: a burst of calls makes one connection attempt, not one each."""
MODERN_INPUT_METHODS = INPUT_METHODS
"""What a 2026-07-28 upstream may ask in a call's rounds or task: the three, each asked of the call's client."""
UPSTREAM_LOG_LEVEL = "debug"
"""What a 2026-07-28 upstream is asked to log on a call's stream: every level (as a legacy upstream sends them);
the gateway's server passes them on to its own clients as it does its own tools' logs."""


async def _listed(client: Client | ModernClient) -> list[UpstreamTool]:
    return [
        UpstreamTool(t.name, t.description or "", dict(t.input_schema), dict(t.annotations))
        for t in await client.list_tools()
    ]


class _NoUpstreamAuth(Auth):
    """An upstream configured without ``auth``: a challenge from it names the setting that is missing."""

    def __init__(self, name: str) -> None:
        self.name = name

    async def reauthorize(self, resources: frozenset[str], scopes: frozenset[str] = frozenset()) -> None:
        raise AuthorizationFailed(
            f"upstream {self.name!r} requires authorization and its [[upstream]] entry has no "
            "auth = { bearer_env = ... } or { client_id = ..., secret_env = ... }"
        )


def client_auth(config: UpstreamConfig) -> Auth:
    """The gateway's own credentials for this upstream (read from the environment at start)."""
    auth = config.auth
    if isinstance(auth, BearerFromEnv):
        return BearerToken(auth.token())
    # No DPoP: upstream requests go through the aiohttp pool, which cannot add a proof to each request.
    if isinstance(auth, ClientCredentialsFromEnv):
        return OAuth(auth.client_id, auth.secret(), scope=auth.scope, dpop=False)
    if isinstance(auth, TokenExchangeFromEnv):
        own = OAuth(auth.credentials.client_id, auth.credentials.secret(), dpop=False)
        return TokenExchange(config.name, own, audience=auth.audience, clock=time.time)
    return _NoUpstreamAuth(config.name)


def _failure(exc: McpClientError) -> UpstreamFailure:
    reason: FailureReason
    if isinstance(exc, CallMayHaveRun):
        reason, ran = "execution_lost", True
    elif isinstance(exc, DeadlineExceeded):
        reason, ran = "deadline", True
    elif isinstance(exc, ConnectionFailed):
        reason, ran = "unreachable", False
    elif isinstance(exc, RequestRejected):
        reason, ran = "rejected", False
    elif isinstance(exc, ExchangeRefused):
        reason, ran = "exchange_refused", False
    elif isinstance(exc, AuthorizationFailed) and isinstance(
        exc.__cause__, httpx.NetworkError | httpx.TimeoutException
    ):
        reason, ran = "unreachable", False  # its token endpoint could not be reached (the upstream's own AS, down too)
    elif isinstance(exc, AuthorizationFailed):
        reason, ran = "unauthorized", False
    elif isinstance(exc, ClientClosed):
        reason, ran = "closed", True
    else:  # ProtocolViolation and anything the client may add: the call may well have run
        reason, ran = "protocol", True
    return UpstreamFailure(reason, exc.reason, may_have_run=ran)


InputAsk = tuple[str, dict[str, Any], "asyncio.Future[dict[str, Any]]"]
"""One request for input an upstream made during a call: its method, params, and where its answer goes."""


def _handlers(methods: frozenset[str], asks: asyncio.Queue[InputAsk]) -> dict[str, InputHandler]:
    """A call's input handlers: each request is queued for the call's own task, which asks the call's client
    (the session's tasks, where the client runs a handler, must not end the gateway's call themselves)."""

    def handler_of(method: str) -> InputHandler:
        async def handler(params: dict[str, Any]) -> dict[str, Any]:
            answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
            asks.put_nowait((method, params, answer))
            return await answer

        return handler

    return {method: handler_of(method) for method in sorted(methods)}


async def _forward(reporter: Reporter, ask: InputAsk) -> None:
    """One request for input, asked of the call's client in its era; its answer (or refusal) goes back. What ends
    the gateway's call instead (a round for a 2026-07-28 client, a cancel) is raised here, after the upstream's
    request is refused, so nothing waits for it."""
    method, params, answer = ask
    try:
        result = await ask_client(reporter, method, params)
    except InputRefused as refused:
        answer.set_exception(refused)
    except BaseException:
        if not answer.done():
            answer.set_exception(InputRefused(errors.INTERNAL_ERROR, "the gateway's call ended before its answer"))
        raise
    else:
        if not answer.done():
            answer.set_result(result)


async def _asking(call: Awaitable[ToolResult], asks: asyncio.Queue[InputAsk], reporter: Reporter) -> ToolResult:
    """``call``'s result, serving the requests for input it makes meanwhile from this (the gateway call's) task;
    when this task ends first, the upstream call is cancelled (the client tells the upstream)."""
    running = asyncio.ensure_future(call)
    try:
        while True:
            asked = asyncio.ensure_future(asks.get())
            try:
                await asyncio.wait((running, asked), return_when=asyncio.FIRST_COMPLETED)
            finally:
                if not asked.done():
                    asked.cancel()
            if running.done():
                if asked.done() and not asked.cancelled():
                    asks.put_nowait(asked.result())  # failed below with the rest: the call it was for is over
                return running.result()
            await _forward(reporter, asked.result())
    finally:
        if not running.done():
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        while not asks.empty():
            _, _, answer = asks.get_nowait()
            if not answer.done():
                answer.set_exception(InputRefused(errors.INTERNAL_ERROR, "the gateway's call ended before its answer"))


@contextlib.contextmanager
def _catalog_errors() -> Iterator[None]:
    """The one mapping of a catalog request's errors (listing, read), shared so both report them alike: nothing
    was run, so a transport error the client did not classify is not may-have-run, unlike a tool call's."""
    try:
        yield
    except RemoteError as exc:
        raise UpstreamRpcError(exc.code, exc.message, exc.data) from None
    except McpClientError as exc:
        raise _failure(exc) from None
    except httpx.TransportError as exc:
        raise UpstreamFailure("protocol", describe_failure(exc), may_have_run=False) from None


def _announces_list_changes(discovered: Mapping[str, Any]) -> bool:
    capabilities = discovered.get("capabilities")
    tools = capabilities.get("tools") if isinstance(capabilities, Mapping) else None
    return isinstance(tools, Mapping) and tools.get("listChanged") is True


class HttpUpstream:
    """Connections to one upstream over one pooled HTTP client, owned by a task of their own (so any task may
    start or close them). The era is negotiated at start (``era = "auto"``: ``server/discover`` first, the
    legacy handshake when the answer is not a modern one). A 2026-07-28 upstream is stateless: one client
    serves every call. A legacy one gets ``sessions`` sessions, and a call goes to the one with the fewest
    calls in flight: upstream servers serialize work per session (the official SDK's one-session throughput
    is well under half its 16-session one).

    The upstream's tool list is watched: on each session's standalone GET stream (legacy: a server announces
    a change on the session it happened in) or a ``subscriptions/listen`` stream (2026-07-28). A
    ``notifications/tools/list_changed`` there, and every (re)opening of such a stream (what was announced
    while it was down is gone), re-lists the tools; a list that differs is published. A 2026-07-28 upstream
    whose ``server/discover`` does not announce ``tools.listChanged`` is not watched: it would refuse the
    stream every time (and the gateway log it, and re-list, forever).
    """

    def __init__(self, config: UpstreamConfig) -> None:
        assert config.url is not None
        self.name = config.name
        self.config = config
        self.era: Literal["modern", "legacy"] | None = None
        """The era negotiated at the last start."""
        self._clients: list[Client | ModernClient] = []
        self._in_flight: list[int] = []
        self._owner: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._stale = asyncio.Event()
        self._tools: list[UpstreamTool] = []
        self._watched = True
        """Whether the upstream announces list changes (a 2026-07-28 one says so in ``server/discover``)."""
        self.up = False
        """Whether the upstream answered its last probe (or call): the circuit breaker. While it is down, a new call
        fails at once as ``unreachable`` (the documented -32045) instead of waiting its deadline for a connection."""
        self.on_reachability: Callable[[bool, str], None] = lambda up, why: None
        """Told each change of :attr:`up`, and why (the gateway's ``upstream_up`` gauge and log)."""
        self._why_down = "not connected"
        self._probing: asyncio.Future[bool] | None = None
        self._probed_at = -math.inf
        self._on_tools_changed: Callable[[], None] = lambda: None

    async def start(self, on_tools_changed: Callable[[], None]) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closed = asyncio.Event()
        self._owner = asyncio.create_task(self._own(ready, on_tools_changed))
        try:
            await ready
        except BaseException:
            await self.close()
            raise
        clients, tools = counted(len(self._clients), "client"), counted(len(self._tools), "tool")
        log.info("upstream %s: %s era, %s, %s", self.name, self.era, clients, tools)

    async def _own(self, ready: asyncio.Future[None], on_tools_changed: Callable[[], None]) -> None:
        config = self.config
        try:
            async with contextlib.AsyncExitStack() as stack:
                http = await stack.enter_async_context(
                    httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=300.0), follow_redirects=False)
                )
                pool = await stack.enter_async_context(UpstreamPool(max_connections=32 * config.sessions))
                clients = await self._connect(stack, http, pool)
                self._tools = (await asyncio.gather(*(_listed(c) for c in clients)))[0]  # each learns annotations
                self._clients, self._in_flight = clients, [0] * len(clients)
                self._on_tools_changed = on_tools_changed
                self._reachable(True, "connected")
                ready.set_result(None)
                watchers = [asyncio.create_task(self._watch(client)) for client in clients if self._watched]
                watchers.append(asyncio.create_task(self._refresh()))
                try:
                    await self._closed.wait()
                finally:
                    for watcher in watchers:
                        watcher.cancel()
                    if self._probing is not None:
                        self._probing.cancel()
                    await asyncio.gather(*watchers, return_exceptions=True)
        except McpClientError as exc:
            if not ready.done():
                ready.set_exception(_failure(exc))
        except httpx.TransportError as exc:  # the modern client's discovery and listing pass these on
            if not ready.done():
                ready.set_exception(UpstreamFailure("unreachable", describe_failure(exc), may_have_run=False))
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            self._clients, self._in_flight = [], []
            self._reachable(False, "closed")

    async def _connect(
        self, stack: contextlib.AsyncExitStack, http: httpx.AsyncClient, pool: UpstreamPool
    ) -> list[Client | ModernClient]:
        """The clients for the upstream's era: 2026-07-28 first unless the config says ``legacy``. Calls go over
        ``pool`` (aiohttp's: the upstream request is the gateway's hot path), OAuth over ``http``."""
        config = self.config
        assert config.url is not None
        self._watched = True
        if config.era != "legacy":
            modern = ModernClient(
                config.url,
                auth=client_auth(config),
                timeout=config.timeout,
                http=http,
                client_info=CLIENT_INFO,
                pool=pool,
            )
            await stack.enter_async_context(modern)
            try:
                discovered = await modern.discover()
            except NotModern as exc:
                if config.era == "modern":
                    raise UpstreamFailure("protocol", f"not a 2026-07-28 server: {exc}", may_have_run=False) from None
                log.info("upstream %s does not speak 2026-07-28 (%s); using the legacy handshake", self.name, exc)
            else:
                self.era = "modern"
                self._watched = _announces_list_changes(discovered)
                if not self._watched:
                    log.info("upstream %s announces no tool-list changes: its tools are listed once", self.name)
                return [modern]
        if isinstance(config.auth, TokenExchangeFromEnv):
            raise UpstreamFailure(
                "protocol",
                "auth.exchange needs a 2026-07-28 upstream: a legacy session is bound to the principal that opened it",
                may_have_run=False,
            )
        clients: list[Client | ModernClient] = []
        for _ in range(config.sessions):
            client = Client(
                config.url,
                auth=client_auth(config),
                timeout=config.timeout,
                backoff=BACKOFF,
                http=http,
                client_info=CLIENT_INFO,
                pool=pool,
                input_methods=LEGACY_INPUT_METHODS,  # each call brings its handlers: they ask its client
            )
            clients.append(await stack.enter_async_context(client))
        self.era = "legacy"
        return clients

    async def _watch(self, client: Client | ModernClient) -> None:
        """Keep a stream open on which the upstream announces list changes; each opening re-lists the tools."""
        attempt = 0

        def opened() -> None:
            nonlocal attempt
            attempt = 0
            self._stale.set()

        def message(note: Mapping[str, Any]) -> None:
            if note.get("method") == "notifications/tools/list_changed":
                self._stale.set()

        while True:
            try:
                if isinstance(client, ModernClient):
                    await client.listen({"toolsListChanged": True}, message, opened)
                else:
                    await client.listen(message, opened)
                detail = "the upstream ended it"
            except (McpClientError, httpx.TransportError) as exc:
                detail = describe_failure(exc)
            attempt += 1
            pause = min(WATCH_MAX_SECONDS, 0.25 * 2**attempt)
            log.info("upstream %s: list-change stream closed (%s); again in %.2g s", self.name, detail, pause)
            self._stale.set()  # a broken stream may be a dead upstream: probe it now
            await asyncio.sleep(pause)
            with contextlib.suppress(McpClientError, httpx.TransportError):
                await client.list_tools()  # a request: re-establishes a legacy session the upstream lost

    async def _refresh(self) -> None:
        """Re-list whenever the list may have changed (announcements coalesce, a stream broke), every
        ``relist_seconds`` when the upstream announces no changes, and while it is down, every few seconds: each
        re-listing is the breaker's probe (:meth:`_probe`)."""
        failed = 0
        while True:
            if not self.up:
                wait: float | None = min(PROBE_MAX_PAUSE, 0.25 * 2**failed)
            else:
                wait = None if self._watched else self.config.relist_seconds
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._stale.wait()
            self._stale.clear()
            failed = 0 if await asyncio.shield(self._probe()) else failed + 1

    def _probe(self) -> asyncio.Future[bool]:
        """One re-listing of the tools at a time, whoever asks (the refresher, calls to a down upstream): whether
        the upstream answered. An answer closes the breaker and publishes a list that differs (a restarted
        upstream may offer other tools); no answer within :data:`RELIST_PROBE_SECONDS` opens it."""
        if self._probing is None or self._probing.done():
            self._probing = asyncio.ensure_future(self._relist())
        return self._probing

    async def _relist(self) -> bool:
        self._probed_at = asyncio.get_running_loop().time()
        try:
            async with asyncio.timeout(RELIST_PROBE_SECONDS):
                try:
                    tools = await _listed(self._clients[0])
                except ConnectionFailed:
                    # Not sent: refused (down), or sent on a session the upstream no longer knows (restarted: it
                    # answered 404, and the client opens a new session for its next request). Once more tells which.
                    tools = await _listed(self._clients[0])
        except (McpClientError, httpx.TransportError, TimeoutError) as exc:
            timed_out = isinstance(exc, TimeoutError)
            self._reachable(False, f"no answer in {RELIST_PROBE_SECONDS:g} s" if timed_out else describe_failure(exc))
            return False
        self._reachable(True, "answered")
        if tools != self._tools:
            self._tools = tools
            log.info("upstream %s: its tool list changed", self.name)
            self._on_tools_changed()
        return True

    def _reachable(self, up: bool, why: str) -> None:
        if not up:
            self._why_down = why
        if up != self.up:
            self.up = up
            self.on_reachability(up, why)

    async def _admit(self) -> None:
        """The breaker: a call to a down upstream probes it first (half-open), unless a probe failed moments ago;
        still down, the call fails at once as ``unreachable``: nothing was sent, so it did not run."""
        if self.up:
            return
        if self._clients and asyncio.get_running_loop().time() - self._probed_at >= PROBE_MIN_PAUSE:
            await asyncio.shield(self._probe())
        if not self.up:
            raise UpstreamFailure("unreachable", f"upstream {self.name} is down ({self._why_down})", may_have_run=False)

    def tools(self) -> list[UpstreamTool]:
        return list(self._tools)

    def dedups_keys(self) -> bool:
        """Whether the upstream, as connected now, declares ``tools.idempotency`` on every session: then a call's
        key goes with it and the upstream's record answers a repeat (ADR 0033). ``False`` while not connected."""
        return bool(self._clients) and all(
            client.keyed if isinstance(client, ModernClient) else idempotency.declared(client.server.capabilities)
            for client in self._clients
        )

    async def call(
        self, tool: str, arguments: dict[str, Any], reporter: Reporter, *, idempotent: bool, key: str | None
    ) -> dict[str, Any]:
        if not self._clients:
            raise UpstreamFailure("unreachable", f"upstream {self.name} is not connected", may_have_run=False)
        await self._admit()
        index = min(range(len(self._in_flight)), key=self._in_flight.__getitem__)
        self._in_flight[index] += 1
        try:
            with needing(self.config.scopes_of(tool)):
                return await self._call(self._clients[index], tool, arguments, reporter, idempotent=idempotent, key=key)
        finally:
            if index < len(self._in_flight):
                self._in_flight[index] -= 1

    async def _call(
        self,
        client: Client | ModernClient,
        tool: str,
        arguments: dict[str, Any],
        reporter: Reporter,
        *,
        idempotent: bool,
        key: str | None,
    ) -> dict[str, Any]:
        """The client sends ``key`` only to an upstream declaring ``tools.idempotency`` (and, without one, a fresh
        key of its own there): every attempt below, and every re-issue of the client's, is under the same key."""
        relay = Relay()

        def progress(update: ProgressUpdate) -> None:
            relay.put(lambda: reporter.report_progress(update.progress, update.total, update.message))

        def message(note: Mapping[str, Any]) -> None:
            params = note.get("params")
            if note.get("method") == "notifications/message" and isinstance(params, dict) and "level" in params:
                level, data, logger = str(params["level"]), params.get("data"), params.get("logger")
                relay.put(lambda: reporter.log(level, data, logger if isinstance(logger, str) else None))

        described = 0

        def task_progress(update: TaskUpdate) -> None:
            """A task upstream has no progress notifications: its status message is its progress."""
            nonlocal described
            if update.status == "working" and update.message:
                described += 1
                step, message = described, update.message
                relay.put(lambda: reporter.report_progress(step, None, message))

        on_progress = progress if reporter.wants_progress else None
        on_task_update = task_progress if reporter.wants_progress else None
        asks: asyncio.Queue[InputAsk] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout
        for attempt in itertools.count():
            try:
                async with relay:
                    timeout = max(0.0, deadline - loop.time())
                    if isinstance(client, ModernClient):
                        call = client.call_tool(
                            tool,
                            arguments,
                            on_progress=on_progress,
                            timeout=timeout,
                            reissue=idempotent or None,
                            idempotency_key=key,
                            on_task_update=on_task_update,
                            on_message=message,
                            log_level=UPSTREAM_LOG_LEVEL,
                            input_handlers=_handlers(MODERN_INPUT_METHODS, asks),
                        )
                    else:
                        call = client.call_tool(
                            tool,
                            arguments,
                            on_progress=on_progress,
                            on_message=message,
                            timeout=timeout,
                            reissue=idempotent or None,
                            idempotency_key=key,
                            input_handlers=_handlers(LEGACY_INPUT_METHODS, asks),
                        )
                    result = await _asking(call, asks, reporter)
            except ToolFailed as exc:
                return dict(exc.result.raw)
            except RemoteError as exc:
                raise UpstreamRpcError(exc.code, exc.message, exc.data) from None
            except ConnectionFailed as exc:
                # Its last send never arrived (for a call that is not idempotent, its only one): wait for the
                # upstream to come back, within the call's deadline. Calls after it fail at once (the breaker).
                self._reachable(False, describe_failure(exc))
                self._stale.set()
                pause = BACKOFF.delay(attempt, None, 0.0)
                if loop.time() + pause >= deadline:
                    raise _failure(exc) from None
                log.info("upstream %s unreachable for %s; trying again in %.2g s", self.name, tool, pause)
                await asyncio.sleep(pause)
                relay = Relay()
                continue
            except InputUnanswered as exc:
                refused = exc.__cause__
                if isinstance(refused, InputRefused):  # a 2026-07-28 upstream's round the client refused: its error
                    raise UpstreamRpcError(refused.code, refused.message) from None
                raise _failure(exc) from None
            except McpClientError as exc:
                raise _failure(exc) from None
            except httpx.TransportError as exc:  # the modern client passes on what it cannot classify
                raise UpstreamFailure("protocol", describe_failure(exc), may_have_run=True) from None
            return dict(result.raw)
        raise AssertionError("unreachable")

    async def listing(self, kind: ListKind) -> list[dict[str, Any]]:
        await self._admit()
        client = self._client()
        rule = self.config.prompts if kind == "prompts" else self.config.resources
        with _catalog_errors(), needing(self.config.catalog_scopes(rule)):
            if kind == "prompts":
                return [dict(p.raw) for p in await client.list_prompts()]
            if kind == "templates":
                return [dict(t.raw) for t in await client.list_resource_templates()]
            return [dict(r.raw) for r in await client.list_resources()]

    async def read(self, method: CatalogRead, params: dict[str, Any]) -> dict[str, Any]:
        await self._admit()
        client = self._client()
        ref = params.get("ref")
        prompt = method == "prompts/get" or (isinstance(ref, dict) and ref.get("type") == "ref/prompt")
        rule = self.config.prompts if prompt else self.config.resources
        with _catalog_errors(), needing(self.config.catalog_scopes(rule)):
            if method == "resources/read":
                return {"contents": [dict(c) for c in await client.read_resource(str(params.get("uri")))]}
            if method == "completion/complete":
                context = params.get("context")
                completion = await client.complete(
                    params["ref"], params["argument"], context if isinstance(context, dict) else None
                )
                return {"completion": dict(completion)}
            arguments = params.get("arguments")
            prompt = await client.get_prompt(str(params.get("name")), arguments if isinstance(arguments, dict) else {})
        result: dict[str, Any] = {"messages": [dict(m) for m in prompt.messages]}
        if prompt.description is not None:
            result["description"] = prompt.description
        return result

    def _client(self) -> Client | ModernClient:
        if not self._clients:
            raise UpstreamFailure("unreachable", f"upstream {self.name} is not connected", may_have_run=False)
        return self._clients[min(range(len(self._in_flight)), key=self._in_flight.__getitem__)]

    async def close(self) -> None:
        self._closed.set()
        owner, self._owner = self._owner, None
        if owner is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await owner
