"""The resume decision: what a GET with ``Last-Event-ID`` gets, from what the adapter has looked up.

Every rule of a resume lives here: the cursor table of ADR 0002, the replay planned against the resuming token
(ADR 0003), settling the stream of a producer that died, and what follows the replay. The transport only looks
things up and renders the outcome.

The decision is asked again as the facts fill in, the way h11's ``next_event`` answers ``NEED_DATA``: it returns
either a question (:class:`NeedStream`, :class:`NeedOwner`, :class:`SettleOrphan`, :class:`NeedEvents`) or an
outcome (:class:`CursorRejected`, :class:`~.replay.Refusal`, :class:`ReplayPlan`). Each question is asked at most
once per resume and only when its answer can change the outcome, so a malformed cursor costs no store read and a
stream this process produces costs no owner check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from .eventids import Cursor, CursorProblem, EventIdCodec, Unverified
from .events import RequestId, StoredEvent, StreamKind, StreamRecord, answered_in
from .principal import Grant
from .replay import Refusal, plan_replay
from .resources import AudiencePolicy

CURSOR_ECHO_CHARS = 200
"""How much of a rejected ``Last-Event-ID`` the refusal echoes back."""


class Lookup(Enum):
    """A fact not (yet) found."""

    PENDING = "pending"
    """Not looked up yet."""
    ABSENT = "absent"
    """Looked up and not there: no such stream, or its events after the cursor are no longer retained."""


class Tail(Enum):
    """What follows the replay on the same response."""

    LIVE = "live"
    """This process produces the stream: its events as they are published, until it ends."""
    REPLICA = "replica"
    """Another live process produces it: its events as the store has them, until it ends or its owner dies."""
    NONE = "none"
    """The stream has ended (or is a standalone GET stream of a process that is gone): the replay is all."""


@dataclass(slots=True)
class ResumeFacts:
    """What the adapter knows about one resume; it fills in what :func:`decide_resume` asks for."""

    session_id: str
    cursor: str
    """The ``Last-Event-ID`` as sent (stripped)."""
    decoded: Cursor | Unverified | CursorProblem
    """:meth:`~.eventids.EventIdCodec.decode` of ``cursor`` for ``session_id``."""
    record: StreamRecord | Lookup = Lookup.PENDING
    """The stream the cursor names: this process's live record, else the store's."""
    same_principal: bool | None = None
    """Whether ``record``'s session (another session) belongs to the resuming principal (``None``: not asked)."""
    live: bool = False
    """``record`` is a stream this process is producing (and can still end normally)."""
    owner_alive: bool | None = None
    """Whether another live process produces ``record`` (``None``: not asked)."""
    settled: bool = False
    """``record`` is what settling its orphaned stream left."""
    events: Sequence[StoredEvent] | Lookup = Lookup.PENDING
    """The stream's events after the cursor's position, or ``ABSENT`` when no longer retained."""


@dataclass(frozen=True, slots=True)
class NeedStream:
    """Look up stream ``stream``: among the session's live streams (one that is not broken), else in the store."""

    stream: str


@dataclass(frozen=True, slots=True)
class NeedSessionPrincipal:
    """Tell whether session ``session_id`` (not the resuming one) belongs to the resuming principal."""

    session_id: str


@dataclass(frozen=True, slots=True)
class NeedOwner:
    """Tell whether ``owner``, a process other than this one, is still alive (its lease)."""

    owner: str


@dataclass(frozen=True, slots=True)
class SettleOrphan:
    """The stream's producer died before answering: record EXECUTION_LOST for each unanswered request (or take
    what the replica that did so left), then decide again with that record."""

    record: StreamRecord


@dataclass(frozen=True, slots=True)
class NeedEvents:
    """Read the events of ``stream`` after position ``seq``."""

    stream: str
    seq: int


@dataclass(frozen=True, slots=True)
class CursorRejected:
    """The cursor cannot be resumed from; nothing is replayed. Not resumable: the client must not retry it."""

    problem: CursorProblem
    cursor: str
    held: str | None = None
    """For :attr:`~.eventids.CursorProblem.LOST`: the id of the last event the store still holds of the stream."""

    @property
    def status(self) -> int:
        return self.problem.status

    @property
    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "error": self.problem.value,
            "error_description": self.problem.description,
            "lastEventId": self.cursor[:CURSOR_ECHO_CHARS],
            "resumable": False,
        }
        if self.held is not None:
            body["heldEventId"] = self.held
        return body


