"""What the client's ledger takes in and hands out: call specs, outcomes, and the actions it decides.

The data here is the ledger's contract with its adapter (``client/session.py``), kept apart from the
machine (``core/ledger.py``) as h11 keeps its events apart from its connection. Every action is a frozen
dataclass that carries the reason it was taken, so each recovery decision can be logged.

:data:`Action` is a closed union. The adapter dispatches it with ``match`` ending in
``case _: typing.assert_never(action)``: an action added here and not handled there is a ``mypy --strict``
error (the unmatched class is not ``Never``), not an action dropped without a word at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

CallKey = int
"""The caller's handle for a call; stable across re-issues (the wire id is not)."""
StreamKey = int


class FailureKind(Enum):
    """Why a call ended without a response from the server."""

    MAY_HAVE_RUN = "may_have_run"
    """The request may have been executed, but its result was not (and will not be) received."""
    NOT_SENT = "not_sent"
    """The request never reached the server."""
    REJECTED = "rejected"
    """The server refused the request itself (an HTTP 4xx that is not about authorization)."""
    AUTHORIZATION = "authorization"
    """No token could be obtained that the server accepts for this call."""
    SESSION_LOST = "session_lost"
    """The server ended the session while the call was pending; it may have run."""
    PROTOCOL = "protocol"
    """The server broke the protocol (unparsable frames, unknown events, foreign ids) and never answered."""
    DEADLINE = "deadline"
    CANCELLED = "cancelled"


@dataclass(frozen=True, slots=True)
class Failure:
    kind: FailureKind
    reason: str
    error: Mapping[str, Any] | None = None
    """The JSON-RPC error object that led here, when there was one (e.g. EXECUTION_LOST)."""


@dataclass(frozen=True, slots=True)
class Answered:
    """The server's response, exactly as received (its ``id`` is the call's current wire id)."""

    message: Mapping[str, Any]


CallOutcome = Answered | Failure


@dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    """How far the ledger goes to recover a call before failing it."""

    reissue_idempotent: bool = True
    """Re-issue calls to tools annotated ``idempotentHint`` without asking."""
    max_reissues: int = 2
    max_keyed_reissues: int = 20
    """Re-issues of a call carrying an idempotency key (SEP-3182): each is safe, as the server runs a key once, so
    the bound is only against a server that never settles; the call's deadline usually ends it first."""
    max_reauthorizations: int = 3
    max_fruitless_reconnects: int = 5
    """Consecutive connections of one stream that end without a single new event."""


@dataclass(frozen=True, slots=True)
class CallSpec:
    """What to send, and what the ledger needs to know to recover it."""

    method: str
    params: Mapping[str, Any] = field(default_factory=dict)
    resources: frozenset[str] = frozenset()
    """Resource indicators a token must cover for this call (its tool's, or the server's)."""
    idempotent: bool = False
    reissue: bool | None = None
    """The caller's choice for this call; ``None`` leaves it to :class:`RecoveryPolicy` and ``idempotent``."""
    progress: bool = False
    """Ask for progress notifications (the wire id is used as the progress token)."""
    idempotency_key: str | None = None
    """The call's SEP-3182 key (the adapter draws it; ``params`` carry it on the wire): set only when the server
    declares ``tools.idempotency``. A keyed call is re-issued under the same key whatever its tool."""


@dataclass(frozen=True, slots=True)
class Link:
    """One connection of one stream. Inputs naming an older link of the stream are stale and ignored."""

    stream: StreamKey
    epoch: int


# ---- actions ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SendCall:
    """POST ``message``; its response (JSON or SSE) is ``link``. ``reissue_of`` names the abandoned id."""

    link: Link
    call: CallKey
    message: Mapping[str, Any]
    resources: frozenset[str]
    reason: str
    reissue_of: str | int | None = None
    attempt: int = 0
    """How many times this call was re-issued before: the adapter backs off before sending again."""
    retry_ms: int | None = None
    """The server's wait before sending again (an in-progress key's ``retryAfter``), the backoff's base."""


@dataclass(frozen=True, slots=True)
class SendBatch:
    """POST ``messages`` as one JSON-RPC batch (2025-03-26 only); every response arrives on ``link``."""

    link: Link
    calls: tuple[CallKey, ...]
    messages: tuple[Mapping[str, Any], ...]
    resources: frozenset[str]
    reason: str


@dataclass(frozen=True, slots=True)
class Resume:
    """GET with ``Last-Event-ID: cursor`` after the delay the attempt number and ``retry_ms`` call for."""

    link: Link
    cursor: str
    attempt: int
    retry_ms: int | None
    resources: frozenset[str]
    reason: str


@dataclass(frozen=True, slots=True)
class Reauthorize:
    """Obtain a fresh grant for ``resources`` and ``scopes`` (the union with what was asked before), then report
    :meth:`Ledger.reauthorized` or ``..._failed``."""

    stream: StreamKey
    resources: frozenset[str]
    cursor: str | None
    reason: str
    scopes: frozenset[str] = frozenset()
    """Scopes the server named as missing (an in-band refusal's ``requiredScopes``; a challenge names its own)."""


@dataclass(frozen=True, slots=True)
class Resolve:
    call: CallKey
    wire_id: str | int
    outcome: CallOutcome


@dataclass(frozen=True, slots=True)
class Progress:
    call: CallKey
    progress: float
    total: float | None
    message: str | None


@dataclass(frozen=True, slots=True)
class CancelOnServer:
    """Tell the server to stop ``wire_id`` (``notifications/cancelled``)."""

    wire_id: str | int
    reason: str


@dataclass(frozen=True, slots=True)
class CloseStream:
    """Stop reading the stream's current connection: it is finished, or superseded by what follows."""

    stream: StreamKey
    reason: str


@dataclass(frozen=True, slots=True)
class Incoming:
    """A server request or notification that is not the ledger's business (logging, ping, sampling)."""

    stream: StreamKey
    message: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Report:
    """Something dropped or decided, for the log: ``what`` is a stable keyword, ``detail`` for humans."""

    stream: StreamKey | None
    what: str
    detail: str


Action = (
    SendCall | SendBatch | Resume | Reauthorize | Resolve | Progress | CancelOnServer | CloseStream | Incoming | Report
)
