"""The answer grace of a POST's inline run (transport._InlineRun): a call whose first suspension is the store
taking its answer has its stream written whole if the answer is stored within the grace; one that takes longer
has its writer started when the grace ends, while it still waits. Every grace of a loop runs on one timer.

Time is a :class:`ManualClock` the graces are given: it moves only when a test says, so the graces end exactly
where the test puts them (no sleep against a 50 ms grace on a loaded machine). The event loop still runs the
calls; a test lets it take a few turns where a call would suspend.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from mcp_lossless.server import transport
from mcp_lossless.server.transport import _AnswerGraces, _InlineRun


class ManualClock:
    """A clock for :class:`_AnswerGraces`: time moves by :meth:`advance`, which fires the callbacks due by then."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.due: list[tuple[float, Callable[[], object]]] = []
        self.armed = 0
        """Callbacks ever scheduled: the graces' timer firings asked for."""

    def time(self) -> float:
        return self.now

    def call_at(self, when: float, callback: Callable[[], object], /) -> object:
        self.armed += 1
        self.due.append((when, callback))
        return callback

    def advance(self, seconds: float) -> None:
        """Move ``seconds`` on, firing each callback due on the way at its own moment, as a loop does."""
        until = self.now + seconds
        while ready := [entry for entry in self.due if entry[0] <= until]:
            first = min(ready, key=lambda entry: entry[0])
            self.due.remove(first)
            self.now = max(self.now, first[0])
            first[1]()
        self.now = until


async def turns(count: int = 3) -> None:
    """Let the loop run what is ready (no time passes on the graces' clock)."""
    for _ in range(count):
        await asyncio.sleep(0)


async def _write(log: list[str], name: str) -> None:
    log.append(f"write {name}")


async def _call(log: list[str], name: str, stored: asyncio.Future[None]) -> None:
    await stored  # the store taking the answer
    log.append(f"answered {name}")


def test_a_grace_that_ends_first_starts_the_writer_and_one_timer_serves_every_call() -> None:
    clock = ManualClock()

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        graces = _AnswerGraces(loop, clock)
        log: list[str] = []
        stored = {name: loop.create_future() for name in "abc"}
        runs = [
            asyncio.ensure_future(_InlineRun(graces, _write(log, name), {}, name).run(_call(log, name, stored[name])))
            for name in "abc"
        ]
        await turns()  # every run is in its grace now: one timer for all three
        assert len(graces) == 3 and clock.armed == 1
        stored["a"].set_result(None)  # stored in time: written whole once answered, by the call's own task
        await turns()
        assert log == ["answered a", "write a"]
        clock.advance(transport.ANSWER_GRACE_SECONDS - 0.001)
        assert len(graces) == 3, "no grace ends before its time"
        clock.advance(0.001 + transport.GRACE_SLACK_SECONDS)  # the graces of b and c end while their stores work
        assert len(graces) == 0
        await turns()
        assert log == ["answered a", "write a", "write b", "write c"]
        stored["b"].set_result(None)
        stored["c"].set_result(None)
        await asyncio.gather(*runs)
        return log

    log = asyncio.run(main())
    assert clock.armed == 1
    assert log.index("answered a") < log.index("write a")
    assert log.index("write b") < log.index("answered b")
    assert log.index("write c") < log.index("answered c")


def test_a_call_that_fails_within_its_grace_has_its_stream_closed_unwritten() -> None:
    clock = ManualClock()

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        graces = _AnswerGraces(loop, clock)
        log: list[str] = []
        stored: asyncio.Future[None] = loop.create_future()
        run = asyncio.ensure_future(_InlineRun(graces, _write(log, "a"), {}, "a").run(_call(log, "a", stored)))
        await turns()
        assert len(graces) == 1
        stored.set_exception(RuntimeError("store down"))
        with pytest.raises(RuntimeError):
            await run
        clock.advance(transport.ANSWER_GRACE_SECONDS * 2)  # its grace ends: no writer for a finished call
        assert len(graces) == 0
        await turns()
        return log

    assert asyncio.run(main()) == []


@pytest.mark.parametrize(
    ("spacing", "firings"),
    [(transport.GRACE_SLACK_SECONDS / 10, 1), (transport.GRACE_SLACK_SECONDS * 2, 8)],
    ids=["within-the-slack", "beyond-the-slack"],
)
def test_graces_that_end_within_the_slack_of_the_first_end_on_one_firing(spacing: float, firings: int) -> None:
    """At thousands of calls a second each call's grace ends at its own moment: one firing per call unless a
    firing also ends the graces that ended within :data:`transport.GRACE_SLACK_SECONDS` of the first."""
    names = "abcdefgh"
    clock = ManualClock()

    async def main() -> list[str]:
        loop = asyncio.get_running_loop()
        graces = _AnswerGraces(loop, clock)
        log: list[str] = []
        stored = {name: loop.create_future() for name in names}
        runs = []
        for name in names:  # each run's grace begins `spacing` after the last, so each ends at its own moment
            runs.append(
                asyncio.ensure_future(
                    _InlineRun(graces, _write(log, name), {}, name).run(_call(log, name, stored[name]))
                )
            )
            await turns()
            clock.advance(spacing)
        clock.advance(transport.ANSWER_GRACE_SECONDS + transport.GRACE_SLACK_SECONDS + spacing * len(names))
        assert len(graces) == 0
        await turns()  # every grace ended while its store still worked: each writer started
        for future in stored.values():
            future.set_result(None)
        await asyncio.gather(*runs)
        return log

    log = asyncio.run(main())
    assert clock.armed == firings
    assert all(log.index(f"write {name}") < log.index(f"answered {name}") for name in names)
