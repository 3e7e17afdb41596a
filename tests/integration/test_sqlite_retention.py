"""SQLite retention: completed streams trimmed by age and by count per session, the file's free pages returned,
a sweep that runs by itself, settings from the store spec, and files of schema versions 1, 2 and 3 carried forward."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

from mcp_lossless.core.events import PendingRequest, StoredEvent
from mcp_lossless.stores import open_store
from mcp_lossless.stores.base import EventsEvicted
from mcp_lossless.stores.sqlite import SqliteStore
from tests.integration.test_store_contract import ALICE, BOB, TOOL_A, event, session, stream

pytestmark = pytest.mark.anyio

CALL = PendingRequest(1, "tools/call", "a", TOOL_A)


class Clock:
    """Wall-clock seconds the test sets; ``called`` is set on each reading once ``arm`` was called."""

    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now
        self.called = threading.Event()
        self._armed = False

    def __call__(self) -> float:
        if self._armed:
            self.called.set()
        return self.now

    def arm(self) -> None:
        self.called.clear()
        self._armed = True


@pytest.fixture
async def opened(tmp_path: Path) -> AsyncIterator[Callable[..., SqliteStore]]:
    stores: list[SqliteStore] = []

    def make(**settings: object) -> SqliteStore:
        store = SqliteStore(str(tmp_path / "retention.db"), **settings)  # type: ignore[arg-type]
        stores.append(store)
        return store

    yield make
    for store in stores:
        await store.close()


async def finished_call(store: SqliteStore, key: str, session_id: str = "s1", events: int = 3) -> None:
    """A stream whose one call reported progress and was answered (the answer completes the stream)."""
    await store.open_stream(stream(key, session_id, requests=(CALL,)))
    for seq in range(events - 1):
        await store.append(event(key, seq, session_id=session_id))
    await store.append(event(key, events - 1, session_id=session_id, request_id=1, terminal=True), completes=True)


async def test_completed_streams_older_than_the_retention_are_deleted_with_their_events(
    opened: Callable[..., SqliteStore],
) -> None:
    clock = Clock(1_000.0)
    store = opened(retention_seconds=3_600, clock=clock)
    await store.open()
    await store.put_session(session("s1"))
    await finished_call(store, "old")
    clock.now = 4_000.0
    await finished_call(store, "recent")
    await store.open_stream(stream("running"))
    await store.append(event("running", 0))
    await store.complete_stream("settled")  # unknown: nothing to complete

    await store.sweep(now=4_601.0)

    assert await store.get_stream("old") is None
    assert await store.read_after("old", -1) == []
    assert [e.seq for e in await store.read_after("recent", -1)] == [0, 1, 2]
    assert [e.seq for e in await store.read_after("running", -1)] == [0]
    assert await store.get_session("s1") == session("s1")

    await store.sweep(now=4_000.0 + 3_601.0)
    assert await store.get_stream("recent") is None
    assert await store.get_stream("running") is not None, "a stream still open is never trimmed by age"


async def test_each_session_keeps_its_newest_completed_streams_up_to_the_count(
    opened: Callable[..., SqliteStore],
) -> None:
    clock = Clock()
    store = opened(max_completed_streams_per_session=3, clock=clock)
    await store.open()
    await store.put_session(session("s1"))
    await store.put_session(session("s2", BOB))
    for n in range(5):
        clock.now = 1_000.0 + n
        await finished_call(store, f"s1-call-{n}")
    await finished_call(store, "s2-call-0", "s2")
    await finished_call(store, "s2-call-1", "s2")
    await store.open_stream(stream("s1-running"))

    await store.sweep()

    kept = [n for n in range(5) if await store.get_stream(f"s1-call-{n}") is not None]
    assert kept == [2, 3, 4]
    assert await store.read_after("s1-call-0", -1) == []
    assert await store.get_stream("s2-call-0") is not None and await store.get_stream("s2-call-1") is not None
    assert await store.get_stream("s1-running") is not None


async def test_the_sweep_runs_by_itself(opened: Callable[..., SqliteStore]) -> None:
    clock = Clock()
    store = opened(retention_seconds=10, sweep_seconds=0.05, clock=clock)
    await store.open()
    await finished_call(store, "done")
    clock.now += 11
    clock.arm()  # nothing else is written from here on: the next readings of the clock are sweeps'
    for _ in range(2):  # the second sweep starts only after the first one finished
        assert await anyio.to_thread.run_sync(clock.called.wait, 10), "no sweep within 10 s"
        clock.called.clear()
    assert await store.get_stream("done") is None


async def test_the_file_gives_back_what_deleted_sessions_held(tmp_path: Path) -> None:
    path = tmp_path / "growth.db"
    payload = b"x" * 1_000

    async def fill_and_measure(store: SqliteStore, session_id: str) -> None:
        await store.put_session(session(session_id, ALICE))
        for n in range(10):
            key = f"{session_id}-{n}"
            await store.open_stream(stream(key, session_id))
            queued = [
                store.enqueue(event(key, seq, session_id=session_id)._replace(data=payload)) for seq in range(150)
            ]
            await asyncio.gather(*queued)

    store = SqliteStore(str(path))
    await store.open()
    await fill_and_measure(store, "first")
    await store.close()
    full = path.stat().st_size
    assert full > 3_000_000

    for cycle in range(4):
        store = SqliteStore(str(path))
        await store.open()
        await store.delete_session("first" if cycle == 0 else f"cycle-{cycle - 1}")
        await store.sweep()
        await fill_and_measure(store, f"cycle-{cycle}")
        await store.close()
        assert path.stat().st_size < 1.5 * full, f"cycle {cycle}: the file grew instead of reusing pages"

    store = SqliteStore(str(path))
    await store.open()
    await store.delete_session("cycle-3")
    await store.sweep()
    await store.close()
    assert path.stat().st_size < full / 10, "the free pages went back to the file system"


async def test_a_running_store_gives_back_what_a_deleted_session_held_without_waiting_for_a_sweep(
    tmp_path: Path,
) -> None:
    """Issue 11, M4: a live server's DELETE shrinks the database and its WAL (not only at close or the next sweep)."""
    path = tmp_path / "live.db"
    store = SqliteStore(str(path), sweep_seconds=3600)  # no periodic sweep during the test
    await store.open()
    try:

        def on_disk() -> int:
            return sum(f.stat().st_size for f in tmp_path.glob("live.db*") if not f.name.endswith("-shm"))

        await store.put_session(session("kept", ALICE))
        await store.open_stream(stream("small", "kept"))
        await store.append(event("small", 0, session_id="kept"))
        await store.put_session(session("big", ALICE))
        for n in range(4):  # about 5 MB in all: the first step of the clean-up returns all of it (8 MiB at most)
            key = f"big-{n}"
            await store.open_stream(stream(key, "big"))
            await asyncio.gather(
                *(store.enqueue(event(key, seq, session_id="big")._replace(data=b"x" * 1_000)) for seq in range(300))
            )
        full = on_disk()
        assert full > 3_000_000

        await store.delete_session("big")
        assert await store.get_session("kept") is not None  # queued after the delete: served after its clean-up

        assert on_disk() < full / 10, f"{on_disk():,} bytes left of {full:,} after the DELETE"
        assert [e.seq for e in await store.read_after("small", -1)] == [0]
    finally:
        await store.close()


