"""``mcp-lossless serve``: your tools from TARGET, a typed config file, ``started`` only once listening, help texts."""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import httpx
import pytest

from mcp_lossless.cli import LIMIT_FLAGS, _serve_parser, main
from mcp_lossless.core.limits import Limits
from mcp_lossless.serve import UsageError, build_config
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.targets import TargetError, load_registry
from tests.support.mcp_http import Peer, call
from tests.support.processes import CLI, free_port, started_cli_server

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "server.toml"

TOOLS = '''
from mcp_lossless.server.tools import ToolRegistry

registry = ToolRegistry()


@registry.tool()
async def shout(text: str) -> str:
    """Upper-case `text`."""
    return text.upper()

not_a_registry = 42
'''


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    _serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


@pytest.mark.anyio
@pytest.mark.parametrize("form", ["file", "module"])
async def test_serve_target_serves_the_named_registry_instead_of_the_demo_tools(tmp_path: Path, form: str) -> None:
    package = tmp_path / "mytools"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tools.py").write_text(TOOLS)
    target = f"{package / 'tools.py'}:registry" if form == "file" else "mytools.tools:registry"
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    port = free_port()
    with started_cli_server([target, "--store", "memory", "--auth", "none", "--port", str(port)], env=env):
        async with httpx.AsyncClient(timeout=10) as http:
            peer = Peer(http, f"http://127.0.0.1:{port}")
            await peer.initialize()
            listed = await peer.post({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
            shouted = await peer.post(call(2, "shout", text="lossless"))
    assert [t["name"] for t in listed.messages[-1]["result"]["tools"]] == ["shout"]
    assert shouted.messages[-1]["result"]["content"] == [{"type": "text", "text": "LOSSLESS"}]


def test_without_a_target_the_demo_tools_are_served() -> None:
    port = free_port()
    args = ["--store", "memory", "--auth", "none", "--port", str(port)]
    with started_cli_server(args), httpx.Client(timeout=10) as http:
        init = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}
        headers = {"accept": "application/json, text/event-stream"}
        session = http.post(f"http://127.0.0.1:{port}/mcp", json=init, headers=headers).headers["mcp-session-id"]
        listed = http.post(
            f"http://127.0.0.1:{port}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
            headers={**headers, "mcp-session-id": session},
        )
    assert "search" in listed.text and "fetch" in listed.text


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("no-colon-here", "expected path/to/file.py:NAME or package.module:NAME"),
        ("FILE:missing", "has no attribute 'missing'"),
        ("FILE:not_a_registry", "is of type int, not a ToolRegistry"),
        ("nowhere/tools.py:registry", "no file 'nowhere/tools.py'"),
        ("mcp_lossless_no_such_module:registry", "no module named 'mcp_lossless_no_such_module'"),
        ("BROKEN:registry", "ZeroDivisionError: division by zero"),
    ],
)
def test_bad_targets_are_named_without_a_traceback(tmp_path: Path, target: str, message: str) -> None:
    (tmp_path / "good.py").write_text(TOOLS)
    (tmp_path / "broken.py").write_text("x = 1 / 0\n")
    target = target.replace("FILE", str(tmp_path / "good.py")).replace("BROKEN", str(tmp_path / "broken.py"))
    with pytest.raises(TargetError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_registry(target)


def test_a_bad_target_exits_2_with_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [*CLI, "serve", "nowhere.py:registry", "--store", "memory"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "TARGET: no file 'nowhere.py'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["serve", "--port", "nope"], "mcp-lossless serve: argument --port: invalid int value: 'nope'"),
        (["serve", "--no-such-flag"], "mcp-lossless serve: unrecognized arguments: --no-such-flag"),
        (["call", "http://127.0.0.1:9/mcp", "search", "--nope"], "mcp-lossless call: unrecognized arguments: --nope"),
        (["gateway"], "mcp-lossless gateway: the following arguments are required: --config"),
        (["srve"], "mcp-lossless: argument command: invalid choice: 'srve'"),
    ],
)
def test_a_bad_flag_is_one_line_naming_it_and_exit_2(args: list[str], line: str) -> None:
    """argparse would print the whole usage first (24 lines for serve) and bury the one that matters."""
    done = subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2
    (only,) = done.stderr.splitlines()
    prog = line.partition(":")[0]
    assert only.startswith(line) and only.endswith(f"(see {prog} --help)"), only


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('port = "x"', 'port = "x": expected an integer'),
        ("port = 70000", "port = 70000: must be between 1 and 65535"),
        ("json_response = 1", "json_response = 1: expected true or false"),
        ('allowed_origins = "http://a"', 'allowed_origins = "http://a": expected a list of strings'),
        ("colour = 1", "unknown setting: colour"),
        ("[limits]\nmax_headers = 1.5", "limits.max_headers = 1.5: expected an integer"),
        ("[limits]\nheader_timeout = 0", "limits.header_timeout = 0.0: must be a positive number"),
        ("[limits]\nsessions = 5", "unknown setting: limits.sessions"),
        ("idempotency_second = 60", "unknown setting: idempotency_second (did you mean idempotency_seconds?)"),
        (
            "[limits]\nidempotency_key_per_principal = 5",
            "unknown setting: limits.idempotency_key_per_principal "
            "(did you mean limits.idempotency_keys_per_principal?)",
        ),
        (
            "idempotency_keys_per_principal = 5",
            "unknown setting: idempotency_keys_per_principal (a limit: put it under [limits])",
        ),
        ("[limits]\ndrain_seconds = 5", "unknown setting: limits.drain_seconds (not a limit: put it before [limits])"),
        ('issuer = "auth.example.com"', 'issuer = "auth.example.com": must be "dev" or an http(s) URL'),
        ('issuer = "ftp://auth.example.com"', 'issuer = "ftp://auth.example.com": must be "dev" or an http(s) URL'),
        ('public_url = "mcp.example.com/mcp"', 'public_url = "mcp.example.com/mcp": must be an absolute http(s) URL'),
        ("port = ", "is not valid TOML"),
        ('[[upstream]]\nname = "x"', "[[upstream]] tables are for mcp-lossless gateway --config, not serve"),
    ],
)
def test_config_values_are_checked_by_type_naming_the_key_and_value(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "server.toml"
    path.write_text(toml + "\n")
    with pytest.raises(UsageError) as raised:
        build_config(_parse("--config", str(path)))
    assert str(path) in str(raised.value)
    assert message in str(raised.value)


def test_a_config_file_that_is_not_utf_8_is_named_as_not_toml(tmp_path: Path) -> None:
    # it ended serve with a UnicodeDecodeError traceback
    path = tmp_path / "server.toml"
    path.write_bytes(b'port = 8000\nissuer = "caf\xe9"\n')  # Latin-1, as an editor might save it
    with pytest.raises(UsageError) as raised:
        build_config(_parse("--config", str(path)))
    assert str(raised.value) == f"{path} is not valid TOML: not UTF-8 text (byte 25)"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--issuer", "notaurl"), 'issuer = "notaurl": must be "dev" or an http(s) URL'),
        (("--public-url", "foo"), 'public_url = "foo": must be an absolute http(s) URL'),
    ],
)
def test_a_flag_that_is_no_url_is_named_before_any_request_uses_it(flags: tuple[str, str], message: str) -> None:
    # before: --issuer notaurl failed at start-up fetching "/.well-known/oauth-authorization-servernotaurl"
    with pytest.raises(UsageError, match=re.escape(message)):
        build_config(_parse(*flags))


