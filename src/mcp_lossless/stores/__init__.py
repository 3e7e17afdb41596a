"""Event stores: one interface (:class:`EventStore`), several backends, and :func:`open_store` to pick one."""

from .base import EventsEvicted, EventStore, SessionRecord, StoreUnavailable, StreamTakenOver
from .open import open_store

__all__ = ["EventStore", "EventsEvicted", "SessionRecord", "StoreUnavailable", "StreamTakenOver", "open_store"]