async def test_settings_come_from_the_store_spec(tmp_path: Path) -> None:
    spec = f"sqlite:{tmp_path}/s.db?retention_seconds=60&max_completed_streams_per_session=5&max_events_per_stream=9"
    store = open_store(spec)
    assert isinstance(store, SqliteStore)
    assert (store.path, store.retention_seconds, store.max_completed_streams_per_session) == (
        f"{tmp_path}/s.db",
        60.0,
        5,
    )
    assert store.max_events_per_stream == 9
    defaults = open_store(f"sqlite:{tmp_path}/d.db")
    assert isinstance(defaults, SqliteStore)
    assert (defaults.retention_seconds, defaults.max_completed_streams_per_session) == (3600, 1000)
    assert defaults.max_events_per_stream is None
    for bad, message in (
        ("retention_seconds=soon", "not a valid float"),
        ("retention_seconds=0", "must be positive"),
        ("keep=everything", "unknown setting 'keep'"),
    ):
        with pytest.raises(ValueError, match=message):
            open_store(f"sqlite:{tmp_path}/b.db?{bad}")


VERSION_1 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, issuer TEXT NOT NULL, subject TEXT NOT NULL,
    client_id TEXT NOT NULL, protocol_version TEXT NOT NULL, created_at REAL NOT NULL, last_seen REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX sessions_by_last_seen ON sessions (last_seen);
