"""The SQLite store's key journal: a keyed call's key and stream record made durable before its tool starts, with
one ``write`` on the loop, not a commit of their own (ADR 0029).

Why: a key is recorded before its tool starts, so that a process killed during the run leaves an execution-lost
key, never a silent second run. Committed alone, that record cost a keyed call a transaction and two thread hops
of its own: 1.3-1.5x the server CPU of an unkeyed call, whose record shares one commit with its answer. Instead,
the record (the key rows and the stream's row) is appended here, a frame of a few hundred bytes, and the tool starts
at once; the rows go into the file in the transaction of the call's answer, as an unkeyed call's do. An appended
frame is in the OS page cache when ``write`` returns, so it survives SIGKILL exactly as a committed WAL frame does
(``synchronous=NORMAL``: neither survives a power loss unsynced, docs/stores.md).

Frames go to numbered segment files beside the database (``<file>-keys.<n>``). A segment is deleted once it is no
longer written and every record in it is committed to the file (or kept, for the next open, if one failed to be).
At open, every segment left is read and the records the file lacks are inserted (the stream without an answer:
its key is then answered as execution lost, as a killed run's is), before the store serves; then the segments go.
A frame cut short by the crash fails its checksum and ends the segment: its ``write`` never returned, so its call
never started.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

_HEADER = struct.Struct("<II")
"""A frame's length and CRC-32 of its payload."""
SEGMENT_BYTES = 1024 * 1024
"""A segment's size after which the next frame starts a new one: what a crash leaves to read back at most, about
4,000 records."""


class Segment:
    __slots__ = ("failed", "fd", "path", "pending", "size")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self.size = 0
        self.pending = 0
        """Records written here whose transaction has not committed yet."""
        self.failed = False
        """A record here was never committed: the segment stays for the next open to insert it."""


class KeyJournal:
    """The segments of one database file; used on the event loop only."""

    __slots__ = ("_base", "_current", "_next", "_retired")

    def __init__(self, database: str, first: int) -> None:
        self._base = database
        self._next = first
        self._current: Segment | None = None
        self._retired: list[Segment] = []

    @staticmethod
    def _pattern(database: str) -> tuple[Path, str]:
        path = Path(database)
        return path.parent, f"{path.name}-keys."

    @classmethod
    def leftovers(cls, database: str) -> list[Path]:
        """The segments a previous process left, in the order they were written."""
        folder, prefix = cls._pattern(database)
        found = [p for p in folder.glob(f"{prefix}*") if p.name[len(prefix) :].isdigit()]
        return sorted(found, key=lambda p: int(p.name[len(prefix) :]))

    @staticmethod
    def read(segment: Path) -> Iterator[Any]:
        """The records of a segment, up to the first frame a crash cut short."""
        data = segment.read_bytes()
        at = 0
        while at + _HEADER.size <= len(data):
            length, crc = _HEADER.unpack_from(data, at)
            payload = data[at + _HEADER.size : at + _HEADER.size + length]
            if len(payload) != length or zlib.crc32(payload) != crc:
                return
            yield orjson.loads(payload)
            at += _HEADER.size + length

    @classmethod
    def number_after(cls, leftovers: list[Path]) -> int:
        """The number of the first segment a new journal writes: after every one left."""
        return int(leftovers[-1].name.rsplit(".", 1)[1]) + 1 if leftovers else 0

    def write(self, record: Any) -> Segment:
        """Append ``record`` (JSON) durably (OSError: it is not; the caller does not start the call); returns its
        segment, for :meth:`settled` once its transaction committed or failed."""
        segment = self._current
        if segment is None or segment.size >= SEGMENT_BYTES:
            if segment is not None:
                self._retire(segment)
            segment = self._current = Segment(Path(f"{self._base}-keys.{self._next}"))
            self._next += 1
        payload = orjson.dumps(record)
        frame = _HEADER.pack(len(payload), zlib.crc32(payload)) + payload
        written = os.write(segment.fd, frame)
        if written != len(frame):  # a regular file takes a small write whole, or fails (disk full)
            segment.failed = True
            raise OSError(f"key journal {segment.path}: wrote {written} of {len(frame)} bytes")
        segment.size += written
        segment.pending += 1
        return segment

    def settled(self, segment: Segment, stored: bool) -> None:
        """A record of ``segment`` is committed (``stored``) or its transaction failed."""
        segment.pending -= 1
        if not stored:
            segment.failed = True
        if segment is not self._current and segment.pending == 0:
            self._drop(segment)

    def _retire(self, segment: Segment) -> None:
        if segment.pending == 0:
            self._drop(segment)
        else:
            self._retired.append(segment)

    def _drop(self, segment: Segment) -> None:
        if segment in self._retired:
            self._retired.remove(segment)
        os.close(segment.fd)
        if not segment.failed:
            segment.path.unlink(missing_ok=True)

    def close(self) -> None:
        """The store closed: every segment's file is closed, and deleted unless a record in it may not be committed
        (one failed, or its outcome did not reach the loop): the next open reads those."""
        segments = self._retired + ([] if self._current is None else [self._current])
        self._current, self._retired = None, []
        for segment in segments:
            segment.failed = segment.failed or segment.pending > 0
            self._drop(segment)
