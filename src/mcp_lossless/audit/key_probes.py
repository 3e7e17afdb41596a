"""The idempotency checks (SEP-3182): ``params.idempotencyKey`` on ``tools/call``, capability ``tools.idempotency``.

A server that declares the capability MUST NOT run the tool again for a duplicate key (nor while its first call
still runs: it SHOULD answer ``idempotency_key_in_progress``), replays the recorded outcome, refuses the key reused
with other arguments (``error.data.type = "idempotency_key_conflict"``), keeps the replay behind the authorization
that governs the call (a narrowed token gets no outcome, and the refusal must not cost the covering retry its
replay) and scopes keys to the caller (another principal's same string is another key: it runs as new, never gets
the first's outcome, and is never told the key exists).

**How the audit tells a second run from a replay**, on any server: by the progress the duplicate's *own*
``progressToken`` receives. The operator's call already sends several progress notifications (the resumption checks
need them); each keyed request carries a fresh token, and the SEP replays only the final outcome, never progress.
So progress for the duplicate's token means the tool ran for it; none, with the first's outcome (``_meta`` aside),
means a replay. A tool whose result carries a run counter or nonce gives a second witness: a different outcome. A
first call that sends no progress leaves the checks not run: nothing would tell the two apart.

Keyed calls go over a session when the server initializes (the duplicate on the first's session: the SEP lets a
server scope keys to an authenticated session), else as 2026-07-28 requests without the tasks extension (so that
the call answers within its request). A server that declares no ``tools.idempotency`` (``initialize`` result or
``server/discover``) makes these checks *not applicable*; the duplicate check still runs its experiment there and
says in its summary whether the tool ran twice, so an operator learns that a client must not re-issue a
non-idempotent call to it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc
import orjson

from ..core.idempotency import CONFLICT, IN_PROGRESS, KEY_PARAM, declared
from .context import CALL_FAILED, Audit, NotRun
from .report import CheckResult
from .tokens import TokenUnavailable, principal_of
from .wire import Credential, Exchange, HandshakeFailed, WireSession, all_answered, call_message

IDEMPOTENCY_ERRORS = (CONFLICT, IN_PROGRESS)
"""The SEP's error types: either one, answered to another principal, tells it that the key string was used."""


def _progress_for(token: str, message: dict[str, Any]) -> bool:
    params = message.get("params")
    return (
        message.get("method") == "notifications/progress"
        and isinstance(params, dict)
        and params.get("progressToken") == token
    )


@dataclass(slots=True)
class KeyedCall:
    """One keyed ``tools/call`` the audit sent, and what came back."""

    request_id: int
    progress_token: str
    exchange: Exchange

    @property
    def answer(self) -> dict[str, Any] | None:
        return self.exchange.terminal_for(self.request_id)

    @property
    def progress(self) -> int:
        """How many progress notifications the request's own token received: each is the tool running for it."""
        return sum(1 for m in self.exchange.messages() if _progress_for(self.progress_token, m))

    @property
    def error_type(self) -> object:
        """``error.data.type`` of a JSON-RPC error answer (the SEP's way to name an idempotency failure)."""
        error = (self.answer or {}).get("error")
        data = error.get("data") if isinstance(error, dict) else None
        return data.get("type") if isinstance(data, dict) else None

    @property
    def delivers_result(self) -> bool:
        """A JSON-RPC result that is not a tool error: the tool's outcome (an ``isError`` result is a refusal)."""
        result = (self.answer or {}).get("result")
        return isinstance(result, dict) and not result.get("isError")

    def outcome(self) -> bytes | None:
        """The answer without its id and the result's ``_meta``, canonical: a replay equals its original."""
        answer = self.answer
        if answer is None:
            return None
        if "error" in answer:
            return orjson.dumps({"error": answer["error"]}, option=orjson.OPT_SORT_KEYS)
        result = answer.get("result")
        kept = {k: v for k, v in result.items() if k != "_meta"} if isinstance(result, dict) else result
        return orjson.dumps({"result": kept}, option=orjson.OPT_SORT_KEYS)

    def shape(self) -> str:
        """``HTTP 200 result, 3 progress`` / ``HTTP 200 -32602 idempotency_key_conflict`` / ``HTTP 403``."""
        exchange = self.exchange
        if exchange.status is None:
            return f"no HTTP answer ({exchange.error})"
        answer = self.answer
        if answer is None:
            return f"HTTP {exchange.status}, no answer"
        error = answer.get("error")
        if isinstance(error, dict):
            named = self.error_type
            return f"HTTP {exchange.status} {error.get('code')} {named or repr(str(error.get('message'))[:80])}"
        what = "tool error" if not self.delivers_result else "result"
        return f"HTTP {exchange.status} {what}, {self.progress} progress notification(s) for its token"


