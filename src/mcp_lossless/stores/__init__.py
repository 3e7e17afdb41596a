"""Event stores: one interface (:class:`EventStore`), several backends."""

from .base import EventsEvicted, EventStore, SessionRecord, open_store

__all__ = ["EventStore", "EventsEvicted", "SessionRecord", "open_store"]
