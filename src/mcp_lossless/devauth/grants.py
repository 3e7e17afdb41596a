"""RFC 8707 resource rules and the in-memory codes, grants and refresh tokens of the development AS.

Nothing here speaks HTTP: the server turns :class:`OAuthError` into an RFC 6749 error response and
:class:`Issue` into a signed access token.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from base64 import urlsafe_b64encode
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from ..core.resources import InvalidResource, canonical_resource

CODE_TTL = 60.0
PKCE_VERIFIER = re.compile(r"[A-Za-z0-9\-._~]{43,128}")
SWEEP_INTERVAL = 60.0
MAX_CODES = 1000
MAX_GRANTS = 5000
MAX_GRANTS_PER_CLIENT = 50
"""A client's oldest grant is revoked when it holds more; past ``MAX_GRANTS`` in all, new grants are refused."""


class OAuthError(Exception):
    """An RFC 6749 §5.2 error (``invalid_target`` from RFC 8707 §2)."""

    def __init__(self, error: str, description: str, status: int = 400, *, nonce: str | None = None) -> None:
        super().__init__(f"{error}: {description}")
        self.error = error
        self.description = description
        self.status = status
        self.nonce = nonce
        """A ``use_dpop_nonce`` error's fresh nonce, sent as ``DPoP-Nonce`` (RFC 9449 §8)."""


@dataclass(frozen=True, slots=True)
class Issue:
    """What the next access token says, and the refresh token that goes with it (if any)."""

    subject: str
    client_id: str
    audience: tuple[str, ...]
    scope: str
    refresh_token: str | None = None
    actor: str | None = None
    """A token exchange's actor (RFC 8693 §4.1 ``act``): the client acting for ``subject``."""
    not_after: float | None = None
    """The token must not outlive this (a token exchange's subject token's ``exp``)."""


class ResourceRules:
    """Which resource indicators exist and how a grant's audience narrows.

    A resource is *within* a grant when the grant names it, or when the grant names the aggregate (the MCP
    server's own URI) and the resource is one of its tools.
    """

    def __init__(
        self,
        resources: Callable[[], Collection[str]] | Collection[str],
        aggregate: str,
        *,
        least_privilege: bool,
        single_audience: bool,
    ) -> None:
        self._resources = resources
        self.aggregate = canonical_resource(aggregate)
        self.least_privilege = least_privilege
        self.single_audience = single_audience

    def tools(self) -> frozenset[str]:
        listed = self._resources() if callable(self._resources) else self._resources
        return frozenset(canonical_resource(r) for r in listed)

    def parse(self, values: Sequence[str]) -> tuple[str, ...]:
        """Canonical, de-duplicated, known indicators in request order, else ``invalid_target``."""
        known = self.tools() | {self.aggregate}
        out: list[str] = []
        for value in values:
            try:
                resource = canonical_resource(value)
            except InvalidResource as exc:
                raise OAuthError("invalid_target", str(exc)) from None
            if resource not in known:
                raise OAuthError("invalid_target", f"unknown resource indicator: {value!r}")
            if resource not in out:
                out.append(resource)
        return tuple(out)

    def check_within(self, requested: Sequence[str], granted: Sequence[str]) -> None:
        tools = self.tools() if self.aggregate in granted else frozenset()
        for resource in requested:
            if resource not in granted and resource not in tools:
                raise OAuthError("invalid_target", f"resource {resource!r} is not within the grant")

    def refresh_audience(self, requested: tuple[str, ...], granted: tuple[str, ...]) -> tuple[str, ...]:
        if not requested:
            return granted
        if self.least_privilege or self.aggregate not in granted or self.aggregate in requested:
            return requested
        return (*requested, self.aggregate)

    def consented(self, requested: tuple[str, ...], granted: tuple[str, ...], narrowed: bool) -> tuple[str, ...]:
        """What a code exchange asks for once the resource owner's choice is applied.

        When the owner approved only some of the aggregate's tools, the exchange that asks for the aggregate
        gets those tools (as RFC 6749 §3.3 lets an AS issue less scope than requested on the owner's
        instructions); anything else outside the grant stays ``invalid_target``. A later refresh cannot
        widen the grant (:meth:`GrantStore.refresh`).
        """
        if not narrowed or self.aggregate not in requested:
            return requested
        rest = tuple(r for r in requested if r != self.aggregate)
        return (*rest, *(r for r in granted if r not in rest))

    def check_single(self, audience: Sequence[str]) -> None:
        """Imitates ASes such as oidc-provider that put exactly one audience in a token."""
        if self.single_audience and len(audience) > 1:
            raise OAuthError(
                "invalid_target",
                "only a single resource indicator value may be requested or resolved per token request",
            )


