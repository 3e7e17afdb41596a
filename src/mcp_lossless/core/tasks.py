"""Tasks (the ``io.modelcontextprotocol/tasks`` extension): their state machine, their lifetime, who may see them.

A task is bound to the principal that created it and records what a token must cover to receive its state:
its tool's resources (and scopes). ``tasks/get`` names only the task id, never the tool, so every look at a task
(poll, update, cancel, subscription, push) is decided here by :func:`decide_poll`, against the token of *that*
request (invariant 1), to exactly one outcome:

- :class:`Unknown`: no such task, expired, or another principal's. All three look alike on the wire, so an
  id is no existence oracle (invariant 4).
- :class:`Denied`: the owner's task, but the token no longer covers the tool. A distinguishable, resumable
  denial naming what is missing, and never a byte of the result (invariant 2).
- :class:`SettleLost`: the owner's live task, whose process is gone: stored ``failed`` (execution lost) before
  anyone is answered, so a task is never ``working`` for ever.
- :class:`Deliver`: the task's state, with its result or error inline once terminal.

Lifetime: a task's TTL counts from the later of its last status change and its owner's last poll, denied
polls included (:attr:`TaskRecord.expires_at`). An owner that keeps polling while it re-authorizes never
loses the task; one that walks away loses it a TTL later. The naive rule (``createdAt + ttl``) would expire
a finished result while its owner fetches a covering token (docs/decisions/0012).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import orjson

from . import denials
from .errors import TASK_DENIED, TASK_EXECUTION_LOST
from .principal import Grant, Principal
from .resources import AudiencePolicy, requirement, resources_in, scopes_in

EXTENSION = "io.modelcontextprotocol/tasks"


def extension_required() -> dict[str, Any]:
    """The data of the -32021 error that asks a client to declare this extension (a fresh dict: it is sent)."""
    return {"requiredCapabilities": {"extensions": {EXTENSION: {}}}}


class TaskStatus(Enum):
    WORKING = "working"
    INPUT_REQUIRED = "input_required"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED})
_NEXT: dict[TaskStatus, frozenset[TaskStatus]] = {
    TaskStatus.WORKING: frozenset({TaskStatus.INPUT_REQUIRED}) | TERMINAL,
    TaskStatus.INPUT_REQUIRED: frozenset({TaskStatus.WORKING}) | TERMINAL,
    **{status: frozenset() for status in TERMINAL},
}
"""The extension's state diagram: working ⇄ input_required, either → a terminal status, which is final."""


class IllegalTransition(ValueError):
    """A status change the state diagram does not allow, or an outcome that does not fit the status."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """What a token must cover to receive a task's state: its tool's resource indicators, and scopes."""

    resources: frozenset[str]
    scopes: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class TaskRecord:
    """A task's durable state. Times are seconds since the epoch; ``ttl`` is seconds, ``None`` for unlimited."""

    task_id: str
    principal: Principal
    tool: str
    requirement: Requirement
    owner: str
    """The server instance running it: when that instance is gone, the task is lost (:func:`lost`)."""
    status: TaskStatus
    created_at: float
    updated_at: float
    seen_at: float
    """The owner's last poll (authorized or denied): the TTL's clock starts again there."""
    ttl: float | None
    message: str | None = None
    result: dict[str, Any] | None = None
    """The tool's result once ``completed`` (``isError`` results too)."""
    error: dict[str, Any] | None = None
    """The JSON-RPC error (``code``, ``message``, maybe ``data``) once ``failed``."""
    input_requests: Mapping[str, Any] = field(default_factory=dict)
    """The requests to the client still unanswered (``{key: {"method", "params"}}``), while ``input_required``."""
    input_responses: Mapping[str, Any] = field(default_factory=dict)
    """Answers ``tasks/update`` delivered that the running tool has not taken yet."""
    asked: frozenset[str] = frozenset()
    """Every input request key this task ever issued: a key is never issued twice in a task's life."""

    @property
    def expires_at(self) -> float | None:
        if self.ttl is None:
            return None
        return max(self.updated_at, self.seen_at) + self.ttl

    def expired(self, now: float) -> bool:
        expires = self.expires_at
        return expires is not None and now > expires


