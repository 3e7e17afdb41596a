"""A ``tools/call`` whose params are malformed is a JSON-RPC ``-32602`` saying what is wrong, in both eras and in a
batch, over real HTTP on loopback: params that are not an object with a string ``name`` are not an "unknown tool
None", and ``arguments`` that are not an object are refused before the tool runs. (Params neither an object nor
an array are no JSON-RPC request: ``-32600``, the envelope's check.)"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from mcp_lossless.core.errors import INVALID_PARAMS
from tests.support.mcp_http import Peer, call, dev_token
from tests.support.modern_http import ModernPeer, answer, rpc_error

pytestmark = pytest.mark.anyio

UNNAMED = "tools/call params must be an object with a string name"
NOT_AN_OBJECT = "invalid arguments for search: arguments must be an object"
MALFORMED: list[tuple[Any, str]] = [
    ([], UNNAMED),
    ({}, UNNAMED),
    ({"arguments": {"query": "q"}}, UNNAMED),
    ({"name": 5}, UNNAMED),
    ({"name": None}, UNNAMED),
    ({"name": "search", "arguments": []}, NOT_AN_OBJECT),
    ({"name": "search", "arguments": "q"}, NOT_AN_OBJECT),
    ({"name": "nope"}, "unknown tool 'nope'"),
]
IDS = ["list", "empty", "no-name", "int-name", "null-name", "list-arguments", "string-arguments", "unknown"]


def rpc(request_id: int, params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


@pytest.mark.parametrize(("params", "message"), MALFORMED, ids=IDS)
async def test_a_legacy_call_with_malformed_params_is_invalid_params(
    server_url: str, http: httpx.AsyncClient, params: Any, message: str
) -> None:
    peer = Peer(http, server_url, await dev_token(http, server_url, f"{server_url}/mcp"))
    await peer.initialize()
    read = await peer.post(rpc(7, params))
    assert read.status == 200
    assert read.messages == [rpc_error(7, INVALID_PARAMS, message)]


async def test_a_batch_answers_each_malformed_call_and_runs_the_others(
    server_url: str, http: httpx.AsyncClient
) -> None:
    peer = Peer(http, server_url, await dev_token(http, server_url, f"{server_url}/mcp"), version="2025-03-26")
    await peer.initialize()
    batch = [rpc(i, params) for i, (params, _) in enumerate(MALFORMED)]
    batch.append(call(len(MALFORMED), "search", query="q", steps=0))
    read = await peer.post(batch)
    assert read.status == 200
    answers = {m["id"]: m for m in read.messages if "id" in m}
    assert [answers[i] for i in range(len(MALFORMED))] == [
        rpc_error(i, INVALID_PARAMS, message) for i, (_, message) in enumerate(MALFORMED)
    ]
    assert answers[len(MALFORMED)]["result"]["isError"] is False


@pytest.mark.parametrize(("params", "message"), MALFORMED[1:], ids=IDS[1:])
async def test_a_modern_call_with_malformed_params_is_invalid_params(
    server_url: str, http: httpx.AsyncClient, params: dict[str, Any], message: str
) -> None:
    """On 2026-07-28 a call without a string ``name`` is refused 400 before its ``Mcp-Name`` header is compared
    (there is no name to mirror); the rest are answered in band, as an unknown tool is. (Params that are not an
    object carry no ``_meta``: that ``-32602`` is the modern leg's routing tests'.)"""
    peer = ModernPeer(http, server_url, await dev_token(http, server_url, f"{server_url}/mcp"), tasks=False)
    sent = peer.message("tools/call", params, request_id=7)
    read = await peer.send(sent)
    assert read.status == (400 if message == UNNAMED else 200)
    assert answer(read) == rpc_error(7, INVALID_PARAMS, message)


# -- arguments held to the published schema -------------------------------------------------------------------

NOT_INTEGER = "invalid arguments for search: steps: Input should be a valid integer"
STEPS: list[tuple[object, str | None]] = [
    ("0", NOT_INTEGER),
    (True, NOT_INTEGER),
    (False, NOT_INTEGER),
    (0.5, NOT_INTEGER),
    (None, NOT_INTEGER),
    (0, None),
    (0.0, None),  # JSON Schema's integer: a number with no fractional part
]
STEP_IDS = ["string", "true", "false", "fraction", "null", "int", "integral-float"]


async def test_search_publishes_steps_as_an_integer(server_url: str, http: httpx.AsyncClient) -> None:
    peer = ModernPeer(http, server_url, await dev_token(http, server_url, f"{server_url}/mcp"), tasks=False)
    (search,) = [t for t in answer(await peer.request("tools/list"))["result"]["tools"] if t["name"] == "search"]
    assert search["inputSchema"]["properties"]["steps"]["type"] == "integer"


@pytest.mark.parametrize(("steps", "message"), STEPS, ids=STEP_IDS)
async def test_a_legacy_call_is_held_to_the_published_schema(
    server_url: str, http: httpx.AsyncClient, steps: object, message: str | None
) -> None:
    peer = Peer(http, server_url, await dev_token(http, server_url, f"{server_url}/mcp"))
    await peer.initialize()
    read = await peer.post(call(7, "search", query="q", steps=steps))
    assert read.status == 200
    if message is None:
        assert read.messages[-1]["result"]["isError"] is False
    else:
        assert read.messages == [rpc_error(7, INVALID_PARAMS, message)]


@pytest.mark.parametrize(("steps", "message"), STEPS, ids=STEP_IDS)
async def test_a_modern_call_is_held_to_the_published_schema(
    server_url: str, http: httpx.AsyncClient, steps: object, message: str | None
) -> None:
    peer = ModernPeer(http, server_url, await dev_token(http, server_url, f"{server_url}/mcp"), tasks=False)
    read = await peer.call("search", query="q", steps=steps)
    assert read.status == 200
    if message is None:
        assert answer(read)["result"]["isError"] is False
    else:
        assert answer(read)["error"] == {"code": INVALID_PARAMS, "message": message}
