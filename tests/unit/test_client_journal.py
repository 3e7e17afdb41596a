"""The client's journal of pending keyed calls: its persisted form, and when a call stays pending or is settled."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from mcp_lossless.client import FileJournal, PendingCall, ToolFailed
from mcp_lossless.client.journal import journaled

CALL = PendingCall("charge", {"amount": 5, "note": "caf\u00e9"}, "0b5c4d1e-7f2a-4c3b-9e8d-112233445566")


def test_a_pending_call_round_trips_through_its_persisted_form() -> None:
    assert PendingCall.from_json(CALL.to_json()) == CALL
    tasked = PendingCall(CALL.tool, CALL.arguments, CALL.idempotency_key, "task-1")
    assert PendingCall.from_json(tasked.to_json()) == tasked


@pytest.mark.parametrize(
    "data",
    [
        b"[]",
        b'{"tool": "charge", "arguments": {}}',
        b'{"tool": "charge", "arguments": [], "idempotencyKey": "k"}',
        b'{"tool": "charge", "arguments": {}, "idempotencyKey": ""}',
        b'{"tool": "charge", "arguments": {}, "idempotencyKey": "k", "taskId": 7}',
    ],
)
def test_anything_else_is_refused_rather_than_reissued(data: bytes) -> None:
    with pytest.raises(ValueError):
        PendingCall.from_json(data)


def test_the_file_journal_keeps_one_entry_per_key_and_forgets_a_settled_one(tmp_path: Path) -> None:
    journal = FileJournal(tmp_path / "journal")
    other = PendingCall("fetch", {}, "another-key")
    journal.pending(CALL)
    journal.pending(other)
    tasked = PendingCall(CALL.tool, CALL.arguments, CALL.idempotency_key, "task-1")
    journal.pending(tasked)
    assert sorted(journal.calls(), key=lambda c: c.tool) == [tasked, other]
    assert FileJournal(tmp_path / "journal").calls() == journal.calls(), "another process reads the same"
    journal.settled(tasked)
    assert journal.calls() == [other]
    assert [p.name for p in (tmp_path / "journal").iterdir() if not p.name.endswith(".pending.json")] == []


def test_an_outcome_settles_the_call_and_a_cancellation_leaves_it_pending(tmp_path: Path) -> None:
    journal = FileJournal(tmp_path)
    with journaled(journal, CALL) as became_task:
        assert journal.calls() == [CALL], "kept before anything is sent"
        became_task("task-9")
        assert [c.task_id for c in journal.calls()] == ["task-9"]
    assert journal.calls() == []

    with pytest.raises(ToolFailed), journaled(journal, CALL):
        raise ToolFailed("charge", {"content": [], "isError": True})
    assert journal.calls() == [], "a tool error is an outcome"

    async def stopped() -> None:
        with anyio.CancelScope() as scope, journaled(journal, CALL):
            scope.cancel()
            await anyio.sleep(1)

    anyio.run(stopped)
    assert journal.calls() == [CALL], "a process stopping mid-call leaves it for the next"


def test_without_a_journal_or_a_key_nothing_is_kept(tmp_path: Path) -> None:
    journal = FileJournal(tmp_path)
    with journaled(None, CALL) as became_task, journaled(journal, None):
        became_task("task-1")
    assert journal.calls() == []
