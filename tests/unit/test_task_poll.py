"""The task poll decision table (ADR 0012, docs/errors.md), property-tested without a server.

A hypothesis-drawn world holds what the adapter could find: the task store's record under the polled id (or
none), which processes still run their tasks, the polling token, the clock and why the task is looked at. A
small driver answers :func:`decide_poll`'s questions from that world and carries out its settlement as a task
store does (the first terminal outcome wins), as the modern leg does; the outcome is held to the table written
out here on its own terms.
"""

from __future__ import annotations

import string
from dataclasses import dataclass, field, replace

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_lossless.core.errors import INVALID_PARAMS, TASK_DENIED, TASK_EXECUTION_LOST
from mcp_lossless.core.principal import Grant, Principal
from mcp_lossless.core.resources import AudiencePolicy
from mcp_lossless.core.tasks import (
    Deliver,
    Denied,
    NeedRunner,
    PollFacts,
    Purpose,
    Requirement,
    SettleLost,
    TaskRecord,
    TaskStatus,
    Unknown,
    advance,
    decide_poll,
    denial_error,
    detailed_task,
    new_task,
)

CANONICAL = "https://mcp.example/mcp"
TOOLS = [f"{CANONICAL}/tools/{name}" for name in ("fetch", "search", "write")]
POLICY = AudiencePolicy(CANONICAL, TOOLS)
ALICE = Principal("https://as.example", "alice", "app")
OTHERS = [Principal("https://as.example", "bob", "app"), Principal("other", "alice", "app")]
OWNERS = ["this-process", "replica-1", "replica-2"]
TASK = "t-1"
T0 = 1000.0
AUDIENCES = st.frozensets(st.sampled_from([CANONICAL, *TOOLS, "https://elsewhere.example"]), max_size=4)
SCOPES = st.frozensets(st.sampled_from(["read", "write", "admin"]), max_size=3)
MARKER = st.text(string.ascii_letters, min_size=12, max_size=20).map(lambda s: f"secret-{s}")


@dataclass
class World:
    """What the adapter could look up for one look at a task."""

    record: TaskRecord | None
    """The store's record under the id the request names."""
    asked_id: str
    purpose: Purpose
    now: float
    runs: set[str] = field(default_factory=set)
    """Owners that still run their tasks (this process: the task is among its running ones; another: its lease)."""
    writes: list[TaskRecord] = field(default_factory=list)

    def settle(self, record: TaskRecord) -> TaskRecord:
        """A task store's update: a terminal task is never overwritten, ``seen_at`` never moves back."""
        self.writes.append(record)
        stored = self.record
        assert stored is not None and not stored.status.terminal, "only a live task is settled"
        self.record = replace(record, seen_at=max(record.seen_at, stored.seen_at))
        return self.record


Outcome = Unknown | Denied | Deliver


def run(world: World, grant: Grant) -> tuple[Outcome, list[object]]:
    """Drive the decision to its outcome, answering each question from ``world``; the steps taken."""
    facts = PollFacts(world.asked_id, world.record, world.purpose)
    steps: list[object] = []
    for _ in range(4):
        step = decide_poll(facts, grant, POLICY, world.now)
        if isinstance(step, Unknown | Denied | Deliver):
            return step, steps
        assert type(step) not in {type(s) for s in steps}, f"{step} asked twice"
        steps.append(step)
        if isinstance(step, NeedRunner):
            assert world.record is not None and step.owner == world.record.owner and step.task_id == world.asked_id
            facts.runs = step.owner in world.runs
        else:
            facts.record = world.settle(step.record)
    raise AssertionError(f"no outcome after {steps}")


