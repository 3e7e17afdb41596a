"""Ctrl-C while ``mcp-lossless`` is still starting (importing the server's modules, building its parsers): one
line and exit 130, never a traceback. The SIGINT is sent by the process itself as the first of those imports
begins, so the test does not race the start-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from mcp_lossless.cli import INTERRUPTED

SCRIPT = Path(sys.executable).parent / "mcp-lossless"
"""The console script pip generated from pyproject's [project.scripts]: what a user's shell runs."""

INTERRUPT_WHILE_IMPORTING = """
import os, runpy, signal, sys

module, script = sys.argv[1:3]

class Interrupt:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: KeyboardInterrupt inside this import
        return None

signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal's foreground job, whatever ran us
sys.meta_path.insert(0, Interrupt())
sys.argv = [script, *sys.argv[3:]]
runpy.run_path(script, run_name="__main__")
"""


@pytest.mark.parametrize(
    ("module", "args", "line"),
    [
        ("mcp_lossless.server", ["serve", "--store", "memory"], "mcp-lossless: interrupted"),
        ("mcp_lossless.client.command", ["call", "http://127.0.0.1:9/mcp", "search"], "mcp-lossless: interrupted"),
        ("mcp_lossless.server.serving", ["serve", "--store", "memory"], "mcp-lossless serve: interrupted"),
    ],
    ids=["config-import", "call-parser-import", "serving-import"],
)
def test_ctrl_c_while_starting_is_one_line_and_exit_130(module: str, args: list[str], line: str) -> None:
    assert SCRIPT.exists(), f"the console script is installed beside {sys.executable}"
    done = subprocess.run(
        [sys.executable, "-c", INTERRUPT_WHILE_IMPORTING, module, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == INTERRUPTED, done.stderr
    assert done.stderr.splitlines() == [line]
    assert done.stdout == ""
