"""Issue 31 item 2: the gateway's health follows its upstreams' reachability.

The official SDK's test upstream runs as its own process over Streamable HTTP behind a gateway on loopback, in
both eras. SIGKILLed mid-run: ``mcp_lossless_gateway_upstream_up`` drops to 0 within seconds (its list-change
stream breaks, the re-listing fails), calls to its tools fail at once with the documented unreachable error
(-32045) instead of waiting their deadline, and ``/readyz`` answers 503 naming it; started again on its port,
the gauge is 1 again (the breaker's probe), ``/readyz`` 200 and calls run.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from mcp_lossless.core.errors import UPSTREAM_FAILED
from mcp_lossless.gateway import UpstreamConfig
from tests.support.gateway_deployment import Deployment, sdk_upstream, serve_gateway
from tests.support.mcp_http import Peer, StreamRead, call, dev_token

pytestmark = pytest.mark.anyio

UPSTREAM_TOKEN = "gateway-health-credential"
TOKEN_ENV = "MCP_LOSSLESS_TEST_HEALTH_TOKEN"
UPSTREAMS = ("modern", "legacy")
SEEN_WITHIN = 10.0
"""Down and back must each be seen within this (the breaker's background probe runs at least every 5 s)."""


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with sdk_upstream(tmp_path_factory.mktemp("sdk"), UPSTREAM_TOKEN, TOKEN_ENV) as (sdk, auth):
        upstreams = [
            UpstreamConfig(name="modern", url=sdk.url, auth=auth, sessions=1, timeout=60, era="modern"),
            UpstreamConfig(name="legacy", url=sdk.url, auth=auth, sessions=2, timeout=60, era="legacy"),
        ]
        with serve_gateway(upstreams, sdk) as d:
            yield d


def answer(read: StreamRead, request_id: int) -> dict[str, Any]:
    (found,) = [m for m in read.messages if m.get("id") == request_id]
    return found


async def gauges(http: httpx.AsyncClient, d: Deployment) -> dict[str, float]:
    text = (await http.get(f"{d.url}/metrics")).text
    found = re.findall(r'^mcp_lossless_gateway_upstream_up\{upstream="([^"]+)"\} (\S+)$', text, re.M)
    return {name: float(value) for name, value in found}


async def until_gauges(http: httpx.AsyncClient, d: Deployment, value: float) -> float:
    """Seconds until every upstream's ``upstream_up`` reads ``value``: a poll of what the gateway saw of another
    process, bounded by :data:`SEEN_WITHIN`."""
    started = time.monotonic()
    with anyio.fail_after(SEEN_WITHIN):
        for _ in itertools.count():
            if set((await gauges(http, d)).values()) == {value}:
                break
            await anyio.sleep(0.05)
    return time.monotonic() - started


async def test_an_upstream_killed_mid_run_is_down_at_once_and_back_when_it_is(
    deployment: Deployment, http: httpx.AsyncClient
) -> None:
    d = deployment
    assert await gauges(http, d) == dict.fromkeys(UPSTREAMS, 1.0)
    ready = await http.get(f"{d.url}/readyz")
    assert ready.status_code == 200 and ready.json()["checks"]["upstreams"] == "ok"
    peer = Peer(http, d.url, await dev_token(http, d.url, d.mcp))
    await peer.initialize()

    d.sdk.kill()
    await until_gauges(http, d, 0.0)
    for request_id, upstream in enumerate(UPSTREAMS, start=1):
        started = time.monotonic()
        refused = await peer.post(call(request_id, f"{upstream}_lookup", key="k", steps=0))
        elapsed = time.monotonic() - started
        error = answer(refused, request_id)["error"]
        assert error["code"] == UPSTREAM_FAILED and error["data"]["reason"] == "unreachable", error
        assert error["data"]["mayHaveRun"] is False
        assert elapsed < 2.0, f"{upstream}: answered in {elapsed:.2f} s, not at once (the call's deadline is 60 s)"
    not_ready = await http.get(f"{d.url}/readyz")
    assert not_ready.status_code == 503
    assert not_ready.json()["checks"]["upstreams"] == "modern down; legacy down"

    d.sdk.restart_after_death()
    await until_gauges(http, d, 1.0)
    again = await http.get(f"{d.url}/readyz")
    assert again.status_code == 200 and again.json()["checks"]["upstreams"] == "ok"
    for request_id, upstream in enumerate(UPSTREAMS, start=10):
        worked = await peer.post(call(request_id, f"{upstream}_lookup", key="b", steps=0))
        assert answer(worked, request_id)["result"]["content"][0]["text"] == "value of b"


async def test_a_call_after_the_upstream_is_back_probes_it_instead_of_failing(
    deployment: Deployment, http: httpx.AsyncClient
) -> None:
    """The breaker is half-open: the first call after the upstream is back finds it so (its probe), though the
    background probe has not yet run."""
    d = deployment
    peer = Peer(http, d.url, await dev_token(http, d.url, d.mcp))
    await peer.initialize()
    d.sdk.kill()
    await until_gauges(http, d, 0.0)
    d.sdk.restart_after_death()
    worked = await peer.post(call(1, "modern_lookup", key="c", steps=0))
    assert answer(worked, 1)["result"]["content"][0]["text"] == "value of c"
    assert (await gauges(http, d))["modern"] == 1.0
