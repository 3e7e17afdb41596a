"""A non-idempotent ``charge`` tool whose runs are counted across processes: the side effect that tests of
idempotency keys across restarts, replicas and gateways count. Each run appends its ``amount`` as a line to a runs
file, so a server killed mid-run still leaves its run on record."""

from __future__ import annotations

from pathlib import Path

TOOLS = '''
import asyncio
from pathlib import Path

from mcp_lossless.server.tools import ToolContext, ToolRegistry

tools = ToolRegistry()


@tools.tool()
async def charge(ctx: ToolContext, amount: str, steps: int = 1) -> str:
    """Not idempotent: each run is one line in the runs file (the side effect, counted across processes)."""
    with Path({runs!r}).open("a") as runs:
        runs.write(amount + "\\n")
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps)
        if step < steps:
            await asyncio.sleep(0.2)
    return f"charged {{amount}}"
'''


def charging_module(root: Path) -> tuple[Path, Path]:
    """Write the tool module under ``root``: its path (``<path>:tools`` for the CLI) and its runs file's."""
    runs, module = root / "runs.txt", root / "charging.py"
    module.write_text(TOOLS.format(runs=str(runs)))
    return module, runs


def runs_of(runs: Path) -> list[str]:
    """The amounts charged so far, a run each, in order."""
    return runs.read_text().split() if runs.exists() else []
