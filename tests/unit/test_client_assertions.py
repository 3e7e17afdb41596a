"""Client assertions (RFC 7523 §2.2) as an authorization server verifies them, and the keys that cannot make one."""

from __future__ import annotations

import pytest
from joserfc import jwt
from joserfc.jwk import ECKey, RSAKey

from mcp_lossless.client import PrivateKeyJwt

METADATA = {"issuer": "https://as.example", "token_endpoint": "https://as.example/oauth/token"}


def test_an_assertion_names_the_client_twice_and_the_server_once_and_is_fresh_each_time() -> None:
    key = ECKey.generate_key("P-256")
    signer = PrivateKeyJwt(key.as_pem(private=True).decode(), clock=lambda: 1_000_000.0)
    first, second = signer.assertion("app", METADATA), signer.assertion("app", METADATA)
    claims = jwt.decode(first, ECKey.import_key(key.as_dict(private=False)), algorithms=["ES256"]).claims
    assert (claims["iss"], claims["sub"], claims["aud"]) == ("app", "app", "https://as.example")
    assert (claims["iat"], claims["exp"]) == (1_000_000, 1_000_060)
    assert claims["jti"] != jwt.decode(second, key, algorithms=["ES256"]).claims["jti"]  # never replayable


def test_the_token_endpoint_as_audience_for_the_servers_that_want_it() -> None:
    key = RSAKey.generate_key(2048)
    signer = PrivateKeyJwt(key.as_pem(private=True).decode(), "RS256", audience="token_endpoint")
    claims = jwt.decode(signer.assertion("app", METADATA), key, algorithms=["RS256"]).claims
    assert claims["aud"] == "https://as.example/oauth/token"


@pytest.mark.parametrize(
    ("pem", "alg", "problem"),
    [
        (None, "HS256", "unsupported client assertion algorithm"),
        ("not a key", "ES256", "not a private ES256 key"),
        ("public", "ES256", "needs the private key"),
    ],
)
def test_what_cannot_sign_is_said_at_construction(pem: str | None, alg: str, problem: str) -> None:
    key = ECKey.generate_key("P-256")
    text = {None: key.as_pem(private=True).decode(), "public": key.as_pem(private=False).decode()}.get(pem, pem)
    with pytest.raises(ValueError, match=problem):
        PrivateKeyJwt(str(text), alg)
