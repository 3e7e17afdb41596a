"""Acceptance 4 of the client issue: hypothesis-generated fault schedules against real servers.

Each schedule (see :mod:`tests.faults.harness`) runs new client sessions against one of three long-lived
servers behind cutting proxies and is held to the invariants: every call resolves to exactly one outcome
within its deadline; a success carries exactly its tool's true output (every call's arguments are unique,
so another call's or session's result cannot pass); progress is the call's own; no call's event reaches
the client over a connection whose token does not cover its tool.

The default run is 150 schedules (about two minutes) from a fixed seed, so that every CI run draws the same
schedules and the budget check below cannot fail by the luck of the draw; ``MCP_LOSSLESS_SOAK=1`` runs
5,000 freshly random ones. Shrinking is off: a real-network schedule is slow to re-run, and the failure
names the whole schedule, which is enough to replay it with ``@example``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.faults.harness import CallPlan, Harness, Schedule, budget, harness, soak

DEFAULT_SCHEDULES = 150
"""200 until ``charge`` joined the restart schedules (issue 28): the fixed seed's draw then held 53 SIGKILL restarts
instead of 31, and the run took 155 s of schedules instead of 104 s back to back on the loaded machine; 150 took
88 s, with 50 restarts and 166 ``charge`` calls."""
SOAK_SCHEDULES = 5000
SCHEDULES = budget(DEFAULT_SCHEDULES, SOAK_SCHEDULES)
CHARGES = budget(100, 1000)
"""``charge`` calls a run makes at least (issue 28, acceptance 1: 1,000 in a soak), each judged by its ledger."""
VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
LAST_EVENT = 30
"""Faults are placed among the first events of a schedule; most schedules produce fewer than this."""


@pytest.fixture(scope="module")
def faults(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with harness(tmp_path_factory.mktemp("faults")) as running:
        yield running
        stats = running.stats
        print(
            f"\nfault schedules: {stats.schedules} in {stats.seconds:.0f} s, {stats.calls} calls; "
            f"outcomes {dict(sorted(stats.outcomes.items()))}; faults {dict(sorted(stats.faults.items()))}\n"
            f"{stats.charge_line()}"
        )


@st.composite
def schedules(draw: st.DrawFn) -> Schedule:
    kind = draw(st.integers(0, 9))
    server = "expiry" if kind == 0 else "restart" if kind == 1 else "memory"
    tools = ["search", "fetch", "charge"]
    if server == "memory":
        steps, delays = st.integers(1, 4), st.sampled_from([0, 5, 15, 30])
    elif server == "expiry":
        steps, delays = st.integers(3, 5), st.sampled_from([150, 200])  # may outlive its one-second token
    else:
        steps, delays = st.integers(3, 6), st.sampled_from([60, 120])  # still running when the server dies
    plan = st.builds(CallPlan, tool=st.sampled_from(tools), steps=steps, delay_ms=delays)
    sessions = draw(st.lists(st.lists(plan, min_size=1, max_size=3).map(tuple), min_size=1, max_size=2))
    version = draw(st.sampled_from(VERSIONS))
    narrow_after = draw(st.none() | st.integers(1, 4))
    return Schedule(
        server=server,
        version=version,
        batch=version == "2025-03-26" and draw(st.booleans()),
        sessions=tuple(sessions),
        cuts=draw(st.frozensets(st.integers(1, LAST_EVENT), max_size=4)),
        delays=tuple(
            draw(
                st.lists(
                    st.tuples(st.integers(1, LAST_EVENT), st.sampled_from([0.01, 0.05, 0.15])),
                    max_size=2,
                    unique_by=lambda d: d[0],
                )
            )
        ),
        narrow_after=narrow_after,
        narrow_to=draw(st.sampled_from(tools)),
        widen=narrow_after is not None and draw(st.booleans()),
        restart_after=draw(st.integers(1, 12)) if server == "restart" else None,
    )


SEED = Schedule(
    "memory",
    "2025-03-26",
    True,
    ((CallPlan("search", 4, 30), CallPlan("fetch", 4, 30)),),
    cuts=frozenset({5}),
    narrow_after=2,
    narrow_to="search",
)
"""The seed scenario: a batch of search + fetch, narrowed to search mid-call, then a drop."""
RESTART_BATCH = Schedule(
    "restart", "2025-03-26", True, ((CallPlan("search", 4, 120), CallPlan("fetch", 4, 120)),), restart_after=3
)
RESTART_CHARGE = Schedule(
    "restart", "2025-11-25", False, ((CallPlan("charge", 5, 120), CallPlan("charge", 2, 60)),), restart_after=4
)
"""Issue 28: a SIGKILL while two charges run: each ends with its one run's result (replayed when its answer was
stored before the kill) or, killed during its own run, "may have run" (counted); never a second run."""
EXPIRY = Schedule("expiry", "2025-11-25", False, ((CallPlan("charge", 5, 250), CallPlan("fetch", 5, 250)),))


@settings(
    max_examples=SCHEDULES,
    derandomize=not soak(),
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@example(SEED)
@example(RESTART_BATCH)
@example(RESTART_CHARGE)
@example(EXPIRY)
@given(schedule=schedules())
def test_every_schedule_keeps_the_invariants(faults: Harness, schedule: Schedule) -> None:
    faults.run(schedule)


def test_the_run_was_long_enough(faults: Harness) -> None:
    """Hypothesis generates the budget (plus the explicit examples) unless it runs out of distinct inputs."""
    stats = faults.stats
    assert stats.schedules >= SCHEDULES
    assert stats.faults.get("restart", 0) >= SCHEDULES // 100, "restarts really happened"
    assert stats.faults.get("cut", 0) >= SCHEDULES, "drops were scheduled"
    assert sum(stats.charges.values()) >= CHARGES, stats.charges
    assert stats.charges.get("restart: ran once", 0) >= SCHEDULES // 100, "charge ran through SIGKILL restarts"
    assert faults.ledger.refresh().repeated() == {}, "no charge ran twice, even after its schedule was checked"
