"""Run any ASGI app under a real uvicorn on a loopback port, in a background thread.

The socket is bound before the app is built when the app needs its own URL (an issuer, a canonical
resource URI)::

    sock = loopback_socket()
    app = DevAuthServer(f"{base_url(sock)}/dev-as", ...)
    with serve_app(app, sock=sock) as url:
        ...

or simply ``with serve_app(app) as url:``. Startup is awaited through uvicorn's own ``startup`` (no
polling), and leaving the block stops the server and joins its thread.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Literal

import uvicorn

STARTUP_TIMEOUT = 10.0
SHUTDOWN_TIMEOUT = 10.0


def loopback_socket() -> socket.socket:
    """A TCP socket bound to a free port on 127.0.0.1 (uvicorn starts listening on it)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


def base_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"


class _SignallingServer(uvicorn.Server):
    """A uvicorn server that tells another thread the moment it accepts connections."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        self.ready.set()


@contextmanager
def serve_app(
    app: Any,
    *,
    sock: socket.socket | None = None,
    lifespan: Literal["auto", "on", "off"] = "auto",
    graceful_shutdown: int = 2,
    startup_timeout: float = STARTUP_TIMEOUT,
) -> Iterator[str]:
    """Serve ``app`` until the block ends; yields its base URL, e.g. ``http://127.0.0.1:40123``."""
    sock = sock if sock is not None else loopback_socket()
    config = uvicorn.Config(app, log_level="warning", lifespan=lifespan, timeout_graceful_shutdown=graceful_shutdown)
    server = _SignallingServer(config)
    with run_server(server, server.ready, sock, startup_timeout) as url:
        yield url


@contextmanager
def run_server(
    server: uvicorn.Server, ready: threading.Event, sock: socket.socket, startup_timeout: float = STARTUP_TIMEOUT
) -> Iterator[str]:
    """Run ``server`` on ``sock`` in a thread until the block ends; ``ready`` is set by its startup."""
    url = base_url(sock)
    failure: list[BaseException] = []

    def run() -> None:
        try:
            server.run(sockets=[sock])
        except BaseException as exc:  # uvicorn reports a failed startup with SystemExit
            failure.append(exc)
        finally:
            ready.set()

    thread = threading.Thread(target=run, name=f"uvicorn {url}", daemon=True)
    thread.start()
    if not ready.wait(startup_timeout) or not server.started:
        server.should_exit = True
        thread.join(SHUTDOWN_TIMEOUT)
        sock.close()
        raise RuntimeError(f"uvicorn did not start on {url}") from (failure[0] if failure else None)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(SHUTDOWN_TIMEOUT)
        if thread.is_alive():
            server.force_exit = True
            thread.join(SHUTDOWN_TIMEOUT)
        sock.close()
        if thread.is_alive():
            raise RuntimeError(f"uvicorn on {url} did not stop")


def lossless_server(
    make_app: Callable[[int], Any], startup_timeout: float = STARTUP_TIMEOUT
) -> AbstractContextManager[str]:
    """Our server built for the port it will listen on (its canonical URI includes the port), then served."""
    sock = loopback_socket()
    return serve_app(make_app(sock.getsockname()[1]), sock=sock, lifespan="on", startup_timeout=startup_timeout)


@contextmanager
def guarded_server(make_app: Callable[[int], Any], fd_limit: int | None = None) -> Iterator[tuple[str, Any]]:
    """Our app as ``serve`` runs it (the guarded protocol and its limits), with the uvicorn server, for tests of
    the HTTP-level limits."""
    from mcp_lossless.server.serving import lossless_server as serving

    sock = loopback_socket()
    server = serving(make_app(sock.getsockname()[1]), fd_limit)
    with run_server(server, server.listening, sock) as url:
        yield url, server


@contextmanager
def serve_guarded(app: Any, guard: Any) -> Iterator[str]:
    """``app`` behind ``guard`` (a ``server.connections.ConnectionGuard``) and nothing else of ours: for tests of the
    guard's own timing (``keep_alive``), which ``serve`` fixes."""
    from mcp_lossless.server.connections import guarded_protocol

    config = uvicorn.Config(app, http=guarded_protocol(guard), loop="uvloop", lifespan="off", log_level="warning")
    server = _SignallingServer(config)
    with run_server(server, server.ready, loopback_socket()) as url:
        yield url


async def read_body(receive: Callable[[], Any]) -> bytes:
    """The whole body of the request an ASGI test app is answering."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body
