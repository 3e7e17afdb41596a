"""Real reverse proxies for tests: Debian's ``nginx`` and ``caddy``, installed if missing, started on a free
loopback port with the configuration ``docs/deploy.md`` shows.

The proxy's own part of the configuration is read from ``docs/deploy/nginx.conf`` or ``docs/deploy/Caddyfile``
(the files the documentation includes verbatim) with ``${LISTEN}`` and ``${UPSTREAM}`` filled in; only what
running unprivileged in a temporary directory needs (pid file, logs, temp paths; Caddy's admin API off) is
wrapped around it here.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.debian import installed_binary
from tests.support.processes import free_port

DEPLOY = Path(__file__).resolve().parents[2] / "docs" / "deploy"
TEMPLATES = {"nginx": DEPLOY / "nginx.conf", "caddy": DEPLOY / "Caddyfile"}
PACKAGES = {"nginx": "nginx", "caddy": "caddy"}


def binary(name: str) -> str:
    """The path of ``nginx`` or ``caddy``, installing Debian's package first when it is not there."""
    return installed_binary(name, PACKAGES[name])


def render(name: str, listen: str, upstream: str) -> str:
    """The documented configuration with its two placeholders filled in."""
    return TEMPLATES[name].read_text().replace("${LISTEN}", listen).replace("${UPSTREAM}", upstream)


def _nginx_config(directory: Path, port: int, upstream: str) -> str:
    temp = {kind: directory / kind for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    directory.chmod(0o755)  # workers run as nobody when the master is root
    for path in temp.values():
        path.mkdir(mode=0o777)
        path.chmod(0o777)
    return f"""daemon off;
worker_processes 1;
pid {directory / "nginx.pid"};
error_log {directory / "error.log"} info;
events {{ worker_connections 256; }}
http {{
    access_log {directory / "access.log"};
    client_body_temp_path {temp["client_body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
{render("nginx", f"127.0.0.1:{port}", upstream)}
}}
"""


def _caddy_config(port: int, upstream: str) -> str:
    return "{\n\tadmin off\n}\n\n" + render("caddy", f"http://127.0.0.1:{port}", upstream)


@dataclass
class RunningProxy:
    name: str
    port: int
    directory: Path
    config: str
    """The whole configuration the proxy runs."""
    listen: str
    """What ``${LISTEN}`` became."""

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self) -> str:
        parts = []
        for log in sorted(self.directory.glob("*.log")):
            with contextlib.suppress(OSError):
                parts.append(f"--- {log.name}\n{log.read_text(errors='replace')[-2000:]}")
        return "\n".join(parts)


def _listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=0.5):
        return True
    return False


@contextlib.contextmanager
def reverse_proxy(name: str, upstream: str, timeout: float = 20) -> Iterator[RunningProxy]:
    """``nginx`` or ``caddy`` in front of ``upstream`` (``host:port``), until the block ends."""
    program = binary(name)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix=f"mcpl-{name}-") as tmp:
        directory = Path(tmp)
        if name == "nginx":
            config = _nginx_config(directory, port, upstream)
            path = directory / "nginx.conf"
            command = [program, "-c", str(path), "-p", str(directory), "-e", str(directory / "error.log")]
            env = dict(os.environ)
        else:
            config = _caddy_config(port, upstream)
            path = directory / "Caddyfile"
            command = [program, "run", "--config", str(path), "--adapter", "caddyfile"]
            env = {**os.environ, "HOME": tmp, "XDG_DATA_HOME": tmp, "XDG_CONFIG_HOME": tmp}
        path.write_text(config)
        listen = f"127.0.0.1:{port}" if name == "nginx" else f"http://127.0.0.1:{port}"
        proxy = RunningProxy(name, port, directory, config, listen)
        with (directory / "stderr.log").open("wb") as stderr:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, env=env)
        try:
            deadline = time.monotonic() + timeout
            delay = 0.02
            while not _listening(port):
                if process.poll() is not None:
                    raise RuntimeError(f"{name} exited with {process.returncode}:\n{proxy.log_tail()}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} not listening after {timeout}s:\n{proxy.log_tail()}")
                time.sleep(delay)  # readiness of another process: there is no event to await
                delay = min(delay * 2, 0.2)
            yield proxy
        finally:
            process.terminate()
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