def narrow_scope(requested: str | None, granted: str) -> str:
    if requested is None:
        return granted
    extra = set(requested.split()) - set(granted.split())
    if extra:
        raise OAuthError("invalid_scope", f"scope not granted: {' '.join(sorted(extra))}")
    return " ".join(requested.split())


def s256(verifier: str) -> str:
    return urlsafe_b64encode(hashlib.sha256(verifier.encode("ascii")).digest()).rstrip(b"=").decode("ascii")


@dataclass(slots=True)
class _Code:
    client_id: str
    redirect_uri: str
    challenge: str
    subject: str
    resources: tuple[str, ...]
    scope: str
    expires_at: float
    narrowed: bool = False
    """The resource owner approved less than the request asked for."""
    grant_id: str | None = None  # set once redeemed, so a replay can revoke what it produced


def _binding_mismatch(record: _Code, client_id: str, redirect_uri: str, verifier: str) -> str | None:
    if record.client_id != client_id:
        return "authorization code was issued to another client"
    if record.redirect_uri != redirect_uri:
        return "redirect_uri differs from the authorization request"
    if not PKCE_VERIFIER.fullmatch(verifier):
        return "code_verifier must be 43-128 characters of [A-Za-z0-9-._~] (RFC 7636)"
    if not hmac.compare_digest(s256(verifier), record.challenge):
        return "code_verifier does not match the code_challenge (PKCE)"
    return None


@dataclass(slots=True)
class _Grant:
    client_id: str
    subject: str
    resources: tuple[str, ...]
    scope: str
    rotates: bool
    narrowed: bool
    expires_at: float
    """A grant ends at a fixed time however often its refresh token rotates."""
    refresh_tokens: list[str] = field(default_factory=list)
    jkt: str | None = None
    """The DPoP key a public client's refresh tokens are bound to (RFC 9449 §5): a refresh needs a proof by it."""


@dataclass(slots=True)
class _Refresh:
    grant_id: str
    expires_at: float
    rotated: bool = False