@dataclass(slots=True)
class KeyedSender:
    """How one principal sends keyed calls: on a session of its own, or as 2026-07-28 requests."""

    audit: Audit
    credential: Credential | None
    session: WireSession | None
    capabilities: dict[str, Any]
    handshake: Exchange
    """The ``initialize`` or ``server/discover`` exchange the capabilities came from."""

    @property
    def declared(self) -> bool:
        return declared(self.capabilities)

    async def call(
        self,
        key: str,
        arguments: dict[str, Any],
        label: str,
        credential: Credential | None = None,
        running: anyio.Event | None = None,
    ) -> KeyedCall:
        """``tools/call`` of the operator's tool with ``arguments`` under ``key``, read to its answer; a fresh
        request id and progress token, so that anything for them belongs to this request alone. ``running`` is set
        at the first progress for that token: the tool is running for this request."""
        wire, tool = self.audit.wire, self.audit.settings.call.tool
        request_id, token = wire.next_id(), wire.progress_token()
        used = credential if credential is not None else self.credential

        def watch(exchange: Exchange) -> bool:
            """Never stops the read; notes the first progress for this request's token (ids or not: a
            2026-07-28 stream has none)."""
            if running is not None and any(_progress_for(token, m) for m in exchange.events[-1].messages()):
                running.set()
            return False

        if self.session is not None:
            message = call_message(request_id, tool, arguments, token)
            message["params"][KEY_PARAM] = key
            answered = all_answered(request_id)
            exchange = await wire.post(
                self.session, message, credential=used, label=label, stop=lambda e: watch(e) or answered(e)
            )
        else:
            params = {"name": tool, "arguments": arguments, KEY_PARAM: key}
            exchange = await wire.modern(
                "tools/call",
                params,
                credential=used,
                label=label,
                request_id=request_id,
                until=watch,
                tasks=False,
                progress_token=token,
            )
        return KeyedCall(request_id, token, exchange)


async def _open(audit: Audit, credential: Credential | None, who: str) -> KeyedSender:
    """A channel for ``credential``: a session if the server initializes, else 2026-07-28 with ``server/discover``."""
    wire = audit.wire
    try:
        session = await wire.open_session(credential, audit.settings.version, f"initialize ({who})")
    except HandshakeFailed:
        request_id = wire.next_id()
        discover = await wire.modern(
            "server/discover",
            {},
            credential=credential,
            label=f"server/discover ({who})",
            request_id=request_id,
            tasks=False,
        )
        return KeyedSender(audit, credential, None, _capabilities(discover), discover)
    return KeyedSender(audit, credential, session, _capabilities(session.initialize), session.initialize)


def _capabilities(exchange: Exchange) -> dict[str, Any]:
    """The server's capabilities in an ``initialize`` or ``server/discover`` answer (``{}`` when it has none)."""
    result: dict[str, Any] = next((m["result"] for m in exchange.messages() if isinstance(m.get("result"), dict)), {})
    capabilities = result.get("capabilities")
    return capabilities if isinstance(capabilities, dict) else {}


async def _channel(audit: Audit) -> KeyedSender:
    async def run(audit: Audit) -> KeyedSender:
        return await _open(audit, await audit.wide(), "wide token")

    return await audit.once("keys_channel", run)  # type: ignore[no-any-return]


def _fresh_key() -> str:
    return str(uuid.uuid4())


def _not_declared(channel: KeyedSender) -> str:
    where = "initialize result" if channel.session is not None else "server/discover"
    return f"the server does not declare tools.idempotency (its {where}): keys are nothing a client may rely on"


