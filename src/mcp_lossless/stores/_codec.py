"""How the durable stores write what is not an event's payload: request lists, tag sets, JSON scalars.

One definition for SQLite and Redis, so both read back exactly the types they were given (``7`` and ``"7"``
stay distinct request ids) and both share one interning policy for tag sets.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..core.events import PendingRequest

CACHE_LIMIT = 65_536
"""Entries an :class:`Interner` keeps before it starts afresh (a bound, not a tuning knob)."""


def encode_json(value: Any) -> bytes:
    return orjson.dumps(value)


def encode_requests(requests: tuple[PendingRequest, ...]) -> bytes:
    return orjson.dumps(
        [{"id": r.request_id, "method": r.method, "tool": r.tool, "resources": sorted(r.resources)} for r in requests]
    )


def decode_requests(raw: bytes | str) -> tuple[PendingRequest, ...]:
    return tuple(PendingRequest(r["id"], r["method"], r["tool"], frozenset(r["resources"])) for r in orjson.loads(raw))


def encode_tags(resources: frozenset[str]) -> bytes:
    """A tag set as a sorted JSON list: equal sets give equal bytes, which is what interning keys on."""
    return orjson.dumps(sorted(resources))


def compact_event_id(stream: str, seq: int, event_id: str) -> str:
    """The event id without the ``<stream>.<seq hex>.`` it repeats from where it is kept (saves ~25 B/event)."""
    prefix = f"{stream}.{seq:x}."
    if event_id.startswith(prefix):
        return "." + event_id[len(prefix) :]
    return "=" + event_id


def full_event_id(stream: str, seq: int, compact: str) -> str:
    return f"{stream}.{seq:x}.{compact[1:]}" if compact[0] == "." else compact[1:]


class Interner:
    """Decodes each distinct raw value once: events of one tool then share one ``frozenset`` of tags, which
    replay memoizes its authorization checks by, and one decoded request id or tool name."""

    __slots__ = ("_tags", "_values")

    def __init__(self) -> None:
        self._tags: dict[bytes | str, frozenset[str]] = {}
        self._values: dict[bytes | str, Any] = {}

    def tags(self, raw: bytes | str) -> frozenset[str]:
        tags = self._tags.get(raw)
        if tags is None:
            if len(self._tags) >= CACHE_LIMIT:
                self._tags.clear()
            tags = self._tags[raw] = frozenset(orjson.loads(raw))
        return tags

    def value(self, raw: bytes | str) -> Any:
        """A decoded JSON scalar (request id, tool name); ``null`` is ``None``."""
        try:
            return self._values[raw]
        except KeyError:
            if len(self._values) >= CACHE_LIMIT:
                self._values.clear()
            value = self._values[raw] = orjson.loads(raw)
            return value