@st.composite
def records(draw: st.DrawFn, marker: str) -> TaskRecord:
    """A task as a store could hold it: any status reached through the diagram, polled at some time."""
    resources = draw(st.frozensets(st.sampled_from(TOOLS), min_size=1, max_size=2))
    requirement = Requirement(resources, draw(SCOPES))
    principal = draw(st.sampled_from([ALICE, *OTHERS]))
    ttl = draw(st.one_of(st.none(), st.floats(1, 100)))
    record = new_task(TASK, principal, "fetch", requirement, draw(st.sampled_from(OWNERS)), T0, ttl)
    status = draw(st.sampled_from(TaskStatus))
    at = T0 + draw(st.floats(0, 50))
    if status is TaskStatus.COMPLETED:
        record = advance(record, status, at, result={"content": [{"type": "text", "text": marker}]})
    elif status is TaskStatus.FAILED:
        record = advance(record, status, at, message=marker, error={"code": -32603, "message": marker})
    elif status is not TaskStatus.WORKING:
        record = advance(record, status, at)
    return replace(record, seen_at=T0 + draw(st.floats(0, 50)))


@st.composite
def worlds(draw: st.DrawFn) -> World:
    marker = draw(MARKER)
    record = draw(st.one_of(st.none(), records(marker)))
    asked = draw(st.sampled_from([TASK, TASK, "t-2"]))  # mostly its own id; sometimes another id's lookup
    world = World(record, asked, draw(st.sampled_from(Purpose)), T0 + draw(st.floats(0, 200)))
    world.runs = draw(st.sets(st.sampled_from(OWNERS)))
    return world


def expected(world: World, grant: Grant) -> Outcome:
    """The table, on its own terms."""
    record = world.record
    if record is None or record.task_id != world.asked_id or record.principal != grant.principal:
        return Unknown(world.asked_id)
    if record.ttl is not None and world.now > max(record.updated_at, record.seen_at) + record.ttl:
        return Unknown(world.asked_id)  # expired: the owner learns what anyone else would
    touch = world.now if world.purpose is Purpose.POLL else None
    lacking = sorted(POLICY.missing(grant.audience, record.requirement.resources))
    lacking_scopes = sorted(record.requirement.scopes - grant.scopes)
    if lacking or lacking_scopes:
        return Denied(TASK, tuple(lacking), tuple(lacking_scopes), record.requirement, touch)
    if touch is not None and record.ttl is not None:  # noted only when it moves the expiry by more than the grain
        grain = min(1.0, record.ttl / 100)
        if touch > max(record.updated_at, record.seen_at) + grain:
            record = replace(record, seen_at=touch)
    dead = record.owner not in world.runs
    if world.purpose is not Purpose.WATCH and record.status in {TaskStatus.WORKING, TaskStatus.INPUT_REQUIRED} and dead:
        error = {
            "code": TASK_EXECUTION_LOST,
            "message": "execution lost: the process running this task ended before it finished; the tool may have run",
            "data": {"reason": "execution_lost", "taskId": TASK, "resumable": False},
        }
        record = replace(
            record,
            status=TaskStatus.FAILED,
            updated_at=max(record.updated_at, world.now),
            message="the server process running this task ended",
            error=error,
            input_requests={},
            input_responses={},
        )
    return Deliver(record, touch)


@settings(max_examples=500)
@given(worlds(), st.sampled_from([ALICE, *OTHERS]), AUDIENCES, SCOPES)
def test_every_look_at_a_task_gets_the_outcome_of_the_table(
    world: World, principal: Principal, audience: frozenset[str], scopes: frozenset[str]
) -> None:
    grant = Grant(principal, audience, scopes=scopes)
    want = expected(world, grant)
    got, _ = run(world, grant)
    assert got == want
    if isinstance(want, Deliver) and want.record.status is TaskStatus.FAILED and world.writes:
        assert world.record == want.record, "a lost task is stored failed before anyone is told"


@given(worlds(), st.sampled_from([ALICE, *OTHERS]), AUDIENCES, SCOPES)
def test_questions_and_writes_only_when_their_answer_matters(
    world: World, principal: Principal, audience: frozenset[str], scopes: frozenset[str]
) -> None:
    live = world.record is not None and not world.record.status.terminal
    got, steps = run(world, Grant(principal, audience, scopes=scopes))
    kinds = [type(step) for step in steps]
    if not isinstance(got, Deliver) or world.purpose is Purpose.WATCH or not live:
        assert steps == [], "an unknown or denied task, a subscription, a settled task: no liveness, no write"
    if SettleLost in kinds:
        assert kinds == [NeedRunner, SettleLost] and len(world.writes) == 1
    if isinstance(got, Deliver | Denied):
        assert (got.touch_at is not None) == (world.purpose is Purpose.POLL), "only an owner's poll restarts the TTL"


