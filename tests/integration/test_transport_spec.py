"""Acceptance 4: status codes and headers of the Streamable HTTP transport, each with a test; never a 500."""

from __future__ import annotations

import re

import httpx
import orjson
import pytest

from mcp_lossless.core.protocol import RESOURCE_META_KEY
from tests.support.mcp_http import ACCEPT_BOTH, Peer, call, dev_token

pytestmark = pytest.mark.anyio


@pytest.fixture
async def peer(server_url: str, http: httpx.AsyncClient) -> Peer:
    peer = Peer(http, server_url, await dev_token(http, server_url, f"{server_url}/mcp"))
    await peer.initialize()
    return peer


async def raw(peer: Peer, method: str = "POST", body: bytes | None = None, **headers: str) -> httpx.Response:
    merged = peer.headers()
    merged.update({k.replace("_", "-"): v for k, v in headers.items()})
    for key in [k for k, v in merged.items() if v == ""]:
        del merged[key]
    return await peer.http.request(method, peer.url, content=body, headers=merged)


PING = orjson.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping"})


async def test_session_id_is_visible_ascii_and_unguessable(peer: Peer) -> None:
    assert peer.session_id is not None and re.fullmatch(r"[\x21-\x7e]{32,}", peer.session_id)


async def test_accept_and_content_type_are_checked(peer: Peer) -> None:
    assert (await raw(peer, body=PING, accept="application/json")).status_code == 406
    assert (await raw(peer, body=PING, content_type="text/plain")).status_code == 415
    assert (await raw(peer, "GET", accept="application/json")).status_code == 406


async def test_notifications_and_responses_get_202_without_body(peer: Peer) -> None:
    note = await raw(peer, body=orjson.dumps({"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}))
    answer = await raw(peer, body=orjson.dumps({"jsonrpc": "2.0", "id": "s1", "result": {}}))
    assert (note.status_code, note.content) == (202, b"")
    assert (answer.status_code, answer.content) == (202, b"")


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"{not json", -32700),
        (b"[]", -32600),
        (b'"text"', -32600),
        (b'{"jsonrpc": "1.0", "id": 1, "method": "ping"}', -32600),
        (b'{"jsonrpc": "2.0", "id": null, "method": "ping"}', -32600),
        (b'{"jsonrpc": "2.0", "id": true, "method": "ping"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1.5, "method": "ping"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": 7}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": "x"}', -32600),
        (b'{"jsonrpc": "2.0", "id": 1}', -32600),
        ('{"jsonrpc": "2.0", "id": 1, "method": "\u00e9\ud800"}'.encode("utf-8", "surrogatepass"), -32700),
    ],
)
async def test_malformed_bodies_are_400_with_a_json_rpc_error(peer: Peer, body: bytes, code: int) -> None:
    response = await raw(peer, body=body)
    assert response.status_code == 400
    assert response.json()["error"]["code"] == code


async def test_oversize_body_is_413_naming_the_limit_and_counted(peer: Peer, server_url: str) -> None:
    # it was -32600 with no data, unlike every other limit refusal (docs/limits.md), and not counted
    big = orjson.dumps(call(1, "search", query="x" * (2 * 1024 * 1024)))
    refused = await raw(peer, body=big)
    assert refused.status_code == 413
    error = refused.json()["error"]
    assert error["code"] == -32044 and error["data"] == {"limit": "max_body_bytes", "maximum": 1024 * 1024}
    text = (await peer.http.get(f"{server_url}/metrics")).text
    assert re.search(r'mcp_lossless_limit_refusals_total\{limit="max_body_bytes"\} [1-9]', text)


async def test_wrong_argument_types_are_a_json_rpc_error_not_a_500(peer: Peer) -> None:
    read = await peer.post(call(4, "search", query=["not", "a", "string"]))
    assert read.status == 200
    error = read.messages[-1]["error"]
    assert error["code"] == -32602 and "query" in error["message"]
    unknown = await peer.post(call(5, "nope"))
    assert unknown.messages[-1]["error"]["code"] == -32602
    method = await peer.post({"jsonrpc": "2.0", "id": 6, "method": "resources/list"})
    assert method.messages[-1]["error"]["code"] == -32601


async def test_session_header_rules(peer: Peer) -> None:
    headless = await raw(peer, body=PING, mcp_session_id="")
    assert headless.status_code == 400 and "Mcp-Session-Id" in headless.json()["error"]["message"], "names the header"
    assert (await raw(peer, body=PING, mcp_session_id="no-such-session")).status_code == 404
    deleted = await raw(peer, "DELETE")
    assert deleted.status_code == 204
    assert (await raw(peer, body=PING)).status_code == 404
    assert (await raw(peer, "GET", accept="text/event-stream")).status_code == 404


