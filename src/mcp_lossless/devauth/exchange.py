"""RFC 8693 token exchange at the development AS: who may trade a user's token for one at another resource.

A gateway that calls an upstream on a user's behalf must not pass the user's token on (its audience is the
gateway), and must not call with its own identity either (the upstream would see one user, the gateway). It
trades the user's token here for one whose ``sub`` is still the user, whose ``aud`` is the upstream, and whose
``act`` names the gateway (RFC 8693 §4.1). What may be traded is a policy of the AS, not of the gateway:

- only a client the policy names may exchange (it authenticates as itself: it is the actor), and only for the
  audiences its rule lists; a rule may also list the subjects it may act for (the users who consented);
- the subject token must be an access token this AS issued, still valid;
- narrowing only: the scopes asked for must be held by the subject token, and the new token expires no later
  than the subject token does.

Nothing here speaks HTTP: :class:`~.grants.OAuthError` becomes the error response, :class:`Exchanged` the token.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any

from ..core.resources import InvalidResource, canonical_resource
from ..core.token_exchange import ACCESS_TOKEN_TYPE
from .forms import Params, optional, required
from .grants import OAuthError, narrow_scope


@dataclass(frozen=True, slots=True)
class ExchangeRule:
    """What one client may exchange for: ``audiences`` (resource URIs or logical names it may ask for) and, when
    given, only tokens of ``subjects`` (``None``: any user's)."""

    audiences: frozenset[str]
    subjects: frozenset[str] | None = None

    @classmethod
    def of(cls, audiences: Collection[str], subjects: Collection[str] | None = None) -> ExchangeRule:
        return cls(frozenset(_target(a) for a in audiences), None if subjects is None else frozenset(subjects))


@dataclass(frozen=True, slots=True)
class Exchanged:
    """The token to issue: the subject token's user, the exchanging client as actor, the narrowed grant."""

    subject: str
    actor: str
    audience: tuple[str, ...]
    scope: str
    expires_at: float


def _target(value: str) -> str:
    """A resource URI in its canonical form; a logical audience name (no scheme) as it is."""
    try:
        return canonical_resource(value)
    except InvalidResource:
        if "://" in value:
            raise
        return value


class ExchangePolicy:
    """The token-exchange grant of one AS: ``rules`` by exchanging client; ``verify`` gives a subject token's claims
    (signed by this AS, not expired) and raises ``invalid_grant`` for one it does not take."""

    def __init__(self, rules: Mapping[str, ExchangeRule], verify: Callable[[str], Mapping[str, Any]]) -> None:
        self._rules = dict(rules)
        self._verify = verify

    def __bool__(self) -> bool:
        return bool(self._rules)

    def exchange(self, client_id: str, params: Params) -> Exchanged:
        rule = self._rules.get(client_id)
        if rule is None:
            raise OAuthError("unauthorized_client", f"client {client_id!r} may not exchange tokens")
        if optional(params, "subject_token_type") != ACCESS_TOKEN_TYPE:
            raise OAuthError("invalid_request", f"subject_token_type must be {ACCESS_TOKEN_TYPE}")
        requested_type = optional(params, "requested_token_type")
        if requested_type not in (None, ACCESS_TOKEN_TYPE):
            raise OAuthError("invalid_request", f"requested_token_type must be {ACCESS_TOKEN_TYPE}")
        if "actor_token" in params:
            raise OAuthError("invalid_request", "actor_token is not supported: the authenticated client is the actor")
        claims = self._verify(required(params, "subject_token"))
        subject, held, expires = claims.get("sub"), claims.get("scope", ""), claims.get("exp")
        if not isinstance(subject, str) or not isinstance(held, str) or not isinstance(expires, int | float):
            raise OAuthError("invalid_grant", "subject_token lacks sub, scope or exp")
        if rule.subjects is not None and subject not in rule.subjects:
            raise OAuthError("invalid_grant", f"client {client_id!r} may not act for subject {subject!r}")
        try:
            targets = [_target(v) for v in (*params.get("resource", []), *params.get("audience", []))]
        except InvalidResource as exc:
            raise OAuthError("invalid_target", str(exc)) from None
        if not targets:
            raise OAuthError("invalid_target", "name the resource or audience the new token is for")
        refused = sorted(t for t in targets if t not in rule.audiences)
        if refused:
            raise OAuthError("invalid_target", f"client {client_id!r} may not exchange for {', '.join(refused)}")
        scope = narrow_scope(optional(params, "scope"), held)
        return Exchanged(subject, client_id, tuple(dict.fromkeys(targets)), scope, float(expires))
