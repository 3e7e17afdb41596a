"""A Streamable HTTP upstream, reached through this project's own client (one pooled session per upstream).

The client already does what "no silent loss from upstream" needs: a broken stream is resumed with the
upstream's own ``Last-Event-ID``; an answer that cannot be recovered is re-issued under a new id when the
tool is idempotent (annotated, or listed in the config) and otherwise fails as may-have-run; a lost session
is re-established; the deadline ends the call and cancels it upstream. This module maps those outcomes onto
:class:`~.upstream.UpstreamFailure` and forwards progress to the gateway's client.

The upstream gets the gateway's own credentials for it (``auth`` in the config), never the client's token.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable, Mapping
from typing import Any

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
)
from ..client.transport import Backoff
from .config import BearerFromEnv, ClientCredentialsFromEnv, UpstreamConfig
from .upstream import FailureReason, Relay, Reporter, UpstreamFailure, UpstreamRpcError, UpstreamTool

log = logging.getLogger("mcp_lossless.gateway")
BACKOFF = Backoff(initial=0.2, maximum=2.0)
"""Reconnects and re-issues to an upstream that is coming back: prompt, since each call has a deadline."""


def client_auth(config: UpstreamConfig) -> Auth:
    """The gateway's own credentials for this upstream (read from the environment at start)."""
    auth = config.auth
    if isinstance(auth, BearerFromEnv):
        return BearerToken(auth.token())
    if isinstance(auth, ClientCredentialsFromEnv):
        return OAuth(auth.client_id, auth.secret(), scope=auth.scope)
    return Auth()


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
    elif isinstance(exc, AuthorizationFailed):
        reason, ran = "unauthorized", False
    elif isinstance(exc, ClientClosed):
        reason, ran = "closed", True
    else:  # ProtocolViolation and anything the client may add: the call may well have run
        reason, ran = "protocol", True
    return UpstreamFailure(reason, exc.reason, may_have_run=ran)


class HttpUpstream:
    """``sessions`` sessions with the upstream over one pooled HTTP client, owned by a task of their own (so any
    task may start or close them). A call goes to the session with the fewest calls in flight: upstream servers
    serialize work per session (the official SDK's one-session throughput is well under half its 16-session one).
    """

    def __init__(self, config: UpstreamConfig) -> None:
        assert config.url is not None
        self.name = config.name
        self.config = config
        self._clients: list[Client] = []
        self._in_flight: list[int] = []
        self._owner: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()
        self._tools: list[UpstreamTool] = []

    async def start(self, on_tools_changed: Callable[[], None]) -> None:
        ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._closed = asyncio.Event()
        self._owner = asyncio.create_task(self._own(ready))
        try:
            await ready
        except BaseException:
            await self.close()
            raise
        log.info("upstream %s: %d sessions, %d tools", self.name, len(self._clients), len(self._tools))

    async def _own(self, ready: asyncio.Future[None]) -> None:
        config = self.config
        assert config.url is not None
        try:
            async with contextlib.AsyncExitStack() as stack:
                limits = httpx.Limits(
                    max_connections=32 * config.sessions, max_keepalive_connections=4 * config.sessions
                )
                http = await stack.enter_async_context(
                    httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=300.0), limits=limits, follow_redirects=False)
                )
                clients = []
                for _ in range(config.sessions):
                    client = Client(
                        config.url,
                        auth=client_auth(config),
                        timeout=config.timeout,
                        backoff=BACKOFF,
                        http=http,
                        client_info={"name": "mcp-lossless-gateway", "version": "0.1.0"},
                    )
                    clients.append(await stack.enter_async_context(client))
                listed = await asyncio.gather(*(client.list_tools() for client in clients))
                self._tools = [
                    UpstreamTool(t.name, t.description or "", dict(t.input_schema), dict(t.annotations))
                    for t in listed[0]
                ]
                self._clients, self._in_flight = clients, [0] * len(clients)
                ready.set_result(None)
                await self._closed.wait()
        except McpClientError as exc:
            if not ready.done():
                ready.set_exception(_failure(exc))
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise
        finally:
            self._clients, self._in_flight = [], []

    def tools(self) -> list[UpstreamTool]:
        return list(self._tools)

    async def call(
        self, tool: str, arguments: dict[str, Any], reporter: Reporter, *, idempotent: bool
    ) -> dict[str, Any]:
        if not self._clients:
            raise UpstreamFailure("unreachable", f"upstream {self.name} is not connected", may_have_run=False)
        index = min(range(len(self._in_flight)), key=self._in_flight.__getitem__)
        self._in_flight[index] += 1
        try:
            return await self._call(self._clients[index], tool, arguments, reporter, idempotent=idempotent)
        finally:
            if index < len(self._in_flight):
                self._in_flight[index] -= 1

    async def _call(
        self, client: Client, tool: str, arguments: dict[str, Any], reporter: Reporter, *, idempotent: bool
    ) -> dict[str, Any]:
        relay = Relay()

        def progress(update: ProgressUpdate) -> None:
            relay.put(lambda: reporter.report_progress(update.progress, update.total, update.message))

        def message(note: Mapping[str, Any]) -> None:
            params = note.get("params")
            if note.get("method") == "notifications/message" and isinstance(params, dict) and "level" in params:
                level, data, logger = str(params["level"]), params.get("data"), params.get("logger")
                relay.put(lambda: reporter.log(level, data, logger if isinstance(logger, str) else None))

        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout
        for attempt in itertools.count():
            try:
                async with relay.running():
                    result = await client.call_tool(
                        tool,
                        arguments,
                        on_progress=progress,
                        on_message=message,
                        timeout=max(0.0, deadline - loop.time()),
                        reissue=idempotent or None,
                    )
            except ToolFailed as exc:
                return dict(exc.result.raw)
            except RemoteError as exc:
                raise UpstreamRpcError(exc.code, exc.message, exc.data) from None
            except ConnectionFailed as exc:
                # Its last send never arrived (for a call that is not idempotent, its only one): wait for the
                # upstream to come back, within the call's deadline.
                pause = BACKOFF.delay(attempt, None, 0.0)
                if loop.time() + pause >= deadline:
                    raise _failure(exc) from None
                log.info("upstream %s unreachable for %s; trying again in %.2g s", self.name, tool, pause)
                await asyncio.sleep(pause)
                relay = Relay()
                continue
            except McpClientError as exc:
                raise _failure(exc) from None
            return dict(result.raw)
        raise AssertionError("unreachable")

    async def close(self) -> None:
        self._closed.set()
        owner, self._owner = self._owner, None
        if owner is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await owner
