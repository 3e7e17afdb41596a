"""``mcp-lossless call`` as a user runs it: a real CLI process against a real ``mcp-lossless serve`` process."""

from __future__ import annotations

import re
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from mcp_lossless.cli import INTERRUPTED
from mcp_lossless.client.command import (
    EXIT_AUTHORIZATION,
    EXIT_MAY_HAVE_RUN,
    EXIT_RESULT,
    EXIT_SERVER,
    EXIT_TOOL_ERROR,
    EXIT_UNREACHED,
    EXIT_USAGE,
    exit_status,
)
from mcp_lossless.client.errors import (
    AuthorizationFailed,
    CallMayHaveRun,
    ConnectionFailed,
    DeadlineExceeded,
    ProtocolViolation,
    RemoteError,
    SessionLost,
    ToolFailed,
)
from mcp_lossless.core.arguments import ArgumentError, parse_tool_arguments, text_that_looks_like_json
from mcp_lossless.core.errors import UPSTREAM_FAILED
from tests.interop.peers.sdk_modern_server import MODERN, modern_only_sdk_server
from tests.support.processes import CLI, ServerProcess, call_killed_midway, cli_server, free_port

CREDENTIALS = ["--client-id", "dev-client", "--client-secret", "dev-secret"]
COMMAND_TIMEOUT = 30


