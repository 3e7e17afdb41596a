"""Issue 31 item 1: a gateway upstream's configuration checked against what the upstream really lists.

The official SDK's test upstream (tools work, lookup, polled, hang, grow, confirm, spell; prompts review and internal)
runs as its own process over Streamable HTTP; two gateways on loopback put it behind several configurations, each
with one mistyped name: the strict one (the default) withholds each such upstream and logs an error naming the key,
the name and the closest real one; the lenient one exposes them with a warning and keeps every deny and scope in
force on the tool it was meant for, or on all of the upstream.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest

from mcp_lossless.client import BearerToken
from mcp_lossless.client.modern import ModernClient
from mcp_lossless.core.protocol import SCOPES_META_KEY
from mcp_lossless.gateway import CatalogRule, UpstreamConfig
from tests.support.gateway_deployment import Deployment, sdk_upstream, serve_gateway
from tests.support.mcp_http import Peer, call, dev_token

pytestmark = pytest.mark.anyio

UPSTREAM_TOKEN = "gateway-config-check-credential"
TOKEN_ENV = "MCP_LOSSLESS_TEST_CONFIG_CHECK_TOKEN"


class Collected(logging.Handler):
    """The gateway's warnings and errors, as an operator reads them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[tuple[int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.getMessage()))

    def of(self, upstream: str) -> list[tuple[int, str]]:
        return [(level, line) for level, line in self.lines if line.startswith(f"upstream {upstream} ")]


@pytest.fixture(scope="module")
def logged() -> Iterator[Collected]:
    handler = Collected()
    logger = logging.getLogger("mcp_lossless.gateway")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def config(name: str, url: str, auth: Any, **rules: Any) -> UpstreamConfig:
    return UpstreamConfig(name=name, url=url, auth=auth, sessions=1, timeout=20, **rules)


@pytest.fixture(scope="module")
def gateways(tmp_path_factory: pytest.TempPathFactory, logged: Collected) -> Iterator[tuple[Deployment, Deployment]]:
    with sdk_upstream(tmp_path_factory.mktemp("sdk"), UPSTREAM_TOKEN, TOKEN_ENV) as (sdk, auth):
        strict = [
            config("ok", sdk.url, auth, allow=frozenset({"work", "lookup"}), scopes={"work": ("bank:write",)}),
            config("allowtypo", sdk.url, auth, allow=frozenset({"wrok", "lookup"})),
            config("denytypo", sdk.url, auth, deny=frozenset({"hnag"})),
            config("scopetypo", sdk.url, auth, scopes={"wrk": ("bank:write",)}),
            config("idemtypo", sdk.url, auth, idempotent=frozenset({"wokr"})),
            config("prompttypo", sdk.url, auth, prompts=CatalogRule(deny=frozenset({"internl"}))),
            config("later", sdk.url, auth, allow=frozenset({"work", "leaf"})),
            config("grower", sdk.url, auth, allow=frozenset({"grow"})),
        ]
        lenient = [
            config("ldeny", sdk.url, auth, deny=frozenset({"hnag"})),
            config("lscope", sdk.url, auth, scopes={"wrk": ("bank:write",)}),
            config("lfardeny", sdk.url, auth, deny=frozenset({"qqqzzz"})),
            config("lfarscope", sdk.url, auth, scopes={"qqqzzz": ("far:away",)}),
            config("lallow", sdk.url, auth, allow=frozenset({"wrok", "lookup"})),
            config("lprompt", sdk.url, auth, prompts=CatalogRule(deny=frozenset({"internl"}))),
        ]
        with serve_gateway(strict, sdk) as s, serve_gateway(lenient, sdk, lenient_config=True) as lax:
            yield s, lax


async def listed(http: httpx.AsyncClient, d: Deployment, method: str = "tools/list") -> dict[str, dict[str, Any]]:
    peer = Peer(http, d.url, await dev_token(http, d.url, d.mcp))
    await peer.initialize()
    read = await peer.post({"jsonrpc": "2.0", "id": 1, "method": method})
    key = method.split("/", maxsplit=1)[0]
    return {entry["name"]: entry for entry in read.messages[0]["result"][key]}


def names_of(tools: dict[str, dict[str, Any]], upstream: str) -> set[str]:
    return {name.removeprefix(f"{upstream}_") for name in tools if name.startswith(f"{upstream}_")}