@dataclass(frozen=True, slots=True)
class ReplayPlan:
    """Replay ``events``, then follow ``tail``; every event is covered by the resuming token."""

    cursor: Cursor
    record: StreamRecord
    events: Sequence[StoredEvent]
    tail: Tail
    settled: frozenset[RequestId]
    """Requests answered before the cursor: the client has their answers, so a later refusal does not name them."""
    covers_stream: bool
    """The token covers every tag set the stream can carry: live delivery need only check expiry."""


Question = NeedStream | NeedSessionPrincipal | NeedOwner | SettleOrphan | NeedEvents
Outcome = CursorRejected | Refusal | ReplayPlan


def stream_tags(record: StreamRecord) -> set[frozenset[str]]:
    """The tag sets a stream's events can carry: each event carries its request's resources, or none."""
    return {frozenset(), *(request.resources for request in record.requests)}


def held_event_id(cursor: str, decoded: Cursor, record: StreamRecord) -> str | None:
    """The id of the last event of ``record`` the store holds, with the MAC the verified ``cursor`` carries."""
    if record.last_seq < 0:
        return None
    return EventIdCodec.encode(decoded.stream, record.last_seq, cursor.rpartition(".")[2])


def decide_resume(facts: ResumeFacts, grant: Grant, policy: AudiencePolicy) -> Question | Outcome:
    """The next question to answer, or the outcome of the resume described by ``facts``."""
    decoded = facts.decoded
    if isinstance(decoded, CursorProblem):
        return CursorRejected(decoded, facts.cursor)
    record = facts.record
    if isinstance(decoded, Unverified):  # whose id it is decides between 400 and 409, never more
        if record is Lookup.PENDING:
            return NeedStream(decoded.stream)
        if record is Lookup.ABSENT:
            return CursorRejected(CursorProblem.UNKNOWN, facts.cursor)
        if record.session_id == facts.session_id:
            return CursorRejected(CursorProblem.FOREIGN_STREAM, facts.cursor)
        if facts.same_principal is None:
            return NeedSessionPrincipal(record.session_id)
        # Another principal's id is answered as an unknown one: the answer must not tell that it exists (invariant 4)
        problem = CursorProblem.FOREIGN_SESSION if facts.same_principal else CursorProblem.UNKNOWN
        return CursorRejected(problem, facts.cursor)
    if record is Lookup.PENDING:
        return NeedStream(decoded.stream)
    if record is Lookup.ABSENT:  # the MAC proves the stream was ours: its record is gone with its events
        return CursorRejected(CursorProblem.EVICTED, facts.cursor)
    if decoded.seq > record.last_seq:  # an id we sent (its MAC holds) that the store no longer has: it lost it
        return CursorRejected(CursorProblem.LOST, facts.cursor, held_event_id(facts.cursor, decoded, record))
    may_be_orphaned = not (facts.live or facts.settled or record.completed) and record.kind is StreamKind.POST
    if may_be_orphaned:
        if facts.owner_alive is None:
            return NeedOwner(record.owner)
        if not facts.owner_alive:
            return SettleOrphan(record)
    events = facts.events
    if events is Lookup.PENDING:
        return NeedEvents(decoded.stream, decoded.seq)
    if events is Lookup.ABSENT:
        return CursorRejected(CursorProblem.EVICTED, facts.cursor)
    tags = stream_tags(record)
    covers = policy.covers_all(grant.audience, tags, grant.scopes)
    if not covers:
        refusal = plan_replay(events, grant, policy, facts.cursor)
        if refusal is not None:
            return refusal
    if facts.live:
        tail = Tail.LIVE
    elif not record.completed and record.kind is StreamKind.POST:
        tail = Tail.REPLICA
    else:
        tail = Tail.NONE
    settled = record.answered.difference(answered_in(events))
    return ReplayPlan(decoded, record, events, tail, settled, covers)
