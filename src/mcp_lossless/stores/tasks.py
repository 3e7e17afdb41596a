"""The task-store interface: the tasks extension's durable state (the factory is ``open.task_store_beside``).

A task store keeps :class:`~mcp_lossless.core.tasks.TaskRecord` s in the one serialized form of the core
(:func:`~mcp_lossless.core.tasks.encode_task`). It decides nothing about tasks but two atomic rules the
server relies on across processes: a terminal task is never overwritten (the first outcome wins, so a
cancel racing a completion, or a replica settling a lost task, cannot clobber a result), and an owner's
poll only ever moves ``seen_at`` forward.

Every store is a facet of the event store it sits in (ADR 0028): the same SQLite file, writer thread and
schema; the same Redis client; process memory beside the memory store. And every store behaves alike at its
bounds: it holds at most ``max_tasks`` (:data:`DEFAULT_MAX_TASKS`) tasks, makes room by purging the expired ones
when full, then refuses with :class:`TaskLimitReached`; :meth:`TaskStore.purge_expired` deletes what expired and
says how many.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol, runtime_checkable

from ..core.events import StoredEvent
from ..core.principal import Principal
from ..core.tasks import TaskRecord

DEFAULT_MAX_TASKS = 100_000
"""Tasks a store holds at most, expired ones not yet purged included."""


class TaskLimitReached(Exception):
    """The store holds as many tasks as it may; the server answers with a clear error, nothing is created."""


def limit_message(max_tasks: int) -> str:
    """What :class:`TaskLimitReached` says, the same from every store (the server sends it)."""
    return f"the server holds {max_tasks} tasks, its limit"


class TaskStore(Protocol):
    async def open(self) -> None: ...
    async def close(self) -> None: ...

    def create(self, record: TaskRecord) -> Awaitable[None]:
        """Store a new task durably: once the awaitable returned is done, :meth:`get` on any process sharing the
        store finds it. A store may queue the write at this call already (SQLite: its writer's next transaction),
        so what the caller queues before awaiting it can share its commit; the caller awaits it in any case.

        When the store holds its limit, the tasks expired at ``record.created_at`` are purged first; if that frees
        nothing, :class:`TaskLimitReached` and nothing is stored."""
        ...

    async def get(self, task_id: str) -> TaskRecord | None: ...

    async def poll(self, task_id: str, principal: Principal, now: float) -> TaskRecord | None:
        """:meth:`get` for ``principal``'s poll at ``now``, noting it in the same write: when the task is that
        principal's live task (:func:`~mcp_lossless.core.tasks.owned`) and the poll restarts its TTL
        (:func:`~mcp_lossless.core.tasks.noted`: not within a second of its last change or poll), its ``seen_at``
        becomes ``now`` (the TTL restarts, denied poll or not) before it is returned, with ``seen_at`` moved. Any
        other task (unknown, expired, another principal's, polled just now) is returned as :meth:`get` returns it,
        untouched."""
        ...

    async def update(self, record: TaskRecord) -> TaskRecord | None:
        """Replace the task's state unless the stored task is terminal; return what is stored now.

        ``None`` if the task is gone (expired and purged). ``seen_at`` is never moved back.
        """
        ...

    async def purge_expired(self, now: float) -> int:
        """Delete the tasks whose TTL ran out before ``now``; return how many."""
        ...


Settled = tuple[TaskRecord | None, bool, BaseException | None]
"""What :meth:`AppendingTaskStore.update_appending` did: the task as stored now, whether that is the record given
(its event was to be appended), and why the event store refused the event (``None``: appended, or not asked)."""


@runtime_checkable
class AppendingTaskStore(TaskStore, Protocol):
    """A task store that shares its event store's transactions (SQLite): a task's outcome and its outcome event are
    one write there, the event appended only if the outcome was stored (ADR 0037)."""

    def update_appending(self, record: TaskRecord, event: StoredEvent) -> Awaitable[Settled]: ...
