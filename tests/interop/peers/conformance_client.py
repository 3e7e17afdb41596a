"""The client the official conformance suite drives: ``conformance client --command "python -m THIS"``.

The suite starts a mock server (and, for ``auth/*``, a mock authorization server) per scenario, then runs
``CMD <server-url>`` with ``MCP_CONFORMANCE_SCENARIO`` naming the scenario and, where it hands out
credentials, ``MCP_CONFORMANCE_CONTEXT`` holding them as JSON. Each scenario is played with the
project's own :class:`~mcp_lossless.client.Client`; everything the suite checks (discovery, registration,
scopes, PKCE, ``resource``, ``iss``) is the client's own behaviour, the driver only picks credentials.

The authorization page is visited headlessly: the mock authorization server redirects at once, so the
driver GETs the authorization URL without following the redirect and hands the ``Location`` (with
``code``, ``state`` and ``iss``) back to the client, which validates it.

Exit status: 0 when the scenario's work succeeded; 1 with ``kind: reason`` on stderr when the client
ended it with an error (the negative ``auth/*`` scenarios expect exactly that); 2 for a scenario this
driver does not play.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import anyio
import httpx

from mcp_lossless.client import AuthorizationCodeGrant, Client, McpClientError, OAuth
from mcp_lossless.client.oauth import Auth
from mcp_lossless.client.registration import ClientRegistration

REDIRECT_URI = "http://localhost:3000/callback"
"""Never listened on: the redirect to it is read from the authorization server's ``Location`` header."""
CLIENT_METADATA_URL = "https://conformance-test.local/client-metadata.json"
"""The client ID metadata document URL ``auth/basic-cimd`` expects."""
TIMEOUT = 20.0
"""Below the suite's 30 s per scenario, so a stuck call ends here with a reason, not as a suite timeout."""
EXIT_FAILED = 1
EXIT_UNSUPPORTED = 2

Scenario = Callable[[str, Mapping[str, Any]], Awaitable[str]]


async def initialize(url: str, context: Mapping[str, Any]) -> str:
    async with Client(url, timeout=TIMEOUT) as client:
        return f"initialized: protocol {client.server.protocol_version}"


async def tools_call(url: str, context: Mapping[str, Any]) -> str:
    async with Client(url, timeout=TIMEOUT) as client:
        result = await client.call_tool("add_numbers", {"a": 5, "b": 3})
    if "8" not in result.text:
        raise McpClientError(f"add_numbers(5, 3) answered {result.text!r}")
    return result.text


async def sse_retry(url: str, context: Mapping[str, Any]) -> str:
    """The server closes the call's stream after a priming event; the client must resume it by GET."""
    async with Client(url, timeout=TIMEOUT) as client:
        return (await client.call_tool("test_reconnection")).text


async def json_schema_preservation(url: str, context: Mapping[str, Any]) -> str:
    """Echo the published ``inputSchema`` back verbatim: the client must not rewrite schemas it lists."""
    async with Client(url, timeout=TIMEOUT) as client:
        tools = {tool.name: tool for tool in await client.list_tools()}
        schema = dict(tools["json_schema_2020_12_tool"].input_schema)
        return (await client.call_tool("json_schema_echo", {"schema": schema})).text


def _headless(http: httpx.AsyncClient) -> Callable[[str], Awaitable[str]]:
    async def visit(authorization_url: str) -> str:
        response = await http.get(authorization_url)
        location = response.headers.get("location")
        if not response.is_redirect or location is None:
            raise McpClientError(f"the authorization endpoint answered {response.status_code} without a redirect")
        return str(httpx.URL(authorization_url).join(location))

    return visit


def _oauth(scenario: str, context: Mapping[str, Any], http: httpx.AsyncClient) -> Auth:
    """Credentials from the suite where it hands them out, else the client registers itself."""
    client_id = context.get("client_id")
    secret = context.get("client_secret")
    if scenario == "auth/client-credentials-basic":
        return OAuth(str(client_id), str(secret))
    grant = AuthorizationCodeGrant(REDIRECT_URI, _headless(http))
    if isinstance(client_id, str):
        return OAuth(client_id, secret if isinstance(secret, str) else None, grant=grant)
    registration = ClientRegistration("mcp-lossless conformance client", metadata_url=CLIENT_METADATA_URL)
    return OAuth(None, grant=grant, registration=registration)


def authorized(scenario: str) -> Scenario:
    async def play(url: str, context: Mapping[str, Any]) -> str:
        async with (
            httpx.AsyncClient(timeout=10, follow_redirects=False) as http,
            Client(url, auth=_oauth(scenario, context, http), timeout=TIMEOUT) as client,
        ):
            return (await client.call_tool("test-tool")).text

    return play


AUTH_SCENARIOS = (
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/metadata-var2",
    "auth/metadata-var3",
    "auth/basic-cimd",
    "auth/pre-registration",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none",
    "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined",
    "auth/scope-step-up",
    "auth/scope-retry-limit",
    "auth/2025-03-26-oauth-metadata-backcompat",
    "auth/2025-03-26-oauth-endpoint-fallback",
    "auth/resource-mismatch",
    "auth/offline-access-scope",
    "auth/offline-access-not-supported",
    "auth/authorization-server-migration",
    "auth/iss-supported",
    "auth/iss-not-advertised",
    "auth/iss-supported-missing",
    "auth/iss-wrong-issuer",
    "auth/iss-unexpected",
    "auth/iss-normalized",
    "auth/metadata-issuer-mismatch",
    "auth/client-credentials-basic",
)
SCENARIOS: dict[str, Scenario] = {
    "initialize": initialize,
    "tools_call": tools_call,
    "sse-retry": sse_retry,
    "json-schema-2020-12-preservation": json_schema_preservation,
    **{name: authorized(name) for name in AUTH_SCENARIOS},
}


def main(argv: list[str]) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    scenario = os.environ.get("MCP_CONFORMANCE_SCENARIO", "")
    play = SCENARIOS.get(scenario)
    if len(argv) < 2 or play is None:
        print(f"usage: MCP_CONFORMANCE_SCENARIO=<one of {sorted(SCENARIOS)}> {argv[0]} <server-url>", file=sys.stderr)
        return EXIT_UNSUPPORTED
    context = json.loads(os.environ.get("MCP_CONFORMANCE_CONTEXT") or "{}")
    try:
        outcome = anyio.run(play, argv[-1], context)
    except McpClientError as exc:
        print(f"{scenario}: {exc.kind}: {exc.reason}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{scenario}: ok: {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
