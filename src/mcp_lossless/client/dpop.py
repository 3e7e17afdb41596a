"""DPoP for the client (RFC 9449, SEP-1932): one key per client, a fresh proof on every request that needs one.

A DPoP-bound token is useless to whoever steals it, because each request must also carry a proof signed by
the client's private key: the token request (so the authorization server binds the token to the key), and
every MCP request that presents the token, resumes and task polls included. The proofs are added by httpx
auth flows (:class:`DpopFlow`) that the transports pass with each request, so no request path can forget
one, and a server's ``use_dpop_nonce`` answer is retried once with the nonce it supplied, inside the flow,
before the caller sees anything.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Generator

import httpx
import orjson
from joserfc import jws
from joserfc.jwk import ECKey

from ..core.dpop import PROOF_TYPE, access_token_hash, normalize_htu

NONCE_HEADER = "DPoP-Nonce"


class DpopKey:
    """The client's proof key: an EC P-256 key (ES256) generated with joserfc unless one is given.

    It lives as long as the client object: tokens bound to it are worth nothing once it is gone, which is the
    point (a restarted client asks for new tokens)."""

    alg = "ES256"

    def __init__(self, key: ECKey | None = None, clock: Callable[[], float] = time.time) -> None:
        self._key = key if key is not None else ECKey.generate_key("P-256")
        if not self._key.is_private or self._key.curve_name != "P-256":
            raise ValueError("a DPoP key must be a private EC P-256 key")
        self._public = self._key.as_dict(private=False)
        self._clock = clock
        self.thumbprint = self._key.thumbprint()
        """RFC 7638: what a token bound to this key names as ``cnf.jkt``."""

    def proof(self, method: str, url: str, access_token: str | None = None, nonce: str | None = None) -> str:
        """A fresh proof for one request: a new ``jti`` each time, ``htu`` without query or fragment, ``ath``
        when a token goes with it, ``nonce`` when the server asked for one."""
        htu = normalize_htu(url)
        if htu is None:
            raise ValueError(f"cannot make a DPoP proof for {url!r}: not an http(s) URL")
        claims: dict[str, object] = {
            "jti": secrets.token_urlsafe(16),
            "htm": method,
            "htu": htu,
            "iat": int(self._clock()),
        }
        if access_token is not None:
            claims["ath"] = access_token_hash(access_token)
        if nonce is not None:
            claims["nonce"] = nonce
        header = {"typ": PROOF_TYPE, "alg": self.alg, "jwk": self._public}
        return jws.serialize_compact(header, orjson.dumps(claims), self._key, algorithms=[self.alg])


def _origin(url: httpx.URL) -> str:
    return f"{url.scheme}://{url.netloc.decode('ascii')}"


class DpopFlow(httpx.Auth):
    """Adds the ``DPoP`` header (and the ``DPoP`` authorization scheme) to requests, retrying once on a nonce.

    ``token_requests``: every request gets a proof without ``ath`` (the token endpoint, RFC 9449 §5). Otherwise a
    request gets one only when its ``Authorization: Bearer`` token is one ``bound`` says is DPoP-bound; it is
    then sent as ``Authorization: DPoP`` with ``ath`` (§7). Nonces are remembered per origin, separately for
    token requests and resource requests (an authorization server and a resource server on one origin issue
    different nonces), and updated from any response that carries ``DPoP-Nonce``.
    """

    def __init__(self, key: DpopKey, *, token_requests: bool, bound: Callable[[str], bool] = lambda _: False) -> None:
        self.key = key
        self._token_requests = token_requests
        self._bound = bound
        self._nonces: dict[str, str] = {}
        self.nonce_retries = 0
        """How often a request was sent again with a server's nonce (observable in tests)."""

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if not self._prepare(request):
            yield request
            return
        response = yield request
        nonce = response.headers.get(NONCE_HEADER)
        if nonce is None:
            return
        origin = _origin(request.url)
        sent = self._nonces.get(origin)
        self._nonces[origin] = nonce
        if nonce != sent and self._asks_for_nonce(response):
            self.nonce_retries += 1
            self._prepare(request)
            yield request

    def _prepare(self, request: httpx.Request) -> bool:
        """Put a fresh proof on ``request``; False when it needs none."""
        token: str | None = None
        if not self._token_requests:
            scheme, _, value = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() not in ("bearer", "dpop") or not self._bound(value.strip()):
                return False
            token = value.strip()
            request.headers["Authorization"] = f"DPoP {token}"
        nonce = self._nonces.get(_origin(request.url))
        request.headers["DPoP"] = self.key.proof(request.method, str(request.url), token, nonce)
        return True

    def _asks_for_nonce(self, response: httpx.Response) -> bool:
        """A resource server's 401 with a ``use_dpop_nonce`` challenge (§9), or a token endpoint's 400 with a new
        nonce (§8: its body says ``use_dpop_nonce``, but a streamed body is not read here)."""
        if self._token_requests:
            return response.status_code == 400
        return response.status_code == 401 and "use_dpop_nonce" in response.headers.get("www-authenticate", "")
