"""DPoP on the resource server (RFC 9449 §7, SEP-1932): what every request with a token must prove, in both eras.

:func:`mcp_lossless.core.dpop.verify_proof` decides whether one proof is good; this module adds the state a
decision needs and the challenges a refusal carries: the ``jti`` replay cache, the server nonces, the rule
that a bound token is honoured only as ``Authorization: DPoP`` with a proof by its key (and, when
``require_dpop`` is set, that nothing else is honoured), and the ``WWW-Authenticate: DPoP`` challenges.

Every request goes through :meth:`DpopGuard.check` (the transport's one authentication step), so a resume
(``GET`` with ``Last-Event-ID``), a task poll or a retried request needs a fresh proof by the same key as the
first request did: a stolen token and a stolen event id are not enough.

Replay: each accepted proof's ``jti`` (with its key) is remembered until its ``iat`` leaves the window, in a
bounded in-process LRU; when the store is shared by replicas and offers :class:`OnceClaims` (Redis), the
claim is also made there, so a proof replayed to another replica is refused too.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from ..asgi import HeaderIndex, Scope
from ..core import errors
from ..core.dpop import (
    ALGORITHMS,
    NONCE_PERIOD,
    PROOF_ALGORITHMS,
    Proof,
    ProofRefusal,
    ReplayCache,
    accepted_nonces,
    server_nonce,
    verify_proof,
)
from ..core.principal import Grant
from ..stores.base import EventStore, StoreUnavailable
from . import metadata
from .errors import Refused


@dataclass(frozen=True, slots=True)
class DpopSettings:
    """``required``: only DPoP-bound tokens with proofs are honoured (``require_dpop``). ``nonce``: every proof
    must carry a current server nonce (``dpop_nonce``). ``window``: how far a proof's ``iat`` may be off the
    clock. ``replay_entries``: the replay cache's bound."""

    algorithms: tuple[str, ...] = ALGORITHMS
    window: float = 60.0
    required: bool = False
    nonce: bool = False
    replay_entries: int = 100_000

    def __post_init__(self) -> None:
        unsupported = set(self.algorithms) - PROOF_ALGORITHMS
        if unsupported or not self.algorithms:
            raise ValueError(f"dpop_algorithms must be a non-empty subset of {sorted(PROOF_ALGORITHMS)}")


@runtime_checkable
class OnceClaims(Protocol):
    """A store shared by replicas that can claim a name once (Redis ``SET NX PX``)."""

    async def claim_once(self, name: str, ttl_ms: int) -> bool:
        """True the first time ``name`` is claimed within ``ttl_ms``; False while an earlier claim lives."""
        ...


def _proof_headers(scope: Scope) -> list[bytes]:
    return [value for name, value in scope["headers"] if name.lower() == b"dpop"]


