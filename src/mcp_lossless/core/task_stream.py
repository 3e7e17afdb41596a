"""Resumable task event streams (SEP-2694, experimental): a task's events, and who receives which of them.

A task's events (its status changes, progress, log messages, requests for input and its terminal outcome) are
kept as one stream of the event store, the task's own (:func:`stream_of`), at positions 0, 1, … which *are* the
SEP's ``seq``: the store's bounds, retention, per-principal accounting and gap-freedom apply unchanged
(docs/decisions/0031). ``tasks/stream {taskId, after?}`` replays what is retained after the cursor, then follows.

Every ``tasks/stream`` is decided by :func:`decide_task_stream` against the token of *that* request, exactly as a
``Last-Event-ID`` resume is (:func:`~mcp_lossless.core.resume.decide_resume`): who may see the task first (the
poll decision, so a foreign, expired, unknown id and a malformed cursor all get the one unknown-task answer),
then whether the store can prove the stream gap-free after the cursor (else ``events_gone``, never a shorter
stream), then each event against the token (the first uncovered one refuses the whole replay before any byte,
naming the missing resources and scopes and the cursor to resume from). Live events pass :func:`gate` one by one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

import orjson

from . import denials
from .errors import TASK_DENIED, TASK_EXECUTION_LOST
from .events import Loss, StoredEvent, StreamRecord
from .principal import Grant
from .resources import AudiencePolicy, describe, resources_in
from .tasks import Deliver, Denied, Unknown

STREAM_EXTENSION = "io.modelcontextprotocol/task-event-streams"
"""The experimental extension ``server/discover`` declares (SEP-2694 is a draft)."""
EVENTS_GONE = -32010
RELATED_TASK_META_KEY = "io.modelcontextprotocol/related-task"
TYPE_PREFIX = "io.github.mcp-lossless.task."


class EventType(Enum):
    """Our task event types: the SEP asks every implementation-defined type to carry a reverse-DNS prefix."""

    STATUS = TYPE_PREFIX + "status"
    """``{status, statusMessage?}``: the task's status changed (``working`` first, at seq 0)."""
    PROGRESS = TYPE_PREFIX + "progress"
    """``{progress, total?, message?}``: its tool reported progress."""
    LOG = TYPE_PREFIX + "log"
    """``{level, logger?, data}``: its tool logged."""
    INPUT_REQUIRED = TYPE_PREFIX + "input_required"
    """``{inputRequests}``: its tool asks the client (answer with ``tasks/update``)."""
    OUTCOME = TYPE_PREFIX + "outcome"
    """``{status, result | error}``: the terminal outcome, always the stream's last event."""


def stream_of(task_id: str) -> str:
    """The event-store stream (and session) holding a task's events: derived from the id, so any replica and
    any restart finds it without a lookup."""
    return f"task.{task_id}"


def event_message(task_id: str, seq: int, kind: EventType, payload: dict[str, Any]) -> bytes:
    """The ``notifications/tasks/event`` as stored and sent, byte for byte."""
    params = {
        "seq": seq,
        "taskId": task_id,
        "type": kind.value,
        "payload": payload,
        "_meta": {RELATED_TASK_META_KEY: {"taskId": task_id}},
    }
    return orjson.dumps({"jsonrpc": "2.0", "method": "notifications/tasks/event", "params": params})


# -- the decision ------------------------------------------------------------------------------------


@dataclass(slots=True)
class StreamFacts:
    """What the adapter knows about one ``tasks/stream``; it fills in what :func:`decide_task_stream` asks."""

    task_id: str
    after: object
    """The request's ``after`` as sent (``None``: absent)."""
    look: Unknown | Denied | Deliver
    """The poll decision for the task against this request's token."""
    record: StreamRecord | None = None
    read: bool = False
    """Whether ``record`` and ``events`` were read."""
    events: Sequence[StoredEvent] | None = None
    """The retained events after the cursor; ``None`` when the store no longer holds them all."""
    earliest: int | None = None
    """The first seq the store still holds (asked only once events are gone)."""


@dataclass(frozen=True, slots=True)
class NeedTaskEvents:
    """Read the task's stream record and its events after ``after`` (``EventsEvicted``: ``events = None``)."""

    stream: str
    after: int


@dataclass(frozen=True, slots=True)
class NeedEarliest:
    """Find the first seq the store still holds of ``stream`` (``None``: none)."""

    stream: str


@dataclass(frozen=True, slots=True)
class EventsGone:
    """``-32010 events_gone``: the store cannot prove the stream gap-free after the cursor."""

    task_id: str
    earliest: int | None


@dataclass(frozen=True, slots=True)
class StreamDenied:
    """The token does not cover (or no longer covers) an event: nothing of it is sent; resume from ``cursor``."""

    task_id: str
    missing: tuple[str, ...]
    cursor: int | None
    """The last seq delivered (or the request's ``after``): the client resumes ``after`` it."""
    expired: bool = False


class Then(Enum):
    """What follows the replay."""

    END = "end"
    """The terminal outcome was replayed: the empty result."""
    FOLLOW = "follow"
    """The task runs: follow its live events."""
    LOST = "lost"
    """The stream ended without its producer (ADR 0025): the explicit outcome from its record."""


