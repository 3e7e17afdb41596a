"""A whole server driven in process through its ASGI surface (no uvicorn, no socket): the app as ``create_app``
builds it, started as an ASGI server would (its lifespan), spoken to by ``httpx.ASGITransport`` with real tokens
signed by its embedded dev authorization server.

What a test may reach of the server is its public surface only: the app, HTTP, and the stores it was given
(``create_app(store=..., task_store=...)``), so the tests hold however the leg's internals are arranged.
"""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, MutableMapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import httpx
import orjson

from mcp_lossless.asgi import ASGIApp, Receive, Scope, Send
from mcp_lossless.core.principal import Principal
from mcp_lossless.server.app import LosslessApp, create_app
from mcp_lossless.server.config import ServerConfig
from mcp_lossless.server.tools import MethodHandler, MethodTags, ToolRegistry
from mcp_lossless.stores import EventStore, TaskStore, task_store_beside
from tests.support.mcp_http import dev_token
from tests.support.modern_http import ModernPeer

BASE = "http://127.0.0.1:8000"
"""What the in-process server is addressed as (a loopback host, so its DNS-rebinding check lets it through)."""
MCP = f"{BASE}/mcp"
CLIENTS = {"dev-client": "dev-secret", "mallory": "mallory-secret"}
"""The dev authorization server's clients in every server test: two principals (``tests.integration.conftest``
hands the same to the uvicorn-served ones)."""


def tool_resource(name: str) -> str:
    """The RFC 8707 resource indicator of the tool ``name`` (what a token must name to call it)."""
    return f"{MCP}/tools/{name}"


def principal_of(token: str) -> Principal:
    """The principal of a token the server accepts, read from its claims (the signature is the server's business)."""
    claims = orjson.loads(base64.urlsafe_b64decode(token.split(".")[1] + "=="))
    return Principal(claims["iss"], claims["sub"], claims["client_id"])


@dataclass
class InProcess:
    app: LosslessApp
    http: httpx.AsyncClient
    tasks: TaskStore
    """The task store the app was given: a test puts exactly the record a decision must see."""
    whole: str
    """The dev client's token for the whole server."""
    narrowed: str
    """The dev client's token for the ``search`` tool only."""
    mallory: str
    """Another principal's token for the whole server."""

    def peer(self, token: str | None = None, *, tasks: bool = True) -> ModernPeer:
        """A 2026-07-28 client with ``token`` (the whole-server token unless given)."""
        return ModernPeer(self.http, BASE, self.whole if token is None else token, tasks=tasks)


Message = MutableMapping[str, Any]


class AsgiViolation(AssertionError):
    """The app broke the ASGI HTTP protocol: a message out of order, after the end, or no end at all."""


def checked(app: ASGIApp) -> ASGIApp:
    """``app`` held to the ASGI HTTP protocol on every request: one ``http.response.start`` before any body, no
    message after the body that ends the response, and a response ended when the app returns (unless the
    client left first). uvicorn would log such a fault and cut the connection; here it fails the test."""

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        state = {"started": False, "ended": False, "left": False}

        async def watched_receive() -> Message:
            message = await receive()
            if message["type"] == "http.disconnect":
                state["left"] = True
            return message

        async def watched_send(message: Message) -> None:
            kind = message["type"]
            if state["ended"]:
                raise AsgiViolation(f"{kind} sent after the response ended")
            if kind == "http.response.start":
                if state["started"]:
                    raise AsgiViolation("http.response.start sent twice")
                state["started"] = True
            elif kind == "http.response.body":
                if not state["started"]:
                    raise AsgiViolation("http.response.body sent before http.response.start")
                state["ended"] = not message.get("more_body", False)
            else:
                raise AsgiViolation(f"{kind} is no HTTP response message")
            await send(message)

        await app(scope, watched_receive, watched_send)
        if not state["ended"] and not state["left"]:
            raise AsgiViolation(f"the app returned without ending its response (started: {state['started']})")

    return guarded


@asynccontextmanager
async def in_process(
    store: EventStore,
    tools: ToolRegistry | None = None,
    *,
    methods: Mapping[str, MethodHandler] | None = None,
    method_tags: Mapping[str, MethodTags] | None = None,
    **settings: Any,
) -> AsyncIterator[InProcess]:
    """The server on ``store`` with ``tools`` (the demo tools unless given), extra ``methods`` (each needing what
    ``method_tags`` says) and ``settings`` (``ServerConfig`` fields), started for the block, and the tokens its
    tests present."""
    tasks = task_store_beside(store)
    config = ServerConfig(store="memory", dev_clients=CLIENTS, **settings)
    app = create_app(config, tools, store=store, task_store=tasks, methods=methods, method_tags=method_tags)
    await app.startup()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=checked(app))) as http:
            whole = await dev_token(http, BASE, MCP)
            narrowed = await dev_token(http, BASE, tool_resource("search"))
            mallory = await dev_token(http, BASE, MCP, client=("mallory", CLIENTS["mallory"]))
            yield InProcess(app, http, tasks, whole, narrowed, mallory)
    finally:
        await app.shutdown()


@dataclass
class RawExchange:
    """One request played on the app's raw ASGI interface: every message it sent, in order, so a test sees what
    went out before what (a status before any byte; nothing after the end)."""

    sent: list[Message]

    @property
    def status(self) -> int:
        starts = [m for m in self.sent if m["type"] == "http.response.start"]
        assert len(starts) == 1, self.sent
        status: int = starts[0]["status"]
        return status

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(next(m for m in self.sent if m["type"] == "http.response.start")["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


async def raw_post(
    app: LosslessApp,
    body: bytes,
    headers: dict[str, str],
    *,
    leave: Callable[[list[Message]], bool] | None = None,
    left: Callable[[], Awaitable[None]] | None = None,
) -> RawExchange:
    """POST ``body`` to the MCP endpoint through raw ASGI. The client leaves (``http.disconnect``) once
    ``leave`` says so of what was sent so far, else once the response is complete, as a client does.
    ``left``, if given, is awaited after the client has left and before the call returns (while the app
    still runs the request, when it does)."""
    sent: list[Message] = []
    gone = anyio.Event()
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
        finished = message["type"] == "http.response.body" and not message.get("more_body", False)
        if finished or (leave is not None and leave(sent)):
            gone.set()

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/mcp",
        "raw_path": b"/mcp",
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }

    async def serve() -> None:
        await checked(app)(scope, receive, send)

    async with anyio.create_task_group() as group:
        group.start_soon(serve)
        await gone.wait()
        if left is not None:
            await left()
    return RawExchange(sent)
