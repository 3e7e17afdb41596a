"""The development authorization server over real HTTP (uvicorn on loopback), its tokens verified by
JwtVerifier with the JWKS fetched by RemoteJwks."""

from __future__ import annotations

import hashlib
import re
import secrets
from base64 import urlsafe_b64encode
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx
import pytest
from joserfc import jwt
from joserfc.jwk import RSAKey

from mcp_lossless.core.principal import Principal
from mcp_lossless.devauth.server import DevAuthServer
from mcp_lossless.server.auth import DiscoveryError, InvalidToken, JwtVerifier, RemoteJwks, discover_jwks_uri
from tests.support.uvicorn_server import base_url, loopback_socket, serve_app

AGGREGATE = "https://mcp.example/mcp"
SEARCH = "https://mcp.example/mcp/tools/search"
FETCH = "https://mcp.example/mcp/tools/fetch"
TOOLS = (SEARCH, FETCH)
CONFIDENTIAL = ("cc", "s3cret")
PUBLIC = "dev-public"
REDIRECT = "http://127.0.0.1:9/callback"


@contextmanager
def running_devauth(**options: Any) -> Iterator[DevAuthServer]:
    """Auto-approving unless told otherwise: most tests here are about tokens, not the consent step."""
    sock = loopback_socket()
    server = DevAuthServer(
        f"{base_url(sock)}/dev-as",
        resources=lambda: TOOLS,
        aggregate=AGGREGATE,
        clients=dict([CONFIDENTIAL]),
        **{"auto_approve": True, **options},
    )
    with serve_app(server, sock=sock):
        yield server


@pytest.fixture(scope="module")
def devauth() -> Iterator[DevAuthServer]:
    with running_devauth() as server:
        yield server


@pytest.fixture
def make_devauth() -> Iterator[Callable[..., DevAuthServer]]:
    with ExitStack() as stack:
        yield lambda **options: stack.enter_context(running_devauth(**options))


# -- helpers: the OAuth client side, written out with plain httpx -----------------------------------


def claims_of(server: DevAuthServer, token: str) -> dict[str, Any]:
    """Signature checked with the server's public keys, then header and claims as a dict."""
    decoded = jwt.decode(token, server.keys, algorithms=["RS256", "ES256"])
    return {"header": decoded.header, **decoded.claims}


async def token_request(
    http: httpx.AsyncClient,
    server: DevAuthServer,
    form: dict[str, Any],
    auth: tuple[str, str] | None = None,
) -> httpx.Response:
    if auth is None:
        return await http.post(f"{server.issuer}/token", data=form)
    return await http.post(f"{server.issuer}/token", data=form, auth=auth)


async def client_credentials(
    http: httpx.AsyncClient, server: DevAuthServer, resources: list[str], **form: Any
) -> httpx.Response:
    body = {"grant_type": "client_credentials", "resource": resources, **form}
    return await token_request(http, server, body, auth=CONFIDENTIAL)


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    challenge = urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


async def authorize(
    http: httpx.AsyncClient, server: DevAuthServer, resources: list[str], **params: Any
) -> httpx.Response:
    query: dict[str, Any] = {
        "response_type": "code",
        "client_id": PUBLIC,
        "redirect_uri": REDIRECT,
        "state": "st-1",
        "code_challenge_method": "S256",
        "resource": resources,
        **params,
    }
    return await http.get(f"{server.issuer}/authorize", params={k: v for k, v in query.items() if v is not None})


def redirect_params(response: httpx.Response) -> dict[str, str]:
    assert response.status_code == 302, response.text
    location = urlsplit(response.headers["location"])
    assert f"{location.scheme}://{location.netloc}{location.path}" == REDIRECT
    return {k: v[0] for k, v in parse_qs(location.query).items()}