@dataclass(frozen=True, slots=True)
class TaskReplay:
    events: Sequence[StoredEvent]
    then: Then
    loss: Loss | None = None


StreamOutcome = Unknown | StreamDenied | EventsGone | TaskReplay


def _cursor(after: object) -> int | None:
    """``after`` as the seq to read after (``-1`` for absent); ``None`` when malformed (negative, not an integer)."""
    if after is None:
        return -1
    if isinstance(after, int) and not isinstance(after, bool) and after >= 0:
        return after
    return None


def gate(
    event: StoredEvent, grant: Grant, policy: AudiencePolicy, now: float, cursor: int | None
) -> StreamDenied | None:
    """One event against the token of the ``tasks/stream`` that would carry it: ``None`` to deliver it, else the
    denial naming what is missing and the last seq delivered (an expired token refuses everything)."""
    task_id = str(event.request_id)
    if grant.expired(now):
        return StreamDenied(task_id, tuple(sorted(event.resources)), cursor, expired=True)
    missing = policy.missing(grant.audience, event.resources, grant.scopes)
    if missing:
        return StreamDenied(task_id, tuple(sorted(missing)), cursor)
    return None


def decide_task_stream(
    facts: StreamFacts, grant: Grant, policy: AudiencePolicy, now: float
) -> NeedTaskEvents | NeedEarliest | StreamOutcome:
    """The next question, or what a ``tasks/stream`` gets. Asked again as the facts fill in.

    The order is the rule: the cursor's form and the task's visibility before anything of the stream (a
    malformed cursor on any id, and any cursor on a foreign or unknown id, get the one unknown answer, so
    neither is an oracle); the task's coverage next (the poll's own denial, before any read); then whether the
    store holds everything after the cursor; then each retained event against the token.
    """
    cursor = _cursor(facts.after)
    task_id = facts.task_id
    if cursor is None or isinstance(facts.look, Unknown):
        return Unknown(task_id)
    after = None if facts.after is None else cursor
    if isinstance(facts.look, Denied):
        denied = facts.look
        missing = (*denied.missing_resources, *denied.missing_scopes)
        return StreamDenied(task_id, tuple(sorted(missing)), after)
    stream = stream_of(task_id)
    if not facts.read:
        return NeedTaskEvents(stream, cursor)
    record = facts.record
    if record is None:  # a task whose stream the store no longer holds (retention), or never held
        return EventsGone(task_id, None)
    if cursor > record.last_seq:
        if record.lost is Loss.STORE:  # the store lost events the client holds (ADR 0025)
            return EventsGone(task_id, None)
        return Unknown(task_id)  # a cursor this task never gave
    if facts.events is None:
        if facts.earliest is None:
            return NeedEarliest(stream)
        return EventsGone(task_id, facts.earliest)
    delivered = after
    for event in facts.events:
        refused = gate(event, grant, policy, now, delivered)
        if refused is not None:
            return refused
        delivered = event.seq
    if any(event.terminal for event in facts.events):
        return TaskReplay(facts.events, Then.END)
    if record.lost is not None:
        return TaskReplay(facts.events, Then.LOST, record.lost)
    if record.completed:  # ended with its outcome, which the cursor is past: nothing more to send
        return TaskReplay(facts.events, Then.END)
    return TaskReplay(facts.events, Then.FOLLOW)


# -- wire shapes ---------------------------------------------------------------------------------------


def events_gone_error(gone: EventsGone) -> dict[str, Any]:
    return {
        "code": EVENTS_GONE,
        "message": "Task events are no longer available",
        "data": {"reason": "events_gone", "taskId": gone.task_id, "earliestSeq": gone.earliest},
    }


def _reason(denied: StreamDenied) -> str:
    if denied.expired:
        return "token_expired"
    return "insufficient_audience" if resources_in(denied.missing) else "insufficient_scope"


def stream_denial_error(denied: StreamDenied) -> dict[str, Any]:
    """:data:`~mcp_lossless.core.errors.TASK_DENIED` for a task stream: the task is kept, nothing after ``lastSeq``
    was sent; re-authorize and call ``tasks/stream`` with ``after: lastSeq``."""
    what = "has expired" if denied.expired else f"does not cover {describe(denied.missing)}"
    resume = "from its start" if denied.cursor is None else f"after seq {denied.cursor}"
    data = denials.refusal_fields(
        denied.task_id,
        denied.missing,
        reason=_reason(denied),
        taskId=denied.task_id,
        lastSeq=denied.cursor,
        resumable=True,
    )
    message = f"task {denied.task_id} events not delivered: the token {what}; re-authorize and stream {resume}"
    return {"code": TASK_DENIED, "message": message, "data": data}


def lost_error(task_id: str, loss: Loss, cursor: int | None) -> dict[str, Any]:
    """The end of a task stream whose producer died or whose store lost events (ADR 0025): explicit, final."""
    if loss is Loss.OWNER:
        message = "execution lost: the process running this task ended before it finished; the tool may have run"
    else:
        message = "task events lost by the store (a failover to a replica that had not received them)"
    data = {"reason": loss.value, "taskId": task_id, "lastSeq": cursor, "resumable": False}
    return {"code": TASK_EXECUTION_LOST, "message": message, "data": data}
