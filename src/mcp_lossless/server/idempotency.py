"""Idempotency keys (SEP-3182, ADR 0029) in both eras: what a keyed ``tools/call`` gets, and which keys its stream
records (a legacy POST's stream, or the stream of its own that a 2026-07-28 keyed call records its answer on).

The decision is :func:`~mcp_lossless.core.idempotency.decide_duplicate`'s; this module finds its facts (the key's
record, the state of the stream it names) and carries out the verdict: a first use is recorded with the stream's
record, the rest are answered at once with the recorded outcome or the SEP's errors. A first use is *claimed* in
process from its decision until its record is recorded (queued durably: memory, SQLite's journal; else stored), so
that a duplicate arriving in that window is "in progress" rather than a second run (one process owns a SQLite file
or a memory store); from then on the store answers for it. On a shared store (Redis) the record's
write decides between processes: the store sets each key only if no one holds it, and the loser decides again, now
finding the winner's record. A lost key of a tool that passes it on to an upstream deduplicating it (a gateway's,
ADR 0033) is run again unrecorded: that upstream's record answers it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from ..core import frames
from ..core import limits as verdicts
from ..core.errors import INVALID_PARAMS
from ..core.events import Loss, PendingRequest, StreamRecord
from ..core.idempotency import (
    REPLAYED_META_KEY,
    Conflict,
    DuplicateFacts,
    InProgress,
    InvalidKey,
    KeyRecord,
    Lost,
    Refuse,
    Replay,
    Run,
    Settle,
    StreamTarget,
    TargetState,
    argument_hash,
    decide_duplicate,
    key_of,
)
from ..core.limits import LimitExceeded
from ..core.principal import Grant, Principal
from ..stores.base import EventsEvicted, KeyTaken, StoreUnavailable
from .errors import Refused
from .observability import now
from .sessions import ServerSession
from .state import ServerState

ClaimKey = tuple[Principal, str]
_Undecided = tuple[int, str, PendingRequest, str]
"""A keyed call the store must be asked about: its index in the POST, its key, its request, its argument hash."""


class _RunAgain:
    """The verdict "run it again, its key not recorded anew": a lost key of a tool that passes the key on to an
    upstream deduplicating it (:attr:`~.tools.RegisteredTool.dedups_keys`, ADR 0033), whose record answers it."""


RUN_AGAIN = _RunAgain()
_new = tuple.__new__
_OPEN_ATTEMPTS = 3
"""Decisions a keyed POST takes at most: a key lost to another replica is found held at the next one (a third only
if that holder's key expired meanwhile); beyond, the store is not answering consistently (503)."""


class Keys:
    """One process's keyed calls between decision and record, and the decision's adapter for the legacy leg."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._claims: dict[ClaimKey, KeyRecord] = {}
        self.running: set[str] = set()
        """Streams of the 2026-07-28 keyed calls running here (:class:`~.modern.keyed.KeyedCalls`), each added
        before its key is recorded: a stream this process owns is running only if held here (:meth:`_held`)."""

    async def open(
        self, session: ServerSession | None, grant: Grant, record: StreamRecord, requests: Sequence[dict[str, Any]],
        pending: Sequence[PendingRequest], refuse: Callable[[LimitExceeded], Exception] = Refused.over,
        alone: bool = False,
    ) -> tuple[dict[int, bytes], asyncio.Future[None] | None]:  # fmt: skip
        """Decide the keyed calls and enqueue ``record`` with the keys of their first uses: the answers of the
        others, by index, and the record's write. A key is recorded before this returns (before its tool starts):
        queued durably where the store can (:attr:`EventStore.keys_durable_when_queued`; the write then commits
        with the call's answer), else stored. :class:`StoreUnavailable` when it cannot be recorded; ``refuse``
        (the era's 429) when the first uses would take the principal past ``idempotency_keys_per_principal``,
        before anything is stored. Either way the caller releases what it counted (a legacy POST counts its calls
        only once dispatched; a 2026-07-28 call counts itself first). ``alone``: the stream holds the keyed call
        only (a 2026-07-28 call's): not opened, and no future, when no key goes with it."""
        state = self.state
        store = state.store
        for _ in range(_OPEN_ATTEMPTS):
            at = now()
            answers, keys, undecided = self._first_uses(grant, record.stream, requests, pending, at)
            if undecided:
                await self._decide_rest(session, grant, record.stream, undecided, answers, keys, at)
            if not keys:
                return answers, None if alone else store.enqueue_open(record)
            principal = grant.principal
            exceeded = verdicts.new_keys(state.config.limits, store.keys_held(principal, at), len(keys))
            if exceeded is not None:
                self.release(keys)
                state.metrics.limit_refusals.labels(exceeded.limit).inc()
                raise refuse(exceeded)
            try:
                opening = store.enqueue_open(record, keys)
            except StoreUnavailable:
                self.release(keys)
                raise
            if store.keys_durable_when_queued and not opening.done():
                # Recorded already (SQLite: its journal, the record committing with the call's answer, as an unkeyed
                # call's does): the store answers for the keys from here (a duplicate reads them once committed).
                self.release(keys)
                return answers, opening
            try:
                await opening
            except KeyTaken:
                continue  # another replica's first use won: decided again, a duplicate of it
            finally:
                self.release(keys)
            return answers, opening
        raise StoreUnavailable("idempotency keys changed hands during every decision")

    def _first_uses(
        self, grant: Grant, stream: str, requests: Sequence[dict[str, Any]], pending: Sequence[PendingRequest],
        now: float,
    ) -> tuple[dict[int, bytes], list[KeyRecord], list[_Undecided]]:  # fmt: skip
        """The first pass over a POST's keyed calls, without I/O: each key's canonical argument hash (computed
        once), the first uses the store knows in process to be first (:meth:`EventStore.lacks_key`: the common
        case, decided here, claimed, their records made), and the answers of invalid keys. The others (a claim or a
        record exists, or only the store can tell) are returned, in order, for
        :meth:`_decide_rest`. The fast path of :func:`~..core.idempotency.decide_duplicate`: with no record, its
        verdict is :class:`Run`."""
        answers: dict[int, bytes] = {}
        first: list[KeyRecord] = []
        undecided: list[_Undecided] = []
        principal = grant.principal
        claims, lacks_key = self._claims, self.state.store.lacks_key
        expires = now + self.state.config.idempotency_seconds
        for index, (message, request) in enumerate(zip(requests, pending, strict=True)):
            params = message.get("params")
            tool = request.tool
            if tool is None or not isinstance(params, dict):
                continue
            try:
                key = key_of(params)
            except InvalidKey as exc:
                answers[index] = frames.error(request.request_id, INVALID_PARAMS, str(exc))
                continue
            if key is None:
                continue
            hashed = argument_hash(params.get("arguments") or {})
            claim = (principal, key)
            if claim in claims or not lacks_key(principal, key, now):
                undecided.append((index, key, request, hashed))
                continue
            # tuple.__new__: the named tuples' own __new__ is a Python frame each (~3,000 instructions for the two)
            record = _new(KeyRecord, (principal, key, tool, hashed, _new(StreamTarget, (stream, request.request_id)),
                                      now, expires))  # fmt: skip
            claims[claim] = record
            first.append(record)
        return answers, first, undecided

    async def _decide_rest(
        self, session: ServerSession | None, grant: Grant, stream: str, undecided: list[_Undecided],
        answers: dict[int, bytes], first: list[KeyRecord], now: float,
    ) -> None:  # fmt: skip
        """Decide the keyed calls :meth:`_first_uses` left, in order, each against the store's record: the answers
        of duplicates into ``answers``, further first uses claimed into ``first``."""
        for index, key, request, hashed in undecided:
            answer = await self._decide(session, grant, key, request, hashed, now)
            if answer is RUN_AGAIN:
                continue  # runs as an unkeyed call does; its tool passes the key on (ADR 0033)
            if answer is None:
                assert request.tool is not None
                record = KeyRecord(
                    grant.principal, key, request.tool, hashed, StreamTarget(stream, request.request_id), now,
                    now + self.state.config.idempotency_seconds,
                )  # fmt: skip
                self._claims[grant.principal, key] = record
                first.append(record)
            else:
                assert isinstance(answer, bytes)
                answers[index] = answer

    def release(self, keys: Sequence[KeyRecord]) -> None:
        """The keys are recorded (or failed to be): the store answers for them from now on."""
        claims = self._claims
        for key in keys:
            claims.pop((key.principal, key.key), None)

    async def _decide(
        self, session: ServerSession | None, grant: Grant, key: str, request: PendingRequest, hashed: str, now: float
    ) -> bytes | _RunAgain | None:
        """``None`` to run it; :data:`RUN_AGAIN` to run it unrecorded; else its one answer."""
        state = self.state
        rid = request.request_id
        for _ in range(2):  # a settled dead owner's key is decided once more, as lost
            claimed = self._claims.get((grant.principal, key))
            record = claimed or await state.store.get_key(grant.principal, key, now)
            target_state, last_event_id = TargetState.RUNNING, None
            if record is not None and claimed is None:
                target_state, last_event_id = await self._target_state(session, record)
            facts = DuplicateFacts(
                record, target_state, request.tool or "", hashed, request.resources, now, last_event_id
            )
            verdict = decide_duplicate(facts, grant, state.policy)
            match verdict:
                case Run():
                    return None
                case Refuse():
                    raise AssertionError("the POST's admission refused every call its token does not cover")
                case Lost() if self._passed_on(request.tool):
                    return RUN_AGAIN
                case Conflict() | InProgress() | Lost():
                    error = verdict.error()
                    return frames.error(rid, error["code"], error["message"], error["data"])
                case Replay(target=target):
                    assert isinstance(target, StreamTarget)
                    return await self._replay(target, rid, key)
                case Settle(target=target):
                    stream = await state.store.get_stream(target.stream)
                    if stream is not None:
                        await state.store.mark_lost(target.stream, stream.owner, Loss.OWNER)
        raise AssertionError("a settled key is decided as lost")

    def _passed_on(self, tool: str | None) -> bool:
        """Whether ``tool`` passes its key on, now, to an upstream that dedups it (ADR 0033)."""
        registered = self.state.tools.get(tool or "")
        return registered is not None and registered.dedups_keys is not None and registered.dedups_keys()

    async def _target_state(self, session: ServerSession | None, record: KeyRecord) -> tuple[TargetState, str | None]:
        """``session``: the duplicate's legacy session, whose live stream a running first use is resumed from."""
        target = record.target
        assert isinstance(target, StreamTarget)
        store = self.state.store
        stream = await store.get_stream(target.stream)
        if stream is None:
            return TargetState.GONE, None
        if target.request_id in stream.answered:
            return TargetState.ANSWERED, None
        if stream.completed:
            return TargetState.LOST, None
        if stream.owner == self.state.instance:
            if not self._held(stream):  # its open failed after the key was stored (finding 8): it never runs
                return TargetState.OWNER_DEAD, None
        elif not await store.owner_alive(stream.owner):
            return TargetState.OWNER_DEAD, None
        live = None if session is None else session.live.get(target.stream)
        return TargetState.RUNNING, live.event_id(live.record.last_seq) if live is not None else None

    def _held(self, stream: StreamRecord) -> bool:
        """Whether this process runs ``stream``, which it owns. A first use is held from before its key is read as
        stored: a 2026-07-28 call joins :attr:`running` before its key is recorded; a legacy POST's live stream is
        registered in its session in the same loop turn as :meth:`open` returns, and until then its claim (or its
        record's pending commit) answers a duplicate. So an owned stream held nowhere is one whose open failed
        after its key was stored (a write that reached a primary that then died, its compare-and-delete too):
        settled as its dead owner's would be (execution lost naming the key), not "in progress" for the key's
        retention."""
        return stream.stream in self.running or self.state.sessions.live(stream.session_id, stream.stream) is not None

    async def _replay(self, target: StreamTarget, rid: Any, key: str) -> bytes:
        """The recorded answer under the duplicate's id, its result marked replayed; errors replayed as they were."""
        try:
            events = await self.state.store.read_after(target.stream, 0)
        except EventsEvicted:
            events = ()
        for event in events:
            if event.terminal and event.request_id == target.request_id:
                message = orjson.loads(event.data)
                message["id"] = rid
                result = message.get("result")
                if isinstance(result, dict):
                    meta = result.get("_meta")
                    result["_meta"] = {**(meta if isinstance(meta, dict) else {}), REPLAYED_META_KEY: True}
                return orjson.dumps(message)
        error = Lost(key, "outcome_gone").error()
        return frames.error(rid, error["code"], error["message"], error["data"])