def new_task(
    task_id: str,
    principal: Principal,
    tool: str,
    requirement: Requirement,
    owner: str,
    now: float,
    ttl: float | None,
) -> TaskRecord:
    if ttl is not None and ttl <= 0:
        raise ValueError("a task's ttl must be positive (or None for unlimited)")
    return TaskRecord(task_id, principal, tool, requirement, owner, TaskStatus.WORKING, now, now, now, ttl)


def advance(
    record: TaskRecord,
    status: TaskStatus,
    now: float,
    *,
    message: str | None = None,
    result: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
) -> TaskRecord:
    """The task after a status change; :class:`IllegalTransition` if the diagram or the outcome forbids it.

    ``completed`` carries a result and ``failed`` a JSON-RPC error; no other status carries either.
    """
    if status not in _NEXT[record.status]:
        raise IllegalTransition(f"task {record.task_id}: {record.status.value} cannot become {status.value}")
    if (result is not None) != (status is TaskStatus.COMPLETED):
        raise IllegalTransition("a result belongs to a completed task, and a completed task has one")
    if (error is not None) != (status is TaskStatus.FAILED):
        raise IllegalTransition("an error belongs to a failed task, and a failed task has one")
    if error is not None and not (isinstance(error.get("code"), int) and isinstance(error.get("message"), str)):
        raise IllegalTransition("a failed task's error is a JSON-RPC error object (integer code, string message)")
    waiting = status is TaskStatus.INPUT_REQUIRED
    return replace(
        record,
        status=status,
        updated_at=max(record.updated_at, now),
        message=message,
        result=result,
        error=error,
        input_requests=record.input_requests if waiting else {},
        input_responses=record.input_responses if waiting else {},
    )


def awaiting_input(record: TaskRecord, requests: Mapping[str, Any], now: float) -> TaskRecord:
    """The running tool asked the client for ``requests`` (on top of those still unanswered): ``input_required``.

    :class:`IllegalTransition` for a finished task, or a key this task issued before (the extension asks keys to
    be unique over a task's life, so an answer always means what the client thinks it means).
    """
    if record.status.terminal:
        raise IllegalTransition(f"task {record.task_id} is {record.status.value}: it asks nothing any more")
    reused = sorted(set(requests) & record.asked)
    if reused:
        raise IllegalTransition(f"task {record.task_id} already issued input request key {reused[0]!r}")
    return replace(
        record,
        status=TaskStatus.INPUT_REQUIRED,
        updated_at=max(record.updated_at, now),
        message="waiting for the client's input (tasks/update)",
        input_requests={**record.input_requests, **requests},
        asked=record.asked | set(requests),
    )


def answered(record: TaskRecord, responses: Mapping[str, Any], now: float) -> TaskRecord:
    """``tasks/update``: the answers to outstanding requests move to the tool's inbox; any other key (never
    issued, answered already, or of a finished task) is ignored. With nothing left outstanding, ``working``."""
    taken = {key: value for key, value in responses.items() if key in record.input_requests}
    if not taken or record.status.terminal:
        return record
    left = {key: value for key, value in record.input_requests.items() if key not in taken}
    return replace(
        record,
        status=TaskStatus.INPUT_REQUIRED if left else TaskStatus.WORKING,
        updated_at=max(record.updated_at, now),
        message=record.message if left else None,
        input_requests=left,
        input_responses={**record.input_responses, **taken},
    )


def consumed(record: TaskRecord, keys: frozenset[str]) -> TaskRecord:
    """The running tool took the answers for ``keys``: they leave the inbox."""
    return replace(record, input_responses={k: v for k, v in record.input_responses.items() if k not in keys})


