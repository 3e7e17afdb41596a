"""The tools every fault schedule calls: the demo tools (``search``, ``fetch``: idempotent) and ``charge`` (not).

Importable by file path too (``mcp-lossless serve tests/faults/fault_tools.py:TOOLS``), so it imports nothing of
``tests``: the failover schedules serve it from real ``mcp-lossless serve`` processes.
"""

from __future__ import annotations

import asyncio

from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.tools import ToolContext, ToolRegistry


def fault_tools() -> ToolRegistry:
    registry = demo_tools()

    @registry.tool(idempotent=False)
    async def charge(ctx: ToolContext, amount: str, steps: int = 3, delay_ms: int = 100) -> str:
        """Pretend to charge ``amount``; sends ``steps`` progress notifications ``delay_ms`` apart."""
        for step in range(1, steps + 1):
            if delay_ms > 0:
                await asyncio.sleep(delay_ms / 1000)
            await ctx.report_progress(step, steps, f"charge step {step}/{steps}")
        return f"charged {amount}"

    return registry


TOOLS = fault_tools()
