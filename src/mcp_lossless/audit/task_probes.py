"""The task checks (2026-07-28, ``io.modelcontextprotocol/tasks``): where a tool's result waits for its poll.

``tasks/get`` names only the task id, not the tool. So a server that binds a task to its user alone hands the
result to a token that no longer covers the tool (a leak), and one that re-checks but answers like "task not
found" makes the client drop the task while it could re-authorize (a silent loss). Another principal must get
nothing, and nothing it could tell from an unknown id.

The shared experiment: the operator's call, sent as a 2026-07-28 ``tools/call`` declaring the extension under
the wide token; if the server answers with a task, it is polled (wide token) until terminal, then polled with
the narrowed token, a random id is polled with that same token, and the wide token polls the task once more
(the control: a refusal must cost nothing). A server that runs the call without a task (or does not speak
2026-07-28) gets "not run": these checks apply to servers that create tasks.

The task-stream check (SEP-2694 ``tasks/stream``) runs its own task: its stream is read under the wide token and
cut after the first event, then resumed after that cursor with the narrowed token (the seed's scenario on a task
stream), a random id is streamed with that token, and the wide token resumes from the same cursor (the control).
Three outcomes: the narrowed resume gets events (a leak), ends without events and without a denial (a silent end:
a client takes the stream as complete, or waits on it), or is an explicit denial a client can tell from "gone".
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

import anyio
import orjson

from ..core.tasks import TERMINAL
from .context import Audit, NotRun
from .report import CheckResult
from .tokens import TokenUnavailable
from .wire import Credential, Exchange

PROBE_POLL_FLOOR_SECONDS = 0.05
PROBE_POLL_CEILING_SECONDS = 2.0


def _answer(exchange: Exchange, request_id: object = None) -> dict[str, Any]:
    """The JSON-RPC answer of a modern request (JSON, or the last answer on its SSE stream); ``{}`` if none."""
    answers = [m for m in exchange.messages() if "result" in m or "error" in m]
    if request_id is not None:
        answers = [m for m in answers if m.get("id") == request_id]
    return answers[-1] if answers else {}


def _result(exchange: Exchange) -> dict[str, Any] | None:
    result = _answer(exchange).get("result")
    return result if isinstance(result, dict) else None


def _delivers_outcome(exchange: Exchange) -> bool:
    """Whether a ``tasks/get`` answer carries the task's state with its outcome (result or error) inline."""
    result = _result(exchange)
    return result is not None and ("result" in result or "error" in result)


def _shape(exchange: Exchange) -> str:
    """``HTTP 403 -31041`` / ``HTTP 200 -32602 'Task not found'`` / ``HTTP 200 task completed``: one short line."""
    if exchange.status is None:
        return f"no HTTP answer ({exchange.error})"
    answer = _answer(exchange)
    error = answer.get("error")
    if isinstance(error, dict):
        return f"HTTP {exchange.status} {error.get('code')} {str(error.get('message'))[:80]!r}"
    result = answer.get("result")
    if isinstance(result, dict) and "status" in result:
        return f"HTTP {exchange.status} task {result['status']}"
    return f"HTTP {exchange.status}"


def _refusal(exchange: Exchange) -> tuple[int | None, object]:
    """What a client can tell a refusal by: the HTTP status and the JSON-RPC error code."""
    error = _answer(exchange).get("error")
    return exchange.status, error.get("code") if isinstance(error, dict) else None


def _unknown_alike(exchange: Exchange, unknown: Exchange) -> bool:
    """Answered exactly as a random id is: status, code and message (the task id each echoes aside)."""
    mine, theirs = _answer(exchange).get("error"), _answer(unknown).get("error")
    if not isinstance(mine, dict) or not isinstance(theirs, dict):
        return False
    return (exchange.status, mine.get("code"), _unechoed(exchange, mine.get("message"))) == (
        unknown.status,
        theirs.get("code"),
        _unechoed(unknown, theirs.get("message")),
    )


