"""``mcp-lossless gateway --config`` as an operator runs it: a real gateway process in front of a stdio SDK server,
called with ``mcp-lossless call``; its metrics count the upstream's calls; a wrong config is a clear error."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from mcp_lossless.client.command import EXIT_MAY_HAVE_RUN, EXIT_UNREACHED
from mcp_lossless.core.errors import EXECUTION_LOST
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.processes import CLI, ServerProcess, call_killed_midway, cli_server, free_port

CREDENTIALS = ["--client-id", "dev-client", "--client-secret", "dev-secret"]
UPSTREAM = [sys.executable, "-m", "tests.interop.peers.sdk_gateway_upstream", "stdio"]
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gateway.toml"
STARTUP = 90
"""The gateway's start includes its stdio child's: on a box shared by several test runs that took a while."""


def toml_list(values: list[str]) -> str:
    return "[" + ", ".join(orjson.dumps(v).decode() for v in values) + "]"


def write_config(path: Path, store: str) -> Path:
    path.write_text(
        f'store = "{store}"\nretry_ms = 100\n\n[[upstream]]\nname = "py"\ncommand = {toml_list(UPSTREAM)}\n'
        'deny = ["hang"]\n'
    )
    return path


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("gateway")
    config = write_config(root / "gateway.toml", "memory")
    with cli_server(["--config", str(config)], root / "gateway.log", command="gateway", timeout=STARTUP) as server:
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
    assert 'mcp_lossless_gateway_upstream_era{era="modern",upstream="py"} 1.0' in metrics, "the SDK's stdio 2026-07-28"
    log = gateway.log.read_text()
    assert '"event":"upstream_call"' in log and '"client_id":"dev-client"' in log, "one line per call, its principal"
    assert "dev-secret" not in log and "eyJ" not in log, "no secret and no token (a JWT) in the gateway's log"


def test_the_example_config_puts_the_demo_server_behind_the_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """examples/gateway.toml as its comment runs it (its upstream on a free port instead of 9001)."""
    upstream = free_port()
    text = EXAMPLE.read_text()
    assert 'url = "http://127.0.0.1:9001/mcp"' in text and "UPSTREAM_SECRET=dev-secret" in text
    config = tmp_path / "gateway.toml"
    config.write_text(text.replace("127.0.0.1:9001", f"127.0.0.1:{upstream}"))
    monkeypatch.setenv("UPSTREAM_SECRET", "dev-secret")
    with (
        cli_server(["--store", "memory"], tmp_path / "upstream.log", port=upstream),
        cli_server(["--config", str(config)], tmp_path / "gateway.log", command="gateway", timeout=STARTUP) as gw,
    ):
        done = subprocess.run(
            [*CLI, "call", f"{gw.base}/mcp", "demo_search", "query=x", *CREDENTIALS],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        task = subprocess.run(
            [*CLI, "call", f"{gw.base}/mcp", "demo_fetch", "url=u", "steps:=4", "delay_ms:=600", *CREDENTIALS],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    banner = (tmp_path / "gateway.log").read_text()
    assert "mcp-lossless gateway: dev clients   dev-client (confidential)" in banner, "which client to call with"
    # the demo server announces no tool-list changes: the gateway does not ask for them (it was refused, logged
    # it and re-listed the tools every 0.5 s, 1 s, ... 30 s, for as long as it ran)
    assert "upstream demo announces no tool-list changes: its tools are listed once" in banner
    assert "list-change stream closed" not in banner
    assert done.returncode == 0, done.stderr
    assert done.stdout == "search results for 'x': 3 documents\n"
    assert "progress 3/3 search step 3/3" in done.stderr, "the upstream's progress reaches the client"
    assert task.returncode == 0, task.stderr
    assert task.stdout == "contents of u: 1 bytes\n"
    described = [line for line in task.stderr.splitlines() if line.startswith("progress")]
    assert described and all(re.fullmatch(r"progress \d+(/4)? fetch step [1-4]/4", line) for line in described), (
        "the upstream ran fetch as a task: its progress reaches the client (the gateway follows the upstream's task)"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('store = "memory"\n', "at least one [[upstream]]"),
        ('[[upstream]]\nname = "x"\n', "exactly one of url"),
        ('[[upstream]]\nname = "x"\nurl = "http://127.0.0.1:1/mcp"\nauth = { bearer = "t" }\n', "auth has unknown"),
        ("[[upstream]\n", "at line 1"),
        ('[[upstream]]\nname = "x"\ncommand = ["mcp-no-such-server"]\n', "'mcp-no-such-server' is not an executable"),
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


@pytest.mark.anyio
async def test_a_killed_gateway_restarts_with_the_calls_events_resumable_then_execution_lost(tmp_path: Path) -> None:
    """As for the server: SIGKILL the gateway (SQLite store) mid-call, restart it, resume: the stored events, then
    EXECUTION_LOST for the call its dead process was running — never a hang or a clean end."""
    args = ["--config", str(write_config(tmp_path / "gateway.toml", f"sqlite:{tmp_path / 'events.db'}"))]
    async with httpx.AsyncClient(timeout=30) as http:
        with cli_server(args, tmp_path / "first.log", command="gateway", timeout=STARTUP) as first:
            mcp = f"{first.base}/mcp"
            peer = Peer(http, first.base, await dev_token(http, first.base, mcp))
            await peer.initialize()
            work = call(5, "py_work", progress="p", label="k", steps=100, delay_ms=50)
            started = await peer.post(work, stop_after=4)  # priming, progress 1 to 3
            first.kill()
        with cli_server(args, tmp_path / "second.log", port=first.port, command="gateway", timeout=STARTUP) as second:
            peer.token = await dev_token(http, second.base, mcp)
            replay = await peer.resume(started.ids[0])
    assert replay.status == 200
    progress = [m["params"]["progress"] for m in replay.messages if m.get("method") == "notifications/progress"]
    assert progress[:3] == [1, 2, 3] and progress == list(range(1, len(progress) + 1)), "every stored event, in order"
    final = replay.messages[-1]
    assert final["id"] == 5 and final["error"]["code"] == EXECUTION_LOST
    assert final["error"]["data"] == {"reason": "execution_lost", "requestId": 5, "resumable": False}


def test_call_through_a_gateway_killed_mid_call_may_have_run(tmp_path: Path) -> None:
    """SIGKILL the gateway while ``call`` waits for a non-idempotent upstream tool: no traceback, the documented
    may-have-run status (3) in one line, not "the tool reported an error" (1)."""
    config = write_config(tmp_path / "gateway.toml", "memory")
    with cli_server(["--config", str(config)], tmp_path / "gateway.log", command="gateway", timeout=STARTUP) as gw:
        args = [f"{gw.base}/mcp", "py_work", "label=k", "steps:=600", "delay_ms:=100", *CREDENTIALS, "--timeout", "5"]
        done = call_killed_midway(gw.kill, args, "work k")
    assert done.returncode == EXIT_MAY_HAVE_RUN, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.splitlines()[-1].startswith("mcp-lossless call: the call may have run"), done.stderr


def test_call_whose_upstream_is_killed_mid_call_may_have_run(tmp_path: Path) -> None:
    """SIGKILL the gateway's stdio upstream mid-call: the gateway answers EXECUTION_LOST, which ``call`` exits as
    may-have-run (3), as the server's own would, not as a refusal (6)."""
    config = write_config(tmp_path / "gateway.toml", "memory")
    with cli_server(["--config", str(config)], tmp_path / "gateway.log", command="gateway", timeout=STARTUP) as gw:
        assert gw.proc is not None
        children = Path(f"/proc/{gw.proc.pid}/task/{gw.proc.pid}/children").read_text().split()
        assert len(children) == 1, f"the gateway's one stdio child: {children}"
        args = [f"{gw.base}/mcp", "py_work", "label=k", "steps:=600", "delay_ms:=100", *CREDENTIALS, "--timeout", "20"]
        done = call_killed_midway(lambda: os.kill(int(children[0]), signal.SIGKILL), args, "work k")
    assert done.returncode == EXIT_MAY_HAVE_RUN, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert "execution lost upstream (py)" in done.stderr.splitlines()[-1], done.stderr


def test_call_whose_http_upstream_is_down_is_unreachable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The example's HTTP upstream SIGKILLed between calls: the gateway answers UPSTREAM_FAILED ``unreachable`` (the
    call did not run) once the upstream's timeout passed, which ``call`` exits as unreachable (5), not as a
    refusal (6)."""
    upstream = free_port()
    config = tmp_path / "gateway.toml"
    text = EXAMPLE.read_text().replace("127.0.0.1:9001", f"127.0.0.1:{upstream}").replace("timeout = 30", "timeout = 3")
    config.write_text(text)
    monkeypatch.setenv("UPSTREAM_SECRET", "dev-secret")
    with (
        cli_server(["--store", "memory"], tmp_path / "upstream.log", port=upstream) as demo,
        cli_server(["--config", str(config)], tmp_path / "gw.log", command="gateway", timeout=STARTUP) as gw,
    ):
        demo.kill()
        done = subprocess.run(
            [*CLI, "call", f"{gw.base}/mcp", "demo_search", "query=x", *CREDENTIALS, "--timeout", "20"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == EXIT_UNREACHED, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert "upstream demo: unreachable" in done.stderr.splitlines()[-1], done.stderr
