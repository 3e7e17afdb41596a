"""Following a task by its event stream (SEP-2694): what the client does after each thing a ``tasks/stream`` says.

The modern client follows a task with ``tasks/stream`` when the server declares the extension, and carries out
the steps :func:`follow` decides; the rule lives here and only here, so the answers to "an event came", "the
stream broke", "the server refused" are one table rather than branches spread through the request loop.

The invariant it keeps is the server's own, seen from the other end: every event is handed to the caller exactly
once and in order. The cursor is the last ``seq`` *delivered* (not what the server believes it sent: a denial's
``lastSeq`` is advice), each resume asks for what follows it, a duplicate after a reconnect is dropped, and a
stream that skips ahead is never delivered with a hole: it is told as events gone, like the server's own
``events_gone``, and the task's outcome is then read with ``tasks/get``. ``tasks/get`` stays the authority for
whatever the stream cannot settle (an unknown task, a lost execution, a server that does not stream after all),
so the stream only ever makes a call faster and more informative, never ends it differently.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..core import denials
from ..core.errors import TASK_DENIED
from ..core.task_stream import EVENTS_GONE, EventType

MAX_STREAM_GRANTS = 2
"""Fresh grants in a row, with no event delivered between them, before a stream denial is final."""
RESUME_CEILING_SECONDS = 5.0
"""The longest wait before resuming a stream that keeps breaking with nothing delivered."""


@dataclass(frozen=True, slots=True)
class Following:
    """Where the client stands in one task's events."""

    task_id: str
    cursor: int | None = None
    """The last seq delivered to the caller (``None``: none yet): every ``tasks/stream`` asks for what follows it."""
    grants: int = 0
    """Fresh grants since the last delivered event."""
    cuts: int = 0
    """Broken streams in a row that delivered nothing: each resume waits longer."""


# -- what a stream says ----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Event:
    """A ``notifications/tasks/event``."""

    seq: int
    kind: str
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Ended:
    """The stream's empty result: the server has nothing more to send."""


@dataclass(frozen=True, slots=True)
class StreamRefusal:
    """An error answer, before the stream began (JSON, a 401/403 among them) or in band (its last message)."""

    code: int | None
    """The JSON-RPC error code; ``None`` when the answer was no JSON-RPC error at all."""
    message: str
    data: object
    challenged: frozenset[str] | None = None
    """The resources a ``WWW-Authenticate`` challenge named (``None``: no challenge came)."""


@dataclass(frozen=True, slots=True)
class Cut:
    """The stream broke before its answer (a reset, a timeout, a server gone)."""

    why: str


Said = Event | Ended | StreamRefusal | Cut


# -- what to do ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class HandOn:
    """Hand the event to the caller (progress, status, log, a request for input); the cursor is now its seq."""

    kind: str
    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Skip:
    """A seq already delivered (the SEP lets a server repeat after a reconnect): not handed on twice."""


@dataclass(frozen=True, slots=True)
class Finish:
    """The terminal outcome event: the call ends with it (``{status, result | error}``)."""

    payload: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class ResumeAfter:
    """Stream again after ``after``, once ``delay`` seconds passed."""

    after: int | None
    delay: float


@dataclass(frozen=True, slots=True)
class Regrant:
    """Get a fresh grant holding ``resources`` and ``scopes`` (echoing ``context``), then resume after ``after``."""

    after: int | None
    resources: frozenset[str]
    scopes: frozenset[str]
    context: str | None


@dataclass(frozen=True, slots=True)
class Gone:
    """The events after ``after`` cannot all be delivered (``earliest``: the first the server holds, if known):
    tell the caller so, explicitly, then read the task's outcome with ``tasks/get``."""

    after: int | None
    earliest: int | None


@dataclass(frozen=True, slots=True)
class Poll:
    """The stream cannot settle the call: ``tasks/get`` decides it (the task unknown, lost, not streamable…)."""

    why: str


@dataclass(frozen=True, slots=True)
class Fail:
    """The call ends as an authorization failure: re-authorizing cannot help, or did not."""

    why: str


Step = HandOn | Skip | Finish | ResumeAfter | Regrant | Gone | Poll | Fail


def follow(state: Following, said: Said) -> tuple[Following, Step]:
    """The next step after what a task's stream said, and where the client then stands."""
    match said:
        case Event(seq=seq, kind=kind, payload=payload):
            expected = 0 if state.cursor is None else state.cursor + 1
            if seq < expected:
                return state, Skip()
            if seq > expected:  # the server skipped retained events: never delivered with a hole
                return state, Gone(state.cursor, None)
            moved = Following(state.task_id, seq)
            if kind == EventType.OUTCOME.value:
                return moved, Finish(payload)
            return moved, HandOn(kind, payload)
        case Ended():
            return state, Poll("the task's event stream ended without its outcome")
        case Cut():
            delay = 0.0 if state.cuts == 0 else min(RESUME_CEILING_SECONDS, 0.25 * 2 ** (state.cuts - 1))
            return replace(state, cuts=state.cuts + 1), ResumeAfter(state.cursor, delay)
        case StreamRefusal(code=code, data=data, challenged=challenged):
            if code == EVENTS_GONE:
                earliest = data.get("earliestSeq") if isinstance(data, dict) else None
                return state, Gone(state.cursor, earliest if isinstance(earliest, int) else None)
            if code != TASK_DENIED and challenged is None:
                return state, Poll(f"tasks/stream answered {code}: {said.message}")
            helps = denials.remedy(data)
            if helps.reauthorize is False:
                return state, Fail(f"task {state.task_id}: refused, and the server says a new grant cannot help")
            if state.grants >= MAX_STREAM_GRANTS:
                return state, Fail(f"task {state.task_id}: events still refused after {MAX_STREAM_GRANTS} fresh grants")
            wanted = helps.resources | (challenged or frozenset())
            step = Regrant(state.cursor, wanted, helps.scopes, helps.context)
            return replace(state, grants=state.grants + 1), step
    raise AssertionError(f"unreachable: {said!r}")
