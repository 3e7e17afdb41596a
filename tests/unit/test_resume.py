"""The resume decision table (ADR 0002, ADR 0003, docs/errors.md), property-tested without a server.

A hypothesis-drawn world holds what the adapter could find: the store's stream records, the session's live
streams, which producers are alive, each stream's events and whether they are still retained. A small driver
answers :func:`decide_resume`'s questions from that world, as the transport does from the store, and the
outcome is held to the table written out here on its own terms.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_lossless.core.eventids import Cursor, CursorProblem, Unverified
from mcp_lossless.core.events import Loss, PendingRequest, StoredEvent, StreamKind, StreamRecord
from mcp_lossless.core.principal import Grant, Principal
from mcp_lossless.core.replay import Refusal, RefusalReason
from mcp_lossless.core.resources import AudiencePolicy
from mcp_lossless.core.resume import (
    CursorRejected,
    Lookup,
    NeedEvents,
    NeedOwner,
    NeedSessionPrincipal,
    NeedStream,
    Question,
    ReplayPlan,
    ResumeFacts,
    SettleOrphan,
    Tail,
    decide_resume,
    stream_tags,
)

CANONICAL = "https://mcp.example/mcp"
TOOLS = [f"https://mcp.example/tools/{name}" for name in "abc"]
POLICY = AudiencePolicy(CANONICAL, TOOLS)
ALICE = Principal("https://issuer.example", "alice", "client-1")
SESSION = "session-1"
OTHER_SESSION = "session-2"
STREAM = "stream-1"
CURSOR = "the-last-event-id"
OWNERS = ["this-process", "replica-1", "replica-2"]
AUDIENCES = st.frozensets(st.sampled_from([*TOOLS, CANONICAL]))

ADR_0002 = {
    CursorProblem.MALFORMED: 400,
    CursorProblem.UNKNOWN: 400,
    CursorProblem.FOREIGN_SESSION: 409,
    CursorProblem.FOREIGN_STREAM: 409,
    CursorProblem.EVICTED: 410,
    CursorProblem.LOST: 410,
}


@dataclass
class World:
    """What the adapter could look up for one resume."""

    decoded: Cursor | Unverified | CursorProblem
    records: dict[str, StreamRecord] = field(default_factory=dict)
    """The store's stream records."""
    live: set[str] = field(default_factory=set)
    """Streams of the session this process produces (in the store too)."""
    alive: set[str] = field(default_factory=set)
    """Other processes whose lease holds."""
    log: dict[str, list[StoredEvent]] = field(default_factory=dict)
    evicted: set[str] = field(default_factory=set)
    ours: bool = True
    """Whether the other session (``OTHER_SESSION``) belongs to the resuming principal."""

    def settle(self, record: StreamRecord) -> StreamRecord:
        """What the transport's orphan settlement does (ADR 0025): the stream ends as lost by its owner, completed,
        and no event is written."""
        fresh = self.records[record.stream].copy()
        fresh.lost = Loss.OWNER
        fresh.completed = True
        self.records[record.stream] = fresh
        return fresh


def run(world: World, grant: Grant) -> tuple[CursorRejected | Refusal | ReplayPlan, list[Question]]:
    """Drive the decision to its outcome, answering each question from ``world``; the questions asked."""
    facts = ResumeFacts(SESSION, CURSOR, world.decoded)
    asked: list[Question] = []
    for _ in range(6):
        step = decide_resume(facts, grant, POLICY)
        if isinstance(step, CursorRejected | Refusal | ReplayPlan):
            return step, asked
        assert type(step) not in {type(q) for q in asked}, f"{step} asked twice"
        asked.append(step)
        if isinstance(step, NeedStream):
            facts.live = step.stream in world.live
            facts.record = world.records.get(step.stream) or Lookup.ABSENT
        elif isinstance(step, NeedSessionPrincipal):
            assert step.session_id == OTHER_SESSION
            facts.same_principal = world.ours
        elif isinstance(step, NeedOwner):
            # as the transport answers: a stream of this process that it no longer produces is orphaned
            facts.owner_alive = step.owner != OWNERS[0] and step.owner in world.alive
        elif isinstance(step, SettleOrphan):
            facts.record, facts.settled = world.settle(step.record), True
        elif isinstance(step, NeedEvents):
            evicted = step.stream in world.evicted
            events = [e for e in world.log.get(step.stream, []) if e.seq > step.seq]
            facts.events = Lookup.ABSENT if evicted else events
    raise AssertionError(f"no outcome after {asked}")