async def code_for(
    http: httpx.AsyncClient, server: DevAuthServer, resources: list[str], client_id: str = PUBLIC, **params: Any
) -> tuple[str, str]:
    verifier, challenge = pkce()
    got = redirect_params(
        await authorize(http, server, resources, client_id=client_id, code_challenge=challenge, **params)
    )
    assert got["state"] == "st-1"
    assert got["iss"] == server.issuer
    return got["code"], verifier


async def exchange(
    http: httpx.AsyncClient,
    server: DevAuthServer,
    code: str,
    verifier: str,
    resources: list[str] = [],  # noqa: B006 - never mutated
    client_id: str = PUBLIC,
) -> httpx.Response:
    form = {
        "grant_type": "authorization_code",
        "code": code,
        "redirect_uri": REDIRECT,
        "code_verifier": verifier,
        "resource": resources,
    }
    if client_id != CONFIDENTIAL[0]:  # public: identified, not authenticated
        return await token_request(http, server, {**form, "client_id": client_id})
    return await token_request(http, server, form, auth=CONFIDENTIAL)


async def refresh(
    http: httpx.AsyncClient,
    server: DevAuthServer,
    refresh_token: str,
    resources: list[str] = [],  # noqa: B006 - never mutated
    client_id: str = PUBLIC,
) -> httpx.Response:
    form = {"grant_type": "refresh_token", "refresh_token": refresh_token, "resource": resources}
    if client_id == PUBLIC:
        return await token_request(http, server, {**form, "client_id": PUBLIC})
    return await token_request(http, server, form, auth=CONFIDENTIAL)


async def tokens_for(
    http: httpx.AsyncClient, server: DevAuthServer, authorized: list[str], client_id: str = PUBLIC
) -> dict[str, Any]:
    code, verifier = await code_for(http, server, authorized, client_id=client_id)
    response = await exchange(http, server, code, verifier, client_id=client_id)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def oauth_error(response: httpx.Response, status: int, error: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["error"] == error
    description: str = body["error_description"]
    return description


def aud(server: DevAuthServer, response: httpx.Response) -> Any:
    assert response.status_code == 200, response.text
    return claims_of(server, response.json()["access_token"])["aud"]


# -- metadata and discovery ------------------------------------------------------------------------


@pytest.mark.anyio
async def test_metadata_at_every_well_known_uri_and_discovery(devauth: DevAuthServer, http: httpx.AsyncClient) -> None:
    origin = devauth.issuer.removesuffix(devauth.path_prefix)
    assert devauth.path_prefix == "/dev-as"
    for path in (
        "/dev-as",  # the issuer URL serve prints
        "/.well-known/oauth-authorization-server/dev-as",
        "/.well-known/openid-configuration/dev-as",
        "/dev-as/.well-known/openid-configuration",
    ):
        metadata = (await http.get(origin + path)).json()
        assert metadata["issuer"] == devauth.issuer
        assert metadata["token_endpoint"] == f"{devauth.issuer}/token"
        assert metadata["authorization_endpoint"] == f"{devauth.issuer}/authorize"
        assert metadata["code_challenge_methods_supported"] == ["S256"]
        assert metadata["response_types_supported"] == ["code"]
        assert metadata["authorization_response_iss_parameter_supported"] is True
        assert set(metadata["token_endpoint_auth_methods_supported"]) == {
            "client_secret_basic",
            "client_secret_post",
            "none",
        }
        assert set(metadata["grant_types_supported"]) == {"authorization_code", "client_credentials", "refresh_token"}
    assert await discover_jwks_uri(devauth.issuer, http) == f"{devauth.issuer}/jwks"
    with pytest.raises(DiscoveryError, match="names issuer"):
        await discover_jwks_uri(devauth.issuer.replace("127.0.0.1", "localhost"), http)
    with pytest.raises(DiscoveryError, match="no authorization server metadata"):
        await discover_jwks_uri(devauth.issuer + "-other", http)
    assert devauth.handles("/dev-as/token")
    assert devauth.handles("/.well-known/oauth-authorization-server/dev-as")
    assert not devauth.handles("/mcp")
    jwks = (await http.get(f"{devauth.issuer}/jwks")).json()
    assert {key["kty"] for key in jwks["keys"]} == {"RSA", "EC"}
    assert all("d" not in key for key in jwks["keys"])  # public parts only
    assert (await http.get(f"{origin}/elsewhere")).status_code == 404
    assert (await http.post(f"{devauth.issuer}/jwks")).status_code == 405


# -- client_credentials ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_client_credentials_with_several_resources_gives_one_multi_audience_token(
    devauth: DevAuthServer, http: httpx.AsyncClient
) -> None:
    response = await client_credentials(http, devauth, ["HTTPS://MCP.example/mcp/tools/search/", FETCH])
    assert response.headers["cache-control"] == "no-store"
    body = response.json()
    assert body["token_type"] == "Bearer"
    assert body["expires_in"] == 600
    assert "refresh_token" not in body
    claims = claims_of(devauth, body["access_token"])
    assert claims["header"]["typ"] == "at+jwt"
    assert claims["header"]["alg"] == "RS256"
    assert claims["header"]["kid"] == devauth.current_kid()
    assert claims["aud"] == [SEARCH, FETCH]
    assert claims["sub"] == claims["client_id"] == "cc"
    assert claims["iss"] == devauth.issuer
    assert claims["exp"] - claims["iat"] == 600
    assert claims["nbf"] == claims["iat"]
    assert claims["jti"]
    assert "scope" not in claims


