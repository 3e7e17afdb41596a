"""Incremental Server-Sent Events decoder following the WHATWG event-stream interpretation rules.

Bytes go in as they arrive off the wire, in chunks of any size; complete events come out. The decoder
keeps the *last event ID buffer* across events (an ``id:`` persists until the server changes it), so
the caller always knows the ``Last-Event-ID`` to resume from, including ids carried by events that
dispatch nothing (an ``id:`` line with no ``data:``). An event larger than the bound raises rather than
growing memory without limit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_MAX_EVENT_BYTES = 4 * 1024 * 1024
_BOM = b"\xef\xbb\xbf"
_EOL = re.compile(rb"\r\n?|\n")


class SseTooLarge(ValueError):
    """An event (or a single line) exceeded the decoder's size bound."""


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched event.

    ``id`` is the last event ID buffer after this event (``None`` while no id, or an empty one, is
    set). A ``retry:`` field is no part of the event: it sets the stream's :attr:`SseDecoder.reconnection_ms`,
    dispatched or not (a block of ``retry:`` alone is never dispatched).
    """

    event: str
    data: str
    id: str | None


class SseDecoder:
    """Feed bytes, get :class:`SseEvent` values; :attr:`last_event_id` tracks every dispatch."""

    __slots__ = (
        "_at_start",
        "_data",
        "_data_seen",
        "_event_bytes",
        "_event_type",
        "_id_buffer",
        "_max",
        "_pending",
        "_skip_lf",
        "last_event_id",
        "reconnection_ms",
    )

    def __init__(self, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        self._max = max_event_bytes
        self._pending = bytearray()
        self._at_start = True
        self._skip_lf = False
        self._data: list[str] = []
        self._data_seen = False
        self._event_type = ""
        self._event_bytes = 0
        self._id_buffer = ""
        self.last_event_id: str | None = None
        """The id buffer as of the last dispatch: what a ``Last-Event-ID`` header should carry."""
        self.reconnection_ms: int | None = None
        """The latest ``retry:`` value seen on this stream, kept across events: how long the client waits before
        it reconnects (the client's transport hands it to the ledger beside :attr:`last_event_id`)."""

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Consume ``chunk`` and return the events it completed, in order."""
        buf = self._pending
        buf += chunk
        if self._at_start:
            if len(buf) < len(_BOM) and _BOM.startswith(bytes(buf)):
                return []
            if buf.startswith(_BOM):
                del buf[: len(_BOM)]
            self._at_start = False
        if self._skip_lf and buf:
            if buf[0] == 0x0A:
                del buf[0]
            self._skip_lf = False
        out: list[SseEvent] = []
        start = 0
        size = len(buf)
        while (match := _EOL.search(buf, start)) is not None:
            end, nxt = match.span()
            if nxt == size and buf[end] == 0x0D:
                self._skip_lf = True
            event = self._line(bytes(buf[start:end]))
            if event is not None:
                out.append(event)
            start = nxt
        del buf[:start]
        if len(buf) > self._max:
            raise SseTooLarge(f"an SSE line exceeds {self._max} bytes")
        return out

    def _line(self, raw: bytes) -> SseEvent | None:
        if not raw:
            return self._dispatch()
        self._event_bytes += len(raw)
        if self._event_bytes > self._max:
            raise SseTooLarge(f"an SSE event exceeds {self._max} bytes")
        line = raw.decode("utf-8", errors="replace")
        if line[0] == ":":
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
            self._data_seen = True
        elif name == "event":
            self._event_type = value
        elif name == "id" and "\x00" not in value:
            self._id_buffer = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self.reconnection_ms = int(value)
        return None

    def _dispatch(self) -> SseEvent | None:
        self.last_event_id = self._id_buffer or None
        event: SseEvent | None = None
        if self._data_seen:
            event = SseEvent(
                event=self._event_type or "message",
                data="\n".join(self._data),
                id=self.last_event_id,
            )
        self._data = []
        self._data_seen = False
        self._event_type = ""
        self._event_bytes = 0
        return event
