"""Properties of the task core: the state diagram, the TTL rule, the wire and durable forms (the poll decision:
test_task_poll.py)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core import tasks
from mcp_lossless.core.errors import TASK_EXECUTION_LOST
from mcp_lossless.core.principal import Principal
from mcp_lossless.core.tasks import (
    IllegalTransition,
    Requirement,
    TaskStatus,
    advance,
    described,
    detailed_task,
    new_task,
    seen,
)

CANONICAL = "https://mcp.example/mcp"
TOOLS = [f"{CANONICAL}/tools/{name}" for name in ("fetch", "search", "write")]
ALICE = Principal("https://as.example", "alice", "app")
SCOPES = st.frozensets(st.sampled_from(["read", "write", "admin"]), max_size=3)
STATUSES = st.sampled_from(list(TaskStatus))


def outcome_for(status: TaskStatus, marker: str = "ok") -> dict[str, object]:
    if status is TaskStatus.COMPLETED:
        return {"result": {"content": [{"type": "text", "text": marker}], "isError": False}}
    if status is TaskStatus.FAILED:
        return {"error": {"code": -32603, "message": marker}}
    return {}


def fresh(ttl: float | None = 60.0, requirement: Requirement | None = None) -> tasks.TaskRecord:
    return new_task("t-1", ALICE, "fetch", requirement or Requirement(frozenset({TOOLS[0]})), "me", 1000.0, ttl)


@given(st.lists(st.tuples(STATUSES, st.floats(0, 100)), max_size=12))
def test_only_the_state_diagram_is_walked_and_terminal_is_final(steps: list[tuple[TaskStatus, float]]) -> None:
    record = fresh()
    now = record.created_at
    for status, delay in steps:
        now += delay
        allowed = not record.status.terminal and status is not record.status
        if allowed:
            after = advance(record, status, now, **outcome_for(status))  # type: ignore[arg-type]
            assert after.status is status and after.updated_at == now
            assert (after.result is not None) == (status is TaskStatus.COMPLETED)
            assert (after.error is not None) == (status is TaskStatus.FAILED)
            record = after
        else:
            with pytest.raises(IllegalTransition):
                advance(record, status, now, **outcome_for(status))  # type: ignore[arg-type]


@given(STATUSES)
def test_an_outcome_must_fit_its_status(status: TaskStatus) -> None:
    record = fresh()
    if status is TaskStatus.WORKING:
        return
    wrong = {"result": {"content": []}} if status is not TaskStatus.COMPLETED else {}
    with pytest.raises(IllegalTransition):
        advance(record, status, 1001.0, **wrong)  # type: ignore[arg-type]
    with pytest.raises(IllegalTransition):
        advance(record, TaskStatus.FAILED, 1001.0, error={"message": "no code"})


@given(STATUSES, st.floats(0, 100))
def test_progress_describes_a_live_task_without_changing_its_status_and_never_a_settled_one(
    status: TaskStatus, later: float
) -> None:
    record = fresh() if status is TaskStatus.WORKING else advance(fresh(), status, 1000.0, **outcome_for(status))  # type: ignore[arg-type]
    if status.terminal:
        with pytest.raises(IllegalTransition):
            described(record, "step 2/3", record.updated_at + later)
        return
    after = described(record, "step 2/3", record.updated_at + later)
    assert (after.status, after.message, after.result, after.error) == (status, "step 2/3", None, None)
    assert after.updated_at == record.updated_at + later, "activity: the TTL counts from it"
    assert detailed_task(after, 500)["statusMessage"] == "step 2/3"


def test_a_lost_task_fails_with_execution_lost_and_a_settled_one_cannot_be_lost() -> None:
    failed = tasks.lost(fresh(), 1005.0)
    assert failed.status is TaskStatus.FAILED
    assert failed.error is not None and failed.error["code"] == TASK_EXECUTION_LOST
    assert failed.error["data"] == {"reason": "execution_lost", "taskId": "t-1", "resumable": False}
    done = advance(fresh(), TaskStatus.COMPLETED, 1001.0, result={"content": []})
    with pytest.raises(IllegalTransition):
        tasks.lost(done, 1002.0)


@given(st.floats(0.5, 100), st.lists(st.floats(0, 1), min_size=1, max_size=20))
def test_an_owner_that_keeps_polling_never_loses_its_task(ttl: float, gaps: list[float]) -> None:
    """Polls (denied ones too) less than a TTL apart keep the task, however long past createdAt + ttl."""
    record = advance(fresh(ttl), TaskStatus.COMPLETED, 1000.0, result={"content": []})
    now = record.created_at
    for fraction in gaps:
        now += fraction * ttl * 0.99
        assert not record.expired(now)
        record = seen(record, now)
        assert record.expires_at == now + ttl
    assert not record.expired(now + ttl)
    assert record.expired(now + ttl + 0.001), "one that stops polling loses it a TTL later"


@given(st.floats(0.5, 100), st.floats(0, 1000))
def test_ttl_counts_from_the_later_of_status_change_and_last_poll(ttl: float, later: float) -> None:
    record = fresh(ttl)
    changed = advance(record, TaskStatus.COMPLETED, record.created_at + later, result={"content": []})
    assert changed.expires_at == record.created_at + later + ttl
    assert seen(changed, record.created_at).expires_at == changed.expires_at, "an older poll moves nothing"
    assert fresh(None).expires_at is None and not fresh(None).expired(1e12)


@given(
    STATUSES,
    st.one_of(st.none(), st.floats(0.001, 1e6)),
    st.frozensets(st.sampled_from(TOOLS)),
    SCOPES,
    st.one_of(st.none(), st.text(max_size=20)),
)
def test_the_durable_form_round_trips(
    status: TaskStatus, ttl: float | None, resources: frozenset[str], scopes: frozenset[str], message: str | None
) -> None:
    record = fresh(ttl, Requirement(resources, scopes))
    if status is not TaskStatus.WORKING:
        record = advance(record, status, 1001.5, message=message, **outcome_for(status))  # type: ignore[arg-type]
    assert tasks.decode_task(tasks.encode_task(record)) == record


def test_wire_view() -> None:
    record = seen(fresh(ttl=60), 1030.0)
    view = tasks.task_view(record, 250)
    assert view == {
        "taskId": "t-1",
        "status": "working",
        "createdAt": "1970-01-01T00:16:40.000Z",
        "lastUpdatedAt": "1970-01-01T00:16:40.000Z",
        "ttlMs": 90_000,
        "pollIntervalMs": 250,
    }
    with pytest.raises(ValueError):
        new_task("t", ALICE, "fetch", Requirement(frozenset()), "me", 0.0, 0.0)


ASK = {"method": "elicitation/create", "params": {"message": "Name?", "requestedSchema": {"type": "object"}}}


def test_a_task_waits_for_every_answer_and_never_reissues_a_key() -> None:
    record = tasks.awaiting_input(fresh(), {"a": ASK, "b": ASK}, 1001.0)
    assert record.status is TaskStatus.INPUT_REQUIRED and set(record.input_requests) == {"a", "b"}
    assert tasks.detailed_task(record, None)["inputRequests"] == {"a": ASK, "b": ASK}
    assert "inputRequests" not in tasks.task_view(record, None), "CreateTaskResult carries no input requests"

    partly = tasks.answered(record, {"a": {"action": "accept"}, "never-asked": {"x": 1}}, 1002.0)
    assert partly.status is TaskStatus.INPUT_REQUIRED, "one request is still outstanding"
    assert set(partly.input_requests) == {"b"} and partly.input_responses == {"a": {"action": "accept"}}
    assert tasks.answered(partly, {"a": {"action": "decline"}}, 1003.0) is partly, "an answered key is ignored"

    done = tasks.answered(partly, {"b": {"action": "accept"}}, 1004.0)
    assert done.status is TaskStatus.WORKING and done.input_requests == {}
    taken = tasks.consumed(done, frozenset({"a", "b"}))
    assert taken.input_responses == {}
    with pytest.raises(IllegalTransition, match="already issued"):
        tasks.awaiting_input(taken, {"a": ASK}, 1005.0)
    assert tasks.decode_task(tasks.encode_task(partly)) == partly, "the durable form keeps the input state"

    cancelled = advance(partly, TaskStatus.CANCELLED, 1006.0)
    assert cancelled.input_requests == {} and cancelled.input_responses == {}
    assert tasks.answered(cancelled, {"b": {}}, 1007.0) is cancelled, "a finished task takes no answers"
    with pytest.raises(IllegalTransition):
        tasks.awaiting_input(cancelled, {"c": ASK}, 1008.0)
