"""Issue 27, deliver 5: failover schedules with the real client against ``mcp-lossless serve`` on Redis.

Each schedule (see :mod:`tests.faults.failover`) runs one client session's calls while the Redis primary is
SIGKILLed under them, the replica promoted (by the endpoint's flip or by Sentinel) and the pair re-established,
maybe with the replication link frozen first (the replica lags), the server running the calls killed too, the
client's connections cut and sent to the other server. Held to: every call ends in exactly one outcome, no hang;
no event id with two contents over everything the client read; with ``wait_replicas=1`` (and the execution alive)
each progress and the result exactly once, on the wire too; without it, an explicit outcome (the result, or the
call's loss said as such).

The default run is a handful of schedules from a fixed seed plus the explicit examples (each a scenario of the
issue), so every ``make test`` stages both kinds of promotion, with and without replica acknowledgement;
``MCP_LOSSLESS_SOAK=1`` runs hundreds of freshly random ones. Shrinking is off: a failing schedule is printed
whole, enough to replay it with ``@example``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from anyio.from_thread import start_blocking_portal
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.faults.failover import FailoverHarness, FailoverSchedule, describe_stats, failover_harness
from tests.faults.harness import CallPlan, budget, soak

DEFAULT_SCHEDULES = 6
SOAK_SCHEDULES = 400
SCHEDULES = int(os.environ.get("MCP_LOSSLESS_FAILOVER_SCHEDULES", "0")) or budget(DEFAULT_SCHEDULES, SOAK_SCHEDULES)
"""``MCP_LOSSLESS_FAILOVER_SCHEDULES=N`` runs N (freshly random in a soak, else from the fixed seed)."""
EXAMPLES = 4


@pytest.fixture(scope="module")
def failovers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FailoverHarness]:
    with start_blocking_portal() as portal, failover_harness(portal, tmp_path_factory.mktemp("failover")) as running:
        yield running
        print("\n" + describe_stats(running.stats))


@st.composite
def failover_schedules(draw: st.DrawFn) -> FailoverSchedule:
    wait_replicas = draw(st.sampled_from([0, 1]))
    plan = st.builds(
        CallPlan,
        tool=st.sampled_from(["search", "fetch", "charge"]),
        steps=st.integers(4, 12),
        delay_ms=st.sampled_from([40, 80]),
    )
    freeze_after = draw(st.none() | st.integers(1, 8))
    if freeze_after is not None and wait_replicas:
        kill_after: int | None = freeze_after  # frozen, nothing more is acknowledged: no later event comes
    elif draw(st.integers(0, 9)) == 0:
        kill_after = None
    else:
        kill_after = draw(st.integers(freeze_after or 1, (freeze_after or 1) + 6))
    return FailoverSchedule(
        promotion=draw(st.sampled_from(["flip", "sentinel"])),
        wait_replicas=wait_replicas,
        replicas=draw(st.sampled_from([1, 2])),
        calls=tuple(draw(st.lists(plan, min_size=1, max_size=3))),
        freeze_after=freeze_after,
        kill_after=kill_after,
        producer_dies=kill_after is not None and draw(st.booleans()),
        move_after=draw(st.none() | st.integers(1, 14)),
    )


LOSS_UNDER_LIVE_CALLS = FailoverSchedule(
    "flip", 0, 2, (CallPlan("charge", 12, 60), CallPlan("fetch", 12, 60)), freeze_after=3, kill_after=8
)
"""The issue's table: the replica lags, the primary dies, the endpoint flips; the calls end explicitly."""
SENTINEL_ACKNOWLEDGED = FailoverSchedule(
    "sentinel", 1, 2, (CallPlan("charge", 10, 80), CallPlan("search", 6, 40)), freeze_after=3, kill_after=3,
    move_after=6,
)  # fmt: skip
"""Acceptance: Sentinel promotes mid-stream with wait_replicas=1; the call completes exactly once, resumed on the
other server."""
PRODUCER_DIES = FailoverSchedule(
    "flip", 0, 2, (CallPlan("fetch", 10, 60), CallPlan("charge", 10, 60)), freeze_after=2, kill_after=5,
    producer_dies=True,
)  # fmt: skip
"""The server running the calls dies with the primary: the other one ends the stream, no id reused."""
ACKNOWLEDGED_FLIP = FailoverSchedule(
    "flip", 1, 1, (CallPlan("charge", 10, 60), CallPlan("fetch", 8, 40)), freeze_after=4, kill_after=4, move_after=9
)


@settings(
    max_examples=SCHEDULES,
    derandomize=not soak(),
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=list(HealthCheck),
    print_blob=True,
)
@example(LOSS_UNDER_LIVE_CALLS)
@example(SENTINEL_ACKNOWLEDGED)
@example(PRODUCER_DIES)
@example(ACKNOWLEDGED_FLIP)
@given(schedule=failover_schedules())
def test_every_failover_schedule_keeps_the_invariants(failovers: FailoverHarness, schedule: FailoverSchedule) -> None:
    failovers.run(schedule)


def test_the_failovers_really_happened(failovers: FailoverHarness) -> None:
    stats = failovers.stats
    assert stats.schedules >= SCHEDULES + EXAMPLES
    assert stats.faults.get("primary killed", 0) >= stats.schedules // 2, stats.faults
    for fault in ("promotion:flip", "promotion:sentinel", "wait_replicas=0", "wait_replicas=1", "link frozen"):
        assert stats.faults.get(fault, 0) >= 1, (fault, stats.faults)
    assert sum(stats.charges.values()) >= 1, stats.charges
    repeated = set(failovers.ledger.refresh().repeated())
    assert repeated <= failovers.unreplicated_repeats, "no charge ran twice where a replica acknowledged its key"