@st.composite
def streams(draw: st.DrawFn, session_id: str = SESSION) -> tuple[StreamRecord, list[StoredEvent]]:
    """A stream record and its event log, consistent with each other (answers are the terminal events)."""
    count = draw(st.integers(0, 3))
    requests = tuple(
        PendingRequest(rid, "tools/call", f"t{rid}", frozenset({draw(st.sampled_from(TOOLS))})) for rid in range(count)
    )
    kind = draw(st.sampled_from(StreamKind))
    if kind is StreamKind.GET:
        requests = ()
    owners = draw(st.sampled_from(OWNERS))
    log: list[StoredEvent] = []
    answered: set[int] = set()
    for seq in range(1, draw(st.integers(0, 8)) + 1):
        request = draw(st.sampled_from(requests)) if requests and draw(st.booleans()) else None
        terminal = request is not None and request.request_id not in answered and draw(st.booleans())
        if terminal and request is not None:
            answered.add(int(request.request_id))
        log.append(
            StoredEvent(
                session_id,
                STREAM,
                seq,
                f"{STREAM}.{seq:x}.mac",
                b"{}",
                None if request is None else request.request_id,
                None if request is None else request.tool,
                frozenset() if request is None else request.resources,
                terminal,
            )
        )
    completed = bool(requests) and len(answered) == len(requests)
    lost = None
    if kind is StreamKind.POST and not completed and draw(st.booleans()):  # ended as lost already
        lost = draw(st.sampled_from(Loss))
        completed = True
    record = StreamRecord(session_id, STREAM, kind, owners, requests, len(log), completed, frozenset(answered), lost)
    return record, log


@st.composite
def worlds(draw: st.DrawFn) -> World:
    shape = draw(st.sampled_from(["malformed", "unverified", "verified"]))
    if shape == "malformed":
        return World(CursorProblem.MALFORMED)
    owner_session = SESSION if shape == "verified" else draw(st.sampled_from([SESSION, OTHER_SESSION]))
    record, log = draw(streams(owner_session))
    seq = draw(st.integers(0, record.last_seq + 2))
    world = World(Cursor(STREAM, seq) if shape == "verified" else Unverified(STREAM, seq))
    if draw(st.booleans()):  # else: no record (never existed, or evicted with its events)
        world.records[STREAM] = record
        world.log[STREAM] = log
        if record.owner == OWNERS[0] and owner_session == SESSION and draw(st.booleans()):
            world.live.add(STREAM)
        if STREAM not in world.live and draw(st.booleans()):
            world.evicted.add(STREAM)
    world.alive = draw(st.sets(st.sampled_from(OWNERS[1:])))
    world.ours = draw(st.booleans())
    return world


def expected(world: World, grant: Grant) -> CursorProblem | Refusal | tuple[list[StoredEvent], Tail, Loss | None]:
    """The table, on its own terms: the cursor problem, the refusal, or the events replayed, the tail and how the
    stream ended without its producer (its unanswered requests' outcome)."""
    decoded = world.decoded
    if isinstance(decoded, CursorProblem):
        return decoded
    record = world.records.get(STREAM)
    if isinstance(decoded, Unverified):
        if record is None:
            return CursorProblem.UNKNOWN
        if record.session_id == SESSION:
            return CursorProblem.FOREIGN_STREAM
        # invariant 4: another principal's id reads exactly as an unknown one
        return CursorProblem.FOREIGN_SESSION if world.ours else CursorProblem.UNKNOWN
    if record is None:
        return CursorProblem.EVICTED
    if decoded.seq > record.last_seq:  # an id we sent that the store does not hold: it lost events
        return CursorProblem.LOST
    live = STREAM in world.live
    orphaned = not live and not record.completed and record.kind is StreamKind.POST and record.owner not in world.alive
    if STREAM in world.evicted:
        return CursorProblem.EVICTED
    lost = Loss.OWNER if orphaned else record.lost  # settling writes no event: the record says how it ended
    events = [e for e in world.log[STREAM] if e.seq > decoded.seq]
    uncovered = [e for e in events if not POLICY.covers(grant.audience, e.resources)]
    if uncovered:
        lacking = set().union(*(POLICY.missing(grant.audience, e.resources) for e in uncovered))
        first = uncovered[0]
        return Refusal(
            RefusalReason.INSUFFICIENT_AUDIENCE, first.event_id, first.request_id, tuple(sorted(lacking)), CURSOR
        )
    if live:
        return events, Tail.LIVE, lost
    if not orphaned and not record.completed and record.kind is StreamKind.POST:
        return events, Tail.REPLICA, lost
    return events, Tail.NONE, lost


