"""Issue 14: an upstream tool's request for client input, mid-call, is passed on to the gateway's calling client
in that client's era, and its answer goes back upstream.

The upstreams are the official SDK server (``mcp`` 2.3) over stdio, twice: negotiated (2026-07-28: the tool's
``input_required`` answers, retried with the responses) and pinned to 2025-11-25 (an ``elicitation/create``
request on the pipe mid-call). Their ``confirm`` (not idempotent) and ``spell`` (idempotent) elicit a yes or
no. The clients are ours: the legacy session client (the gateway's request arrives on the call's SSE stream,
the answer is POSTed back) and the 2026-07-28 client (a task waiting ``input_required`` answered with
``tasks/update``, or rounds of the request itself). The same SDK server over Streamable HTTP, legacy leg
(``web``: its request on the gateway's call's own SSE stream, which names the call, answered by that call's
handlers in our session client), and negotiated (``webnew``: 2026-07-28, its ``input_required`` rounds answered
by our modern client from the gateway call's handlers, ADR 0015).
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import orjson
import pytest

from mcp_lossless.client import BearerToken, Client, RemoteError, ToolFailed
from mcp_lossless.client.modern import ModernClient
from mcp_lossless.core.errors import MISSING_REQUIRED_CLIENT_CAPABILITY
from mcp_lossless.core.tasks import EXTENSION
from mcp_lossless.gateway import UpstreamConfig
from tests.support.gateway_deployment import Deployment, sdk_upstream, serve_gateway
from tests.support.mcp_http import dev_token

pytestmark = pytest.mark.anyio

SDK_STDIO = (sys.executable, "-m", "tests.interop.peers.sdk_gateway_upstream", "stdio")
ASKING = frozenset({"confirm", "spell", "work"})
UPSTREAM_TOKEN = "gateway-input-upstream-credential"
TOKEN_ENV = "MCP_LOSSLESS_TEST_INPUT_UPSTREAM_TOKEN"
UPSTREAMS = ["py", "pyold", "web", "webnew"]


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Deployment]:
    with sdk_upstream(tmp_path_factory.mktemp("sdk"), UPSTREAM_TOKEN, TOKEN_ENV) as (sdk, auth):
        upstreams = [
            UpstreamConfig(name="py", command=SDK_STDIO, allow=ASKING, timeout=30),
            UpstreamConfig(name="pyold", command=SDK_STDIO, allow=ASKING, timeout=30, era="legacy"),
            # one session: concurrent calls' requests arrive on it, each on its own call's stream
            UpstreamConfig(name="web", url=sdk.url, auth=auth, allow=ASKING, timeout=30, era="legacy", sessions=1),
            UpstreamConfig(name="webnew", url=sdk.url, auth=auth, allow=ASKING, timeout=30),
        ]
        with serve_gateway(upstreams, sdk) as d:
            eras = {name: upstream.era for name, upstream in d.gateway.upstreams.items()}
            assert eras == {"py": "modern", "pyold": "legacy", "web": "legacy", "webnew": "modern"}
            yield d


class Confirming:
    """An ``elicitation/create`` handler answering ``ok``: what a user would, with what they were asked kept."""

    def __init__(self, ok: bool = True) -> None:
        self.ok = ok
        self.asked: list[str] = []

    async def __call__(self, params: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(str(params.get("message")))
        return {"action": "accept", "content": {"ok": self.ok}}


@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_a_legacy_client_answers_on_its_session_and_the_answer_reaches_the_upstream(
    deployment: Deployment, http: httpx.AsyncClient, upstream: str
) -> None:
    token = await dev_token(http, deployment.url, deployment.mcp)
    confirming = Confirming()
    async with Client(
        deployment.mcp, auth=BearerToken(token), http=http, input_handlers={"elicitation/create": confirming}
    ) as client:
        result = await client.call_tool(f"{upstream}_confirm", {"question": "ship it"})
        assert result.text == "ship it: yes"
        assert confirming.asked == ["confirm: ship it"], "asked once, with the upstream's own question"
        confirming.ok = False
        refused = await client.call_tool(f"{upstream}_spell", {"question": "again"})
        assert refused.text == "again: no", "the answer that reached the upstream is the client's"


@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_a_modern_client_answers_a_task_and_rounds_of_its_request(
    deployment: Deployment, http: httpx.AsyncClient, upstream: str
) -> None:
    token = await dev_token(http, deployment.url, deployment.mcp)
    confirming = Confirming()
    tasks: list[str] = []
    async with ModernClient(
        deployment.mcp,
        auth=BearerToken(token),
        http=http,
        input_handlers={"elicitation/create": confirming},
        on_task=lambda _, name: tasks.append(name),
    ) as client:
        confirmed = await client.call_tool(f"{upstream}_confirm", {"question": "deploy"})
        assert confirmed.text == "deploy: yes"
        assert tasks == [f"{upstream}_confirm"], "not idempotent: a task, whose input_required state was answered"
        spelled = await client.call_tool(f"{upstream}_spell", {"question": "spell"})
        assert spelled.text == "spell: yes"
        assert tasks == [f"{upstream}_confirm"], "idempotent: within its request, by input_required rounds"
        assert confirming.asked == ["confirm: deploy", "confirm: spell"], "each question asked of the client once"


@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_a_client_that_cannot_answer_ends_the_call_with_an_explicit_error(
    deployment: Deployment, http: httpx.AsyncClient, upstream: str
) -> None:
    token = await dev_token(http, deployment.url, deployment.mcp)
    async with Client(deployment.mcp, auth=BearerToken(token), http=http) as client:  # no elicitation handler
        with pytest.raises((ToolFailed, RemoteError)) as failed:
            await client.call_tool(f"{upstream}_confirm", {"question": "unanswerable"})
        assert "unanswerable: " not in str(failed.value), "no answer was made up"
        worked = await client.call_tool(f"{upstream}_work", {"label": "after", "steps": 1, "delay_ms": 1})
        assert worked.text == "work after done", "the upstream goes on"


@pytest.mark.parametrize("upstream", UPSTREAMS)
async def test_a_modern_client_without_tasks_is_told_a_tool_that_may_not_run_twice_needs_them(
    deployment: Deployment, http: httpx.AsyncClient, upstream: str
) -> None:
    """Rounds would run the upstream call again (the gateway keeps nothing between them): for a tool that may not
    run twice, the gateway asks for the tasks extension instead (a legacy child's call waiting for the answer is
    cancelled), and the upstream goes on serving."""
    token = await dev_token(http, deployment.url, deployment.mcp)
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {}},
        "io.modelcontextprotocol/clientInfo": {"name": "no-tasks", "version": "1"},
    }
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": f"{upstream}_confirm", "arguments": {"question": "once"}, "_meta": meta},
    }
    headers = {
        "authorization": f"Bearer {token}",
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": f"{upstream}_confirm",
    }
    response = await http.post(deployment.mcp, content=orjson.dumps(body), headers=headers)
    answer = orjson.loads(response.content) if response.headers["content-type"].startswith("application/json") else {}
    error = answer.get("error")
    assert error is not None and error["code"] == MISSING_REQUIRED_CLIENT_CAPABILITY, response.text
    assert error["data"] == {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}
    async with Client(deployment.mcp, auth=BearerToken(token), http=http) as client:
        worked = await client.call_tool(f"{upstream}_work", {"label": "next", "steps": 1, "delay_ms": 1})
        assert worked.text == "work next done"


async def test_a_legacy_childs_request_is_passed_on_only_while_one_call_runs_on_it(
    deployment: Deployment, http: httpx.AsyncClient
) -> None:
    """The pipe names no call: with two running, whose client to ask is unknown, and nobody is asked (asking the
    wrong one would hand one caller another's question); the child gets an error and its tool says so."""
    token = await dev_token(http, deployment.url, deployment.mcp)
    confirming = Confirming()
    running = anyio.Event()
    async with (
        Client(
            deployment.mcp, auth=BearerToken(token), http=http, input_handlers={"elicitation/create": confirming}
        ) as client,
        anyio.create_task_group() as tg,
    ):

        async def long_work() -> None:
            await client.call_tool(
                "pyold_work", {"label": "long", "steps": 600, "delay_ms": 50}, on_progress=lambda _: running.set()
            )

        tg.start_soon(long_work)
        with anyio.fail_after(30):
            await running.wait()
        with pytest.raises(RemoteError) as failed:
            await client.call_tool("pyold_confirm", {"question": "whose"})
        # the SDK's tool passes the gateway's answer to its elicitation on as its call's error
        assert "cannot tell whose client to ask for elicitation/create: 2 calls are running" in failed.value.message
        assert confirming.asked == [], "no client was asked"
        tg.cancel_scope.cancel()
    # the long call's cancel reaches the gateway and the child after the client let go of it: the alone call
    # waits until the gateway has counted it (a metric of another process: no event this test could await)
    cancelled = 'mcp_lossless_gateway_calls_total{outcome="cancelled",upstream="pyold"} 1.0'
    with anyio.fail_after(10):
        for _ in itertools.count():
            if cancelled in (await http.get(f"{deployment.url}/metrics")).text:
                break
            await anyio.sleep(0.05)
    async with Client(
        deployment.mcp, auth=BearerToken(token), http=http, input_handlers={"elicitation/create": confirming}
    ) as client:
        alone = await client.call_tool("pyold_confirm", {"question": "alone"})
    assert alone.text == "alone: yes" and confirming.asked == ["confirm: alone"], "one call running: it is asked"


async def test_an_http_upstreams_requests_during_concurrent_calls_each_reach_their_own_caller(
    deployment: Deployment, http: httpx.AsyncClient
) -> None:
    """Unlike a pipe, a legacy HTTP session names the call a request belongs to (the call's stream): two callers'
    calls at once on the upstream's one session are each asked their own question, and get their own answer."""
    token = await dev_token(http, deployment.url, deployment.mcp)
    yes, no = Confirming(ok=True), Confirming(ok=False)
    results: dict[str, str] = {}

    async def call(question: str, confirming: Confirming) -> None:
        handlers = {"elicitation/create": confirming}
        async with Client(deployment.mcp, auth=BearerToken(token), http=http, input_handlers=handlers) as client:
            results[question] = (await client.call_tool("web_confirm", {"question": question})).text

    async with anyio.create_task_group() as tg:
        tg.start_soon(call, "first", yes)
        tg.start_soon(call, "second", no)
    assert results == {"first": "first: yes", "second": "second: no"}
    assert yes.asked == ["confirm: first"] and no.asked == ["confirm: second"], "nobody saw the other's question"