async def test_protocol_version_header(peer: Peer) -> None:
    assert (await raw(peer, body=PING, mcp_protocol_version="1999-01-01")).status_code == 400
    stateless = await raw(peer, body=PING, mcp_protocol_version="2026-07-28")
    assert stateless.status_code == 400 and "2026-07-28" in stateless.json()["error"]["message"]
    assert (await raw(peer, body=PING, mcp_protocol_version="")).status_code == 200


async def test_a_2026_07_28_request_without_a_session_is_answered_by_the_modern_leg(peer: Peer) -> None:
    """ADR 0012 (superseding 0004): a 2026-07-28 request is served statelessly, before any session check (a
    2026-07-28 client never has a session), and what it lacks is named with that revision's codes. Its -32022
    lists the modern revision first, then the served legacy ones. The GET stream exists for legacy sessions only:
    there 2026-07-28 still gets -32022 with only the revisions a session can speak, which dual-era clients fall
    back to ``initialize`` on."""
    served = ["2025-11-25", "2025-06-18", "2025-03-26"]
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28", "io.modelcontextprotocol/clientCapabilities": {}}
    by_header = await raw(peer, body=PING, mcp_protocol_version="2026-07-28", mcp_session_id="")
    partial = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "server/discover",
        "params": {"_meta": {"io.modelcontextprotocol/protocolVersion": "2026-07-28"}},
    }
    by_meta = await raw(peer, body=orjson.dumps(partial), mcp_protocol_version="", mcp_session_id="")
    for response, request_id in ((by_header, 1), (by_meta, 7)):
        assert response.status_code == 400 and "mcp-session-id" not in response.headers
        body = response.json()
        assert body["id"] == request_id
        assert body["error"]["code"] == -32602, "a modern request without its _meta fields is malformed"
        assert "_meta" in body["error"]["message"]
    discover = {"jsonrpc": "2.0", "id": 8, "method": "server/discover", "params": {"_meta": meta}}
    unheaded = await raw(peer, body=orjson.dumps(discover), mcp_protocol_version="", mcp_session_id="")
    assert unheaded.status_code == 400 and unheaded.json()["error"]["code"] == -32020, "its headers are required"
    served_modern = await raw(
        peer,
        body=orjson.dumps(discover),
        mcp_protocol_version="2026-07-28",
        mcp_method="server/discover",
        mcp_session_id="",
    )
    assert served_modern.status_code == 200 and "mcp-session-id" not in served_modern.headers
    assert served_modern.json()["result"]["supportedVersions"] == ["2026-07-28", *served]
    future = {**discover, "params": {"_meta": {**meta, "io.modelcontextprotocol/protocolVersion": "2099-01-01"}}}
    later = await raw(
        peer,
        body=orjson.dumps(future),
        mcp_protocol_version="2099-01-01",
        mcp_method="server/discover",
        mcp_session_id="",
    )
    assert later.status_code == 400 and later.json()["id"] == 8
    assert later.json()["error"]["code"] == -32022
    assert later.json()["error"]["data"] == {"supported": ["2026-07-28", *served], "requested": "2099-01-01"}
    listen = await raw(peer, "GET", accept="text/event-stream", mcp_protocol_version="2026-07-28", mcp_session_id="")
    assert listen.status_code == 400
    body = listen.json()
    assert body["id"] is None and body["error"]["code"] == -32022
    assert body["error"]["data"] == {"supported": served, "requested": "2026-07-28"}
    assert "2026-07-28" in body["error"]["message"]
    unknown = await raw(peer, body=PING, mcp_protocol_version="1999-01-01", mcp_session_id="no-such-session")
    assert unknown.status_code == 400 and unknown.json()["error"]["data"]["requested"] == "1999-01-01"


@pytest.mark.parametrize("request_id", [[1, 2], {"a": 1}, 1.5, True])
async def test_a_response_whose_id_is_not_an_id_is_a_400_not_a_500(peer: Peer, request_id: object) -> None:
    response = {"jsonrpc": "2.0", "id": request_id, "result": {}}
    for body in (response, [response]):
        answer = await raw(peer, body=orjson.dumps(body))
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["code"] == -32600 and "response id" in error["message"]
    after = await raw(peer, body=PING)  # the session still works
    assert after.status_code == 200


async def test_batches_only_on_2025_03_26_sessions(peer: Peer) -> None:
    response = await raw(peer, body=orjson.dumps([{"jsonrpc": "2.0", "id": 1, "method": "ping"}]))
    assert response.status_code == 400 and "2025-03-26" in response.json()["error"]["message"]


async def test_origin_and_host_are_validated(peer: Peer) -> None:
    assert (await raw(peer, body=PING, origin="https://evil.example")).status_code == 403
    assert (await raw(peer, body=PING, host="evil.example")).status_code == 403
    assert (await raw(peer, body=PING, origin="http://localhost:3000")).status_code == 200


