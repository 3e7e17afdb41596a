"""The 2026-07-28 leg's routing and the request core in process, through the app's ASGI surface (no uvicorn): every
method of the leg's table, what it answers a method it does not serve, the checks of headers and of ``_meta``, the
mirrored ``Mcp-Param-*`` headers, batches, and the refusals before any byte (the token's coverage, the body's
size), on the memory and SQLite stores. Every assertion is on the whole status, the headers that matter and the
whole JSON body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from mcp_lossless import __version__
from mcp_lossless.core.errors import (
    HEADER_MISMATCH,
    INVALID_PARAMS,
    INVALID_REQUEST,
    LIMIT_EXCEEDED,
    METHOD_NOT_FOUND,
    MISSING_REQUIRED_CLIENT_CAPABILITY,
    PARSE_ERROR,
    RESOURCE_NOT_FOUND,
    TOOL_FORBIDDEN,
    UNSUPPORTED_PROTOCOL_VERSION,
)
from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.tools import MethodError, ToolContext, ToolRegistry
from tests.support.in_process import MCP, InProcess, in_process, tool_resource
from tests.support.mcp_http import Peer
from tests.support.modern_http import (
    MODERN,
    ModernPeer,
    assert_replacement_envelope,
    json_of,
    meta,
    rpc_error,
    rpc_result,
)
from tests.support.stores import store_of_kind

pytestmark = pytest.mark.anyio

SERVED = [MODERN, "2025-11-25", "2025-06-18", "2025-03-26"]
PROMPT = f"{MCP}/prompts/greeting"
"""What a token must cover to get the prompt (the extra method's tag)."""
REGION = {"type": "string", "x-mcp-header": "Region"}
ROUTED_SCHEMA = {
    "type": "object",
    "properties": {
        "region": REGION,
        "priority": {"type": "integer", "x-mcp-header": "Priority"},
        "dry": {"type": "boolean", "x-mcp-header": "Dry"},
    },
}


def tools() -> ToolRegistry:
    registry = demo_tools()

    @registry.tool(input_schema=ROUTED_SCHEMA)
    async def routed(region: str | None = None, priority: int | None = None, dry: bool | None = None) -> str:
        """Mirrors its three arguments into ``Mcp-Param-*`` headers."""
        return f"{region}/{priority}/{dry}"

    @registry.tool()
    async def book(ctx: ToolContext, city: str) -> str:
        """Asks the traveller's name (one more round of the same request)."""
        name = await ctx.request("elicitation/create", {"message": "Name?", "requestedSchema": {}})
        return f"booked {city} for {name['content']['name']}"

    return registry


async def read_resource(ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
    if params.get("uri") != "test://hello":
        raise MethodError(RESOURCE_NOT_FOUND, "resource not found", {"uri": params.get("uri")})
    return {"contents": [{"uri": "test://hello", "text": "hello"}]}


async def list_resources(ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
    return {"resources": [{"uri": "test://hello", "name": "hello"}]}


async def get_prompt(ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": {"type": "text", "text": f"hello {params['name']}"}}]}


async def removed_but_registered(ctx: ToolContext, params: dict[str, Any]) -> dict[str, Any]:
    raise AssertionError("a method 2026-07-28 removed is never run there")


METHODS = {
    "resources/read": read_resource,
    "resources/list": list_resources,
    "prompts/get": get_prompt,
    "resources/subscribe": removed_but_registered,
}


@pytest.fixture(params=["memory", "sqlite"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[InProcess]:
    store = store_of_kind(request, tmp_path, "asgi-routing")
    tags = {"prompts/get": lambda params: frozenset({PROMPT})}
    async with in_process(store, tools(), methods=METHODS, method_tags=tags, max_body_bytes=4096, max_batch=3) as s:
        yield s


# -- the method table ---------------------------------------------------------------------------------------------


async def test_discover_answers_the_served_versions_and_the_extensions(server: InProcess) -> None:
    peer = server.peer()
    read = await peer.send(peer.message("server/discover", request_id=1))
    assert read.status == 200 and "mcp-session-id" not in read.headers
    result = json_of(read)["result"]
    assert result.pop("_meta") == {
        "io.modelcontextprotocol/serverInfo": {"name": "mcp-lossless", "version": __version__}
    }
    assert result == {
        "supportedVersions": SERVED,
        "capabilities": {
            "tools": {"listChanged": False, "idempotency": {}},
            "extensions": {
                "io.modelcontextprotocol/tasks": {},
                "io.modelcontextprotocol/structured-authorization-denials": {},
                "io.modelcontextprotocol/task-event-streams": {},
            },
        },
        "instructions": "Tool results are never lost or leaked: long or non-idempotent tools run as tasks.",
        "ttlMs": 0,
        "cacheScope": "private",
        "resultType": "complete",
    }


async def test_tools_list_names_every_tool_with_the_caching_hints(server: InProcess) -> None:
    peer = server.peer()
    body = json_of(await peer.send(peer.message("tools/list", request_id=21)))
    assert body["id"] == 21 and set(body) == {"jsonrpc", "id", "result"}
    result = body["result"]
    assert [tool["name"] for tool in result.pop("tools")] == ["search", "fetch", "routed", "book"]
    assert result == {"ttlMs": 0, "cacheScope": "private", "resultType": "complete"}


async def test_a_call_is_answered_inline_as_json(server: InProcess) -> None:
    peer = server.peer(tasks=False)
    message = peer.message("tools/call", {"name": "search", "arguments": {"query": "q", "steps": 0}}, request_id=2)
    read = await peer.send(message)
    assert read.status == 200
    assert json_of(read) == rpc_result(
        2,
        {"content": [{"type": "text", "text": "search results for 'q': 3 documents"}], "isError": False,
         "resultType": "complete"},
    )  # fmt: skip


async def test_a_call_that_reports_progress_is_answered_as_sse_without_ids(server: InProcess) -> None:
    peer = server.peer(tasks=False)
    arguments = {"query": "q", "steps": 2, "delay_ms": 0}
    message = peer.message("tools/call", {"name": "search", "arguments": arguments, "_meta": {"progressToken": "p"}})
    read = await peer.send(message, headers={})
    assert read.status == 200 and read.headers["content-type"] == "text/event-stream"
    assert read.ids == [], "nothing on this leg is resumable"
    progress = [
        {"jsonrpc": "2.0", "method": "notifications/progress",
         "params": {"progressToken": "p", "progress": step, "total": 2, "message": f"search step {step}/2"}}
        for step in (1, 2)
    ]  # fmt: skip
    final = rpc_result(
        message["id"],
        {"content": [{"type": "text", "text": "search results for 'q': 3 documents"}], "isError": False,
         "resultType": "complete"},
    )  # fmt: skip
    assert read.messages == [*progress, final]


async def test_an_unknown_tool_is_an_error_in_a_200(server: InProcess) -> None:
    peer = server.peer()
    read = await peer.send(peer.message("tools/call", {"name": "nope", "arguments": {}}, request_id=3))
    assert read.status == 200
    assert json_of(read) == rpc_error(3, INVALID_PARAMS, "unknown tool 'nope'")


async def test_the_extra_methods_of_the_table_run_with_the_caching_hints_where_cacheable(server: InProcess) -> None:
    peer = server.peer()
    listed = await peer.send(peer.message("resources/list", request_id=4))
    assert listed.status == 200
    assert json_of(listed) == rpc_result(
        4, {"resources": [{"uri": "test://hello", "name": "hello"}], "ttlMs": 0, "cacheScope": "private",
            "resultType": "complete"}
    )  # fmt: skip
    read = await peer.send(peer.message("resources/read", {"uri": "test://hello"}, request_id=5))
    assert json_of(read) == rpc_result(
        5, {"contents": [{"uri": "test://hello", "text": "hello"}], "ttlMs": 0, "cacheScope": "private",
            "resultType": "complete"}
    )  # fmt: skip
    prompt = await peer.send(peer.message("prompts/get", {"name": "ada"}, request_id=6))
    assert json_of(prompt) == rpc_result(
        6, {"messages": [{"role": "user", "content": {"type": "text", "text": "hello ada"}}], "resultType": "complete"}
    )


async def test_a_resource_not_found_is_invalid_params_on_this_revision(server: InProcess) -> None:
    peer = server.peer()
    read = await peer.send(peer.message("resources/read", {"uri": "test://nowhere"}, request_id=7))
    assert read.status == 200
    assert json_of(read) == rpc_error(7, INVALID_PARAMS, "resource not found", {"uri": "test://nowhere"})


@pytest.mark.parametrize(
    "method",
    ["initialize", "ping", "logging/setLevel", "resources/subscribe", "resources/unsubscribe", "tasks/result",
     "tasks/list", "prompts/list", "nope/nope"],
)  # fmt: skip
async def test_a_removed_or_unknown_method_is_404_method_not_found(server: InProcess, method: str) -> None:
    peer = server.peer()
    read = await peer.send(peer.message(method, request_id=8))
    assert read.status == 404
    assert json_of(read) == rpc_error(8, METHOD_NOT_FOUND, f"method {method!r} not found on {MODERN}")


async def test_a_notification_is_accepted_with_nothing_to_say(server: InProcess) -> None:
    peer = server.peer()
    message = peer.message("notifications/progress", {"progressToken": "x", "progress": 1})
    del message["id"]
    read = await peer.send(message)
    assert (read.status, read.body) == (202, b"")


async def test_a_response_from_the_client_is_refused(server: InProcess) -> None:
    peer = server.peer()
    response = {"jsonrpc": "2.0", "id": 9, "result": {}}
    headers = peer.headers(peer.message("tools/list"))  # no session, a version no session has: the modern leg's
    read = await server.http.post(peer.url, content=orjson.dumps(response), headers=headers)
    assert read.status_code == 400
    assert read.json() == rpc_error(9, INVALID_REQUEST, f"clients send no responses on {MODERN}")


# -- the checks of headers and _meta -----------------------------------------------------------------------------

META_REQUIRED = (
    "params._meta must carry io.modelcontextprotocol/protocolVersion (a string) and "
    "io.modelcontextprotocol/clientCapabilities (an object)"
)


@pytest.mark.parametrize(
    "params",
    [
        {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN}},
        {"_meta": {"io.modelcontextprotocol/protocolVersion": MODERN,
                   "io.modelcontextprotocol/clientCapabilities": []}},
        {"_meta": {"io.modelcontextprotocol/protocolVersion": 20260728,
                   "io.modelcontextprotocol/clientCapabilities": {}}},
    ],
    ids=["no-capabilities", "capabilities-not-an-object", "version-not-a-string"],
)  # fmt: skip
async def test_meta_without_its_fields_is_invalid_params(server: InProcess, params: dict[str, Any]) -> None:
    peer = server.peer()
    message = {"jsonrpc": "2.0", "id": 10, "method": "tools/list", "params": params}
    read = await peer.send(message)
    assert read.status == 400
    assert json_of(read) == rpc_error(10, INVALID_PARAMS, META_REQUIRED)


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({"mcp-protocol-version": None}, "MCP-Protocol-Version header required"),
        ({"mcp-protocol-version": "2025-11-25"},
         "MCP-Protocol-Version header does not match io.modelcontextprotocol/protocolVersion '2026-07-28'"),
        ({"mcp-method": None}, "Mcp-Method header must be present and equal 'tools/call'"),
        ({"mcp-method": "tools/list"}, "Mcp-Method header must be present and equal 'tools/call'"),
        ({"mcp-name": None}, "Mcp-Name header must be present and equal params.name"),
        ({"mcp-name": "fetch"}, "Mcp-Name header must be present and equal params.name"),
        ({"mcp-name": "=?base64?c2VhcmNo?= x"}, "Mcp-Name header must be present and equal params.name"),
        ({"mcp-name": "sea\x7frch"}, "header value has characters outside visible ASCII"),
        ({"mcp-name": "=?base64?not base64!?="}, "header value is not valid base64 UTF-8"),
        ({"mcp-name": "=?base64?//79?="}, "header value is not valid base64 UTF-8"),
    ],
    ids=["no-version", "other-version", "no-method", "other-method", "no-name", "other-name", "not-the-sentinel",
         "control-byte",
         "bad-base64", "not-utf8"],
)  # fmt: skip
async def test_a_header_that_does_not_mirror_the_body_is_refused(
    server: InProcess, headers: dict[str, Any], message: str
) -> None:
    peer = server.peer()
    call = peer.message("tools/call", {"name": "search", "arguments": {"query": "q", "steps": 0}}, request_id=11)
    read = await peer.send(call, headers=headers)
    assert read.status == 400
    assert json_of(read) == rpc_error(11, HEADER_MISMATCH, message)


@pytest.mark.parametrize("name", ["=?base64?c2VhcmNo?=", " search\t"], ids=["base64", "padded"])
async def test_a_name_header_in_its_other_forms_is_accepted(server: InProcess, name: str) -> None:
    peer = server.peer(tasks=False)
    call = peer.message("tools/call", {"name": "search", "arguments": {"query": "q", "steps": 0}}, request_id=12)
    read = await peer.send(call, headers={"mcp-name": name})
    assert read.status == 200 and json_of(read)["result"]["resultType"] == "complete"


async def test_an_unsupported_version_is_refused_naming_the_served_ones(server: InProcess) -> None:
    peer = server.peer()
    message = {**peer.message("tools/list", request_id=13), "params": {"_meta": meta(version="2099-01-01")}}
    read = await peer.send(message, headers={"mcp-protocol-version": "2099-01-01"})
    assert read.status == 400
    assert json_of(read) == rpc_error(
        13, UNSUPPORTED_PROTOCOL_VERSION, "Unsupported protocol version",
        {"supported": SERVED, "requested": "2099-01-01"},
    )  # fmt: skip


async def test_a_task_method_without_the_extension_names_the_capability(server: InProcess) -> None:
    peer = server.peer(tasks=False)
    read = await peer.send(peer.message("tasks/get", {"taskId": "t"}, request_id=14))
    assert read.status == 400
    assert json_of(read) == rpc_error(
        14, MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability",
        {"requiredCapabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}}},
    )  # fmt: skip


# -- Mcp-Param-* ------------------------------------------------------------------------------------------------


def routed_call(peer: ModernPeer, **arguments: Any) -> dict[str, Any]:
    return peer.message("tools/call", {"name": "routed", "arguments": arguments}, request_id=15)


@pytest.mark.parametrize(
    ("arguments", "headers", "text"),
    [
        ({"region": "eu"}, {"mcp-param-region": "eu"}, "eu/None/None"),
        ({"region": "zürich"}, {"mcp-param-region": "=?base64?esO8cmljaA==?="}, "zürich/None/None"),
        ({"priority": 3, "dry": True}, {"mcp-param-priority": "3.0", "mcp-param-dry": "true"}, "None/3/True"),
        ({"dry": False, "region": None}, {"mcp-param-dry": "false"}, "None/None/False"),
        ({}, {}, "None/None/None"),
    ],
    ids=["plain", "base64", "number-and-boolean", "null-needs-no-header", "none"],
)
async def test_mirrored_arguments_with_their_headers_are_served(
    server: InProcess, arguments: dict[str, Any], headers: dict[str, str], text: str
) -> None:
    peer = server.peer()
    read = await peer.send(routed_call(peer, **arguments), headers=headers)
    assert read.status == 200
    assert json_of(read) == rpc_result(
        15, {"content": [{"type": "text", "text": text}], "isError": False, "resultType": "complete"}
    )


@pytest.mark.parametrize(
    ("arguments", "headers", "message"),
    [
        ({"region": "eu"}, {}, "mcp-param-region header required: arguments.region is set"),
        ({"region": "eu"}, {"mcp-param-region": "us"}, "mcp-param-region header does not match arguments.region"),
        ({"priority": 3}, {"mcp-param-priority": "three"},
         "mcp-param-priority header does not match arguments.priority"),
        ({"dry": True}, {"mcp-param-dry": "True"}, "mcp-param-dry header does not match arguments.dry"),
        ({"region": "zürich"}, {"mcp-param-region": "=?base64?enVyaWNo?="},
         "mcp-param-region header does not match arguments.region"),
        ({"priority": 10}, {"mcp-param-priority": "1_0"},
         "mcp-param-priority header does not match arguments.priority"),
        ({"priority": 42}, {"mcp-param-priority": "=?base64?2aTZog==?="},
         "mcp-param-priority header does not match arguments.priority"),
        ({"priority": 2**53}, {"mcp-param-priority": "9007199254740993.0"},
         "mcp-param-priority header does not match arguments.priority"),
    ],
    ids=["missing", "other-value", "not-a-number", "boolean-spelling", "other-decoded", "underscore",
         "arabic-indic-digits", "past-float-precision"],
)  # fmt: skip
async def test_a_mirrored_header_missing_or_unequal_is_refused_before_the_tool_runs(
    server: InProcess, arguments: dict[str, Any], headers: dict[str, str], message: str
) -> None:
    peer = server.peer()
    read = await peer.send(routed_call(peer, **arguments), headers=headers)
    assert read.status == 400
    assert json_of(read) == rpc_error(15, HEADER_MISMATCH, message)


# -- batches ----------------------------------------------------------------------------------------------------


async def test_a_batch_of_modern_requests_is_refused_as_this_revision_has_none(server: InProcess) -> None:
    peer = server.peer()
    first, second = peer.message("tools/list", request_id=16), peer.message("server/discover", request_id=17)
    response = await server.http.post(peer.url, content=orjson.dumps([first, second]), headers=peer.headers(first))
    assert response.status_code == 400
    assert response.json() == rpc_error(
        None, UNSUPPORTED_PROTOCOL_VERSION,
        f"protocol {MODERN} is served statelessly (per-request _meta, no session), not on a session; "
        "a session speaks one of 2025-11-25, 2025-06-18, 2025-03-26",
        {"supported": SERVED[1:], "requested": MODERN},
    )  # fmt: skip


async def test_a_batch_longer_than_max_batch_is_refused_before_it_is_read(server: InProcess) -> None:
    peer = server.peer()
    batch = [peer.message("tools/list", request_id=n) for n in range(4)]
    response = await server.http.post(peer.url, content=orjson.dumps(batch), headers=peer.headers(batch[0]))
    assert response.status_code == 400
    assert response.json() == rpc_error(
        None, LIMIT_EXCEEDED, "a batch holds at most 3 messages (max_batch); this one has 4",
        {"limit": "max_batch", "maximum": 3},
    )  # fmt: skip


@pytest.mark.parametrize(("version", "allowed"), [("2025-03-26", True), ("2025-06-18", False), ("2025-11-25", False)])
async def test_a_legacy_batch_is_served_only_on_the_revision_that_has_them(
    server: InProcess, version: str, allowed: bool
) -> None:
    legacy = Peer(server.http, "http://127.0.0.1:8000", server.whole, version=version)
    await legacy.initialize()
    batch = [{"jsonrpc": "2.0", "id": n, "method": "ping"} for n in (1, 2)]
    read = await legacy.post(batch)
    if allowed:
        assert read.status == 200 and sorted(m["id"] for m in read.messages) == [1, 2]
        assert all(m["result"] == {} for m in read.messages)
    else:
        assert read.status == 400
        assert read.json() == rpc_error(
            None, INVALID_REQUEST,
            f"JSON-RPC batches are only accepted on sessions negotiated at 2025-03-26 (this one: {version})",
        )  # fmt: skip


# -- refused before any byte ------------------------------------------------------------------------------------


async def test_a_call_the_token_does_not_cover_is_403_with_the_challenge(server: InProcess) -> None:
    peer = server.peer(server.narrowed)
    call = peer.message("tools/call", {"name": "fetch", "arguments": {"url": "u"}}, request_id=18)
    read = await peer.send(call)
    assert read.status == 403
    fetch = tool_resource("fetch")
    description = f"token audience does not cover {fetch}"
    assert read.headers["www-authenticate"] == (
        f'Bearer error="insufficient_scope", error_description="{description}", resource="{fetch}", '
        'resource_metadata="http://127.0.0.1:8000/.well-known/oauth-protected-resource/mcp"'
    )
    body = json_of(read)
    envelope = body["error"]["data"]["authorization"]
    assert body == rpc_error(
        18, TOOL_FORBIDDEN, description,
        {"requiredResources": [fetch], "requiredScopes": [], "authorization": envelope,
         "_meta": {"io.modelcontextprotocol/authorization": envelope}},
    )  # fmt: skip
    assert_replacement_envelope(envelope, resources=[fetch], scopes=[])


async def test_an_extra_method_the_token_does_not_cover_is_403_naming_its_tag(server: InProcess) -> None:
    peer = server.peer(server.narrowed)
    read = await peer.send(peer.message("prompts/get", {"name": "ada"}, request_id=19))
    assert read.status == 403
    body = json_of(read)
    assert body["id"] == 19 and body["error"]["code"] == TOOL_FORBIDDEN
    assert body["error"]["message"] == f"token audience does not cover {PROMPT}"
    assert body["error"]["data"]["requiredResources"] == [PROMPT]
    assert f'resource="{PROMPT}"' in read.headers["www-authenticate"]


async def test_no_token_is_401_with_the_metadata_challenge(server: InProcess) -> None:
    peer = server.peer()
    message = peer.message("tools/list", request_id=20)
    headers = peer.headers(message)
    del headers["authorization"]
    response = await server.http.post(peer.url, content=orjson.dumps(message), headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer ")
    assert (
        'resource_metadata="http://127.0.0.1:8000/.well-known/oauth-protected-resource/mcp"'
        in (response.headers["www-authenticate"])
    )
    assert "result" not in response.json()


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({"accept": "application/json"}, 406, "Accept must list both application/json and text/event-stream"),
        ({"content-type": "text/plain"}, 415, "Content-Type must be application/json"),
    ],
    ids=["accept", "content-type"],
)
async def test_media_types_are_checked_first(
    server: InProcess, headers: dict[str, str], status: int, message: str
) -> None:
    peer = server.peer()
    read = await peer.send(peer.message("tools/list"), headers=headers)
    assert read.status == status
    assert json_of(read) == rpc_error(None, INVALID_REQUEST, message)


async def test_a_body_past_max_body_bytes_is_413_naming_the_limit(server: InProcess) -> None:
    peer = server.peer()
    message = peer.message("tools/call", {"name": "search", "arguments": {"query": "q" * 5000}})
    read = await peer.send(message)
    assert read.status == 413
    assert json_of(read) == rpc_error(
        None, LIMIT_EXCEEDED, "request body exceeds 4096 bytes", {"limit": "max_body_bytes", "maximum": 4096}
    )


async def test_a_body_that_is_not_json_is_a_parse_error(server: InProcess) -> None:
    peer = server.peer()
    headers = peer.headers(peer.message("tools/list"))
    response = await server.http.post(peer.url, content=b'{"jsonrpc": "2.0", ', headers=headers)
    assert response.status_code == 400
    body = response.json()
    assert body["id"] is None and body["error"]["code"] == PARSE_ERROR
    assert body["error"]["message"].startswith("body is not JSON: ")


async def test_a_foreign_origin_is_refused_before_the_token_is_read(server: InProcess) -> None:
    """DNS-rebinding protection holds for the stateless leg too: a page elsewhere cannot drive a loopback server."""
    peer = server.peer()
    anonymous_elsewhere: dict[str, str | None] = {"origin": "http://evil.example", "authorization": None}
    read = await peer.send(peer.message("tools/list", request_id=22), headers=anonymous_elsewhere)
    assert read.status == 403
    assert json_of(read) == rpc_error(None, INVALID_REQUEST, "origin 'http://evil.example' is not allowed")


async def test_a_client_gone_before_its_body_is_read_gets_nothing_and_runs_nothing(server: InProcess) -> None:
    peer = server.peer()
    message = peer.message("tools/call", {"name": "search", "arguments": {"query": "q", "steps": 0}})
    sent: list[Any] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.disconnect"}

    async def send(event: Any) -> None:
        sent.append(event)

    headers = [(k.encode(), v.encode()) for k, v in peer.headers(message).items()]
    scope = {"type": "http", "method": "POST", "path": "/mcp", "headers": headers, "client": ("127.0.0.1", 1)}
    await server.app(scope, receive, send)
    assert sent == []


# -- multi round-trip requests ----------------------------------------------------------------------------------

ELICITS: dict[str, Any] = {"io.modelcontextprotocol/clientCapabilities": {"elicitation": {}}}
ASKED = {"input-1": {"method": "elicitation/create", "params": {"message": "Name?", "requestedSchema": {}}}}


async def test_input_is_asked_in_rounds_bound_to_the_principal_and_the_call(server: InProcess) -> None:
    """The request answers ``input_required`` with a sealed ``requestState``; the retry carrying the answers and
    that state is served; the state is refused to another principal, for other arguments, or altered."""
    peer = server.peer(tasks=False)
    call = {"name": "book", "arguments": {"city": "Oslo"}, "_meta": ELICITS}
    first = await peer.send(peer.message("tools/call", call, request_id=23))
    assert first.status == 200
    result = json_of(first)["result"]
    state = result.pop("requestState")
    assert result == {"inputRequests": ASKED, "resultType": "input_required"}
    retry = {**call, "inputResponses": {"input-1": {"action": "accept", "content": {"name": "Ada"}}}}
    retry["requestState"] = state
    stranger = server.peer(server.mallory, tasks=False)
    bound = "requestState was issued for another principal, request or arguments"
    altered = state[:-1] + ("A" if state[-1] != "A" else "B")
    for who, params, message in [
        (stranger, retry, bound),
        (peer, {**retry, "arguments": {"city": "Rome"}}, bound),
        (peer, {**retry, "requestState": altered},
         "requestState failed verification: it was not issued by this server or was altered"),
    ]:  # fmt: skip
        refused = await who.send(who.message("tools/call", params, request_id=24))
        assert (refused.status, json_of(refused)) == (200, rpc_error(24, INVALID_PARAMS, message))
    served = await peer.send(peer.message("tools/call", retry, request_id=25))
    assert json_of(served) == rpc_result(
        25, {"content": [{"type": "text", "text": "booked Oslo for Ada"}], "isError": False, "resultType": "complete"}
    )


async def test_input_the_client_cannot_give_is_refused_naming_the_capability(server: InProcess) -> None:
    peer = server.peer(tasks=False)
    read = await peer.send(peer.message("tools/call", {"name": "book", "arguments": {"city": "Oslo"}}, request_id=26))
    assert read.status == 400
    assert json_of(read) == rpc_error(
        26, MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability",
        {"requiredCapabilities": {"elicitation": {}}},
    )  # fmt: skip
