"""The SQLite store's key journal (ADR 0029, :mod:`mcp_lossless.stores.key_journal`): a keyed stream's record is
durable when ``enqueue_open`` returns, before its transaction commits, so a process SIGKILLed in between leaves a key
the next open finds (its stream unanswered: execution lost), never a key forgotten and its call run again. The
segments go once their records are committed."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mcp_lossless.core.events import PendingRequest, StoredEvent, StreamKind, StreamRecord
from mcp_lossless.core.idempotency import KeyRecord, StreamTarget
from mcp_lossless.core.principal import Principal
from mcp_lossless.stores.base import SessionRecord, StoreUnavailable
from mcp_lossless.stores.sqlite import SqliteStore

pytestmark = pytest.mark.anyio

ALICE = Principal("https://issuer.example", "alice", "client-1")
TAGS = frozenset({"https://mcp.example/tools/charge"})
CALL = PendingRequest(1, "tools/call", "charge", TAGS)

CHILD = """
import asyncio, sys, time
from mcp_lossless.core.events import PendingRequest, StreamKind, StreamRecord
from mcp_lossless.core.idempotency import KeyRecord, StreamTarget
from mcp_lossless.core.principal import Principal
from mcp_lossless.stores.sqlite import SqliteStore

async def main() -> None:
    store = SqliteStore(sys.argv[1])
    await store.open()
    print("opened", flush=True)
    alice = Principal("https://issuer.example", "alice", "client-1")
    call = PendingRequest(1, "tools/call", "charge", frozenset({"https://mcp.example/tools/charge"}))
    record = StreamRecord("s1", "keyed", StreamKind.POST, "the-killed-one", (call,), 0)
    now = time.time()
    key = KeyRecord(alice, "k-1", "charge", "hash", StreamTarget("keyed", 1), now, now + 3600)
    sys.stdin.readline()  # the test holds the file's write lock now: the record cannot commit
    store.enqueue_open(record, [key])
    print("journaled", flush=True)  # the call would start now
    await asyncio.sleep(60)