@pytest.fixture(scope="module")
def authorized(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("serve") / "authorized.log"
    with cli_server(["--store", "memory", "--retry-ms", "100"], log) as server:
        yield server


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("serve") / "open.log"
    with cli_server(["--store", "memory", "--auth", "none"], log) as server:
        yield server


def call(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "call", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False, stdin=None
    )


def test_result_with_client_credentials_as_json_and_progress_on_stderr(authorized: ServerProcess) -> None:
    url = f"{authorized.base}/mcp"
    done = call(url, "search", "query=lossless", "steps:=3", "delay_ms:=20", *CREDENTIALS, "--json")
    assert done.returncode == EXIT_RESULT, done.stderr
    document = orjson.loads(done.stdout)
    assert document["outcome"] == "result"
    assert document["result"]["content"][0]["text"] == "search results for 'lossless': 3 documents"
    assert [line for line in done.stderr.splitlines() if line.startswith("progress")] == [
        "progress 1/3 search step 1/3",
        "progress 2/3 search step 2/3",
        "progress 3/3 search step 3/3",
    ]


def test_a_tool_our_server_runs_as_a_task_shows_the_task_and_its_progress_from_its_event_stream(
    authorized: ServerProcess,
) -> None:
    """``fetch`` runs as a task on 2026-07-28, followed by ``tasks/stream``: stderr shows the task, each of its
    progress events once and in order, and its end; stdout has the result. The call never used a session."""
    url = f"{authorized.base}/mcp"
    done = call(url, "fetch", "url=https://example.com/task", "steps:=4", "delay_ms:=100", *CREDENTIALS)
    assert done.returncode == EXIT_RESULT, done.stderr
    assert done.stdout.strip() == "contents of https://example.com/task: 24 bytes"
    lines = [line for line in done.stderr.splitlines() if line.startswith("task ")]
    assert len({line.split()[1] for line in lines}) == 1, f"one task: {lines}"
    assert lines[0].endswith(" working") and lines[-1].endswith(" completed"), lines
    progress = [line for line in done.stderr.splitlines() if line.startswith("progress ")]
    assert progress == [f"progress {n}/4 fetch step {n}/4" for n in range(1, 5)], done.stderr


def test_ctrl_c_mid_call_is_one_line_and_exit_130(authorized: ServerProcess) -> None:
    """Ctrl-C while the tool runs: one line saying so, no KeyboardInterrupt traceback, no result printed."""
    proc = subprocess.Popen(
        [*CLI, "call", f"{authorized.base}/mcp", "fetch", "url=https://example.com/c", "steps:=600", *CREDENTIALS],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    assert proc.stderr.readline().startswith("task "), "the call is under way"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=COMMAND_TIMEOUT)
    assert proc.returncode == INTERRUPTED, err
    assert "Traceback" not in err
    assert err.splitlines()[-1] == "mcp-lossless call: interrupted"
    assert out == ""


def test_a_2026_only_server_is_called_without_a_session() -> None:
    """The Python SDK's 2026-07-28 leg with its legacy leg refused: the probe finds it, the call runs there."""
    with modern_only_sdk_server() as sdk:
        done = call(sdk.url, "count", "n:=3")
        seen, refused = list(sdk.requests), sdk.refused
    assert done.returncode == EXIT_RESULT, done.stderr
    assert done.stdout.strip() == "counted to 3"
    assert [line for line in done.stderr.splitlines() if line.startswith("progress")] == [
        "progress 1/3 step 1/3",
        "progress 2/3 step 2/3",
        "progress 3/3 step 3/3",
    ]
    assert [m for m, _ in seen] == ["server/discover", "tools/list", "tools/call"]
    assert {v for _, v in seen} == {MODERN} and refused == 0


def test_no_credentials_needed_when_the_server_asks_for_none(open_server: ServerProcess) -> None:
    done = call(f"{open_server.base}/mcp", "fetch", "url=https://example.com/x", "steps:=1", "delay_ms:=0")
    assert done.returncode == EXIT_RESULT, done.stderr
    assert done.stdout.strip() == "contents of https://example.com/x: 21 bytes"


def test_arguments_follow_httpie_text_and_raw_json(open_server: ServerProcess) -> None:
    """``query=5`` is the string "5"; ``query:=5`` is the number 5, which the tool refuses (it wants a string)."""
    string = call(f"{open_server.base}/mcp", "search", "query=5", "steps:=1", "delay_ms:=0")
    assert string.returncode == EXIT_RESULT, string.stderr
    assert string.stdout.strip() == "search results for '5': 3 documents"
    number = call(f"{open_server.base}/mcp", "search", "query:=5", "steps:=1", "delay_ms:=0", "--json")
    assert number.returncode == EXIT_SERVER
    assert "query" in orjson.loads(number.stdout)["reason"]
    steps = call(f"{open_server.base}/mcp", "search", "query=x", "steps:=2", "delay_ms:=0")
    assert steps.returncode == EXIT_RESULT
    assert [line for line in steps.stderr.splitlines() if line.startswith("progress")] == [
        "progress 1/2 search step 1/2",
        "progress 2/2 search step 2/2",
    ]


def test_a_number_sent_as_text_is_refused_with_the_json_form_named(open_server: ServerProcess) -> None:
    """``steps=2`` sends the text "2", which the tool's published schema (an integer) refuses: the refusal says
    which ``KEY:=JSON`` sends the number; a text argument that only looks like text gets no such hint."""
    done = call(f"{open_server.base}/mcp", "search", "query=5", "steps=2", "delay_ms:=0")
    assert done.returncode == EXIT_SERVER
    assert "steps" in done.stderr and "for JSON write steps:=2" in done.stderr
    assert "query:=5" not in done.stderr  # query=5 is the string the tool wants, and the server said nothing of it
    refused = call(f"{open_server.base}/mcp", "search", "query:=5", "steps:=2")
    assert refused.returncode == EXIT_SERVER and "for JSON write" not in refused.stderr


def test_options_may_come_between_the_tools_arguments(open_server: ServerProcess) -> None:
    done = call(f"{open_server.base}/mcp", "search", "--timeout", "20", "query=x", "--json", "steps:=2", "delay_ms:=0")
    assert done.returncode == EXIT_RESULT, done.stderr
    assert orjson.loads(done.stdout)["result"]["content"][0]["text"] == "search results for 'x': 3 documents"
    assert "progress 2/2" in done.stderr


def test_authorization_needed_but_no_credentials(authorized: ServerProcess) -> None:
    done = call(f"{authorized.base}/mcp", "search", "query=x")
    assert done.returncode == EXIT_AUTHORIZATION
    assert "authorization failed" in done.stderr and "no credentials" in done.stderr
    assert "give --client-id" in done.stderr, "the way out is named"


def test_a_url_without_an_mcp_endpoint_is_named_with_the_status_it_answered(open_server: ServerProcess) -> None:
    done = call(f"{open_server.base}/nowhere", "search", "query=x")
    assert done.returncode == EXIT_SERVER, done.stderr
    assert "HTTP 404" in done.stderr and "no resource at /nowhere" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_url_without_a_path_says_the_endpoint_usually_has_one(open_server: ServerProcess) -> None:
    done = call(f"{open_server.base}/", "search", "query=x")
    assert done.returncode == EXIT_SERVER, done.stderr
    assert "HTTP 404" in done.stderr and "an MCP endpoint usually has one, such as /mcp" in done.stderr
    elsewhere = call(f"{open_server.base}/nowhere", "search", "query=x")
    assert "such as /mcp" not in elsewhere.stderr, "a URL with a path gets no guess"


def test_credentials_for_a_url_short_of_the_endpoint_name_the_resource_the_metadata_describes(
    authorized: ServerProcess,
) -> None:
    """The origin's metadata describes ``…/mcp``; the URL given stops short of it, so the AS refuses the origin as
    a resource (``invalid_target``) and the error names the resource the server does describe."""
    done = call(authorized.base, "search", "query=x", *CREDENTIALS)
    assert done.returncode == EXIT_AUTHORIZATION, done.stderr
    assert "invalid_target" in done.stderr
    assert f"the server's metadata describes {authorized.base}/mcp: is that the MCP endpoint?" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_confidential_client_without_its_secret_names_the_missing_flag(tmp_path: Path) -> None:
    """``--client-id dev-client`` alone runs the browser flow (a public client's), which the dev AS refuses at the
    code exchange: the error names the flag that is missing, not only ``invalid_client``."""
    with cli_server(["--store", "memory", "--auto-approve"], tmp_path / "serve.log") as server:
        proc = subprocess.Popen(
            [*CLI, "call", f"{server.base}/mcp", "search", "query=x", "--client-id", "dev-client"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert proc.stderr is not None
        opened = proc.stderr.readline()
        assert opened.startswith("Open to authorize: "), opened
        browser = httpx.get(opened.removeprefix("Open to authorize: ").strip(), timeout=COMMAND_TIMEOUT)
        assert browser.status_code == 302, "the auto-approving dev AS redirects to the command's listener"
        httpx.get(browser.headers["location"], timeout=COMMAND_TIMEOUT)
        out, err = proc.communicate(timeout=COMMAND_TIMEOUT)
    assert proc.returncode == EXIT_AUTHORIZATION, err
    assert "invalid_client" in err and "dev-client was sent without a secret" in err
    assert err.rstrip().endswith("give --client-secret (client_credentials, no browser), or the id of a public client")
    assert out == ""


def test_wrong_secret_is_an_authorization_failure(authorized: ServerProcess) -> None:
    secret = "wrong-s3cret-value"
    done = call(f"{authorized.base}/mcp", "search", "query=x", "--client-id", "dev-client", "--client-secret", secret)
    assert done.returncode == EXIT_AUTHORIZATION
    assert "invalid_client" in done.stderr
    assert secret not in done.stderr + done.stdout


def test_unknown_tool_is_a_server_refusal(authorized: ServerProcess) -> None:
    done = call(f"{authorized.base}/mcp", "nosuch", *CREDENTIALS, "--json")
    assert done.returncode == EXIT_SERVER
    document = orjson.loads(done.stdout)
    assert document == {"outcome": "error", "kind": "remote_error", "reason": document["reason"], "exit": EXIT_SERVER}
    assert "nosuch" in document["reason"]


def test_deadline(authorized: ServerProcess) -> None:
    done = call(
        f"{authorized.base}/mcp",
        "fetch",
        "url=u",
        "steps:=5",
        "delay_ms:=1000",
        *CREDENTIALS,
        "--timeout",
        "1.5",
        "--json",
    )
    assert done.returncode == EXIT_UNREACHED
    document = orjson.loads(done.stdout)
    assert document["kind"] == "deadline"
    assert document["reason"] == "no outcome within --timeout 1.5 s", "the timeout given, not the time left"
    url = f"{authorized.base}/mcp"
    human = call(url, "fetch", "url=u", "steps:=5", "delay_ms:=1000", *CREDENTIALS, "--timeout", "1.5")
    assert human.returncode == EXIT_UNREACHED
    assert "no outcome within --timeout 1.5 s" in human.stderr


@pytest.mark.parametrize(
    "credentials",
    [[], CREDENTIALS, ["--client-id", "dev-public"]],
    ids=["none", "client-credentials", "authorization-code"],
)
def test_unreachable_server_is_a_connection_error_with_or_without_credentials(credentials: list[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}/mcp"
    done = call(url, "search", "query=x", "--timeout", "5", *credentials)
    assert done.returncode == EXIT_UNREACHED, done.stderr
    assert f"no outcome (connection): cannot reach {url}: connection refused; check that the server is running" in (
        done.stderr
    )
    assert "token endpoint" not in done.stderr and "Traceback" not in done.stderr
    assert not re.search(r"\w+Error\(", done.stderr), f"a sentence, not an exception's repr: {done.stderr}"


def test_a_server_killed_mid_task_may_have_run(tmp_path: Path) -> None:
    """SIGKILL the server while the CLI follows the task it runs: no traceback, the call may have run (3), said in
    one line once the deadline passes with the server still gone; never "the tool reported an error" (1)."""
    with cli_server(["--store", "memory"], tmp_path / "serve.log") as server:
        url = f"{server.base}/mcp"
        args = [url, "fetch", "url=u", "steps:=600", "delay_ms:=100", *CREDENTIALS, "--timeout", "4"]
        done = call_killed_midway(server.kill, args, " fetch step ")
    assert done.returncode == EXIT_MAY_HAVE_RUN, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    last = done.stderr.splitlines()[-1]
    assert last.startswith("mcp-lossless call: the call may have run, but its result was not received (may_have_run)")
    assert "the server stopped answering (connection refused)" in last and "it may have run" in last, last


def test_a_server_killed_mid_stream_of_an_idempotent_tool_is_unreachable(tmp_path: Path) -> None:
    """``search`` (idempotent) streams within its request: its broken stream is sent again, which finds no server:
    5, one line naming the refused connection."""
    with cli_server(["--store", "memory"], tmp_path / "serve.log") as server:
        url = f"{server.base}/mcp"
        args = [url, "search", "query=q", "steps:=600", "delay_ms:=100", *CREDENTIALS, "--timeout", "20"]
        done = call_killed_midway(server.kill, args, "progress 1/600 ")
    assert done.returncode == EXIT_UNREACHED, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.splitlines()[-1] == (
        f"mcp-lossless call: no outcome (connection): cannot reach {url}: connection refused; check that the server "
        "is running at that URL"
    )


NOT_IDEMPOTENT = """
import asyncio
from mcp_lossless.server import ToolContext, ToolRegistry

tools = ToolRegistry()


@tools.tool()
async def charge(ctx: ToolContext, amount: int) -> str:
    \"\"\"Not idempotent: streams progress until the server is killed.\"\"\"
    for step in range(1, 601):
        await ctx.report_progress(step, 600, f"charging {amount}")
        await asyncio.sleep(0.1)
    return "charged"
"""


def test_a_server_killed_mid_stream_of_a_keyed_tool_that_may_not_run_twice_may_have_run(tmp_path: Path) -> None:
    """A tool that is not idempotent, keyed: its broken stream is re-issued under its key, which finds no server.
    The tool was running: 3 (may have run), naming the key that gets its outcome, never 5 ("did not run")."""
    (tmp_path / "charges.py").write_text(NOT_IDEMPOTENT)
    with cli_server([f"{tmp_path / 'charges.py'}:tools", "--store", "memory"], tmp_path / "serve.log") as server:
        url, key = f"{server.base}/mcp", "charge-4d1f"
        args = [url, "charge", "amount:=5", *CREDENTIALS, "--timeout", "20", "--idempotency-key", key]
        done = call_killed_midway(server.kill, args, "progress 1/600 ")
    assert done.returncode == EXIT_MAY_HAVE_RUN, done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""
    assert done.stderr.splitlines()[-1] == (
        "mcp-lossless call: the call may have run, but its result was not received (may_have_run): the response of "
        "charge broke and the server could not be reached again (connection refused); the call may have run: "
        f"re-issue it under idempotency key '{key}' for its outcome"
    )


@pytest.fixture
def resetting_listener() -> Iterator[int]:
    """A loopback port whose every connection is reset (RST) as soon as the request arrives: a network failure
    after connecting, as a crashing server or a middlebox gives."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()
        thread.join(5)


@pytest.mark.parametrize("credentials", [[], CREDENTIALS], ids=["none", "client-credentials"])
def test_a_connection_reset_is_unreachable_not_a_protocol_breach(
    resetting_listener: int, credentials: list[str]
) -> None:
    url = f"http://127.0.0.1:{resetting_listener}/mcp"
    done = call(url, "search", "query=x", "--timeout", "5", *credentials)
    assert done.returncode == EXIT_UNREACHED, done.stderr
    assert done.stderr.strip() == (
        f"mcp-lossless call: no outcome (connection): cannot reach {url}: the connection broke while reading the "
        "response; check that the server is running at that URL"
    )


def test_a_host_name_that_does_not_resolve_is_unreachable() -> None:
    url = "http://mcp-lossless-test.invalid/mcp"  # .invalid never resolves (RFC 6761)
    done = call(url, "search", "query=x", "--timeout", "5")
    assert done.returncode == EXIT_UNREACHED, done.stderr
    assert done.stderr.strip() == (
        f"mcp-lossless call: no outcome (connection): cannot reach {url}: the host name did not resolve; check that "
        "the server is running at that URL"
    )


def test_a_tool_reporting_an_error_exits_1(tmp_path: Path) -> None:
    with cli_server(["--conformance"], tmp_path / "serve.log") as server:
        done = call(f"{server.base}/mcp", "test_error_handling")
    assert done.returncode == EXIT_TOOL_ERROR, done.stderr
    assert done.stdout.strip() == "This tool intentionally returns an error for testing"
    assert done.stderr.strip().startswith("mcp-lossless call: the tool reported an error (tool_error)")


def test_https_to_a_plain_http_server_says_so(open_server: ServerProcess) -> None:
    url = f"https://127.0.0.1:{open_server.port}/mcp"
    done = call(url, "search", "query=x")
    assert done.returncode == EXIT_UNREACHED, done.stderr
    assert f"cannot reach {url}: the TLS handshake failed (WRONG_VERSION_NUMBER: a plain http:// server?)" in (
        done.stderr
    )


@pytest.mark.parametrize("url", ["127.0.0.1:8000/mcp", "localhost/mcp", "ftp://127.0.0.1/mcp"])
@pytest.mark.parametrize("credentials", [[], CREDENTIALS], ids=["none", "credentials"])
def test_url_without_http_scheme_is_a_usage_error(url: str, credentials: list[str]) -> None:
    done = call(url, "search", "query=x", *credentials)
    assert done.returncode == EXIT_USAGE
    assert f"{url!r} is not an http:// or https:// URL" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


@pytest.mark.parametrize(
    "args",
    [["search", "query"], ["search", "=x"], ["search", ":=1"], ["search", "a=1", "a=2"], ["search", "a=1", "a:=2"],
     ["search", "n:=not-json"], ["search", "--timeout", "0"], ["search", "--client-secret", "s"],
     ["search", "--no-such-flag"]],
)  # fmt: skip
def test_usage_errors(args: list[str]) -> None:
    done = call("http://127.0.0.1:9/mcp", *args)
    assert done.returncode == EXIT_USAGE
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--elicit", "name"], "--elicit: argument 'name' is neither KEY=TEXT nor KEY:=JSON"),
        (["--root", "/no/such/dir"], "--root '/no/such/dir': no such file or directory"),
        (  # an empty key was replaced by a fresh one: a repeated command ran the tool again
            ["--idempotency-key", ""],
            "--idempotency-key '': idempotencyKey must be a non-empty string of at most 255 characters",
        ),
        (
            ["--idempotency-key", "k" * 256],
            f"--idempotency-key '{'k' * 256}': idempotencyKey must be a non-empty string of at most 255 characters",
        ),
    ],
)
def test_input_flags_are_checked_before_the_call(args: list[str], message: str) -> None:
    # a missing --root was sent as a file URI if and when the tool asked; --elicit's error named no flag
    done = call("http://127.0.0.1:9/mcp", "search", *args)
    assert done.returncode == EXIT_USAGE
    assert f"mcp-lossless call: {message}" in done.stderr and done.stdout == ""


def test_help_documents_every_exit_status() -> None:
    done = call("--help")
    assert done.returncode == 0
    for status in range(7):
        assert f"\n  {status}  " in done.stdout


def test_argument_values() -> None:
    parsed = parse_tool_arguments(
        ["n:=5", "b:=true", "nothing:=null", "list:=[1,2]", 'obj:={"a": "b=c"}', 'quoted:="5"', "text=hello world",
         "five=5", "t=true", "e=", "eq=a=b", "url=http://x/?q=1"]
    )  # fmt: skip
    assert parsed == {
        "n": 5, "b": True, "nothing": None, "list": [1, 2], "obj": {"a": "b=c"}, "quoted": "5",
        "text": "hello world", "five": "5", "t": "true", "e": "", "eq": "a=b", "url": "http://x/?q=1",
    }  # fmt: skip
    for bad in (["novalue"], ["n:=nope"], [":=1"], ["a=1", "a:=1"]):
        with pytest.raises(ArgumentError):
            parse_tool_arguments(bad)
    looks = ["n=5", "b=true", "z=null", "l=[1]", "s=hello", 'q="5"', "j:=5", "novalue", "e=", "nn=7"]
    refusal = "invalid arguments: n, b, z, l, s, q, j, novalue, e: wrong type"
    assert text_that_looks_like_json(looks, refusal) == ["n:=5", "b:=true", "z:=null", "l:=[1]"]


def test_exit_status_per_outcome() -> None:
    assert exit_status(ToolFailed("failed", None)) == EXIT_TOOL_ERROR
    assert exit_status(CallMayHaveRun("lost")) == EXIT_MAY_HAVE_RUN
    assert exit_status(SessionLost("gone")) == EXIT_MAY_HAVE_RUN
    assert exit_status(AuthorizationFailed("no")) == EXIT_AUTHORIZATION
    assert exit_status(DeadlineExceeded("late")) == EXIT_UNREACHED
    assert exit_status(ConnectionFailed("down")) == EXIT_UNREACHED
    assert exit_status(TimeoutError()) == EXIT_UNREACHED
    assert exit_status(RemoteError(-32602, "bad")) == EXIT_SERVER
    assert exit_status(ProtocolViolation("bad frames")) == EXIT_SERVER


@pytest.mark.parametrize(
    ("data", "status"),
    [
        ({"reason": "unreachable", "upstream": "u", "mayHaveRun": False}, EXIT_UNREACHED),
        ({"reason": "deadline", "upstream": "u", "mayHaveRun": False}, EXIT_UNREACHED),
        ({"reason": "deadline", "upstream": "u", "mayHaveRun": True}, EXIT_MAY_HAVE_RUN),
        ({"reason": "closed", "upstream": "u", "mayHaveRun": True}, EXIT_MAY_HAVE_RUN),
        ({"reason": "rejected", "upstream": "u", "mayHaveRun": False}, EXIT_SERVER),
        ({"reason": "protocol", "upstream": "u", "mayHaveRun": False}, EXIT_SERVER),
        (None, EXIT_SERVER),
    ],
)
def test_a_gateways_upstream_failure_exits_as_the_same_outcome_would(data: object, status: int) -> None:
    """``UPSTREAM_FAILED`` (docs/gateway.md): unreachable or past its deadline without running is 5, may have run 3,
    refused or broken 6."""
    assert exit_status(RemoteError(UPSTREAM_FAILED, "upstream u failed", data)) == status


def test_the_same_idempotency_key_again_is_answered_with_the_first_runs_outcome_and_says_so(
    authorized: ServerProcess,
) -> None:
    """``--idempotency-key``: a command run again after a crash or a lost answer gets the recorded outcome; the
    tool does not run again (no progress for the second command) and both output forms say it was replayed."""
    url, key = f"{authorized.base}/mcp", "cli-key-0b5c4d1e-7f2a-4c3b-9e8d-112233445566"
    command = (url, "search", "query=once", "steps:=2", "delay_ms:=20", *CREDENTIALS, "--idempotency-key", key)
    first = call(*command)
    again = call(*command)
    machine = call(*command, "--json")

    assert first.returncode == again.returncode == machine.returncode == EXIT_RESULT, first.stderr + again.stderr
    assert first.stdout == again.stdout == "search results for 'once': 3 documents\n"
    assert [line for line in first.stderr.splitlines() if line.startswith("progress")] == [
        "progress 1/2 search step 1/2",
        "progress 2/2 search step 2/2",
    ]
    assert "replayed" not in first.stderr, "the first command ran the tool"
    assert "progress" not in again.stderr, "the second did not"
    assert "mcp-lossless call: outcome replayed: the tool ran once, for an earlier try" in again.stderr
    document = orjson.loads(machine.stdout)
    assert (
        document["replayed"] is True
        and document["result"]["content"][0]["text"] == "search results for 'once': 3 documents"
    )
    other = call(url, "search", "query=other", *CREDENTIALS, "--idempotency-key", key)
    assert other.returncode == EXIT_SERVER, "the key with other arguments conflicts"
    assert f"-32602: idempotency key '{key}' was used with another tool or other arguments" in other.stderr


def test_the_same_idempotency_key_for_a_task_gets_the_same_task_and_says_replayed(authorized: ServerProcess) -> None:
    """``fetch`` runs as a task: the command run again under its key follows the same task (the server marks its
    ``CreateTaskResult`` replayed) and says so, as for a call answered within its request."""
    url, key = f"{authorized.base}/mcp", "cli-task-key-5e0c"
    command = (url, "fetch", "url=https://e/once", "steps:=2", "delay_ms:=20", *CREDENTIALS, "--idempotency-key", key)
    first = call(*command)
    again = call(*command, "--json")

    assert first.returncode == again.returncode == EXIT_RESULT, first.stderr + again.stderr
    task_lines = [line for line in first.stderr.splitlines() if line.startswith("task ")]
    assert task_lines and task_lines[0].endswith(" working")
    assert task_lines[0] in again.stderr, "the same task"
    assert "replayed" not in first.stderr, "the first command ran the tool"
    document = orjson.loads(again.stdout)
    assert document["replayed"] is True
    assert document["result"]["content"] == [{"type": "text", "text": "contents of https://e/once: 14 bytes"}]
    shown = call(*command)
    assert "mcp-lossless call: outcome replayed: the tool ran once, for an earlier try" in shown.stderr
