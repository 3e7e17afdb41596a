"""What both protocol eras share, in process through the app's ASGI surface (no uvicorn), on the memory and SQLite
stores: a tool's run and the shape of its result, the refusal of a call the token does not cover (its audience or
its scopes), and the one decision of which era serves a POST. Each test runs the same request on a legacy session
(2025-11-25) and statelessly (2026-07-28) and holds both answers to one expectation, so the two cannot drift.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx
import orjson
import pytest

from mcp_lossless.core.errors import (
    FORBIDDEN,
    INVALID_PARAMS,
    INVALID_REQUEST,
    TOOL_FORBIDDEN,
    UNSUPPORTED_PROTOCOL_VERSION,
)
from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.tools import ToolContext, ToolError, ToolRegistry
from tests.support.in_process import BASE, MCP, InProcess, in_process, tool_resource
from tests.support.mcp_http import Peer, dev_token
from tests.support.modern_http import MODERN, answer, meta
from tests.support.stores import store_of_kind

pytestmark = pytest.mark.anyio

PRM = "http://127.0.0.1:8000/.well-known/oauth-protected-resource/mcp"
SEARCHED = {"content": [{"type": "text", "text": "search results for 'q': 3 documents"}], "isError": False}


def tools() -> ToolRegistry:
    registry = demo_tools()

    @registry.tool()
    async def refuse(ctx: ToolContext) -> str:
        """Fails the way a tool says its input was wrong."""
        raise ToolError("bad input")

    @registry.tool()
    async def crash(ctx: ToolContext) -> str:
        """Fails the way a bug does: its message is not the client's business."""
        raise RuntimeError("a secret in a traceback")

    @registry.tool(scopes=("files:write",))
    async def write(ctx: ToolContext) -> str:
        """Needs the ``files:write`` scope besides its resource."""
        return "written"

    return registry


@dataclass
class Answer:
    status: int
    headers: httpx.Headers
    message: dict[str, Any]
    """The JSON-RPC response: the last SSE message, or the JSON body."""


class Era(Protocol):
    code_forbidden: int

    async def call(self, name: str, arguments: dict[str, Any], token: str | None = None) -> Answer: ...

    def result(self, result: dict[str, Any]) -> dict[str, Any]:
        """A call's result as this era shapes it."""
        ...


class Legacy:
    """A 2025-11-25 session: the call's answer on the SSE stream of its POST."""

    code_forbidden = FORBIDDEN

    def __init__(self, peer: Peer) -> None:
        self.peer = peer

    async def call(self, name: str, arguments: dict[str, Any], token: str | None = None) -> Answer:
        message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
        read = await self.peer.post(message, token=token)
        return Answer(read.status, read.headers, read.messages[-1] if read.events else read.json())

    def result(self, result: dict[str, Any]) -> dict[str, Any]:
        return result


class Modern:
    """A stateless 2026-07-28 request (without the tasks extension: every tool runs within its request)."""

    code_forbidden = TOOL_FORBIDDEN

    def __init__(self, server: InProcess) -> None:
        self.peer = server.peer(tasks=False)

    async def call(self, name: str, arguments: dict[str, Any], token: str | None = None) -> Answer:
        params = {"name": name, "arguments": arguments}
        read = await self.peer.send(self.peer.message("tools/call", params, request_id=1), token=token)
        return Answer(read.status, read.headers, answer(read))

    def result(self, result: dict[str, Any]) -> dict[str, Any]:
        return {**result, "resultType": "complete"}


@pytest.fixture(params=["memory", "sqlite"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[InProcess]:
    async with in_process(store_of_kind(request, tmp_path, "asgi-core"), tools()) as served:
        yield served


@pytest.fixture(params=["legacy", "modern"])
async def era(request: pytest.FixtureRequest, server: InProcess) -> Era:
    if request.param == "modern":
        return Modern(server)
    peer = Peer(server.http, BASE, server.whole)
    await peer.initialize()
    return Legacy(peer)


# -- running a tool ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "result"),
    [
        ("search", {"query": "q", "steps": 0}, SEARCHED),
        ("refuse", {}, {"content": [{"type": "text", "text": "bad input"}], "isError": True}),
        ("crash", {}, {"content": [{"type": "text", "text": "tool crash failed"}], "isError": True}),
    ],
    ids=["result", "tool-error", "crash"],
)
async def test_a_tools_result_is_shaped_alike_in_both_eras(
    era: Era, name: str, arguments: dict[str, Any], result: dict[str, Any]
) -> None:
    answered = await era.call(name, arguments)
    assert answered.status == 200
    assert answered.message == {"jsonrpc": "2.0", "id": 1, "result": era.result(result)}


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        ("nope", {}, "unknown tool 'nope'"),
        ("search", {"query": 3}, "invalid arguments for search: query: Input should be a valid string"),
    ],
    ids=["unknown-tool", "invalid-arguments"],
)
async def test_a_call_that_cannot_run_is_invalid_params_in_both_eras(
    era: Era, name: str, arguments: dict[str, Any], message: str
) -> None:
    answered = await era.call(name, arguments)
    assert answered.status == 200
    assert answered.message == {"jsonrpc": "2.0", "id": 1, "error": {"code": INVALID_PARAMS, "message": message}}


# -- the coverage refusal ---------------------------------------------------------------------------------------


def envelope_of(resources: list[str], scopes: list[str], context: str) -> dict[str, Any]:
    return {
        "reason": "insufficient_authorization",
        "remediation": "available",
        "authorizationContextId": context,
        "credentialDisposition": "replacement",
        "remediationHints": [{"type": "io.github.mcp-lossless/oauth-grant", "resources": resources, "scopes": scopes}],
    }


