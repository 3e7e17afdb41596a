"""An official ``mcp`` 2.3 SDK server (``MCPServer``) as a gateway's upstream, over Streamable HTTP or stdio.

    python -m tests.interop.peers.sdk_gateway_upstream http PORT HEADERS_FILE   # env UPSTREAM_TOKEN
    python -m tests.interop.peers.sdk_gateway_upstream jwt PORT HEADERS_FILE    # env UPSTREAM_ISSUER, UPSTREAM_SCOPES
    python -m tests.interop.peers.sdk_gateway_upstream stdio

HTTP: the SDK's legacy leg with an event store of the SDK examples' shape and ``retry_interval`` (resumable
streams), behind a bearer check for ``UPSTREAM_TOKEN`` (401 otherwise); the ``Authorization`` header of
every request it receives is appended to HEADERS_FILE as a JSON line, so a test can assert what reached
it, and the JSON-RPC method and params of every message body. Prints ``ready PORT`` once listening. A
separate process, so tests can SIGKILL it mid-call.

JWT (``jwt``): the same server as a resource server of its own (the SDK's ``AuthSettings``: its protected resource
metadata names ``UPSTREAM_ISSUER``, its bearer middleware requires ``UPSTREAM_SCOPES``), with a token verifier that
checks each JWT itself (PyJWT: signature by the issuer's JWKS, ``typ`` at+jwt, ``iss``, ``aud`` = its own URL,
``exp``); every POST is appended to HEADERS_FILE as one line with its ``Authorization`` and JSON-RPC method.

Tools: ``work`` (progress per step, one log message; not idempotent), ``lookup`` (the same, annotated
read-only and idempotent), ``polled`` (closes its own stream mid-call: SEP-1699 polling), ``hang`` (never
answers), ``grow`` (adds a tool and announces ``list_changed``), ``confirm`` (asks the client to confirm its
question by elicitation: a request on the call's stream at 2025-11-25, an ``input_required`` round at
2026-07-28; not idempotent) and ``spell`` (the same, read-only and idempotent). Resources ``notes://readme`` and ``notes://private``
(text), resource templates ``notes://topics/{topic}`` and ``test://template/shared{n}/data`` (the latter
overlapping the conformance server's ``test://template/{id}/data``); prompts ``review`` (argument ``topic``) and
``internal``; completions of ``review``'s and ``notes://topics/{topic}``'s ``topic``.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Annotated, Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp_types import Completion, PromptReference, ResourceTemplateReference, ToolAnnotations
from pydantic import BaseModel

from tests.interop.peers.sdk_resumable_server import ExampleShapedEventStore

RETRY_MS = 200
LEGACY_PATH = "/legacy/mcp"
LEGACY_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")


class Confirmation(BaseModel):
    ok: bool


def confirmation_of(question: str) -> Elicit[Confirmation]:
    return Elicit(f"confirm: {question}", Confirmation)


def build_server(**options: Any) -> MCPServer:
    server = MCPServer("sdk-gateway-upstream", **options)

    async def steps_of(ctx: Context, what: str, steps: int, delay_ms: int) -> None:
        await ctx.info(f"{what} started")
        for step in range(1, steps + 1):
            await anyio.sleep(delay_ms / 1000)
            await ctx.report_progress(step, steps, f"{what} step {step}/{steps}")

    @server.tool()
    async def work(label: str, ctx: Context, steps: int = 3, delay_ms: int = 100) -> str:
        """Do `label`'s work in `steps` steps `delay_ms` apart, reporting progress (not idempotent)."""
        await steps_of(ctx, f"work {label}", steps, delay_ms)
        return f"work {label} done"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True))
    async def lookup(key: str, ctx: Context, steps: int = 3, delay_ms: int = 100) -> str:
        """Look `key` up in `steps` steps `delay_ms` apart (read-only: safe to run again)."""
        await steps_of(ctx, f"lookup {key}", steps, delay_ms)
        return f"value of {key}"

    @server.tool()
    async def polled(label: str, ctx: Context, steps: int = 3, delay_ms: int = 50) -> str:
        """Like `work`, but closes its own SSE stream after step 1 (SEP-1699): the caller must resume it."""
        for step in range(1, steps + 1):
            await anyio.sleep(delay_ms / 1000)
            await ctx.report_progress(step, steps, f"polled {label} step {step}/{steps}")
            if step == 1:
                await ctx.close_sse_stream()
        return f"polled {label} done"

    @server.tool()
    async def confirm(question: str, answer: Annotated[Confirmation, Resolve(confirmation_of)]) -> str:
        """Ask the client to confirm `question` (elicitation), then say what it answered (not idempotent)."""
        return f"{question}: {'yes' if answer.ok else 'no'}"

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True))
    async def spell(question: str, answer: Annotated[Confirmation, Resolve(confirmation_of)]) -> str:
        """As `confirm`, read-only: safe to run again."""
        return f"{question}: {'yes' if answer.ok else 'no'}"

    @server.tool()
    async def hang() -> str:
        """Never answers (a hung upstream)."""
        await anyio.sleep(3600)
        return "unreachable"

    @server.tool()
    async def grow(name: str, ctx: Context) -> str:
        """Add a tool called `name` and announce tools/list_changed."""

        async def grown() -> str:
            return f"{name} grown"

        server.add_tool(grown, name=name, description=f"grown as {name}")
        await ctx.session.send_tool_list_changed()  # legacy: on this session's standalone GET stream
        await ctx.notify_tools_changed()  # 2026-07-28: on every subscriptions/listen stream that asked for it
        return f"added {name}"

    @server.resource("notes://readme", name="readme", mime_type="text/plain")
    def readme() -> str:
        """The notes' readme."""
        return "read me first"

    @server.resource("notes://private", name="private", mime_type="text/plain")
    def private() -> str:
        """Notes not every client may read."""
        return "private notes"

    @server.resource("notes://topics/{topic}", name="topic", mime_type="text/plain")
    def topic(topic: str) -> str:
        """The notes on one topic (a resource template)."""
        return f"notes on {topic}"

    @server.resource("test://template/shared{n}/data", name="shared", mime_type="text/plain")
    def shared(n: str) -> str:
        """A template whose URIs the conformance server's ``test://template/{id}/data`` names too."""
        return f"shared {n}"

    @server.prompt()
    def review(topic: str) -> str:
        """Ask for a review of `topic`."""
        return f"Please review {topic}."

    @server.completion()
    async def complete(ref: Any, argument: Any, context: Any) -> Completion | None:
        """``review``'s topic and ``notes://topics/{topic}``'s topic: the candidates starting with the value."""
        if isinstance(ref, PromptReference) and ref.name == "review":
            candidates = ["gateway", "gardening", "tools"]
        elif isinstance(ref, ResourceTemplateReference) and ref.uri == "notes://topics/{topic}":
            candidates = ["alpha", "almanac", "beta"]
        else:
            return None
        values = [c for c in candidates if argument.name == "topic" and c.startswith(argument.value)]
        return Completion(values=values, total=len(values), has_more=False)

    @server.prompt()
    def internal() -> str:
        """A prompt the gateway's configuration keeps to itself."""
        return "internal"

    return server


