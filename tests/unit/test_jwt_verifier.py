"""JwtVerifier against real signed JWTs: what it accepts, the RFC 9068 negative matrix, and its cache."""

from __future__ import annotations

import hashlib
import hmac
import logging
from base64 import urlsafe_b64encode
from typing import Any

import orjson
import pytest
from joserfc import jws, jwt
from joserfc.jwk import ECKey, Key, KeySet, RSAKey

from mcp_lossless.core.principal import Principal
from mcp_lossless.server.auth import InvalidToken, JwtVerifier, StaticJwks, metadata_urls

ISSUER = "https://as.example/tenant"
SEARCH = "https://mcp.example/mcp/tools/search"
FETCH = "https://mcp.example/mcp/tools/fetch"
NOW = 1_800_000_000.0

RSA = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})
EC = ECKey.generate_key("P-256", parameters={"kid": "ec-1"})
PUBLIC = KeySet.import_key_set(KeySet([RSA, EC]).as_dict(private=False))


def b64(data: bytes) -> str:
    return urlsafe_b64encode(data).rstrip(b"=").decode()


def claims(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "iss": ISSUER,
        "sub": "alice",
        "client_id": "app",
        "aud": SEARCH,
        "iat": int(NOW),
        "nbf": int(NOW),
        "exp": int(NOW) + 600,
        "jti": "j1",
        "scope": "tools:search tools:fetch",
    }
    base.update(overrides)
    return {k: v for k, v in base.items() if v is not None}


def sign(payload: dict[str, Any], *, key: Key = RSA, alg: str = "RS256", **header: Any) -> str:
    head = {"alg": alg, "kid": key.kid, "typ": "at+jwt", **header}
    head = {k: v for k, v in head.items() if v is not None}
    return jwt.encode(head, payload, key, algorithms=[alg], default_type=None)


def unsigned(header: dict[str, Any], payload: dict[str, Any], signature: bytes = b"") -> str:
    return f"{b64(orjson.dumps(header))}.{b64(orjson.dumps(payload))}.{b64(signature)}"


class CountingJwks(StaticJwks):
    """The real in-process key source, counting lookups: one lookup per signature check."""

    def __init__(self, key_set: KeySet) -> None:
        super().__init__(key_set)
        self.lookups = 0

    async def key_for(self, kid: str | None) -> Key | None:
        self.lookups += 1
        return await super().key_for(kid)


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def jwks() -> CountingJwks:
    return CountingJwks(PUBLIC)


@pytest.fixture
def verifier(jwks: CountingJwks, clock: Clock) -> JwtVerifier:
    return JwtVerifier(ISSUER, jwks, clock=clock)


@pytest.mark.anyio
@pytest.mark.parametrize(("key", "alg"), [(RSA, "RS256"), (RSA, "PS256"), (EC, "ES256")])
async def test_accepts_rfc9068_token_and_builds_grant(verifier: JwtVerifier, key: Key, alg: str) -> None:
    grant = await verifier.verify(sign(claims(aud=["HTTPS://MCP.example/mcp/tools/search/", FETCH]), key=key, alg=alg))
    assert grant.principal == Principal(issuer=ISSUER, subject="alice", client_id="app")
    assert grant.audience == frozenset({SEARCH, FETCH})
    assert grant.scopes == frozenset({"tools:search", "tools:fetch"})
    assert grant.expires_at == NOW + 600


@pytest.mark.anyio
async def test_client_id_falls_back_to_azp_and_media_type_typ_is_accepted(verifier: JwtVerifier) -> None:
    token = sign(claims(client_id=None, azp="other-app", scope=None), typ="application/at+jwt")
    grant = await verifier.verify(token)
    assert grant.principal.client_id == "other-app"
    assert grant.scopes == frozenset()


@pytest.mark.anyio
async def test_within_leeway_is_accepted(verifier: JwtVerifier) -> None:
    token = sign(claims(exp=int(NOW) - 10, nbf=int(NOW) + 20, iat=int(NOW) + 20))
    assert (await verifier.verify(token)).principal.subject == "alice"


