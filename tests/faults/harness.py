"""The fault-injection harness: real servers behind cutting proxies, the real client, one schedule at a time.

Three servers stay up for a whole run, each behind its own :class:`CuttingProxy` (its canonical URI is the
proxy's, so the client, its tokens and the embedded authorization server all go through the proxy):

* ``memory``: in-process, memory store, the demo tools plus ``charge`` (not idempotent);
* ``expiry``: the same with access tokens that live one second and no leeway, so tokens expire mid-call;
* ``restart``: a real ``mcp-lossless serve`` process with the SQLite store and a shared dev-keys file,
  killed with SIGKILL and started again on the same port when a schedule says so.

A :class:`Schedule` says which calls to make (one or two sessions, batched or not) and which faults to
inject: connection drops after chosen SSE events (numbered across all connections of the schedule),
delays before chosen events, narrowing the client's token to one tool and widening it again, expiry, a
server restart. :func:`check` then holds every outcome to the invariants; a violation raises
:class:`Violation` naming the schedule.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx
from anyio.from_thread import BlockingPortal, start_blocking_portal

from mcp_lossless.client import (
    AuthorizationFailed,
    CallMayHaveRun,
    Client,
    McpClientError,
    ProgressUpdate,
    RecoveryPolicy,
    ToolCall,
    ToolResult,
)
from mcp_lossless.client.oauth import OAuth
from mcp_lossless.client.transport import Backoff
from mcp_lossless.server.app import create_app
from mcp_lossless.server.config import ServerConfig
from tests.faults import ledger as charges
from tests.faults.fault_tools import LEDGER_ENV, fault_tools
from tests.support.processes import ServerProcess, free_port
from tests.support.proxy import CuttingProxy, Fault
from tests.support.recording import RecordingTransport
from tests.support.uvicorn_server import loopback_socket, serve_app

CLIENT_ID, CLIENT_SECRET = "dev-client", "dev-secret"
CALL_DEADLINE = 20.0
"""Each schedule's calls must all resolve within this; the harness waits a little longer, then calls it a hang."""
HANG_MARGIN = 10.0
RETRY_MS = 20
RESTART_GRACE = 10.0
"""While the server restarts, the proxy holds new connections (as a load balancer would) for up to this long."""
IDEMPOTENT = frozenset({"search", "fetch"})
TOOLS_TARGET = f"{Path(__file__).with_name('fault_tools.py')}:TOOLS"
"""The tools a server process serves: the same as the in-process servers', ``charge`` and its ledger included."""


class Violation(AssertionError):
    """An invariant did not hold for a schedule."""


# ---- schedules ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallPlan:
    tool: str
    steps: int
    delay_ms: int


@dataclass(frozen=True)
class Schedule:
    server: str
    """``memory``, ``expiry`` or ``restart``."""
    version: str
    batch: bool
    """Several calls of a session as one JSON-RPC batch (2025-03-26 only), else one POST each."""
    sessions: tuple[tuple[CallPlan, ...], ...]
    cuts: frozenset[int] = frozenset()
    """Drop the connection right after these events (numbered from 1 across the schedule)."""
    delays: tuple[tuple[int, float], ...] = ()
    """(event number, seconds to hold it back)."""
    narrow_after: int | None = None
    """Narrow the first session's token to ``narrow_to`` after this many progress updates reached it."""
    narrow_to: str = "search"
    widen: bool = False
    """Re-authorize for every tool shortly after narrowing (a fresh grant)."""
    restart_after: int | None = None
    """Kill the server (SIGKILL) right after this event and start it again."""

    def describe(self) -> str:
        calls = " | ".join(", ".join(f"{c.tool}({c.steps}x{c.delay_ms}ms)" for c in s) for s in self.sessions)
        parts = [f"{self.server} {self.version}{' batch' if self.batch else ''}: {calls}"]
        if self.cuts:
            parts.append(f"cuts {sorted(self.cuts)}")
        if self.delays:
            parts.append(f"delays {list(self.delays)}")
        if self.narrow_after is not None:
            parts.append(f"narrow to {self.narrow_to} after {self.narrow_after}{' then widen' if self.widen else ''}")
        if self.restart_after is not None:
            parts.append(f"restart after event {self.restart_after}")
        return "; ".join(parts)


