"""``mcp-lossless call`` answering a tool's requests for input, as a real CLI process against a real ``serve
--conformance`` process: ``--root``, ``--elicit``, the person at a terminal (a real pty), and nothing made up."""

from __future__ import annotations

import os
import pty
import select
import subprocess
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from mcp_lossless.client.command import EXIT_RESULT, EXIT_TOOL_ERROR
from tests.support.processes import CLI, ServerProcess, cli_server

COMMAND_TIMEOUT = 30


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    log = tmp_path_factory.mktemp("serve") / "conformance.log"
    with cli_server(["--conformance"], log) as server:
        yield server


def call(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, "call", f"{server.base}/mcp", *args],
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_elicit_values_answer_the_elicitation(server: ServerProcess) -> None:
    done = call(server, "test_elicitation", "message=Who?", "--elicit", "username=alice", "--elicit", "email=a@x.org")
    assert done.returncode == EXIT_RESULT, done.stderr
    assert done.stdout.strip() == 'User response: action=accept, content={"username":"alice","email":"a@x.org"}'


def test_elicit_values_that_miss_a_required_field_decline(server: ServerProcess) -> None:
    done = call(server, "test_elicitation", "message=Who?", "--elicit", "username=alice")
    assert done.returncode == EXIT_RESULT, done.stderr
    assert done.stdout.strip() == "User response: action=decline, content={}"


def test_roots_are_listed_as_file_uris(server: ServerProcess, tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    done = call(server, "test_input_required_result_list_roots", "--root", str(tmp_path / "a"), "--root", ".")
    assert done.returncode == EXIT_RESULT, done.stderr
    assert done.stdout.strip() == f"Client roots: {(tmp_path / 'a').as_uri()}, {Path.cwd().as_uri()}"


def test_without_a_terminal_or_values_no_elicitation_is_offered_and_the_call_fails_clearly(
    server: ServerProcess,
) -> None:
    done = call(server, "test_elicitation", "message=Who?")
    assert done.returncode == EXIT_TOOL_ERROR  # the fixture reports the missing capability as its error
    assert "Missing required client capability" in done.stderr


class Terminal:
    """The CLI with its stdin and stderr on a pty, as in a shell; stdout (the outcome) on a pipe."""

    def __init__(self, args: list[str]) -> None:
        self.master, replica = pty.openpty()
        self.proc = subprocess.Popen(args, stdin=replica, stderr=replica, stdout=subprocess.PIPE)
        os.close(replica)
        self.seen = b""

    def expect(self, text: bytes) -> None:
        """Read what the terminal shows until ``text`` appears (each read waits for output, with a deadline)."""
        while text not in self.seen:
            ready, _, _ = select.select([self.master], [], [], COMMAND_TIMEOUT)
            assert ready, f"no {text!r} on the terminal; it showed {self.seen!r}"
            self.seen += os.read(self.master, 4096)
        self.seen = self.seen[self.seen.index(text) + len(text) :]

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def outcome(self) -> tuple[int, bytes]:
        out, _ = self.proc.communicate(timeout=COMMAND_TIMEOUT)
        os.close(self.master)
        return self.proc.returncode, out


def test_a_terminal_asks_each_field_with_its_default_and_asks_again_for_a_bad_value(server: ServerProcess) -> None:
    terminal = Terminal([*CLI, "call", f"{server.base}/mcp", "test_elicitation_sep1034_defaults"])
    terminal.expect(b"The tool asks: Please review and update the form fields with defaults")
    terminal.expect(b'name (Your name) [string, default "John Doe"]: ')
    terminal.type("Ann")
    terminal.expect(b"age (Your age) [integer, default 30]: ")
    terminal.type("forty")  # not an integer: asked again
    terminal.expect(b"age (Your age) [integer, default 30]: ")
    terminal.type("41")
    terminal.expect(b"score (Your score) [number, default 95.5]: ")
    terminal.type("")  # the default
    terminal.expect(b'status (Your status) [string, default "active", one of active|inactive|pending]: ')
    terminal.type("gone")  # not a choice: asked again
    terminal.expect(b"status (Your status)")
    terminal.type("pending")
    terminal.expect(b"verified (Verified?) [boolean, default true]: ")
    terminal.type("false")
    status, out = terminal.outcome()
    assert status == EXIT_RESULT, out
    content = {"name": "Ann", "age": 41, "score": 95.5, "status": "pending", "verified": False}
    assert out.strip() == b"Elicitation completed: action=accept, content=" + orjson.dumps(content)


def test_end_of_input_at_the_terminal_declines(server: ServerProcess) -> None:
    terminal = Terminal([*CLI, "call", f"{server.base}/mcp", "test_elicitation", "message=Who?"])
    terminal.expect(b"The tool asks: Who?")
    terminal.expect(b"username")
    os.write(terminal.master, b"\x04")  # Ctrl-D: end of input
    status, out = terminal.outcome()
    assert status == EXIT_RESULT
    assert out.strip() == b"User response: action=decline, content={}"