@pytest.mark.anyio
async def test_client_credentials_post_auth_single_resource_and_default_aggregate(
    devauth: DevAuthServer, http: httpx.AsyncClient
) -> None:
    form = {"grant_type": "client_credentials", "resource": SEARCH, "client_id": "cc", "client_secret": "s3cret"}
    posted = await token_request(http, devauth, {**form, "scope": "tools:search"})
    assert aud(devauth, posted) == SEARCH
    assert posted.json()["scope"] == "tools:search"
    assert claims_of(devauth, posted.json()["access_token"])["scope"] == "tools:search"
    assert aud(devauth, await client_credentials(http, devauth, [])) == AGGREGATE


@pytest.mark.anyio
async def test_client_authentication_failures(devauth: DevAuthServer, http: httpx.AsyncClient) -> None:
    wrong = await token_request(http, devauth, {"grant_type": "client_credentials"}, auth=("cc", "wrong"))
    oauth_error(wrong, 401, "invalid_client")
    assert wrong.headers["www-authenticate"].startswith("Basic")
    unknown = {"grant_type": "client_credentials", "client_id": "who", "client_secret": "x"}
    oauth_error(await token_request(http, devauth, unknown), 401, "invalid_client")
    anonymous = await token_request(http, devauth, {"grant_type": "client_credentials"})
    oauth_error(anonymous, 401, "invalid_client")
    no_secret = await token_request(http, devauth, {"grant_type": "client_credentials", "client_id": "cc"})
    oauth_error(no_secret, 401, "invalid_client")
    public = await token_request(http, devauth, {"grant_type": "client_credentials", "client_id": PUBLIC})
    oauth_error(public, 400, "unauthorized_client")
    both = {"grant_type": "client_credentials", "client_secret": "s3cret"}
    oauth_error(await token_request(http, devauth, both, auth=CONFIDENTIAL), 400, "invalid_request")
    garbled = await http.post(
        f"{devauth.issuer}/token", data={"grant_type": "client_credentials"}, headers={"authorization": "Basic %%%"}
    )
    oauth_error(garbled, 401, "invalid_client")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("resource", "fragment_of_description"),
    [
        ("https://mcp.example/unknown", "unknown resource indicator"),
        ("/mcp/tools/search", "absolute URI"),
        (f"{SEARCH}#frag", "fragment"),
        ("", "absolute URI"),
    ],
)
async def test_invalid_target(
    devauth: DevAuthServer, http: httpx.AsyncClient, resource: str, fragment_of_description: str
) -> None:
    description = oauth_error(await client_credentials(http, devauth, [SEARCH, resource]), 400, "invalid_target")
    assert fragment_of_description in description


