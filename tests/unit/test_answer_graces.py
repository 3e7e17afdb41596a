"""The answer grace of a POST's inline run (transport._InlineRun): a call whose first suspension is the store
taking its answer has its stream written whole if the answer is stored within the grace; one that takes longer
has its writer started when the grace ends, while it still waits. Every grace of a loop runs on one timer."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from mcp_lossless.server import transport
from mcp_lossless.server.transport import _AnswerGraces, _InlineRun


async def _write(log: list[str], name: str) -> None:
    log.append(f"write {name}")


async def _call(log: list[str], name: str, stored: asyncio.Future[None]) -> None:
    await stored  # the store taking the answer
    log.append(f"answered {name}")


def test_a_grace_that_ends_first_starts_the_writer_and_one_timer_serves_every_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(transport, "ANSWER_GRACE_SECONDS", 0.05)

    async def main() -> tuple[list[str], int]:
        loop = asyncio.get_running_loop()
        armed = 0
        call_at = loop.call_at

        def counting(when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
            nonlocal armed
            armed += getattr(callback, "__self__", None) is graces  # the graces' timer, not the test's sleeps
            return call_at(when, callback, *args, context=context)

        monkeypatch.setattr(loop, "call_at", counting)
        graces = _AnswerGraces(loop)
        log: list[str] = []
        stored = {name: loop.create_future() for name in "abc"}
        runs = [
            asyncio.ensure_future(_InlineRun(graces, _write(log, name), {}, name).run(_call(log, name, stored[name])))
            for name in "abc"
        ]
        await asyncio.sleep(0.01)  # every run is in its grace now: one timer for all three
        timers = armed
        assert len(graces) == 3
        stored["a"].set_result(None)  # stored in time: written whole once answered, by the call's own task
        await asyncio.sleep(0.1)  # the graces of b and c end while their stores still work
        assert len(graces) == 0
        stored["b"].set_result(None)
        stored["c"].set_result(None)
        await asyncio.gather(*runs)
        return log, timers

    log, timers = asyncio.run(main())
    assert timers == 1
    assert log.index("answered a") < log.index("write a")
    assert log.index("write b") < log.index("answered b")
    assert log.index("write c") < log.index("answered c")


def test_a_call_that_fails_within_its_grace_has_its_stream_closed_unwritten() -> None:
    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        graces = _AnswerGraces(loop)
        log: list[str] = []
        stored: asyncio.Future[None] = loop.create_future()
        run = asyncio.ensure_future(_InlineRun(graces, _write(log, "a"), {}, "a").run(_call(log, "a", stored)))
        await asyncio.sleep(0)
        stored.set_exception(RuntimeError("store down"))
        with pytest.raises(RuntimeError):
            await run
        await asyncio.sleep(transport.ANSWER_GRACE_SECONDS * 2)  # its grace ends: no writer for a finished call
        return log

    assert asyncio.run(main()) == []


def test_graces_that_end_within_the_slack_of_the_first_end_on_one_firing(monkeypatch: pytest.MonkeyPatch) -> None:
    """At thousands of calls a second each call's grace ends at its own moment: one firing per call unless a
    firing also ends the graces that ended within :data:`transport.GRACE_SLACK_SECONDS` of the first."""
    monkeypatch.setattr(transport, "ANSWER_GRACE_SECONDS", 0.02)
    monkeypatch.setattr(transport, "GRACE_SLACK_SECONDS", 0.2)
    names = "abcdefgh"

    async def main() -> tuple[int, list[str]]:
        loop = asyncio.get_running_loop()
        graces = _AnswerGraces(loop)
        armed = 0
        call_at = loop.call_at

        def counting(when: float, callback: Any, *args: Any, context: Any = None) -> asyncio.TimerHandle:
            nonlocal armed
            armed += getattr(callback, "__self__", None) is graces
            return call_at(when, callback, *args, context=context)

        monkeypatch.setattr(loop, "call_at", counting)
        log: list[str] = []
        all_written = loop.create_future()

        async def write(name: str) -> None:
            log.append(f"write {name}")
            if sum(entry.startswith("write") for entry in log) == len(names):
                all_written.set_result(None)

        stored = {name: loop.create_future() for name in names}
        runs = []
        began = loop.time()
        for name in names:  # each run's grace begins some ms after the last, so each ends at its own moment
            runs.append(
                asyncio.ensure_future(_InlineRun(graces, write(name), {}, name).run(_call(log, name, stored[name])))
            )
            await asyncio.sleep(0.002)  # spacing the graces, not waiting for anything
        assert loop.time() - began < 0.2  # all began within the slack of the first
        await all_written  # every grace ended while its store still worked: each writer started
        for future in stored.values():
            future.set_result(None)
        await asyncio.gather(*runs)
        return armed, log

    armed, log = asyncio.run(main())
    assert armed == 1
    assert all(log.index(f"write {name}") < log.index(f"answered {name}") for name in names)