@pytest.mark.parametrize(
    ("upstream", "named"),
    [
        ("allowtypo", "allow names 'wrok', which the upstream does not offer (closest: 'work')"),
        ("denytypo", "deny names 'hnag', which the upstream does not offer (closest: 'hang')"),
        ("scopetypo", "scopes names 'wrk', which the upstream does not offer (closest: 'work')"),
        ("idemtypo", "idempotent names 'wokr', which the upstream does not offer (closest: 'work')"),
        ("prompttypo", "prompts.deny names 'internl', which the upstream does not offer (closest: 'internal')"),
    ],
)
async def test_a_typo_withholds_the_upstream_with_an_error_naming_it(
    gateways: tuple[Deployment, Deployment], logged: Collected, http: httpx.AsyncClient, upstream: str, named: str
) -> None:
    strict, _ = gateways
    tools = await listed(http, strict)
    assert names_of(tools, "ok") == {"work", "lookup"}, "an upstream whose configuration checks out is exposed"
    assert tools["ok_work"]["_meta"][SCOPES_META_KEY] == ["bank:write"]
    assert names_of(tools, upstream) == set(), f"{upstream} is withheld"
    if upstream == "prompttypo":
        prompts = await listed(http, strict, "prompts/list")
        assert "ok_internal" in prompts and not names_of(prompts, upstream), "its prompts too"
    errors = [line for level, line in logged.of(upstream) if level == logging.ERROR]
    assert errors == [
        f"upstream {upstream} is not exposed: {named}; fix the configuration (or run with --lenient-config)"
    ]

    peer = Peer(http, strict.url, await dev_token(http, strict.url, strict.mcp))
    await peer.initialize()
    refused = await peer.post(call(2, f"{upstream}_work", label="x", steps=0))
    assert "unknown tool" in refused.messages[0]["error"]["message"], "a withheld tool cannot be called either"


async def test_a_relisting_that_brings_the_named_tool_exposes_the_upstream(
    gateways: tuple[Deployment, Deployment], logged: Collected, http: httpx.AsyncClient
) -> None:
    strict, _ = gateways
    assert names_of(await listed(http, strict), "later") == set()
    assert ("allow names 'leaf', which the upstream does not offer (nothing offered is close)") in logged.of("later")[
        0
    ][1]
    token = await dev_token(http, strict.url, strict.mcp)
    peer = Peer(http, strict.url, token)
    await peer.initialize()
    told, heard = anyio.create_memory_object_stream[None](100)
    listening = anyio.Event()
    async with ModernClient(strict.mcp, auth=BearerToken(token), http=http) as client, anyio.create_task_group() as tg:
        tg.start_soon(client.listen, {"toolsListChanged": True}, lambda _: told.send_nowait(None), listening.set)
        with anyio.fail_after(15):
            await listening.wait()
            grown = await peer.post(call(1, "grower_grow", name="leaf"))
            assert grown.messages[0]["result"]["content"][0]["text"] == "added leaf"
            # Each list_changed the gateway announces (its upstreams re-list one by one): list until later is in.
            async for _ in heard:
                if names_of(await listed(http, strict), "later") == {"work", "leaf"}:
                    break
        tg.cancel_scope.cancel()


async def test_lenient_exposes_with_a_warning_and_keeps_every_deny_and_scope(
    gateways: tuple[Deployment, Deployment], logged: Collected, http: httpx.AsyncClient
) -> None:
    _, lax = gateways
    tools = await listed(http, lax)
    assert "hang" not in names_of(tools, "ldeny") and {"work", "lookup", "polled"} <= names_of(tools, "ldeny")
    assert tools["lscope_work"]["_meta"][SCOPES_META_KEY] == ["bank:write"], "the scope meant for work stays on it"
    assert SCOPES_META_KEY not in tools["lscope_lookup"]["_meta"]
    assert names_of(tools, "lfardeny") == set(), "a deny close to nothing withholds everything of the upstream"
    assert {tools[f"lfarscope_{t}"]["_meta"][SCOPES_META_KEY][0] for t in names_of(tools, "lfarscope")} == {
        "far:away"
    }, "a scope close to nothing is required for every tool of the upstream"
    assert names_of(tools, "lallow") == {"lookup"}, "an allow typo only narrows"
    prompts = await listed(http, lax, "prompts/list")
    assert "lprompt_review" in prompts and "lprompt_internal" not in prompts

    for upstream, named in [
        ("ldeny", "deny names 'hnag'"),
        ("lscope", "scopes names 'wrk'"),
        ("lfardeny", "deny names 'qqqzzz'"),
        ("lallow", "allow names 'wrok'"),
        ("lprompt", "prompts.deny names 'internl'"),
    ]:
        (level, line), *_ = logged.of(upstream)
        assert level == logging.WARNING and named in line and "--lenient-config" in line, line

    peer = Peer(http, lax.url, await dev_token(http, lax.url, lax.mcp))
    await peer.initialize()
    refused = await peer.post(call(2, "lscope_work", label="x", steps=0))
    assert refused.status == 403 and refused.json()["error"]["data"]["requiredScopes"] == ["bank:write"]
    held = await peer.post(call(3, "ldeny_hang"))
    assert "unknown tool" in held.messages[0]["error"]["message"]
