"""The app under uvicorn as ``serve`` runs it: the guarded protocol, the file descriptor limit raised to what the
process may hold, uvicorn's own log lines in the JSON format of ours, and the banner printed and ``started``
logged only once the socket listens (a readiness signal a script can await; a failed start prints no URL)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import resource
import signal
import socket
import sys
import threading
from collections.abc import Iterator, Sequence

import uvicorn

from ..asgi import ASGIApp
from ..core.limits import connection_cap
from .app import LosslessApp
from .connections import KEEP_ALIVE_SECONDS, ConnectionGuard, guarded_protocol
from .observability import log_decision

FD_LIMIT_WITHOUT_HARD_CAP = 1 << 16
HANGUP_IGNORED = (
    "SIGHUP ignored: reloading the configuration (upstreams, limits) is not supported; restart the process to "
    "apply a change"
)
log = logging.getLogger("mcp_lossless.server.serving")


def raise_fd_limit() -> int:
    """Raise this process's soft open-file limit to its hard limit (1,024 is a common soft default, far below
    what a server holding thousands of connections needs); the soft limit in force afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = FD_LIMIT_WITHOUT_HARD_CAP if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return FD_LIMIT_WITHOUT_HARD_CAP if soft == resource.RLIM_INFINITY else soft


YOUNG_COLLECTION_EVERY = 10_000
"""Net container allocations between two collections of the youngest generation (CPython's default: 700).
Measured (benchmarks/instructions_serve.py, echo16): 527k -> 503k instructions per call with the SQLite store,
350k -> 347k with the memory store."""


def freeze_startup_heap() -> None:
    """Move what start-up built (modules, the app, its tools) out of the collector's sight (``gc.freeze``).

    A full collection walks every tracked object; the ~70,000 of a started process made each one take 40-100 ms,
    during which no other client is served (issue 11, H1). They live as long as the process, so walking them
    never frees anything. Done by ``serve`` just before it runs, after one collection so no garbage is frozen;
    an app embedded in another process leaves its host's collector alone.

    Then the youngest generation is collected every :data:`YOUNG_COLLECTION_EVERY` allocations, not every 700:
    each collection walks what is in flight then (with a SQLite store, the suspended coroutines of every call
    waiting for its commit), so fewer of them cost less, and the garbage they find is only reference cycles,
    which wait a little longer.
    """
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, older, oldest)


class LosslessServer(uvicorn.Server):
    """uvicorn's server, printing the banner and logging ``started`` with the address it listens on once it does."""

    def __init__(
        self, config: uvicorn.Config, app: LosslessApp, guard: ConnectionGuard, banner: Sequence[str] = ()
    ) -> None:
        super().__init__(config)
        self.app = app
        self.guard = guard
        self.banner = banner
        self.listening = threading.Event()
        """Set once the socket listens, or once startup has failed (then ``started`` is false): for embedders
        running the server in a thread of their own."""

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's run, Ctrl-C being the ordinary way to stop: uvicorn shuts down gracefully on SIGINT, then
        raises the signal again for its caller, which would end ``serve`` with a KeyboardInterrupt traceback."""
        with contextlib.suppress(KeyboardInterrupt):
            super().run(sockets=sockets)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's (SIGINT and SIGTERM stop the server gracefully), and SIGHUP, which an operator sends to
        reload: its default action would end the process without a word, so it is logged as unsupported and
        ignored instead. Only in the main thread, as uvicorn's: a server run in another thread leaves the
        process's signals to its host."""
        with super().capture_signals():
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            loop = asyncio.get_running_loop()
            loop.add_signal_handler(signal.SIGHUP, _hangup_ignored)
            try:
                yield
            finally:
                loop.remove_signal_handler(signal.SIGHUP)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's, after a drain (:meth:`LosslessApp.drain`): listening stops first, then running calls and
        tasks get ``drain_seconds`` to finish before uvicorn closes the connections (and cancels what is left)."""
        for server in self.servers:
            server.close()
        await self.app.drain(self.app.config.drain_seconds)
        await super().shutdown(sockets)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        try:
            await super().startup(sockets=sockets)
        finally:
            self.listening.set()
        if not self.started:
            return
        for line in self.banner:
            print(line, file=sys.stderr)
        state = self.app.state
        listening = [s.getsockname() for server in self.servers for s in server.sockets]
        log_decision(
            "started",
            canonical=state.canonical,
            listen=[f"{address[0]}:{address[1]}" for address in listening],
            store=state.config.store.split(":", 1)[0],
            auth=state.config.issuer or "none",
            instance=state.instance,
            max_connections=self.guard.cap,
        )


def _hangup_ignored() -> None:
    log.warning(HANGUP_IGNORED, extra={"fields": {"event": "signal_ignored", "signal": "SIGHUP"}})


def lossless_server(
    app: LosslessApp, fd_limit: int | None = None, asgi: ASGIApp | None = None, banner: Sequence[str] = ()
) -> LosslessServer:
    """The server ``serve`` runs for ``app`` (on its config's host and port, or on sockets given to ``run``);
    ``asgi`` is served instead when it wraps ``app`` (the gateway, which starts its upstreams first); ``banner``
    is printed to stderr once the socket listens."""
    config = app.state.config
    limits = config.limits
    metrics = app.state.metrics
    cap = connection_cap(limits, raise_fd_limit() if fd_limit is None else fd_limit)
    guard = ConnectionGuard(limits, cap, lambda limit: metrics.limit_refusals.labels(limit).inc())
    settings = uvicorn.Config(
        app if asgi is None else asgi,
        host=config.host,
        port=config.port,
        loop="uvloop",
        http=guarded_protocol(guard),
        ws="none",
        lifespan="on",
        proxy_headers=False,
        server_header=False,
        log_level="warning",
        log_config=None,  # uvicorn's loggers keep the JSON handler configure_logging gave them
        access_log=False,
        timeout_graceful_shutdown=5,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,  # the guard enforces it (ConnectionGuard.keep_alive), not uvicorn
    )
    return LosslessServer(settings, app, guard, banner)
