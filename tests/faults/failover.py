"""Failover schedules: the real client, real ``mcp-lossless serve`` replicas, a Redis primary SIGKILLed mid-call.

Issue 27, ADR 0025. Two *sites*, each a Redis primary and replica (tests/support/redis_topology.py: the replication
link runs through a relay the harness freezes, so the replica lags) and a pair of ``mcp-lossless serve`` processes
behind a load balancer (a :class:`CuttingProxy` whose upstream the harness switches, as a health-checking balancer
would), for each ``wait_replicas`` setting (0 and 1) the schedules use:

* ``flip``: the servers' store is the topology's endpoint relay; a failover is ``REPLICAOF NO ONE`` on the replica
  and the endpoint flipped to it, as a managed endpoint's name flips;
* ``sentinel``: three Sentinels monitor the pair; the servers' store is ``redis+sentinel://``; a failover is the
  Sentinels promoting the replica once the primary died.

A :class:`FailoverSchedule` draws the calls of one client session (``search`` and ``fetch`` idempotent, ``charge``
not), and where the faults land, each after a chosen SSE event (numbered across every connection through the load
balancer): freezing the replication link, killing the primary (then promotion, and the old primary rejoins as the
new one's replica through the relay: the pair is re-established for the next schedule, and a ``wait_replicas=1``
server has a replica to acknowledge again), whether the server running the calls dies with the primary, and
whether every client connection is cut and sent to the other server. :func:`check` holds each schedule to the
invariants; a violation raises :class:`~tests.faults.harness.Violation` naming the schedule.

Every server of a site stays up across schedules (a killed one is started again on its port), and so does the
topology: one start-up per site per run.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
import redis
from anyio.from_thread import BlockingPortal

from mcp_lossless.client import (
    CallMayHaveRun,
    Client,
    McpClientError,
    ProgressUpdate,
    RecoveryPolicy,
    RequestRejected,
    ToolCall,
    ToolResult,
)
from mcp_lossless.client.oauth import OAuth
from mcp_lossless.client.transport import Backoff
from mcp_lossless.core.errors import EXECUTION_LOST
from tests.faults import ledger as charges
from tests.faults.fault_tools import LEDGER_ENV
from tests.faults.harness import (
    CLIENT_ID,
    CLIENT_SECRET,
    TOOLS_TARGET,
    CallPlan,
    Stats,
    Violation,
    _one_by_one,
    arguments,
    expected_text,
)
from tests.support.mcp_http import parse_sse
from tests.support.processes import ServerProcess, free_port
from tests.support.proxy import CuttingProxy, Fault
from tests.support.recording import Exchange, RecordingTransport
from tests.support.redis_topology import RedisTopology, redis_topology

CALL_DEADLINE = 45.0
"""The client's deadline for each call: longer than any failover here (a Sentinel promotion takes a few seconds,
a ``wait_replicas=1`` append retries for up to 30 s), so a call that reaches it hung."""
HANG_MARGIN = 30.0
"""The harness waits this much longer than the deadline, failover steps included, then calls it a hang."""
LEASE_SECONDS = {"flip": 5, "sentinel": 20}
"""Above a failover's duration, as docs/redis.md requires: no server can renew its lease during one, and a shorter
lease lets the other server end a live call as "execution lost" (it does: with 1 s, a Sentinel promotion under
``wait_replicas=1`` loses calls whose server never died). A Sentinel promotion takes ``DOWN_AFTER_MS`` and an
election, and a split vote waits twice ``FAILOVER_TIMEOUT_MS`` before the next: about 7 s on an idle machine, but
10 s was outlasted on this loaded one (a soak's schedule 79 at ce913b5: two ``charge`` calls ended "execution
lost", no server killed), so 20."""
DOWN_AFTER_MS = 2000
"""The Sentinels' ``down-after-milliseconds``: with 500, and still now and then with 1000, a loaded machine makes them
fail a healthy primary over by themselves."""
FAILOVER_TIMEOUT_MS = 2000
WAIT_TIMEOUT_MS = 300
PROGRESS_EVERY = 25
"""A summary line every so many schedules (seen with ``-s``): a long run stopped early still has its figures."""
START_TRIES = 10
"""Sessions started per schedule while the server answers ``initialize`` 503 (the store still settling)."""
KEYED_REISSUES = 60
"""The client's bound on re-issues under one idempotency key, set to outlast :data:`CALL_DEADLINE` as the
application would: each "in progress" answer is sent again after its ``retryAfter`` (1 s), and a first use may run
longer than the default 20 of them here (its server's appends ride a Sentinel promotion and ``WAIT`` out for up to
30 s). With 20, soak schedule 37 at b9c78ff (Sentinel, ``wait_replicas=1``, two servers, freeze and kill after event
1, move after 13) ended an idempotent ``search`` "may have run: the key's first use was still running at the last
try" while that use went on to complete: a finding against the default bound (ADR 0029), reported with issue 28."""
BALANCER_GRACE = 30.0
"""While a server restarts, the balancer holds new connections for up to this long."""


RECORD_NOT_RETRIED = True
"""A known product gap, reported with issue 27: a POST stream's record is written once (``enqueue_open``), not
through an outage as its events are (``_append_with_retry``, 30 s), while its tool already runs. When the store
is away at that moment (with ``wait_replicas=1``, a ``WAIT`` that times out while the link is frozen and the primary
dies) the call ends -32041 before any event id, "may have run", instead of completing. Until fixed, a lossless
schedule tolerates that outcome for a call with no event id, counted as ``may_have_run:unavailable_before_any_id``;
set this to ``False`` to fail on it."""


# ---- schedules ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FailoverSchedule:
    promotion: str
    """``flip`` (the endpoint flipped to the promoted replica) or ``sentinel`` (the Sentinels promote it)."""
    wait_replicas: int
    replicas: int
    """How many ``mcp-lossless serve`` processes the balancer may use: 1, or 2 (the other takes over)."""
    calls: tuple[CallPlan, ...]
    """One session's calls, all in flight at once."""
    freeze_after: int | None = None
    """Freeze the replication link right after this event: from then on the replica lags."""
    kill_after: int | None = None
    """SIGKILL the primary right after this event (once the link froze, when it does), then promote."""
    producer_dies: bool = False
    """The server the balancer sends the client to is SIGKILLed with the primary (and started again after)."""
    move_after: int | None = None
    """Cut every client connection after this event; with two servers, send new ones to the other."""

    def describe(self) -> str:
        calls = ", ".join(f"{c.tool}({c.steps}x{c.delay_ms}ms)" for c in self.calls)
        parts = [f"{self.promotion} wait_replicas={self.wait_replicas} replicas={self.replicas}: {calls}"]
        if self.freeze_after is not None:
            parts.append(f"freeze after {self.freeze_after}")
        if self.kill_after is not None:
            parts.append(f"kill primary after {self.kill_after}{' with its server' if self.producer_dies else ''}")
        if self.move_after is not None:
            parts.append(f"cut and move after {self.move_after}")
        return "; ".join(parts)

    @property
    def lossless(self) -> bool:
        """Nothing may be lost: acknowledged by a replica, and the tool's execution survives."""
        return self.wait_replicas >= 1 and not (self.producer_dies and self.kill_after is not None)


# ---- the deployment ----------------------------------------------------------------------------------


@dataclass
class Pair:
    """Two servers on one store spec behind one balancer; :attr:`url` is their canonical URI."""

    balancer: CuttingProxy
    url: str
    servers: list[ServerProcess]
    front: int = 0
    """The server the balancer sends new connections to."""

    def point(self, index: int, *, cut: bool) -> None:
        self.front = index
        self.balancer.upstream_port = self.servers[index].port
        if cut:
            self.balancer.cut_all()


@dataclass
class Site:
    promotion: str
    topology: RedisTopology
    pairs: dict[int, Pair] = field(default_factory=dict)
    """By ``wait_replicas``."""

    def store(self, wait_replicas: int) -> str:
        base = self.topology.sentinel_url if self.promotion == "sentinel" else self.topology.endpoint_url
        spec = f"{base}?prefix=soak-{wait_replicas}&lease_seconds={LEASE_SECONDS[self.promotion]}"
        if wait_replicas:
            spec += f"&wait_replicas={wait_replicas}&wait_timeout_ms={WAIT_TIMEOUT_MS}"
        return spec


class FailoverHarness:
    """Sites and servers started on first use, kept for the whole run, and stopped at its end."""

    def __init__(self, portal: BlockingPortal, workdir: Path, stack: contextlib.ExitStack) -> None:
        self.portal = portal
        self.workdir = workdir
        self.stack = stack
        self.sites: dict[str, Site] = {}
        self.stats = Stats()
        self._number = 0
        (workdir / "charges").mkdir()
        self.ledger = charges.Ledger(workdir / "charges")
        self.unreplicated_repeats: set[str] = set()
        """``charge`` arguments run twice where the configuration allows it (:func:`_check_runs`)."""

    def site(self, promotion: str) -> Site:
        if promotion not in self.sites:
            directory = self.workdir / promotion
            sentinels = 3 if promotion == "sentinel" else 0
            topology = self.stack.enter_context(
                redis_topology(directory / "redis", sentinels=sentinels, down_after_ms=DOWN_AFTER_MS,
                               failover_timeout_ms=FAILOVER_TIMEOUT_MS)
            )  # fmt: skip
            self.sites[promotion] = Site(promotion, topology)
        return self.sites[promotion]

    def pair(self, site: Site, wait_replicas: int) -> Pair:
        if wait_replicas not in site.pairs:
            balancer = CuttingProxy(0, upstream_grace=BALANCER_GRACE)
            self.portal.call(balancer.__aenter__)
            self.stack.callback(self.portal.call, balancer.__aexit__, None, None, None)
            url = f"http://127.0.0.1:{balancer.port}/mcp"
            logs = self.workdir / site.promotion / f"wait-{wait_replicas}"
            logs.mkdir(parents=True)
            args = [
                TOOLS_TARGET, "--store", site.store(wait_replicas), "--public-url", url,
                "--dev-keys", str(self.workdir / "dev-keys.json"), "--dev-client", f"{CLIENT_ID}:{CLIENT_SECRET}",
                "--retry-ms", "50", "--log-level", "warning",
            ]  # fmt: skip
            ledger = {LEDGER_ENV: str(self.ledger.directory)}
            servers = [ServerProcess(args, free_port(), logs / f"{name}.log", env=ledger) for name in "ab"]
            for server in servers:
                self.stack.callback(server.stop)
            with ThreadPoolExecutor(2) as pool:
                list(pool.map(ServerProcess.start, servers))
            pair = Pair(balancer, url, servers)
            pair.point(0, cut=False)
            site.pairs[wait_replicas] = pair
        return site.pairs[wait_replicas]

    def settle(self, site: Site, timeout: float = 30) -> None:
        """Before and after a schedule: the Sentinels agree that the primary is the one this harness staged.

        On a loaded machine a primary may miss ``down-after-milliseconds`` (an ``appendfsync always`` write stuck
        behind other processes' disk traffic) and the Sentinels fail it over by themselves, even while the link is
        frozen (counted as a fault: the servers meet it as any other); the pair is then re-established the other
        way round. Readiness of other processes: polled, with a deadline.
        """
        topology = site.topology
        if site.promotion != "sentinel":
            return
        deadline = time.monotonic() + timeout
        while True:
            masters = set(topology.sentinel_masters())
            if masters == {("127.0.0.1", topology.primary.port)} and topology.role(topology.primary) == "master":
                return
            if masters == {("127.0.0.1", topology.replica.port)} and topology.role(topology.replica) == "master":
                self.stats.count(self.stats.faults, "Sentinel failover of its own")
                topology.swap_after_failover()
                continue
            if time.monotonic() > deadline:
                raise AssertionError(f"the Sentinels report {masters} after {timeout} s")
            time.sleep(0.05)  # readiness of other processes: there is no event to await

    def reestablished(self, site: Site, tries: int = 5) -> None:
        """After a schedule: the staged primary is the master and its replica holds every write it accepted. The
        Sentinels may fail the pair over by themselves at any moment (see :meth:`settle`), even between the two
        steps: then settle again."""
        for attempt in range(tries):
            self.settle(site)
            try:
                site.topology.wait_replicated()
                return
            except (redis.RedisError, AssertionError):
                if attempt == tries - 1:
                    raise

    def run(self, schedule: FailoverSchedule) -> None:
        self._number += 1
        number = self._number
        site = self.site(schedule.promotion)
        pair = self.pair(site, schedule.wait_replicas)
        self.settle(site)
        started = time.monotonic()
        said = _ClientLog()
        client_log = logging.getLogger("mcp_lossless.client")
        client_log.addHandler(said)
        try:
            run = self.portal.call(self._run, schedule, number, site, pair)
        except Violation as exc:
            raise Violation(f"failover schedule {number} [{schedule.describe()}]: {exc}{said.lines()}") from None
        except TimeoutError:
            raise Violation(
                f"failover schedule {number} [{schedule.describe()}]: no end within {CALL_DEADLINE + HANG_MARGIN} s"
                f"{said.lines()}"
            ) from None
        finally:
            client_log.removeHandler(said)
            self.stats.seconds += time.monotonic() - started
        self._tally(schedule, run)
        if self.stats.schedules % PROGRESS_EVERY == 0:
            print(f"\n[{time.strftime('%H:%M:%S')}] {describe_stats(self.stats)}", flush=True)

    async def _run(self, schedule: FailoverSchedule, number: int, site: Site, pair: Pair) -> FailoverRun:
        run = FailoverRun(schedule, number)
        triggers = {"freeze": anyio.Event(), "kill": anyio.Event(), "move": anyio.Event()}
        at = {"freeze": schedule.freeze_after, "kill": schedule.kill_after, "move": schedule.move_after}

        def hook(event: int) -> Fault | None:
            for name, when in at.items():
                if event == when:
                    triggers[name].set()
            return None

        pair.point(0, cut=False)
        recorder = RecordingTransport()
        with anyio.fail_after(CALL_DEADLINE + HANG_MARGIN):
            async with (
                httpx.AsyncClient(transport=recorder, timeout=httpx.Timeout(10, read=60)) as http,
                anyio.create_task_group() as tg,
            ):
                tg.start_soon(self._control, run, site, pair, triggers)
                tg.start_soon(self._move_when, run, pair, triggers["move"])
                await run.execute(pair.url, http, lambda: pair.balancer.reset(hook))
                run.finished = True
                for trigger in triggers.values():
                    trigger.set()  # an event that never came: let its waiter go
        pair.balancer.reset(None)
        if run.frozen and not run.killed:
            await anyio.to_thread.run_sync(site.topology.thaw_link)
            run.frozen = False
        await anyio.to_thread.run_sync(self.reestablished, site)
        check(run, recorder, self.ledger.refresh())
        self.unreplicated_repeats.update(run.unreplicated_repeats)
        return run

    async def _control(self, run: FailoverRun, site: Site, pair: Pair, triggers: dict[str, anyio.Event]) -> None:
        """Freeze the link, then kill the primary (and maybe its server), promote, re-establish the pair."""
        schedule, topology = run.schedule, site.topology
        if schedule.freeze_after is not None:
            await triggers["freeze"].wait()
            if run.finished:
                return
            await anyio.to_thread.run_sync(topology.freeze_link)
            run.frozen = run.froze = True
        if schedule.kill_after is None:
            return
        await triggers["kill"].wait()
        if run.finished:
            return
        victim = pair.front
        run.killed = True
        if schedule.producer_dies:
            run.killed_servers.append(pair.servers[victim].pid)
            await anyio.to_thread.run_sync(pair.servers[victim].kill)
        await anyio.to_thread.run_sync(topology.kill_primary)
        if schedule.producer_dies and schedule.replicas == 2:
            pair.point(1 - victim, cut=True)  # the balancer's health check: the survivor takes every connection
        if site.promotion == "flip":
            await anyio.to_thread.run_sync(topology.promote_replica)
            await anyio.to_thread.run_sync(topology.flip_endpoint)
        else:
            await anyio.to_thread.run_sync(topology.wait_sentinel_master)
        await anyio.to_thread.run_sync(topology.swap_after_failover)
        run.frozen = False
        if schedule.producer_dies:
            await anyio.to_thread.run_sync(pair.servers[victim].start)

    async def _move_when(self, run: FailoverRun, pair: Pair, trigger: anyio.Event) -> None:
        await trigger.wait()
        if run.finished:
            return
        other = 1 - pair.front if run.schedule.replicas == 2 else pair.front
        if run.schedule.producer_dies and run.killed:
            other = pair.front  # the balancer already sends everything to the survivor
        pair.point(other, cut=True)
        run.moved = True

    def _tally(self, schedule: FailoverSchedule, run: FailoverRun) -> None:
        stats = self.stats
        stats.schedules += 1
        for key in run.outcome_kinds():
            stats.calls += 1
            stats.count(stats.outcomes, key)
        for verdict in run.verdicts:
            stats.count(stats.charges, verdict)
        stats.count(stats.faults, f"promotion:{schedule.promotion}")
        stats.count(stats.faults, f"wait_replicas={schedule.wait_replicas}")
        stats.count(stats.faults, f"replicas={schedule.replicas}")
        if run.frozen_ever:
            stats.count(stats.faults, "link frozen")
        if run.killed:
            stats.count(stats.faults, "primary killed")
            if schedule.producer_dies:
                stats.count(stats.faults, "server killed with it")
        elif schedule.kill_after is not None:
            stats.count(stats.faults, "kill not reached")
        if run.moved:
            stats.count(stats.faults, "cut and moved" if schedule.replicas == 2 else "cut")
        stats.count(stats.faults, "re-issued", run.reissued)
        if run.replayed:
            stats.count(stats.faults, "result replayed under its key", run.replayed)
        if run.start_refusals:
            stats.count(stats.faults, "session start answered 503, started again", run.start_refusals)
        for status, n in run.resumes.items():
            stats.count(stats.faults, f"resume answered {status}", n)


class _ClientLog(logging.Handler):
    """What the client logged (its recovery decisions) during one schedule, for a violation's message."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(f"{record.levelname} {record.getMessage()}")

    def lines(self) -> str:
        return "".join(f"\n  client: {line}" for line in self.records)


# ---- one schedule's session --------------------------------------------------------------------------


@dataclass
class FailoverRun:
    schedule: FailoverSchedule
    number: int
    outcomes: list[ToolResult | McpClientError] = field(default_factory=list)
    progress: list[list[ProgressUpdate]] = field(default_factory=list)
    error: BaseException | None = None
    elapsed: float = 0.0
    finished: bool = False
    frozen: bool = False
    froze: bool = False
    killed: bool = False
    moved: bool = False
    reissued: int = 0
    start_refusals: int = 0
    resumes: dict[str, int] = field(default_factory=dict)
    replayed: int = 0
    """Results replayed under their key (:func:`_check_exactly_once`)."""
    killed_servers: list[int] = field(default_factory=list)
    """The pids of the servers SIGKILLed with the primary."""
    verdicts: list[str] = field(default_factory=list)
    """What the side-effect ledger says of each ``charge`` call (:func:`_check_runs`)."""
    unreplicated_repeats: list[str] = field(default_factory=list)

    @property
    def frozen_ever(self) -> bool:
        return self.froze

    def argument(self, position: int) -> str:
        """Unique per call across the whole run: a result carrying another call's output cannot pass."""
        tool = self.schedule.calls[position].tool
        base = f"f{self.number}-{position}"
        return f"https://example.com/{base}" if tool == "fetch" else f"{tool}-{base}"

    async def execute(self, url: str, http: httpx.AsyncClient, begin: Callable[[], None]) -> None:
        started = anyio.current_time()
        try:
            await self._execute(url, http, begin)
        except Exception as exc:
            self.error = exc
        finally:
            self.elapsed = anyio.current_time() - started

    async def _execute(self, url: str, http: httpx.AsyncClient, begin: Callable[[], None]) -> None:
        plans = self.schedule.calls
        self.progress = [[] for _ in plans]
        calls = [
            ToolCall(plan.tool, arguments(plan.tool, self.argument(i), plan), self.progress[i].append)
            for i, plan in enumerate(plans)
        ]
        for attempt in range(START_TRIES):
            client = Client(
                url,
                auth=OAuth(CLIENT_ID, CLIENT_SECRET),
                http=http,
                timeout=CALL_DEADLINE,
                backoff=Backoff(initial=0.05, maximum=1.0, jitter=0.25),
                policy=RecoveryPolicy(max_fruitless_reconnects=15, max_keyed_reissues=KEYED_REISSUES),
            )
            try:
                async with client:
                    await client.list_tools()
                    begin()  # events are numbered from the calls' first one
                    self.outcomes = await _one_by_one(client, calls)
                return
            except RequestRejected as exc:
                # The session could not start: a store still settling after the last failover answered 503
                # "retry later" (Retry-After: 1), which the client does not retry itself. No call was sent yet,
                # so the application starts a new session after the server's Retry-After (a protocol delay, not a
                # synchronisation), as it would; counted.
                if "HTTP 503" not in exc.reason or attempt == START_TRIES - 1:
                    raise
                self.start_refusals += 1
                await anyio.sleep(1)

    def outcome_kinds(self) -> list[str]:
        return [kind_of(outcome) for outcome in self.outcomes]


LOSS_REASONS = (
    ("resume refused: lost", "resume_lost"),
    ("events lost by the store", "events_lost"),
    ("execution lost", "execution_lost"),
    ("without a new event", "fruitless_resumes"),
    ("delivery refused before any event id (store_unavailable)", "unavailable_before_any_id"),
    ("server error before a response", "refused_before_a_response"),
    ("connection lost before a response", "cut_before_a_response"),
)
"""How the client says why a call may have run, by the words of its reason (the server's loss reason first)."""


def kind_of(outcome: object) -> str:
    """``result``, or the client's error kind with why, where it said why."""
    if isinstance(outcome, ToolResult):
        return "result"
    kind = str(getattr(outcome, "kind", "error"))
    if isinstance(outcome, CallMayHaveRun):
        data = (outcome.error or {}).get("data")
        reason = data.get("reason") if isinstance(data, dict) else None
        reason = reason or next((name for words, name in LOSS_REASONS if words in outcome.reason), "other")
        return f"{kind}:{reason}"
    return kind


# ---- the invariants ----------------------------------------------------------------------------------


@dataclass
class WireEvent:
    """One SSE event the client read, with the JSON-RPC messages it carried."""

    id: str | None
    data: str
    messages: list[dict[str, Any]]


def wire_events(recorder: RecordingTransport) -> list[WireEvent]:
    """Every SSE event of every response the client read, byte for byte as it arrived (priming events included)."""
    return [event for exchange in recorder.to("/mcp") for event in wire_events_of(exchange)]


def wire_events_of(exchange: Exchange) -> list[WireEvent]:
    """The SSE events of one response, each with its own ``id:`` field, not the decoder's *last event ID buffer*
    (which an event without an id inherits, as the spec says): what matters is the id the server put on the event.
    A partial event at the end of a cut connection was never dispatched to the client, and is not counted."""
    if not exchange.headers.get("content-type", "").startswith("text/event-stream"):
        return []
    text = bytes(exchange.received).decode("utf-8", errors="replace").replace("\r\n", "\n")
    complete = text[: text.rfind("\n\n") + 2] if "\n\n" in text else ""
    events: list[WireEvent] = []
    for event in parse_sse(complete):
        try:
            parsed = orjson.loads(event.data) if event.data else None
        except orjson.JSONDecodeError:
            parsed = None
        messages = [m for m in (parsed if isinstance(parsed, list) else [parsed]) if isinstance(m, dict)]
        events.append(WireEvent(event.id or None, event.data, messages))
    return events


@dataclass
class Sent:
    """One ``tools/call`` request the client sent, and whether its response carried any event id before it ended."""

    message: dict[str, Any]
    primed: bool

    @property
    def wire(self) -> Any:
        return self.message["id"]


def sent_calls(recorder: RecordingTransport, run: FailoverRun) -> list[list[Sent]]:
    """Each call's requests in the order sent: the first, then re-issues under new ids (same arguments)."""
    by_arguments: dict[bytes, list[Sent]] = {}
    for exchange in recorder.to("/mcp"):
        body = exchange.sent_json()
        for message in body if isinstance(body, list) else [body]:
            if isinstance(message, dict) and message.get("method") == "tools/call":
                primed = any(e.id for e in wire_events_of(exchange))
                by_arguments.setdefault(orjson.dumps(message["params"]["arguments"]), []).append(Sent(message, primed))
    return [
        by_arguments.get(orjson.dumps(arguments(plan.tool, run.argument(i), plan)), [])
        for i, plan in enumerate(run.schedule.calls)
    ]


def check(run: FailoverRun, recorder: RecordingTransport, ledger: charges.Ledger) -> None:
    schedule = run.schedule
    if run.error is not None:
        raise Violation(f"the session failed outside any call: {run.error!r}")
    if len(run.outcomes) != len(schedule.calls):
        raise Violation(f"{len(run.outcomes)} outcomes for {len(schedule.calls)} calls")
    if run.elapsed > CALL_DEADLINE:
        raise Violation(f"the session took {run.elapsed:.1f} s")
    events = wire_events(recorder)
    _check_ids(events)
    run.resumes = _check_resumes(recorder, schedule.lossless)
    requests = sent_calls(recorder, run)
    run.reissued = sum(len(sent) - 1 for sent in requests if sent)
    for position, (plan, outcome) in enumerate(zip(schedule.calls, run.outcomes, strict=True)):
        where = f"call {position} ({plan.tool})"
        if isinstance(outcome, ToolResult) and outcome.replayed:
            run.replayed += 1
        _check_outcome(run, position, plan, outcome, requests[position], where)
        _check_progress(run, position, plan, where)
        if plan.tool == "charge":
            _check_runs(run, position, outcome, ledger, where)
        if schedule.lossless:
            _check_exactly_once(plan, outcome, requests[position], events, where)
    if schedule.lossless:
        said = [m for e in events if e.id is None for m in e.messages if _code(m) == EXECUTION_LOST]
        if said:
            raise Violation(f"a loss said where nothing may be lost: {said}")


def _code(message: dict[str, Any]) -> object:
    error = message.get("error")
    return error.get("code") if isinstance(error, dict) else None


def _check_ids(events: Sequence[WireEvent]) -> None:
    """No event id ever named two contents, over every stream the client read (resumes on any server included)."""
    seen: dict[str, str] = {}
    for event in events:
        if event.id is not None and seen.setdefault(event.id, event.data) != event.data:
            raise Violation(f"event id {event.id} named two contents: {seen[event.id]!r} and {event.data!r}")


EXPLICIT_LOSSES = frozenset({"410 lost", "410 evicted"})
"""What a resume from an id a server sent may be refused with: the store lost it. ``evicted`` is what a resume
gets when the failover took the stream's record itself (its first events were never replicated): the store cannot
tell that from retention (``decide_resume``, record absent); explicit and final, though it names retention."""


def _check_resumes(recorder: RecordingTransport, lossless: bool) -> dict[str, int]:
    """Every id the client resumes from is one a server sent it: never answered 400 ``unknown`` (a store that lost
    it says so, 410, not resumable), nor any other refusal of the cursor; 404 (the session unknown) only where
    the store may lose what it acknowledged. Returns the answers by status (and error)."""
    statuses: dict[str, int] = {}
    for exchange in recorder.to("/mcp"):
        if exchange.method != "GET" or exchange.last_event_id is None:
            continue
        answer = exchange.received_json()
        error = answer.get("error") if isinstance(answer, dict) and exchange.status >= 400 else None
        key = f"{exchange.status}{f' {error}' if isinstance(error, str) else ''}"
        statuses[key] = statuses.get(key, 0) + 1
        if key == "404" and not lossless:
            continue  # without wait_replicas the failover may take the session's own record: said as 404
        if 400 <= exchange.status < 500 and key not in EXPLICIT_LOSSES:
            raise Violation(f"the resume from {exchange.last_event_id} was answered {key}: {answer}")
        if key in EXPLICIT_LOSSES and answer.get("resumable") is not False:
            raise Violation(f"the resume from {exchange.last_event_id} was answered {key}, resumable: {answer}")
    return statuses


def _check_outcome(
    run: FailoverRun, position: int, plan: CallPlan, outcome: object, sent: Sequence[Sent], where: str
) -> None:
    if isinstance(outcome, ToolResult):
        want = expected_text(plan.tool, run.argument(position))
        if outcome.text != want:
            raise Violation(f"{where}: result {outcome.text!r}, expected {want!r}")
        return
    if isinstance(outcome, CallMayHaveRun) and not run.schedule.lossless:
        # The explicit loss: the store lost acknowledged events (wait_replicas=0), or the execution died with its
        # server. An idempotent call is re-issued by the client and may still end so when its re-issues run out.
        return
    unprimed = bool(sent) and not any(s.primed for s in sent)
    gap = kind_of(outcome) == "may_have_run:unavailable_before_any_id"
    if isinstance(outcome, CallMayHaveRun) and unprimed and (RECORD_NOT_RETRIED or not gap):
        # Before the call's first event id the client has no cursor, and charge is not re-issued: a cut then (a
        # move), or the product gap of RECORD_NOT_RETRIED (counted apart as unavailable_before_any_id).
        return
    raise Violation(f"{where}: {type(outcome).__name__} ({kind_of(outcome)}): {getattr(outcome, 'reason', outcome)}")


def _check_runs(run: FailoverRun, position: int, outcome: object, ledger: charges.Ledger, where: str) -> None:
    """Issue 28, acceptance 1, by the server-side ledger: under its idempotency key the call ran at most once, a
    result after exactly one run, "may have run" only where its server was SIGKILLed during its run.

    With ``wait_replicas=0`` and the primary killed, Redis may lose acknowledged writes, the key's record or its
    outcome among them (docs/redis.md): a second run or a "may have run" without a killed server is then what the
    configuration allows, counted apart (``wait_replicas=0 failover: ...``), never tolerated with a replica's
    acknowledgement."""
    argument = run.argument(position)
    if not isinstance(outcome, ToolResult | CallMayHaveRun):
        return  # an error the tool did not run for: _check_outcome judged it
    verdict = charges.judge(argument, isinstance(outcome, ToolResult), ledger, run.killed_servers)
    if verdict.ok:
        run.verdicts.append(verdict.kind)
        return
    if run.schedule.wait_replicas or not run.killed:
        raise Violation(f"{where}: {kind_of(outcome)}: {verdict.kind}: {verdict.detail}")
    run.verdicts.append(f"wait_replicas=0 failover: {verdict.kind}")
    if len(ledger.runs.get(argument, [])) > 1:
        run.unreplicated_repeats.append(argument)


def _check_progress(run: FailoverRun, position: int, plan: CallPlan, where: str) -> None:
    """Only the call's own progress, increasing (a re-issue starts again at 1); with nothing lost, all of it."""
    updates = run.progress[position]
    last = 0.0
    for update in updates:
        expected = f"{plan.tool} step {update.progress:g}/{plan.steps}"
        if update.message != expected or update.total != plan.steps:
            raise Violation(f"{where}: foreign progress {update}")
        if update.progress <= last and update.progress != 1:
            raise Violation(f"{where}: progress {update.progress} after {last}")
        last = update.progress
    outcome = run.outcomes[position]
    if run.schedule.lossless and isinstance(outcome, ToolResult) and not outcome.replayed:
        values = [u.progress for u in updates]
        if values != [float(step) for step in range(1, plan.steps + 1)]:
            raise Violation(f"{where}: progress {values}, expected each of 1..{plan.steps} once")


def _check_exactly_once(
    plan: CallPlan, outcome: object, sent: Sequence[Sent], events: Sequence[WireEvent], where: str
) -> None:
    """On the wire, not only at the callbacks (the client drops what it already delivered): the call was sent again
    only when cut before its first event, and over the distinct events the client read, each progress value and
    the response of the request that answered came exactly once.

    A result *replayed* under the call's idempotency key (its first request cut before any event id, its tool run
    once on the server that took it, the re-issue answered "in progress" and then the stored outcome) carries no
    progress: that went to the first request's stream, for which the client held no cursor. Known client gap
    (issue 28): the in-progress answer's ``lastEventId`` names that stream, and the client does not follow it. For
    such a call only the one answer is required, and that its first request had no event id; counted."""
    if not sent:
        raise Violation(f"{where}: never sent")
    replayed = isinstance(outcome, ToolResult) and outcome.replayed
    if sent[0].primed if replayed else any(s.primed for s in sent[:-1]):
        raise Violation(f"{where}: re-issued after its stream had started: {[s.wire for s in sent]}")
    if not isinstance(outcome, ToolResult):
        return  # cut before any event, and not re-issued (checked by _check_outcome)
    distinct: dict[str, WireEvent] = {}
    for event in events:
        if event.id is not None:
            distinct.setdefault(event.id, event)
    wire = sent[-1].wire
    progress: list[float] = []
    answers = 0
    for event in distinct.values():
        for m in event.messages:
            params = m.get("params")
            params = params if isinstance(params, dict) else {}
            if m.get("method") == "notifications/progress" and params.get("progressToken") == wire:
                progress.append(params["progress"])
            elif m.get("id") == wire and ("result" in m or "error" in m):
                answers += 1
    if answers != 1 or (sorted(progress) != list(range(1, plan.steps + 1)) and not replayed):
        raise Violation(f"{where}: request {wire!r} on the wire: progress {sorted(progress)}, {answers} answers")


# ---- setting up ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def failover_harness(portal: BlockingPortal, workdir: Path) -> Iterator[FailoverHarness]:
    with contextlib.ExitStack() as stack:
        yield FailoverHarness(portal, workdir, stack)


def describe_stats(stats: Stats) -> str:
    return (
        f"failover schedules: {stats.schedules} in {stats.seconds:.0f} s, {stats.calls} calls; "
        f"outcomes {dict(sorted(stats.outcomes.items()))}; faults {dict(sorted(stats.faults.items()))}\n"
        f"{stats.charge_line()}"
    )


__all__ = ["FailoverHarness", "FailoverSchedule", "describe_stats", "failover_harness"]
