"""The client the official conformance suite drives: ``conformance client --command "python -m THIS"``.

The suite starts a mock server (and, for ``auth/*``, a mock authorization server) per scenario, then runs
``CMD <server-url>`` with ``MCP_CONFORMANCE_SCENARIO`` naming the scenario,
``MCP_CONFORMANCE_PROTOCOL_VERSION`` the revision its mock server speaks and, where it hands out credentials
or tool calls, ``MCP_CONFORMANCE_CONTEXT`` holding them as JSON. At 2025-11-25 each scenario is played with
the project's legacy :class:`~mcp_lossless.client.Client`; at 2026-07-28 with the client
:func:`~mcp_lossless.client.modern.open_client` picks, which must be the
:class:`~mcp_lossless.client.modern.ModernClient` (a fallback to the legacy handshake fails the scenario).
Everything the suite checks (discovery, registration, scopes, PKCE, ``resource``, ``iss``, ``_meta``, the
mirrored headers, ``requestState``) is the client's own behaviour; the driver only picks credentials,
arguments, and answers input as a user would (:data:`HANDLERS`).

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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import anyio
import httpx

from mcp_lossless.client import (
    AuthorizationCodeGrant,
    Client,
    IdJagFromIdp,
    InputHandler,
    JwtBearerGrant,
    McpClientError,
    OAuth,
    PrivateKeyJwt,
    ProtocolViolation,
)
from mcp_lossless.client.modern import MODERN, ModernClient, open_client
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
LEGACY_WIRE = "2025-11-25"

Scenario = Callable[[str, Mapping[str, Any]], Awaitable[str]]
AnyClient = Client | ModernClient


async def _elicit(params: dict[str, Any]) -> Mapping[str, Any]:
    """The user accepts: every boolean the form asks for is ``true``."""
    schema = params.get("requestedSchema") or {}
    fields = schema.get("properties") or {}
    return {"action": "accept", "content": {k: True for k, v in fields.items() if v.get("type") == "boolean"}}


async def _sample(params: dict[str, Any]) -> Mapping[str, Any]:
    return {"role": "assistant", "content": {"type": "text", "text": "ok"}, "model": "conformance-driver"}


async def _roots(params: dict[str, Any]) -> Mapping[str, Any]:
    return {"roots": []}


HANDLERS = {"elicitation/create": _elicit, "sampling/createMessage": _sample, "roots/list": _roots}
"""What the 2026-07-28 client answers a server's requests for input with (and so declares it can answer)."""


def _wire() -> str:
    return os.environ.get("MCP_CONFORMANCE_PROTOCOL_VERSION") or LEGACY_WIRE


@asynccontextmanager
async def connect(
    url: str, auth: Auth | None = None, handlers: Mapping[str, InputHandler] = HANDLERS
) -> AsyncIterator[AnyClient]:
    """The client for the scenario's wire: the legacy one at 2025-11-25, else the one ``open_client`` picks,
    which must be the 2026-07-28 client (answering input from ``handlers``)."""
    if _wire() != MODERN:
        async with Client(url, auth=auth, timeout=TIMEOUT) as legacy:
            yield legacy
        return
    async with open_client(url, auth=auth, timeout=TIMEOUT, input_handlers=handlers) as client:
        if not isinstance(client, ModernClient):
            raise ProtocolViolation(f"open_client took {url} for a {LEGACY_WIRE} server")
        yield client


async def initialize(url: str, context: Mapping[str, Any]) -> str:
    async with Client(url, timeout=TIMEOUT) as client:
        return f"initialized: protocol {client.server.protocol_version}"


async def tools_call(url: str, context: Mapping[str, Any]) -> str:
    async with connect(url) as client:
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
    async with connect(url) as client:
        tools = {tool.name: tool for tool in await client.list_tools()}
        schema = dict(tools["json_schema_2020_12_tool"].input_schema)
        return (await client.call_tool("json_schema_echo", {"schema": schema})).text


async def request_metadata(url: str, context: Mapping[str, Any]) -> str:
    """Every request carries ``_meta`` and the version header; the server refuses the first as an unsupported
    version while listing 2026-07-28, and the client must send it again."""
    async with connect(url) as client:
        return f"{len(await client.list_tools())} tools"