def _undeclared(name: str, channel: KeyedSender) -> CheckResult:
    """The verdict of a check that needs ``tools.idempotency`` on a server that does not declare it: one wording,
    with the handshake that showed it as evidence."""
    return CheckResult(name, "not_applicable", _not_declared(channel), [channel.handshake])


async def _first(channel: KeyedSender, key: str, label: str) -> KeyedCall:
    """The operator's call under ``key`` with the wide token, completed, with progress for its own token."""
    call = await channel.call(key, channel.audit.settings.call.arguments, label)
    answer = call.answer
    if answer is None:
        raise NotRun(f"the keyed call got no answer ({call.shape()})", [call.exchange])
    if not call.delivers_result:
        raise NotRun(f"{CALL_FAILED}: {call.shape()} {orjson.dumps(answer).decode()[:200]}", [call.exchange])
    if call.progress == 0:
        raise NotRun(
            "the call sent no progress notifications: the audit tells a second run from a replay by the progress "
            "the duplicate's own token receives (pick a call with steps, e.g. steps:=3 delay_ms:=100)",
            [call.exchange],
        )
    return call


@dataclass(slots=True)
class Duplicate:
    key: str
    first: KeyedCall
    duplicate: KeyedCall


async def _duplicate(audit: Audit) -> Duplicate:
    """The call under a fresh key, then the same key and arguments again once it completed (shared: the conflict
    check reuses the completed key)."""

    async def run(audit: Audit) -> Duplicate:
        channel = await _channel(audit)
        key = _fresh_key()
        first = await _first(channel, key, "the call under a fresh idempotencyKey (wide token)")
        again = await channel.call(
            key, audit.settings.call.arguments, "duplicate: the same key and arguments, after the first completed"
        )
        return Duplicate(key, first, again)

    return await audit.once("keys_duplicate", run)  # type: ignore[no-any-return]


def _ran_or_replayed(original: KeyedCall, again: KeyedCall) -> str | None:
    """Why ``again`` is not a replay of ``original`` (it ran the tool, or answered otherwise); ``None`` if it is."""
    if again.answer is None:
        return f"no answer ({again.shape()})"
    if again.progress:
        return f"it ran the tool again: {again.progress} progress notification(s) for its own token ({again.shape()})"
    if again.outcome() != original.outcome():
        return f"it was not answered with the recorded outcome ({again.shape()})"
    return None


async def idempotency_duplicate_runs(audit: Audit) -> CheckResult:
    name = "idempotency_duplicate_runs"
    channel = await _channel(audit)
    if not channel.declared:
        try:
            run = await _duplicate(audit)
        except NotRun as exc:
            return CheckResult(name, "not_applicable", f"{_not_declared(channel)} ({exc.reason})", exc.evidence)
        why = _ran_or_replayed(run.first, run.duplicate)
        seen = f"observed: the duplicate {why.removeprefix('it ')}" if why else "observed: the duplicate was replayed"
        return CheckResult(
            name, "not_applicable", f"{_not_declared(channel)}; {seen}", [run.first.exchange, run.duplicate.exchange]
        )
    run = await _duplicate(audit)
    evidence = [channel.handshake, run.first.exchange, run.duplicate.exchange]
    if run.duplicate.exchange.status is None:
        raise NotRun(f"the duplicate failed at the connection level ({run.duplicate.shape()})", evidence)
    why = _ran_or_replayed(run.first, run.duplicate)
    if why is not None:
        found = f"the server declares tools.idempotency, yet for the duplicate {why}"
        return CheckResult(name, "finding", found, evidence)
    return CheckResult(
        name,
        "ok",
        f"replayed without running: no progress for the duplicate's token, the first's outcome "
        f"({run.duplicate.shape()}; the first had {run.first.progress})",
        evidence,
    )