asyncio.run(main())
"""


def spawn(path: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )


def journal_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if "-keys." in p.name)


async def test_a_keyed_record_journaled_but_not_committed_survives_sigkill(tmp_path: Path) -> None:
    path = str(tmp_path / "keys.db")
    child = spawn(path)
    assert child.stdin is not None and child.stdout is not None
    try:
        assert await asyncio.to_thread(child.stdout.readline) == "opened\n"
        lock = sqlite3.connect(path, timeout=10)
        lock.execute("BEGIN EXCLUSIVE")
        child.stdin.write("go\n")
        child.stdin.flush()
        assert await asyncio.to_thread(child.stdout.readline) == "journaled\n"
        child.send_signal(signal.SIGKILL)
        child.wait(10)
        lock.rollback()
        lock.close()
        with sqlite3.connect(path) as db:
            assert db.execute("SELECT count(*) FROM idempotency_keys").fetchone()[0] == 0, "never committed"
        db.close()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)

    store = SqliteStore(path)
    await store.open()
    try:
        found = await store.get_key(ALICE, "k-1", time.time())
        assert found is not None and found.target == StreamTarget("keyed", 1)
        stream = await store.get_stream("keyed")
        assert stream is not None and stream.owner == "the-killed-one"
        assert (stream.completed, stream.answered) == (False, frozenset()), "unanswered: its key is execution lost"
    finally:
        await store.close()
    assert journal_files(tmp_path) == [], "the recovered segments went"


async def test_segments_go_once_their_records_are_committed(tmp_path: Path) -> None:
    store = SqliteStore(str(tmp_path / "keys.db"))
    await store.open()
    try:
        await store.put_session(SessionRecord("s1", ALICE, "2025-11-25", created_at=50.0, last_seen=100.0))
        now = time.time()
        for n in range(3):
            name = f"keyed-{n}"
            key = KeyRecord(ALICE, f"k-{n}", "charge", "hash", StreamTarget(name, 1), now, now + 3600)
            opening = store.enqueue_open(StreamRecord("s1", name, StreamKind.POST, "me", (CALL,), 0), [key])
            answer = StoredEvent("s1", name, 1, f"{name}.1", b"{}", 1, "charge", TAGS, True)
            await store.enqueue(answer, completes=True)
            assert opening.done() and opening.exception() is None
        assert journal_files(tmp_path), "the open segment is kept while written"
        assert [await store.get_key(ALICE, f"k-{n}", now) is not None for n in range(3)] == [True] * 3
    finally:
        await store.close()
    assert journal_files(tmp_path) == [], "all committed: nothing to read back"


async def test_a_duplicate_reads_a_journaled_key_once_its_record_committed(tmp_path: Path) -> None:
    """A key journaled, its transaction held back (another connection holds the write lock): the store knows the key
    at once (no first use again), and :meth:`get_key` answers only once the record committed, with the record."""
    path = str(tmp_path / "keys.db")
    store = SqliteStore(path)
    await store.open()
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        await store.put_session(SessionRecord("s1", ALICE, "2025-11-25", created_at=50.0, last_seen=100.0))
        now = time.time()
        key = KeyRecord(ALICE, "k-1", "charge", "hash", StreamTarget("keyed", 1), now, now + 3600)
        blocker.execute("BEGIN IMMEDIATE")
        opening = store.enqueue_open(StreamRecord("s1", "keyed", StreamKind.POST, "me", (CALL,), 0), [key])
        assert not store.lacks_key(ALICE, "k-1", now), "known from the journal on: a duplicate is no first use"
        duplicate = asyncio.ensure_future(store.get_key(ALICE, "k-1", now))
        await asyncio.sleep(0)  # the duplicate's read is under way (a loop turn, not a wait for time)
        assert not opening.done() and not duplicate.done()
        blocker.execute("ROLLBACK")
        found = await duplicate
        assert opening.done() and opening.exception() is None, "answered only once the record committed"
        assert found == key
    finally:
        blocker.close()
        await store.close()


async def test_a_journaled_record_whose_transaction_fails_stays_known_and_is_read_back(tmp_path: Path) -> None:
    """Its transaction fails (another connection holds the file past the busy timeout): the open fails, the key stays
    known to the process (a duplicate finds it: its outcome is lost, never a second run), and its segment stays for
    the next open, which inserts the key with its unanswered stream. The journal settles after the batch's outcomes
    (not a done callback per record), so this holds for a record settled that way too."""
    path = str(tmp_path / "keys.db")
    store = SqliteStore(path)
    await store.open()
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        await store.put_session(SessionRecord("s1", ALICE, "2025-11-25", created_at=50.0, last_seen=100.0))
        now = time.time()
        key = KeyRecord(ALICE, "k-1", "charge", "hash", StreamTarget("keyed", 1), now, now + 3600)
        blocker.execute("BEGIN EXCLUSIVE")
        opening = store.enqueue_open(StreamRecord("s1", "keyed", StreamKind.POST, "me", (CALL,), 0), [key])
        with pytest.raises(StoreUnavailable):
            await opening  # the writer's busy timeout (2 s) passes with the file held
        blocker.execute("ROLLBACK")
        assert not store.lacks_key(ALICE, "k-1", now)
        assert await store.get_key(ALICE, "k-1", now) == key, "known in process: its transaction failed"
    finally:
        blocker.close()
        await store.close()
    assert journal_files(tmp_path), "its segment stays for the next open"
    store = SqliteStore(path)
    await store.open()
    try:
        assert await store.get_key(ALICE, "k-1", now) == key
        stream = await store.get_stream("keyed")
        assert stream is not None and (stream.completed, stream.answered) == (False, frozenset())
    finally:
        await store.close()
    assert journal_files(tmp_path) == [], "read back, then gone"
