"""Issue 5 acceptance: several `mcp-lossless serve` processes on one real redis-server behave as one server.

Every replica gets the same ``--public-url`` (the canonical resource a load balancer would front) and the
same ``--dev-keys`` file, so a token from any replica's embedded AS verifies on every replica. The tests
address each replica directly: that is what a load balancer does to a client whose connection moves.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import pytest

from mcp_lossless.core.errors import DELIVERY_REFUSED, EXECUTION_LOST
from tests.support.mcp_http import Peer, StreamRead, call, dev_token, read_events
from tests.support.processes import ServerProcess, free_port
from tests.support.redis_server import RedisServer, redis_server_binary

pytestmark = pytest.mark.anyio

CLIENTS = ["dev-client:dev-secret", "mallory:mallory-secret"]
MALLORY = ("mallory", "mallory-secret")


@dataclass
class Deployment:
    """What replicas share: the Redis store (one prefix), the dev AS keys and the canonical URI."""

    store: str
    keys: Path
    canonical: str
    logs: Path

    def start(self, stack: contextlib.ExitStack, *names: str) -> list[ServerProcess]:
        """Start one replica per name, concurrently (each takes a second or two to import and bind)."""
        args = ["--store", self.store, "--dev-keys", str(self.keys), "--public-url", self.canonical]
        args += ["--retry-ms", "100"]
        for client in CLIENTS:
            args += ["--dev-client", client]
        replicas = [ServerProcess(args, free_port(), self.logs / f"{name}.log") for name in names]
        for replica in replicas:
            stack.callback(replica.stop)
        with ThreadPoolExecutor(len(replicas)) as pool:
            list(pool.map(ServerProcess.start, replicas))
        return replicas

    def tool(self, name: str) -> str:
        return f"{self.canonical}/tools/{name}"


def deployment(redis_url: str, directory: Path, lease_seconds: float) -> Deployment:
    prefix = f"replicas-{uuid.uuid4().hex[:12]}"
    store = f"{redis_url}?prefix={prefix}&lease_seconds={lease_seconds}"
    return Deployment(store, directory / "dev-keys.json", f"http://127.0.0.1:{free_port()}/mcp", directory)


@pytest.fixture(scope="module")
def pair(
    redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Deployment, ServerProcess, ServerProcess]]:
    """Replicas A and B on the shared redis-server; a dead replica's lease runs out after one second."""
    with contextlib.ExitStack() as stack:
        shared = deployment(redis_url, tmp_path_factory.mktemp("replicas"), lease_seconds=1.0)
        a, b = shared.start(stack, "a", "b")
        yield shared, a, b


def on(replica: ServerProcess, peer: Peer, token: str | None = None) -> Peer:
    """The same client (session, token) talking to another replica."""
    moved = Peer(peer.http, replica.base, token or peer.token, peer.version)
    moved.session_id = peer.session_id
    return moved


def progress_of(*reads: StreamRead) -> list[int]:
    return [m["params"]["progress"] for r in reads for m in r.messages if m.get("method") == "notifications/progress"]


def resume_decisions(replica: ServerProcess) -> list[dict[str, Any]]:
    lines = replica.log.read_text().splitlines()
    entries = [orjson.loads(line) for line in lines if line.startswith("{")]
    return [e for e in entries if e.get("event") == "resume"]


async def read_while(
    peer: Peer, last_event_id: str, reached: anyio.Event, ids_needed: int, out: list[StreamRead]
) -> None:
    """Resume and read to the end, setting ``reached`` once ``ids_needed`` events with an id arrived."""
    headers = peer.headers(**{"last-event-id": last_event_id, "accept": "text/event-stream"})
    headers.pop("content-type")
    async with peer.http.stream("GET", peer.url, headers=headers) as response:
        read = StreamRead(response.status_code, headers=response.headers)
        out.append(read)
        await read_events(response, read, lambda read: len(read.ids) >= ids_needed and reached.set())
    reached.set()


# --- 1. a call moves to another replica while it runs ------------------------------------------------