@settings(max_examples=400)
@given(worlds(), AUDIENCES)
def test_every_resume_gets_the_outcome_of_the_table(world: World, audience: frozenset[str]) -> None:
    grant = Grant(ALICE, audience)
    want = expected(world, grant)
    got, _ = run(world, grant)
    if isinstance(want, CursorProblem):
        assert isinstance(got, CursorRejected) and got.problem is want
    elif isinstance(want, Refusal):
        assert got == want
    else:
        events, tail, lost = want
        assert isinstance(got, ReplayPlan)
        assert got.record.lost is lost
        assert [(e.seq, e.request_id, e.terminal) for e in got.events] == [
            (e.seq, e.request_id, e.terminal) for e in events
        ]
        assert got.tail is tail
        assert got.cursor == world.decoded
        assert got.covers_stream == POLICY.covers_all(audience, stream_tags(got.record))


@given(worlds(), AUDIENCES)
def test_a_plan_names_as_settled_exactly_the_requests_answered_before_the_cursor(
    world: World, audience: frozenset[str]
) -> None:
    got, _ = run(world, Grant(ALICE, audience))
    if not isinstance(got, ReplayPlan):
        return
    assert isinstance(world.decoded, Cursor)
    log = world.log[STREAM]
    before = {e.request_id for e in log if e.terminal and e.seq <= world.decoded.seq}
    assert got.settled == before
    replayed = {e.request_id for e in got.events if e.terminal}
    assert got.settled.isdisjoint(replayed)


@given(worlds(), AUDIENCES)
def test_questions_are_asked_only_when_their_answer_matters(world: World, audience: frozenset[str]) -> None:
    got, asked = run(world, Grant(ALICE, audience))
    kinds = [type(q) for q in asked]
    if isinstance(world.decoded, CursorProblem):
        assert asked == []  # a malformed id costs no lookup
    elif isinstance(world.decoded, Unverified):  # whose stream it is (whose session), and nothing of its events
        assert asked in ([NeedStream(STREAM)], [NeedStream(STREAM), NeedSessionPrincipal(OTHER_SESSION)])
    if STREAM in world.live:
        assert NeedOwner not in kinds and SettleOrphan not in kinds  # this process produces it
    if SettleOrphan in kinds:
        assert kinds.index(NeedOwner) < kinds.index(SettleOrphan) < kinds.index(NeedEvents)
    if isinstance(got, CursorRejected) and got.problem is not CursorProblem.EVICTED:
        assert NeedEvents not in kinds


@given(worlds(), AUDIENCES)
def test_a_cursor_problem_carries_its_status_and_a_body_that_is_not_resumable(
    world: World, audience: frozenset[str]
) -> None:
    got, _ = run(world, Grant(ALICE, audience))
    if isinstance(got, CursorRejected):
        assert got.status == ADR_0002[got.problem]
        held = {"heldEventId": got.held} if got.problem is CursorProblem.LOST else {}
        assert got.body == {
            "error": got.problem.value,
            "error_description": got.problem.description,
            "lastEventId": CURSOR,
            "resumable": False,
            **held,
        }
        if got.problem is CursorProblem.LOST:  # names the last event the store holds, with the cursor's MAC
            record = world.records[STREAM]
            assert got.held == f"{STREAM}.{record.last_seq:x}.{CURSOR}"