def record(headers_file: str, entry: dict[str, Any]) -> None:
    with open(headers_file, "a") as out:  # one short line per observation: the test reads them after the fact
        out.write(json.dumps(entry) + "\n")


def bearer_guard(app: Any, token: str, headers_file: str) -> Any:
    """ASGI middleware: log every request's Authorization header and JSON-RPC method; refuse any but the token.

    ``/legacy/mcp`` is the same server as a 2025-11-25 server that predates 2026-07-28 answers there: a request
    at that revision gets 400 with the unsupported-version error (the SDK serves both eras on one endpoint).
    """

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if scope["path"] == LEGACY_PATH:
            version = dict(scope["headers"]).get(b"mcp-protocol-version", b"").decode()
            if version and version not in LEGACY_VERSIONS:
                body = {
                    "jsonrpc": "2.0",
                    "id": None,
                    "error": {"code": -32600, "message": f"Unsupported protocol version: {version}"},
                }
                await send(
                    {"type": "http.response.start", "status": 400, "headers": [(b"content-type", b"application/json")]}
                )
                await send({"type": "http.response.body", "body": json.dumps(body).encode()})
                return
            scope = {**scope, "path": "/mcp", "raw_path": b"/mcp"}
        raw = dict(scope["headers"]).get(b"authorization")
        resume = dict(scope["headers"]).get(b"last-event-id")
        record(
            headers_file,
            {
                "path": scope["path"],
                "http": scope["method"],
                "authorization": raw.decode() if raw else None,
                "last_event_id": resume.decode() if resume else None,
            },
        )
        if raw != f"Bearer {token}".encode():
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        chunks: list[bytes] = []

        async def observed() -> Any:
            message = await receive()
            if message["type"] == "http.request":
                chunks.append(message.get("body", b""))
                if not message.get("more_body") and any(chunks):
                    with contextlib.suppress(ValueError):
                        body = json.loads(b"".join(chunks))
                        if isinstance(body, dict):
                            record(headers_file, {"method": body.get("method"), "params": body.get("params")})
            return message

        await app(scope, observed, send)

    return guarded


