"""Event stores: one interface (:class:`EventStore`), several backends, and :func:`open_store` to pick one.

Task stores (2026-07-28 tasks) beside them: :class:`TaskStore`, and :func:`task_store_beside` for the one that
keeps tasks where an event store keeps events.
"""

from .base import EventsEvicted, EventsLost, EventStore, SessionRecord, StoreUnavailable, StreamTakenOver
from .open import open_store, task_store_beside
from .tasks import TaskLimitReached, TaskStore

__all__ = [
    "EventStore",
    "EventsEvicted",
    "EventsLost",
    "SessionRecord",
    "StoreUnavailable",
    "StreamTakenOver",
    "TaskLimitReached",
    "TaskStore",
    "open_store",
    "task_store_beside",
]
