"""Pending keyed calls kept outside the process, so that a restarted client can re-issue them (SEP-3182, ADR 0029).

A ``tools/call`` to a server declaring ``tools.idempotency`` carries a key, and the server runs a key once: a
re-issue under the same key gets the first run's recorded outcome (or "in progress", or the same task), never a
second run. Within a process the ledger re-issues by itself. What a process that dies mid-call loses is the key:
a new one would run the tool again. A :class:`Journal` is told of each keyed call **before its first byte is sent**
(and again once it became a task, with the task's id), and told when the call ended with an outcome its caller
received; whatever it still holds after a crash is what the next process passes to ``resume_pending``. A
cancellation (the process shutting down) is not an outcome: the call stays pending.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import orjson

JOURNAL_SUFFIX = ".pending.json"


@dataclass(frozen=True, slots=True)
class PendingCall:
    """A keyed call whose outcome its caller has not received yet: all that re-issuing it needs."""

    tool: str
    arguments: Mapping[str, Any]
    idempotency_key: str
    task_id: str | None = None
    """Set once the server ran the call as a task: a restarted process polls the task rather than re-issuing."""

    def to_json(self) -> bytes:
        entry = {"tool": self.tool, "arguments": dict(self.arguments), "idempotencyKey": self.idempotency_key}
        return orjson.dumps(entry | ({"taskId": self.task_id} if self.task_id is not None else {}))

    @classmethod
    def from_json(cls, data: bytes) -> PendingCall:
        """The call :meth:`to_json` wrote; ``ValueError`` for anything else (a journal is not trusted blindly)."""
        entry = orjson.loads(data)
        if not isinstance(entry, dict):
            raise ValueError("a pending call is a JSON object")
        tool, arguments, key, task = (entry.get(k) for k in ("tool", "arguments", "idempotencyKey", "taskId"))
        if not isinstance(tool, str) or not isinstance(arguments, dict) or not isinstance(key, str) or not key:
            raise ValueError("a pending call needs tool, arguments (an object) and idempotencyKey")
        if task is not None and not isinstance(task, str):
            raise ValueError("taskId must be a string")
        return cls(tool, arguments, key, task)


class Journal(Protocol):
    """Where a client keeps its pending keyed calls; each method must have made the change durable on return."""

    def pending(self, call: PendingCall) -> None:
        """``call`` is about to be sent (or became a task): keep it, replacing any entry of the same key."""
        ...

    def settled(self, call: PendingCall) -> None:
        """``call``'s caller received its outcome: forget it."""
        ...


class FileJournal:
    """One file per pending call in ``directory``, named by a hash of its key, written whole (a temporary file,
    fsynced, renamed over the entry, the directory fsynced): a crash leaves the old entry or the new, never half."""

    def __init__(self, directory: Path | str) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        return self.directory / f"{hashlib.sha256(key.encode()).hexdigest()}{JOURNAL_SUFFIX}"

    def pending(self, call: PendingCall) -> None:
        path = self._path(call.idempotency_key)
        temporary = path.with_suffix(".tmp")
        with temporary.open("wb") as out:
            out.write(call.to_json())
            out.flush()
            os.fsync(out.fileno())
        temporary.replace(path)
        self._sync_directory()

    def settled(self, call: PendingCall) -> None:
        self._path(call.idempotency_key).unlink(missing_ok=True)
        self._sync_directory()

    def calls(self) -> list[PendingCall]:
        """The calls still pending, e.g. those a process that died left: each one for ``resume_pending``."""
        return [PendingCall.from_json(path.read_bytes()) for path in sorted(self.directory.glob(f"*{JOURNAL_SUFFIX}"))]

    def _sync_directory(self) -> None:
        descriptor = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(descriptor)
        finally:
            os.close(descriptor)


def no_longer_keyed(call: PendingCall) -> str:
    """Why a pending call is not re-issued: its server stopped declaring the capability its key relied on."""
    return (
        f"{call.tool}: the server no longer declares tools.idempotency, so re-issuing key {call.idempotency_key} "
        "could run the tool again; it may have run"
    )


@contextmanager
def journaled(journal: Journal | None, call: PendingCall | None) -> Iterator[Callable[[str], None]]:
    """Keep ``call`` pending in ``journal`` while the block runs; the block gets a function to note its task id.

    An outcome (a return, or an exception: a tool error, a refusal, "may have run", a deadline) settles it; a
    cancellation does not: a process stopping mid-call leaves it for the next. Without a journal or a key, nothing.
    """
    if journal is None or call is None:
        yield lambda _task_id: None
        return
    journal.pending(call)
    current = call

    def became_task(task_id: str) -> None:
        nonlocal current
        current = replace(current, task_id=task_id)
        journal.pending(current)

    try:
        yield became_task
    except Exception:
        journal.settled(current)
        raise
    journal.settled(current)