def described(record: TaskRecord, message: str, now: float) -> TaskRecord:
    """A running task's status message changed (its tool reported progress); its status stays as it is."""
    if record.status.terminal:
        raise IllegalTransition(f"task {record.task_id} is {record.status.value}: its message is final")
    return replace(record, message=message, updated_at=max(record.updated_at, now))


POLL_NOTED_WITHIN = 1.0
"""Seconds by which an owner's poll may restart a task's TTL late, at most (and never by more than a hundredth of
the TTL): a poll that would move the TTL's start by no more is not written (:func:`noted`, ADR 0039)."""


def noted(record: TaskRecord, now: float) -> bool:
    """Whether an owner's poll at ``now`` restarts ``record``'s TTL, so that the store writes it. Not when the TTL's
    start (the later of the last change and the last poll) is within ``min(POLL_NOTED_WITHIN, ttl / 100)`` of
    ``now``: the expiry then stays up to that much earlier than ``now + ttl``, and a poll right after the task was
    created or settled (a quick tool's one poll) costs the store no write. Nor for an unlimited task, whose expiry a
    poll cannot move. The one rule of every store and of the answer (:func:`decide_poll`)."""
    ttl = record.ttl
    return ttl is not None and now - max(record.updated_at, record.seen_at) > min(POLL_NOTED_WITHIN, ttl / 100)


def seen(record: TaskRecord, now: float) -> TaskRecord:
    """The task after its owner polled it at ``now`` (an :class:`Deliver` or :class:`Denied` verdict): its TTL
    restarts. ``seen_at`` only moves forward, and a record it would not move is returned as it is (a record is
    16 fields: a copy is the dearest step of a poll)."""
    return record if record.seen_at >= now else replace(record, seen_at=now)


def execution_lost_error(task_id: str) -> dict[str, Any]:
    return {
        "code": TASK_EXECUTION_LOST,
        "message": "execution lost: the process running this task ended before it finished; the tool may have run",
        "data": {"reason": "execution_lost", "taskId": task_id, "resumable": False},
    }


def lost(record: TaskRecord, now: float) -> TaskRecord:
    """A live task whose process died: ``failed`` with the execution-lost error, never ``working`` forever."""
    message = "the server process running this task ended"
    return advance(record, TaskStatus.FAILED, now, message=message, error=execution_lost_error(record.task_id))


# -- who may see a task: the poll decision --------------------------------------------------------


class Purpose(Enum):
    """Why the adapter looks at a task: what the decision may ask and what bookkeeping its outcome carries."""

    POLL = "poll"
    """``tasks/get``, ``tasks/update``, ``tasks/cancel``: the owner asked, so its TTL restarts (denied or not),
    and a task whose process died is settled as lost before it is answered."""
    PUSH = "push"
    """A listen stream's push: a lost task is settled (the push shows ``failed``), the TTL restarts not."""
    WATCH = "watch"
    """A listen stream's subscription: only whether the stream may see the task; nothing is asked or written."""


@dataclass(slots=True)
class PollFacts:
    """What the adapter knows about one look at a task; it fills in what :func:`decide_poll` asks for."""

    task_id: str
    """The id the request names."""
    record: TaskRecord | None
    """What the task store holds under ``task_id`` (``None``: nothing), or what settling it as lost stored."""
    purpose: Purpose
    runs: bool | None = None
    """Whether the task's owner still runs it (``None``: not asked)."""


@dataclass(frozen=True, slots=True)
class NeedRunner:
    """Tell whether ``owner`` still runs task ``task_id``: this process, by its running tasks; another, by its
    lease in the event store."""

    task_id: str
    owner: str


@dataclass(frozen=True, slots=True)
class Unknown:
    """Answered exactly as for an id never issued: no such task, expired, or another principal's."""

    task_id: str