class GrantStore:
    """Authorization codes (single use, PKCE-bound) and refresh-token grants, all in memory."""

    def __init__(self, rules: ResourceRules, *, refresh_ttl: float, clock: Callable[[], float]) -> None:
        self._rules = rules
        self._refresh_ttl = refresh_ttl
        self._clock = clock
        self._codes: dict[str, _Code] = {}
        self._grants: dict[str, _Grant] = {}
        self._refresh: dict[str, _Refresh] = {}
        self._swept_at = clock()

    def issue_code(
        self,
        *,
        client_id: str,
        redirect_uri: str,
        challenge: str,
        subject: str,
        resources: tuple[str, ...],
        scope: str,
        narrowed: bool = False,
    ) -> str:
        self._sweep(force=len(self._codes) >= MAX_CODES)
        if len(self._codes) >= MAX_CODES:
            raise OAuthError("temporarily_unavailable", f"{MAX_CODES} authorization codes outstanding; retry later")
        code = secrets.token_urlsafe(32)
        expires_at = self._clock() + CODE_TTL
        self._codes[code] = _Code(client_id, redirect_uri, challenge, subject, resources, scope, expires_at, narrowed)
        return code

    def exchange_code(
        self,
        code: str,
        *,
        client_id: str,
        redirect_uri: str,
        verifier: str,
        requested: tuple[str, ...],
        scope: str | None,
        public_client: bool,
        jkt: str | None = None,
    ) -> Issue:
        """A binding mismatch burns the code; a bad ``resource`` or ``scope`` leaves it usable."""
        self._sweep()
        record = self._codes.get(code)
        if record is None or record.expires_at <= self._clock():
            raise OAuthError("invalid_grant", "authorization code is unknown or expired")
        if record.grant_id is not None:
            self._revoke(record.grant_id)
            raise OAuthError("invalid_grant", "authorization code was already used; its tokens are revoked")
        mismatch = _binding_mismatch(record, client_id, redirect_uri, verifier)
        if mismatch is not None:
            del self._codes[code]
            raise OAuthError("invalid_grant", mismatch)
        requested = self._rules.consented(requested, record.resources, record.narrowed)
        self._rules.check_within(requested, record.resources)
        audience = requested or record.resources
        self._rules.check_single(audience)
        granted_scope = narrow_scope(scope, record.scope)
        grant_id = self._new_grant(
            _Grant(
                client_id,
                record.subject,
                record.resources,
                record.scope,
                public_client,
                record.narrowed,
                self._clock() + self._refresh_ttl,
                jkt=jkt if public_client else None,
            )
        )
        record.grant_id = grant_id
        return Issue(record.subject, client_id, audience, granted_scope, self._new_refresh(grant_id))

    def refresh(
        self, token: str, *, client_id: str, requested: tuple[str, ...], scope: str | None, jkt: str | None = None
    ) -> Issue:
        """Narrow (never widen) the grant's audience; rotate the token for public clients. A public client's grant
        obtained with DPoP refreshes only with a proof by the same key (``jkt``): a stolen refresh token is useless."""
        self._sweep()
        record = self._refresh.get(token)
        grant = self._grants.get(record.grant_id) if record is not None else None
        now = self._clock()
        if record is None or grant is None or record.expires_at <= now or grant.expires_at <= now:
            raise OAuthError("invalid_grant", "refresh token is unknown, expired or revoked")
        if grant.client_id != client_id:
            raise OAuthError("invalid_grant", "refresh token was issued to another client")
        if grant.jkt is not None and jkt != grant.jkt:
            raise OAuthError("invalid_grant", "refresh token is bound to a DPoP key this request does not prove")
        if record.rotated:
            self._revoke(record.grant_id)
            raise OAuthError("invalid_grant", "refresh token was already used; its grant is revoked")
        try:
            self._rules.check_within(requested, grant.resources)
        except OAuthError as exc:
            if not grant.narrowed:
                raise
            # What the owner declined needs the owner again: invalid_grant makes stock clients (TS SDK,
            # mcp-remote) drop the refresh token and re-authorize, where invalid_target would end the call.
            raise OAuthError("invalid_grant", f"{exc.description}: the resource owner declined it") from None
        audience = self._rules.refresh_audience(requested, grant.resources)
        self._rules.check_single(audience)
        granted_scope = narrow_scope(scope, grant.scope)
        if grant.rotates:
            record.rotated = True
            token = self._new_refresh(record.grant_id)
        return Issue(grant.subject, client_id, audience, granted_scope, token)

    def _new_grant(self, grant: _Grant) -> str:
        """Store ``grant`` within the bounds: a client's oldest grant goes first; the total is capped."""
        self._sweep(force=len(self._grants) >= MAX_GRANTS)
        own = [gid for gid, g in self._grants.items() if g.client_id == grant.client_id]
        for grant_id in own[: max(0, len(own) - MAX_GRANTS_PER_CLIENT + 1)]:
            self._revoke(grant_id)
        if len(self._grants) >= MAX_GRANTS:
            raise OAuthError("temporarily_unavailable", f"{MAX_GRANTS} grants outstanding; retry later")
        grant_id = secrets.token_urlsafe(16)
        self._grants[grant_id] = grant
        return grant_id

    def __len__(self) -> int:
        """Grants held (tests check the bounds with it)."""
        return len(self._grants)

    def _new_refresh(self, grant_id: str) -> str:
        token = secrets.token_urlsafe(32)
        grant = self._grants[grant_id]
        self._refresh[token] = _Refresh(grant_id, min(self._clock() + self._refresh_ttl, grant.expires_at))
        self._grants[grant_id].refresh_tokens.append(token)
        return token

    def _revoke(self, grant_id: str) -> None:
        grant = self._grants.pop(grant_id, None)
        for token in grant.refresh_tokens if grant is not None else ():
            self._refresh.pop(token, None)

    def _sweep(self, force: bool = False) -> None:
        """Drop expired codes and grants now and then (or now, at a bound), so a long dev session stays small."""
        now = self._clock()
        if not force and now - self._swept_at < SWEEP_INTERVAL:
            return
        self._swept_at = now
        self._codes = {c: r for c, r in self._codes.items() if r.expires_at > now}
        self._refresh = {t: r for t, r in self._refresh.items() if r.expires_at > now}
        for grant_id, grant in list(self._grants.items()):
            grant.refresh_tokens = [t for t in grant.refresh_tokens if t in self._refresh]
            if not grant.refresh_tokens or grant.expires_at <= now:
                del self._grants[grant_id]
