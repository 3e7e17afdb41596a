"""A stdio upstream: a child process speaking newline-delimited JSON-RPC, spawned and supervised.

The supervisor owns the child. When it exits (crash, SIGKILL, closed stdout, a line past the bound), every
call in flight on it ends at once with an explicit outcome — never a hang: a call to an idempotent tool
(annotated, or listed in the config) waits for the restarted child and runs again under a new id while
its deadline allows; any other call fails with ``execution_lost`` (it may have run). The child is
restarted with exponential backoff, and given up after ``max_restarts`` failed starts in a row (calls
then fail as ``unreachable``). A call past its deadline is cancelled in the child
(``notifications/cancelled``) and fails with ``deadline``; so is a call whose client cancelled it.

The child's era is negotiated at each spawn (:mod:`.stdio_era`: 2026-07-28 first, then ``initialize``, or
as configured). A modern child's tool-list changes come on a ``subscriptions/listen`` request kept open on
the pipe (when its ``server/discover`` announces them), a legacy child's as plain notifications.

A child's requests for input (elicitation, sampling, roots) are asked of the calling client in its era, through
the call's :class:`~.upstream.Reporter` (the server's one way of asking, ``ToolContext.request``/``ask``), and the
answer goes back: a modern child's ``input_required`` answers are retried with the responses (a new request per
round); a legacy child's requests arrive on the pipe mid-call, which names no call, so one is passed on only
while exactly one call runs on the child (else the child gets an error saying why).

Log notifications of a stdio child carry no request they relate to, so they go to the gateway's log,
not to any client's stream (another tool's caller must not receive them); a modern child is not asked for
any. Progress is routed by its token, which the gateway sets per call.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import os
import signal
from collections.abc import Callable
from typing import Any

import orjson

from .. import tracing
from ..client.errors import ProtocolViolation, describe_failure
from ..client.handlers import MAX_INPUT_ROUNDS, InputRefused
from ..client.paging import collect_pages
from ..core import errors, idempotency
from .config import UpstreamConfig
from .stdio_era import LEGACY_INPUT_METHODS, SpokenEra, complete, enveloped, input_requests, negotiate_era
from .upstream import (
    LIST_METHODS,
    CatalogRead,
    ListKind,
    Relay,
    Reporter,
    UpstreamFailure,
    UpstreamRpcError,
    UpstreamTool,
    ask_client,
    counted,
)

log = logging.getLogger("mcp_lossless.gateway")
MAX_LINE_BYTES = 8 * 1024 * 1024
HANDSHAKE_SECONDS = 60.0
STDERR_GRACE_SECONDS = 1.0
"""How long a child that exited during its start is given to finish writing its stderr (its reason)."""
LISTENED = {"toolsListChanged": True}
"""What a modern child's ``subscriptions/listen`` asks for."""
_PASSED_ENV = ("PATH", "HOME", "LANG", "TMPDIR")


def _route_progress(relay: Relay, reporter: Reporter, params: dict[str, Any]) -> None:
    """A ``notifications/progress`` of a call, queued for the client's stream (malformed values dropped)."""
    value, total, message = params.get("progress"), params.get("total"), params.get("message")
    if not isinstance(value, int | float) or isinstance(value, bool):
        return
    relay.put(
        lambda: reporter.report_progress(
            float(value),
            float(total) if isinstance(total, int | float) and not isinstance(total, bool) else None,
            message if isinstance(message, str) else None,
        )
    )


class _ChildExited(Exception):
    """The child that was to answer is gone."""


class _Call:
    """One gateway call on the child: its progress token (its first request's id), the id of its request now in
    flight (a modern child's input rounds are new requests), its client, and the child's requests for input."""

    __slots__ = ("asks", "reporter", "rid", "token")

    def __init__(self, rid: int, reporter: Reporter) -> None:
        self.token = rid
        self.rid = rid
        self.reporter = reporter
        self.asks: asyncio.Queue[dict[str, Any]] = asyncio.Queue()


