"""Call the example's ``search`` tool: ``python examples/client.py [URL]`` (default http://127.0.0.1:8000/mcp)."""

import asyncio
import sys

from mcp_lossless.client import Client, OAuth


async def main(url: str) -> None:
    async with Client(url, auth=OAuth("dev-client", "dev-secret")) as client:
        result = await client.call_tool(
            "search", {"query": "lossless"}, on_progress=lambda p: print("progress", p.message), timeout=30
        )
    print(result.text)


asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000/mcp"))
