"""Issue 14: the gateway exposes its upstreams' prompts and resources (docs/decisions/0021).

Real upstreams on loopback: the official SDK server (``MCPServer``, a resource pair and two prompts) over
Streamable HTTP in both eras and over stdio in both eras, and our own demo server, which has neither
(``resources/list`` answers -32601). Clients in front of the gateway: raw HTTP in both eras, with real JWTs
of the gateway's dev AS, and our own client.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from mcp_lossless.client import BearerToken, Client, RemoteError
from mcp_lossless.client.modern import ModernClient
from mcp_lossless.conformance_fixtures import conformance_app
from mcp_lossless.core.errors import FORBIDDEN, INVALID_PARAMS, RESOURCE_NOT_FOUND, TOOL_FORBIDDEN
from mcp_lossless.gateway import UpstreamConfig
from mcp_lossless.gateway.config import CatalogRule
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from tests.support.gateway_deployment import Deployment, sdk_upstream, serve_gateway
from tests.support.mcp_http import Peer, StreamRead, dev_token
from tests.support.modern_http import ModernPeer
from tests.support.modern_http import answer as modern_answer
from tests.support.uvicorn_server import lossless_server

pytestmark = pytest.mark.anyio

UPSTREAM_TOKEN = "gateway-own-upstream-credential"
TOKEN_ENV = "MCP_LOSSLESS_TEST_CATALOG_UPSTREAM_TOKEN"
SDK_STDIO = (sys.executable, "-m", "tests.interop.peers.sdk_gateway_upstream", "stdio")
CONF_TEMPLATE = "test://template/{id}/data"


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    guarded = CatalogRule(scopes=("notes:read",))

    def plain(port: int) -> Any:
        return create_app(ServerConfig(port=port, store="memory", issuer=None))

    def conformance(port: int) -> Any:
        return conformance_app(ServerConfig(port=port, store="memory", issuer=None))

    with (
        sdk_upstream(tmp_path_factory.mktemp("sdk"), UPSTREAM_TOKEN, TOKEN_ENV) as (sdk, auth),
        lossless_server(plain) as plain_base,
        lossless_server(conformance) as conf_base,
    ):
        plain_url, conf_url = f"{plain_base}/mcp", f"{conf_base}/mcp"
        upstreams = [
            # The SDK's legacy leg; its private notes and internal prompt are not exposed.
            UpstreamConfig(
                name="sdk",
                url=sdk.url,
                auth=auth,
                era="legacy",
                sessions=1,
                resources=CatalogRule(deny=frozenset({"notes://private", "notes://topics/secret"})),
                prompts=CatalogRule(deny=frozenset({"internal"})),
            ),
            # The same server in 2026-07-28: its readme's URI is the sdk upstream's (skipped, logged); its
            # private notes and its prompts need a scope.
            UpstreamConfig(
                name="modern", url=sdk.url, auth=auth, prefix="m_", sessions=1, resources=guarded, prompts=guarded
            ),
            # stdio children in both eras: prompts only.
            UpstreamConfig(name="pysdk", command=SDK_STDIO, resources=CatalogRule(exposed=False)),
            UpstreamConfig(name="pyold", command=SDK_STDIO, era="legacy", resources=CatalogRule(exposed=False)),
            # Our demo server: tools only, -32601 for the rest.
            UpstreamConfig(name="plain", url=plain_url),
            # Our conformance server: its resource template only (guarded), overlapping one of the SDK's.
            UpstreamConfig(
                name="conf",
                url=conf_url,
                prompts=CatalogRule(exposed=False),
                resources=CatalogRule(allow=frozenset({CONF_TEMPLATE}), scopes=("notes:read",)),
            ),
        ]
        with serve_gateway(upstreams, sdk, retry_ms=200) as d:
            yield d


async def token(http: httpx.AsyncClient, d: Deployment, scope: str = "", resource: str | None = None) -> str:
    """A real signed JWT of the gateway's dev AS for ``resource`` (the whole gateway unless given)."""
    return await dev_token(http, d.url, resource or d.mcp, scope=scope)


def answer(read: StreamRead, request_id: int) -> dict[str, Any]:
    for message in read.messages:
        if message.get("id") == request_id:
            return message
    raise AssertionError(f"no answer to {request_id}: {read}")