async def idempotency_concurrent_runs(audit: Audit) -> CheckResult:
    name = "idempotency_concurrent_runs"
    sender = await _channel(audit)
    if not sender.declared:
        return _undeclared(name, sender)
    key, arguments = _fresh_key(), audit.settings.call.arguments
    running = anyio.Event()
    calls: dict[str, KeyedCall] = {}

    async def first(group: anyio.abc.TaskGroup) -> None:
        label = "the call under a fresh key, read to its answer"
        calls["first"] = await sender.call(key, arguments, label, running=running)
        if not running.is_set():  # answered without progress: nothing to send the duplicate during
            group.cancel_scope.cancel()

    async def duplicate() -> None:
        await running.wait()
        calls["duplicate"] = await sender.call(key, arguments, "duplicate: the same key while the first still runs")

    with anyio.move_on_after(audit.settings.read_seconds):
        async with anyio.create_task_group() as group:
            group.start_soon(first, group)
            group.start_soon(duplicate)
    original = calls.get("first")
    if original is None or "duplicate" not in calls:
        evidence = [c.exchange for c in calls.values()]
        raise NotRun(
            "the call sent no progress while running, or did not finish within --read-seconds: the duplicate could "
            "not be sent while it ran",
            evidence,
        )
    again = calls["duplicate"]
    evidence = [original.exchange, again.exchange]
    if again.progress:
        return CheckResult(
            name,
            "finding",
            f"the duplicate sent while the first still ran ran the tool a second time: {again.progress} progress "
            f"notification(s) for its own token ({again.shape()})",
            evidence,
        )
    if again.error_type == IN_PROGRESS:
        error = (again.answer or {}).get("error", {})
        data = error.get("data") if isinstance(error, dict) else None
        wait = data.get("retryAfter") if isinstance(data, dict) else None
        after = f", retryAfter {wait}" if wait is not None else ", without retryAfter"
        return CheckResult(name, "ok", f"refused as {IN_PROGRESS} ({again.shape()}{after})", evidence)
    if again.answer is not None and again.outcome() == original.outcome():
        return CheckResult(
            name,
            "ok",
            f"no second run: the duplicate waited for the first and got its outcome ({again.shape()}; the SEP asks "
            f"for an immediate {IN_PROGRESS} instead)",
            evidence,
        )
    raise NotRun(f"the duplicate was answered neither {IN_PROGRESS} nor with the outcome ({again.shape()})", evidence)


