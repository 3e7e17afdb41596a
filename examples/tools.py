"""Your own tools: serve them with ``mcp-lossless serve examples/tools.py:tools``."""

from mcp_lossless.server import ToolContext, ToolRegistry

tools = ToolRegistry()


@tools.tool(idempotent=True)  # resource indicator: <canonical>/tools/search, published in tools/list _meta
async def search(ctx: ToolContext, query: str, pages: int = 3) -> str:
    """Search for `query`, reporting progress page by page."""
    for page in range(1, pages + 1):
        await ctx.report_progress(page, pages, f"page {page}/{pages}")
    return f"{pages} pages of results for {query!r}"