def hs256_with_public_pem() -> str:
    """The classic key-confusion forgery: HMAC keyed with the RSA public key's PEM."""
    header = {"alg": "HS256", "kid": RSA.kid, "typ": "at+jwt"}
    signing_input = f"{b64(orjson.dumps(header))}.{b64(orjson.dumps(claims()))}"
    pem = RSA.as_pem(private=False)
    return f"{signing_input}.{b64(hmac.new(pem, signing_input.encode(), hashlib.sha256).digest())}"


def tampered() -> str:
    head, _, signature = sign(claims()).split(".")
    return f"{head}.{b64(orjson.dumps(claims(sub='mallory')))}.{signature}"


def foreign_key_token() -> str:
    stranger = RSAKey.generate_key(2048, parameters={"kid": "rsa-1"})
    return sign(claims(), key=stranger)


NEGATIVE: dict[str, tuple[Any, str]] = {
    "alg none": (lambda: unsigned({"alg": "none", "typ": "at+jwt"}, claims()), "algorithm 'none'"),
    "HS256 keyed with RSA public PEM": (hs256_with_public_pem, "algorithm 'HS256'"),
    "tampered payload": (tampered, "signature"),
    "same kid, other key": (foreign_key_token, "signature"),
    "unknown kid": (lambda: sign(claims(), kid="nope"), "no verification key"),
    "wrong iss": (lambda: sign(claims(iss="https://evil.example")), "issuer"),
    "expired beyond leeway": (lambda: sign(claims(exp=int(NOW) - 31)), "expired"),
    "nbf in the future": (lambda: sign(claims(nbf=int(NOW) + 60)), "nbf"),
    "iat in the future": (lambda: sign(claims(iat=int(NOW) + 60)), "iat"),
    "exp missing": (lambda: sign(claims(exp=None)), "'exp'"),
    "exp not a number": (lambda: sign(claims(exp="tomorrow")), "NumericDate"),
    "aud missing": (lambda: sign(claims(aud=None)), "'aud'"),
    "aud empty list": (lambda: sign(claims(aud=[])), "'aud'"),
    "aud not strings": (lambda: sign(claims(aud=[1, 2])), "'aud'"),
    "sub missing": (lambda: sign(claims(sub=None)), "'sub'"),
    "client_id missing": (lambda: sign(claims(client_id=None)), "'client_id'"),
    "scope not a string": (lambda: sign(claims(scope=["a"])), "'scope'"),
    "typ JWT": (lambda: sign(claims(), typ="JWT"), "typ"),
    "typ missing": (lambda: sign(claims(), typ=None), "typ"),
    "empty string": (lambda: "", "3 segments"),
    "garbage": (lambda: "not a token at all", "3 segments"),
    "two segments": (lambda: "abc.def", "3 segments"),
    "JWE-shaped": (lambda: "a.b.c.d.e", "3 segments"),
    "bad base64 header": (lambda: "!!!.e30.e30", "base64url"),
    "header not JSON": (lambda: f"{b64(b'not json')}.e30.e30", "base64url"),
    "header not an object": (lambda: f"{b64(b'[1]')}.e30.e30", "not a JSON object"),
    "huge header": (lambda: f"{b64(b'{' + b' ' * 4000 + b'}')}.e30.e30", "too large"),
    "huge token": (lambda: "a." + "b" * 20_000 + ".c", "16 KiB"),
    "non-ascii": (lambda: "ä.ö.ü", "base64url"),
    "signed payload not JSON": (
        lambda: jws.serialize_compact({"alg": "RS256", "kid": RSA.kid, "typ": "at+jwt"}, b"nope", RSA),
        "payload",
    ),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", NEGATIVE)
async def test_negative_matrix(verifier: JwtVerifier, case: str, caplog: pytest.LogCaptureFixture) -> None:
    make, expected = NEGATIVE[case]
    token = make()
    caplog.set_level(logging.DEBUG)
    with pytest.raises(InvalidToken) as info:
        await verifier.verify(token)
    assert expected in info.value.description
    if token:
        assert token not in info.value.description
        assert token not in caplog.text


@pytest.mark.anyio
async def test_signed_payload_that_is_not_an_object_is_rejected(verifier: JwtVerifier) -> None:
    header = {"alg": "RS256", "kid": RSA.kid, "typ": "at+jwt"}
    with pytest.raises(InvalidToken, match="not a JSON object"):
        await verifier.verify(jws.serialize_compact(header, b"[1, 2]", RSA, algorithms=["RS256"]))


@pytest.mark.parametrize("alg", ["none", "HS256", "RS257"])
def test_algorithm_allow_list_refuses_symmetric_and_unknown(alg: str) -> None:
    with pytest.raises(ValueError, match="algorithms"):
        JwtVerifier(ISSUER, StaticJwks(PUBLIC), algorithms=("RS256", alg))


@pytest.mark.anyio
async def test_algorithm_outside_configured_list_is_rejected(jwks: CountingJwks, clock: Clock) -> None:
    verifier = JwtVerifier(ISSUER, jwks, algorithms=("RS256",), clock=clock)
    with pytest.raises(InvalidToken, match="'ES256' is not allowed"):
        await verifier.verify(sign(claims(), key=EC, alg="ES256"))
    assert jwks.lookups == 0


@pytest.mark.anyio
async def test_repeated_token_is_served_from_cache(verifier: JwtVerifier, jwks: CountingJwks) -> None:
    token = sign(claims())
    first = await verifier.verify(token)
    second = await verifier.verify(token)
    assert second == first
    assert jwks.lookups == 1


@pytest.mark.anyio
async def test_cached_token_is_rejected_once_expired(verifier: JwtVerifier, jwks: CountingJwks, clock: Clock) -> None:
    token = sign(claims(exp=int(NOW) + 60))
    await verifier.verify(token)
    clock.now = NOW + 60 + 29
    await verifier.verify(token)
    clock.now = NOW + 60 + 30
    with pytest.raises(InvalidToken, match="expired"):
        await verifier.verify(token)
    with pytest.raises(InvalidToken, match="expired"):
        await verifier.verify(token)
    assert jwks.lookups == 2  # the second rejection re-checked the token from scratch


@pytest.mark.anyio
async def test_cache_is_bounded_and_evicts_least_recently_used(jwks: CountingJwks, clock: Clock) -> None:
    verifier = JwtVerifier(ISSUER, jwks, cache_size=2, clock=clock)
    a, b, c = (sign(claims(jti=j)) for j in "abc")
    for token in (a, b, a, c):  # a is used again before c arrives, so b is the one evicted
        await verifier.verify(token)
    assert jwks.lookups == 3
    await verifier.verify(a)
    assert jwks.lookups == 3
    await verifier.verify(b)
    assert jwks.lookups == 4


@pytest.mark.anyio
async def test_failed_verification_is_not_cached(verifier: JwtVerifier, jwks: CountingJwks) -> None:
    token = sign(claims(iss="https://evil.example"))
    for _ in range(2):
        with pytest.raises(InvalidToken):
            await verifier.verify(token)
    assert jwks.lookups == 2


@pytest.mark.anyio
async def test_token_without_kid_uses_the_only_key() -> None:
    only = CountingJwks(KeySet.import_key_set(KeySet([RSA]).as_dict(private=False)))
    verifier = JwtVerifier(ISSUER, only, clock=lambda: NOW)
    assert (await verifier.verify(sign(claims(), kid=None))).principal.subject == "alice"
    ambiguous = JwtVerifier(ISSUER, StaticJwks(PUBLIC), clock=lambda: NOW)
    with pytest.raises(InvalidToken, match="no verification key"):
        await ambiguous.verify(sign(claims(), kid=None))


def test_metadata_urls_follow_rfc8414_then_oidc_order() -> None:
    assert metadata_urls("https://as.example/tenant/one") == [
        "https://as.example/.well-known/oauth-authorization-server/tenant/one",
        "https://as.example/.well-known/openid-configuration/tenant/one",
        "https://as.example/tenant/one/.well-known/openid-configuration",
    ]
    assert metadata_urls("https://as.example") == [
        "https://as.example/.well-known/oauth-authorization-server",
        "https://as.example/.well-known/openid-configuration",
    ]