# ---- the servers -------------------------------------------------------------------------------------


def expected_text(tool: str, argument: str) -> str:
    if tool == "search":
        return f"search results for {argument!r}: 3 documents"
    if tool == "fetch":
        return f"contents of {argument}: {len(argument)} bytes"
    return f"charged {argument}"


def arguments(tool: str, argument: str, plan: CallPlan) -> dict[str, Any]:
    key = {"search": "query", "fetch": "url", "charge": "amount"}[tool]
    return {key: argument, "steps": plan.steps, "delay_ms": plan.delay_ms}


@dataclass
class Target:
    name: str
    proxy: CuttingProxy
    url: str
    process: ServerProcess | None = None
    restarts: int = 0

    def resource(self, tool: str) -> str:
        return f"{self.url}/tools/{tool}"


@dataclass
class Stats:
    schedules: int = 0
    calls: int = 0
    outcomes: dict[str, int] = field(default_factory=dict)
    faults: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    charges: dict[str, int] = field(default_factory=dict)
    """``charge`` calls by what the side-effect ledger says of them (:func:`tests.faults.ledger.judge`)."""

    def charge_line(self) -> str:
        total = sum(self.charges.values())
        crashes = sum(self.charges.get(kind, 0) for kind in charges.CRASH_KINDS)
        by_kind = dict(sorted(self.charges.items()))
        return f"charge: {total} calls, each run at most once; may have run {crashes} (killed in its run); {by_kind}"

    def count(self, table: dict[str, int], key: str, n: int = 1) -> None:
        table[key] = table.get(key, 0) + n


class Harness:
    """Servers, proxies and an event loop thread shared by every schedule of a run."""

    def __init__(self, portal: BlockingPortal, targets: dict[str, Target], ledger: charges.Ledger) -> None:
        self.portal = portal
        self.targets = targets
        self.ledger = ledger
        self.stats = Stats()
        self._counter = 0
        self._lock = threading.Lock()

    def run(self, schedule: Schedule) -> None:
        with self._lock:
            self._counter += 1
            number = self._counter
        started = time.monotonic()
        try:
            self.portal.call(self._run, schedule, number)
        except Violation as exc:
            raise Violation(f"schedule {number} [{schedule.describe()}]: {exc}") from None
        finally:
            self.stats.seconds += time.monotonic() - started

    async def _run(self, schedule: Schedule, number: int) -> None:
        target = self.targets[schedule.server]
        restart = anyio.Event()
        cuts, delays = schedule.cuts, dict(schedule.delays)

        def hook(event: int) -> Fault | None:
            if event == schedule.restart_after:
                restart.set()
            if event in cuts or event in delays:
                return Fault(delay=delays.get(event, 0.0), cut=event in cuts)
            return None

        target.proxy.reset(hook)
        recorder = RecordingTransport()
        runs = [SessionRun(i, plans, number) for i, plans in enumerate(schedule.sessions)]
        finished: list[bool] = []
        killed: list[int] = []
        hang_limit = CALL_DEADLINE + HANG_MARGIN + (30 if schedule.restart_after else 0)
        with anyio.fail_after(hang_limit):
            async with (
                httpx.AsyncClient(transport=recorder, timeout=httpx.Timeout(10, read=60)) as http,
                anyio.create_task_group() as tg,
            ):
                if schedule.restart_after is not None:
                    tg.start_soon(self._restart_when, restart, target, finished, killed)
                for run in runs:
                    tg.start_soon(run.execute, target, schedule, http)
                for run in runs:
                    await run.done.wait()
                finished.append(True)
                restart.set()  # the event never came: let the waiter go
        target.proxy.reset(None)
        verdicts = check(schedule, target, runs, recorder, self.ledger.refresh(), killed)
        self._tally(schedule, runs, target, verdicts)

    async def _restart_when(
        self, trigger: anyio.Event, target: Target, finished: list[bool], killed: list[int]
    ) -> None:
        await trigger.wait()
        if target.process is None or finished:
            return
        killed.append(target.process.pid)
        await anyio.to_thread.run_sync(_restart, target.process)
        target.restarts += 1
        self.stats.count(self.stats.faults, "restart")

    def _tally(self, schedule: Schedule, runs: list[SessionRun], target: Target, verdicts: list[str]) -> None:
        stats = self.stats
        stats.schedules += 1
        for verdict in verdicts:
            stats.count(stats.charges, f"{schedule.server}: {verdict}" if verdict == "ran once" else verdict)
        for run in runs:
            for outcome in run.outcomes:
                stats.calls += 1
                key = "result" if isinstance(outcome, ToolResult) else getattr(outcome, "kind", "error")
                stats.count(stats.outcomes, key)
        stats.count(stats.faults, f"server:{schedule.server}")
        stats.count(stats.faults, "cut", len(schedule.cuts))
        stats.count(stats.faults, "delay", len(schedule.delays))
        if schedule.narrow_after is not None:
            stats.count(stats.faults, "narrow")
        if schedule.widen:
            stats.count(stats.faults, "widen")
        if schedule.restart_after is not None:
            stats.count(stats.faults, "restart scheduled")
        if schedule.batch:
            stats.count(stats.faults, "batch")
        if len(schedule.sessions) > 1:
            stats.count(stats.faults, "two sessions")


