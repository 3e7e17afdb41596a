"""Replay planning and live delivery checks against the token of the *resuming* request.

Invariant 1: every event a token would receive must be covered by its audience. Invariant 2: an event
that cannot be delivered stops the stream with an explicit, resumable error; the cursor stays on the
last delivered event.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum

from .events import RequestId, StoredEvent
from .principal import Grant
from .resources import AudiencePolicy


class RefusalReason(Enum):
    INSUFFICIENT_AUDIENCE = "insufficient_audience"
    TOKEN_EXPIRED = "token_expired"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why delivery stops: the first undeliverable event and every resource the token lacks."""

    reason: RefusalReason
    event_id: str
    request_id: RequestId | None
    missing: tuple[str, ...]
    cursor: str | None
    """The ``Last-Event-ID`` to resume from: the last event actually delivered (unchanged on refusal)."""


def plan_replay(events: Iterable[StoredEvent], grant: Grant, policy: AudiencePolicy, cursor: str) -> Refusal | None:
    """Decide a replay before any byte is sent: ``None`` to deliver all, else the refusal.

    ``missing`` lists all resources lacking across the remaining events, so one re-authorization
    suffices. Coverage is memoized per tag set: events of one tool share one interned frozenset.
    """
    audience = grant.audience
    memo: dict[frozenset[str], frozenset[str]] = {}
    first: StoredEvent | None = None
    lacking: set[str] = set()
    for event in events:
        tags = event.resources
        gap = memo.get(tags)
        if gap is None:
            gap = memo[tags] = policy.missing(audience, tags)
        if gap:
            if first is None:
                first = event
            lacking |= gap
    if first is None:
        return None
    return Refusal(
        RefusalReason.INSUFFICIENT_AUDIENCE, first.event_id, first.request_id, tuple(sorted(lacking)), cursor
    )


class DeliveryGate:
    """Checks each live event of a committed stream against the stream's token, one event at a time."""

    __slots__ = ("_grant", "_leeway", "_memo", "_policy", "last_delivered")

    def __init__(self, grant: Grant, policy: AudiencePolicy, cursor: str | None, leeway: float = 0.0) -> None:
        self._grant = grant
        self._policy = policy
        self._leeway = leeway
        self._memo: dict[frozenset[str], frozenset[str]] = {}
        self.last_delivered = cursor

    def check(self, event: StoredEvent, now: float) -> Refusal | None:
        """``None`` if ``event`` may be sent now (the caller then calls :meth:`delivered`)."""
        if self._grant.expired(now, self._leeway):
            return Refusal(
                RefusalReason.TOKEN_EXPIRED,
                event.event_id,
                event.request_id,
                tuple(sorted(event.resources)),
                self.last_delivered,
            )
        tags = event.resources
        gap = self._memo.get(tags)
        if gap is None:
            gap = self._memo[tags] = self._policy.missing(self._grant.audience, tags)
        if gap:
            return Refusal(
                RefusalReason.INSUFFICIENT_AUDIENCE,
                event.event_id,
                event.request_id,
                tuple(sorted(gap)),
                self.last_delivered,
            )
        return None

    def delivered(self, event: StoredEvent) -> None:
        self.last_delivered = event.event_id
