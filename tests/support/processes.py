"""The CLI server as a real child process: started, probed until ready, killed for real."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

CLI = [sys.executable, "-m", "mcp_lossless"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class ServerProcess:
    def __init__(
        self, args: list[str], port: int, log: Path, command: str = "serve", env: dict[str, str] | None = None
    ) -> None:
        self.args = args
        self.env = env
        """Variables set for the process on top of this one's environment."""
        self.command = command
        self.port = port
        self.base = f"http://127.0.0.1:{port}"
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 20) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*CLI, self.command, "--port", str(self.port), *self.args],
                stdout=out,
                stderr=out,
                env=None if self.env is None else {**os.environ, **self.env},
            )
        deadline = time.monotonic() + timeout
        delay = 0.02
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log.read_text()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base}/.well-known/oauth-protected-resource/mcp", timeout=1).status_code == 200:
                    return
            time.sleep(delay)  # readiness probe of another process: there is no event to await
            delay = min(delay * 2, 0.25)
        raise RuntimeError(f"server not ready in {timeout}s:\n{self.log.read_text()}")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


@contextlib.contextmanager
def cli_server(
    args: list[str], log: Path, port: int | None = None, command: str = "serve", timeout: float = 20
) -> Iterator[ServerProcess]:
    server = ServerProcess(args, port or free_port(), log, command)
    server.start(timeout)
    try:
        yield server
    finally:
        server.stop()


@contextlib.contextmanager
def started_cli_server(
    args: list[str],
    *,
    nofile: int | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30,
    command_name: str = "serve",
) -> Iterator[tuple[subprocess.Popen[str], dict[str, object]]]:
    """``mcp-lossless serve ARGS`` (or ``command_name``: ``gateway``) as a child process, yielded with its
    ``started`` log entry once it has logged it (``started`` comes after the socket is bound: the line is the
    readiness signal, nothing to poll). ``nofile`` sets its open-file limit, soft and hard, as ``ulimit -n``
    would (``serve`` only)."""
    import json

    command = [*CLI, command_name, *args]
    if nofile is not None:  # set in the child itself: preexec_fn is unsafe in a process with threads
        command = [
            sys.executable,
            "-c",
            "import resource, runpy, sys; "
            f"resource.setrlimit(resource.RLIMIT_NOFILE, ({nofile}, {nofile})); "
            "sys.argv = ['mcp-lossless', *sys.argv[1:]]; runpy.run_module('mcp_lossless', run_name='__main__')",
            "serve",
            *args,
        ]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    try:
        deadline = time.monotonic() + timeout
        lines = []
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                raise RuntimeError(f"server exited with {proc.wait(10)}:\n{''.join(lines)}")
            lines.append(line)
            if line.startswith("{") and json.loads(line).get("event") == "started":
                yield proc, json.loads(line)
                return
        raise RuntimeError(f"server not started in {timeout}s:\n{''.join(lines)}")
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        proc.stderr.close()


def call_killed_midway(kill: Callable[[], None], args: list[str], started: str) -> subprocess.CompletedProcess[str]:
    """``mcp-lossless call ARGS``, and ``kill`` run once its stderr shows a line containing ``started`` (the call's
    first progress: the tool runs): the finished command, stderr whole."""
    proc = subprocess.Popen([*CLI, "call", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if started in line:
            break
    else:
        proc.wait(30)
        raise AssertionError(f"the call never got to {started!r}: {''.join(seen)}")
    kill()
    out, err = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "".join(seen) + err)
