"""The two demo tools `serve` offers: each reports progress and then returns a deterministic text.

``fetch`` runs as a task for 2026-07-28 clients that declared the tasks extension.
"""

from __future__ import annotations

import asyncio

from .tools import ToolContext, ToolRegistry


async def _steps(ctx: ToolContext, steps: int, delay_ms: int, what: str) -> None:
    for step in range(1, steps + 1):
        if delay_ms > 0:
            await asyncio.sleep(delay_ms / 1000)
        await ctx.report_progress(step, steps, f"{what} step {step}/{steps}")


def demo_tools() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool(idempotent=True, read_only=True)
    async def search(ctx: ToolContext, query: str, steps: int = 3, delay_ms: int = 100) -> str:
        """Search for `query`; sends `steps` progress notifications `delay_ms` apart."""
        await _steps(ctx, steps, delay_ms, "search")
        return f"search results for {query!r}: 3 documents"

    @registry.tool(idempotent=True, read_only=True, task=True)
    async def fetch(ctx: ToolContext, url: str, steps: int = 3, delay_ms: int = 100) -> str:
        """Fetch `url`; sends `steps` progress notifications `delay_ms` apart."""
        await _steps(ctx, steps, delay_ms, "fetch")
        return f"contents of {url}: {len(url)} bytes"

    return registry