def _other_arguments(arguments: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """The same arguments with one value changed, and how: the first number + 1, else the first string with a
    suffix, else the first flag flipped, else one argument added. A call the tool plausibly accepts, so that a
    refusal is the key's doing, not the arguments'."""
    numbers = [(k, v) for k, v in arguments.items() if isinstance(v, int | float) and not isinstance(v, bool)]
    texts = [(k, v) for k, v in arguments.items() if isinstance(v, str)]
    flags = [(k, v) for k, v in arguments.items() if isinstance(v, bool)]
    name: str
    value: object
    changed: object
    if numbers:
        (name, value), changed = numbers[0], numbers[0][1] + 1
    elif texts:
        (name, value), changed = texts[0], f"{texts[0][1]}-2"
    elif flags:
        (name, value), changed = flags[0], not flags[0][1]
    else:
        return {**arguments, "mcp_lossless_audit": 1}, "an argument mcp_lossless_audit added"
    return {**arguments, name: changed}, f"{name}: {value!r} → {changed!r}"


async def idempotency_conflict_accepted(audit: Audit) -> CheckResult:
    name = "idempotency_conflict_accepted"
    channel = await _channel(audit)
    if not channel.declared:
        return _undeclared(name, channel)
    run = await _duplicate(audit)
    arguments, how = _other_arguments(audit.settings.call.arguments)
    other = await channel.call(run.key, arguments, f"the completed key with other arguments ({how})")
    evidence = [run.first.exchange, other.exchange]
    if other.answer is None:
        raise NotRun(f"the conflicting call got no answer ({other.shape()})", evidence)
    if other.error_type == CONFLICT:
        return CheckResult(name, "ok", f"refused as {CONFLICT} ({other.shape()}; {how})", evidence)
    if other.error_type == IN_PROGRESS:
        raise NotRun(f"answered {IN_PROGRESS} for a key whose call had completed ({other.shape()})", evidence)
    if other.progress:
        found = f"the tool ran with the other arguments under the used key ({other.shape()}; {how})"
    elif "result" in other.answer:
        found = f"a result for other arguments without a run: the first call's cached outcome? ({other.shape()}; {how})"
    else:
        found = (
            f"refused, but not as {CONFLICT} ({other.shape()}; {how}): a client cannot tell the conflict from any "
            "other failure"
        )
    return CheckResult(name, "finding", found, evidence)


async def idempotency_replay_narrowed(audit: Audit) -> CheckResult:
    name = "idempotency_replay_narrowed"
    channel = await _channel(audit)
    if not channel.declared:
        return _undeclared(name, channel)
    narrowed = await audit.narrowed()
    key, arguments = _fresh_key(), audit.settings.call.arguments
    first = await _first(channel, key, "the call under a fresh key (wide token)")
    label = "the same key with the narrowed token (not covering the call)"
    denied = await channel.call(key, arguments, label, narrowed)
    control = await channel.call(key, arguments, "control: the same key with the wide token again")
    evidence = [first.exchange, denied.exchange, control.exchange]
    narrow = ", ".join(audit.settings.narrow_resources)
    if denied.delivers_result or (denied.answer is not None and denied.outcome() == first.outcome()):
        how = "ran the tool for it" if denied.progress else "got the key's recorded outcome"
        return CheckResult(
            name,
            "finding",
            f"a token for [{narrow}] (not covering {audit.resource}) {how} under the completed key ({denied.shape()})",
            evidence,
        )
    why = _ran_or_replayed(first, control)
    if why is not None:
        return CheckResult(
            name,
            "finding",
            f"after the narrowed refusal ({denied.shape()}) the covering retry got no replay: {why}; the refusal cost "
            "the key",
            evidence,
        )
    challenge = denied.exchange.response_headers.get("www-authenticate")
    extra = ", with a challenge" if challenge else ""
    return CheckResult(
        name,
        "ok",
        f"the narrowed token got nothing ({denied.shape()}{extra}); the wide token then got the recorded outcome "
        f"without a second run ({control.shape()})",
        evidence,
    )


async def idempotency_other_principal(audit: Audit) -> CheckResult:
    name = "idempotency_other_principal"
    channel = await _channel(audit)
    if not channel.declared:
        return _undeclared(name, channel)
    if audit.second is None:
        raise NotRun("no second principal: pass --second-client or --second-token-command")
    try:
        credential = await audit.second.credential(audit.wide_resources, "wide")
    except TokenUnavailable as exc:
        raise NotRun(f"no token for the second principal: {exc}") from None
    mine = principal_of(channel.credential.token) if channel.credential is not None else None
    if mine is not None and mine == principal_of(credential.token):
        raise NotRun("the second credentials speak for the same principal (same iss, sub and client_id)")
    theirs = await _open(audit, credential, "second principal")
    arguments = audit.settings.call.arguments
    other_arguments, how = _other_arguments(arguments)
    same_key, other_key = _fresh_key(), _fresh_key()
    first = await _first(channel, same_key, "first principal: the call under key A")
    await _first(channel, other_key, "first principal: the call under key B")
    same = await theirs.call(same_key, arguments, "second principal: key A, the same arguments")
    other = await theirs.call(other_key, other_arguments, f"second principal: key B, other arguments ({how})")
    evidence = [first.exchange, same.exchange, other.exchange]
    for call, what in ((same, "key A with the same arguments"), (other, "key B with other arguments")):
        if call.error_type in IDEMPOTENCY_ERRORS:
            return CheckResult(
                name,
                "finding",
                f"the second principal's {what} was answered {call.error_type} ({call.shape()}): an oracle telling "
                "that another principal used the key",
                evidence,
            )
        if call.answer is not None and not call.progress and call.outcome() == first.outcome():
            return CheckResult(
                name,
                "finding",
                f"the second principal's {what} got the first principal's recorded outcome without a run "
                f"({call.shape()}): another principal's result",
                evidence,
            )
        if not call.delivers_result or not call.progress:
            raise NotRun(f"the second principal's {what} did not run as a new call ({call.shape()})", evidence)
    return CheckResult(
        name,
        "ok",
        f"the second principal's same key strings ran as new calls of its own: key A {same.shape()}; key B "
        f"{other.shape()}",
        evidence,
    )
