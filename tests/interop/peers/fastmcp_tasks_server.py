"""FastMCP with ``fastmcp-tasks`` (the tasks extension's one runtime), set up as a careful operator would.

Run under the peer's own Python (tests/support/python_peers.py), never imported by the tests: its FastMCP
pin differs from the project's. ``fetch`` may run as a task; each tool admits only tokens whose audience
names its own resource indicator (a FastMCP component auth check, the per-tool rule FastMCP documents);
tokens are real JWTs from our dev AS, verified with FastMCP's ``JWTVerifier`` against its JWKS. The socket
comes bound and listening from the test (inherited descriptor), so nothing has to wait for readiness.

usage: python fastmcp_tasks_server.py FD AGGREGATE_URL ISSUER
"""

from __future__ import annotations

import asyncio
import socket
import sys

import uvicorn
from fastmcp import Context, FastMCP
from fastmcp.server.auth.providers.jwt import JWTVerifier
from fastmcp.utilities.authorization import AuthContext
from fastmcp_tasks import TasksExtension


def covers(resource: str):  # type: ignore[no-untyped-def]
    def check(ctx: AuthContext) -> bool:
        audience = ctx.token.claims.get("aud") if ctx.token is not None else None
        audience = [audience] if isinstance(audience, str) else audience or []
        return resource in audience

    return check


def build(aggregate: str, issuer: str) -> FastMCP:
    resources = {name: f"{aggregate}/tools/{name}" for name in ("search", "fetch")}
    verifier = JWTVerifier(jwks_uri=f"{issuer}/jwks", issuer=issuer, audience=[aggregate, *resources.values()])
    server = FastMCP("fastmcp-tasks-peer", auth=verifier)
    server.add_extension(TasksExtension())

    async def report(ctx: Context, what: str, steps: int, delay_ms: int) -> None:
        for step in range(1, steps + 1):
            await asyncio.sleep(delay_ms / 1000)
            await ctx.report_progress(step, steps, f"{what} step {step}/{steps}")

    @server.tool(auth=covers(resources["search"]))
    async def search(query: str, ctx: Context, steps: int = 3, delay_ms: int = 100) -> str:
        """Search for `query`."""
        await report(ctx, "search", steps, delay_ms)
        return f"search results for {query!r}"

    @server.tool(task=True, auth=covers(resources["fetch"]))
    async def fetch(url: str, ctx: Context, steps: int = 3, delay_ms: int = 100) -> str:
        """Fetch `url`; may run as a task."""
        await report(ctx, "fetch", steps, delay_ms)
        return f"contents of {url}"

    return server


def main() -> None:
    fd, aggregate, issuer = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    app = build(aggregate, issuer).http_app(path="/mcp")
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    server.run(sockets=[socket.socket(fileno=fd)])


if __name__ == "__main__":
    main()
