"""Replay planning and live delivery checks against the token of the *resuming* request.

Invariant 1: every event a token would receive must be covered by its audience and its scopes. Invariant 2: an event
that cannot be delivered stops the stream with an explicit, resumable error; the cursor stays on the
last delivered event.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum

from .events import EventRows, RequestId, StoredEvent
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


class Coverage:
    """What one token lacks for each tag set, computed once per distinct (interned) set.

    The one place replay planning and live delivery ask the policy; both scan events through
    :meth:`uncovered`.
    """

    __slots__ = ("_audience", "_memo", "_policy", "_scopes")

    def __init__(self, grant: Grant, policy: AudiencePolicy) -> None:
        self._audience = grant.audience
        self._scopes = grant.scopes
        self._policy = policy
        self._memo: dict[frozenset[str], frozenset[str]] = {}

    def gap(self, tags: frozenset[str]) -> frozenset[str]:
        gap = self._memo.get(tags)
        if gap is None:
            gap = self._memo[tags] = self._policy.missing(self._audience, tags, self._scopes)
        return gap

    def uncovered(self, events: Sequence[StoredEvent]) -> Iterator[tuple[int, frozenset[str]]]:
        """``(index, gap)`` for each event that starts a run of one tag set the token does not cover.

        Runs of one tool share one interned set, so an event whose set is the previous one's is passed over
        with an identity test (rows of :class:`~.events.EventRows`: an equality test of their index into its
        table, which holds each set once). The first pair yielded is the first event the token lacks something for; the
        union of the gaps yielded is everything it lacks for ``events``.
        """
        if type(events) is EventRows:  # a run is one index into the rows' table, which holds each set once
            tags_of, last_index = events.tags, -1
            for index, row in enumerate(events.rows):
                tag_index = row[4]
                if tag_index == last_index:
                    continue
                last_index = tag_index
                gap = self.gap(tags_of[tag_index])
                if gap:
                    yield index, gap
            return
        last_tags: frozenset[str] | None = None
        for index, event in enumerate(events):
            tags = event.resources
            if tags is last_tags:
                continue
            last_tags = tags
            gap = self.gap(tags)
            if gap:
                yield index, gap


def plan_replay(
    events: Sequence[StoredEvent],
    grant: Grant,
    policy: AudiencePolicy,
    cursor: str,
    stream_tags: Collection[frozenset[str]] | None = None,
) -> Refusal | None:
    """Decide a replay before any byte is sent: ``None`` to deliver all, else the refusal.

    ``missing`` lists all resources lacking across the remaining events, so one re-authorization
    suffices. ``stream_tags`` are the tag sets the stream's events can carry (each event carries its
    request's resources, or none): when the token covers all of them, no event needs a look. Otherwise each
    event is checked, memoized per tag set (events of one tool share one interned frozenset).
    """
    if stream_tags is not None and policy.covers_all(grant.audience, stream_tags, grant.scopes):
        return None  # every tag set the stream can carry is covered: no per-event work
    first: StoredEvent | None = None
    lacking: set[str] = set()
    for index, gap in Coverage(grant, policy).uncovered(events):
        if first is None:
            first = events[index]
        lacking |= gap
    if first is None:
        return None
    return Refusal(
        RefusalReason.INSUFFICIENT_AUDIENCE, first.event_id, first.request_id, tuple(sorted(lacking)), cursor
    )


class DeliveryGate:
    """Checks the live events of a committed stream against the stream's token before each write."""

    __slots__ = ("_coverage", "_grant", "_leeway", "last_delivered")

    def __init__(
        self,
        grant: Grant,
        policy: AudiencePolicy,
        cursor: str | None,
        leeway: float = 0.0,
        covers_stream: bool = False,
    ) -> None:
        self._grant = grant
        self._leeway = leeway
        self.last_delivered = cursor
        self._coverage = None if covers_stream else Coverage(grant, policy)
        """``None`` when the token covers every tag set the stream can carry (:meth:`AudiencePolicy.covers_all`, or
        a POST whose calls were all admitted): only expiry is left to check per write."""

    def admit(self, events: Sequence[StoredEvent], now: float) -> tuple[int, Refusal | None]:
        """How many of ``events`` (a prefix) may be sent now, and the refusal for the first that may not.

        The cursor moves to the last admitted event. A batch is sent at one instant, so expiry is checked
        once per batch; coverage once per distinct tag set, and per event only to find a refused one.
        """
        if not events:
            return 0, None
        if self._grant.expired(now, self._leeway):
            first = events[0]
            missing = tuple(sorted(first.resources))
            return 0, Refusal(
                RefusalReason.TOKEN_EXPIRED, first.event_id, first.request_id, missing, self.last_delivered
            )
        coverage = self._coverage
        if coverage is not None:
            for index, gap in coverage.uncovered(events):
                if index:
                    self.last_delivered = events[index - 1].event_id
                event = events[index]
                reason = RefusalReason.INSUFFICIENT_AUDIENCE
                missing = tuple(sorted(gap))
                return index, Refusal(reason, event.event_id, event.request_id, missing, self.last_delivered)
        self.last_delivered = events[-1].event_id
        return len(events), None
