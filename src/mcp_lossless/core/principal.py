"""Who a token speaks for. Sessions and event ids are bound to this, never to token bytes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from .resources import Audience


class Principal(NamedTuple):
    """Who a token speaks for: its issuer, subject and client.

    A named tuple, not a frozen dataclass: a principal is a dict key on the per-event path (what it makes the
    store hold is looked up for every event, :meth:`~..stores.base.EventStore.stored_bytes`), and a tuple hashes
    and compares in C, where a dataclass runs a generated Python ``__hash__`` that builds a tuple each time (about
    2,000 instructions an event). Two principals are equal exactly when their three fields are.
    """

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
