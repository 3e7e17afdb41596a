"""DPoP proofs (RFC 9449, the MCP DPoP extension SEP-1932): the decision whether one proof is good, sans I/O.

A DPoP-bound access token is only as strong as the check of the proof that comes with it, so the check lives
in one pure function, :func:`verify_proof`, that the resource server (every request of both eras), the dev
authorization server (token requests) and the tests all call. It takes the clock reading and the server's
expectations (nonce, bound key) as arguments and returns either the proof's key thumbprint and ``jti``
(:class:`Proof`) or a :class:`ProofRefusal` naming the one thing that failed; it raises nothing, so callers
decide once where the refusal becomes an HTTP answer. Remembering ``jti`` values (replay) is state and is
the caller's job.

joserfc does the cryptography (key import, RFC 7638 thumbprints, signature verification) behind
:func:`_verify_signature`; nothing here hand-rolls a primitive.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import math
import warnings
from base64 import urlsafe_b64decode, urlsafe_b64encode
from collections import OrderedDict
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import orjson
from joserfc import jws
from joserfc.errors import JoseError
from joserfc.jwk import ECKey, JWKRegistry, OKPKey, RSAKey

PROOF_TYPE = "dpop+jwt"
"""RFC 9449 §4.2: the ``typ`` that tells a DPoP proof from any other JWT signed by the same key."""

ALGORITHMS: tuple[str, ...] = ("ES256", "EdDSA", "PS256", "RS256")
"""The default allow-list, ES256 first (what clients generate, the conformance suite's AS advertises it alone).
Asymmetric only: ``none`` and HMAC would make the proof prove nothing."""

PROOF_ALGORITHMS = frozenset({"ES256", "ES384", "ES512", "EdDSA", "PS256", "RS256"})
"""What an operator may configure; a longer list only widens what a stolen-key attacker can try."""

DEFAULT_WINDOW = 60.0
"""Seconds a proof's ``iat`` may be off the server clock either way (RFC 9449 §11.1 leaves it to the server)."""

MAX_PROOF_LENGTH = 8 * 1024
MAX_JTI_LENGTH = 256
MAX_HEADER_LENGTH = 2048

_PRIVATE_MEMBERS = frozenset({"d", "p", "q", "dp", "dq", "qi", "oth", "k"})
"""JWK members that hold private (or symmetric) key material: a proof that ships one is refused, never used."""

_KEY_TYPES: Mapping[str, str] = {"ES": "EC", "Ed": "OKP", "PS": "RSA", "RS": "RSA"}
_DEFAULT_PORTS: Mapping[str, int] = {"http": 80, "https": 443}

RefusalError = Literal["invalid_dpop_proof", "use_dpop_nonce", "invalid_token"]


@dataclass(frozen=True, slots=True)
class Proof:
    """A proof that passed every check: who signed it (``jkt``, the RFC 7638 SHA-256 thumbprint of its key) and
    the ``jti`` and ``iat`` the caller needs to refuse a replay within the window."""

    jkt: str
    jti: str
    iat: float


@dataclass(frozen=True, slots=True)
class ProofRefusal:
    """Why a proof was refused. ``error`` is the RFC 9449 §7.1 / RFC 6750 code for the challenge: the proof
    itself is wrong (``invalid_dpop_proof``), it lacks the server's current nonce (``use_dpop_nonce``), or it is
    fine but signed by a key the token is not bound to (``invalid_token``: the token is not usable with it).
    ``check`` names the check that failed (``typ``, ``alg``, ``jwk``, ``signature``, ``htm``, ``htu``, ``iat``,
    ``ath``, ``jti``, ``nonce``, ``jkt``, ``syntax``); ``description`` is short and safe to send, never holds
    the proof or the token."""

    error: RefusalError
    check: str
    description: str


def b64url(data: bytes) -> str:
    return urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def access_token_hash(token: str) -> str:
    """RFC 9449 §4.2 ``ath``: base64url of the SHA-256 of the token's ASCII octets."""
    return b64url(hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest())


def normalize_htu(url: str) -> str | None:
    """The form two ``htu`` values are compared in (RFC 9449 §4.3 point 9, RFC 3986 §6.2.2-6.2.3): scheme and
    host lowercase, the scheme's default port dropped, an empty path as ``/``, query and fragment removed.
    ``None`` for what is not an absolute http(s) URL."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host or parts.username is not None or parts.password is not None:
        return None
    if ":" in host:
        host = f"[{host}]"  # an IPv6 literal, as it was bracketed in the URL
    netloc = host if port is None or port == _DEFAULT_PORTS[scheme] else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path or "/", "", ""))


def _refuse(check: str, description: str, error: RefusalError = "invalid_dpop_proof") -> ProofRefusal:
    return ProofRefusal(error, check, description)


def _json_segment(segment: str) -> Any:
    return orjson.loads(urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))


def _public_key(jwk: Mapping[str, Any], alg: str) -> ECKey | RSAKey | OKPKey | ProofRefusal:
    """The proof's public key, or why the ``jwk`` header cannot be one."""
    private = sorted(_PRIVATE_MEMBERS & jwk.keys())
    if private:
        named = ", ".join(private)
        return _refuse("jwk", f"header 'jwk' holds private key material ({named}): a proof carries a public key only")
    expected = _KEY_TYPES[alg[:2]]
    if jwk.get("kty") != expected:
        return _refuse("jwk", f"header 'jwk' is not an {expected} key, as algorithm {alg} needs")
    if alg == "EdDSA" and jwk.get("crv") != "Ed25519":
        return _refuse("jwk", "header 'jwk' must be an Ed25519 key for EdDSA")
    try:
        key = JWKRegistry.import_key(dict(jwk))
    except (JoseError, ValueError, TypeError, KeyError):
        return _refuse("jwk", "header 'jwk' is not a usable public key")
    if key.is_private or not isinstance(key, ECKey | RSAKey | OKPKey):
        return _refuse("jwk", "header 'jwk' is not a public key")
    return key


def _verify_signature(proof: str, key: ECKey | RSAKey | OKPKey, alg: str) -> bytes | None:
    """The thin adapter to joserfc: the verified payload, or ``None`` when the signature does not verify.

    Only ``alg`` is admitted (already on the allow-list). joserfc warns that the name ``EdDSA`` is deprecated
    (RFC 9864) but it is still the name clients send; the warning is about naming, not safety.
    """
    registry = jws.JWSRegistry(algorithms=[alg], strict_check_header=False)
    registry.max_header_length = MAX_HEADER_LENGTH  # an RSA 4096 jwk in the header is ~1 KiB; joserfc says 512
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return jws.deserialize_compact(proof, key, registry=registry).payload or b""
    except (JoseError, ValueError, TypeError):
        return None


def verify_proof(
    proof: str,
    method: str,
    url: str,
    access_token: str | None,
    now: float,
    nonces: Collection[str] | None = None,
    jkt: str | None = None,
    *,
    window: float = DEFAULT_WINDOW,
    algorithms: Collection[str] = ALGORITHMS,
) -> Proof | ProofRefusal:
    """Check one DPoP proof (RFC 9449 §4.3) for the request ``method`` ``url`` at time ``now``.

    ``access_token``: the token presented with it (a resource request; ``ath`` must match it), or ``None`` (a
    token request). ``nonces``: the server nonces currently accepted, or ``None`` when the server issues none.
    ``jkt``: the thumbprint the token is bound to (its ``cnf.jkt``), or ``None``. Checks run cheapest first and
    the signature before any claim is believed; the first failure is returned.
    """
    if not isinstance(proof, str) or not proof or len(proof) > MAX_PROOF_LENGTH:
        return _refuse("syntax", f"a DPoP proof is one JWS of at most {MAX_PROOF_LENGTH} bytes")
    segments = proof.split(".")
    if len(segments) != 3 or not all(segments):
        return _refuse("syntax", "the DPoP proof is not a JWS compact serialization")
    try:
        header = _json_segment(segments[0])
    except (binascii.Error, ValueError):
        return _refuse("syntax", "the DPoP proof's header is not base64url-encoded JSON")
    if not isinstance(header, dict):
        return _refuse("syntax", "the DPoP proof's header is not a JSON object")
    if header.get("typ") != PROOF_TYPE:
        return _refuse("typ", f"header 'typ' must be {PROOF_TYPE!r}")
    alg = header.get("alg")
    if not isinstance(alg, str) or alg not in algorithms or alg not in PROOF_ALGORITHMS:
        return _refuse("alg", f"algorithm {alg!r} is not one of {' '.join(a for a in algorithms)}")
    jwk = header.get("jwk")
    if not isinstance(jwk, dict):
        return _refuse("jwk", "header 'jwk' is missing or not a JSON object")
    key = _public_key(jwk, alg)
    if isinstance(key, ProofRefusal):
        return key
    payload = _verify_signature(proof, key, alg)
    if payload is None:
        return _refuse("signature", "the DPoP proof's signature does not verify with its 'jwk'")
    try:
        claims = orjson.loads(payload)
    except orjson.JSONDecodeError:
        return _refuse("syntax", "the DPoP proof's payload is not JSON")
    if not isinstance(claims, dict):
        return _refuse("syntax", "the DPoP proof's payload is not a JSON object")
    return _check_claims(claims, key, method, url, access_token, now, nonces, jkt, window)


def _check_claims(
    claims: Mapping[str, Any],
    key: ECKey | RSAKey | OKPKey,
    method: str,
    url: str,
    access_token: str | None,
    now: float,
    nonces: Collection[str] | None,
    jkt: str | None,
    window: float,
) -> Proof | ProofRefusal:
    jti = claims.get("jti")
    if not isinstance(jti, str) or not jti or len(jti) > MAX_JTI_LENGTH:
        return _refuse("jti", f"claim 'jti' is missing or not a string of at most {MAX_JTI_LENGTH} characters")
    if claims.get("htm") != method:
        return _refuse("htm", f"claim 'htm' does not match the request method {method}")
    htu = claims.get("htu")
    if not isinstance(htu, str) or "?" in htu or "#" in htu:
        return _refuse("htu", "claim 'htu' is missing or carries a query or fragment")
    expected = normalize_htu(url)
    if expected is None or normalize_htu(htu) != expected:
        return _refuse("htu", f"claim 'htu' does not match the request URL {expected}")
    iat = claims.get("iat")
    if isinstance(iat, bool) or not isinstance(iat, int | float) or not math.isfinite(iat):
        return _refuse("iat", "claim 'iat' is missing or not a NumericDate")
    if abs(now - iat) > window:
        return _refuse("iat", f"claim 'iat' is more than {window:g} s from the server's clock")
    if nonces is not None:
        nonce = claims.get("nonce")
        if not isinstance(nonce, str) or nonce not in nonces:
            return _refuse("nonce", "a current server-provided nonce is required", "use_dpop_nonce")
    if access_token is not None and claims.get("ath") != access_token_hash(access_token):
        return _refuse("ath", "claim 'ath' is missing or is not the hash of the access token presented")
    thumbprint = key.thumbprint()
    if jkt is not None and thumbprint != jkt:
        return _refuse("jkt", "the DPoP proof is signed by a key the access token is not bound to", "invalid_token")
    return Proof(thumbprint, jti, float(iat))


def bound_key(claims: Mapping[str, Any]) -> str | ProofRefusal | None:
    """The ``cnf.jkt`` a token's claims bind it to (RFC 9449 §6.1), ``None`` for an unbound token, or a refusal
    for a ``cnf`` that names a key in a form this server cannot check (it must not then be taken as unbound)."""
    cnf = claims.get("cnf")
    if cnf is None:
        return None
    if not isinstance(cnf, dict):
        return _refuse("jkt", "claim 'cnf' is not a JSON object", "invalid_token")
    jkt = cnf.get("jkt")
    if jkt is None:
        return _refuse("jkt", "claim 'cnf' binds the token by a method other than DPoP", "invalid_token")
    if not isinstance(jkt, str) or len(jkt) != 43:
        return _refuse("jkt", "claim 'cnf.jkt' is not a SHA-256 JWK thumbprint", "invalid_token")
    return jkt


NONCE_PERIOD = 300.0
"""Seconds a server nonce is current; the previous one is still accepted, so a nonce lives 5 to 10 minutes."""


def server_nonce(key: bytes, period: float, now: float, back: int = 0) -> str:
    """The nonce a server hands out (RFC 9449 §8-9) in the ``period`` holding ``now`` (``back`` periods earlier):
    a MAC of the period's number, so every replica holding ``key`` issues and accepts the same nonces and none
    has to remember one. Unguessable without ``key``; it changes every ``period`` seconds."""
    number = math.floor(now / period) - back
    return b64url(hmac.new(key, number.to_bytes(8, "big", signed=True), hashlib.sha256).digest()[:18])


def accepted_nonces(key: bytes, period: float, now: float) -> frozenset[str]:
    """The current period's nonce and the previous one's: a nonce handed out just before a change stays good."""
    return frozenset({server_nonce(key, period, now), server_nonce(key, period, now, 1)})


class ReplayCache:
    """Proof identities seen, each until its proof's ``iat`` leaves the window; least recently added evicted past
    ``size`` (expired entries first). Memory stays bounded whatever clients send; past the bound the oldest
    identity is forgotten, which a replay can use only while that proof's ``iat`` is still in the window."""

    def __init__(self, size: int, clock: Callable[[], float]) -> None:
        self._size = size
        self._clock = clock
        self._entries: OrderedDict[bytes, float] = OrderedDict()

    def first_use(self, key: bytes, until: float) -> bool:
        now = self._clock()
        entries = self._entries
        seen = entries.get(key)
        if seen is not None and seen > now:
            return False
        entries[key] = until
        entries.move_to_end(key)
        while len(entries) > self._size:
            entries.popitem(last=False)
        while entries:  # expired entries at the front go as new ones arrive: no sweeper needed
            oldest_key, oldest_until = next(iter(entries.items()))
            if oldest_until > now:
                break
            del entries[oldest_key]
        return True

    def __len__(self) -> int:
        return len(self._entries)
