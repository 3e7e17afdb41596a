"""A FastMCP (4.x) server as a gateway upstream: Streamable HTTP, no auth, one tool that reports progress."""

from __future__ import annotations

from typing import Any

import anyio
from fastmcp import Context, FastMCP


def build_fastmcp_app() -> Any:
    server = FastMCP("fastmcp-upstream")

    @server.tool
    async def tally(numbers: list[int], ctx: Context, delay_ms: int = 20) -> int:
        """Add `numbers` one by one, reporting progress after each."""
        total = 0
        for done, number in enumerate(numbers, start=1):
            await anyio.sleep(delay_ms / 1000)
            total += number
            await ctx.report_progress(done, len(numbers), f"added {number}")
        return total

    return server.http_app(path="/mcp")
