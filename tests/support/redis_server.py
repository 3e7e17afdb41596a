"""A real ``redis-server`` for tests: installed from Debian's package if missing, on a free loopback port.

The tests that need Redis never skip: if ``redis-server`` is not on PATH, ``apt-get install -y
redis-server`` runs (through ``sudo`` when not root), and a failure says exactly what to do by hand.
Persistence is on (``appendonly yes``, by default ``appendfsync always``) so a restart keeps every
acknowledged write.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from tests.support.debian import installed_binary
from tests.support.processes import free_port

PACKAGE = "redis-server"


def redis_server_binary() -> str:
    """The path of ``redis-server``, installing Debian's package first when it is not there."""
    return installed_binary("redis-server", PACKAGE)


class RedisServer:
    """One ``redis-server`` process on 127.0.0.1 with its data in a temporary directory."""

    def __init__(
        self,
        binary: str,
        directory: Path,
        port: int | None = None,
        appendfsync: str = "always",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.binary = binary
        self.directory = directory
        self.port = port or free_port()
        self.appendfsync = appendfsync
        """``always`` for tests (nothing acknowledged is lost); benchmarks also run Redis's default ``everysec``."""
        self.extra_args = list(extra_args)
        """Further ``--name value`` settings, e.g. ``--replicaof`` for a replica (tests/support/redis_topology.py)."""
        self.url = f"redis://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> Path:
        return self.directory / "redis.log"

    def command(self) -> list[str]:
        """The command line of the process: a subclass may run another mode of the same binary (Sentinel)."""
        return [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            self.appendfsync,
            "--dir",
            str(self.directory),
            "--daemonize",
            "no",
            "--maxmemory-policy",
            "noeviction",
            "--logfile",
            str(self.log),
            *self.extra_args,
        ]

    def start(self, timeout: float = 20) -> None:
        self.proc = subprocess.Popen(self.command(), stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        delay = 0.01
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}:\n{self._log_tail()}")
            if self.ping():
                return
            time.sleep(delay)  # readiness of another process: there is no event to await
            delay = min(delay * 2, 0.1)
        raise RuntimeError(f"redis-server not answering PING after {timeout}s:\n{self._log_tail()}")

    def ping(self) -> bool:
        """One raw ``PING`` over RESP: ``+PONG`` once the data set is loaded (``-LOADING`` before)."""
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(64).startswith(b"+PONG")
        return False

    def stop(self) -> None:
        """SIGTERM: Redis flushes the append-only file and exits."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash or an OOM kill: nothing is flushed, what reached the append-only file stays."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return "(no log)"


@contextlib.contextmanager
def redis_server() -> Iterator[RedisServer]:
    binary = redis_server_binary()
    with tempfile.TemporaryDirectory(prefix="mcpl-redis-") as directory:
        server = RedisServer(binary, Path(directory))
        server.start()
        try:
            yield server
        finally:
            server.stop()