@pytest.mark.anyio
async def test_bad_token_requests(devauth: DevAuthServer, http: httpx.AsyncClient) -> None:
    unsupported = await token_request(http, devauth, {"grant_type": "password"}, auth=CONFIDENTIAL)
    oauth_error(unsupported, 400, "unsupported_grant_type")
    oauth_error(await token_request(http, devauth, {}, auth=CONFIDENTIAL), 400, "invalid_request")
    repeated = await token_request(http, devauth, {"grant_type": ["client_credentials"] * 2}, auth=CONFIDENTIAL)
    assert "repeated" in oauth_error(repeated, 400, "invalid_request")
    as_json = await http.post(f"{devauth.issuer}/token", json={"grant_type": "client_credentials"}, auth=CONFIDENTIAL)
    assert "x-www-form-urlencoded" in oauth_error(as_json, 400, "invalid_request")
    huge = await token_request(http, devauth, {"grant_type": "client_credentials", "pad": "x" * 70_000})
    oauth_error(huge, 413, "invalid_request")
    bad_utf8 = await http.post(
        f"{devauth.issuer}/token",
        content=b"grant_type=client_credentials&scope=%ff",
        headers={"content-type": "application/x-www-form-urlencoded"},
        auth=CONFIDENTIAL,
    )
    oauth_error(bad_utf8, 400, "invalid_request")
    missing_code = {"grant_type": "authorization_code", "client_id": PUBLIC, "redirect_uri": REDIRECT}
    assert "'code'" in oauth_error(await token_request(http, devauth, missing_code), 400, "invalid_request")
    assert (await http.get(f"{devauth.issuer}/token")).status_code == 405


# -- authorization_code + PKCE ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_code_flow_issues_access_and_refresh_tokens(devauth: DevAuthServer, http: httpx.AsyncClient) -> None:
    code, verifier = await code_for(http, devauth, [SEARCH, FETCH], login_hint="alice", scope="tools:search")
    response = await exchange(http, devauth, code, verifier)
    body = response.json()
    assert body["refresh_token"]
    assert body["scope"] == "tools:search"
    claims = claims_of(devauth, body["access_token"])
    assert claims["aud"] == [SEARCH, FETCH]
    assert (claims["sub"], claims["client_id"]) == ("alice", PUBLIC)
    default_subject = await tokens_for(http, devauth, [SEARCH])
    claims = claims_of(devauth, default_subject["access_token"])
    assert (claims["sub"], claims["aud"]) == ("dev-user", SEARCH)


@pytest.mark.anyio
async def test_code_exchange_narrows_to_a_subset_and_refuses_others(
    devauth: DevAuthServer, http: httpx.AsyncClient
) -> None:
    code, verifier = await code_for(http, devauth, [SEARCH])
    refused = await exchange(http, devauth, code, verifier, resources=[FETCH])
    assert "not within the grant" in oauth_error(refused, 400, "invalid_target")
    assert aud(devauth, await exchange(http, devauth, code, verifier, resources=[SEARCH])) == SEARCH  # still usable


@pytest.mark.anyio
async def test_pkce_failure_burns_the_code(devauth: DevAuthServer, http: httpx.AsyncClient) -> None:
    code, verifier = await code_for(http, devauth, [SEARCH])
    wrong = await exchange(http, devauth, code, pkce()[0])
    assert "PKCE" in oauth_error(wrong, 400, "invalid_grant")
    oauth_error(await exchange(http, devauth, code, verifier), 400, "invalid_grant")