class StdioUpstream:
    def __init__(self, config: UpstreamConfig, *, initial_backoff: float = 0.2, max_backoff: float = 10.0) -> None:
        assert config.command is not None
        self.name = config.name
        self.config = config
        self.restarts = 0
        self.era: SpokenEra | None = None
        """The era the running child speaks (negotiated at its spawn, or configured)."""
        self.on_restart: Callable[[], None] = lambda: None
        self.on_reachability: Callable[[bool, str], None] = lambda up, why: None
        """Told when the child is ready (``True``) and when it exits (``False``): the ``upstream_up`` gauge."""
        self.up = False
        self._initial_backoff = initial_backoff
        self._max_backoff = max_backoff
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._stderr: asyncio.Task[None] | None = None
        self._stderr_tail = ""
        """The child's last non-empty line on stderr: a failed start quotes it."""
        self._supervisor: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._progress: dict[int, Callable[[dict[str, Any]], None]] = {}
        self._asking: dict[int, Callable[[dict[str, Any]], None]] = {}
        """Where a legacy child's requests for input go, per running call (:meth:`_exchange` serves them)."""
        self._ids = itertools.count(1)
        self._ready = asyncio.Event()
        self._failed_starts = 0
        self._given_up: str | None = None
        self._closing = False
        self._tools: list[UpstreamTool] = []
        self._keyed = False
        """The running child declared ``tools.idempotency``: a call's key goes with it (ADR 0033)."""
        self._on_tools_changed: Callable[[], None] = lambda: None

    @property
    def pid(self) -> int | None:
        """The running child's process id (for operators and fault tests)."""
        return self._proc.pid if self._proc is not None and self._proc.returncode is None else None

    async def start(self, on_tools_changed: Callable[[], None]) -> None:
        self._on_tools_changed = on_tools_changed
        await self._spawn()
        self._supervisor = asyncio.create_task(self._supervise())

    def tools(self) -> list[UpstreamTool]:
        return list(self._tools)

    # ---- the child --------------------------------------------------------------------------------

    async def _spawn(self) -> None:
        config = self.config
        assert config.command is not None
        env = {k: v for k in _PASSED_ENV if (v := os.environ.get(k)) is not None}
        env.update(config.env)
        try:
            proc = await asyncio.create_subprocess_exec(
                *config.command,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                limit=MAX_LINE_BYTES,
            )
        except OSError as exc:
            raise UpstreamFailure(
                "unreachable", f"cannot start {config.command[0]}: {exc}", may_have_run=False
            ) from exc
        self._proc = proc
        self._reader = asyncio.create_task(self._read(proc))
        self._stderr_tail = ""
        stderr = self._stderr = asyncio.create_task(self._drain_stderr(proc))
        try:
            async with asyncio.timeout(HANDSHAKE_SECONDS):
                handshake = await negotiate_era(self._request, self._notify, config.era, self.era)
                self.era = handshake.era
                self._keyed = idempotency.declared(handshake.capabilities)
                if handshake.era == "modern" and handshake.announces_list_changes:
                    self._spawn_task(self._listen())  # before the listing: a change after it is announced
                self._tools = await self._list_tools()
        except (TimeoutError, _ChildExited, UpstreamRpcError, UpstreamFailure) as exc:
            self.era = None  # the era is probed again at the next start
            if isinstance(exc, _ChildExited):  # what it said before it went is why: read its stderr to the end
                await asyncio.wait((stderr,), timeout=STDERR_GRACE_SECONDS)
            await self._kill(proc)
            raise UpstreamFailure(
                "unreachable",
                f"upstream {self.name} did not start: {self._start_failure(exc, proc.returncode)}",
                may_have_run=False,
            ) from exc
        log.info(
            "upstream %s: child %d ready, %s era (%s), %s",
            self.name,
            proc.pid,
            handshake.era,
            handshake.how,
            counted(len(self._tools), "tool"),
        )
        self._ready.set()
        self._reachable(True, f"child {proc.pid} ready")

    def _reachable(self, up: bool, why: str) -> None:
        if up != self.up:
            self.up = up
            self.on_reachability(up, why)

    def _start_failure(self, exc: Exception, status: int | None) -> str:
        """Why a child did not start, in words its operator can act on (an exception's repr names our classes)."""
        if isinstance(exc, TimeoutError):
            return f"no answer to its handshake within {HANDSHAKE_SECONDS:g} s"
        if isinstance(exc, _ChildExited):
            said = (
                f"; its last line on stderr: {self._stderr_tail}" if self._stderr_tail else ", saying nothing on stderr"
            )
            return f"it exited with status {status} during its handshake{said}"
        if isinstance(exc, UpstreamRpcError):
            return f"its handshake was refused: {exc.code} {exc}"
        return str(exc)

    def _speaking(self, params: dict[str, Any]) -> dict[str, Any]:
        """A request's params in the child's era: a modern child gets the per-request envelope."""
        return enveloped(params) if self.era == "modern" else params

    async def _list_tools(self) -> list[UpstreamTool]:
        async def page(params: dict[str, Any]) -> dict[str, Any]:
            return await self._request("tools/list", self._speaking(params))

        try:
            entries = await collect_pages(page, "tools")
        except ProtocolViolation as exc:  # an upstream cycling cursors must not stall a start
            raise UpstreamFailure("protocol", str(exc), may_have_run=False) from exc
        return [tool for entry in entries if (tool := UpstreamTool.from_wire(entry)) is not None]

    async def _supervise(self) -> None:
        while not self._closing:
            proc, reader = self._proc, self._reader
            assert proc is not None and reader is not None
            await reader  # stdout ended: the child exited or closed it
            self._reachable(False, f"child {proc.pid} exited")
            await self._kill(proc)
            if self._closing:
                return
            log.warning("upstream %s: child %d exited with %s; restarting", self.name, proc.pid, proc.returncode)
            before = [t.name for t in self._tools]
            while not self._closing:
                self._failed_starts += 1
                if self._failed_starts > self.config.max_restarts:
                    self._given_up = f"upstream {self.name} failed {self.config.max_restarts} restarts in a row"
                    log.error("%s; giving up", self._given_up)
                    self._ready.set()  # wake waiting calls: they fail as unreachable
                    return
                delay = min(self._max_backoff, self._initial_backoff * 2 ** (self._failed_starts - 1))
                await asyncio.sleep(delay)
                try:
                    await self._spawn()
                except UpstreamFailure as exc:
                    log.warning("upstream %s: restart failed: %s", self.name, exc.detail)
                    continue
                self.restarts += 1
                self.on_restart()
                break
            if [t.name for t in self._tools] != before:
                self._on_tools_changed()

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            while line := await proc.stdout.readline():
                self._handle(line)
        except ValueError:  # a line past MAX_LINE_BYTES (asyncio's LimitOverrunError)
            log.error("upstream %s: a line exceeded %d bytes; restarting the child", self.name, MAX_LINE_BYTES)
        finally:
            self._ready.clear()
            pending, self._pending = self._pending, {}
            for future in pending.values():
                if not future.done():
                    future.set_exception(_ChildExited(f"upstream {self.name} exited"))

    async def _drain_stderr(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stderr is not None
        with contextlib.suppress(ValueError):
            while line := await proc.stderr.readline():
                text = line[:1000].decode("utf-8", "replace").rstrip()
                log.debug("upstream %s stderr: %s", self.name, text)
                self._stderr_tail = text or self._stderr_tail

    def _handle(self, line: bytes) -> None:
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            log.info("upstream %s: ignored a stdout line that is not JSON", self.name)
            return
        if not isinstance(message, dict):
            return
        method = message.get("method")
        if "id" in message and method is None:
            future = self._pending.pop(message["id"], None) if isinstance(message["id"], int) else None
            if future is not None and not future.done():
                future.set_result(message)
            return
        if not isinstance(method, str):
            return
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        if "id" in message:  # a request of the child's own: ping, or one for input
            reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
            if method == "ping":
                reply["result"] = {}
            elif method not in LEGACY_INPUT_METHODS:  # a modern child asks in its answers, never on the pipe
                reply["error"] = {"code": errors.METHOD_NOT_FOUND, "message": f"the gateway does not serve {method}"}
            elif len(self._asking) == 1:  # the pipe names no call: it can only be the one running
                next(iter(self._asking.values()))(message)
                return
            else:
                running = f"{len(self._asking)} calls are running" if self._asking else "no call is running"
                reply["error"] = {
                    "code": errors.INTERNAL_ERROR,
                    "message": f"the gateway cannot tell whose client to ask for {method}: {running}",
                }
            self._spawn_task(self._write_quietly(reply))
        elif method == "notifications/progress":
            route = self._progress.get(params.get("progressToken"))  # type: ignore[arg-type]
            if route is not None:
                route(params)
        elif method in ("notifications/tools/list_changed", "notifications/subscriptions/acknowledged"):
            self._spawn_task(self._refresh())  # the list changed, or may have before the subscription took hold
        elif method == "notifications/message":
            log.info("upstream %s log [%s]: %s", self.name, params.get("level"), str(params.get("data"))[:1000])

    def _spawn_task(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _refresh(self) -> None:
        """Re-list the tools; a list that differs is published."""
        try:
            tools = await self._list_tools()
        except (_ChildExited, UpstreamRpcError, UpstreamFailure) as exc:
            log.warning("upstream %s: tools/list after list_changed failed: %r", self.name, exc)
            return
        if tools != self._tools:
            self._tools = tools
            self._on_tools_changed()

    async def _listen(self) -> None:
        """A modern child's ``subscriptions/listen``: open for the child's life (its answer ends it)."""
        try:
            await self._request("subscriptions/listen", enveloped({"notifications": LISTENED}))
            log.warning("upstream %s ended its list-change subscription: its list is read at restarts", self.name)
        except UpstreamRpcError as exc:
            log.warning("upstream %s refused subscriptions/listen (%s): its list is read at restarts", self.name, exc)
        except (_ChildExited, UpstreamFailure):
            pass  # the child is gone: its successor subscribes again

    async def _write(self, message: dict[str, Any]) -> None:
        proc = self._proc
        if proc is None or proc.stdin is None or proc.returncode is not None:
            raise _ChildExited(f"upstream {self.name} is not running")
        try:
            proc.stdin.write(orjson.dumps(message) + b"\n")
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError) as exc:
            raise _ChildExited(f"upstream {self.name}: its stdin is closed ({describe_failure(exc)})") from exc

    async def _notify(self, method: str) -> None:
        await self._write({"jsonrpc": "2.0", "method": method})

    async def _write_quietly(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(_ChildExited):
            await self._write(message)

    async def _request(self, method: str, params: dict[str, Any], rid: int | None = None) -> dict[str, Any]:
        rid = next(self._ids) if rid is None else rid
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[rid] = future
        try:
            await self._write({"jsonrpc": "2.0", "id": rid, "method": method, "params": params})
            answer = await future
        finally:
            self._pending.pop(rid, None)
        error = answer.get("error")
        if isinstance(error, dict):
            raise UpstreamRpcError(
                int(error.get("code", errors.INTERNAL_ERROR)), str(error.get("message", "")), error.get("data")
            )
        result = answer.get("result")
        if not isinstance(result, dict):
            raise UpstreamFailure("protocol", f"the answer to {method} has no result object", may_have_run=True)
        return result

    async def _kill(self, proc: asyncio.subprocess.Process) -> None:
        if proc.returncode is None:
            # os.kill, not proc.kill(): Popen.send_signal polls first, and that poll reaps a child that has just
            # exited before asyncio's child watcher does, which then reports status 255 instead of the real one.
            # Until the watcher reaps it, the pid is the child's (alive or a zombie), so the signal cannot stray.
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
        for task in (self._reader, self._stderr):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # ---- calls ------------------------------------------------------------------------------------

    async def call(
        self, tool: str, arguments: dict[str, Any], reporter: Reporter, *, idempotent: bool, key: str | None
    ) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.timeout
        attempts = 0
        while True:
            try:
                async with asyncio.timeout_at(deadline):
                    await self._ready.wait()
            except TimeoutError:
                raise UpstreamFailure(
                    "deadline",
                    f"upstream {self.name} was not back within the call's deadline",
                    may_have_run=attempts > 0,
                ) from None
            if self._given_up is not None:
                raise UpstreamFailure("unreachable", self._given_up, may_have_run=attempts > 0)
            call = _Call(next(self._ids), reporter)
            relay = Relay()
            self._progress[call.token] = functools.partial(_route_progress, relay, reporter)
            self._asking[call.token] = call.asks.put_nowait
            meta: dict[str, Any] = {"progressToken": call.token}
            tracing.inject(meta)  # the gateway call's trace goes on to the child (SEP-414)
            called: dict[str, Any] = {"name": tool, "arguments": arguments, "_meta": meta}
            if key is not None and self._keyed:
                called[idempotency.KEY_PARAM] = key
            params = self._speaking(called)
            try:
                async with relay:
                    try:
                        async with asyncio.timeout_at(deadline):
                            result = await self._exchange(call, params)
                            if self.era == "modern":
                                result = await self._rounds(tool, call, params, result)
                    except TimeoutError:
                        self._cancel(call.rid, "the gateway's deadline for this call passed")
                        raise UpstreamFailure(
                            "deadline",
                            f"upstream {self.name} did not answer within {self.config.timeout:g} s",
                            may_have_run=True,
                        ) from None
                    except BaseException:  # a cancel, input the client answers in a round of its own, a failure
                        self._cancel(call.rid, "the gateway's call ended before its answer")  # a done id is ignored
                        raise
            except _ChildExited as exc:
                attempts += 1
                if idempotent and loop.time() < deadline:
                    log.warning("upstream %s: %s during %s; re-issuing (idempotent)", self.name, exc, tool)
                    continue
                raise UpstreamFailure(
                    "execution_lost", f"{exc} while running {tool}; it may have run", may_have_run=True
                ) from None
            finally:
                self._progress.pop(call.token, None)
                self._asking.pop(call.token, None)
            self._failed_starts = 0
            return result

    async def _exchange(self, call: _Call, params: dict[str, Any]) -> dict[str, Any]:
        """One ``tools/call`` request (``call.rid``) to its answer, asking the call's client whatever the child
        asks for meanwhile (a legacy child's requests for input arrive on the pipe while the call runs)."""
        answer = asyncio.ensure_future(self._request("tools/call", params, call.rid))
        asked: asyncio.Future[dict[str, Any]] | None = None
        try:
            while True:
                asked = asyncio.ensure_future(call.asks.get())
                await asyncio.wait((answer, asked), return_when=asyncio.FIRST_COMPLETED)
                if not asked.done():
                    return answer.result()
                await self._forward(call.reporter, asked.result())
        finally:
            for pending in (answer, asked):
                if pending is not None and not pending.done():
                    pending.cancel()

    async def _forward(self, reporter: Reporter, message: dict[str, Any]) -> None:
        """A legacy child's request for input, asked of the call's client in its era; its answer goes back."""
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": message["id"]}
        try:
            reply["result"] = await ask_client(reporter, message["method"], message.get("params"))
        except InputRefused as refused:
            reply["error"] = {"code": refused.code, "message": refused.message}
        await self._write_quietly(reply)

    async def _rounds(self, tool: str, call: _Call, params: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
        """A modern child's ``input_required`` answers, each asked of the call's client and retried with its
        answers (a new request each round) until the child's answer is complete."""
        for rounds in itertools.count(1):
            if result.get("resultType") != "input_required":
                return complete(tool, result)
            if rounds > MAX_INPUT_ROUNDS:
                detail = f"{tool} asked for input past {MAX_INPUT_ROUNDS} rounds"
                raise UpstreamFailure("protocol", detail, may_have_run=True)
            answers = await call.reporter.ask(input_requests(tool, result))
            retry = {**params, "inputResponses": answers}
            state = result.get("requestState")
            if isinstance(state, str):
                retry["requestState"] = state
            call.rid = next(self._ids)
            result = await self._exchange(call, retry)
        raise AssertionError("unreachable: the loop returns or raises")

    async def listing(self, kind: ListKind) -> list[dict[str, Any]]:
        method, key = LIST_METHODS[kind]

        async def page(params: dict[str, Any]) -> dict[str, Any]:
            return await self._ask_now(method, params)

        try:
            return await collect_pages(page, key)
        except ProtocolViolation as exc:
            raise UpstreamFailure("protocol", str(exc), may_have_run=False) from exc

    async def read(self, method: CatalogRead, params: dict[str, Any]) -> dict[str, Any]:
        return await self._ask_now(method, params)

    async def _ask_now(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """One request that changes nothing, to the running child, within the upstream's ``timeout``: a child that
        is restarting or gone is ``unreachable`` (a read is not worth waiting for one)."""
        if not self._ready.is_set() or self._given_up is not None:
            raise UpstreamFailure("unreachable", f"upstream {self.name} is not running", may_have_run=False)
        try:
            async with asyncio.timeout(self.config.timeout):
                return await self._request(method, self._speaking(dict(params)))
        except TimeoutError:
            raise UpstreamFailure(
                "deadline",
                f"upstream {self.name} did not answer {method} within {self.config.timeout:g} s",
                may_have_run=False,
            ) from None
        except _ChildExited as exc:
            raise UpstreamFailure("unreachable", str(exc), may_have_run=False) from None

    def _cancel(self, rid: int, reason: str) -> None:
        message = {
            "jsonrpc": "2.0",
            "method": "notifications/cancelled",
            "params": {"requestId": rid, "reason": reason},
        }
        self._spawn_task(self._write_quietly(message))

    async def close(self) -> None:
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if proc.stdin is not None:
                proc.stdin.close()  # stdio servers exit when their input ends
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(2):
                    await proc.wait()
            await self._kill(proc)
        for task in list(self._background):
            task.cancel()
