"""The official ``mcp`` 2.3 Python SDK server, set up the way a careful operator would, as an audit target.

* ``search`` and ``fetch`` report progress; each checks its *own* resource indicator in the caller's token
  with ``get_access_token()`` in tool code, the per-tool rule the SDK documents.
* An in-memory event store with the shape of the SDK's example stores (the wheel ships none): one global
  index of event ids, replay of the same stream's tail after an id.
* ``retry_interval`` set, so POST streams open with a priming event (resumable from the first byte).
* Real JWTs from our embedded development authorization server, served on its own port and knowing one
  foreign resource server too (a real AS serves many), verified with our ``JwtVerifier`` inside the SDK's
  ``TokenVerifier`` protocol; the verifier only accepts tokens whose audience names this server or one of
  its tools (hence ``validate_token_resource=False``: the SDK's own check is single-valued).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.provider import AccessToken
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp_types import JSONRPCMessage

from mcp_lossless.devauth import DevAuthServer
from mcp_lossless.server.auth import InvalidToken, JwtVerifier, StaticJwks
from tests.support.uvicorn_server import base_url, loopback_socket, serve_app

FOREIGN_RESOURCE = "https://not-this-server.example/mcp"
CLIENTS = {"dev-client": "dev-secret", "mallory": "mallory-secret"}
RETRY_MS = 200


class ExampleShapedEventStore(EventStore):
    """Like the SDK examples: events indexed globally by id, a replay sends the tail of the id's stream."""

    def __init__(self) -> None:
        self._streams: dict[str, list[tuple[str, JSONRPCMessage | None]]] = {}
        self._index: dict[str, str] = {}

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        event_id = str(uuid.uuid4())
        self._streams.setdefault(stream_id, []).append((event_id, message))
        self._index[event_id] = stream_id
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        stream_id = self._index.get(last_event_id)
        if stream_id is None:
            return None
        events = self._streams[stream_id]
        position = next(i for i, (event_id, _) in enumerate(events) if event_id == last_event_id)
        for event_id, message in events[position + 1 :]:
            if message is not None:
                await send_callback(EventMessage(message, event_id))
        return stream_id


class AudienceCheckingVerifier:
    """SDK ``TokenVerifier``: a real JWT check, and an audience that must name this server or one of its tools."""

    def __init__(self, jwt: JwtVerifier, aggregate: str, resources: frozenset[str]) -> None:
        self._jwt = jwt
        self._aggregate = aggregate
        self._resources = resources

    async def verify_token(self, token: str) -> AccessToken | None:
        try:
            grant = await self._jwt.verify(token)
        except InvalidToken:
            return None
        if not grant.audience & self._resources:
            return None
        audience = sorted(grant.audience)
        return AccessToken(
            token=token,
            client_id=grant.principal.client_id,
            scopes=sorted(grant.scopes),
            expires_at=None if grant.expires_at is None else int(grant.expires_at),
            resource=self._aggregate if self._aggregate in grant.audience else audience[0],
            subject=grant.principal.subject,
            claims={"iss": grant.principal.issuer, "aud": audience},
        )


def _require_audience(resource: str) -> None:
    """The per-tool check in tool code: the caller's token must name this tool's resource."""
    token = get_access_token()
    audience = (token.claims or {}).get("aud", []) if token is not None else []
    if resource not in audience:
        raise ToolError(f"insufficient audience: token aud {audience} lacks resource {resource}")


def build_sdk_app(aggregate: str, issuer: str, verifier: AudienceCheckingVerifier) -> Any:
    server = MCPServer(
        "sdk-resumable-peer",
        token_verifier=verifier,
        auth=AuthSettings.model_validate(
            {"issuer_url": issuer, "resource_server_url": aggregate, "validate_token_resource": False}
        ),
    )

    async def report_steps(ctx: Context, what: str, steps: int, delay_ms: int) -> None:
        for step in range(1, steps + 1):
            await anyio.sleep(delay_ms / 1000)
            await ctx.report_progress(step, steps, f"{what} step {step}/{steps}")

    @server.tool()
    async def search(query: str, ctx: Context, steps: int = 3, delay_ms: int = 100) -> str:
        """Search for `query`; reports `steps` progress notifications `delay_ms` apart."""
        _require_audience(f"{aggregate}/tools/search")
        await report_steps(ctx, "search", steps, delay_ms)
        return f"search results for {query!r}"

    @server.tool()
    async def fetch(url: str, ctx: Context, steps: int = 3, delay_ms: int = 100) -> str:
        """Fetch `url`; reports `steps` progress notifications `delay_ms` apart."""
        _require_audience(f"{aggregate}/tools/fetch")
        await report_steps(ctx, "fetch", steps, delay_ms)
        return f"contents of {url}"

    return server.streamable_http_app(event_store=ExampleShapedEventStore(), retry_interval=RETRY_MS)


@dataclass(frozen=True)
class SdkPeer:
    url: str
    token_endpoint: str
    resources: dict[str, str]
    """Tool name -> resource indicator, as the operator would pass them with ``--resource``."""


def _bound(port: int) -> socket.socket:
    if port == 0:
        return loopback_socket()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    return sock


@contextmanager
def sdk_resumable_server(port: int = 0, as_port: int = 0) -> Iterator[SdkPeer]:
    """The SDK server and its authorization server, each under uvicorn on its own loopback port (0: any free)."""
    sdk_sock, as_sock = _bound(port), _bound(as_port)
    aggregate, issuer = f"{base_url(sdk_sock)}/mcp", base_url(as_sock)
    tools = {name: f"{aggregate}/tools/{name}" for name in ("search", "fetch")}
    authority = DevAuthServer(
        issuer, resources=[*tools.values(), FOREIGN_RESOURCE], aggregate=aggregate, clients=CLIENTS
    )
    verifier = AudienceCheckingVerifier(
        JwtVerifier(issuer, StaticJwks(authority.keys)), aggregate, frozenset({aggregate, *tools.values()})
    )
    with ExitStack() as stack:
        stack.enter_context(serve_app(authority, sock=as_sock))
        stack.enter_context(serve_app(build_sdk_app(aggregate, issuer, verifier), sock=sdk_sock, lifespan="on"))
        yield SdkPeer(aggregate, f"{issuer}/token", tools)


def main() -> None:
    """``python -m tests.interop.peers.sdk_resumable_server [PORT AS_PORT]``: serve until interrupted."""
    port, as_port = (int(a) for a in (sys.argv[1:3] if len(sys.argv) >= 3 else ("0", "0")))
    with sdk_resumable_server(port, as_port) as peer:
        print(f"MCP endpoint {peer.url}\ntoken URL    {peer.token_endpoint}", flush=True)
        print("\n".join(f"{tool:<12} {resource}" for tool, resource in peer.resources.items()), flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
