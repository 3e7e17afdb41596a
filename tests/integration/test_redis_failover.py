"""Redis fails over mid-call, with real processes: what a client of mcp-lossless gets (issue 27, ADR 0025).

A primary, a replica replicating through a relay the test freezes (so the replica lags), and an endpoint relay the
mcp-lossless servers connect to, flipped to the promoted replica as a managed endpoint's name flips
(tests/support/redis_topology.py). The client speaks raw HTTP, reading the call's stream live while the test kills
the primary under it.

Without replica acknowledgement the failover loses events the client holds: every call still ends in exactly one
explicit outcome, no stream hangs, no event id is ever sent with two contents, and a resume across the loss is the
explicit `lost` refusal. With ``wait_replicas=1`` nothing acknowledged is lost and the call completes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from mcp_lossless.core.errors import EXECUTION_LOST
from tests.integration.test_redis_replicas import Deployment, on
from tests.support.mcp_http import Peer, StreamRead, call, dev_token, parse_sse
from tests.support.processes import free_port
from tests.support.redis_topology import RedisTopology, redis_topology

pytestmark = pytest.mark.anyio

STEPS = 40
DELAY_MS = 100


class LiveRead:
    """One response read as it arrives, so the test can act when the client holds given events."""

    def __init__(self) -> None:
        self.read = StreamRead(0)
        self.ended = anyio.Event()
        self._changed = anyio.Event()

    def progress(self) -> list[int]:
        return [m["params"]["progress"] for m in self.read.messages if m.get("method") == "notifications/progress"]

    async def until(self, condition: Callable[[LiveRead], bool]) -> None:
        with anyio.fail_after(30):
            while not condition(self):
                if self.ended.is_set():
                    raise AssertionError(f"the stream ended first: {self.read.messages[-3:]}")
                self._changed = anyio.Event()
                await self._changed.wait()

    async def run(self, peer: Peer, method: str, headers: dict[str, str], body: bytes | None) -> None:
        try:
            async with peer.http.stream(method, peer.url, headers=headers, content=body) as response:
                self.read.status = response.status_code
                buffer = ""
                async for chunk in response.aiter_text():
                    buffer += chunk
                    while "\n\n" in buffer:
                        block, buffer = buffer.split("\n\n", 1)
                        self.read.events.extend(parse_sse(block + "\n\n"))
                        self._changed.set()
        finally:
            self.ended.set()
            self._changed.set()


def posting(peer: Peer, payload: dict[str, Any]) -> tuple[LiveRead, Callable[[], Any]]:
    live = LiveRead()
    return live, lambda: live.run(peer, "POST", peer.headers(), orjson.dumps(payload))


def resuming(peer: Peer, cursor: str) -> tuple[LiveRead, Callable[[], Any]]:
    live = LiveRead()
    headers = peer.headers(**{"last-event-id": cursor, "accept": "text/event-stream"})
    headers.pop("content-type")
    return live, lambda: live.run(peer, "GET", headers, None)


def contents(*reads: StreamRead) -> dict[str, str]:
    """Event id → content over every read, asserting that no id was ever sent with two contents."""
    seen: dict[str, str] = {}
    for read in reads:
        for event in read.events:
            if event.id is not None and event.data:
                assert seen.setdefault(event.id, event.data) == event.data, f"id {event.id} named two contents"
    return seen


def seq(event_id: str) -> int:
    return int(event_id.split(".")[1], 16)


@contextlib.contextmanager
def deployed(tmp_path: Path, *names: str, wait_replicas: int = 0) -> Iterator[tuple[RedisTopology, list[Any]]]:
    """The topology and mcp-lossless replicas on its endpoint (a dead replica's lease runs out after 1 s)."""
    with redis_topology(tmp_path / "redis") as topology, contextlib.ExitStack() as stack:
        store = f"{topology.endpoint_url}?prefix=failover&lease_seconds=1"
        if wait_replicas:
            store += f"&wait_replicas={wait_replicas}&wait_timeout_ms=300"
        logs = tmp_path / "logs"
        logs.mkdir()
        shared = Deployment(store, tmp_path / "dev-keys.json", f"http://127.0.0.1:{free_port()}/mcp", logs)
        yield topology, [shared, *shared.start(stack, *names)]


async def fail_over(topology: RedisTopology) -> None:
    """Kill the primary, promote the lagging replica, flip the endpoint to it (off the event loop: they block)."""
    await anyio.to_thread.run_sync(topology.kill_primary)
    await anyio.to_thread.run_sync(topology.promote_replica)
    await anyio.to_thread.run_sync(topology.flip_endpoint)


def outcome(read: StreamRead, request_id: int) -> dict[str, Any]:
    """The one terminal answer of ``request_id`` in ``read``."""
    answers = [m for m in read.messages if m.get("id") == request_id and ("result" in m or "error" in m)]
    assert len(answers) == 1, f"{len(answers)} outcomes of request {request_id}: {read.messages[-3:]}"
    return answers[0]


async def test_a_loss_under_a_live_call_ends_it_explicitly_and_resumes_across_it_are_refused(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    with deployed(tmp_path, "a", "b") as (topology, (shared, a, b)):
        peer = Peer(http, a.base, await dev_token(http, a.base, shared.canonical))
        await peer.initialize()
        live, run = posting(
            peer, call(5, "fetch", progress="p", url="https://example.com", steps=STEPS, delay_ms=DELAY_MS)
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await live.until(lambda r: len(r.progress()) >= 3)
            await anyio.to_thread.run_sync(topology.wait_replicated)
            topology.freeze_link()  # from here the replica lags: what the client is sent next, a failover loses
            await live.until(lambda r: len(r.progress()) >= 6)
            await fail_over(topology)
            with anyio.fail_after(20):
                await live.ended.wait()

        held_by_client = live.read.ids[-1]
        final = outcome(live.read, 5)
        assert final["error"]["code"] == EXECUTION_LOST and final["error"]["data"]["reason"] == "events_lost"
        assert live.read.events[-1].id is None, "the loss is said without an id: the cursor stays put"
        held = final["error"]["data"]["heldEventId"]
        assert held is not None and seq(held) < seq(held_by_client), "it names what the store still holds"
        assert live.progress() == list(range(1, len(live.progress()) + 1)), "nothing skipped before the end"

        for replica in (a, b):  # the client's cursor is past what the store holds: the explicit loss, never 'unknown'
            refused = await on(replica, peer).resume(held_by_client)
            assert refused.status == 410, refused.body
            assert refused.json()["error"] == "lost" and refused.json()["resumable"] is False
            assert refused.json()["heldEventId"] == held

        early = live.read.ids[1]  # an id the store holds: its events, then the same explicit end
        replay = await on(b, peer).resume(early)
        assert replay.status == 200
        assert all(seq(i) <= seq(held) for i in replay.ids)
        assert outcome(replay, 5)["error"]["data"] == final["error"]["data"]
        contents(live.read, replay)


async def test_a_replica_following_the_call_ends_explicitly_within_the_lease_and_no_id_is_reused(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    with deployed(tmp_path, "a", "b") as (topology, (shared, a, b)):
        peer = Peer(http, a.base, await dev_token(http, a.base, shared.canonical))
        await peer.initialize()
        payload = call(5, "fetch", progress="p", url="https://example.com", steps=STEPS, delay_ms=DELAY_MS)
        started = await peer.post(payload, stop_after=3)
        followed, run = resuming(on(b, peer), started.ids[-1])  # B follows A's stream through the store
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await followed.until(lambda r: len(r.read.ids) >= 2)
            await anyio.to_thread.run_sync(topology.wait_replicated)
            topology.freeze_link()
            await followed.until(lambda r: len(r.read.ids) >= 5)
            a.kill()  # the producer dies with the primary: B must end the stream, not wait on it
            await fail_over(topology)
            with anyio.fail_after(15):
                await followed.ended.wait()

        final = outcome(followed.read, 5)
        assert final["error"]["code"] == EXECUTION_LOST, final
        assert followed.read.events[-1].id is None
        client_holds = followed.read.ids[-1]

        again = await on(b, peer).resume(client_holds)
        assert again.status == 410 and again.json()["error"] == "lost", again.body
        held = again.json()["heldEventId"]
        replay = await on(b, peer).resume(started.ids[1])
        assert replay.status == 200
        assert replay.ids and seq(replay.ids[-1]) == seq(held), "every event the store holds, then the end"
        assert outcome(replay, 5)["error"]["code"] == EXECUTION_LOST
        contents(started, followed.read, replay)  # B's settling wrote no position the dead producer had given


async def test_with_replica_acknowledgement_nothing_acknowledged_is_lost_and_the_call_completes(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    with deployed(tmp_path, "a", "b", wait_replicas=1) as (topology, (shared, a, b)):
        peer = Peer(http, a.base, await dev_token(http, a.base, shared.canonical))
        await peer.initialize()
        steps = 25
        live, run = posting(
            peer, call(5, "fetch", progress="p", url="https://example.com", steps=steps, delay_ms=DELAY_MS)
        )
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await live.until(lambda r: len(r.progress()) >= 4)
            topology.freeze_link()
            held_before = len(live.progress())
            await fail_over(topology)
            # The old primary comes back as a replica of the new one, so there is a replica to acknowledge again.
            await anyio.to_thread.run_sync(topology.rejoin_primary_as_replica)
            with anyio.fail_after(60):
                await live.ended.wait()

        assert held_before <= 5, "frozen, the replica acknowledged nothing: at most one event was already sent"
        final = outcome(live.read, 5)
        assert final["result"]["content"][0]["text"].startswith("contents of https://example.com"), final
        assert live.progress() == list(range(1, steps + 1)), "every progress exactly once, in order"
        ids = live.read.ids
        assert len(ids) == len(set(ids))
        resumed = await on(b, peer).resume(ids[2])
        assert resumed.status == 200
        contents(live.read, resumed)
        assert outcome(resumed, 5) == final


async def test_sentinel_promotes_the_replica_mid_stream_and_another_replica_resumes_the_call_exactly_once(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    with redis_topology(tmp_path / "redis", sentinels=3) as topology, contextlib.ExitStack() as stack:
        store = f"{topology.sentinel_url}?prefix=sentinel&lease_seconds=5&wait_replicas=1&wait_timeout_ms=300"
        logs = tmp_path / "logs"
        logs.mkdir()
        shared = Deployment(store, tmp_path / "dev-keys.json", f"http://127.0.0.1:{free_port()}/mcp", logs)
        a, b = shared.start(stack, "a", "b")
        peer = Peer(http, a.base, await dev_token(http, a.base, shared.canonical))
        await peer.initialize()
        steps = 40
        live, run = posting(peer, call(5, "fetch", progress="p", url="https://example.com", steps=steps, delay_ms=80))
        async with anyio.create_task_group() as tg:
            tg.start_soon(run)
            await live.until(lambda r: len(r.progress()) >= 4)
            await anyio.to_thread.run_sync(topology.kill_primary)
            await anyio.to_thread.run_sync(topology.wait_sentinel_master)
            await anyio.to_thread.run_sync(topology.rejoin_primary_as_replica)
            after_failover = len(live.progress())
            await live.until(lambda r: len(r.progress()) >= after_failover + 3)  # the call goes on, acknowledged
            tg.cancel_scope.cancel()  # the client's connection drops: it resumes on the other replica

        resumed = await on(b, peer).resume(live.read.ids[-1])
        assert resumed.status == 200
        progress = live.progress() + [
            m["params"]["progress"] for m in resumed.messages if m.get("method") == "notifications/progress"
        ]
        assert progress == list(range(1, steps + 1)), "every progress exactly once, in order, across the failover"
        final = outcome(resumed, 5)
        assert final["result"]["content"][0]["text"].startswith("contents of https://example.com"), final
        ids = live.read.ids + resumed.ids
        assert len(ids) == len(set(ids))
        contents(live.read, resumed)
