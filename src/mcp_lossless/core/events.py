"""What the event log records: each event with the authorization tags that replay is checked against."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple, overload

RequestId = str | int


class StreamKind(Enum):
    POST = "post"
    GET = "get"


class Loss(Enum):
    """Why a stream ended without its producer answering every request (ADR 0025).

    The outcome is kept on the stream's record, never written as an event: an event position is the producer's
    to give, and a process that ends the stream for it cannot know which positions the producer had given (a
    store that fails over may have lost some that clients hold), so any position it wrote could name two
    contents.
    """

    OWNER = "execution_lost"
    """The process producing the stream died: each unanswered request may have run."""
    STORE = "events_lost"
    """The store lost events it had acknowledged (a failover to a replica that had not received them)."""


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


Row = tuple[str, bytes, RequestId | None, str | None, int, bool]
"""An event as a store holds it, without what its stream shares: id, payload, request id, tool, the index of its tag
set in the stream's table, terminal (its position is its place among the rows)."""


class EventRows(Sequence[StoredEvent]):
    """Consecutive events of one stream as a store holds them: rows (:data:`Row`) from position ``first_seq`` on,
    with the stream's table of tag sets they name by index.

    A sequence of :class:`StoredEvent`, each built only when asked for (an index, iteration): what a replay does per
    event (framing, the answered requests, the coverage scan) reads the rows themselves, and building an event per
    row cost more than all of that (ADR 0020). The table holds each tag set once, so rows with equal indices carry
    equal sets. Immutable, as the rows and the table are.
    """

    __slots__ = ("first_seq", "rows", "session_id", "stream", "tags")

    def __init__(
        self, session_id: str, stream: str, first_seq: int, rows: list[Row], tags: Sequence[frozenset[str]]
    ) -> None:
        self.session_id = session_id
        self.stream = stream
        self.first_seq = first_seq
        """The position of ``rows[0]``; each next row's is one more."""
        self.rows = rows
        self.tags = tags
        """The tag sets rows name by index, each once."""

    def __len__(self) -> int:
        return len(self.rows)

    @overload
    def __getitem__(self, index: int) -> StoredEvent: ...
    @overload
    def __getitem__(self, index: slice) -> EventRows: ...
    def __getitem__(self, index: int | slice) -> StoredEvent | EventRows:
        rows = self.rows
        if isinstance(index, slice):
            start, stop, step = index.indices(len(rows))
            if step != 1:
                raise ValueError("EventRows slices are contiguous")
            stop = max(start, stop)
            return EventRows(self.session_id, self.stream, self.first_seq + start, rows[start:stop], self.tags)
        if index < 0:
            index += len(rows)
        if not 0 <= index < len(rows):
            raise IndexError("EventRows index out of range")
        return self._event(index, rows[index])

    def _event(self, index: int, row: Row) -> StoredEvent:
        event_id, data, request_id, tool, tag_index, terminal = row
        seq = self.first_seq + index
        return StoredEvent(
            self.session_id, self.stream, seq, event_id, data, request_id, tool, self.tags[tag_index], terminal
        )

    def __iter__(self) -> Iterator[StoredEvent]:
        for index, row in enumerate(self.rows):
            yield self._event(index, row)

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same events (a list a store returns, another :class:`EventRows`)."""
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"EventRows({list(self)!r})"


def answered_in(events: Sequence[StoredEvent]) -> list[RequestId]:
    """The request ids ``events`` answer (their terminal events'), in order: read off the rows of
    :class:`EventRows`, with no event built."""
    if type(events) is EventRows:
        return [row[2] for row in events.rows if row[5] and row[2] is not None]
    return [event.request_id for event in events if event.terminal and event.request_id is not None]


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
    lost: Loss | None = None
    """Set when the stream ended without its producer (then ``completed`` too): its unanswered requests' outcome."""

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
            self.lost,
        )

    def unanswered(self) -> tuple[PendingRequest, ...]:
        return tuple(r for r in self.requests if r.request_id not in self.answered)