@pytest.mark.parametrize("problem", list(CursorProblem))
def test_each_cursor_problem_has_the_status_of_adr_0002(problem: CursorProblem) -> None:
    assert problem.status == ADR_0002[problem]
    assert "Last-Event-ID" in problem.description
    long = CursorRejected(problem, "x" * 1000)
    assert long.body["lastEventId"] == "x" * 200


def dead_owners_stream() -> World:
    """A POST stream of two calls whose producer died after answering the first and sending progress of both."""
    a, b = (PendingRequest(i, "tools/call", f"t{i}", frozenset({TOOLS[i]})) for i in range(2))
    log = [
        StoredEvent(SESSION, STREAM, 1, f"{STREAM}.1.mac", b"{}", 0, "t0", a.resources, False),
        StoredEvent(SESSION, STREAM, 2, f"{STREAM}.2.mac", b"{}", 0, "t0", a.resources, True),
        StoredEvent(SESSION, STREAM, 3, f"{STREAM}.3.mac", b"{}", 1, "t1", b.resources, False),
    ]
    record = StreamRecord(SESSION, STREAM, StreamKind.POST, OWNERS[1], (a, b), 3, False, frozenset({0}))
    return World(Cursor(STREAM, 1), {STREAM: record}, set(), set(), {STREAM: log})


def test_the_stream_of_a_dead_owner_is_settled_before_it_is_replayed() -> None:
    world = dead_owners_stream()
    got, asked = run(world, Grant(ALICE, frozenset({CANONICAL})))
    assert asked == [
        NeedStream(STREAM),
        NeedOwner(OWNERS[1]),
        SettleOrphan(dead_owners_stream().records[STREAM]),
        NeedEvents(STREAM, 1),
    ]
    assert isinstance(got, ReplayPlan)
    assert [(e.seq, e.request_id, e.terminal) for e in got.events] == [(2, 0, True), (3, 1, False)]
    # the second call ends explicitly: execution lost, from the record, at no position of the dead owner's
    assert got.record.lost is Loss.OWNER and [r.request_id for r in got.record.unanswered()] == [1]
    assert got.tail is Tail.NONE and got.record.completed and got.settled == frozenset()


def test_the_stream_of_a_live_replica_is_replayed_then_followed_through_the_store() -> None:
    world = dead_owners_stream()
    world.alive.add(OWNERS[1])
    got, asked = run(world, Grant(ALICE, frozenset({CANONICAL})))
    assert SettleOrphan not in {type(q) for q in asked}
    assert isinstance(got, ReplayPlan) and got.tail is Tail.REPLICA
    assert [e.seq for e in got.events] == [2, 3]


def test_a_settled_orphan_is_still_replayed_only_to_a_token_that_covers_it() -> None:
    got, _ = run(dead_owners_stream(), Grant(ALICE, frozenset({TOOLS[0]})))
    assert isinstance(got, Refusal)
    assert got.event_id == f"{STREAM}.3.mac" and got.request_id == 1
    assert got.missing == (TOOLS[1],) and got.cursor == CURSOR  # the cursor does not move


def test_settling_is_asked_once_even_if_another_replica_left_the_stream_open() -> None:
    world = dead_owners_stream()
    facts = ResumeFacts(SESSION, CURSOR, world.decoded, world.records[STREAM], owner_alive=False)
    assert isinstance(decide_resume(facts, Grant(ALICE, frozenset({CANONICAL})), POLICY), SettleOrphan)
    facts.settled = True  # the claim went to another replica; its record is still open
    assert decide_resume(facts, Grant(ALICE, frozenset({CANONICAL})), POLICY) == NeedEvents(STREAM, 1)
    facts.events = world.log[STREAM][1:]
    plan = decide_resume(facts, Grant(ALICE, frozenset({CANONICAL})), POLICY)
    assert isinstance(plan, ReplayPlan) and plan.tail is Tail.REPLICA