async def test_call_resumed_on_another_replica_gets_every_event_once_live_included(
    pair: tuple[Deployment, ServerProcess, ServerProcess], http: httpx.AsyncClient
) -> None:
    shared, a, b = pair
    peer = Peer(http, a.base, await dev_token(http, a.base, shared.canonical))
    await peer.initialize()
    steps = 12
    started = await peer.post(call(1, "search", progress="p", query="moving", steps=steps, delay_ms=120), stop_after=3)
    assert started.status == 200
    early = started.ids[1]  # an event is stored after it: the refusal is due before anything is sent

    narrowed = await dev_token(http, b.base, shared.tool("fetch"))
    refused_on_b = await on(b, peer).resume(early, token=narrowed)
    refused_on_a = await peer.resume(early, token=narrowed)
    assert refused_on_b.status == refused_on_a.status == 403, refused_on_b.body
    assert refused_on_b.json() == refused_on_a.json(), "B refuses exactly as the producing server does"
    assert refused_on_b.json()["requiredResources"] == [shared.tool("search")]
    challenge = refused_on_b.headers["www-authenticate"]
    assert challenge == refused_on_a.headers["www-authenticate"]
    assert 'error="insufficient_scope"' in challenge

    cursor = started.ids[-1]
    resumed = await on(b, peer).resume(cursor)

    assert resumed.status == 200
    ids = started.ids + resumed.ids
    assert len(ids) == len(set(ids)), "no event delivered twice"
    assert progress_of(started, resumed) == list(range(1, steps + 1)), "every event exactly once, in order"
    final = resumed.messages[-1]
    assert final["id"] == 1
    assert final["result"]["content"][0]["text"] == "search results for 'moving': 3 documents"
    replayed = [d for d in resume_decisions(b) if d.get("decision") == "replay" and d.get("cursor") == cursor]
    assert replayed and replayed[0]["tail"] == "replica", "B tailed the stream A was still producing"
    assert replayed[0]["events"] < steps, "so the later events reached B live, through the store"


# --- 2. the producing replica dies ------------------------------------------------------------------


async def test_killed_replica_its_call_ends_with_execution_lost_and_a_reissue_succeeds(
    pair: tuple[Deployment, ServerProcess, ServerProcess], http: httpx.AsyncClient
) -> None:
    shared, _, b = pair
    with contextlib.ExitStack() as stack:
        [doomed] = shared.start(stack, "doomed")
        peer = Peer(http, doomed.base, await dev_token(http, b.base, shared.canonical))
        await peer.initialize()
        fetch = call(5, "fetch", progress="p", url="https://example.com/big", steps=60, delay_ms=40)
        started = await peer.post(fetch, stop_after=5)  # priming + 4 progress events
        doomed.kill()

    replay = await on(b, peer).resume(started.ids[1])

    assert replay.status == 200
    assert replay.ids[:3] == started.ids[2:], "the stored events come first"
    progress = progress_of(replay)
    assert progress == list(range(2, len(progress) + 2))
    final = replay.messages[-1]
    assert final["id"] == 5
    assert final["error"]["code"] == EXECUTION_LOST
    assert final["error"]["data"] == {"reason": "execution_lost", "requestId": 5, "resumable": False}
    # ADR 0025: the loss is on the stream's record, at no position the dead replica may have given
    assert replay.events[-1].id is None, "the loss names no position"

    again = await on(b, peer).resume(started.ids[1])
    assert again.ids == replay.ids, "recorded once, whichever replica is asked"
    assert again.messages[-1] == final, "every replica reads the same outcome off the record"

    reissued = await on(b, peer).post(call(6, "fetch", url="https://example.com/big", steps=2, delay_ms=5))
    assert reissued.messages[-1]["result"]["content"][0]["text"] == "contents of https://example.com/big: 23 bytes"


# --- 4. hijacks are refused everywhere --------------------------------------------------------------


async def test_cross_replica_hijacks_are_refused_on_every_replica(
    pair: tuple[Deployment, ServerProcess, ServerProcess], http: httpx.AsyncClient
) -> None:
    shared, a, b = pair
    token = await dev_token(http, a.base, shared.canonical)
    victim = Peer(http, a.base, token)
    await victim.initialize()
    done = await victim.post(call(1, "search", query="private", steps=1, delay_ms=0))
    other = Peer(http, b.base, token)
    await other.initialize()
    foreign = await other.post(call(1, "search", query="other", steps=1, delay_ms=0))

    mallory_token = await dev_token(http, b.base, shared.canonical, client=MALLORY)
    for replica in (a, b):
        thief = on(replica, victim, mallory_token)
        assert (await thief.post(call(2, "search", query="steal"))).status == 404
        assert (await thief.resume(done.ids[0])).status == 404
        assert (await http.delete(thief.url, headers=thief.headers())).status_code == 404

        spliced = await on(replica, victim).resume(foreign.ids[0])
        assert spliced.status == 409
        assert spliced.json()["error"] == "foreign_session"
        mallory = Peer(http, replica.base, mallory_token)
        await mallory.initialize()  # the victim's real id on mallory's own session: as unknown as a made-up one
        stolen = await mallory.resume(done.ids[0])
        assert (stolen.status, stolen.json()["error"], stolen.events) == (400, "unknown", [])

        assert (await on(replica, victim).resume(done.ids[0])).ids == done.ids[1:], "the owner is unaffected"