def request(request_id: int, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


async def test_legacy_client_lists_gets_and_reads_through_every_upstream_era(deployment: Deployment, http) -> None:
    d = deployment
    peer = Peer(http, d.url, await token(http, d, "notes:read"))
    initialized = await peer.initialize()
    assert initialized["capabilities"]["prompts"] == {"listChanged": False}
    assert initialized["capabilities"]["resources"] == {"listChanged": False}

    prompts = answer(await peer.post(request(1, "prompts/list")), 1)["result"]["prompts"]
    names = sorted(p["name"] for p in prompts)
    assert names == [
        *("m_internal", "m_review", "pyold_internal", "pyold_review", "pysdk_internal", "pysdk_review", "sdk_review")
    ]
    review = next(p for p in prompts if p["name"] == "sdk_review")
    assert review["arguments"][0]["name"] == "topic" and review["description"] == "Ask for a review of `topic`."

    resources = answer(await peer.post(request(2, "resources/list")), 2)["result"]["resources"]
    assert sorted((r["uri"], r["name"]) for r in resources) == [
        ("notes://private", "private"),  # modern's: sdk denies it
        ("notes://readme", "readme"),  # sdk's: modern's copy of the URI is skipped
    ]

    for rid, name in enumerate(["sdk_review", "m_review", "pysdk_review", "pyold_review"], start=3):
        got = answer(await peer.post(request(rid, "prompts/get", name=name, arguments={"topic": "the gateway"})), rid)
        assert got["result"]["messages"][0]["content"] == {"type": "text", "text": "Please review the gateway."}, got

    readme = answer(await peer.post(request(10, "resources/read", uri="notes://readme")), 10)["result"]
    assert readme["contents"][0]["text"] == "read me first"
    private = answer(await peer.post(request(11, "resources/read", uri="notes://private")), 11)["result"]
    assert private["contents"][0]["text"] == "private notes"


async def test_denied_unknown_and_uncovered_are_refused_explicitly(deployment: Deployment, http) -> None:
    d = deployment
    peer = Peer(http, d.url, await token(http, d))  # the whole gateway, no scope
    await peer.initialize()
    await peer.post(request(1, "resources/list"))

    denied = answer(await peer.post(request(2, "prompts/get", name="sdk_internal")), 2)["error"]
    assert denied["code"] == INVALID_PARAMS and denied["message"] == "unknown prompt 'sdk_internal'"
    # A URI no listing routes needs what every upstream exposing resources needs (here modern's scope): a stale
    # route can refuse, never leak. With it, the URI is unknown.
    unrouted = await peer.post(request(3, "resources/read", uri="notes://nowhere"))
    assert unrouted.status == 403 and unrouted.json()["error"]["data"]["requiredScopes"] == ["notes:read"]
    reader = await token(http, d, "notes:read")
    unknown = answer(await peer.post(request(4, "resources/read", uri="notes://nowhere"), token=reader), 4)["error"]
    assert unknown == {
        "code": RESOURCE_NOT_FOUND,
        "message": "unknown resource 'notes://nowhere'",
        "data": {"uri": "notes://nowhere"},
    }

    before = len(d.sdk.messages())
    for message in [request(5, "resources/read", uri="notes://private"), request(6, "prompts/get", name="m_review")]:
        refused = await peer.post(message)
        assert refused.status == 403, refused
        error = refused.json()["error"]
        assert error["code"] == FORBIDDEN and error["message"] == "token lacks scope notes:read"
        assert error["data"]["requiredResources"] == [] and error["data"]["requiredScopes"] == ["notes:read"]
        assert 'error="insufficient_scope"' in refused.headers["www-authenticate"]
    assert not any(m["method"] in ("resources/read", "prompts/get") for m in d.sdk.messages()[before:]), (
        "a refused read never reaches the upstream"
    )

    # A token for one exposed tool only is not a token for the gateway's prompts and resources.
    prm = (await http.get(f"{d.url}/.well-known/oauth-protected-resource/mcp")).json()
    assert "notes:read" in prm["scopes_supported"], "the scopes prompts and resources need are discoverable"

    narrow = await token(http, d, "notes:read", resource=f"{d.mcp}/tools/sdk_lookup")
    refused = await peer.post(request(7, "resources/read", uri="notes://readme"), token=narrow)
    assert refused.status == 403 and refused.json()["error"]["data"]["requiredResources"] == [d.mcp]


async def test_modern_clients_get_read_and_are_refused_the_same_way(deployment: Deployment, http) -> None:
    d = deployment
    peer = ModernPeer(http, d.url, await token(http, d))
    refused = await peer.request("resources/read", {"uri": "notes://private"})
    assert refused.status == 403
    assert refused.json()["error"]["code"] == TOOL_FORBIDDEN
    assert refused.json()["error"]["data"]["requiredResources"] == [] and refused.json()["error"]["data"][
        "requiredScopes"
    ] == ["notes:read"]
    reader = await token(http, d, "notes:read")
    missing = modern_answer(await peer.request("resources/read", {"uri": "notes://nowhere"}, token=reader))["error"]
    assert missing["code"] == INVALID_PARAMS and missing["data"] == {"uri": "notes://nowhere"}

    async with ModernClient(d.mcp, auth=BearerToken(reader)) as client:
        assert {p.name for p in await client.list_prompts()} >= {"sdk_review", "m_review", "pysdk_review"}
        got = await client.get_prompt("pyold_review", {"topic": "stdio"})
        assert got.messages[0]["content"]["text"] == "Please review stdio."
        contents = await client.read_resource("notes://private")
        assert contents[0]["text"] == "private notes"
        with pytest.raises(RemoteError) as unknown:
            await client.get_prompt("plain_anything")
        assert unknown.value.code == INVALID_PARAMS

    async with Client(d.mcp, auth=BearerToken(await token(http, d))) as legacy:
        assert [r.uri for r in await legacy.list_resources()] == ["notes://readme", "notes://private"]
        assert (await legacy.read_resource("notes://readme"))[0]["text"] == "read me first"


async def test_a_reads_stored_answer_is_replayed_only_to_a_token_that_covers_it(deployment: Deployment, http) -> None:
    d = deployment
    reader = await token(http, d, "notes:read")
    peer = Peer(http, d.url, reader)
    await peer.initialize()
    first = await peer.post(request(1, "resources/read", uri="notes://private"), stop_after=1)
    assert first.status == 200 and len(first.ids) == 1  # the priming event; the answer is left on the stream
    # The upstream's answer reaches the store after the cut: the reader's own resume waits for it live, so the
    # bare token below meets a *stored* answer (refused before the response is committed, not in-band).
    stored = await peer.resume(first.ids[0], token=reader)
    assert answer(stored, 1)["result"]["contents"][0]["text"] == "private notes"

    bare = await token(http, d)
    refused = await peer.resume(first.ids[0], token=bare)
    assert refused.status == 403, refused
    assert refused.json()["error"] == "replay_refused" and refused.json()["requiredScopes"] == ["notes:read"]
    assert "private notes" not in refused.body.decode()

    replayed = await peer.resume(first.ids[0], token=reader)
    assert answer(replayed, 1)["result"]["contents"][0]["text"] == "private notes"


async def test_an_upstream_without_prompts_or_resources_is_skipped_cleanly(
    deployment: Deployment, http, caplog: pytest.LogCaptureFixture
) -> None:
    d = deployment
    peer = Peer(http, d.url, await token(http, d, "notes:read"))
    await peer.initialize()
    tools = answer(await peer.post(request(1, "tools/list")), 1)["result"]["tools"]
    assert any(t["name"].startswith("plain_") for t in tools), "the demo server is connected"
    with caplog.at_level(logging.WARNING, logger="mcp_lossless.gateway"):
        prompts = answer(await peer.post(request(2, "prompts/list")), 2)["result"]["prompts"]
        resources = answer(await peer.post(request(3, "resources/list")), 3)["result"]["resources"]
    assert not any(p["name"].startswith("plain_") for p in prompts) and len(resources) == 2
    assert not [r for r in caplog.records if "plain" in r.getMessage()], "its -32601 is no failure"
    unknown = answer(await peer.post(request(4, "prompts/get", name="plain_echo")), 4)["error"]
    assert unknown["code"] == INVALID_PARAMS


async def test_templates_are_listed_and_route_reads_of_unlisted_uris(deployment: Deployment, http) -> None:
    d = deployment
    peer = Peer(http, d.url, await token(http, d, "notes:read"))
    await peer.initialize()
    listed = answer(await peer.post(request(1, "resources/templates/list")), 1)["result"]
    assert "nextCursor" not in listed
    assert [(t["uriTemplate"], t["name"]) for t in listed["resourceTemplates"]] == [
        ("notes://topics/{topic}", "topic"),  # sdk's; modern's copies are skipped
        ("test://template/shared{n}/data", "shared"),
        (CONF_TEMPLATE, "template-data"),  # conf's: the rest of its resources are not allowed
    ]

    before = len(d.sdk.messages())
    topic = answer(await peer.post(request(2, "resources/read", uri="notes://topics/gateway")), 2)["result"]
    assert topic["contents"][0]["text"] == "notes on gateway"
    reads = [m for m in d.sdk.messages()[before:] if m["method"] == "resources/read"]
    assert [m["params"]["uri"] for m in reads] == ["notes://topics/gateway"], "read once, from sdk alone"
    conf = answer(await peer.post(request(3, "resources/read", uri="test://template/7/data")), 3)["result"]
    assert conf["contents"][0]["text"] == '{"id":"7","templateTest":true,"data":"Data for ID: 7"}'

    ambiguous = answer(await peer.post(request(4, "resources/read", uri="test://template/shared1/data")), 4)["error"]
    assert ambiguous["code"] == INVALID_PARAMS and "ambiguous" in ambiguous["message"], ambiguous
    assert ambiguous["data"] == {
        "uri": "test://template/shared1/data",
        "templates": [
            {"upstream": "sdk", "uriTemplate": "test://template/shared{n}/data"},
            {"upstream": "conf", "uriTemplate": CONF_TEMPLATE},
        ],
    }
    # A URI the upstream's rule denies is not read through its template; nor one that matches no template.
    for rid, uri in [(5, "notes://topics/secret"), (6, "notes://topics/a/b"), (7, "test://template//data")]:
        unknown = answer(await peer.post(request(rid, "resources/read", uri=uri)), rid)["error"]
        assert unknown["code"] == RESOURCE_NOT_FOUND and unknown["data"] == {"uri": uri}, unknown
    long = "notes://topics/" + "a" * 3000
    refused = answer(await peer.post(request(8, "resources/read", uri=long)), 8)["error"]
    assert refused["code"] == INVALID_PARAMS and refused["data"] == {"maxLength": 2048}, refused
    assert not any(m["params"].get("uri") in ("notes://topics/secret", long) for m in d.sdk.messages()[before:])


async def test_a_templated_read_needs_its_upstreams_scopes(deployment: Deployment, http) -> None:
    d = deployment
    peer = Peer(http, d.url, await token(http, d))  # the whole gateway, no scope
    await peer.initialize()
    await peer.post(request(1, "resources/templates/list"))
    # sdk needs no scope: its templated URI is read; conf's needs notes:read.
    open_read = answer(await peer.post(request(2, "resources/read", uri="notes://topics/open")), 2)["result"]
    assert open_read["contents"][0]["text"] == "notes on open"
    refused = await peer.post(request(3, "resources/read", uri="test://template/9/data"))
    assert refused.status == 403, refused
    assert refused.json()["error"]["data"]["requiredResources"] == [] and refused.json()["error"]["data"][
        "requiredScopes"
    ] == ["notes:read"]
    assert 'error="insufficient_scope"' in refused.headers["www-authenticate"]
    narrow = await token(http, d, "notes:read", resource=f"{d.mcp}/tools/sdk_lookup")
    refused = await peer.post(request(4, "resources/read", uri="test://template/9/data"), token=narrow)
    assert refused.status == 403 and refused.json()["error"]["data"]["requiredResources"] == [d.mcp]

    reader = await token(http, d, "notes:read")
    async with ModernClient(d.mcp, auth=BearerToken(reader)) as client:
        templates = [t.uri_template for t in await client.list_resource_templates()]
        assert templates == ["notes://topics/{topic}", "test://template/shared{n}/data", CONF_TEMPLATE]
        contents = await client.read_resource("test://template/9/data")
        assert '"Data for ID: 9"' in contents[0]["text"]
        with pytest.raises(RemoteError) as ambiguous:
            await client.read_resource("test://template/shared2/data")
        assert ambiguous.value.code == INVALID_PARAMS


def completion(request_id: int, ref: dict[str, str], value: str, name: str = "topic") -> dict[str, Any]:
    return request(request_id, "completion/complete", ref=ref, argument={"name": name, "value": value})


async def test_completions_route_by_prompt_name_and_template(deployment: Deployment, http) -> None:
    d = deployment
    peer = Peer(http, d.url, await token(http, d, "notes:read"))
    assert (await peer.initialize())["capabilities"]["completions"] == {}

    before = len(d.sdk.messages())
    sdk = answer(await peer.post(completion(1, {"type": "ref/prompt", "name": "sdk_review"}, "ga")), 1)["result"]
    assert sdk["completion"]["values"] == ["gateway", "gardening"], sdk
    asked = [m["params"] for m in d.sdk.messages()[before:] if m["method"] == "completion/complete"]
    assert [p["ref"]["name"] for p in asked] == ["review"], "the upstream gets its own prompt name"
    stdio = answer(await peer.post(completion(2, {"type": "ref/prompt", "name": "pyold_review"}, "t")), 2)["result"]
    assert stdio["completion"]["values"] == ["tools"]

    await peer.post(request(3, "resources/templates/list"))
    topics = answer(await peer.post(completion(4, {"type": "ref/resource", "uri": "notes://topics/{topic}"}, "al")), 4)
    assert topics["result"]["completion"]["values"] == ["alpha", "almanac"], topics
    conf = answer(await peer.post(completion(5, {"type": "ref/resource", "uri": CONF_TEMPLATE}, "12", "id")), 5)
    assert conf["result"]["completion"]["values"] == ["12", "123"], conf

    for rid, ref in [
        (6, {"type": "ref/prompt", "name": "sdk_internal"}),  # denied
        (7, {"type": "ref/resource", "uri": "notes://nowhere/{x}"}),
        (8, {"type": "ref/tool", "name": "sdk_lookup"}),
    ]:
        error = answer(await peer.post(completion(rid, ref, "")), rid)["error"]
        assert error["code"] == INVALID_PARAMS, error

    async with ModernClient(d.mcp, auth=BearerToken(await token(http, d, "notes:read"))) as client:
        got = await client.complete({"type": "ref/prompt", "name": "m_review"}, {"name": "topic", "value": "g"})
        assert got["values"] == ["gateway", "gardening"]
        got = await client.complete({"type": "ref/resource", "uri": CONF_TEMPLATE}, {"name": "id", "value": "1"})
        assert got["values"] == ["1", "12", "123"]


async def test_a_completion_needs_what_its_prompt_or_template_needs(deployment: Deployment, http) -> None:
    d = deployment
    peer = Peer(http, d.url, await token(http, d))  # the whole gateway, no scope
    await peer.initialize()
    await peer.post(request(1, "resources/templates/list"))
    open_one = answer(await peer.post(completion(2, {"type": "ref/prompt", "name": "sdk_review"}, "to")), 2)
    assert open_one["result"]["completion"]["values"] == ["tools"], "sdk's prompts need no scope"
    before = len(d.sdk.messages())
    for rid, ref, value in [
        (3, {"type": "ref/prompt", "name": "m_review"}, "g"),  # modern's prompts need notes:read
        (4, {"type": "ref/resource", "uri": CONF_TEMPLATE}, "1"),  # conf's resources too
    ]:
        refused = await peer.post(completion(rid, ref, value, "id" if rid == 4 else "topic"))
        assert refused.status == 403, refused
        assert refused.json()["error"]["data"]["requiredResources"] == [] and refused.json()["error"]["data"][
            "requiredScopes"
        ] == ["notes:read"]
        assert 'error="insufficient_scope"' in refused.headers["www-authenticate"]
    assert not any(m["method"] == "completion/complete" for m in d.sdk.messages()[before:])
    narrow = await token(http, d, "notes:read", resource=f"{d.mcp}/tools/sdk_lookup")
    refused = await peer.post(completion(5, {"type": "ref/prompt", "name": "sdk_review"}, "g"), token=narrow)
    assert refused.status == 403 and refused.json()["error"]["data"]["requiredResources"] == [d.mcp]