def serve_http(port: int, headers_file: str) -> None:
    token = os.environ["UPSTREAM_TOKEN"]
    app = build_server().streamable_http_app(event_store=ExampleShapedEventStore(), retry_interval=RETRY_MS)
    serve(bearer_guard(app, token, headers_file), port)


class JwtAccessTokens:
    """The SDK's ``TokenVerifier``: an RFC 9068 access token of ``issuer`` for ``resource``, checked here with PyJWT
    (the issuer's JWKS found through its RFC 8414 metadata)."""

    def __init__(self, issuer: str, resource: str) -> None:
        self.issuer = issuer
        self.resource = resource
        self._keys: Any = None

    def _jwks(self) -> Any:
        import urllib.request
        from urllib.parse import urlsplit

        import jwt

        if self._keys is None:
            parts = urlsplit(self.issuer)
            where = f"{parts.scheme}://{parts.netloc}/.well-known/oauth-authorization-server{parts.path}"
            with urllib.request.urlopen(where, timeout=10) as response:
                self._keys = jwt.PyJWKClient(json.load(response)["jwks_uri"])
        return self._keys

    async def verify_token(self, token: str) -> Any:
        import jwt
        from mcp.server.auth.provider import AccessToken

        try:
            if jwt.get_unverified_header(token).get("typ") != "at+jwt":
                return None
            key = self._jwks().get_signing_key_from_jwt(token)
            claims = jwt.decode(
                token,
                key.key,
                algorithms=["RS256", "ES256", "PS256"],
                audience=self.resource,
                issuer=self.issuer,
                options={"require": ["exp", "iss", "aud", "sub"]},
            )
        except jwt.PyJWTError:
            return None
        return AccessToken(
            token=token,
            client_id=str(claims.get("client_id", "")),
            scopes=str(claims.get("scope", "")).split(),
            expires_at=int(claims["exp"]),
            resource=self.resource,
            subject=str(claims["sub"]),
            claims=claims,
        )


def recorded(app: Any, headers_file: str) -> Any:
    """ASGI middleware: one line per POST with its ``Authorization`` header and JSON-RPC method and params."""

    async def recording(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        messages = [await receive()]
        while messages[-1].get("more_body"):
            messages.append(await receive())
        body: Any = None
        with contextlib.suppress(ValueError):
            body = json.loads(b"".join(m.get("body", b"") for m in messages))
        raw = dict(scope["headers"]).get(b"authorization")
        entry = {"http": "POST", "authorization": raw.decode() if raw else None}
        if isinstance(body, dict):
            entry |= {"method": body.get("method"), "params": body.get("params")}
        record(headers_file, entry)
        replay = iter(messages)

        async def replayed() -> Any:
            return next(replay, None) or await receive()

        await app(scope, replayed, send)

    return recording


def serve_jwt(port: int, headers_file: str) -> None:
    from mcp.server.auth.settings import AuthSettings
    from pydantic import AnyHttpUrl

    issuer, url = os.environ["UPSTREAM_ISSUER"], f"http://127.0.0.1:{port}/mcp"
    settings = AuthSettings(
        issuer_url=AnyHttpUrl(issuer),
        resource_server_url=AnyHttpUrl(url),
        required_scopes=os.environ.get("UPSTREAM_SCOPES", "").split() or None,
        validate_token_resource=False,  # the verifier checks aud itself
    )
    server = build_server(token_verifier=JwtAccessTokens(issuer, url), auth=settings)
    serve(recorded(server.streamable_http_app(), headers_file), port)


def serve(app: Any, port: int) -> None:
    import uvicorn

    class Announcing(uvicorn.Server):
        async def startup(self, sockets: Any = None) -> None:
            await super().startup(sockets=sockets)
            print(f"ready {port}", flush=True)

    Announcing(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on")).run()


def main() -> None:
    mode = sys.argv[1] if len(sys.argv) > 1 else "stdio"
    if mode == "http":
        serve_http(int(sys.argv[2]), sys.argv[3])
    elif mode == "jwt":
        serve_jwt(int(sys.argv[2]), sys.argv[3])
    else:
        build_server().run("stdio")


if __name__ == "__main__":
    main()
