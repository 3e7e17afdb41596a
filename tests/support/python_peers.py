"""Python peers whose pins clash with the project's, each in a virtualenv of its own: installed on first use.

``fastmcp-tasks`` (the one tasks-extension runtime there is) pins ``fastmcp-slim==4.1.4``; the project pins
``fastmcp==4.2.3``. So the peer gets its own venv under ``$MCP_LOSSLESS_CACHE`` (beside the Node packages),
marked complete only after pip succeeded, under the same file lock. Tests never skip: when an install is
impossible they fail with what to run by hand.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path

from tests.support.node import INSTALL_TIMEOUT, _locked, cache_root

FASTMCP_TASKS = ("fastmcp-tasks==4.1.4", "fastmcp-slim[server]==4.1.4")


class PeerSetupError(RuntimeError):
    """A peer's virtualenv could not be made; the message says what to run by hand."""


def _venv(name: str, requirements: tuple[str, ...]) -> Path:
    """The Python of a venv holding exactly ``requirements``, made once."""
    root = cache_root()
    prefix = root / f"pyvenv-{name}"
    spec = "\n".join(requirements) + "\n"
    python = prefix / "bin" / "python"
    with _locked(root):
        marker = prefix / ".complete"
        if marker.is_file() and marker.read_text() == spec and python.exists():
            return python
        shutil.rmtree(prefix, ignore_errors=True)
        steps = [
            [sys.executable, "-m", "venv", str(prefix)],
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *requirements],
        ]
        for command in steps:
            try:
                done = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT, check=False)
            except subprocess.TimeoutExpired:
                raise PeerSetupError(f"`{' '.join(command)}` did not finish in {INSTALL_TIMEOUT}s") from None
            if done.returncode != 0:
                raise PeerSetupError(
                    f"`{' '.join(command)}` failed (rc {done.returncode}); is PyPI reachable?\n{done.stderr[-3000:]}"
                )
        marker.write_text(spec)
    return python


@functools.cache
def fastmcp_tasks_python() -> Path:
    """A Python with FastMCP 4.1 and ``fastmcp-tasks`` (run peers/fastmcp_tasks_server.py with it)."""
    return _venv("fastmcp-tasks-4.1.4", FASTMCP_TASKS)
