"""What the event log records: each event with the authorization tags that replay is checked against."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

RequestId = str | int


class StreamKind(Enum):
    POST = "post"
    GET = "get"


class PendingRequest(NamedTuple):
    """A request carried by a stream, with the tool and resources its events need (built once per request)."""

    request_id: RequestId
    method: str
    tool: str | None = None
    resources: frozenset[str] = frozenset()


class StoredEvent(NamedTuple):
    """One SSE event of one stream.

    ``resources`` are the resource indicators a token must cover to receive it (empty: session-level).
    ``data`` is the JSON-RPC message exactly as sent, encoded once at append time; empty for priming.
    ``terminal`` marks the final response (result or error) for ``request_id``.
    A named tuple: immutable, and built several times faster than a frozen dataclass on the per-event path.
    """

    session_id: str
    stream: str
    seq: int
    event_id: str
    data: bytes
    request_id: RequestId | None = None
    tool: str | None = None
    resources: frozenset[str] = frozenset()
    terminal: bool = False


@dataclass(slots=True)
class StreamRecord:
    """A stream's durable state: whose it is, what it carries and whether it has ended."""

    session_id: str
    stream: str
    kind: StreamKind
    owner: str
    requests: tuple[PendingRequest, ...] = ()
    last_seq: int = -1
    completed: bool = False
    answered: frozenset[RequestId] = field(default_factory=frozenset)

    def copy(self) -> StreamRecord:
        """An independent copy (``dataclasses.replace`` costs several times more on the per-call path)."""
        return StreamRecord(
            self.session_id,
            self.stream,
            self.kind,
            self.owner,
            self.requests,
            self.last_seq,
            self.completed,
            self.answered,
        )

    def unanswered(self) -> tuple[PendingRequest, ...]:
        return tuple(r for r in self.requests if r.request_id not in self.answered)
