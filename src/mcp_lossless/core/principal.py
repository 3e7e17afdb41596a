"""Who a token speaks for. Sessions and event ids are bound to this, never to token bytes."""

from __future__ import annotations

from dataclasses import dataclass

from .resources import Audience


@dataclass(frozen=True, slots=True)
class Principal:
    issuer: str
    subject: str
    client_id: str


ANONYMOUS = Principal(issuer="", subject="anonymous", client_id="")


@dataclass(frozen=True, slots=True)
class Grant:
    """A verified access token as the server sees it: who, for which resources, until when."""

    principal: Principal
    audience: Audience
    expires_at: float | None = None
    scopes: frozenset[str] = frozenset()
    jkt: str | None = None
    """The RFC 7638 thumbprint of the key the token is bound to (its ``cnf.jkt``, RFC 9449 §6): a bound token is
    honoured only with a DPoP proof signed by that key, on every request (resumes and task polls included)."""

    def expired(self, now: float, leeway: float = 0.0) -> bool:
        return self.expires_at is not None and now > self.expires_at + leeway