@given(worlds(), st.sampled_from(OTHERS), AUDIENCES, SCOPES)
def test_another_principals_task_reads_exactly_as_no_task(
    world: World, stranger: Principal, audience: frozenset[str], scopes: frozenset[str]
) -> None:
    grant = Grant(stranger, audience, scopes=scopes)
    if world.record is not None:
        world.record = replace(world.record, principal=ALICE)
    got, steps = run(world, grant)
    nothing, _ = run(World(None, world.asked_id, world.purpose, world.now), grant)
    assert got == nothing == Unknown(world.asked_id) and steps == [] and world.writes == []


@given(MARKER, AUDIENCES, SCOPES, st.sampled_from([TaskStatus.COMPLETED, TaskStatus.FAILED]))
def test_a_denial_carries_not_a_byte_of_the_result(
    marker: str, audience: frozenset[str], scopes: frozenset[str], status: TaskStatus
) -> None:
    record = new_task(TASK, ALICE, "fetch", Requirement(frozenset({TOOLS[0]}), frozenset({"read"})), OWNERS[0], T0, 60)
    outcome = {"content": [{"type": "text", "text": marker}]}
    if status is TaskStatus.COMPLETED:
        record = advance(record, status, T0, result=outcome)
    else:
        record = advance(record, status, T0, message=marker, error={"code": -32603, "message": marker})
    got = decide_poll(PollFacts(TASK, record, Purpose.POLL), Grant(ALICE, audience, scopes=scopes), POLICY, T0 + 1)
    if isinstance(got, Deliver):
        view = detailed_task(got.record, 500)
        assert ("result" in view) == (status is TaskStatus.COMPLETED) and ("error" in view) != ("result" in view)
        return
    assert isinstance(got, Denied)
    error = denial_error(got)
    assert error["code"] == TASK_DENIED and not -32768 <= error["code"] <= -32000 and error["code"] != INVALID_PARAMS
    assert error["data"]["taskId"] == TASK and error["data"]["resumable"] is True
    assert marker.encode() not in orjson.dumps(error)


def test_a_dead_owners_task_is_settled_once_then_delivered_failed() -> None:
    record = new_task(TASK, ALICE, "fetch", Requirement(frozenset({TOOLS[0]})), OWNERS[1], T0, 60)
    world = World(record, TASK, Purpose.POLL, T0 + 5)
    got, steps = run(world, Grant(ALICE, frozenset({CANONICAL})))
    assert steps[0] == NeedRunner(TASK, OWNERS[1]) and isinstance(steps[1], SettleLost)
    assert isinstance(got, Deliver) and got.touch_at == T0 + 5
    assert got.record.status is TaskStatus.FAILED and got.record.error is not None
    assert got.record.error["code"] == TASK_EXECUTION_LOST and got.record.seen_at == T0 + 5


def test_a_task_that_ended_elsewhere_meanwhile_keeps_its_outcome() -> None:
    """The replica settling a task it thought lost finds it completed: the store keeps the result, and the poll
    delivers what the store holds, asking nothing more."""
    record = new_task(TASK, ALICE, "fetch", Requirement(frozenset({TOOLS[0]})), OWNERS[1], T0, 60)
    facts = PollFacts(TASK, record, Purpose.POLL, runs=False)
    grant = Grant(ALICE, frozenset({CANONICAL}))
    assert isinstance(decide_poll(facts, grant, POLICY, T0 + 5), SettleLost)
    facts.record = advance(record, TaskStatus.COMPLETED, T0 + 4, result={"content": []})  # what the store kept
    got = decide_poll(facts, grant, POLICY, T0 + 5)
    assert isinstance(got, Deliver) and got.record.status is TaskStatus.COMPLETED and got.record.seen_at == T0 + 5
