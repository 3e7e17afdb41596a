"""core.dpop.verify_proof against real signed proofs: what it accepts, one refusal per defect, and properties.

Proofs are built here by hand with joserfc (not with the client's builder), so a bug shared by the client
and the verifier cannot hide.
"""

from __future__ import annotations

import hashlib
import warnings
from base64 import urlsafe_b64encode
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from joserfc import jws
from joserfc.jwk import ECKey, Key, OKPKey, RSAKey

from mcp_lossless.core.dpop import (
    Proof,
    ProofRefusal,
    access_token_hash,
    bound_key,
    normalize_htu,
    verify_proof,
)

NOW = 1_800_000_000.0
URL = "https://mcp.example/mcp"
TOKEN = "eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln"
EC = ECKey.generate_key("P-256")
EC_OTHER = ECKey.generate_key("P-256")
RSA = RSAKey.generate_key(2048)
ED = OKPKey.generate_key("Ed25519")
P384 = ECKey.generate_key("P-384")


def b64(data: bytes) -> str:
    return urlsafe_b64encode(data).rstrip(b"=").decode()


def proof(
    key: Key = EC,
    alg: str = "ES256",
    *,
    header: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    **claims: Any,
) -> str:
    head: dict[str, Any] = {"typ": "dpop+jwt", "alg": alg, "jwk": key.as_dict(private=False)}
    head.update(header or {})
    body: dict[str, Any] = {"jti": "j-1", "htm": "POST", "htu": URL, "iat": int(NOW), "ath": access_token_hash(TOKEN)}
    body.update(claims)
    for name in drop:
        head.pop(name, None)
        body.pop(name, None)
    head = {k: v for k, v in head.items() if v is not None}
    body = {k: v for k, v in body.items() if v is not None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # joserfc: the name EdDSA is deprecated (RFC 9864); clients still send it
        return jws.serialize_compact(head, orjson.dumps(body), key, algorithms=[alg])


def check(value: str, **kwargs: Any) -> Proof | ProofRefusal:
    args: dict[str, Any] = {"method": "POST", "url": URL, "access_token": TOKEN, "now": NOW}
    args.update(kwargs)
    return verify_proof(value, **args)


def refused(result: Proof | ProofRefusal, check_name: str, error: str = "invalid_dpop_proof") -> None:
    assert isinstance(result, ProofRefusal), result
    assert (result.check, result.error) == (check_name, error), result


@pytest.mark.parametrize(("key", "alg"), [(EC, "ES256"), (RSA, "RS256"), (RSA, "PS256"), (ED, "EdDSA")])
def test_a_good_proof_gives_its_thumbprint_and_jti(key: Key, alg: str) -> None:
    result = check(proof(key, alg))
    assert result == Proof(key.thumbprint(), "j-1", NOW)


def test_the_thumbprint_is_rfc7638_sha256() -> None:
    jwk = EC.as_dict(private=False)
    canonical = orjson.dumps({k: jwk[k] for k in ("crv", "kty", "x", "y")}, option=orjson.OPT_SORT_KEYS)
    result = check(proof())
    assert isinstance(result, Proof) and result.jkt == b64(hashlib.sha256(canonical).digest())


def test_the_rfc9449_ath_example() -> None:
    """RFC 9449 §7.1's example token and its ``ath``."""
    assert access_token_hash("Kz~8mXK1EalYznwH-LC-1fBAo.4Ljp~zsPE_NeO.gxU") == (
        "fUHyO2r2Z3DZ53EsNrWBb0xWXoaNy59IiKCAqksmQEo"
    )


def test_a_token_request_proof_needs_no_ath() -> None:
    result = check(proof(ath=None), access_token=None)
    assert isinstance(result, Proof)


@pytest.mark.parametrize(
    ("build", "check_name"),
    [
        (lambda: proof(header={"typ": "JWT"}), "typ"),
        (lambda: proof(drop=("typ",)), "typ"),
        (lambda: proof(RSA, "RS384"), "alg"),
        (lambda: proof(P384, "ES384"), "alg"),
        (lambda: proof(drop=("jwk",)), "jwk"),
        (lambda: proof(header={"jwk": EC.as_dict(private=True)}), "jwk"),
        (lambda: proof(header={"jwk": RSA.as_dict(private=False)}), "jwk"),
        (lambda: proof(header={"jwk": EC_OTHER.as_dict(private=False)}), "signature"),
        (lambda: proof(drop=("jti",)), "jti"),
        (lambda: proof(jti=""), "jti"),
        (lambda: proof(jti=7), "jti"),
        (lambda: proof(htm="GET"), "htm"),
        (lambda: proof(htm="post"), "htm"),
        (lambda: proof(htu="https://mcp.example/other"), "htu"),
        (lambda: proof(htu="https://evil.example/mcp"), "htu"),
        (lambda: proof(htu=URL + "?x=1"), "htu"),
        (lambda: proof(htu=URL + "#f"), "htu"),
        (lambda: proof(htu="http://mcp.example/mcp"), "htu"),
        (lambda: proof(htu=URL + "/"), "htu"),
        (lambda: proof(drop=("htu",)), "htu"),
        (lambda: proof(drop=("iat",)), "iat"),
        (lambda: proof(iat=True), "iat"),
        (lambda: proof(iat="1800000000"), "iat"),
        (lambda: proof(iat=int(NOW) - 61), "iat"),
        (lambda: proof(iat=int(NOW) + 61), "iat"),
        (lambda: proof(ath=None), "ath"),
        (lambda: proof(ath=access_token_hash(TOKEN + "x")), "ath"),
    ],
)
def test_each_defect_is_refused_by_name(build: Any, check_name: str) -> None:
    refused(check(build()), check_name)


def test_unsigned_and_hmac_proofs_are_refused_as_algorithms() -> None:
    head = b64(orjson.dumps({"typ": "dpop+jwt", "alg": "none", "jwk": EC.as_dict(private=False)}))
    body = b64(orjson.dumps({"jti": "j", "htm": "POST", "htu": URL, "iat": int(NOW)}))
    refused(check(f"{head}.{body}.", access_token=None), "syntax")
    refused(check(f"{head}.{body}.c2ln", access_token=None), "alg")
    hmac_head = b64(orjson.dumps({"typ": "dpop+jwt", "alg": "HS256", "jwk": {"kty": "oct", "k": "c2VjcmV0"}}))
    refused(check(f"{hmac_head}.{body}.c2ln", access_token=None), "alg")


def test_an_oct_key_in_jwk_is_private_material() -> None:
    value = proof(header={"jwk": {"kty": "oct", "k": "c2VjcmV0"}})
    refused(check(value), "jwk")


def test_a_tampered_payload_fails_the_signature() -> None:
    head, _, signature = proof().split(".")
    body = b64(
        orjson.dumps({"jti": "j-2", "htm": "POST", "htu": URL, "iat": int(NOW), "ath": access_token_hash(TOKEN)})
    )
    refused(check(f"{head}.{body}.{signature}"), "signature")


@pytest.mark.parametrize("value", ["", "a.b", "a.b.c.d", "!!.e30.c2ln", "W10.e30.c2ln", "x" * 9000])
def test_garbage_is_refused_as_syntax(value: str) -> None:
    refused(check(value), "syntax")


def test_the_iat_window_is_inclusive_and_settable() -> None:
    assert isinstance(check(proof(iat=int(NOW) - 60)), Proof)
    assert isinstance(check(proof(iat=int(NOW) + 60)), Proof)
    assert isinstance(check(proof(iat=int(NOW) - 200), window=300), Proof)
    refused(check(proof(iat=int(NOW) - 20), window=10), "iat")


def test_nonces_when_required() -> None:
    refused(check(proof(), nonces={"n1"}), "nonce", "use_dpop_nonce")
    refused(check(proof(nonce="old"), nonces={"n1", "n2"}), "nonce", "use_dpop_nonce")
    assert isinstance(check(proof(nonce="n2"), nonces={"n1", "n2"}), Proof)
    assert isinstance(check(proof(nonce="whatever")), Proof), "no nonce is checked when the server issues none"


def test_the_bound_key_must_be_the_signing_key() -> None:
    assert isinstance(check(proof(), jkt=EC.thumbprint()), Proof)
    refused(check(proof(), jkt=EC_OTHER.thumbprint()), "jkt", "invalid_token")


def test_a_signature_failure_is_reported_before_any_claim() -> None:
    """An attacker's claims are never judged (nor echoed) before the signature holds."""
    head, body, _ = proof(htm="GET", iat=0).split(".")
    other = proof(EC_OTHER).split(".")[2]
    refused(check(f"{head}.{body}.{other}"), "signature")


def test_the_algorithm_list_is_the_callers() -> None:
    refused(check(proof(RSA, "RS256"), algorithms=("ES256",)), "alg")


@pytest.mark.parametrize(
    ("url", "normal"),
    [
        ("HTTPS://MCP.Example/mcp", "https://mcp.example/mcp"),
        ("https://mcp.example:443/mcp", "https://mcp.example/mcp"),
        ("http://mcp.example:80/mcp", "http://mcp.example/mcp"),
        ("http://mcp.example:8080/mcp", "http://mcp.example:8080/mcp"),
        ("https://mcp.example", "https://mcp.example/"),
        ("https://mcp.example/mcp?x=1#y", "https://mcp.example/mcp"),
        ("http://[::1]:3000/mcp", "http://[::1]:3000/mcp"),
        ("https://mcp.example/MCP", "https://mcp.example/MCP"),
    ],
)
def test_htu_normalization(url: str, normal: str) -> None:
    assert normalize_htu(url) == normal


@pytest.mark.parametrize("url", ["/mcp", "ftp://x/y", "https://user:pw@mcp.example/mcp", "https://x:99999/", "mcp"])
def test_htu_that_is_no_http_url(url: str) -> None:
    assert normalize_htu(url) is None


def test_a_request_url_with_default_port_and_query_matches_a_plain_htu() -> None:
    assert isinstance(check(proof(), url="HTTPS://mcp.example:443/mcp?session=1"), Proof)


def test_bound_key() -> None:
    assert bound_key({}) is None
    assert bound_key({"cnf": {"jkt": EC.thumbprint()}}) == EC.thumbprint()
    for cnf in ("x", {"x5t#S256": "abc"}, {"jkt": 5}, {"jkt": "short"}):
        result = bound_key({"cnf": cnf})
        assert isinstance(result, ProofRefusal) and result.error == "invalid_token"


@settings(max_examples=60, deadline=None)
@given(
    method=st.sampled_from(["GET", "POST", "DELETE"]),
    skew=st.integers(min_value=-120, max_value=120),
    path=st.from_regex(r"/[a-z]{0,8}", fullmatch=True),
    token=st.text(alphabet=st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=40),
)
def test_property_accepted_exactly_when_every_claim_matches(method: str, skew: int, path: str, token: str) -> None:
    url = f"https://mcp.example{path}"
    value = proof(htm=method, htu=url, iat=int(NOW) + skew, ath=access_token_hash(token))
    result = verify_proof(value, method, url, token, NOW)
    assert isinstance(result, Proof) == (abs(skew) <= 60)
    other_method = verify_proof(value, "PUT", url, token, NOW)
    assert isinstance(other_method, ProofRefusal) and other_method.check == "htm"
    other_token = verify_proof(value, method, url, token + "x", NOW)
    assert isinstance(other_token, ProofRefusal) and other_token.check in {"ath", "iat"}


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=300))
def test_property_arbitrary_text_never_raises(value: str) -> None:
    assert isinstance(check(value), ProofRefusal)