async def request_state(url: str, context: Mapping[str, Any]) -> str:
    """Multi round-trip calls: ``requestState`` echoed as given (and none sent when none was given), a new id
    per round; a call made while another waits for its answer (from the elicitation handler) carries nothing
    of it."""
    opened: list[AnyClient] = []
    unrelated: list[str] = []

    async def elicit_after_another_call(params: dict[str, Any]) -> Mapping[str, Any]:
        unrelated.append((await opened[0].call_tool("test_mrtr_unrelated")).text)
        return await _elicit(params)

    async with connect(url, handlers={**HANDLERS, "elicitation/create": elicit_after_another_call}) as client:
        opened.append(client)
        names = ("test_mrtr_echo_state", "test_mrtr_no_state", "test_mrtr_no_result_type")
        texts = [(await client.call_tool(name)).text for name in names]
    return ", ".join([*texts, *unrelated])


async def standard_headers(url: str, context: Mapping[str, Any]) -> str:
    """``Mcp-Method`` on every request, ``Mcp-Name`` on every call, read and prompt (the name of a call, the URI
    of a read: percent-encoded, with a query string; a hyphenated tool name)."""
    async with connect(url) as client:
        texts = [(await client.call_tool(tool.name)).text for tool in await client.list_tools()]
        reads = [len(await client.read_resource(resource.uri)) for resource in await client.list_resources()]
        prompts = [len((await client.get_prompt(p.name)).messages) for p in await client.list_prompts()]
        return f"{', '.join(texts)}; {len(reads)} resources read, {len(prompts)} prompts got"


async def custom_headers(url: str, context: Mapping[str, Any]) -> str:
    """The calls the suite hands out, whose ``x-mcp-header`` arguments the client mirrors into headers."""
    async with connect(url) as client:
        calls = context.get("toolCalls") or []
        return ", ".join([(await client.call_tool(c["name"], c.get("arguments") or {})).text for c in calls])


def _placeholders(schema: Mapping[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties") or {}
    return {k: "conformance" for k in schema.get("required") or [] if properties.get(k, {}).get("type") == "string"}


async def invalid_tool_headers(url: str, context: Mapping[str, Any]) -> str:
    """Call every tool the client kept: the ones published with a malformed ``x-mcp-header`` must be gone."""
    async with connect(url) as client:
        tools = await client.list_tools()
        for tool in tools:
            await client.call_tool(tool.name, _placeholders(tool.input_schema))
    return "called " + ", ".join(tool.name for tool in tools)


async def ref_no_deref(url: str, context: Mapping[str, Any]) -> str:
    """List a tool whose schema ``$ref``s a network URI: the client must not fetch it."""
    async with connect(url) as client:
        return ", ".join(tool.name for tool in await client.list_tools())


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
    if scenario == "auth/client-credentials-jwt":  # private_key_jwt with the key the suite generated
        key = PrivateKeyJwt(str(context["private_key_pem"]), str(context.get("signing_algorithm", "ES256")))
        return OAuth(str(client_id), client_key=key)
    if scenario == "auth/wif-jwt-bearer":  # the workload's JWT (as a platform would mount it) is the grant
        return OAuth(str(client_id), grant=JwtBearerGrant(str(context["valid_jwt"])))
    if scenario == "auth/enterprise-managed-authorization":  # the user's IdP ID token, exchanged for an ID-JAG
        idp = IdJagFromIdp(
            str(context["idp_token_endpoint"]), str(context["idp_id_token"]), str(context["idp_client_id"])
        )
        return OAuth(str(client_id), str(secret), grant=JwtBearerGrant(idp))
    grant = AuthorizationCodeGrant(REDIRECT_URI, _headless(http))
    if isinstance(client_id, str):
        return OAuth(client_id, secret if isinstance(secret, str) else None, grant=grant)
    registration = ClientRegistration("mcp-lossless conformance client", metadata_url=CLIENT_METADATA_URL)
    return OAuth(None, grant=grant, registration=registration)


def authorized(scenario: str) -> Scenario:
    async def play(url: str, context: Mapping[str, Any]) -> str:
        async with (
            httpx.AsyncClient(timeout=10, follow_redirects=False) as http,
            connect(url, auth=_oauth(scenario, context, http)) as client,
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
    "auth/client-credentials-jwt",
    "auth/wif-jwt-bearer",
    "auth/enterprise-managed-authorization",
    "auth/dpop",
    "auth/dpop-nonce",
)
SCENARIOS: dict[str, Scenario] = {
    "initialize": initialize,
    "tools_call": tools_call,
    "sse-retry": sse_retry,
    "json-schema-2020-12-preservation": json_schema_preservation,
    "request-metadata": request_metadata,
    "sep-2322-client-request-state": request_state,
    "http-standard-headers": standard_headers,
    "http-custom-headers": custom_headers,
    "http-invalid-tool-headers": invalid_tool_headers,
    "json-schema-ref-no-deref": ref_no_deref,
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