@dataclass(frozen=True, slots=True)
class Denied:
    """The owner's task, which the token no longer covers: re-authorize for ``missing_*`` and poll again."""

    task_id: str
    missing_resources: tuple[str, ...]
    missing_scopes: tuple[str, ...]
    requirement: Requirement
    """All the task's tool requires: what the challenge asks a new token to hold."""
    touch_at: float | None
    """Restart the TTL from here (an owner's poll, written with the adapter's read:
    :meth:`~mcp_lossless.stores.tasks.TaskStore.poll`); ``None``: write nothing."""


@dataclass(frozen=True, slots=True)
class SettleLost:
    """The task's process died before it finished: store ``record`` (the task ``failed``, execution lost), then
    decide again with what the store holds after it."""

    record: TaskRecord


@dataclass(frozen=True, slots=True)
class Deliver:
    """The task's state goes to the requester (with ``seen_at`` moved to this poll for an owner's poll)."""

    record: TaskRecord
    touch_at: float | None
    """Restart the TTL from here (an owner's poll, written with the adapter's read:
    :meth:`~mcp_lossless.stores.tasks.TaskStore.poll`); ``None``: write nothing."""


PollOutcome = Unknown | Denied | SettleLost | Deliver


def owned(record: TaskRecord, task_id: str, principal: Principal, now: float) -> bool:
    """Whether ``record``, stored under ``task_id``, is ``principal``'s live task at ``now``: the first question of
    :func:`decide_poll` (else the task is unknown), and what decides whether a poll restarts its TTL, denied or not
    (a store asked to note the poll in the same write as its read, :meth:`~mcp_lossless.stores.tasks.TaskStore.poll`,
    asks it too)."""
    return record.task_id == task_id and record.principal == principal and not record.expired(now)


def decide_poll(facts: PollFacts, grant: Grant, policy: AudiencePolicy, now: float) -> NeedRunner | PollOutcome:
    """The one decision behind every ``tasks/get``, ``tasks/update``, ``tasks/cancel``, subscription and push: the
    next question, or what the adapter does. Asked again as the facts fill in, as
    :func:`~mcp_lossless.core.resume.decide_resume` is.

    The order is the rule: whose task it is before what the token covers (so a foreign id learns nothing), what
    the token covers before whether the task still runs (a denied poll costs no liveness check and settles
    nothing it could not see). Coverage, of resources and scopes alike, is the audience policy's: the same rule
    as calls and replays (invariant 1), checked on every look since the token is this request's.
    """
    record = facts.record
    task_id = facts.task_id
    if record is None or not owned(record, task_id, grant.principal, now):
        return Unknown(task_id)
    touch_at = now if facts.purpose is Purpose.POLL else None
    needed = requirement(record.requirement.resources, record.requirement.scopes)
    gap = policy.missing(grant.audience, needed, grant.scopes)
    if gap:
        return Denied(task_id, resources_in(gap), scopes_in(gap), record.requirement, touch_at)
    if touch_at is not None and noted(record, touch_at):
        record = seen(record, touch_at)
    if facts.purpose is not Purpose.WATCH and not record.status.terminal:
        if facts.runs is None:
            return NeedRunner(task_id, record.owner)
        if not facts.runs:
            return SettleLost(lost(record, now))
    return Deliver(record, touch_at)


# -- wire shapes -------------------------------------------------------------------------------------

UNKNOWN_MESSAGE = "Failed to retrieve task: Task not found"
"""The one answer (``-32602``) for an unknown, expired or foreign task id; it echoes nothing."""


def denial_message(denied: Denied) -> str:
    missing = ", ".join((*denied.missing_resources, *(f"scope {s}" for s in denied.missing_scopes)))
    return (
        f"task {denied.task_id} not delivered: the token does not cover {missing}; "
        "the task is kept: re-authorize and poll the same task id"
    )


def denial_data(denied: Denied) -> dict[str, Any]:
    """``data`` of the :data:`~mcp_lossless.core.errors.TASK_DENIED` error (docs/errors.md), with the SEP-2643
    envelope: every denied poll repeats it, as the SEP asks of every ``tasks/get`` of a task not delivered."""
    return denials.refusal_fields(
        denied.task_id,
        requirement(denied.missing_resources, denied.missing_scopes),
        reason="insufficient_audience" if denied.missing_resources else "insufficient_scope",
        taskId=denied.task_id,
        resumable=True,
    )