async def test_a_session_deleted_on_one_replica_is_gone_on_every_replica(
    pair: tuple[Deployment, ServerProcess, ServerProcess], http: httpx.AsyncClient
) -> None:
    shared, a, b = pair
    peer = Peer(http, a.base, await dev_token(http, a.base, shared.canonical))
    await peer.initialize()
    assert (await on(b, peer).post(call(1, "search", query="x", steps=0, delay_ms=0))).status == 200
    assert (await http.delete(peer.url, headers=peer.headers())).status_code == 204
    assert (await on(b, peer).post(call(2, "search", query="x", steps=0, delay_ms=0))).status == 404
    assert (await peer.post(call(3, "search", query="x", steps=0, delay_ms=0))).status == 404


# --- 3. Redis restarts and stays away for a while ---------------------------------------------------


async def test_redis_outage_gives_503s_and_explicit_ends_then_recovers_without_restarts(
    tmp_path: Path, http: httpx.AsyncClient
) -> None:
    redis = RedisServer(redis_server_binary(), tmp_path / "redis-data")
    redis.directory.mkdir()
    redis.start()
    with contextlib.ExitStack() as stack:
        stack.callback(redis.stop)
        # The lease outlives the outage, so after it no replica takes the other for dead.
        shared = deployment(redis.url, tmp_path, lease_seconds=30.0)
        a, b = shared.start(stack, "a", "b")
        peer = Peer(http, a.base, await dev_token(http, a.base, shared.canonical))
        await peer.initialize()
        finished = await peer.post(call(1, "search", progress="p", query="before", steps=3, delay_ms=0))
        assert finished.messages[-1]["id"] == 1

        redis.restart()  # a restart mid-run with persistence: nothing acknowledged is lost
        replayed = await on(b, peer).resume(finished.ids[0])
        assert (replayed.ids, replayed.messages) == (finished.ids[1:], finished.messages)

        steps = 30
        running = await peer.post(
            call(2, "search", progress="p", query="during", steps=steps, delay_ms=100), stop_after=2
        )
        tail_on_b: list[StreamRead] = []
        tailing = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(read_while, on(b, peer), running.ids[-1], tailing, 2, tail_on_b)
            await tailing.wait()
            redis.stop()

        tail = tail_on_b[0]
        end = tail.messages[-1]
        assert tail.events[-1].id is None, "the explicit end carries no id: the cursor stays put"
        assert end["id"] == 2
        assert end["error"]["code"] == DELIVERY_REFUSED
        assert end["error"]["data"]["reason"] == "store_unavailable"
        assert end["error"]["data"]["lastEventId"] == tail.ids[-1]

        while_down = [
            await peer.post(call(3, "search", query="down")),
            await on(b, peer).post(call(4, "search", query="down")),
            await on(b, peer).resume(finished.ids[0]),
            await Peer(http, b.base, peer.token).post(
                {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": "2025-11-25"}}
            ),
        ]
        for refused in while_down:
            assert refused.status == 503, refused.body
            assert refused.headers["retry-after"] == "1"
            assert "event store unavailable" in refused.json()["error"]["message"]

        redis.start()  # same port, same append-only file

        rest = await on(b, peer).resume(tail.ids[-1])
        assert progress_of(running, tail, rest) == list(range(1, steps + 1)), "paused, then every event once"
        assert rest.messages[-1]["result"]["content"][0]["text"] == "search results for 'during': 3 documents"
        again = await on(b, peer).resume(finished.ids[0])
        assert (again.ids, again.messages) == (finished.ids[1:], finished.messages), "acknowledged events survived"
        after = await on(b, peer).post(call(5, "search", query="after", steps=1, delay_ms=0))
        assert after.messages[-1]["result"]["content"][0]["text"] == "search results for 'after': 3 documents"
        assert a.proc is not None and a.proc.poll() is None
        assert b.proc is not None and b.proc.poll() is None
