"""``mcp-lossless gateway --config`` as an operator runs it: a real gateway process in front of a stdio SDK server,
called with ``mcp-lossless call``; its metrics count the upstream's calls; a wrong config is a clear error."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from tests.support.processes import CLI, ServerProcess, cli_server

CREDENTIALS = ["--client-id", "dev-client", "--client-secret", "dev-secret"]
UPSTREAM = [sys.executable, "-m", "tests.interop.peers.sdk_gateway_upstream", "stdio"]


def toml_list(values: list[str]) -> str:
    return "[" + ", ".join(orjson.dumps(v).decode() for v in values) + "]"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("gateway")
    config = root / "gateway.toml"
    config.write_text(
        f'store = "memory"\nretry_ms = 100\n\n[[upstream]]\nname = "py"\ncommand = {toml_list(UPSTREAM)}\n'
        'deny = ["hang"]\n'
    )
    with cli_server(["--config", str(config)], root / "gateway.log", command="gateway") as server:
        yield server


def test_call_through_the_gateway_cli_and_its_metrics(gateway: ServerProcess) -> None:
    done = subprocess.run(
        [*CLI, "call", f"{gateway.base}/mcp", "py_work", "label=cli", "steps=2", "delay_ms=10", *CREDENTIALS, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert orjson.loads(done.stdout)["result"]["content"][0]["text"] == "work cli done"
    metrics = httpx.get(f"{gateway.base}/metrics", timeout=10).text
    assert 'mcp_lossless_gateway_calls_total{outcome="ok",upstream="py"} 1.0' in metrics
    assert 'mcp_lossless_gateway_upstream_up{upstream="py"} 1.0' in metrics
    assert "dev-secret" not in gateway.log.read_text()


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('store = "memory"\n', "at least one [[upstream]]"),
        ('[[upstream]]\nname = "x"\n', "exactly one of url"),
        ('[[upstream]]\nname = "x"\nurl = "http://127.0.0.1:1/mcp"\nauth = { bearer = "t" }\n', "auth has unknown"),
        ("[[upstream]\n", "at line 1"),
    ],
)
def test_a_wrong_config_is_a_clear_error_not_a_traceback(tmp_path: Path, text: str, problem: str) -> None:
    config = tmp_path / "gateway.toml"
    config.write_text(text)
    done = subprocess.run(
        [*CLI, "gateway", "--config", str(config)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode != 0
    assert problem in done.stderr and "Traceback" not in done.stderr, done.stderr
