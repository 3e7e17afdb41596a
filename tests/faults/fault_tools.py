"""The tools every fault schedule calls: the demo tools (``search``, ``fetch``: idempotent) and ``charge`` (not).

Importable by file path too (``mcp-lossless serve tests/faults/fault_tools.py:TOOLS``), so it imports nothing of
``tests``: the failover and restart schedules serve it from real ``mcp-lossless serve`` processes.

``charge`` keeps a side-effect ledger (issue 28, acceptance 1): each run appends ``start <key> <amount>`` before
anything else and ``end``/``abort <key> <amount>`` when it returns or raises, ``<key>`` being the idempotency key it
runs under (``-`` for none), to one file per server process (``charge-<pid>.log``) in the directory named by
:data:`LEDGER_ENV` (or given to :func:`fault_tools`). The harness counts the runs per call from it, and tells a run
a SIGKILL cut short (a ``start`` with nothing after it in a killed process's file) from every other. Each line is
one unbuffered ``os.write`` to an ``O_APPEND`` file: once it returns the line is in the kernel, which a SIGKILL of
the process does not lose (no fsync: the machine does not crash in these tests), and processes never interleave
within a line.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.tools import ToolContext, ToolRegistry

LEDGER_ENV = "MCP_LOSSLESS_CHARGE_LEDGER"
"""The directory ``charge``'s ledger files go to, for a server process started by path (``TOOLS``)."""


def ledger_file(directory: Path, pid: int) -> Path:
    """The ledger of the server process ``pid``."""
    return directory / f"charge-{pid}.log"


def fault_tools(ledger: Path | None = None) -> ToolRegistry:
    """The tools; ``charge`` notes its runs in ``ledger`` (a directory), nowhere when ``None``."""
    registry = demo_tools()

    def note(what: str, key: str | None, amount: str) -> None:
        if ledger is None:
            return
        fd = os.open(ledger_file(ledger, os.getpid()), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{what} {key or '-'} {amount}\n".encode())
        finally:
            os.close(fd)

    @registry.tool(idempotent=False)
    async def charge(ctx: ToolContext, amount: str, steps: int = 3, delay_ms: int = 100) -> str:
        """Pretend to charge ``amount``; sends ``steps`` progress notifications ``delay_ms`` apart."""
        note("start", ctx.idempotency_key, amount)
        try:
            for step in range(1, steps + 1):
                if delay_ms > 0:
                    await asyncio.sleep(delay_ms / 1000)
                await ctx.report_progress(step, steps, f"charge step {step}/{steps}")
        except BaseException:
            note("abort", ctx.idempotency_key, amount)
            raise
        note("end", ctx.idempotency_key, amount)
        return f"charged {amount}"

    return registry


_directory = os.environ.get(LEDGER_ENV)
TOOLS = fault_tools(Path(_directory) if _directory else None)