CREATE TABLE streams (stream TEXT PRIMARY KEY, session_id TEXT NOT NULL, kind TEXT NOT NULL, owner TEXT NOT NULL,
    requests TEXT NOT NULL, last_seq INTEGER NOT NULL, first_seq INTEGER NOT NULL, completed INTEGER NOT NULL,
    answered TEXT NOT NULL
) WITHOUT ROWID;
CREATE INDEX streams_by_session ON streams (session_id);
CREATE TABLE events (stream TEXT NOT NULL, seq INTEGER NOT NULL, event_id TEXT NOT NULL, request_id TEXT, tool TEXT,
    resources TEXT NOT NULL, data BLOB NOT NULL, terminal INTEGER NOT NULL, PRIMARY KEY (stream, seq)
) WITHOUT ROWID;
INSERT INTO meta VALUES ('secret', x'000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f');
INSERT INTO sessions VALUES ('s1', 'https://issuer.example', 'alice', 'client-1', '2025-11-25', 50.0, 100.0);
INSERT INTO streams VALUES ('k1', 's1', 'post', 'instance-1', '[]', 1, 0, 1, '[1]');
INSERT INTO events VALUES ('k1', 0, 'k1.0.mac', NULL, 'a', '["https://mcp.example/tools/a"]', x'', 0);
INSERT INTO events VALUES ('k1', 1, 'k1.1.mac', '1', 'a', '["https://mcp.example/tools/a"]', x'7b7d', 1);
PRAGMA user_version = 1;
"""


async def test_a_version_1_file_is_carried_forward(tmp_path: Path) -> None:
    path = tmp_path / "v1.db"
    with sqlite3.connect(path) as old:
        old.executescript(VERSION_1)
    clock = Clock(5_000.0)
    store = SqliteStore(str(path), retention_seconds=100, clock=clock)
    await store.open()
    try:
        assert await store.secret() == bytes(range(32))
        assert await store.get_session("s1") == session("s1")
        assert await store.read_after("k1", -1) == [
            StoredEvent("s1", "k1", 0, "k1.0.mac", b"", None, "a", TOOL_A, False),
            StoredEvent("s1", "k1", 1, "k1.1.mac", b"{}", 1, "a", TOOL_A, True),
        ]
        await store.sweep(now=5_050.0)
        assert await store.get_stream("k1") is not None, "its completion counts from when the file was opened"
        await store.sweep(now=5_101.0)
        assert await store.get_stream("k1") is None
    finally:
        await store.close()
    with sqlite3.connect(path) as reopened:
        assert reopened.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        assert reopened.execute("PRAGMA user_version").fetchone()[0] == 7
        assert reopened.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0, "the tasks table (schema 6) is made"


VERSION_2 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, issuer TEXT NOT NULL, subject TEXT NOT NULL,
    client_id TEXT NOT NULL, protocol_version TEXT NOT NULL, created_at REAL NOT NULL, last_seen REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX sessions_by_last_seen ON sessions (last_seen);
CREATE TABLE streams (stream TEXT PRIMARY KEY, session_id TEXT NOT NULL, kind TEXT NOT NULL, owner TEXT NOT NULL,
    requests TEXT NOT NULL, last_seq INTEGER NOT NULL, first_seq INTEGER NOT NULL, completed INTEGER NOT NULL,
    answered TEXT NOT NULL, completed_at REAL
) WITHOUT ROWID;
CREATE INDEX streams_by_session ON streams (session_id);
CREATE INDEX completed_streams_by_session ON streams (session_id, completed_at) WHERE completed_at IS NOT NULL;
CREATE TABLE events (stream TEXT NOT NULL, seq INTEGER NOT NULL, event_id TEXT NOT NULL, request_id TEXT, tool TEXT,
    resources TEXT NOT NULL, data BLOB NOT NULL, terminal INTEGER NOT NULL, PRIMARY KEY (stream, seq)
) WITHOUT ROWID;
INSERT INTO meta VALUES ('secret', x'000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f');
INSERT INTO sessions VALUES ('s1', 'https://issuer.example', 'alice', 'client-1', '2025-11-25', 50.0, 100.0);
INSERT INTO sessions VALUES ('s2', 'https://issuer.example', 'bob', 'client-2', '2025-11-25', 50.0, 100.0);
INSERT INTO streams VALUES ('done', 's1', 'post', 'instance-1',
    '[{"id":1,"method":"tools/call","tool":"a","resources":["https://mcp.example/tools/a"]}]', 2, 1, 1, '[1]', 900.0);
INSERT INTO streams VALUES ('open', 's1', 'post', 'instance-1',
    '[{"id":"2","method":"tools/call","tool":"a","resources":["https://mcp.example/tools/a"]}]', 1, 0, 0, '[]', NULL);
INSERT INTO streams VALUES ('bobs', 's2', 'get', 'instance-1', '[]', 0, 0, 0, '[]', NULL);
INSERT INTO events VALUES ('done', 1, 'done.1.mac', NULL, 'a', '["https://mcp.example/tools/a"]', x'', 0);
INSERT INTO events VALUES ('done', 2, 'done.2.mac', '1', 'a', '["https://mcp.example/tools/a"]', x'7b7d', 1);
INSERT INTO events VALUES ('open', 0, 'open.0.mac', '"2"', 'a', '["https://mcp.example/tools/a"]', x'5b5d', 0);
INSERT INTO events VALUES ('open', 1, 'open.1.mac', '"2"', 'a', '["https://mcp.example/tools/a"]', x'5b315d', 0);
PRAGMA user_version = 2;
"""


