"""The tasks/stream decision (core/task_stream.py) against an independent oracle, no server: as test_resume.py
holds decide_resume. Each world is a task's retained stream, a cursor and a token; the decision, asked until it
answers, must send exactly the retained events after the cursor or refuse explicitly, never a shorter stream."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core.events import Loss, StoredEvent, StreamKind, StreamRecord
from mcp_lossless.core.principal import Grant, Principal
from mcp_lossless.core.resources import AudiencePolicy
from mcp_lossless.core.task_stream import (
    EventsGone,
    NeedEarliest,
    NeedTaskEvents,
    StreamDenied,
    StreamFacts,
    TaskReplay,
    Then,
    decide_task_stream,
    stream_of,
)
from mcp_lossless.core.tasks import Deliver, Denied, Requirement, Unknown, new_task

CANONICAL = "https://mcp.example/mcp"
FETCH = f"{CANONICAL}/tools/fetch"
SEARCH = f"{CANONICAL}/tools/search"
POLICY = AudiencePolicy(CANONICAL, [FETCH, SEARCH])
ALICE = Principal("https://as.example", "alice", "app")
TASK = "t-1"
NOW = 1000.0


def events(count: int, first: int, terminal: bool) -> list[StoredEvent]:
    sid = stream_of(TASK)
    return [
        StoredEvent(
            sid, sid, seq, f"{sid}.{seq}", b"{}", TASK, "fetch", frozenset({FETCH}), terminal and seq == count - 1
        )
        for seq in range(first, count)
    ]


def decide(
    after: object, look: object, record: StreamRecord | None, held: list[StoredEvent], grant: Grant
) -> tuple[object, int]:
    """Ask until answered, as the adapter does; returns the outcome and the number of questions asked."""
    facts = StreamFacts(TASK, after, look)  # type: ignore[arg-type]
    first = held[0].seq if held else (record.last_seq + 1 if record else 0)
    asked = 0
    while True:
        outcome = decide_task_stream(facts, grant, POLICY, NOW)
        if isinstance(outcome, NeedTaskEvents):
            asked += 1
            facts.record, facts.read = record, True
            facts.events = None if outcome.after + 1 < first else [e for e in held if e.seq > outcome.after]
        elif isinstance(outcome, NeedEarliest):
            asked += 1
            facts.earliest = first
        else:
            return outcome, asked


@given(
    count=st.integers(1, 12),
    evicted=st.integers(0, 12),
    terminal=st.booleans(),
    lost=st.sampled_from([None, Loss.OWNER]),
    after=st.one_of(st.none(), st.integers(-3, 15), st.sampled_from(["1", 1.5, True])),
    audience=st.sampled_from([{CANONICAL}, {FETCH}, {SEARCH}]),
)
def test_exactly_the_retained_events_after_the_cursor_or_an_explicit_refusal(
    count: int, evicted: int, terminal: bool, lost: Loss | None, after: object, audience: set[str]
) -> None:
    terminal = terminal and lost is None
    first = min(evicted, count)
    held = events(count, first, terminal)
    record = StreamRecord(
        stream_of(TASK), stream_of(TASK), StreamKind.POST, "o", (), count - 1, terminal or lost is not None, lost=lost
    )
    grant = Grant(ALICE, frozenset(audience))
    task = new_task(TASK, ALICE, "fetch", Requirement(frozenset({FETCH})), "o", NOW, None)
    covered = audience != {SEARCH}
    look = Deliver(task, None) if covered else Denied(TASK, (FETCH,), (), task.requirement, None)
    outcome, _ = decide(after, look, record, held, grant)
    malformed = not (after is None or (type(after) is int and after >= 0))
    if malformed:
        assert outcome == Unknown(TASK), "a malformed cursor reads as an unknown task"
        return
    cursor = -1 if after is None else after
    assert isinstance(cursor, int)
    if not covered:
        assert outcome == StreamDenied(TASK, (FETCH,), None if after is None else cursor), "nothing sent, cursor kept"
        return
    if cursor > count - 1:
        assert outcome == Unknown(TASK), "a cursor this task never gave"
        return
    if cursor + 1 < first:
        assert outcome == EventsGone(TASK, first), "never a shorter stream"
        return
    assert isinstance(outcome, TaskReplay)
    assert [e.seq for e in outcome.events] == list(range(cursor + 1, count)), "each retained seq after it, once"
    expected = Then.END if terminal else Then.LOST if lost else Then.FOLLOW
    assert outcome.then is expected


def test_a_foreign_task_asks_nothing_of_the_store() -> None:
    outcome, asked = decide(3, Unknown(TASK), None, [], Grant(ALICE, frozenset({CANONICAL})))
    assert outcome == Unknown(TASK) and asked == 0


def test_a_task_whose_stream_is_gone_is_events_gone() -> None:
    task = new_task(TASK, ALICE, "fetch", Requirement(frozenset({FETCH})), "o", NOW, None)
    outcome, _ = decide(None, Deliver(task, None), None, [], Grant(ALICE, frozenset({CANONICAL})))
    assert outcome == EventsGone(TASK, None)


def test_an_expired_token_is_refused_at_the_first_event() -> None:
    task = new_task(TASK, ALICE, "fetch", Requirement(frozenset({FETCH})), "o", NOW, None)
    record = StreamRecord(stream_of(TASK), stream_of(TASK), StreamKind.POST, "o", (), 2)
    grant = Grant(ALICE, frozenset({CANONICAL}), expires_at=NOW - 1)
    outcome, _ = decide(0, Deliver(task, None), record, events(3, 0, False), grant)
    assert isinstance(outcome, StreamDenied) and outcome.expired and outcome.cursor == 0