def _restart(process: ServerProcess) -> None:
    process.kill()
    process.start()


@dataclass
class SessionRun:
    """One client session of a schedule: its calls, their outcomes, and what reached its callbacks."""

    index: int
    plans: tuple[CallPlan, ...]
    schedule_number: int
    outcomes: list[ToolResult | McpClientError] = field(default_factory=list)
    progress: list[list[ProgressUpdate]] = field(default_factory=list)
    error: BaseException | None = None
    token_changes_failed: list[str] = field(default_factory=list)
    elapsed: float = 0.0
    done: anyio.Event = field(default_factory=anyio.Event)

    def argument(self, position: int) -> str:
        """Unique per call across the whole run: a result carrying another call's output cannot pass."""
        tool = self.plans[position].tool
        base = f"{self.schedule_number}-{self.index}-{position}"
        return f"https://example.com/{base}" if tool == "fetch" else f"{tool}-{base}"

    async def execute(self, target: Target, schedule: Schedule, http: httpx.AsyncClient) -> None:
        started = anyio.current_time()
        try:
            await self._execute(target, schedule, http)
        except Exception as exc:
            self.error = exc
        finally:
            self.elapsed = anyio.current_time() - started
            self.done.set()

    async def _execute(self, target: Target, schedule: Schedule, http: httpx.AsyncClient) -> None:
        auth = OAuth(CLIENT_ID, CLIENT_SECRET, leeway=0)
        self.progress = [[] for _ in self.plans]
        narrowing = anyio.Event()
        updates = 0

        def on_progress(position: int) -> Any:
            def record(update: ProgressUpdate) -> None:
                nonlocal updates
                self.progress[position].append(update)
                updates += 1
                if self.index == 0 and schedule.narrow_after is not None and updates >= schedule.narrow_after:
                    narrowing.set()

            return record

        calls = [
            ToolCall(plan.tool, arguments(plan.tool, self.argument(i), plan), on_progress(i))
            for i, plan in enumerate(self.plans)
        ]
        client = Client(
            target.url,
            auth=auth,
            http=http,
            timeout=CALL_DEADLINE,
            protocol_version=schedule.version,
            backoff=Backoff(initial=0.02, maximum=0.5, jitter=0.25),
            policy=RecoveryPolicy(max_fruitless_reconnects=8),
        )
        async with client:
            await client.list_tools()
            async with anyio.create_task_group() as tg:
                if self.index == 0 and schedule.narrow_after is not None:
                    tg.start_soon(self._narrow, auth, narrowing, target, schedule)
                if schedule.batch:
                    self.outcomes = await client.call_tools(calls)
                else:
                    self.outcomes = await _one_by_one(client, calls)
                tg.cancel_scope.cancel()

    async def _narrow(self, auth: OAuth, trigger: anyio.Event, target: Target, schedule: Schedule) -> None:
        """The application drops privileges (and maybe takes them back); the AS may be down (a restart)."""
        await trigger.wait()
        try:
            await auth.narrow([target.resource(schedule.narrow_to)])
            if schedule.widen:
                await anyio.sleep(0.02)
                await auth.reauthorize(frozenset(target.resource(p.tool) for p in self.plans))
        except AuthorizationFailed as exc:
            self.token_changes_failed.append(exc.reason)


