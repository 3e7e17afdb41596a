"""The client's rule for following a task's event stream (:func:`mcp_lossless.client.task_follow.follow`): every event
handed on exactly once and in order, whatever breaks, refuses or repeats."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.client.task_follow import (
    MAX_STREAM_GRANTS,
    Cut,
    Ended,
    Event,
    Fail,
    Finish,
    Following,
    Gone,
    HandOn,
    Poll,
    Regrant,
    ResumeAfter,
    Said,
    Skip,
    Step,
    StreamRefusal,
    follow,
)
from mcp_lossless.core import denials
from mcp_lossless.core.errors import INVALID_PARAMS, TASK_DENIED, TASK_EXECUTION_LOST
from mcp_lossless.core.task_stream import EVENTS_GONE, EventType

PROGRESS, OUTCOME = EventType.PROGRESS.value, EventType.OUTCOME.value
FETCH = "http://127.0.0.1:1/mcp/tools/fetch"


def event(seq: int, kind: str = PROGRESS) -> Event:
    return Event(seq, kind, {"progress": seq})


def denial(missing: list[str] | None = None, remediation: str | None = None) -> StreamRefusal:
    data = denials.refusal_fields("t", missing or [FETCH], taskId="t", lastSeq=1, resumable=True)
    if remediation is not None:
        data["authorization"] = {**data["authorization"], "remediation": remediation}
    return StreamRefusal(TASK_DENIED, "denied", data, frozenset({FETCH}))


def test_events_in_order_are_delivered_and_move_the_cursor() -> None:
    state = Following("t")
    for seq in range(3):
        state, step = follow(state, event(seq))
        assert step == HandOn(PROGRESS, {"progress": seq}) and state.cursor == seq
    state, step = follow(state, Event(3, OUTCOME, {"status": "completed"}))
    assert step == Finish({"status": "completed"}) and state.cursor == 3


def test_a_repeated_seq_is_skipped_and_a_skipped_one_is_told_as_gone() -> None:
    state = Following("t", cursor=4)
    assert follow(state, event(4)) == (state, Skip())
    assert follow(state, event(2)) == (state, Skip())
    assert follow(state, event(6)) == (state, Gone(4, None)), "never delivered with a hole"
    assert follow(Following("t"), event(1)) == (Following("t"), Gone(None, None)), "seq starts at 0"


def test_a_cut_resumes_after_the_last_delivered_seq_at_once_then_later() -> None:
    state = Following("t", cursor=2)
    delays = []
    for _ in range(8):
        state, step = follow(state, Cut("reset"))
        assert isinstance(step, ResumeAfter) and step.after == 2
        delays.append(step.delay)
    assert delays[0] == 0 and delays == sorted(delays) and max(delays) <= 5.0
    state, _ = follow(state, event(3))
    assert follow(state, Cut("reset"))[1] == ResumeAfter(3, 0.0), "an event delivered resets the wait"


def test_a_denial_reauthorizes_for_what_it_names_then_resumes_from_the_cursor() -> None:
    state = Following("t", cursor=1)
    state, step = follow(state, denial())
    assert isinstance(step, Regrant) and step.after == 1 and step.resources == {FETCH}
    assert step.context is not None and step.context.startswith("authzctx_")
    for _ in range(MAX_STREAM_GRANTS - 1):
        state, step = follow(state, denial())
        assert isinstance(step, Regrant)
    assert isinstance(follow(state, denial())[1], Fail), "bounded: a server that keeps refusing ends the call"
    state, _ = follow(state, event(2))
    assert isinstance(follow(state, denial())[1], Regrant), "an event delivered restores the grants"


def test_a_denial_the_server_says_no_grant_can_help_fails_at_once() -> None:
    assert isinstance(follow(Following("t"), denial(remediation="unavailable"))[1], Fail)


def test_a_bare_challenge_reauthorizes_for_what_it_names() -> None:
    step = follow(Following("t"), StreamRefusal(None, "HTTP 401 without a JSON-RPC answer", None, frozenset({FETCH})))[
        1
    ]
    assert isinstance(step, Regrant) and step.resources == {FETCH}


def test_events_gone_names_the_cursor_and_the_earliest_held() -> None:
    data = {"reason": "events_gone", "taskId": "t", "earliestSeq": 7}
    assert follow(Following("t", cursor=2), StreamRefusal(EVENTS_GONE, "gone", data))[1] == Gone(2, 7)
    assert follow(Following("t"), StreamRefusal(EVENTS_GONE, "gone", {"earliestSeq": None}))[1] == Gone(None, None)


def test_what_the_stream_cannot_settle_is_left_to_tasks_get() -> None:
    for said in (
        Ended(),
        StreamRefusal(INVALID_PARAMS, "unknown task", None),
        StreamRefusal(TASK_EXECUTION_LOST, "execution lost", {"reason": "execution_lost"}),
        StreamRefusal(-32601, "method not found", None),
        StreamRefusal(None, "HTTP 502 without a JSON-RPC answer", None),
    ):
        assert isinstance(follow(Following("t", cursor=3), said)[1], Poll), said


said_strategy: st.SearchStrategy[Said] = st.one_of(
    st.builds(event, st.integers(0, 12)),
    st.just(Cut("reset")),
    st.just(denial()),
)


@given(st.lists(said_strategy, max_size=40))
def test_whatever_comes_each_seq_is_delivered_at_most_once_and_in_order(script: list[Said]) -> None:
    state, delivered = Following("t"), []
    for said in script:
        state, step = follow(state, said)
        if isinstance(step, HandOn):
            delivered.append(state.cursor)
        stop: tuple[type[Step], ...] = (Gone, Fail, Finish, Poll)
        if isinstance(step, stop):
            break
    assert delivered == list(range(len(delivered)))
