"""The count of a principal's requests at work, kept in step where requests start and end, always equals what
its cap means: the tasks of the sessions held for it plus its sessionless (2026-07-28) calls, and nothing of
another principal. Random runs of starts, ends, session deletions and sessionless calls, against that sum."""

from __future__ import annotations

import asyncio
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from mcp_lossless.core.principal import Principal
from mcp_lossless.server.sessions import ServerSession, SessionRegistry
from mcp_lossless.stores.memory import MemoryStore

PRINCIPALS = [Principal("https://as.example", subject, "client") for subject in ("a", "b")]

OPERATIONS = st.lists(
    st.tuples(st.sampled_from(["create", "start", "end", "delete", "hold", "release"]), st.integers(0, 7)),
    max_size=60,
)


def _meant(registry: SessionRegistry, held: dict[str, ServerSession], sessionless: dict[Principal, int]) -> None:
    for principal in PRINCIPALS:
        in_sessions = sum(len(s.tasks) for s in held.values() if s.principal == principal)
        assert registry.running_calls(principal) == in_sessions + sessionless.get(principal, 0)


async def _run(operations: list[tuple[str, int]]) -> None:
    registry = SessionRegistry(MemoryStore())
    held: dict[str, ServerSession] = {}
    gone: list[ServerSession] = []  # deleted while their requests still run: those no longer count
    sessionless: dict[Principal, int] = {}
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task: Any = asyncio.ensure_future(never)  # stands for a request's task; never run to an end here
    for name, n in operations:
        principal = PRINCIPALS[n % 2]
        sessions = [*held.values(), *gone]
        if name == "create":
            session = await registry.create(principal, "2025-11-25", 0.0)
            held[session.id] = session
        elif name == "start" and sessions:
            sessions[n % len(sessions)].start_task(n, task)  # an id already at work is not counted twice
        elif name == "end" and sessions:
            sessions[n % len(sessions)].end_task(n)
        elif name == "delete" and held:
            session = list(held.values())[n % len(held)]
            del held[session.id]
            registry._forget(session.id)
            gone.append(session)
        elif name == "hold":
            registry.hold_call(principal)
            sessionless[principal] = sessionless.get(principal, 0) + 1
        elif name == "release" and sessionless.get(principal):
            registry.end_call(principal)
            sessionless[principal] -= 1
        _meant(registry, held, sessionless)
    task.cancel()


@settings(max_examples=200, deadline=None)
@given(operations=OPERATIONS)
def test_the_running_count_is_the_sum_its_cap_means(operations: list[tuple[str, int]]) -> None:
    asyncio.run(_run(operations))


def test_a_principal_with_no_session_and_no_call_left_is_forgotten() -> None:
    async def run() -> None:
        registry = SessionRegistry(MemoryStore())
        principal = PRINCIPALS[0]
        session = await registry.create(principal, "2025-11-25", 0.0)
        registry.hold_call(principal)
        registry._forget(session.id)
        assert registry._held  # its sessionless call still counts
        registry.end_call(principal)
        assert not registry._held and registry.running_calls(principal) == 0

    asyncio.run(run())
