"""Run ASGI apps and the CLI server on real loopback sockets for tests."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

import uvicorn


def bound_socket(host: str = "127.0.0.1") -> socket.socket:
    """A listening socket on a free port, bound before the app is built so its URL is known."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, 0))
    sock.listen(128)
    return sock


@contextlib.contextmanager
def run_asgi(app: Any, sock: socket.socket | None = None) -> Iterator[str]:
    """Serve ``app`` with uvicorn in a thread; yields ``http://127.0.0.1:PORT``; stops cleanly on exit."""
    sock = sock or bound_socket()
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, lifespan="on", log_level="warning", access_log=False, timeout_graceful_shutdown=2)
    server = uvicorn.Server(config)
    started = threading.Event()
    failure: list[BaseException] = []

    def target() -> None:
        async def main() -> None:
            # uvicorn's own serve() in explicit steps, so "started" is signalled, not polled for.
            config.load()
            server.lifespan = config.lifespan_class(config)
            try:
                await server.startup(sockets=[sock])
            finally:
                started.set()
            if server.started:
                await server.main_loop()
                await server.shutdown(sockets=[sock])

        try:
            asyncio.run(main())
        except BaseException as exc:  # pragma: no cover - surfaced to the test below
            failure.append(exc)
            started.set()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    started.wait(10)
    if failure or not server.started:
        raise RuntimeError(f"server did not start: {failure}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()


def lossless_server(make_app: Callable[[int], Any]) -> contextlib.AbstractContextManager[str]:
    """Build the app for the port it will listen on (its canonical URI includes the port), then serve it."""
    sock = bound_socket()
    return run_asgi(make_app(sock.getsockname()[1]), sock)
