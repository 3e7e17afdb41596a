"""What an operator meets around the protocol, on real ``serve`` and ``gateway`` processes: ``--version``, a SIGHUP
logged as unsupported instead of ending the process without a word, the issuer in the banner, ``/healthz`` and
``/readyz``."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import orjson
import pytest

from mcp_lossless import __version__
from tests.support.processes import CLI, cli_server, free_port, started_cli_server
from tests.support.redis_server import redis_server

UPSTREAM = [sys.executable, "-m", "tests.interop.peers.sdk_gateway_upstream", "stdio"]
LABELS = ("MCP endpoint", "metadata", "upstream", "dev issuer", "issuer", "token URL", "dev clients", "registration",
          "authorization")  # fmt: skip
"""What the banners of ``serve`` and ``gateway`` name, each line a label and a value."""
GATEWAY_STARTUP = 90
"""The gateway's start includes its stdio child's: on a box shared by several test runs that takes a while."""


def gateway_config(path: Path) -> Path:
    """A gateway on the memory store in front of the SDK's stdio test upstream."""
    command = "[" + ", ".join(orjson.dumps(part).decode() for part in UPSTREAM) + "]"
    path.write_text(f'store = "memory"\n\n[[upstream]]\nname = "py"\ncommand = {command}\n')
    return path


def test_version_is_printed_and_exits_0() -> None:
    done = subprocess.run([*CLI, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"mcp-lossless {__version__}\n"


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_sighup_is_logged_as_unsupported_and_the_process_serves_on(command: str, tmp_path: Path) -> None:
    """The default action of SIGHUP ends a process silently; ``serve`` and ``gateway`` log one JSON line saying
    reloading is not supported, and go on serving until SIGTERM stops them as usual."""
    port = free_port()
    args = ["--port", str(port)]
    args += ["--store", "memory"] if command == "serve" else ["--config", str(gateway_config(tmp_path / "gw.toml"))]
    with started_cli_server(args, command_name=command, timeout=GATEWAY_STARTUP) as (proc, _):
        assert proc.stderr is not None
        for attempt in range(2):  # and a second one is ignored as the first
            proc.send_signal(signal.SIGHUP)
            entry = next_event(proc, "signal_ignored")
            assert entry["signal"] == "SIGHUP" and entry["level"] == "warning"
            assert "not supported" in entry["msg"] and "restart" in entry["msg"]
            metadata = httpx.get(f"http://127.0.0.1:{port}/.well-known/oauth-protected-resource/mcp", timeout=10)
            assert metadata.status_code == 200, f"still serving after SIGHUP {attempt + 1}"
        proc.terminate()
        assert proc.wait(30) == -signal.SIGTERM, "SIGTERM still stops it (uvicorn raises it again once shut down)"


def next_event(proc: subprocess.Popen[str], event: str) -> dict[str, object]:
    """The next JSON log line of ``proc`` logging ``event``: waits for it, line by line."""
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("{") and json.loads(line).get("event") == event:
            entry: dict[str, object] = json.loads(line)
            return entry
    raise AssertionError(f"the process ended with {proc.wait(10)} before logging {event}")


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_the_banner_prints_the_issuer_beside_the_token_url_and_both_answer(command: str, tmp_path: Path) -> None:
    """A client's OAuth settings (the Inspector's, say) ask for the issuer; the banner prints it just before the
    token URL, and the issuer's metadata names itself and that token endpoint."""
    port = free_port()
    args = ["--port", str(port), "--auto-approve"]
    args += ["--store", "memory"] if command == "serve" else ["--config", str(gateway_config(tmp_path / "gw.toml"))]
    proc = subprocess.Popen([*CLI, command, *args], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        banner = {}
        for line in proc.stderr:
            if line.startswith("{"):  # the log: the upstreams' start, then started
                if json.loads(line).get("event") == "started":
                    break
                continue
            shown = re.fullmatch(rf"mcp-lossless(?: gateway)?: ({'|'.join(LABELS)})\s+(.*)", line.strip())
            assert shown is not None, f"a banner line: {line!r}"
            banner[shown[1]] = shown[2]
        else:
            raise AssertionError(f"{command} ended with {proc.wait(10)} before it started")
        issuer = f"http://127.0.0.1:{port}/dev-as"
        labels = list(banner)
        assert banner["dev issuer"] == issuer and labels[labels.index("dev issuer") + 1] == "token URL", banner
        assert banner["authorization"] == "auto-approved (--auto-approve)", banner
        assert "dev-public (public, PKCE)" in banner["dev clients"], banner
        metadata = httpx.get(f"http://127.0.0.1:{port}/.well-known/oauth-authorization-server/dev-as", timeout=10)
        assert metadata.json()["issuer"] == issuer
        assert metadata.json()["token_endpoint"] == banner["token URL"]
    finally:
        proc.terminate()
        proc.wait(30)
        proc.stderr.close()


@pytest.mark.parametrize("command", ["serve", "gateway"])
def test_healthz_and_readyz_on_the_memory_store_under_the_metrics_host_and_origin_rule(
    command: str, tmp_path: Path
) -> None:
    args = ["--store", "memory"] if command == "serve" else ["--config", str(gateway_config(tmp_path / "gw.toml"))]
    with (
        cli_server(args, tmp_path / "server.log", command=command, timeout=GATEWAY_STARTUP) as server,
        httpx.Client(base_url=server.base, timeout=10) as http,
    ):
        health = http.get("/healthz")
        assert (health.status_code, health.json()) == (200, {"status": "ok"})
        ready = http.get("/readyz")
        assert ready.status_code == 200, ready.text
        checks = {"store": "ok", "keys": "ok"} | ({"upstreams": "ok"} if command == "gateway" else {})
        assert ready.json() == {"status": "ready", "checks": checks}
        assert http.head("/readyz").status_code == 200
        for path in ("/healthz", "/readyz", "/metrics"):  # one rule for the three (DNS rebinding)
            assert http.get(path, headers={"host": "evil.example"}).status_code == 403, path
            assert http.get(path, headers={"origin": "https://evil.example"}).status_code == 403, path
            assert http.get(path, headers={"origin": f"http://localhost:{server.port}"}).status_code == 200


def test_readyz_follows_the_redis_store(tmp_path: Path) -> None:
    """503 naming the store while its redis-server is stopped, 200 again once it is back (the process stays up:
    ``/healthz`` answers 200 throughout)."""
    with (
        redis_server() as redis,
        cli_server(["--store", redis.url], tmp_path / "serve.log") as server,
        httpx.Client(base_url=server.base, timeout=10) as http,
    ):
        assert http.get("/readyz").status_code == 200
        redis.stop()
        down = http.get("/readyz")
        assert down.status_code == 503, down.text
        assert down.json()["status"] == "not_ready" and down.json()["checks"]["keys"] == "ok"
        assert f"redis store at 127.0.0.1:{redis.port} unavailable" in down.json()["checks"]["store"], down.text
        assert http.get("/healthz").status_code == 200, "alive, only not ready"
        redis.start()  # returns once it answers PING, on the same port and data
        back = http.get("/readyz")
        assert back.status_code == 200, back.text
