"""Whatever a client sends, the server answers with a 2xx/4xx and a JSON body — never a 5xx or a traceback."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.mcp_http import Peer, dev_token

ints = st.integers(min_value=-(2**63), max_value=2**64 - 1)
json_values = st.recursive(
    st.none() | st.booleans() | ints | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
methods = st.sampled_from(["tools/call", "tools/list", "ping", "initialize", "notifications/cancelled", "x/y", ""])
messages = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0", 2]), "method": methods | json_values},
    optional={"id": ints | st.text(max_size=8) | st.none() | st.booleans(), "params": json_values},
)
bodies = (
    messages.map(orjson.dumps)
    | st.lists(messages, max_size=3).map(orjson.dumps)
    | json_values.map(orjson.dumps)
    | st.binary(max_size=64)
    | st.just(b'{"jsonrpc": "2.0", "id": 123456789012345678901234567890, "method": "ping"}')
)
header_values = st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40)


@pytest.fixture(scope="module")
def peer_headers(server_url: str) -> dict[str, Any]:
    import anyio

    async def setup() -> dict[str, Any]:
        async with httpx.AsyncClient(timeout=10) as http:
            peer = Peer(http, server_url, await dev_token(http, server_url, f"{server_url}/mcp"))
            await peer.initialize()
            return peer.headers()

    return anyio.run(setup)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=bodies, version=st.sampled_from(["2025-11-25", "2025-03-26", "bogus", ""]), last=header_values)
def test_no_input_gets_a_5xx(server_url: str, peer_headers: dict[str, Any], body: bytes, version: str, last: str):
    headers = {**peer_headers, "mcp-protocol-version": version}
    with httpx.Client(timeout=10) as http:
        posted = http.post(f"{server_url}/mcp", content=body, headers=headers)
        assert posted.status_code < 500, posted.text
        if posted.headers.get("content-type", "").startswith("application/json"):
            orjson.loads(posted.content)
        resumed = http.get(
            f"{server_url}/mcp", headers={**headers, "accept": "text/event-stream", "last-event-id": last}
        )
        assert resumed.status_code < 500, resumed.text
        assert "Traceback" not in posted.text + resumed.text