def _unechoed(exchange: Exchange, message: object) -> object:
    """An error message with the task id its request named replaced, so that echoing the id tells nothing."""
    try:
        task_id = orjson.loads(exchange.request_body or "{}")["params"]["taskId"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return message
    return message.replace(task_id, "{taskId}") if isinstance(message, str) and isinstance(task_id, str) else message


@dataclass(slots=True)
class SettledTask:
    task_id: str
    created: Exchange
    settled: Exchange
    """The wide token's last poll: the task terminal, its outcome inline."""


@dataclass(slots=True)
class NarrowedPolls:
    narrowed: Exchange
    unknown: Exchange
    control: Exchange


async def _settled_task(audit: Audit) -> SettledTask:
    return await audit.once("task", _create_and_settle)  # type: ignore[no-any-return]


async def _created_task(audit: Audit, label: str) -> tuple[Exchange, str, dict[str, Any]]:
    """The operator's call at 2026-07-28 under the wide token, answered with a task: the exchange, its id, the
    ``CreateTaskResult``; :class:`NotRun` when the server runs it without one."""
    call = audit.settings.call
    created = await audit.wire.modern(
        "tools/call", {"name": call.tool, "arguments": call.arguments}, credential=await audit.wide(), label=label
    )
    result = _result(created)
    if result is None or result.get("resultType") != "task" or not isinstance(result.get("taskId"), str):
        raise NotRun(
            f"the server did not run the call as a task ({_shape(created)}): the task checks apply to servers "
            "that answer 2026-07-28 calls with CreateTaskResult",
            [created],
        )
    return created, result["taskId"], result


async def _create_and_settle(audit: Audit) -> SettledTask:
    wide = await audit.wide()
    label = "the call at 2026-07-28, declaring the tasks extension (wide token)"
    created, task_id, result = await _created_task(audit, label)
    interval = _interval(result)
    with anyio.move_on_after(audit.settings.read_seconds):
        while True:
            await anyio.sleep(interval)
            polled = await audit.wire.modern(
                "tasks/get", {"taskId": task_id}, credential=wide, label="poll with the wide token until terminal"
            )
            state = _result(polled)
            if state is None:
                raise NotRun(f"the wide token's poll of its own task was refused ({_shape(polled)})", [created, polled])
            if any(state.get("status") == status.value for status in TERMINAL):
                return SettledTask(task_id, created, polled)
            interval = min(PROBE_POLL_CEILING_SECONDS, max(interval, _interval(state)))
    raise NotRun(f"the task did not finish within --read-seconds {audit.settings.read_seconds:g}", [created])


def _interval(state: dict[str, Any]) -> float:
    served = state.get("pollIntervalMs")
    seconds = served / 1000 if isinstance(served, int) and served > 0 else 0.5
    return min(PROBE_POLL_CEILING_SECONDS, max(PROBE_POLL_FLOOR_SECONDS, seconds))


async def _poll(audit: Audit, task_id: str, credential: Credential | None, label: str) -> Exchange:
    return await audit.wire.modern("tasks/get", {"taskId": task_id}, credential=credential, label=label)


def _random_task_id() -> str:
    return f"mcp-lossless-audit-{secrets.token_urlsafe(18)}"


async def _narrowed_polls(audit: Audit) -> NarrowedPolls:
    async def run(audit: Audit) -> NarrowedPolls:
        task = await _settled_task(audit)
        narrowed = await audit.narrowed()
        polled = await _poll(audit, task.task_id, narrowed, "poll the task with the narrowed token")
        unknown = await _poll(audit, _random_task_id(), narrowed, "poll a random task id with the narrowed token")
        control = await _poll(audit, task.task_id, await audit.wide(), "control: poll the task with the wide token")
        return NarrowedPolls(polled, unknown, control)

    return await audit.once("task_narrowed", run)  # type: ignore[no-any-return]


async def task_leak_narrowed(audit: Audit) -> CheckResult:
    task = await _settled_task(audit)
    polls = await _narrowed_polls(audit)
    evidence = [task.created, task.settled, polls.narrowed, polls.control]
    narrow = ", ".join(audit.settings.narrow_resources)
    if _delivers_outcome(polls.narrowed):
        return CheckResult(
            "task_leak_narrowed",
            "finding",
            f"a token for [{narrow}] (not covering {audit.resource}) received the task's outcome by its id "
            f"({_shape(polls.narrowed)})",
            evidence,
        )
    if not _delivers_outcome(polls.control):
        raise NotRun(f"the wide token no longer gets the task's outcome ({_shape(polls.control)})", evidence)
    return CheckResult(
        "task_leak_narrowed",
        "ok",
        f"the narrowed token got nothing of the task ({_shape(polls.narrowed)}); the wide token then got its "
        f"outcome ({_shape(polls.control)})",
        evidence,
    )


async def task_denial_unknown_alike(audit: Audit) -> CheckResult:
    task = await _settled_task(audit)
    polls = await _narrowed_polls(audit)
    evidence = [task.created, polls.narrowed, polls.unknown, polls.control]
    if _delivers_outcome(polls.narrowed):
        raise NotRun("the server did not refuse the narrowed poll: it delivered the task (task_leak_narrowed)")
    if polls.narrowed.status is None or polls.unknown.status is None:
        raise NotRun("a poll failed at the connection level", evidence)
    if not _delivers_outcome(polls.control):
        return CheckResult(
            "task_denial_unknown_alike",
            "finding",
            f"after the narrowed poll ({_shape(polls.narrowed)}) the wide token no longer gets the task "
            f"({_shape(polls.control)}): the refusal cost the result",
            evidence,
        )
    if _refusal(polls.narrowed) == _refusal(polls.unknown):
        return CheckResult(
            "task_denial_unknown_alike",
            "finding",
            f"the owner's narrowed poll of a live task was answered like a random id ({_shape(polls.narrowed)} vs "
            f"{_shape(polls.unknown)}): a client cannot tell 're-authorize and poll again' from 'gone', and drops it",
            evidence,
        )
    challenge = polls.narrowed.response_headers.get("www-authenticate")
    extra = f", WWW-Authenticate: {challenge}" if challenge else " (no challenge names what to re-authorize for)"
    return CheckResult(
        "task_denial_unknown_alike",
        "ok",
        f"denied distinguishably: {_shape(polls.narrowed)}{extra}; a random id: {_shape(polls.unknown)}; the wide "
        "token then got the outcome",
        evidence,
    )


async def task_other_principal(audit: Audit) -> CheckResult:
    if audit.second is None:
        raise NotRun("no second principal: pass --second-client or --second-token-command")
    task = await _settled_task(audit)
    try:
        other = await audit.second.credential(audit.wide_resources, "wide")
    except TokenUnavailable as exc:
        raise NotRun(f"no token for the second principal: {exc}") from None
    theirs = await _poll(audit, task.task_id, other, "the second principal polls the first principal's task")
    unknown = await _poll(audit, _random_task_id(), other, "the second principal polls a random task id")
    evidence = [task.created, theirs, unknown]
    if _result(theirs) is not None:
        return CheckResult(
            "task_other_principal",
            "finding",
            f"the second principal read the first principal's task by its id ({_shape(theirs)})",
            evidence,
        )
    if not _unknown_alike(theirs, unknown):
        return CheckResult(
            "task_other_principal",
            "finding",
            f"the second principal was refused, but not as for a random id ({_shape(theirs)} vs {_shape(unknown)}): "
            "the answer tells that the task exists",
            evidence,
        )
    return CheckResult(
        "task_other_principal",
        "ok",
        f"answered exactly as a random id is ({_shape(theirs)})",
        evidence,
    )


@dataclass(slots=True)
class CutStream:
    created: Exchange
    first: Exchange
    """The wide token's stream of the task, dropped after its first event (the cut)."""
    cursor: int
    narrowed: Exchange
    unknown: Exchange
    control: Exchange


def _task_events(exchange: Exchange) -> list[dict[str, Any]]:
    """The ``notifications/tasks/event`` params an exchange carried, in order."""
    return [
        m["params"]
        for m in exchange.messages()
        if m.get("method") == "notifications/tasks/event" and isinstance(m.get("params"), dict)
    ]


def _seqs(exchange: Exchange) -> list[object]:
    return [event.get("seq") for event in _task_events(exchange)]


async def _cut_stream(audit: Audit) -> CutStream:
    async def run(audit: Audit) -> CutStream:
        label = "the call at 2026-07-28 for the task-stream check (wide token)"
        created, task_id, _ = await _created_task(audit, label)
        wide = await audit.wide()

        async def stream(credential: Credential | None, label: str, **params: Any) -> Exchange:
            return await audit.wire.modern(
                "tasks/stream", {"taskId": task_id, **params}, credential=credential, label=label
            )

        first = await audit.wire.modern(
            "tasks/stream",
            {"taskId": task_id},
            credential=wide,
            label="stream the task with the wide token, cut after its first event",
            until=lambda exchange: bool(_task_events(exchange)),
        )
        seqs = _seqs(first)
        if not seqs or not isinstance(seqs[-1], int):
            raise NotRun(f"the server does not stream the task's events ({_shape(first)})", [created, first])
        cursor = seqs[-1]
        narrowed = await audit.narrowed()
        resumed = await stream(narrowed, "resume the task's stream after the cut with the narrowed token", after=cursor)
        random_id = _random_task_id()
        unknown = await audit.wire.modern(
            "tasks/stream",
            {"taskId": random_id},
            credential=narrowed,
            label="stream a random task id with the narrowed token",
        )
        control = await stream(
            wide, "control: resume the task's stream after the cut with the wide token", after=cursor
        )
        return CutStream(created, first, cursor, resumed, unknown, control)

    return await audit.once("task_stream", run)  # type: ignore[no-any-return]


async def task_stream_narrowed(audit: Audit) -> CheckResult:
    cut = await _cut_stream(audit)
    evidence = [cut.created, cut.first, cut.narrowed, cut.unknown, cut.control]
    narrow = ", ".join(audit.settings.narrow_resources)
    leaked = _seqs(cut.narrowed)
    if leaked:
        return CheckResult(
            "task_stream_narrowed",
            "finding",
            f"a token for [{narrow}] (not covering {audit.resource}) received {len(leaked)} of the task's events "
            f"after the cut (seq {leaked[0]}…{leaked[-1]}): a leak",
            evidence,
        )
    answer = _answer(cut.narrowed)
    error = answer.get("error")
    if not isinstance(error, dict) and cut.narrowed.status not in (401, 403):
        how = "with an empty result, as a finished stream ends" if "result" in answer else "without any answer"
        return CheckResult(
            "task_stream_narrowed",
            "finding",
            f"the narrowed token's resume after seq {cut.cursor} ended {how} ({_shape(cut.narrowed)}): a silent end, "
            "no denial a client could re-authorize on",
            evidence,
        )
    if _unknown_alike(cut.narrowed, cut.unknown):
        return CheckResult(
            "task_stream_narrowed",
            "finding",
            f"the narrowed resume was answered like a random task id ({_shape(cut.narrowed)}): a client cannot tell "
            "'re-authorize and resume' from 'gone', and drops the task",
            evidence,
        )
    rest = _seqs(cut.control)
    if rest[:1] != [cut.cursor + 1] or rest != list(range(cut.cursor + 1, cut.cursor + 1 + len(rest))):
        return CheckResult(
            "task_stream_narrowed",
            "finding",
            f"after the denial the wide token's resume after seq {cut.cursor} did not get the rest once, in order "
            f"(seqs {rest[:8]}…, {_shape(cut.control)}): the refusal cost events",
            evidence,
        )
    data = error.get("data") if isinstance(error, dict) else None
    named = data.get("lastSeq") if isinstance(data, dict) else None
    resume = f", naming the cursor to resume after (lastSeq {named})" if named == cut.cursor else ""
    return CheckResult(
        "task_stream_narrowed",
        "ok",
        f"an explicit denial: {_shape(cut.narrowed)}{resume}; a random id: {_shape(cut.unknown)}; the wide token then "
        f"got seq {rest[0]}…{rest[-1]} once ({_shape(cut.control)})",
        evidence,
    )