def denial_error(denied: Denied) -> dict[str, Any]:
    return {"code": TASK_DENIED, "message": denial_message(denied), "data": denial_data(denied)}


def iso(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def task_view(record: TaskRecord, poll_interval_ms: int | None) -> dict[str, Any]:
    """The extension's ``Task`` (for ``CreateTaskResult``), without outcome.

    ``ttlMs`` counts from ``createdAt`` (as the extension defines it) to the current expiry, so it grows as
    the owner polls: a client using ``createdAt + ttlMs`` as its backstop sees the true deadline.
    """
    view: dict[str, Any] = {
        "taskId": record.task_id,
        "status": record.status.value,
        "createdAt": iso(record.created_at),
        "lastUpdatedAt": iso(record.updated_at),
        "ttlMs": None if record.expires_at is None else round((record.expires_at - record.created_at) * 1000),
    }
    if record.message is not None:
        view["statusMessage"] = record.message
    if poll_interval_ms is not None:
        view["pollIntervalMs"] = poll_interval_ms
    return view


def detailed_task(record: TaskRecord, poll_interval_ms: int | None) -> dict[str, Any]:
    """The extension's ``DetailedTask`` (``tasks/get``): the task, with its result or error inline once terminal."""
    view = task_view(record, poll_interval_ms)
    if record.status is TaskStatus.COMPLETED:
        view["result"] = record.result
    elif record.status is TaskStatus.FAILED:
        view["error"] = record.error
    elif record.status is TaskStatus.INPUT_REQUIRED:
        view["inputRequests"] = dict(record.input_requests)
    return view


# -- durable form ------------------------------------------------------------------------------------


def _listed(values: frozenset[str]) -> list[str]:
    """A set as a list in one order whatever the set's: sorted when it has more than one member."""
    return sorted(values) if len(values) > 1 else [*values]


def encode_task(record: TaskRecord) -> bytes:
    """The one serialized form every task store keeps (JSON). The SQLite and Redis stores encode a task at each
    write, so this counts (some 23k instructions a completed task before): the status goes to orjson as the enum
    (which it writes as its value, without the ``value`` property's descriptor call), and a set of one member or
    none is not sorted. The bytes are the same."""
    principal, requirement = record.principal, record.requirement
    return orjson.dumps(
        {
            "id": record.task_id,
            "iss": principal.issuer,
            "sub": principal.subject,
            "cid": principal.client_id,
            "tool": record.tool,
            "res": _listed(requirement.resources),
            "scp": _listed(requirement.scopes),
            "owner": record.owner,
            "status": record.status,
            "created": record.created_at,
            "updated": record.updated_at,
            "seen": record.seen_at,
            "ttl": record.ttl,
            "msg": record.message,
            "result": record.result,
            "error": record.error,
            "inq": record.input_requests,
            "inr": record.input_responses,
            "asked": _listed(record.asked),
        }
    )


def decode_task(raw: bytes | str) -> TaskRecord:
    d = orjson.loads(raw)
    return TaskRecord(
        task_id=d["id"],
        principal=Principal(d["iss"], d["sub"], d["cid"]),
        tool=d["tool"],
        requirement=Requirement(frozenset(d["res"]), frozenset(d["scp"])),
        owner=d["owner"],
        status=TaskStatus(d["status"]),
        created_at=d["created"],
        updated_at=d["updated"],
        seen_at=d["seen"],
        ttl=d["ttl"],
        message=d["msg"],
        result=d["result"],
        error=d["error"],
        input_requests=d.get("inq") or {},  # absent in records stored before tasks asked for input
        input_responses=d.get("inr") or {},
        asked=frozenset(d.get("asked") or ()),
    )
