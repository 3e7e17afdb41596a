"""The lock that orders a stream's appends: exclusive, first come first served, and a cancelled waiter neither
keeps its place nor keeps the lock (asyncio.Lock's behaviour, with a free lock taken without a coroutine)."""

from __future__ import annotations

import asyncio

import pytest

from mcp_lossless.server.streams import AppendLock

pytestmark = pytest.mark.anyio


async def _hold(lock: AppendLock, name: str, order: list[str], inside: list[str]) -> None:
    if not lock.take():
        await lock.wait()
    try:
        inside.append(name)
        assert inside == [name], "two holders at once"
        order.append(name)
        await asyncio.sleep(0)
        await asyncio.sleep(0)
    finally:
        inside.remove(name)
        lock.release()


async def test_holders_take_turns_in_arrival_order() -> None:
    lock = AppendLock()
    order: list[str] = []
    inside: list[str] = []
    tasks = [asyncio.ensure_future(_hold(lock, str(n), order, inside)) for n in range(6)]
    await asyncio.gather(*tasks)
    assert order == [str(n) for n in range(6)]
    assert not lock.locked() and lock.take()


async def test_a_free_lock_is_taken_at_once_and_a_held_one_is_not() -> None:
    lock = AppendLock()
    assert lock.take()
    assert not lock.take()
    lock.release()
    assert lock.take()


async def test_a_waiter_cancelled_in_line_leaves_it_and_the_next_gets_the_lock() -> None:
    lock = AppendLock()
    assert lock.take()
    got: list[str] = []

    async def wait_for(name: str) -> None:
        await lock.wait()
        got.append(name)
        lock.release()

    first = asyncio.ensure_future(wait_for("first"))
    second = asyncio.ensure_future(wait_for("second"))
    await asyncio.sleep(0)
    first.cancel()
    await asyncio.sleep(0)
    lock.release()
    await asyncio.wait_for(second, 5)  # a lock that kept its place or its hold would hang here
    assert got == ["second"] and first.cancelled()
    assert not lock.locked()


async def test_a_waiter_cancelled_once_handed_the_lock_passes_it_on() -> None:
    lock = AppendLock()
    assert lock.take()
    got: list[str] = []

    async def wait_for(name: str) -> None:
        await lock.wait()
        got.append(name)
        lock.release()

    first = asyncio.ensure_future(wait_for("first"))
    second = asyncio.ensure_future(wait_for("second"))
    await asyncio.sleep(0)
    lock.release()  # handed to first, which has not run yet
    first.cancel()  # and is cancelled before it does
    await asyncio.wait_for(second, 5)  # a lock that kept its place or its hold would hang here
    assert got == ["second"] and first.cancelled()
    assert not lock.locked()


async def test_a_cancelled_waiter_dropped_by_a_release_leaves_no_trace() -> None:
    lock = AppendLock()
    assert lock.take()
    waiting = asyncio.ensure_future(lock.wait())
    await asyncio.sleep(0)
    waiting.cancel()  # its future is cancelled now; the release below drops it before it runs
    lock.release()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert not lock.locked() and lock.take()
