"""One check per finding. Each returns its verdict with the exchanges that support it.

A check raises :class:`NotRun` when it cannot reach a verdict (missing input, a call too short to drop
mid-stream, nothing to compare against): an audit never counts an inconclusive check as passed.
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio

from .context import BATCH_VERSION, CALL_FAILED, Audit, NotRun, Sent, failure_of
from .key_probes import (
    idempotency_concurrent_runs,
    idempotency_conflict_accepted,
    idempotency_duplicate_runs,
    idempotency_other_principal,
    idempotency_replay_narrowed,
)
from .redact import truncate
from .report import CheckResult
from .task_probes import task_denial_unknown_alike, task_leak_narrowed, task_other_principal, task_stream_narrowed
from .tokens import TokenUnavailable, audience, principal_of
from .wire import Credential, Exchange, HandshakeFailed, all_answered, progressed

STATUS_DETAIL_CHARS = 100


def _undroppable(exchange: Exchange, calls: list[Sent]) -> NotRun:
    """Why a stream could not be dropped after a progress event: a failed call, no resumption, a too short call."""
    for sent in calls:
        answer = exchange.terminal_for(sent.request_id)
        if answer is not None and (failure := failure_of(answer)) is not None:
            return NotRun(f"{CALL_FAILED}: {failure}", [exchange])
    if exchange.last_event_id is None:
        kind = "SSE" if exchange.is_sse else exchange.response_headers.get("content-type")
        return NotRun(
            f"the call's answer (HTTP {exchange.status}, {kind}) carried no SSE event ids: the server offers no "
            "resumption",
            [exchange],
        )
    return NotRun(
        "the call's stream ended before a progress event with an id: pick a call that sends several progress "
        "notifications over some time (e.g. steps=5 delay_ms=200)",
        [exchange],
    )


def _status(exchange: Exchange) -> str:
    """``HTTP 404 -32600 'Session not found'``: the status and the error the body names, in one short line."""
    if exchange.status is None:
        return f"no HTTP answer ({exchange.error})"
    detail = ""
    body = exchange.body_json()
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            detail = f"{error.get('code')} {error.get('message')!r}"
        elif isinstance(error, str):
            detail = repr(error)
    detail = truncate(" ".join(detail.split()), STATUS_DETAIL_CHARS)
    return f"HTTP {exchange.status} {detail}" if detail else f"HTTP {exchange.status}"


def _ending(exchange: Exchange) -> str:
    if exchange.end == "deadline":
        return f"was still open after {exchange.seconds:.1f} s"
    return {"closed": "ended cleanly", "dropped": "was read up to the answer", "error": "failed"}[exchange.end]


def _kinds(messages: list[dict[str, Any]]) -> str:
    progress = sum(1 for m in messages if m.get("method") == "notifications/progress")
    results = sum(1 for m in messages if "result" in m)
    return f"{progress} progress notification(s) and {results} result(s)"


@dataclass(slots=True)
class NarrowedResume:
    sent: Sent
    dropped: Exchange
    narrowed: Exchange
    control: Exchange

    @property
    def evidence(self) -> list[Exchange]:
        return [self.dropped, self.narrowed, self.control]


async def _narrowed_resume(audit: Audit) -> NarrowedResume:
    """Drop the call after its first progress event, resume with the narrowed token, then with the wide one.

    Shared by the leak and clean-end checks: run once, and a reason not to run it holds for both.
    """
    if "narrowed" not in audit.memo:
        try:
            audit.memo["narrowed"] = await _drop_and_resume_narrowed(audit)
        except NotRun as exc:
            audit.memo["narrowed"] = exc
    outcome: NarrowedResume | NotRun = audit.memo["narrowed"]
    if isinstance(outcome, NotRun):
        raise outcome
    return outcome


async def _drop_and_resume_narrowed(audit: Audit) -> NarrowedResume:
    narrowed = await audit.narrowed()
    session = await audit.session("initialize (wide token)")
    sent = audit.new_call()
    dropped = await audit.wire.post(
        session,
        sent.message,
        label="the call, dropped by the audit after its first progress event",
        stop=progressed([sent.progress_token]),
    )
    cursor = dropped.last_event_id
    if dropped.end != "dropped" or cursor is None:
        raise _undroppable(dropped, [sent])
    resumed = await audit.wire.resume(
        session,
        cursor,
        credential=narrowed,
        label="resume with the narrowed token (does not cover the call)",
        stop=all_answered(sent.request_id),
    )
    control = await audit.wire.resume(
        session, cursor, label="control: resume with the wide token", stop=all_answered(sent.request_id)
    )
    return NarrowedResume(sent, dropped, resumed, control)


async def replay_leak_narrowed(audit: Audit) -> CheckResult:
    run = await _narrowed_resume(audit)
    leaked = run.sent.leaked_in(run.narrowed)
    narrow = ", ".join(audit.settings.narrow_resources)
    if leaked:
        return CheckResult(
            "replay_leak_narrowed",
            "finding",
            f"after the drop, a token for [{narrow}] (not covering {audit.resource}) received "
            f"{_kinds(leaked)} of the call ({_status(run.narrowed)})",
            run.evidence,
        )
    later = run.sent.leaked_in(run.control)
    if not later:
        raise NotRun("neither token received anything of the call after the drop point: inconclusive", run.evidence)
    return CheckResult(
        "replay_leak_narrowed",
        "ok",
        f"the narrowed token got nothing of the call ({_status(run.narrowed)}); the wide token then received "
        f"the remaining {_kinds(later)}",
        run.evidence,
    )


async def refusal_clean_end(audit: Audit) -> CheckResult:
    run = await _narrowed_resume(audit)
    if run.sent.leaked_in(run.narrowed):
        raise NotRun("the server did not refuse the narrowed resume: it delivered the call (replay_leak_narrowed)")
    resumed = run.narrowed
    if resumed.end == "error":
        raise NotRun(f"the narrowed resume failed: {resumed.error}", run.evidence)
    if not resumed.ok:
        challenge = resumed.response_headers.get("www-authenticate")
        extra = f", WWW-Authenticate: {challenge}" if challenge else ""
        return CheckResult("refusal_clean_end", "ok", f"refused explicitly: {_status(resumed)}{extra}", run.evidence)
    answer = resumed.terminal_for(run.sent.request_id)
    if answer is not None:
        error = answer.get("error", {})
        message = truncate(str(error.get("message")), STATUS_DETAIL_CHARS)
        return CheckResult(
            "refusal_clean_end",
            "ok",
            f"refused in-band: JSON-RPC error {error.get('code')} {message!r} for the pending request",
            run.evidence,
        )
    return CheckResult(
        "refusal_clean_end",
        "finding",
        f"the narrowed resume answered HTTP {resumed.status} and {_ending(resumed)} with no response or error "
        f"for pending request {run.sent.request_id}: a client cannot tell the refusal from a lost result",
        run.evidence,
    )


async def unknown_event_id_empty_200(audit: Audit) -> CheckResult:
    session = await audit.session("initialize")
    reads = []
    for cursor in (f"mcp-lossless-audit-{secrets.token_hex(8)}", "987654321"):
        reads.append(
            await audit.wire.resume(
                session,
                cursor,
                label=f"resume from an unknown Last-Event-ID {cursor!r}",
                seconds=audit.settings.open_seconds,
            )
        )
    evidence = [session.initialize, *reads]
    if any(r.end == "error" for r in reads):
        raise NotRun("a resume request failed at the connection level", evidence)
    silent = [r for r in reads if r.ok and not any("error" in m for m in r.messages())]
    if silent:
        details = "; ".join(
            f"{r.request_headers['last-event-id']!r}: HTTP {r.status}, {len(r.messages())} messages, {_ending(r)}"
            for r in silent
        )
        return CheckResult(
            "unknown_event_id_empty_200",
            "finding",
            f"an unknown Last-Event-ID was answered as success without an error: {details}",
            evidence,
        )
    answers = "; ".join(_status(r) for r in reads)
    return CheckResult("unknown_event_id_empty_200", "ok", f"answered explicitly: {answers}", evidence)


def _first_event_id(exchange: Exchange) -> str:
    return next(e.id for e in exchange.events if e.id is not None)


def _after_first_id(sent: Sent, exchange: Exchange) -> list[dict[str, Any]]:
    first = next(i for i, e in enumerate(exchange.events) if e.id is not None)
    return [m for e in exchange.events[first + 1 :] for m in e.messages() if sent.owns(m)]


async def _other_session_credential(audit: Audit) -> tuple[Credential | None, str]:
    if audit.second is not None:
        try:
            return await audit.second.credential(audit.wide_resources, "wide"), "the second principal"
        except TokenUnavailable as exc:
            return await audit.wide(), f"the same principal (second principal unavailable: {exc})"
    return await audit.wide(), "the same principal"


async def cross_session_replay(audit: Audit) -> CheckResult:
    session_a = await audit.session("session A: initialize")
    sent, done = await audit.complete_call(session_a, "session A: the call, read to its answer")
    if not _after_first_id(sent, done):
        raise NotRun("session A's call produced nothing after its first event id", [done])
    credential, who = await _other_session_credential(audit)
    session_b = await audit.session("session B: initialize", credential)
    cursor = _first_event_id(done)
    replay = await audit.wire.resume(
        session_b,
        cursor,
        label="session B resumes from session A's first event id",
        stop=all_answered(sent.request_id),
    )
    evidence = [done, session_b.initialize, replay]
    stolen = [m for m in replay.messages() if sent.owns(m)]
    if stolen:
        return CheckResult(
            "cross_session_replay",
            "finding",
            f"session B (opened by {who}) received {_kinds(stolen)} of session A's call by presenting A's event id",
            evidence,
        )
    return CheckResult(
        "cross_session_replay",
        "ok",
        f"session B (opened by {who}) got nothing of session A: {_status(replay)}",
        evidence,
    )


async def cross_stream_replay(audit: Audit) -> CheckResult:
    session = await audit.session("initialize")
    first, second = audit.new_call(), audit.new_call()
    exchanges: dict[int, Exchange] = {}

    async def run(sent: Sent, label: str) -> None:
        exchanges[sent.request_id] = await audit.wire.post(
            session, sent.message, label=label, stop=all_answered(sent.request_id)
        )

    async with anyio.create_task_group() as group:
        group.start_soon(run, first, "stream X: the call")
        group.start_soon(run, second, "stream Y: the same call, concurrently")
    x, y = exchanges[first.request_id], exchanges[second.request_id]
    for sent, exchange in ((first, x), (second, y)):
        answer = exchange.terminal_for(sent.request_id)
        if answer is None or exchange.last_event_id is None:
            raise NotRun("the two concurrent calls did not both complete on resumable streams", [x, y])
        if (failure := failure_of(answer)) is not None:
            raise NotRun(f"{CALL_FAILED}: {failure}", [x, y])
    if not _after_first_id(first, x):
        raise NotRun("stream X produced nothing after its first event id", [x, y])
    replay = await audit.wire.resume(
        session,
        _first_event_id(x),
        label="resume stream X from its first event id",
        stop=all_answered(first.request_id),
    )
    evidence = [x, y, replay]
    foreign = [m for m in replay.messages() if second.owns(m)]
    if foreign:
        return CheckResult(
            "cross_stream_replay",
            "finding",
            f"resuming stream X delivered {_kinds(foreign)} of stream Y (a different request)",
            evidence,
        )
    return CheckResult(
        "cross_stream_replay",
        "ok",
        f"resuming stream X delivered {_kinds(replay.messages())}, none of stream Y ({_status(replay)})",
        evidence,
    )


async def session_other_principal(audit: Audit) -> CheckResult:
    if audit.second is None:
        raise NotRun("no second principal: pass --second-client or --second-token-command")
    first = await audit.wide()
    try:
        other = await audit.second.credential(audit.wide_resources, "wide")
    except TokenUnavailable as exc:
        raise NotRun(f"no token for the second principal: {exc}") from None
    if first is not None and (who := principal_of(first.token)) is not None and who == principal_of(other.token):
        raise NotRun("the second credentials speak for the same principal (same iss, sub and client_id)")
    session = await audit.session("initialize (first principal)")
    request_id = audit.wire.next_id()
    attempt = await audit.wire.post(
        session,
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/list"},
        credential=other,
        label="tools/list on the first principal's session with the second principal's token",
        stop=all_answered(request_id),
    )
    evidence = [session.initialize, attempt]
    answer = attempt.terminal_for(request_id)
    if attempt.ok and answer is not None and "result" in answer:
        return CheckResult(
            "session_other_principal",
            "finding",
            "the second principal's token was served on the first principal's session (tools/list answered)",
            evidence,
        )
    return CheckResult("session_other_principal", "ok", f"refused: {_status(attempt)}", evidence)


async def resumed_stream_never_ends(audit: Audit) -> CheckResult:
    session = await audit.session("initialize")
    sent, done = await audit.complete_call(session, "the call, read to its answer")
    cursor = done.last_event_id
    assert cursor is not None  # complete_call guarantees a resumable stream
    seconds = audit.settings.open_seconds
    tail = await audit.wire.resume(
        session, cursor, label=f"resume from the final event id, waiting up to {seconds:g} s", seconds=seconds
    )
    evidence = [done, tail]
    if tail.end == "error":
        raise NotRun(f"the resume failed: {tail.error}", evidence)
    if tail.end == "deadline":
        return CheckResult(
            "resumed_stream_never_ends",
            "finding",
            f"resuming request {sent.request_id}'s completed stream from its final event answered HTTP "
            f"{tail.status} and was still open after {seconds:g} s ({len(tail.messages())} messages)",
            evidence,
        )
    return CheckResult(
        "resumed_stream_never_ends",
        "ok",
        f"{_status(tail)}, {len(tail.messages())} messages, ended after {tail.seconds:.2f} s",
        evidence,
    )


async def wrong_audience_accepted(audit: Audit) -> CheckResult:
    foreign = audit.settings.foreign_resource
    if audit.principal is None:
        raise NotRun("no token source")
    try:
        credential = await audit.principal.credential([foreign], "foreign-audience")
    except TokenUnavailable as exc:
        raise NotRun(f"the token source could not mint a token for {foreign}: {exc}") from None
    minted = audience(credential.token)
    if minted is not None and minted != {foreign}:
        raise NotRun(f"the token source ignored the resource: the token's audience is {sorted(minted)}")
    try:
        session = await audit.wire.open_session(credential, audit.settings.version, "initialize with the token")
    except HandshakeFailed as exc:
        return CheckResult("wrong_audience_accepted", "ok", f"refused: {_status(exc.exchange)}", [exc.exchange])
    request_id = audit.wire.next_id()
    listing = await audit.wire.post(
        session,
        {"jsonrpc": "2.0", "id": request_id, "method": "tools/list"},
        label="tools/list with the token",
        stop=all_answered(request_id),
    )
    return CheckResult(
        "wrong_audience_accepted",
        "finding",
        f"a token whose only audience is {foreign} opened a session (initialize HTTP "
        f"{session.initialize.status}; tools/list {_status(listing)})",
        [session.initialize, listing],
    )


async def batch_multiplexing(audit: Audit) -> CheckResult:
    try:
        session = await audit.wire.open_session(await audit.wide(), BATCH_VERSION, "initialize at 2025-03-26")
    except HandshakeFailed as exc:
        raise NotRun(f"no 2025-03-26 session: {exc}", [exc.exchange]) from None
    if session.version != BATCH_VERSION:
        raise NotRun(f"the server negotiated {session.version}: batches exist only in 2025-03-26", [session.initialize])
    calls = [audit.new_call(), audit.new_call()]
    batch = await audit.wire.post(
        session,
        [c.message for c in calls],
        label="a JSON-RPC batch of two calls",
        stop=progressed([c.progress_token for c in calls]),
    )
    ids = [c.request_id for c in calls]
    if batch.status is None:
        raise NotRun(f"the batch request failed: {batch.error}", [batch])
    if batch.status >= 500:
        return CheckResult("batch_multiplexing", "finding", f"the batch was answered {_status(batch)}", [batch])
    if not batch.ok:
        return CheckResult("batch_multiplexing", "ok", f"rejected cleanly: {_status(batch)}", [batch])
    answers = [batch.terminal_for(i) for i in ids]
    if all(a is not None and "error" in a for a in answers):
        return CheckResult("batch_multiplexing", "ok", "rejected cleanly with a JSON-RPC error per call", [batch])
    if batch.end != "dropped" or batch.last_event_id is None:
        if not batch.is_sse:
            return CheckResult("batch_multiplexing", "ok", "answered as one JSON body: no stream to resume", [batch])
        raise _undroppable(batch, calls)
    cursor = batch.last_event_id
    try:
        narrowed = await audit.narrowed()
    except NotRun as exc:
        raise NotRun(f"the batch was accepted, but {exc.reason}", [batch]) from None
    resumed = await audit.wire.resume(
        session, cursor, credential=narrowed, label="resume the batch with the narrowed token", stop=all_answered(*ids)
    )
    control = await audit.wire.resume(
        session, cursor, label="control: resume the batch with the wide token", stop=all_answered(*ids)
    )
    evidence = [batch, resumed, control]
    leaked = [m for c in calls for m in c.leaked_in(resumed)]
    if leaked:
        return CheckResult(
            "batch_multiplexing",
            "finding",
            f"the batch was accepted and its narrowed resume leaked {_kinds(leaked)} ({_status(resumed)})",
            evidence,
        )
    later = [m for c in calls for m in c.leaked_in(control)]
    if not later:
        raise NotRun("neither token received anything of the batch after the drop point: inconclusive", evidence)
    return CheckResult(
        "batch_multiplexing",
        "ok",
        f"accepted; the narrowed resume got nothing of the calls ({_status(resumed)}), the wide token then "
        f"received the remaining {_kinds(later)}",
        evidence,
    )


Probe = Callable[[Audit], Awaitable[CheckResult]]

PROBES: dict[str, Probe] = {
    "replay_leak_narrowed": replay_leak_narrowed,
    "refusal_clean_end": refusal_clean_end,
    "unknown_event_id_empty_200": unknown_event_id_empty_200,
    "cross_session_replay": cross_session_replay,
    "cross_stream_replay": cross_stream_replay,
    "session_other_principal": session_other_principal,
    "resumed_stream_never_ends": resumed_stream_never_ends,
    "wrong_audience_accepted": wrong_audience_accepted,
    "batch_multiplexing": batch_multiplexing,
    "task_leak_narrowed": task_leak_narrowed,
    "task_denial_unknown_alike": task_denial_unknown_alike,
    "task_other_principal": task_other_principal,
    "task_stream_narrowed": task_stream_narrowed,
    "idempotency_duplicate_runs": idempotency_duplicate_runs,
    "idempotency_concurrent_runs": idempotency_concurrent_runs,
    "idempotency_conflict_accepted": idempotency_conflict_accepted,
    "idempotency_replay_narrowed": idempotency_replay_narrowed,
    "idempotency_other_principal": idempotency_other_principal,
}