@pytest.mark.anyio
async def test_code_is_bound_to_client_and_redirect_uri(devauth: DevAuthServer, http: httpx.AsyncClient) -> None:
    code, verifier = await code_for(http, devauth, [SEARCH])
    other_client = await exchange(http, devauth, code, verifier, client_id="cc")
    assert "another client" in oauth_error(other_client, 400, "invalid_grant")
    code, verifier = await code_for(http, devauth, [SEARCH])
    form = {
        "grant_type": "authorization_code",
        "client_id": PUBLIC,
        "code": code,
        "code_verifier": verifier,
        "redirect_uri": "http://127.0.0.1:9/elsewhere",
    }
    assert "redirect_uri" in oauth_error(await token_request(http, devauth, form), 400, "invalid_grant")


@pytest.mark.anyio
async def test_code_reuse_is_refused_and_revokes_its_tokens(devauth: DevAuthServer, http: httpx.AsyncClient) -> None:
    code, verifier = await code_for(http, devauth, [SEARCH])
    first = await exchange(http, devauth, code, verifier)
    assert first.status_code == 200
    assert "already used" in oauth_error(await exchange(http, devauth, code, verifier), 400, "invalid_grant")
    oauth_error(await refresh(http, devauth, first.json()["refresh_token"]), 400, "invalid_grant")


@pytest.mark.anyio
async def test_authorization_errors_redirect_with_state_and_iss(
    devauth: DevAuthServer, http: httpx.AsyncClient
) -> None:
    _, challenge = pkce()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"code_challenge": challenge, "code_challenge_method": "plain"}, "invalid_request"),
        ({"code_challenge": challenge, "code_challenge_method": None}, "invalid_request"),
        ({}, "invalid_request"),
        ({"code_challenge": "short", "code_challenge_method": "S256"}, "invalid_request"),
        ({"code_challenge": challenge, "resource": ["https://mcp.example/nope"]}, "invalid_target"),
        ({"code_challenge": challenge, "resource": [f"{SEARCH}#x"]}, "invalid_target"),
        ({"code_challenge": challenge, "response_type": "token"}, "unsupported_response_type"),
    ]
    for params, error in cases:
        got = redirect_params(await authorize(http, devauth, [SEARCH], **params))
        assert (got["error"], got["state"], got["iss"]) == (error, "st-1", devauth.issuer), params
        assert got["error_description"]
        assert "code" not in got


@pytest.mark.anyio
async def test_authorization_with_untrusted_redirect_gets_an_error_page(
    devauth: DevAuthServer, http: httpx.AsyncClient
) -> None:
    _, challenge = pkce()
    for params in (
        {"redirect_uri": "https://evil.example/cb"},
        {"redirect_uri": "http://127.0.0.1:9/cb#frag"},
        {"redirect_uri": None},
        {"client_id": "nobody"},
    ):
        response = await authorize(http, devauth, [SEARCH], code_challenge=challenge, **params)
        assert response.status_code == 400, params
        assert response.headers["content-type"].startswith("text/html")
        assert "location" not in response.headers


def consent_fields(page: httpx.Response) -> dict[str, str]:
    """The hidden fields of a consent page: its consent id and CSRF token."""
    assert page.status_code == 200, page.text
    return dict(re.findall(r'<input type="hidden" name="(consent|csrf)" value="([^"]+)">', page.text))