def test_a_refused_exposure_is_a_usage_error_of_serve_exit_2() -> None:
    # it exited 1 with the bare message, unlike every other bad flag (2, "mcp-lossless serve: ...")
    done = subprocess.run(
        [*CLI, "serve", "--conformance", "--host", "0.0.0.0", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert (
        done.stderr
        == "mcp-lossless serve: --conformance is refused on a non-loopback host: it would serve tools to anyone\n"
    )


@pytest.mark.parametrize(
    ("store", "message"),
    [
        # it exited 1 as "mcp-lossless: unknown store ...", unlike every other bad flag (2, "mcp-lossless serve: ...")
        (
            "postgres://db",
            "unknown store 'postgres://db': use memory, sqlite:PATH[?S=V], redis://HOST:PORT[/DB][?S=V], "
            "redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE[/DB][?S=V] or redis+cluster://HOST:PORT[,HOST:PORT…][?S=V]",
        ),
        # passed on to redis-py, which refused it only at the first connection: a traceback and exit 3
        (
            "redis://127.0.0.1:1/0?prefix=x&bogus=1",
            "redis store: unknown setting 'bogus' (the store's: prefix, retention_seconds, max_events_per_stream, "
            "lease_seconds, wait_replicas, wait_timeout_ms; or redis-py's)",
        ),
        (
            "redis+sentinel://u:s3cret/x@127.0.0.1/mcpl",
            "redis+sentinel store: Sentinel address 1 is not HOST[:PORT] (comma-separated)",
        ),
        (
            "redis+cluster://127.0.0.1:1,127.0.0.1:2/0",
            "redis+cluster store: a cluster has one database: nothing goes after the node addresses",
        ),
    ],
)
def test_a_bad_store_is_a_usage_error_of_serve_exit_2_before_connecting(store: str, message: str) -> None:
    done = subprocess.run(
        [*CLI, "serve", "--store", store, "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr == f"mcp-lossless serve: {message}\n"


def test_a_bad_config_value_exits_2_before_anything_starts(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text('port = "x"\n')
    done = subprocess.run(
        [*CLI, "serve", "--config", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert f'{path}: port = "x": expected an integer' in done.stderr
    assert "started" not in done.stderr and "Traceback" not in done.stderr


def test_the_example_config_file_is_valid_and_spells_out_the_defaults() -> None:
    config = build_config(_parse("--config", str(EXAMPLE)))
    assert config == ServerConfig()
    assert config.limits == Limits()
    text = EXAMPLE.read_text()
    tables = {"dev_clients", "limits"}
    named = {f for f in [*ServerConfig.__dataclass_fields__, *Limits.__dataclass_fields__] if f not in tables}
    unnamed = [name for name in named if not re.search(rf"^(# )?{name} = ", text, re.MULTILINE)]
    assert sorted(unnamed) == [], "every setting is in the example, set to its default or commented out"


def test_flags_override_the_file_and_reach_the_limits(tmp_path: Path) -> None:
    path = tmp_path / "server.toml"
    path.write_text("port = 9001\n[limits]\nmax_headers = 50\nheader_timeout = 3\n")
    config = build_config(_parse("--config", str(path), "--port", "9002", "--max-headers", "60", "--body-timeout", "7"))
    assert config.port == 9002
    assert config.limits == Limits(max_headers=60, header_timeout=3.0, body_timeout=7.0)


def test_the_top_level_help_is_plain_text_naming_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    description = capsys.readouterr().out.split("positional arguments")[0]
    assert "``" not in description  # it printed the module docstring's reST markup
    assert all(command in description for command in ("serve", "gateway", "audit", "call"))


@pytest.mark.parametrize("command", ["serve", "gateway", "call", "audit"])
def test_every_flag_names_its_value_in_words(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    # --max-header-bytes LIMIT_MAX_HEADER_BYTES, --client-id CLIENT_ID: argparse's default is the internal dest
    with pytest.raises(SystemExit):
        main([command, "--help"])
    metavars = set(re.findall(r"--[a-z-]+ ([A-Z][A-Za-z0-9_]*)", capsys.readouterr().out))
    assert metavars
    assert sorted(m for m in metavars if "_" in m) == []


def test_every_limit_has_a_flag() -> None:
    assert list(LIMIT_FLAGS) == [f for f in Limits.__dataclass_fields__]


def test_every_serve_flag_has_help_text_that_shows_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    _serve_parser(parser.add_subparsers())
    serve = next(a for a in parser._subparsers._group_actions[0].choices.values())  # type: ignore[union-attr]
    undocumented = [
        action.option_strings or [action.dest]
        for action in serve._actions
        if action.dest != "help" and "default" not in (action.help or "")
    ]
    assert undocumented == []
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    assert "--max-header-bytes" in capsys.readouterr().out


def test_started_is_logged_once_the_socket_listens_and_never_when_binding_fails() -> None:
    port = free_port()
    with started_cli_server(["--store", "memory", "--auth", "none", "--port", str(port)]) as (_, started):
        assert started["listen"] == [f"127.0.0.1:{port}"]
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # accepted at once: the line came after the bind
        taken = subprocess.run(
            [*CLI, "serve", "--store", "memory", "--auth", "none", "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert taken.returncode == 3
    assert '"started"' not in taken.stderr
    assert "address already in use" in taken.stderr.lower()
    assert_only_json_lines(taken.stderr)


def test_ctrl_c_stops_serve_cleanly_without_a_traceback() -> None:
    """The README's way to stop ``serve``: SIGINT shuts it down and exits 0, with no KeyboardInterrupt traceback
    (uvicorn raises the signal again once it has shut down)."""
    with started_cli_server(["--store", "memory", "--port", str(free_port())]) as (proc, _):
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
        assert proc.stderr is not None
        rest = proc.stderr.read()
    assert "Traceback" not in rest
    assert "KeyboardInterrupt" not in rest


@pytest.mark.parametrize(
    ("command", "config", "message"),
    [
        (["serve", "--store", "sqlite:MISSING/events.db"], "", "cannot open sqlite store"),
        (["serve", "--store", "memory", "--issuer", "http://127.0.0.1:PORT"], "", "no authorization server metadata"),
        (
            ["gateway", "--store", "memory", "--config", "CONFIG"],
            '[[upstream]]\nname = "up"\nurl = "http://127.0.0.1:PORT/mcp"\n'
            'auth = { bearer_env = "MCPL_NO_SUCH_VAR" }\n',
            "environment variable MCPL_NO_SUCH_VAR (an upstream's bearer token) is not set",
        ),
    ],
)
def test_a_start_up_failure_is_one_explained_line_without_a_traceback(
    tmp_path: Path, command: list[str], config: str, message: str
) -> None:
    (tmp_path / "gateway.toml").write_text(config)
    argv = [
        a.replace("MISSING", str(tmp_path / "missing")).replace("CONFIG", str(tmp_path / "gateway.toml"))
        for a in command
    ]
    argv = [a.replace("PORT", str(free_port())) for a in argv]
    done = subprocess.run(
        [*CLI, *argv, "--port", str(free_port())], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 3
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert '"started"' not in done.stderr
    records = assert_only_json_lines(done.stderr)
    assert len([r for r in records if message in r["msg"]]) == 1, records  # the reason is said once


def assert_only_json_lines(stderr: str) -> list[dict[str, str]]:
    """A failed start prints no banner (no URL that does not answer) and nothing a JSON log reader cannot parse:
    uvicorn's own lines come in our format."""
    records = [json.loads(line) for line in stderr.splitlines()]
    assert records
    assert {r["level"] for r in records} == {"error"}
    return records


def test_every_url_the_banner_prints_answers() -> None:
    """What a new user clicks first: each URL ``serve`` prints is served (a GET may be the wrong method for an
    endpoint, never a 404)."""
    port = free_port()
    proc = subprocess.Popen(
        [*CLI, "serve", "--store", "memory", "--port", str(port)], stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    try:
        banner = []
        for line in proc.stderr:
            if line.startswith("{") and '"started"' in line:
                break
            banner.append(line)
        urls = [url for line in banner for url in re.findall(r"http://\S+", line)]
        assert len(urls) >= 6, banner
        with httpx.Client(timeout=10) as http:
            answers = {url: http.get(url).status_code for url in urls}
    finally:
        proc.terminate()
        proc.wait(10)
        proc.stderr.close()
    assert {url: status for url, status in answers.items() if status == 404 or status >= 500} == {}
