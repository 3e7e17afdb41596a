"""Request idempotency keys (SEP-3182): what a repeated ``tools/call`` key gets, decided once, without I/O.

A key names the stream (legacy, or a 2026-07-28 call answered inline) or the task that ran its first use. Its
identity is the principal (issuer, subject, client) and the key string: another principal's same string is another
key, so a key is no oracle and never hands one principal another's outcome (invariant 4). The store keeps one
:class:`KeyRecord` per key, written in the same commit as the call's stream record, so a key is recorded before its
tool starts; the outcome is the stream's own answer event (or the task's state), never a second record.

:func:`decide_duplicate` takes what the adapter found (the record, the state of what it names, the request's tool,
argument hash and requirement, the request's grant) and returns exactly one :data:`DuplicateVerdict`:

- :class:`Run`: no record (or an expired one, or another principal's): a first use.
- :class:`Refuse`: the duplicate's token does not cover the tool: the standard coverage refusal, before any byte,
  and the key stays usable for a covering retry (invariant 1).
- :class:`Conflict`: the key was used with another tool or other arguments (SEP: ``idempotency_key_conflict``).
- :class:`Replay`: the recorded outcome, errors included, without running the tool; for a task, the same task.
- :class:`InProgress`: the first use still runs (SEP: ``idempotency_key_in_progress``, with ``retryAfter`` and,
  for a legacy stream, the last event id to resume it by).
- :class:`Settle`: the first use's owner died before answering: the adapter ends its stream as lost (ADR 0025)
  and asks again, so a dead owner's key is never "in progress" forever.
- :class:`Lost`: the first use's execution was lost (or its outcome is no longer held): the execution-lost error
  naming the key, never a second run.

:func:`argument_hash` compares arguments as parsed JSON values (SEP "Request equivalence"): key order and
serialization do not matter, ``1`` equals ``1.0``, and escapes are whatever parsing made of them.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, NamedTuple

import orjson

from .errors import EXECUTION_LOST, IDEMPOTENCY_IN_PROGRESS, INVALID_PARAMS
from .principal import Grant, Principal
from .resources import AudiencePolicy

KEY_PARAM = "idempotencyKey"
"""Where a ``tools/call`` carries its key (SEP-3182: in ``params``, not ``_meta``)."""
CAPABILITY = "idempotency"
"""The server capability under ``tools`` (``server/discover``, and here the legacy ``initialize`` result too)."""
IN_PROGRESS = "idempotency_key_in_progress"
CONFLICT = "idempotency_key_conflict"
MAX_KEY_CHARS = 255
"""Stripe's bound: a UUID fits many times over, and a key record stays small enough to bound per principal."""
RETRY_AFTER_SECONDS = 1
"""What an in-progress answer asks the client to wait: a call answering at once is done within it."""
REPLAYED_META_KEY = "io.github.mcp-lossless/replayed"
"""Set (``true``) in the ``_meta`` of a result this server replayed for a key rather than ran: the SEP replays the
outcome unchanged, and this says so, so that a client can tell its user the tool did not run again."""
CONTINUATION_PARAMS = ("requestState", "inputResponses")
"""A ``tools/call`` carrying these continues a multi round-trip call (SEP-2322): out of the SEP's scope."""


def declared(capabilities: Mapping[str, Any]) -> bool:
    """Whether a server's capabilities (``server/discover``'s, or the legacy ``initialize`` result's) declare
    ``tools.idempotency``: only then does a client rely on a key (the SEP: sending one elsewhere guarantees nothing)."""
    tools = capabilities.get("tools")
    return isinstance(tools, dict) and isinstance(tools.get(CAPABILITY), dict)


class InvalidKey(ValueError):
    """An ``idempotencyKey`` that is not a non-empty string of at most :data:`MAX_KEY_CHARS` characters."""


_CONTINUATIONS = frozenset(CONTINUATION_PARAMS)


