"""Tasks in process memory: for tests and single-process servers that may lose tasks on restart."""

from __future__ import annotations

from ..core.principal import Principal
from ..core.tasks import TaskRecord, noted, owned, seen
from .tasks import DEFAULT_MAX_TASKS, TaskLimitReached, limit_message


class MemoryTaskStore:
    """A dict of records, bounded by ``max_tasks`` (expired ones are purged first when it is full)."""

    def __init__(self, max_tasks: int = DEFAULT_MAX_TASKS) -> None:
        if max_tasks < 1:
            raise ValueError("max_tasks must be at least 1")
        self.max_tasks = max_tasks
        self._tasks: dict[str, TaskRecord] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def create(self, record: TaskRecord) -> None:
        if len(self._tasks) >= self.max_tasks and not await self.purge_expired(record.created_at):
            raise TaskLimitReached(limit_message(self.max_tasks))
        self._tasks[record.task_id] = record

    async def get(self, task_id: str) -> TaskRecord | None:
        return self._tasks.get(task_id)

    async def poll(self, task_id: str, principal: Principal, now: float) -> TaskRecord | None:
        stored = self._tasks.get(task_id)
        if stored is None or not owned(stored, task_id, principal, now) or not noted(stored, now):
            return stored
        fresh = self._tasks[task_id] = seen(stored, now)
        return fresh

    async def update(self, record: TaskRecord) -> TaskRecord | None:
        stored = self._tasks.get(record.task_id)
        if stored is None or stored.status.terminal:
            return stored
        fresh = seen(record, stored.seen_at)
        self._tasks[record.task_id] = fresh
        return fresh

    async def purge_expired(self, now: float) -> int:
        gone = [task_id for task_id, record in self._tasks.items() if record.expired(now)]
        for task_id in gone:
            del self._tasks[task_id]
        return len(gone)
