"""The README's code blocks, run as written: the curl walkthrough pasted whole into bash, the library example's
files and the commands that serve and call them. Blocks that are not meant to run (a synopsis, the layout) are
listed by their first line, so a new block cannot slip in untested."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
from pathlib import Path

import orjson

from tests.support.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
NOT_RUN = {
    "make run    # installs into .venv and serves on http://127.0.0.1:8000/mcp (embedded dev authorization server, "
    "SQLite store)",
    "mcp-lossless serve [TARGET] [--store memory | sqlite:PATH[?S=V] | redis://HOST:PORT[/DB][?S=V]] [--issuer dev | "
    "ISSUER_URL]",
    "src/mcp_lossless/",
}
"""First lines of the blocks that are documentation only: ``make`` itself (the suite runs inside it), the
command synopsis, the source layout."""


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(README.read_text())]


def run_bash(script: str, timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``script`` in a fresh, non-interactive bash from the repository root, as a user pastes it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MCP_LOSSLESS")}
    env["PORT"] = str(free_port())
    process = subprocess.Popen(
        ["bash", "--noprofile", "--norc"],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its background server goes with it if the script fails half-way
    )
    try:
        out, err = process.communicate(script, timeout=timeout)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # whatever the script left running, e.g. after a failure
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def test_every_block_is_run_or_known_not_to_be() -> None:
    firsts = {body.splitlines()[0] for _, body in blocks()}
    runnable = {body.splitlines()[0] for lang, body in blocks() if lang == "sh" and "SERVER=$!" in body}
    python = {body.splitlines()[0] for lang, body in blocks() if lang == "python"}
    assert firsts - runnable - python == NOT_RUN
    assert len(runnable) == 4 and len(python) == 2


def test_the_library_example_is_the_shipped_files() -> None:
    python = [body for lang, body in blocks() if lang == "python"]
    assert python == [(ROOT / "examples" / "tools.py").read_text(), (ROOT / "examples" / "client.py").read_text()]


def script(marker: str) -> str:
    [body] = [body for lang, body in blocks() if lang == "sh" and "SERVER=$!" in body and marker in body]
    return body


def test_curl_walkthrough_pasted_whole_shows_both_refusals_and_the_lossless_resume() -> None:
    done = run_bash(script("last-event-id"))
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    out = done.stdout
    in_band, _, rest = out.partition("HTTP/1.1 403 Forbidden")
    assert rest, out
    assert '"code":-32041' in in_band and "requiredResources" in in_band, "the committed resume: an in-band error"
    assert 'www-authenticate: Bearer error="insufficient_scope"' in rest
    assert out.count("fetch step 2/3") == 1 and out.count("fetch step 3/3") == 1, "each remaining event once"
    assert out.count("contents of https://example.com: 19 bytes") == 1
    assert out.index("fetch step 2/3") > out.index("HTTP/1.1 403 Forbidden"), "nothing leaked to the narrowed token"


def test_library_example_serves_and_calls_as_written() -> None:
    done = run_bash(script("examples/tools.py:tools"))
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert done.stdout.splitlines() == [
        "progress page 1/3",
        "progress page 2/3",
        "progress page 3/3",
        "3 pages of results for 'lossless'",
    ]


def test_call_from_the_shell_shows_progress_then_a_task_polled_to_its_result() -> None:
    done = run_bash(script("mcp-lossless call $URL"))
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    assert done.stdout.splitlines() == [
        "search results for 'lossless': 3 documents",
        "contents of https://example.com: 19 bytes",
    ]
    progress = [line for line in done.stderr.splitlines() if line.startswith("progress")]
    search = [f"progress {n}/3 search step {n}/3" for n in (1, 2, 3)]
    fetch = [f"progress {n}/4 fetch step {n}/4" for n in (1, 2, 3, 4)]  # the task's, from its event stream
    assert progress == search + fetch, "each progress once, in order"
    tasks = [line.split(" ", 2) for line in done.stderr.splitlines() if line.startswith("task ")]
    assert len({task_id for _, task_id, _ in tasks}) == 1, "one task, named on each line"
    states = [state for _, _, state in tasks]
    assert states[0].startswith("working") and states[-1] == "completed"


def test_a_2026_07_28_call_with_curl_is_answered_replayed_then_polled_as_a_task() -> None:
    """The stateless walkthrough: the headers and ``_meta`` it shows are what the server asks; a repeated key is
    replayed, not run again; a task is polled with ``tasks/get`` to its result."""
    done = run_bash(script("tasks/get"))
    assert done.returncode == 0, done.stderr[-3000:] + done.stdout[-3000:]
    first, again, polled = (orjson.loads(line) for line in done.stdout.splitlines())
    text = {"type": "text", "text": "search results for 'x': 3 documents"}
    assert first["result"]["content"] == [text] and "_meta" not in first["result"], first
    assert again["result"]["content"] == [text], again
    assert again["result"]["_meta"] == {"io.github.mcp-lossless/replayed": True}, again
    assert polled["result"]["status"] == "completed", polled
    assert polled["result"]["result"]["content"][0]["text"] == "contents of https://example.com: 19 bytes", polled


def test_make_run_passes_its_args_to_serve() -> None:
    """The README's ``make run ARGS='…'``: the flags reach ``serve`` (``make -n`` prints the command it would run)."""
    done = subprocess.run(
        ["make", "-n", "run", "ARGS=--port 8001 --store memory"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert ".venv/bin/mcp-lossless serve --port 8001 --store memory" in done.stdout.splitlines()
    assert "make run ARGS='--port 8001" in README.read_text()