@pytest.mark.anyio
async def test_consent_page_approve_and_deny(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    server = make_devauth(auto_approve=False)
    verifier, challenge = pkce()
    page = await authorize(http, server, [SEARCH, FETCH], code_challenge=challenge, login_hint="<bob>")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert page.headers["x-frame-options"] == "DENY"
    assert "&lt;bob&gt;" in page.text and "<bob>" not in page.text
    assert page.text.count('name="resource"') == 2
    assert "location" not in page.headers
    hidden = consent_fields(page)
    decide = {**hidden, "decision": "approve", "subject": "bob", "resource": [SEARCH, FETCH]}
    approved = redirect_params(await http.post(f"{server.issuer}/authorize", data=decide))
    assert approved["state"] == "st-1"
    response = await exchange(http, server, approved["code"], verifier)
    assert aud(server, response) == [SEARCH, FETCH]
    assert claims_of(server, response.json()["access_token"])["sub"] == "bob"
    again = await http.post(f"{server.issuer}/authorize", data=decide)
    assert again.status_code == 400 and "location" not in again.headers, "a consent is decided once"
    page = await authorize(http, server, [SEARCH, FETCH], code_challenge=challenge)
    denied = {**consent_fields(page), "decision": "deny", "subject": "bob"}
    denied_params = redirect_params(await http.post(f"{server.issuer}/authorize", data=denied))
    assert (denied_params["error"], denied_params["state"]) == ("access_denied", "st-1")
    assert "code" not in denied_params


# -- refresh_token ---------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_refresh_narrows_and_never_widens(devauth: DevAuthServer, http: httpx.AsyncClient) -> None:
    tokens = await tokens_for(http, devauth, [SEARCH, FETCH], client_id="cc")
    rt = tokens["refresh_token"]
    assert aud(devauth, await refresh(http, devauth, rt, [FETCH], client_id="cc")) == FETCH
    assert aud(devauth, await refresh(http, devauth, rt, [SEARCH], client_id="cc")) == SEARCH
    assert aud(devauth, await refresh(http, devauth, rt, client_id="cc")) == [SEARCH, FETCH]
    narrow = await tokens_for(http, devauth, [SEARCH], client_id="cc")
    widened = await refresh(http, devauth, narrow["refresh_token"], [FETCH], client_id="cc")
    assert "not within the grant" in oauth_error(widened, 400, "invalid_target")
    aggregate = await refresh(http, devauth, narrow["refresh_token"], [AGGREGATE], client_id="cc")
    oauth_error(aggregate, 400, "invalid_target")
    unknown = await refresh(http, devauth, narrow["refresh_token"], ["https://mcp.example/x"], client_id="cc")
    assert "unknown" in oauth_error(unknown, 400, "invalid_target")


@pytest.mark.anyio
async def test_refresh_under_aggregate_keeps_the_aggregate_in_normal_mode(
    devauth: DevAuthServer, http: httpx.AsyncClient
) -> None:
    tokens = await tokens_for(http, devauth, [], client_id="cc")
    assert claims_of(devauth, tokens["access_token"])["aud"] == AGGREGATE
    narrowed = await refresh(http, devauth, tokens["refresh_token"], [SEARCH], client_id="cc")
    assert aud(devauth, narrowed) == [SEARCH, AGGREGATE]


@pytest.mark.anyio
async def test_least_privilege_refresh_gives_exactly_what_was_asked(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    server = make_devauth(least_privilege=True)
    tokens = await tokens_for(http, server, [], client_id="cc")
    rt = tokens["refresh_token"]
    assert aud(server, await refresh(http, server, rt, [SEARCH], client_id="cc")) == SEARCH
    assert aud(server, await refresh(http, server, rt, [SEARCH, FETCH], client_id="cc")) == [SEARCH, FETCH]
    assert aud(server, await refresh(http, server, rt, client_id="cc")) == AGGREGATE


@pytest.mark.anyio
async def test_refresh_scope_may_narrow_but_not_widen(devauth: DevAuthServer, http: httpx.AsyncClient) -> None:
    code, verifier = await code_for(http, devauth, [SEARCH], client_id="cc", scope="a b")
    rt = (await exchange(http, devauth, code, verifier, client_id="cc")).json()["refresh_token"]
    form = {"grant_type": "refresh_token", "refresh_token": rt}
    narrowed = await token_request(http, devauth, {**form, "scope": "a"}, auth=CONFIDENTIAL)
    assert claims_of(devauth, narrowed.json()["access_token"])["scope"] == "a"
    wider = await token_request(http, devauth, {**form, "scope": "a c"}, auth=CONFIDENTIAL)
    oauth_error(wider, 400, "invalid_scope")


@pytest.mark.anyio
async def test_public_client_refresh_tokens_rotate_and_reuse_revokes_the_grant(
    devauth: DevAuthServer, http: httpx.AsyncClient
) -> None:
    first = (await tokens_for(http, devauth, [SEARCH]))["refresh_token"]
    rotated = await refresh(http, devauth, first)
    second = rotated.json()["refresh_token"]
    assert second != first
    third = (await refresh(http, devauth, second)).json()["refresh_token"]
    assert "already used" in oauth_error(await refresh(http, devauth, first), 400, "invalid_grant")
    oauth_error(await refresh(http, devauth, third), 400, "invalid_grant")


@pytest.mark.anyio
async def test_confidential_client_keeps_its_refresh_token(devauth: DevAuthServer, http: httpx.AsyncClient) -> None:
    rt = (await tokens_for(http, devauth, [SEARCH], client_id="cc"))["refresh_token"]
    for _ in range(3):
        response = await refresh(http, devauth, rt, client_id="cc")
        assert response.json()["refresh_token"] == rt
    stolen = await refresh(http, devauth, rt, client_id=PUBLIC)
    assert "another client" in oauth_error(stolen, 400, "invalid_grant")


@pytest.mark.anyio
async def test_refresh_token_expires(make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient) -> None:
    now = [1_800_000_000.0]
    server = make_devauth(refresh_ttl=100, clock=lambda: now[0])
    rt = (await tokens_for(http, server, [SEARCH], client_id="cc"))["refresh_token"]
    now[0] += 99
    assert (await refresh(http, server, rt, client_id="cc")).status_code == 200
    now[0] += 1
    assert "expired" in oauth_error(await refresh(http, server, rt, client_id="cc"), 400, "invalid_grant")


# -- single_audience (imitates oidc-provider) ------------------------------------------------------


@pytest.mark.anyio
async def test_single_audience_mode_refuses_several_resources_per_token(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    server = make_devauth(single_audience=True)
    oauth_error(await client_credentials(http, server, [SEARCH, FETCH]), 400, "invalid_target")
    assert aud(server, await client_credentials(http, server, [SEARCH])) == SEARCH
    code, verifier = await code_for(http, server, [SEARCH, FETCH])
    oauth_error(await exchange(http, server, code, verifier), 400, "invalid_target")
    response = await exchange(http, server, code, verifier, resources=[FETCH])
    assert aud(server, response) == FETCH
    rt = response.json()["refresh_token"]
    oauth_error(await refresh(http, server, rt, [SEARCH, FETCH]), 400, "invalid_target")
    assert aud(server, await refresh(http, server, rt, [SEARCH])) == SEARCH


# -- verification over HTTP: RemoteJwks + JwtVerifier ----------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


STRANGER = RSAKey.generate_key(2048)


def stranger_token(server: DevAuthServer) -> str:
    """Signed by a key the AS never published, under a made-up kid."""
    payload = {"iss": server.issuer, "sub": "x", "client_id": "x", "aud": SEARCH, "exp": 2**40}
    return jwt.encode({"alg": "RS256", "kid": secrets.token_hex(4), "typ": "at+jwt"}, payload, STRANGER)


@pytest.mark.anyio
async def test_tokens_from_every_grant_verify_against_the_remote_jwks(
    devauth: DevAuthServer, http: httpx.AsyncClient
) -> None:
    jwks_uri = await discover_jwks_uri(devauth.issuer, http)
    verifier = JwtVerifier(devauth.issuer, RemoteJwks(jwks_uri))
    cc = await verifier.verify((await client_credentials(http, devauth, [SEARCH, FETCH])).json()["access_token"])
    assert cc.principal == Principal(devauth.issuer, "cc", "cc")
    assert cc.audience == frozenset({SEARCH, FETCH})
    code, verifier_secret = await code_for(http, devauth, [SEARCH], login_hint="carol", scope="s1 s2")
    body = (await exchange(http, devauth, code, verifier_secret)).json()
    user = await verifier.verify(body["access_token"])
    assert user.principal == Principal(devauth.issuer, "carol", PUBLIC)
    assert user.scopes == frozenset({"s1", "s2"})
    refreshed = await verifier.verify((await refresh(http, devauth, body["refresh_token"])).json()["access_token"])
    assert refreshed.audience == frozenset({SEARCH})
    es256 = devauth.mint(subject="dave", client_id="app", audience=[FETCH], alg="ES256")
    assert (await verifier.verify(es256)).audience == frozenset({FETCH})
    with pytest.raises(InvalidToken, match="no verification key"):
        await verifier.verify(stranger_token(devauth))


@pytest.mark.anyio
async def test_key_rotation_refetches_once_and_unknown_kids_cannot_cause_a_fetch_storm(
    make_devauth: Callable[..., DevAuthServer],
) -> None:
    server = make_devauth()
    clock = Clock()
    verifier = JwtVerifier(server.issuer, RemoteJwks(f"{server.issuer}/jwks", cooldown=5, ttl=300, clock=clock))
    old = server.mint(subject="a", client_id="app", audience=[SEARCH])
    await verifier.verify(old)
    assert server.jwks_requests == 1

    server.rotate_keys()
    clock.now += 6  # past the cooldown since the first fetch
    rotated = server.mint(subject="b", client_id="app", audience=[SEARCH])
    assert (await verifier.verify(rotated)).principal.subject == "b"
    assert server.jwks_requests == 2
    assert (
        await verifier.verify(server.mint(subject="c", client_id="app", audience=[SEARCH]))
    ).principal.subject == "c"
    assert server.jwks_requests == 2  # the old key is still published and still known

    for _ in range(20):
        with pytest.raises(InvalidToken):
            await verifier.verify(stranger_token(server))
    assert server.jwks_requests == 2  # all within the cooldown

    clock.now += 5
    with pytest.raises(InvalidToken):
        await verifier.verify(stranger_token(server))
    assert server.jwks_requests == 3  # one per cooldown, not zero forever

    clock.now += 300
    assert (await verifier.verify(server.mint(subject="d", client_id="app", audience=[SEARCH]))).audience
    assert server.jwks_requests == 4  # the TTL ran out: known kid, fresh set


@pytest.mark.anyio
async def test_concurrent_misses_share_one_fetch(make_devauth: Callable[..., DevAuthServer]) -> None:
    server = make_devauth()
    verifier = JwtVerifier(server.issuer, RemoteJwks(f"{server.issuer}/jwks"))
    tokens = [server.mint(subject=f"u{i}", client_id="app", audience=[SEARCH]) for i in range(16)]
    subjects: list[str] = []

    async def check(token: str) -> None:
        subjects.append((await verifier.verify(token)).principal.subject)

    async with anyio.create_task_group() as group:
        for token in tokens:
            group.start_soon(check, token)
    assert sorted(subjects) == sorted(f"u{i}" for i in range(16))
    assert server.jwks_requests == 1


@pytest.mark.anyio
async def test_unreachable_jwks_keeps_the_keys_already_known(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    with running_devauth() as server:
        jwks = RemoteJwks(f"{server.issuer}/jwks", ttl=10, cooldown=1, clock=clock)
        verifier = JwtVerifier(server.issuer, jwks, cache_size=0)
        token = server.mint(subject="a", client_id="app", audience=[SEARCH])
        await verifier.verify(token)
    clock.now += 11  # stale, and the AS is gone: the fetch fails
    assert (await verifier.verify(token)).principal.subject == "a"
    assert "JWKS fetch from" in caplog.text
    assert token not in caplog.text


def test_mint_sets_ttl_and_scope(devauth: DevAuthServer) -> None:
    token = devauth.mint(subject="s", client_id="c", audience=[SEARCH, FETCH], ttl=5, scopes=("x", "y"))
    claims = claims_of(devauth, token)
    assert claims["aud"] == [SEARCH, FETCH]
    assert claims["exp"] - claims["iat"] == 5
    assert claims["scope"] == "x y"