def assert_refused(era: Era, answered: Answer, resources: list[str], scopes: list[str]) -> None:
    """403 before any byte: the era's code, the same data and SEP-2643 envelope in both eras, and a challenge naming
    what a new token must hold, whose description is the error's message."""
    assert answered.status == 403 and answered.headers["content-type"] == "application/json"
    error = answered.message["error"]
    context = error["data"]["authorization"]["authorizationContextId"]
    assert context.startswith("authzctx_")
    sealed = envelope_of(resources, scopes, context)
    assert answered.message == {
        "jsonrpc": "2.0",
        "id": 1,
        "error": {
            "code": era.code_forbidden,
            "message": error["message"],
            "data": {
                "requiredResources": resources,
                "requiredScopes": scopes,
                "authorization": sealed,
                "_meta": {"io.modelcontextprotocol/authorization": sealed},
            },
        },
    }
    named = [f'resource="{" ".join(resources)}"'] if resources else []
    named += [f'scope="{" ".join(scopes)}"'] if scopes else []
    assert answered.headers["www-authenticate"] == ", ".join(
        ['Bearer error="insufficient_scope"', f'error_description="{error["message"]}"', *named,
         f'resource_metadata="{PRM}"']
    )  # fmt: skip
    assert all(tag in error["message"] for tag in (*resources, *scopes))


async def test_a_call_outside_the_tokens_audience_is_refused_alike(era: Era, server: InProcess) -> None:
    answered = await era.call("fetch", {"url": "u"}, token=server.narrowed)
    assert_refused(era, answered, [tool_resource("fetch")], [])


async def test_a_call_without_its_scope_is_refused_alike_and_served_with_it(era: Era, server: InProcess) -> None:
    assert_refused(era, await era.call("write", {}), [], ["files:write"])
    scoped = await dev_token(server.http, BASE, MCP, scope="files:write")
    answered = await era.call("write", {}, token=scoped)
    assert answered.status == 200
    result = era.result({"content": [{"type": "text", "text": "written"}], "isError": False})
    assert answered.message == {"jsonrpc": "2.0", "id": 1, "result": result}


async def test_both_eras_seal_the_same_refusal_in_the_same_envelope(server: InProcess) -> None:
    legacy = Peer(server.http, BASE, server.whole)
    await legacy.initialize()
    refusals = [
        await era.call("fetch", {"url": "u"}, token=server.narrowed) for era in (Legacy(legacy), Modern(server))
    ]
    old, new = (refusal.message["error"]["data"] for refusal in refusals)
    assert old == new, "one refusal, one envelope, whichever era asked"


# -- which era serves a POST ------------------------------------------------------------------------------------


async def post(server: InProcess, message: dict[str, Any], **headers: str) -> httpx.Response:
    sent = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    sent["authorization"] = f"Bearer {server.whole}"
    return await server.http.post(MCP, content=orjson.dumps(message), headers={**sent, **headers})


async def test_a_request_carrying_the_modern_meta_is_served_statelessly_even_beside_a_session(
    server: InProcess,
) -> None:
    legacy = Peer(server.http, BASE, server.whole)
    await legacy.initialize()
    assert legacy.session_id is not None
    message = {"jsonrpc": "2.0", "id": 2, "method": "server/discover", "params": {"_meta": meta()}}
    headers = {"mcp-protocol-version": MODERN, "mcp-method": "server/discover", "mcp-session-id": legacy.session_id}
    response = await post(server, message, **headers)
    assert response.status_code == 200 and "mcp-session-id" not in response.headers
    assert response.json()["result"]["resultType"] == "complete", "only the modern leg says resultType"


async def test_a_legacy_request_without_a_session_is_asked_for_one(server: InProcess) -> None:
    message = {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}
    response = await post(server, message, **{"mcp-protocol-version": "2025-11-25"})
    assert response.status_code == 400
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": INVALID_REQUEST, "message": "Mcp-Session-Id header required"},
    }


async def test_a_request_naming_the_modern_version_without_its_meta_gets_the_modern_answer(server: InProcess) -> None:
    message = {"jsonrpc": "2.0", "id": 4, "method": "tools/list"}
    response = await post(server, message, **{"mcp-protocol-version": MODERN, "mcp-method": "tools/list"})
    assert response.status_code == 400
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": 4,
        "error": {
            "code": INVALID_PARAMS,
            "message": "params._meta must carry io.modelcontextprotocol/protocolVersion (a string) and "
            "io.modelcontextprotocol/clientCapabilities (an object)",
        },
    }


async def test_a_session_revision_in_the_modern_meta_is_an_unsupported_version(server: InProcess) -> None:
    message = {"jsonrpc": "2.0", "id": 5, "method": "tools/list", "params": {"_meta": meta(version="2025-11-25")}}
    response = await post(server, message, **{"mcp-protocol-version": "2025-11-25", "mcp-method": "tools/list"})
    assert response.status_code == 400
    assert response.json() == {
        "jsonrpc": "2.0",
        "id": 5,
        "error": {
            "code": UNSUPPORTED_PROTOCOL_VERSION,
            "message": "Unsupported protocol version",
            "data": {"supported": [MODERN, "2025-11-25", "2025-06-18", "2025-03-26"], "requested": "2025-11-25"},
        },
    }


async def test_initialize_opens_a_legacy_session_at_the_newest_revision_it_negotiates(server: InProcess) -> None:
    message = {
        "jsonrpc": "2.0",
        "id": 6,
        "method": "initialize",
        "params": {"protocolVersion": MODERN, "capabilities": {}, "clientInfo": {"name": "t", "version": "0"}},
    }
    response = await post(server, message)
    assert response.status_code == 200 and response.headers["mcp-session-id"]
    assert response.json()["result"]["protocolVersion"] == "2025-11-25", "2026-07-28 is never negotiated"
