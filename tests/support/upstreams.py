"""Upstream MCP servers for the gateway tests, as real child processes that a test can SIGKILL and restart."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

READY_TIMEOUT = 90.0
"""Generous: on a box shared by several test runs, importing the SDK alone has taken half a minute."""


class SdkHttpUpstream:
    """``tests.interop.peers.sdk_gateway_upstream http``: the SDK server, its bearer check and header log; with
    ``issuer`` its ``jwt`` mode instead: a resource server of that issuer's that verifies JWTs itself, requiring
    ``scopes``."""

    def __init__(
        self, port: int, headers_file: Path, token: str = "", *, issuer: str | None = None, scopes: str = ""
    ) -> None:
        self.port = port
        self.issuer = issuer
        self.scopes = scopes
        self.url = f"http://127.0.0.1:{port}/mcp"
        self.legacy_url = f"http://127.0.0.1:{port}/legacy/mcp"
        """The same server as one that predates 2026-07-28 answers (``sdk_gateway_upstream``'s fence)."""
        self.headers_file = headers_file
        self.token = token
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> None:
        env = {**os.environ, "UPSTREAM_TOKEN": self.token, "UPSTREAM_SCOPES": self.scopes}
        mode = "http" if self.issuer is None else "jwt"
        if self.issuer is not None:
            env["UPSTREAM_ISSUER"] = self.issuer
        command = [sys.executable, "-m", "tests.interop.peers.sdk_gateway_upstream", mode, str(self.port)]
        self.proc = subprocess.Popen(
            [*command, str(self.headers_file)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, bufsize=0
        )
        assert self.proc.stdout is not None
        # Raw reads after select: a buffered readline may pull the ready line into its buffer along with the one
        # before it, and select would then wait on the pipe for a line already read (seen under load).
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + READY_TIMEOUT
        seen = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], deadline - time.monotonic())
            if not ready:
                break
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            seen += chunk
            if any(line.startswith(b"ready ") for line in seen.splitlines()):
                return
        self.stop()
        raise RuntimeError(f"SDK upstream did not start:\n{seen.decode(errors='replace')}")

    def kill(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def restart_after_death(self) -> None:
        """Start again once the killed process is reaped (same port, fresh state: a restarted server)."""
        assert self.proc is not None
        self.proc.wait(10)
        self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)

    def authorizations(self) -> list[str | None]:
        """The ``Authorization`` header of every request the upstream received, in order."""
        return [entry["authorization"] for entry in self._entries() if "authorization" in entry]

    def resumes(self) -> list[str]:
        """The ``Last-Event-ID`` of every resuming GET the upstream received."""
        return [e["last_event_id"] for e in self._entries() if e.get("http") == "GET" and e.get("last_event_id")]

    def messages(self) -> list[dict[str, Any]]:
        """The JSON-RPC method and params of every message body the upstream received, in order."""
        return [entry for entry in self._entries() if "method" in entry]

    def _entries(self) -> list[dict[str, Any]]:
        lines = self.headers_file.read_text().splitlines() if self.headers_file.exists() else []
        return [json.loads(line) for line in lines]