def key_of(params: Mapping[str, Any]) -> str | None:
    """The key a ``tools/call``'s params carry, ``None`` when there is none or it continues a multi round-trip call
    (the SEP leaves continuations out; the continuation names its call by ``requestState`` already)."""
    if KEY_PARAM not in params or not _CONTINUATIONS.isdisjoint(params):  # one C call, no generator
        return None
    key = params[KEY_PARAM]
    if not isinstance(key, str) or not key or len(key) > MAX_KEY_CHARS:
        raise InvalidKey(f"{KEY_PARAM} must be a non-empty string of at most {MAX_KEY_CHARS} characters")
    return key


# ---- canonical arguments -----------------------------------------------------------------------------


def _canonical(value: Any) -> Any:
    """``value`` with every integral float made an int, so that equal numbers serialize alike (1 == 1.0)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


def _reference_text(arguments: Any) -> bytes:
    """The canonical serialization, defined: keys sorted, no whitespace, integral floats as ints (a bool stays a
    bool: ``True`` is not ``1``), a non-integral float as its shortest round-trip form (one text per value),
    strings as their parsed code points."""
    text = json.dumps(_canonical(arguments), sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return text.encode("utf-8", errors="surrogatepass")


_FLOAT_MARKS = re.compile(rb"\.|e[+-]")
"""What every float ``orjson`` writes contains (``1.0``, ``1e+16``, ``1.5e-7``), and no other token it writes."""
_POINT = re.compile(rb"\.")
_EXPONENT = re.compile(rb"e[+-]")
""":data:`_FLOAT_MARKS` as two searches, each led by a literal (a fast scan for one byte): together about half the
instructions of the alternation, which tries both branches at every position (~4,000 instructions a keyed call).
(``mark in text`` for each mark first tries each mark as an integer, an exception raised and cleared each time.)"""
_STRINGS = re.compile(rb'"(?:[^"\\]|\\.)*"')
"""A JSON string as ``orjson`` writes it: what may hold those marks without being a float."""


def canonical_text(arguments: Any) -> bytes:
    """:func:`_reference_text`, by ``orjson`` when the value holds no float (the common case; ~7x faster: a
    keyed call's budget is 10 % of an unkeyed one's CPU): for every other JSON value the two write the same bytes
    (each string escaped alike, keys in code-point order, integers alike), so a hash stored before is unchanged.
    A float (or an integer past 64 bits, a lone surrogate, which ``orjson`` refuses) takes the reference."""
    try:
        text = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # orjson.JSONEncodeError is one
        return _reference_text(arguments)
    if (_POINT.search(text) is not None or _EXPONENT.search(text) is not None) and _FLOAT_MARKS.search(
        _STRINGS.sub(b"", text)
    ) is not None:
        return _reference_text(arguments)  # a float outside every string
    return text


def argument_hash(arguments: Any) -> str:
    """The SHA-256 of the arguments' canonical serialization (:func:`canonical_text`): equal exactly when the
    parsed values are equal."""
    return hashlib.sha256(canonical_text(arguments)).hexdigest()


# ---- what the adapter finds --------------------------------------------------------------------------


class StreamTarget(NamedTuple):
    """A first use that runs on a stream: a legacy POST's, or a 2026-07-28 call answered inline. (A named tuple,
    as :class:`KeyRecord`.)"""

    stream: str
    request_id: str | int


@dataclass(frozen=True, slots=True)
class TaskTarget:
    """A first use whose call became a task: a duplicate gets the same task."""

    task_id: str


Target = StreamTarget | TaskTarget


class KeyRecord(NamedTuple):
    """One key's first use, stored with the call's stream record (the outcome is that stream's answer). A named
    tuple, not a frozen dataclass: one is made for every keyed call, and a frozen dataclass's ``__init__`` sets
    each field through ``object.__setattr__`` (with its target, ~2.3 µs against ~0.5 µs)."""

    principal: Principal
    key: str
    tool: str
    arguments_hash: str
    target: Target
    created: float
    expires: float


class TargetState(Enum):
    """What became of the stream or task a key names."""

    ANSWERED = "answered"
    """The request's answer (result or error) is stored."""
    RUNNING = "running"
    """No answer yet, and the owner lives."""
    OWNER_DEAD = "owner_dead"
    """No answer, and the process that ran it is gone: not yet settled as lost."""
    LOST = "lost"
    """Ended without its producer (ADR 0025): no answer will ever come."""
    GONE = "gone"
    """The store no longer holds the stream or task (trimmed, expired): its outcome is unknown."""


@dataclass(frozen=True, slots=True)
class DuplicateFacts:
    record: KeyRecord | None
    state: TargetState | None
    """The state of ``record.target``; ``None`` when there is no record."""
    tool: str
    arguments_hash: str
    required: frozenset[str]
    """The tags a token must cover to call ``tool`` (its resources and scope tags)."""
    now: float
    last_event_id: str | None = None
    """For a running legacy stream: the last event id it holds, for the same principal to resume from."""


# ---- verdicts ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Run:
    """A first use: record the key with the call's stream record and run the tool."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """The duplicate's token lacks ``missing``: the standard coverage refusal; the key is untouched."""

    missing: frozenset[str]


@dataclass(frozen=True, slots=True)
class Conflict:
    key: str

    def error(self) -> dict[str, Any]:
        return {
            "code": INVALID_PARAMS,
            "message": f"idempotency key {self.key!r} was used with another tool or other arguments",
            "data": {"type": CONFLICT, KEY_PARAM: self.key},
        }


@dataclass(frozen=True, slots=True)
class Replay:
    """Answer with the recorded outcome of ``target`` (for a task: the task itself), without running the tool."""

    target: Target


@dataclass(frozen=True, slots=True)
class InProgress:
    key: str
    retry_after: int
    last_event_id: str | None

    def error(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": IN_PROGRESS, KEY_PARAM: self.key, "retryAfter": self.retry_after}
        if self.last_event_id is not None:
            data["lastEventId"] = self.last_event_id
        return {
            "code": IDEMPOTENCY_IN_PROGRESS,
            "message": f"a request with idempotency key {self.key!r} is still running; retry after "
            f"{self.retry_after} s" + (" or resume its stream" if self.last_event_id is not None else ""),
            "data": data,
        }


@dataclass(frozen=True, slots=True)
class Settle:
    """The owner of ``target`` died before answering: end it as lost (``mark_lost``), then decide again."""

    target: StreamTarget


@dataclass(frozen=True, slots=True)
class Lost:
    key: str
    reason: str
    """``execution_lost`` (its process died during the run) or ``outcome_gone`` (no longer held)."""

    def error(self) -> dict[str, Any]:
        what = "its execution was lost" if self.reason == "execution_lost" else "its outcome is no longer held"
        return {
            "code": EXECUTION_LOST,
            "message": f"the request with idempotency key {self.key!r} is not run again: {what}; it may have run",
            "data": {"reason": self.reason, KEY_PARAM: self.key, "resumable": False},
        }


DuplicateVerdict = Run | Refuse | Conflict | Replay | InProgress | Settle | Lost


def decide_duplicate(facts: DuplicateFacts, grant: Grant, policy: AudiencePolicy) -> DuplicateVerdict:
    """The one decision for a keyed ``tools/call`` (see the module's docstring for the verdicts)."""
    record = facts.record
    if record is None or record.principal != grant.principal or record.expires <= facts.now:
        return Run()
    missing = policy.missing(grant.audience, facts.required, grant.scopes)
    if missing:
        return Refuse(missing)
    if record.tool != facts.tool or record.arguments_hash != facts.arguments_hash:
        return Conflict(record.key)
    state = facts.state
    if state is TargetState.GONE or state is None:
        return Lost(record.key, "outcome_gone")
    if isinstance(record.target, TaskTarget):
        return Replay(record.target)  # the task answers for itself: its poll settles a dead owner's task
    match state:
        case TargetState.ANSWERED:
            return Replay(record.target)
        case TargetState.RUNNING:
            return InProgress(record.key, RETRY_AFTER_SECONDS, facts.last_event_id)
        case TargetState.OWNER_DEAD:
            return Settle(record.target)
        case TargetState.LOST:
            return Lost(record.key, "execution_lost")
