"""The development AS safe by default: who may be a client (RFC 7591 registration, Client ID Metadata
Documents, ``dev-public``), strict redirect URIs, a consent step that cannot be skipped or forged, bounded
and expiring state, and one error for every failed client authentication. Over real HTTP on loopback."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest

from mcp_lossless.asgi import Receive, Scope, Send, respond
from mcp_lossless.cli import _serve_parser
from mcp_lossless.devauth.server import DevAuthServer
from mcp_lossless.serve import UsageError, build_config
from tests.integration.test_devauth import (
    AGGREGATE,
    FETCH,
    PUBLIC,
    REDIRECT,
    SEARCH,
    aud,
    authorize,
    claims_of,
    code_for,
    consent_fields,
    exchange,
    make_devauth,
    oauth_error,
    pkce,
    redirect_params,
    refresh,
    token_request,
)
from tests.support.uvicorn_server import serve_app

__all__ = ["make_devauth"]  # the fixture, shared with test_devauth

pytestmark = pytest.mark.anyio


async def register(http: httpx.AsyncClient, server: DevAuthServer, **metadata: Any) -> httpx.Response:
    return await http.post(server.metadata["registration_endpoint"], json={"redirect_uris": [REDIRECT], **metadata})


# -- strict redirect URIs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "redirect_uri",
    [
        "http://evil.example\\@127.0.0.1/cb",  # WHATWG parsers (browsers) see host evil.example
        "http://evil.example%5C@127.0.0.1/cb",
        "http://user@127.0.0.1/cb",
        "http://127.0.0.1.evil.example/cb",
        "http://127.0.0.1:99999/cb",
        "http://127.0.0.1/c b",
        "http://127.0.0.1/cb#frag",
        "javascript://127.0.0.1/%0aalert(1)",
        "HTTP://127.0.0.1/cb\\..",
        "http://[::1]@evil.example/cb",
    ],
)
async def test_redirect_uri_is_parsed_strictly_before_it_is_compared(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient, redirect_uri: str
) -> None:
    server = make_devauth()
    _, challenge = pkce()
    response = await authorize(http, server, [SEARCH], code_challenge=challenge, redirect_uri=redirect_uri)
    assert response.status_code == 400, redirect_uri
    assert "location" not in response.headers, "no code and no error is sent to an unparsable redirect"
    assert "loopback host" in response.text


async def test_loopback_redirect_uris_that_parse_are_accepted(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    server = make_devauth()
    for uri in ("http://127.0.0.1:9/cb", "http://localhost:65535/a/b?x=1", "http://[::1]/cb", "https://127.0.0.1/c"):
        _, challenge = pkce()
        response = await authorize(http, server, [SEARCH], code_challenge=challenge, redirect_uri=uri)
        assert response.status_code == 302, (uri, response.text)
        assert response.headers["location"].startswith(uri)


# -- the consent step --------------------------------------------------------------------------------


async def test_decision_in_the_query_cannot_skip_the_consent(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    server = make_devauth(auto_approve=False)
    _, challenge = pkce()
    page = await authorize(http, server, [SEARCH], code_challenge=challenge, decision="approve")
    assert page.status_code == 200 and "location" not in page.headers
    assert 'name="csrf"' in page.text


async def test_consent_post_needs_its_csrf_token_its_browser_and_its_origin(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    server = make_devauth(auto_approve=False)
    _, challenge = pkce()
    page = await authorize(http, server, [SEARCH], code_challenge=challenge)
    hidden = consent_fields(page)
    assert "HttpOnly" in page.headers["set-cookie"] and "SameSite=Strict" in page.headers["set-cookie"]
    form = {**hidden, "decision": "approve", "subject": "alice", "resource": [SEARCH]}
    url = f"{server.issuer}/authorize"
    forged = await http.post(url, data={**form, "csrf": "x" * 43})
    assert forged.status_code == 400 and "location" not in forged.headers
    async with httpx.AsyncClient() as other_browser:  # no cookie: a cross-site form post from another page
        cross_site = await other_browser.post(url, data=form)
    assert cross_site.status_code == 400 and "location" not in cross_site.headers
    other_origin = await http.post(url, data=form, headers={"origin": "http://evil.example"})
    assert other_origin.status_code == 400 and "location" not in other_origin.headers
    bare = await http.post(url, data={"decision": "approve", "client_id": PUBLIC, "redirect_uri": REDIRECT})
    assert bare.status_code == 400 and "location" not in bare.headers
    approved = redirect_params(await http.post(url, data=form))  # the real page's post still works
    assert approved["code"]


async def test_consent_may_narrow_the_aggregate_to_some_tools(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    """The resource owner ticks only ``search``: a client asking for the whole server gets a search token."""
    server = make_devauth(auto_approve=False)
    verifier, challenge = pkce()
    page = await authorize(http, server, [AGGREGATE], code_challenge=challenge)
    assert page.text.count('name="resource"') == 3  # the aggregate (ticked) and each tool (to narrow to)
    form = {**consent_fields(page), "decision": "approve", "subject": "alice", "resource": [SEARCH]}
    code = redirect_params(await http.post(f"{server.issuer}/authorize", data=form))["code"]
    first = await exchange(http, server, code, verifier, resources=[AGGREGATE])
    assert aud(server, first) == SEARCH
    again = await refresh(http, server, first.json()["refresh_token"])
    assert aud(server, again) == SEARCH
    for wider in ([AGGREGATE], [FETCH]):  # what the owner declined needs the owner: a new authorization
        widen = await refresh(http, server, again.json()["refresh_token"], wider)
        assert "declined" in oauth_error(widen, 400, "invalid_grant")
    page = await authorize(http, server, [SEARCH], code_challenge=challenge)
    widen = {**consent_fields(page), "decision": "approve", "subject": "alice", "resource": [FETCH]}
    refused = redirect_params(await http.post(f"{server.issuer}/authorize", data=widen))
    assert refused["error"] == "invalid_target", "the page cannot approve more than was asked"


# -- dynamic client registration (RFC 7591) -------------------------------------------------------------


async def test_dynamic_registration_of_a_public_client(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    server = make_devauth()
    assert server.metadata["registration_endpoint"] == f"{server.issuer}/register"
    registered = await register(http, server, token_endpoint_auth_method="none", client_name="app")
    assert registered.status_code == 201, registered.text
    body = registered.json()
    assert body["client_id"].startswith("reg-") and "client_secret" not in body
    assert (body["redirect_uris"], body["token_endpoint_auth_method"]) == ([REDIRECT], "none")
    client_id = body["client_id"]
    other_port = "http://127.0.0.1:8123/callback"  # RFC 8252 §7.3: any port on a loopback redirect
    _, challenge = pkce()
    moved = await authorize(
        http, server, [SEARCH], client_id=client_id, code_challenge=challenge, redirect_uri=other_port
    )
    assert moved.status_code == 302 and moved.headers["location"].startswith(other_port)
    elsewhere = await authorize(
        http, server, [SEARCH], client_id=client_id, code_challenge=challenge, redirect_uri="http://127.0.0.1:9/other"
    )
    assert elsewhere.status_code == 400 and "not registered" in elsewhere.text
    code, verifier = await code_for(http, server, [SEARCH], client_id=client_id)
    token = await exchange(http, server, code, verifier, client_id=client_id)
    assert claims_of(server, token.json()["access_token"])["client_id"] == client_id
    credentials = {"grant_type": "client_credentials", "client_id": client_id}
    oauth_error(await token_request(http, server, credentials), 400, "unauthorized_client")


async def test_dynamic_registration_of_a_confidential_client(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    server = make_devauth()
    grant_types = ["client_credentials"]
    method = "client_secret_post"
    registered = await register(
        http, server, grant_types=grant_types, token_endpoint_auth_method=method, redirect_uris=[]
    )
    assert registered.status_code == 201, registered.text
    body = registered.json()
    assert body["client_secret"] and body["client_secret_expires_at"] > 0
    form = {"grant_type": "client_credentials", "client_id": body["client_id"], "resource": SEARCH}
    got = await token_request(http, server, {**form, "client_secret": body["client_secret"]})
    assert aud(server, got) == SEARCH
    wrong = await token_request(http, server, {**form, "client_secret": "nope"})
    oauth_error(wrong, 401, "invalid_client")
    code_grant = await token_request(
        http, server, {**form, "client_secret": body["client_secret"], "grant_type": "refresh_token"}
    )
    oauth_error(code_grant, 400, "unauthorized_client")


@pytest.mark.parametrize(
    ("metadata", "error"),
    [
        ({"redirect_uris": ["http://evil.example\\@127.0.0.1/cb"]}, "invalid_redirect_uri"),
        ({"redirect_uris": ["https://evil.example/cb"]}, "invalid_redirect_uri"),
        ({"redirect_uris": []}, "invalid_redirect_uri"),
        ({"token_endpoint_auth_method": "private_key_jwt"}, "invalid_client_metadata"),
        ({"grant_types": ["password"]}, "invalid_client_metadata"),
        ({"grant_types": ["client_credentials"], "token_endpoint_auth_method": "none"}, "invalid_client_metadata"),
        ({"response_types": ["token"]}, "invalid_client_metadata"),
        ({"grant_types": ["client_credentials"]}, "invalid_redirect_uri"),  # no redirect without codes
        ({"client_name": 5}, "invalid_client_metadata"),
    ],
)
async def test_registration_refuses_bad_metadata(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient, metadata: dict[str, Any], error: str
) -> None:
    server = make_devauth()
    oauth_error(await register(http, server, **metadata), 400, error)


async def test_registration_refuses_what_is_not_json(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    server = make_devauth()
    url = server.metadata["registration_endpoint"]
    oauth_error(
        await http.post(url, content=b"{", headers={"content-type": "application/json"}), 400, "invalid_client_metadata"
    )
    oauth_error(await http.post(url, data={"redirect_uris": REDIRECT}), 400, "invalid_client_metadata")
    oauth_error(await http.post(url, json=[REDIRECT]), 400, "invalid_client_metadata")
    assert (await http.get(url)).status_code == 405


async def test_registrations_are_bounded_and_expire(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    now = [1_000_000.0]
    server = make_devauth(max_registrations=2, clock=lambda: now[0])
    first = (await register(http, server, token_endpoint_auth_method="none")).json()["client_id"]
    assert (await register(http, server, token_endpoint_auth_method="none")).status_code == 201
    full = await register(http, server, token_endpoint_auth_method="none")
    assert "limit" in oauth_error(full, 503, "temporarily_unavailable")
    now[0] += 24 * 3600 + 1
    _, challenge = pkce()
    expired = await authorize(http, server, [SEARCH], client_id=first, code_challenge=challenge)
    assert expired.status_code == 400 and "unknown client_id" in expired.text
    assert (await register(http, server, token_endpoint_auth_method="none")).status_code == 201, "room again"


# -- Client ID Metadata Documents ----------------------------------------------------------------------


@contextmanager
def metadata_documents(documents: dict[str, dict[str, Any]]) -> Iterator[str]:
    """A loopback web server publishing ``documents`` by path; yields its base URL."""

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        document = documents.get(scope["path"])
        if document is None:
            await respond(send, 404, b"not found", b"text/plain")
        else:
            await respond(send, 200, orjson.dumps(document), b"application/json")

    with serve_app(app) as url:
        yield url


async def test_client_id_metadata_document_client(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    documents: dict[str, dict[str, Any]] = {}
    with metadata_documents(documents) as base:
        client_id = f"{base}/client.json"
        documents["/client.json"] = {"client_id": client_id, "client_name": "doc app", "redirect_uris": [REDIRECT]}
        documents["/liar.json"] = {"client_id": f"{base}/other.json", "redirect_uris": [REDIRECT]}
        documents["/secretive.json"] = {
            "client_id": f"{base}/secretive.json",
            "redirect_uris": [REDIRECT],
            "token_endpoint_auth_method": "client_secret_basic",
        }
        server = make_devauth(http_metadata_documents=True)
        code, verifier = await code_for(http, server, [SEARCH], client_id=client_id)
        token = await exchange(http, server, code, verifier, client_id=client_id)
        assert claims_of(server, token.json()["access_token"])["client_id"] == client_id
        _, challenge = pkce()
        for bad_id, redirect_uri, why in (
            (client_id, "http://127.0.0.1:9/elsewhere", "not registered"),
            (f"{base}/liar.json", REDIRECT, "names another client_id"),
            (f"{base}/secretive.json", REDIRECT, "must be public"),
            (f"{base}/missing.json", REDIRECT, "HTTP 404"),
        ):
            response = await authorize(
                http, server, [SEARCH], client_id=bad_id, code_challenge=challenge, redirect_uri=redirect_uri
            )
            assert response.status_code == 400 and why in response.text, (bad_id, response.text)
        strict = make_devauth()  # the default: only https document URLs
        response = await authorize(http, strict, [SEARCH], client_id=client_id, code_challenge=challenge)
        assert response.status_code == 400 and "must be https" in response.text


# -- client authentication -----------------------------------------------------------------------------


async def test_unknown_client_and_wrong_secret_get_one_and_the_same_error(
    make_devauth: Callable[..., DevAuthServer], http: httpx.AsyncClient
) -> None:
    server = make_devauth()
    form = {"grant_type": "client_credentials"}
    answers = [
        await token_request(http, server, form, auth=("cc", "wrong")),
        await token_request(http, server, form, auth=("nobody", "wrong")),
        await token_request(http, server, {**form, "client_id": "nobody"}),
        await token_request(http, server, {**form, "client_id": PUBLIC, "client_secret": "x"}),
        await token_request(http, server, {**form, "client_id": "reg-unknown", "client_secret": "x"}),
    ]
    bodies = {(a.status_code, a.text) for a in answers}
    assert bodies == {(401, '{"error":"invalid_client","error_description":"client authentication failed"}')}


# -- serve refuses an exposed dev AS -------------------------------------------------------------------


def _parse(*argv: str) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    _serve_parser(parser.add_subparsers())
    return parser.parse_args(["serve", *argv])


def test_serve_refuses_auto_approve_and_default_credentials_on_a_non_loopback_host() -> None:
    with pytest.raises(UsageError, match="--auto-approve is refused on a non-loopback host"):
        build_config(_parse("--host", "0.0.0.0", "--auto-approve", "--dev-client", "a:long-secret"))
    with pytest.raises(UsageError, match="default dev client dev-client:dev-secret is public"):
        build_config(_parse("--host", "0.0.0.0"))
    assert build_config(_parse("--host", "0.0.0.0", "--dev-client", "a:long-secret")).dev_clients == {
        "a": "long-secret"
    }
    assert build_config(_parse("--host", "0.0.0.0", "--force-dev-credentials")).force_dev_credentials
    loopback = build_config(_parse("--auto-approve"))
    assert loopback.auto_approve and loopback.dev_clients == {"dev-client": "dev-secret"}
    assert not build_config(_parse()).auto_approve, "consent is the default"