class DpopGuard:
    """The DPoP rules of one server; :meth:`check` raises the refusal, already carrying its challenges."""

    def __init__(
        self,
        settings: DpopSettings,
        store: EventStore,
        resource_metadata: str,
        *,
        public_url: str | None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.settings = settings
        self._store = store
        self._prm = resource_metadata
        self._public_url = public_url
        self._clock = clock
        self._replays = ReplayCache(settings.replay_entries, clock)
        self._shared = store if store.shared and isinstance(store, OnceClaims) else None
        self._nonce_key: bytes | None = None

    # -- what the server publishes -------------------------------------------------------------------

    def metadata(self) -> dict[str, object]:
        """The protected resource metadata members (RFC 9449 §5.2)."""
        members: dict[str, object] = {"dpop_signing_alg_values_supported": list(self.settings.algorithms)}
        if self.settings.required:
            members["dpop_bound_access_tokens_required"] = True
        return members

    def challenges(self, error: str | None, description: str | None, scheme: str = "dpop") -> list[tuple[bytes, bytes]]:
        """The ``WWW-Authenticate`` headers of a 401: a ``DPoP`` challenge with ``algs``, and a ``Bearer`` one
        first unless bearer tokens are refused here. The error goes on the challenge of ``scheme``, the one the
        client used (or should use)."""
        algs = self.settings.algorithms
        dpop_error = (error, description) if scheme == "dpop" else (None, None)
        out = [(b"www-authenticate", metadata.challenge(*dpop_error, self._prm, scheme="DPoP", algs=algs))]
        if not self.settings.required:
            bearer_error = (error, description) if scheme == "bearer" else (None, None)
            out.insert(0, (b"www-authenticate", metadata.challenge(*bearer_error, self._prm)))
        return out

    def refused(self, error: str, description: str, scheme: str = "dpop") -> Refused:
        headers = self.challenges(error, description, scheme)
        return Refused.rpc(401, errors.INVALID_REQUEST, description, headers=headers)

    # -- the check -----------------------------------------------------------------------------------

    async def check(self, scope: Scope, index: HeaderIndex, scheme: str, token: str, grant: Grant) -> None:
        """Raise the refusal unless this request may use ``grant``: presented as ``scheme`` (``bearer`` or
        ``dpop``, lowercase) with ``token``, and with the request's ``DPoP`` header (read from ``scope``: there may be
        several) and Host (from the header ``index`` its entry made)."""
        if scheme == "bearer":
            if grant.jkt is not None:
                raise self.refused("invalid_token", "a DPoP-bound token must be presented as 'Authorization: DPoP'")
            if self.settings.required:
                raise self.refused("invalid_token", "this server accepts DPoP-bound tokens only")
            return
        if grant.jkt is None:
            raise self.refused("invalid_token", "the token is not DPoP-bound: present it as a Bearer token")
        proofs = _proof_headers(scope)
        if len(proofs) != 1:
            raise self.refused("invalid_dpop_proof", "exactly one DPoP header is required")
        now = self._clock()
        nonces = accepted_nonces(await self._key(), NONCE_PERIOD, now) if self.settings.nonce else None
        result = verify_proof(
            proofs[0].decode("latin-1"),
            scope["method"],
            self._request_url(scope, index),
            token,
            now,
            nonces,
            grant.jkt,
            window=self.settings.window,
            algorithms=self.settings.algorithms,
        )
        if isinstance(result, ProofRefusal):
            raise await self._refusal(result, now)
        await self._first_use(result, now)

    async def _refusal(self, refusal: ProofRefusal, now: float) -> Refused:
        refused = self.refused(refusal.error, refusal.description)
        if refusal.error == "use_dpop_nonce":
            refused.headers.append((b"dpop-nonce", server_nonce(await self._key(), NONCE_PERIOD, now).encode()))
        return refused

    async def _first_use(self, proof: Proof, now: float) -> None:
        identity = hashlib.sha256(f"{proof.jkt}\0{proof.jti}".encode()).digest()[:20]
        until = proof.iat + self.settings.window + 1
        if not self._replays.first_use(identity, until):
            raise self.refused("invalid_dpop_proof", "this DPoP proof was used before (jti seen)")
        if self._shared is not None:
            ttl_ms = max(1, int((until - now) * 1000))
            try:
                first = await self._shared.claim_once("dpop-jti:" + identity.hex(), ttl_ms)
            except StoreUnavailable:
                raise Refused.rpc(
                    503, errors.INTERNAL_ERROR, "store unavailable; retry later", headers=[(b"retry-after", b"1")]
                ) from None
            if not first:
                raise self.refused("invalid_dpop_proof", "this DPoP proof was used before (jti seen)")

    def _request_url(self, scope: Scope, index: HeaderIndex) -> str:
        """The URL the client addressed: the configured public URL (behind a proxy), else what the request says
        (the Host/Origin check has already vetted the host)."""
        if self._public_url is not None:
            return self._public_url
        host = index.get(b"host", b"").decode("latin-1")
        return f"{scope.get('scheme', 'http')}://{host}{scope['path']}"

    async def _key(self) -> bytes:
        """The nonce MAC key, derived from the store's secret: replicas sharing a store share their nonces."""
        if self._nonce_key is None:
            secret = await self._store.secret()
            self._nonce_key = hashlib.sha256(b"mcp-lossless dpop nonce\0" + secret).digest()
        return self._nonce_key