async def _one_by_one(client: Client, calls: Sequence[ToolCall]) -> list[ToolResult | McpClientError]:
    """Every call in flight at once, each its own ``call_tool`` (its own POST, whatever the revision)."""
    outcomes: list[ToolResult | McpClientError | None] = [None] * len(calls)

    async def one(position: int, call: ToolCall) -> None:
        try:
            outcomes[position] = await client.call_tool(call.name, call.arguments, on_progress=call.on_progress)
        except McpClientError as exc:
            outcomes[position] = exc

    async with anyio.create_task_group() as tg:
        for position, call in enumerate(calls):
            tg.start_soon(one, position, call)
    return [o for o in outcomes if o is not None]


# ---- the invariants ----------------------------------------------------------------------------------


def check(
    schedule: Schedule,
    target: Target,
    runs: Sequence[SessionRun],
    recorder: RecordingTransport,
    ledger: charges.Ledger,
    killed: Sequence[int],
) -> list[str]:
    """Raises :class:`Violation`, else returns what the ledger says of each ``charge`` call."""
    verdicts: list[str] = []
    for run in runs:
        if run.error is not None:
            raise Violation(f"session {run.index} failed outside any call: {run.error!r}")
        if len(run.outcomes) != len(run.plans):
            raise Violation(f"session {run.index}: {len(run.outcomes)} outcomes for {len(run.plans)} calls")
        if run.elapsed > CALL_DEADLINE + HANG_MARGIN:
            raise Violation(f"session {run.index} took {run.elapsed:.1f} s")
        for position, (plan, outcome) in enumerate(zip(run.plans, run.outcomes, strict=True)):
            _check_outcome(run, position, plan, outcome)
            _check_progress(run, position, plan)
            if plan.tool == "charge":
                verdicts.append(_check_runs(run, position, outcome, ledger, killed))
    _check_deliveries(target, recorder)
    return verdicts


def _check_outcome(run: SessionRun, position: int, plan: CallPlan, outcome: object) -> None:
    where = f"session {run.index} call {position} ({plan.tool})"
    if isinstance(outcome, ToolResult):
        want = expected_text(plan.tool, run.argument(position))
        if outcome.text != want:
            raise Violation(f"{where}: result {outcome.text!r}, expected {want!r}")
        return
    if plan.tool not in IDEMPOTENT and isinstance(outcome, CallMayHaveRun):
        return  # whether it may have: the side-effect ledger says (_check_runs)
    raise Violation(f"{where}: {type(outcome).__name__}: {getattr(outcome, 'reason', outcome)}")


def _check_runs(run: SessionRun, position: int, outcome: object, ledger: charges.Ledger, killed: Sequence[int]) -> str:
    """Issue 28, acceptance 1: under its idempotency key the call ran at most once, a result after exactly one run,
    and "may have run" only where a SIGKILL landed during the call's own run (what the server-side ledger says)."""
    verdict = charges.judge(run.argument(position), isinstance(outcome, ToolResult), ledger, killed)
    if not verdict.ok:
        said = getattr(outcome, "reason", "its result")
        raise Violation(
            f"session {run.index} call {position} (charge) ended {said!r}: {verdict.kind}: {verdict.detail}"
        )
    return verdict.kind