async def test_other_methods_are_405(peer: Peer) -> None:
    response = await raw(peer, "PUT", body=PING)
    assert response.status_code == 405 and "POST" in response.headers["allow"]


async def test_priming_event_with_retry_only_for_2025_11_25(server_url: str, http: httpx.AsyncClient) -> None:
    token = await dev_token(http, server_url, f"{server_url}/mcp")
    new, old = Peer(http, server_url, token), Peer(http, server_url, token, version="2025-06-18")
    await new.initialize()
    await old.initialize()
    primed = await new.post(call(1, "search", query="a", steps=0, delay_ms=0))
    assert primed.events[0].data == "" and primed.events[0].id and primed.events[0].retry == 200
    plain = await old.post(call(1, "search", query="a", steps=0, delay_ms=0))
    assert all(e.data for e in plain.events) and len(plain.events) == 1 and plain.events[0].id


async def test_standalone_get_stream_is_single(peer: Peer, server_url: str) -> None:
    headers = {**peer.headers(), "accept": "text/event-stream"}
    async with peer.http.stream("GET", peer.url, headers=headers) as first:
        assert first.status_code == 200 and first.headers["content-type"] == "text/event-stream"
        chunk = await first.aiter_raw().__anext__()
        assert chunk.startswith(b"id: ")
        second = await peer.http.get(peer.url, headers=headers)
        assert second.status_code == 409


async def test_authentication_challenges(server_url: str, http: httpx.AsyncClient) -> None:
    url = f"{server_url}/mcp"
    headers = {"accept": ACCEPT_BOTH, "content-type": "application/json"}
    missing = await http.post(url, content=PING, headers=headers)
    assert missing.status_code == 401
    assert (
        f'resource_metadata="{server_url}/.well-known/oauth-protected-resource/mcp"'
        in missing.headers["www-authenticate"]
    )
    bad = await http.post(url, content=PING, headers={**headers, "authorization": "Bearer not.a.jwt"})
    assert bad.status_code == 401 and 'error="invalid_token"' in bad.headers["www-authenticate"]


async def test_wrong_audience_is_rejected_and_uncovered_call_is_403(server_url: str, http: httpx.AsyncClient) -> None:
    mcp = f"{server_url}/mcp"
    search_only = Peer(http, server_url, await dev_token(http, server_url, f"{mcp}/tools/search"))
    await search_only.initialize()
    forbidden = await search_only.post(call(1, "fetch", url="x"))
    assert forbidden.status == 403
    assert forbidden.json()["error"]["data"]["requiredResources"] == [f"{mcp}/tools/fetch"]
    challenge = forbidden.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge and f'resource="{mcp}/tools/fetch"' in challenge
    assert f'resource_metadata="{server_url}/.well-known/oauth-protected-resource/mcp"' in challenge
    endpoint = await http.get(f"{server_url}/.well-known/oauth-protected-resource/mcp")
    assert endpoint.json()["resource"] == mcp, "the challenge's metadata names the URI the client connected to"
    allowed = await search_only.post(call(2, "search", query="q", steps=0, delay_ms=0))
    assert allowed.messages[-1]["result"]["isError"] is False


async def test_tools_list_publishes_resource_indicators_and_metadata(peer: Peer, server_url: str) -> None:
    listed = await peer.post({"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
    tools = {t["name"]: t for t in listed.messages[-1]["result"]["tools"]}
    assert tools["fetch"]["_meta"][RESOURCE_META_KEY] == f"{server_url}/mcp/tools/fetch"
    assert tools["fetch"]["annotations"]["idempotentHint"] is True
    assert tools["search"]["inputSchema"]["required"] == ["query"]
    prm = await peer.http.get(f"{server_url}/.well-known/oauth-protected-resource/mcp/tools/fetch")
    assert prm.json()["resource"] == f"{server_url}/mcp/tools/fetch"
    assert prm.json()["authorization_servers"] == [f"{server_url}/dev-as"]


async def test_metrics_count_streams_and_refusals(peer: Peer, server_url: str, http: httpx.AsyncClient) -> None:
    done = await peer.post(call(1, "fetch", url="m", steps=1, delay_ms=0))
    narrowed = await dev_token(http, server_url, f"{server_url}/mcp/tools/search")
    assert (await peer.resume(done.ids[0], token=narrowed)).status == 403
    text = (await http.get(f"{server_url}/metrics")).text
    assert re.search(r'mcp_lossless_refusals_total\{phase="replay",reason="insufficient_audience"\} [1-9]', text)
    assert re.search(r'mcp_lossless_streams_total\{kind="post"\} [1-9]', text)
    assert re.search(r'mcp_lossless_store_seconds_count\{op="append"\} [1-9]', text)
    assert re.search(r'mcp_lossless_store_seconds_count\{op="read"\} [0-9]', text)
    assert re.search(r"mcp_lossless_replayed_events_total [0-9]", text)