async def test_a_version_2_file_is_carried_forward(tmp_path: Path) -> None:
    """Every record of a version-2 file reads back the same from schema 4, and the store goes on from it: the open
    stream takes its next position and completes, a new stream is added, retention and DELETE still apply."""
    path = tmp_path / "v2.db"
    with sqlite3.connect(path) as old:
        old.executescript(VERSION_2)
    clock = Clock(5_000.0)
    store = SqliteStore(str(path), retention_seconds=1_000, clock=clock)
    await store.open()
    try:
        assert await store.secret() == bytes(range(32))
        assert await store.get_session("s2") == session("s2", BOB)
        done = await store.get_stream("done")
        assert done is not None and (done.completed, done.last_seq, done.answered) == (True, 2, frozenset({1}))
        assert done.requests == (CALL,)
        assert await store.read_after("done", 0) == [
            StoredEvent("s1", "done", 1, "done.1.mac", b"", None, "a", TOOL_A, False),
            StoredEvent("s1", "done", 2, "done.2.mac", b"{}", 1, "a", TOOL_A, True),
        ]
        with pytest.raises(EventsEvicted):  # its first position was trimmed before: still so
            await store.read_after("done", -1)
        call = PendingRequest("2", "tools/call", "a", TOOL_A)
        with pytest.raises(ValueError):  # the migrated stream's last position is still 1
            await store.append(event("open", 3, request_id="2"))
        await store.append(StoredEvent("s1", "open", 2, "open.2.mac", b"{}", "2", "a", TOOL_A, True), completes=True)
        opened = await store.get_stream("open")
        assert opened is not None and (opened.completed, opened.last_seq, opened.requests) == (True, 2, (call,))
        assert [(e.seq, e.request_id, e.data) for e in await store.read_after("open", -1)] == [
            (0, "2", b"[]"),
            (1, "2", b"[1]"),
            (2, "2", b"{}"),
        ]
        await finished_call(store, "new", "s2")
        assert [e.seq for e in await store.read_after("new", -1)] == [0, 1, 2]
        assert await store.read_after("bobs", -1) == []

        await store.sweep(now=1_901.0)  # "done" completed at 900 in the old file
        assert await store.get_stream("done") is None
        assert await store.get_stream("open") is not None
        await store.delete_session("s2")
        assert await store.get_stream("new") is None and await store.get_stream("bobs") is None
        assert await store.read_after("new", -1) == []
        assert [e.seq for e in await store.read_after("open", -1)] == [0, 1, 2]
    finally:
        await store.close()
    with sqlite3.connect(path) as reopened:
        assert reopened.execute("PRAGMA user_version").fetchone()[0] == 7
        assert reopened.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0, "the tasks table (schema 6) is made"
        tables = {row[0] for row in reopened.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert tables == {"meta", "sessions", "streams", "events", "session_streams", "tasks", "idempotency_keys"}
        assert reopened.execute("SELECT count(*) FROM events").fetchone()[0] == 3


VERSION_3 = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE sessions (session_id TEXT PRIMARY KEY, issuer TEXT NOT NULL, subject TEXT NOT NULL,
    client_id TEXT NOT NULL, protocol_version TEXT NOT NULL, created_at REAL NOT NULL, last_seen REAL NOT NULL
) WITHOUT ROWID;
CREATE INDEX sessions_by_last_seen ON sessions (last_seen);
CREATE TABLE streams (id INTEGER PRIMARY KEY, stream TEXT NOT NULL UNIQUE, session_id TEXT NOT NULL,
    kind TEXT NOT NULL, owner TEXT NOT NULL, requests TEXT NOT NULL, last_seq INTEGER NOT NULL,
    first_seq INTEGER NOT NULL, completed INTEGER NOT NULL, answered TEXT NOT NULL, completed_at REAL
);
CREATE INDEX streams_by_session ON streams (session_id, completed_at);
CREATE TABLE events (stream_id INTEGER NOT NULL, seq INTEGER NOT NULL, event_id TEXT NOT NULL, request_id TEXT,
    tool TEXT, resources TEXT NOT NULL, data BLOB NOT NULL, terminal INTEGER NOT NULL, PRIMARY KEY (stream_id, seq)
) WITHOUT ROWID;
INSERT INTO meta VALUES ('secret', x'000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f');
INSERT INTO sessions VALUES ('s1', 'https://issuer.example', 'alice', 'client-1', '2025-11-25', 50.0, 100.0);
INSERT INTO streams VALUES (1, 'old', 's1', 'post', 'instance-1', '[]', 1, 0, 1, '[1]', 900.0);
INSERT INTO streams VALUES (2, 'newer', 's1', 'post', 'instance-1', '[]', 0, 0, 1, '[]', 950.0);
INSERT INTO streams VALUES (3, 'open', 's1', 'post', 'instance-1', '[]', 0, 0, 0, '[]', NULL);
INSERT INTO events VALUES (1, 0, 'old.0.mac', NULL, 'a', '["https://mcp.example/tools/a"]', x'', 0);
INSERT INTO events VALUES (1, 1, 'old.1.mac', '1', 'a', '["https://mcp.example/tools/a"]', x'7b7d', 1);
INSERT INTO events VALUES (3, 0, 'open.0.mac', NULL, 'a', '["https://mcp.example/tools/a"]', x'', 0);
PRAGMA user_version = 3;
"""


@pytest.mark.parametrize("version", [3, 4])
async def test_a_version_3_or_4_file_is_carried_forward(tmp_path: Path, version: int) -> None:
    """Schemas 4 and 5 index the same tables differently: a version-3 or version-4 file (version 4: the index by
    session alone) keeps its rows, has its streams indexed in ``session_streams``, and retention by count and by
    age, DELETE and new streams work on it."""
    path = tmp_path / f"v{version}.db"
    script = VERSION_3
    if version == 4:
        script = script.replace("(session_id, completed_at);", "(session_id);").replace(
            "PRAGMA user_version = 3;",
            "CREATE INDEX completed_streams ON streams (completed_at, session_id) WHERE completed_at IS NOT NULL;"
            " PRAGMA user_version = 4;",
        )
    with sqlite3.connect(path) as old:
        old.executescript(script)
    store = SqliteStore(str(path), retention_seconds=1_000, max_completed_streams_per_session=1, clock=Clock(5_000.0))
    await store.open()
    try:
        assert await store.read_after("old", -1) == [
            StoredEvent("s1", "old", 0, "old.0.mac", b"", None, "a", TOOL_A, False),
            StoredEvent("s1", "old", 1, "old.1.mac", b"{}", 1, "a", TOOL_A, True),
        ]
        await store.open_stream(stream("new"))
        await store.append(event("new", 0))
        assert [e.seq for e in await store.read_after("new", -1)] == [0]
        await store.sweep(now=1_000.0)  # neither is past its age yet: the count keeps the newest completed one
        assert await store.get_stream("old") is None and await store.read_after("old", -1) == []
        assert await store.get_stream("newer") is not None and await store.get_stream("open") is not None
        await store.sweep(now=1_951.0)
        assert await store.get_stream("newer") is None
        await store.delete_session("s1")
        assert await store.get_stream("open") is None and await store.get_stream("new") is None
        assert await store.read_after("new", -1) == []
    finally:
        await store.close()
    with sqlite3.connect(path) as reopened:
        assert reopened.execute("PRAGMA user_version").fetchone()[0] == 7
        assert reopened.execute("SELECT count(*) FROM tasks").fetchone()[0] == 0, "the tasks table (schema 6) is made"
        names = {row[0] for row in reopened.execute("SELECT name FROM sqlite_master")}
        assert {"session_streams", "completed_streams"} <= names and "streams_by_session" not in names
        assert reopened.execute("SELECT count(*) FROM events").fetchone()[0] == 0
        assert reopened.execute("SELECT count(*) FROM session_streams").fetchone()[0] == 0


async def _kept_and_newest(path: Path, newest: str) -> SqliteStore:
    """An open store at ``path`` with a finished call "kept" in session s1 and then one named ``newest`` in s2, so
    s2 holds the largest stream id: the start of both tests of ids after that session's deletion."""
    store = SqliteStore(str(path))
    await store.open()
    try:
        await store.put_session(session("s1", ALICE))
        await store.put_session(session("s2", ALICE))
        await finished_call(store, "kept", "s1")
        await finished_call(store, newest, "s2")
    except BaseException:
        await store.close()
        raise
    return store


async def test_a_stream_opened_after_the_newest_was_deleted_gets_a_new_id(tmp_path: Path) -> None:
    """The store carries the next stream id from one transaction to the next (the largest id is read once): a
    stream opened after the newest one's session was deleted gets an id never given before, at the end of the
    tables as every new stream's (the id was read per transaction before, and a deleted largest id given again)."""
    path = tmp_path / "ids.db"
    store = await _kept_and_newest(path, "newest")
    try:
        await store.delete_session("s2")
        await finished_call(store, "after", "s1")
    finally:
        await store.close()
    db = sqlite3.connect(path)
    try:
        ids = dict(db.execute("SELECT stream, id FROM streams").fetchall())
    finally:
        db.close()
    assert set(ids) == {"kept", "after"}
    assert ids["after"] == ids["kept"] + 2  # not kept + 1, the deleted newest stream's id


def _rows(path: Path, query: str) -> list[tuple[object, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(query).fetchall()
    finally:
        db.close()


async def test_a_sessions_deletion_takes_its_indexed_and_its_not_yet_indexed_streams_and_only_those(
    tmp_path: Path,
) -> None:
    """Streams are indexed by session in bulk (schema 5), not in the commit that opens them: a session's DELETE
    finds both the streams ``session_streams`` holds and those opened since its last indexing."""
    path = tmp_path / "index.db"
    store = SqliteStore(str(path))
    await store.open()
    try:
        for name in ("s1", "s2"):
            await store.put_session(session(name, ALICE))
        await finished_call(store, "indexed", "s1")
        await finished_call(store, "other", "s2")
        await store.sweep()  # indexes both
        await finished_call(store, "fresh", "s1")
        await store.open_stream(stream("running", "s1"))
        await store.append(event("running", 0, session_id="s1"))
        assert _rows(path, "SELECT session_id, stream_id FROM session_streams ORDER BY stream_id") == [
            ("s1", 1),
            ("s2", 2),
        ]
        await store.delete_session("s1")
        for key in ("indexed", "fresh", "running"):
            assert await store.get_stream(key) is None and await store.read_after(key, -1) == []
        assert await store.get_stream("other") is not None and len(await store.read_after("other", -1)) == 3
    finally:
        await store.close()
    assert _rows(path, "SELECT session_id FROM session_streams") == [("s2",)]
    assert _rows(path, "SELECT DISTINCT stream_id FROM events") == [(2,)]


async def test_stream_ids_do_not_go_back_across_a_restart_so_every_stream_is_found_by_its_session(
    tmp_path: Path,
) -> None:
    """After the streams with the largest ids went (their session deleted), a restarted store gives ids above every
    id it indexed, so a later stream is neither skipped by the indexing nor by a deletion's range."""
    path = tmp_path / "restart.db"
    store = await _kept_and_newest(path, "gone")
    try:
        await store.sweep()
        await store.delete_session("s2")
    finally:
        await store.close()
    store = SqliteStore(str(path))
    await store.open()
    try:
        await finished_call(store, "after", "s1")
        await store.sweep()
        assert _rows(path, "SELECT stream_id FROM session_streams ORDER BY stream_id") == [(1,), (3,)]
        await store.delete_session("s1")
        assert await store.get_stream("after") is None and await store.get_stream("kept") is None
    finally:
        await store.close()
    assert _rows(path, "SELECT count(*) FROM streams") == [(0,)]