def _check_progress(run: SessionRun, position: int, plan: CallPlan) -> None:
    """Only this call's own progress, each value once per run of the tool (a re-issue starts again at 1)."""
    last = 0.0
    for update in run.progress[position]:
        expected = f"{plan.tool} step {update.progress:g}/{plan.steps}"
        if update.message != expected or update.total != plan.steps:
            raise Violation(f"session {run.index} call {position}: foreign progress {update}")
        if update.progress <= last and update.progress != 1:
            raise Violation(f"session {run.index} call {position}: progress {update.progress} after {last}")
        last = update.progress


def _check_deliveries(target: Target, recorder: RecordingTransport) -> None:
    """No call's progress or result reached the client over a connection whose token did not cover its tool."""
    tool_of: dict[object, str] = {}
    exchanges = recorder.to("/mcp")
    for exchange in exchanges:
        sent = exchange.sent_json()
        for message in sent if isinstance(sent, list) else [sent]:
            if isinstance(message, dict) and message.get("method") == "tools/call":
                tool_of[message["id"]] = message["params"]["name"]
    for exchange in exchanges:
        audience = exchange.audience
        for message in exchange.messages():
            wire = message.get("id") if "result" in message else (message.get("params") or {}).get("progressToken")
            tool = tool_of.get(wire) if isinstance(wire, str | int) else None
            if tool is None:
                continue
            if target.url not in audience and target.resource(tool) not in audience:
                raise Violation(f"{tool} event for {wire!r} reached the client under a token for {sorted(audience)}")


# ---- setting up ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def harness(workdir: Path) -> Iterator[Harness]:
    ledger = workdir / "charges"
    ledger.mkdir()
    with start_blocking_portal() as portal:
        targets: dict[str, Target] = {}
        with contextlib.ExitStack() as stack:
            for name, ttl in (("memory", 600), ("expiry", 1)):
                targets[name] = stack.enter_context(_in_process(portal, name, ttl, ledger))
            targets["restart"] = stack.enter_context(_cli_process(portal, workdir, ledger))
            yield Harness(portal, targets, charges.Ledger(ledger))


@contextlib.contextmanager
def _proxy(portal: BlockingPortal, upstream: int) -> Iterator[CuttingProxy]:
    proxy = CuttingProxy(upstream, upstream_grace=RESTART_GRACE)
    portal.call(proxy.__aenter__)
    try:
        yield proxy
    finally:
        portal.call(proxy.__aexit__, None, None, None)


@contextlib.contextmanager
def _in_process(portal: BlockingPortal, name: str, ttl: int, ledger: Path) -> Iterator[Target]:
    sock = loopback_socket()
    port = sock.getsockname()[1]
    with _proxy(portal, port) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/mcp"
        config = ServerConfig(
            port=port,
            public_url=url,
            store="memory",
            retry_ms=RETRY_MS,
            token_ttl=ttl,
            leeway_seconds=0 if ttl < 60 else 30,
            dev_clients={CLIENT_ID: CLIENT_SECRET},
        )
        with serve_app(create_app(config, fault_tools(ledger)), sock=sock, lifespan="on"):
            yield Target(name, proxy, url)


@contextlib.contextmanager
def _cli_process(portal: BlockingPortal, workdir: Path, ledger: Path) -> Iterator[Target]:
    port = free_port()
    with _proxy(portal, port) as proxy:
        url = f"http://127.0.0.1:{proxy.port}/mcp"
        args = [
            TOOLS_TARGET, "--store", f"sqlite:{workdir / 'faults.db'}", "--public-url", url,
            "--retry-ms", str(RETRY_MS),
            "--dev-keys", str(workdir / "dev-keys.json"), "--dev-client", f"{CLIENT_ID}:{CLIENT_SECRET}",
            "--log-level", "warning",
        ]  # fmt: skip
        process = ServerProcess(args, port, workdir / "serve.log", env={LEDGER_ENV: str(ledger)})
        process.start()
        try:
            yield Target("restart", proxy, url, process)
        finally:
            process.stop()


def soak() -> bool:
    """``MCP_LOSSLESS_SOAK=1`` asks for the long run."""
    return os.environ.get("MCP_LOSSLESS_SOAK") == "1"


def budget(default: int, long: int) -> int:
    """How many schedules to run: the long count in a soak."""
    return long if soak() else default
