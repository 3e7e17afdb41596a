"""The Streamable HTTP endpoint: POST opens a stream per request batch, GET resumes or listens, DELETE ends.

Everything a client can get wrong is refused with a status and a JSON body saying what (:class:`.errors.Refused`,
raised where it is found and rendered here, once); nothing else reaches the ASGI server. Replays are decided by
:func:`~..core.resume.decide_resume` against the resuming token before any byte is committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Sequence
from time import perf_counter
from typing import Any, Protocol

from .. import __version__, tracing
from ..asgi import BodyTooLarge, ClientGone, Receive, Scope, Send, read_body, respond
from ..asgi import HeaderIndex as Index
from ..core import errors, frames, protocol
from ..core import limits as verdicts
from ..core.eventids import Cursor, CursorProblem, EventIdCodec
from ..core.events import PendingRequest, StoredEvent, StreamKind, StreamRecord
from ..core.idempotency import KEY_PARAM
from ..core.limits import LimitExceeded
from ..core.principal import Grant
from ..core.replay import DeliveryGate, Refusal
from ..core.resume import (
    CursorRejected,
    Lookup,
    NeedEvents,
    NeedOwner,
    NeedSessionPrincipal,
    NeedStream,
    ReplayPlan,
    ResumeFacts,
    SettleOrphan,
    Tail,
    decide_resume,
    stream_tags,
)
from ..stores.base import EventsEvicted, StoreUnavailable
from . import checks, metadata
from .auth import CALLER, InvalidToken, VerifierUnavailable
from .dispatch import Dispatcher
from .errors import Refused, rpc_error
from .keys import stream_key
from .modern import ModernLeg
from .observability import fingerprint, log_decision, now
from .requests import STATELESS_LEG, era, uncovered
from .sessions import ServerSession
from .state import ServerState
from .streams import LiveStream, Producers
from .writer import LiveSource, RemoteTail, SseWriter, StoredSource, StreamLost

__all__ = ["Transport", "rpc_error"]

log = logging.getLogger("mcp_lossless.transport")


def _text(index: Index, name: bytes) -> str | None:
    """Header ``name`` of the request's ``index`` as text (latin-1): read here rather than through
    :func:`.asgi.header`, which would take the request back to the ASGI layer its entry has left."""
    value = index.get(name)
    return None if value is None else value.decode("latin-1")


ANSWER_GRACE_SECONDS = 0.05
"""How long a call's response waits for its answer to be stored before its head and priming event go out alone."""
GRACE_SLACK_SECONDS = 0.0125
"""How much later than its end a grace may be found over: one timer firing ends every grace that ended within this
of the first (at thousands of calls a second, one firing per call otherwise)."""


_new_request = tuple.__new__
"""Builds a :class:`PendingRequest` from all four fields without the named tuple's Python ``__new__`` (a frame
per request, two thirds of its cost)."""
_UNTAGGED: frozenset[str] = frozenset()
"""The resources of a request that is no tool call (``PendingRequest``'s default)."""

STANDALONE = PendingRequest("", "standalone")
"""The request a standalone GET stream's messages are stored under: that stream carries no request, so the id
is nobody's, and no resource tags them."""


class Transport:
    """The MCP endpoint: the protocol's checks in the protocol's order, then a stream per POST or GET.

    It looks things up (token, session, stream, store) and renders; what a request gets is decided by the checks
    (:mod:`.checks`, and its own methods that need the server's state) and, for a resume, by the core. Requests
    are run by the :class:`.dispatch.Dispatcher` and written by an :class:`.writer.SseWriter`.
    """

    def __init__(self, state: ServerState, modern: ModernLeg) -> None:
        self.state = state
        self.dispatcher = Dispatcher(state)
        self.keys = modern.keys
        """Idempotency keys between their decision and their record (ADR 0029): one claim set for both eras."""
        self.producers = Producers(state.store, state.instance, state.metrics.lost.inc)
        self.modern = modern
        """The 2026-07-28 leg: a POST that opens the modern way goes there (docs/decisions/0012)."""
        self._graces: _AnswerGraces | None = None

    def _answer_graces(self) -> _AnswerGraces:
        """The graces of this server's inline runs, on the loop it runs on (made on the first call)."""
        graces = self._graces
        loop = self.state.loop
        if graces is None or graces.loop is not loop:
            graces = self._graces = _AnswerGraces(loop)
        return graces

    async def announce(self, method: str) -> None:
        """A notification that belongs to no request (``notifications/tools/list_changed``) on the standalone
        GET stream of every session of this process that opened one: stored, so a client that resumes that
        stream gets it. Untagged: every token of the session may receive it. Each session's append on its own:
        one whose client does not read (a full backlog waits for a reader) holds up no other."""
        data = frames.notification(method, {})

        async def tell(session: ServerSession, live: LiveStream) -> None:
            try:
                await live.append(data, STANDALONE)
            except Exception as exc:  # a store that is down, a stream that ended: the others go on
                log.warning("cannot announce %s to session %s: %r", method, session.id, exc)

        streams = [(s, s.live.get(s.get_stream)) for s in self.state.sessions.all() if s.get_stream and not s.closing]
        await asyncio.gather(*(tell(session, live) for session, live in streams if live is not None))

    async def __call__(self, scope: Scope, index: Index, receive: Receive, send: Send) -> None:
        """Route by method; render whatever refusal the checks raise, before any byte of a response.

        ``index`` is the request's headers as the app's entry indexed them (:func:`.asgi.headers`): read from
        it here and passed down, so no step below goes back to the ASGI layer for a header."""
        method = scope["method"]
        try:
            if method == "POST":
                await self.post(scope, index, receive, send)
            elif method == "GET":
                await self.get(scope, index, receive, send)
            elif method == "DELETE":
                await self.delete(scope, index, send)
            else:
                raise Refused.rpc(
                    405, errors.INVALID_REQUEST, "use POST, GET or DELETE", headers=[(b"allow", b"GET, POST, DELETE")]
                )
        except Refused as refusal:
            await refusal.render(send)
        except StoreUnavailable:
            await Refused.rpc(
                503, errors.INTERNAL_ERROR, "event store unavailable; retry later", headers=[(b"retry-after", b"1")]
            ).render(send)
        except ClientGone:
            return  # the client left before its request was read: nobody to answer

    # -- POST ----------------------------------------------------------------------------------------

    async def post(self, scope: Scope, index: Index, receive: Receive, send: Send) -> None:
        """The protocol's order: token, Accept, Content-Type, body, JSON-RPC shape; then ``initialize`` (which
        makes the session) or the revision, the session and its batch rule; then each tool call's audience."""
        state = self.state
        config = state.config
        # Without a verifier every request is anonymous: no coroutine of _authenticate's to get that answer
        grant = state.anonymous if state.verifier is None else await self._authenticate(scope, index)
        checks.require_post_media(index)
        try:
            body = await read_body(receive, config.max_body_bytes)
        except BodyTooLarge:
            raise self._over(verdicts.body_too_large(config.max_body_bytes)) from None
        values, batch = checks.parse_body(body)
        too_long = verdicts.batch(config.max_batch, len(values)) if batch else None  # one message: no batch
        if too_long is not None:  # before any of its messages is looked at
            raise self._over(too_long)
        messages = checks.check_messages(values)
        first = messages[0]
        requested = era(index, first, not batch)
        if requested is STATELESS_LEG:
            await self.modern.serve(receive, send, grant, index, first, scope.get("client"))
            return
        if first.get("method") == "initialize" and "id" in first:
            checks.require_alone(messages)
            await self._initialize(send, grant, first)
            return
        version = checks.served_revision(requested, messages)
        session = self._recent_session(index, grant)
        if session is None:
            session = await self._session(index, grant)
        if batch:
            checks.require_batches_allowed(session.version)
        requests, pending, calls, keyed = self._admit(session, messages, grant)
        if not requests:
            await respond(send, 202)
            return
        self.state.sessions.admit(session, calls)
        await self._open_post_stream(
            receive, send, session, grant, version or session.version, requests, pending, batch, keyed
        )

    async def _initialize(self, send: Send, grant: Grant, message: dict[str, Any]) -> None:
        params = message.get("params")
        version = protocol.negotiate(params.get("protocolVersion") if isinstance(params, dict) else None)
        session = await self.state.sessions.create(grant.principal, version, now())
        self.state.metrics.sessions.set(len(self.state.sessions))
        result = {
            "protocolVersion": version,
            "capabilities": self.state.initialize_capabilities,
            "serverInfo": {"name": "mcp-lossless", "version": __version__},
            "instructions": "Tool results are never lost or leaked: resume with GET + Last-Event-ID.",
        }
        log_decision("session_created", session=fingerprint(session.id), version=version)
        await respond(
            send,
            200,
            frames.result(message["id"], result),
            b"application/json",
            [(b"mcp-session-id", session.id.encode())],
        )

    def _admit(
        self, session: ServerSession, messages: list[dict[str, Any]], grant: Grant
    ) -> tuple[list[dict[str, Any]], list[PendingRequest], int, bool]:
        """The requests among ``messages``, each with the resources its events need, how many are tool calls, and
        whether any call carries an idempotency key (one dictionary lookup a call: an unkeyed POST, nearly every one,
        skips the idempotency machinery, which would find no key); 403 naming every resource the token lacks for a
        call (or for an extra method's request, by its tags). Responses and cancellations are handed over as they
        come."""
        state = self.state
        requests = []
        pending = []
        calls = 0
        keyed = False
        refused: set[str] = set()
        for message in messages:
            if "method" not in message:
                self.dispatcher.deliver(session, message)
                continue
            if "id" not in message:
                if message["method"] == "notifications/cancelled":
                    self.dispatcher.cancel(session, message.get("params"))
                continue
            requests.append(message)
            method = message["method"]
            tool = None
            params = message.get("params")
            if method == "tools/call":
                name = params.get("name") if isinstance(params, dict) else None
                tool = state.tools.get(name) if isinstance(name, str) else None
            if tool is not None:
                resources = state.tool_tags[tool.name]
                calls += 1
                if KEY_PARAM in params:  # type: ignore[operator]  # a dict: a tool was found by its name there
                    keyed = True
            elif method in state.method_tags:
                resources = state.method_tags[method](params if isinstance(params, dict) else {})
            else:
                pending.append(_new_request(PendingRequest, (message["id"], method, None, _UNTAGGED)))
                continue
            gap = state.policy.missing(grant.audience, resources, grant.scopes)
            if gap:
                refused |= gap
            pending.append(
                _new_request(PendingRequest, (message["id"], method, None if tool is None else tool.name, resources))
            )
        if refused:
            raise self._forbidden(sorted(refused), requests, pending)
        return requests, pending, calls, keyed

    def _forbidden(self, missing: list[str], requests: list[dict[str, Any]], pending: list[PendingRequest]) -> Refused:
        needed = frozenset[str]().union(*(p.resources for p in pending))
        refusal = uncovered(missing, needed, self.state.prm_url, self.state.metrics)
        body = [rpc_error(errors.FORBIDDEN, refusal.description, m["id"], refusal.data) for m in requests]
        return Refused(403, body if len(body) > 1 else body[0], refusal.challenge)

    async def _open_post_stream(
        self,
        receive: Receive,
        send: Send,
        session: ServerSession,
        grant: Grant,
        version: str,
        requests: list[dict[str, Any]],
        pending: list[PendingRequest],
        batch: bool,
        keyed: bool,
    ) -> None:
        state = self.state
        # Position 0 is the stream's start: the priming event's id names it, and it is never stored.
        record = StreamRecord(session.id, stream_key(), StreamKind.POST, state.instance, tuple(pending), 0)
        json_response = state.config.json_response
        decided: dict[int, bytes] = {}
        if keyed and state.store.idempotency_keys:
            try:  # a key is recorded before its tool starts: a keyed call waits for the record's commit
                decided, opening = await self.keys.open(session, grant, record, requests, pending)
            except StoreUnavailable:
                raise Refused.rpc(503, errors.INTERNAL_ERROR, "the event store is unavailable") from None
        else:
            # Queued, not awaited: the record goes into the store's next write with the call's first events (its
            # answer, if it answers at once), one transaction. No id of the stream goes out before it is stored.
            opening = state.store.enqueue_open(record)
        live = state.live_stream(record, answers_only=json_response, opening=opening)
        session.live[record.stream] = live
        state.metrics.post_streams.inc()
        head = b"" if json_response else self._priming(live, version)  # names position 0
        run = None
        if len(requests) == 1:
            run = await self.dispatcher.prepare_inline(session, live, grant, requests[0], pending[0], decided.get(0))
        else:
            counts = Counter(request.request_id for request in pending)
            for index, (message, request) in enumerate(zip(requests, pending, strict=True)):
                repeated = counts[request.request_id] > 1
                answer = decided.get(index)
                await self.dispatcher.start(session, live, grant, message, request, repeated=repeated, decided=answer)
        if json_response:
            if run is not None:
                await run
            await self._write_json(live, send, batch)
            return
        # Every call the token does not cover was refused above, so it covers every event this stream can carry.
        # Positional arguments: keyword arguments to a class cost a dict per call (about 1,200 instructions).
        gate = DeliveryGate(grant, state.policy, None, state.leeway, True)  # covers_stream
        writer = SseWriter(state.config.retry_ms, state.metrics, session.id, record.stream, gate, record.requests)
        source = LiveSource(live, 0, bool(head))  # has_cursor: the priming id
        if live.recording is None:  # an attribute: no call for a store that opens at once
            writing = writer.run(receive, send, source, head)
        else:
            writing = self._write_recorded(live, writer, receive, send, source, head)
        if run is None:
            await writing
        else:
            await _InlineRun(self._answer_graces(), writing, session.contexts, pending[0].request_id).run(run)
        session.forget_if_finished(live)

    @staticmethod
    async def _write_recorded(
        live: LiveStream, writer: SseWriter, receive: Receive, send: Send, source: LiveSource, head: bytes
    ) -> None:
        """Write a stream whose record the store is still writing: its first id (the priming event's) goes out only
        once the record is stored, as a resume from it needs the record. If it cannot be stored, the stream is
        failed and the response carries an explicit error per request, without any id (nothing to resume)."""
        if not await live.wait_recorded():
            head = b""
            source.has_cursor = False
        await writer.run(receive, send, source, head)

    def _priming(self, live: LiveStream, version: str) -> bytes:
        """The priming event (SEP-1699): an id for the stream's current position, empty data, ``retry``.

        Only for clients at 2025-11-25 or later: older ones cannot parse an event with empty data.
        """
        if not protocol.primes_streams(version):
            return b""
        return frames.sse(live.event_id(live.record.last_seq), b"", self.state.config.retry_ms)

    async def _write_json(self, live: LiveStream, send: Send, batch: bool) -> None:
        while not (live.done or live.broken):
            await live.waiter()
        answers = [e.data for e in live.events if e.terminal]
        if live.broken or not answers:
            raise Refused.rpc(503, errors.INTERNAL_ERROR, "the answer could not be stored")
        body = b"[" + b",".join(answers) + b"]" if batch else answers[0]
        await respond(send, 200, body, b"application/json")

    # -- GET -----------------------------------------------------------------------------------------

    async def get(self, scope: Scope, index: Index, receive: Receive, send: Send) -> None:
        """Token, Accept, revision, session; then the standalone stream, or a resume from ``Last-Event-ID``."""
        grant = await self._authenticate(scope, index)
        checks.require_get_accept(index)
        requested = era(index, None, False)
        assert requested is not STATELESS_LEG, "a GET carries no message to open the modern way"
        checks.served_revision(requested, [])
        session = await self._session(index, grant)
        last_event_id = _text(index, b"last-event-id")
        if last_event_id is None:
            await self._listen(receive, send, session, grant)
            return
        # A resume has no body, hence no _meta: the caller's trace comes in W3C Trace Context headers (traceparent).
        carrier = {key: value for key in tracing.CARRIER_KEYS if (value := _text(index, key.encode())) is not None}
        with tracing.span("GET resume", carrier=carrier, kind="server"):
            await self._resume(receive, send, session, grant, last_event_id.strip())

    async def _listen(self, receive: Receive, send: Send, session: ServerSession, grant: Grant) -> None:
        """The standalone GET stream: server messages unrelated to any request, one listener at a time."""
        state = self.state
        live = session.live.get(session.get_stream) if session.get_stream else None
        if live is None:
            record = StreamRecord(session.id, stream_key(), StreamKind.GET, state.instance, (), 0)
            await state.store.open_stream(record)
            live = state.live_stream(record)
            session.live[record.stream] = live
            session.get_stream = record.stream
        elif live.writer is not None:
            raise Refused.rpc(409, errors.INVALID_REQUEST, "a GET stream is already open")
        state.metrics.get_streams.inc()
        head = self._priming(live, session.version)
        covers = state.policy.covers_all(grant.audience, stream_tags(live.record), grant.scopes)
        gate = DeliveryGate(grant, state.policy, None, state.leeway, covers)
        writer = SseWriter(state.config.retry_ms, state.metrics, session.id, live.record.stream, gate, ())
        await writer.run(receive, send, LiveSource(live, live.record.last_seq, has_cursor=bool(head)), head)

    async def _resume(
        self, receive: Receive, send: Send, session: ServerSession, grant: Grant, last_event_id: str
    ) -> None:
        """Look up what :func:`~..core.resume.decide_resume` needs, decide, then render its outcome.

        The stream the cursor names and, for a cursor of this session, its events after the cursor are looked up
        before the decision is asked (it would ask for them first, in that order), so a resume steps into the
        core once; the loop answers only what the rarer cases ask besides (another session's principal, a
        producer's liveness, an orphan to settle)."""
        state = self.state
        decoded = state.codec.decode(last_event_id, session.id)
        facts = ResumeFacts(session.id, last_event_id, decoded)
        live: LiveStream | None = None
        if not isinstance(decoded, CursorProblem):
            live = await self._find_stream(facts, session, decoded.stream)
            if isinstance(decoded, Cursor) and isinstance(facts.record, StreamRecord):  # not another session's
                facts.events = await self._events_after(live, decoded.stream, decoded.seq)
        while True:
            step = decide_resume(facts, grant, state.policy)
            if isinstance(step, NeedStream):
                live = await self._find_stream(facts, session, step.stream)
            elif isinstance(step, NeedSessionPrincipal):
                other = await state.store.get_session(step.session_id)
                facts.same_principal = other is not None and other.principal == grant.principal
            elif isinstance(step, NeedOwner):
                facts.owner_alive = await self.producers.owner_alive(step.owner)
            elif isinstance(step, SettleOrphan):  # settling appends the lost answers: what was read is stale
                facts.record, facts.settled = await self.producers.settle(step.record), True
                facts.events = Lookup.PENDING
            elif isinstance(step, NeedEvents):
                facts.events = await self._events_after(live, step.stream, step.seq)
            else:
                break
        if isinstance(step, CursorRejected):
            raise self._cursor_rejected(session, step)
        if isinstance(step, Refusal):
            needed = stream_tags(facts.record) if isinstance(facts.record, StreamRecord) else set()
            raise self._replay_refused(session, step, frozenset[str]().union(*needed))
        await self._replay(receive, send, session, grant, last_event_id, step, live)

    async def _find_stream(self, facts: ResumeFacts, session: ServerSession, stream: str) -> LiveStream | None:
        """Fill in ``facts.record`` (and ``facts.live``) for ``stream``: the session's live stream, else the
        store's record; return the live stream, if any."""
        live = self._live(session, stream)
        facts.live = live is not None
        if live is not None:
            facts.record = live.snapshot()
        else:
            facts.record = await self.state.store.get_stream(stream) or Lookup.ABSENT
        return live

    @staticmethod
    def _live(session: ServerSession, stream: str) -> LiveStream | None:
        """The session's live stream ``stream``; one whose producer could not store an answer is settled instead."""
        live = session.live.get(stream)
        if live is not None and live.broken:
            session.live.pop(stream, None)
            return None
        return live

    async def _events_after(self, live: LiveStream | None, stream: str, seq: int) -> Sequence[StoredEvent] | Lookup:
        """The events of ``stream`` after ``seq``: memory holds a live stream's backlog; what was sent, the store."""
        held = live.after(seq) if live is not None else None
        if held is not None:
            return held
        started = perf_counter()
        try:
            events = await self.state.store.read_after(stream, seq)
        except EventsEvicted:
            return Lookup.ABSENT
        self.state.metrics.read_latency.observe(perf_counter() - started)
        return events

    async def _replay(
        self,
        receive: Receive,
        send: Send,
        session: ServerSession,
        grant: Grant,
        last_event_id: str,
        plan: ReplayPlan,
        live: LiveStream | None,
    ) -> None:
        state = self.state
        stream = plan.cursor.stream
        state.metrics.resumes.labels("replayed").inc()
        state.metrics.replayed.inc(len(plan.events))
        log_decision(
            "resume",
            session=fingerprint(session.id),
            stream=stream,
            cursor=last_event_id,
            decision="replay",
            events=len(plan.events),
            tail=plan.tail.value,
        )
        gate = DeliveryGate(grant, state.policy, last_event_id, state.leeway, plan.covers_stream)
        writer = SseWriter(
            state.config.retry_ms, state.metrics, session.id, stream, gate, plan.record.requests, plan.settled
        )
        source: LiveSource | StoredSource
        if live is not None:
            source = LiveSource(live, plan.cursor.seq, has_cursor=True, replay=plan.events)
        else:
            mac = state.codec.stream_mac(session.id, stream)

            def event_id(seq: int) -> str:
                return EventIdCodec.encode(stream, seq, mac)

            record = plan.record
            tail = RemoteTail(state.store, stream, self.producers, event_id) if plan.tail is Tail.REPLICA else None
            lost = None
            if record.lost is not None:  # ended without its producer: the unanswered requests' outcome ends it
                lost = StreamLost(record.lost, event_id(record.last_seq) if record.last_seq >= 0 else None)
            source = StoredSource(plan.events, plan.cursor.seq, tail, lost)
        decided = {"mcp_lossless.decision": "replay", "mcp_lossless.cursor": last_event_id}
        with tracing.span("resume", {**decided, "mcp_lossless.replayed": len(plan.events)}, kind="server"):
            await writer.run(receive, send, source, b"retry: %d\n\n" % state.config.retry_ms)

    def _cursor_rejected(self, session: ServerSession, rejected: CursorRejected) -> Refused:
        self.state.metrics.resumes.labels(rejected.problem.value).inc()
        log_decision(
            "resume",
            session=fingerprint(session.id),
            decision="rejected",
            reason=rejected.problem.value,
            cursor=rejected.cursor[:80],
        )
        rejection = {"mcp_lossless.reason": rejected.problem.value, "mcp_lossless.cursor": rejected.cursor[:80]}
        tracing.decision("resume", {"mcp_lossless.decision": "rejected", **rejection})
        return Refused(rejected.status, rejected.body)

    def _replay_refused(self, session: ServerSession, refusal: Refusal, needed: frozenset[str]) -> Refused:
        """The pre-commit 403; ``needed`` is every tag the stream's events can carry (its challenge's scopes)."""
        state = self.state
        state.metrics.resumes.labels("refused").inc()
        state.metrics.refusals.labels(refusal.reason.value, "replay").inc()
        log_decision(
            "resume",
            session=fingerprint(session.id),
            decision="refused",
            reason=refusal.reason.value,
            event_id=refusal.event_id,
            missing=list(refusal.missing),
            cursor=refusal.cursor,
        )
        refused = {"mcp_lossless.reason": refusal.reason.value, "mcp_lossless.cursor": refusal.cursor}
        tracing.decision("resume", {"mcp_lossless.decision": "refused", **refused})
        description = frames.refusal_message(refusal)
        body = {"error": "replay_refused", "error_description": description, **frames.refusal_data(refusal)}
        challenge = metadata.insufficient_scope(description, state.prm_url, refusal.missing, needed)
        return Refused(403, body, [(b"www-authenticate", challenge)])

    # -- DELETE --------------------------------------------------------------------------------------

    async def delete(self, scope: Scope, index: Index, send: Send) -> None:
        state = self.state
        session = await self._session(index, await self._authenticate(scope, index))
        await state.sessions.delete(session)
        state.metrics.sessions.set(len(state.sessions))
        log_decision("session_deleted", session=fingerprint(session.id))
        await respond(send, 204)

    # -- shared checks -------------------------------------------------------------------------------

    async def _authenticate(self, scope: Scope, index: Index) -> Grant:
        """The request's grant; 401 with challenges when there is no token, or one this server does not take.

        A token comes as ``Bearer`` or as ``DPoP`` (RFC 9449 §7.1); :meth:`.dpop.DpopGuard.check` then decides
        whether the proof (or its absence) lets this request use it. Every request of both eras comes here, so
        a resume or a task poll is held to the same proof as the call that started it.
        """
        state = self.state
        if state.verifier is None:
            return state.anonymous
        raw = _text(index, b"authorization") or ""
        scheme, _, token = raw.partition(" ")
        scheme, token = scheme.lower(), token.strip()
        if scheme not in ("bearer", "dpop") or not token:
            raise Refused.rpc(
                401, errors.INVALID_REQUEST, "authorization required", headers=state.dpop.challenges(None, None)
            )
        try:
            grant = await state.verifier.verify(token)
        except InvalidToken as exc:
            raise state.dpop.refused("invalid_token", exc.description, scheme) from None
        except VerifierUnavailable as exc:  # the token could not be judged: not the client's fault, no challenge
            raise Refused.rpc(503, errors.INTERNAL_ERROR, str(exc), headers=[(b"retry-after", b"1")]) from None
        if not state.policy.admits(grant.audience):
            description = "token audience does not include this server or any of its tools"
            raise state.dpop.refused("invalid_token", description, scheme)
        await state.dpop.check(scope, index, scheme, token, grant)
        CALLER.set((grant, token))
        return grant

    def _recent_session(self, index: Index, grant: Grant) -> ServerSession | None:
        """:meth:`_session`'s answer when the registry has it at hand without awaiting
        (:meth:`.sessions.SessionRegistry.recent`); ``None``: ask :meth:`_session`, which also refuses."""
        session_id = index.get(b"mcp-session-id")
        if session_id is None:
            return None
        return self.state.sessions.recent(session_id.decode("latin-1"), grant.principal, now())

    def _over(self, exceeded: LimitExceeded) -> Refused:
        """A request past a server setting's limit, counted in ``/metrics`` as every limit refusal is."""
        self.state.metrics.limit_refusals.labels(exceeded.limit).inc()
        return Refused.over(exceeded)

    async def _session(self, index: Index, grant: Grant) -> ServerSession:
        """The request's session: 400 without the header, 404 when unknown or another principal's (one answer)."""
        session_id = _text(index, b"mcp-session-id")
        if session_id is None:
            raise Refused.rpc(400, errors.INVALID_REQUEST, "Mcp-Session-Id header required")
        sessions = self.state.sessions
        session = await sessions.find(session_id, grant.principal)
        if session is None:
            raise Refused.rpc(404, errors.INVALID_REQUEST, "session not found")
        at = now()
        if sessions.stale(session, at):
            await sessions.touch(session, at)
        return session


class _InlineRun:
    """Run a POST's one request in the request's own task, then write its stream.

    A call that answers without suspending needs no second task: its stream is written whole once it
    returns. If it suspends while still working (its context registered), the writer starts in a task of its
    own on the next loop turn, so the priming event and progress go out while the call runs (as for a POST with
    several requests). A call whose first suspension is the store taking its answer gets
    :data:`ANSWER_GRACE_SECONDS` for it: a second task, a watch for the client's disconnect and a write of the
    priming event alone would cost more than the whole call (with SQLite, a commit takes longer than one turn of
    the loop), so once stored in time the stream is written whole; a store slower than that (an outage being
    ridden out) has the writer start, and the priming event go out, as for a call still working.

    An object with slots, not a coroutine with closures: its callbacks are bound methods (closures, their cells
    and a lambda per call cost several thousand instructions a call).
    """

    __slots__ = ("_contexts", "_finished", "_graces", "_request_id", "_turn", "_writer", "_writing")

    def __init__(
        self,
        graces: _AnswerGraces,
        writing: Coroutine[Any, Any, None],
        contexts: dict[str | int, Any],
        request_id: str | int,
    ) -> None:
        self._graces = graces
        self._writing = writing
        self._contexts = contexts
        self._request_id = request_id
        self._writer: asyncio.Task[None] | None = None
        self._finished = False
        """The call returned (or failed) before any writer started: :meth:`run` writes the stream, or closes it."""
        self._turn: asyncio.Handle = graces.loop.call_soon(self._start_if_working)

    def _start_writer(self) -> None:
        self._writer = self._graces.loop.create_task(self._writing)

    def _start_if_working(self) -> None:
        if self._request_id in self._contexts:
            self._start_writer()
        else:
            self._graces.add(self)

    def grace_over(self) -> None:
        """:data:`ANSWER_GRACE_SECONDS` after the call's first suspension: start the writer unless it returned."""
        if not self._finished:
            self._start_writer()

    async def run(self, run: Coroutine[Any, Any, None]) -> None:
        try:
            await run
        except BaseException:
            if self._writer is None:
                self._finished = True
                self._turn.cancel()
                self._writing.close()
            raise
        if self._writer is None:
            self._finished = True
            self._turn.cancel()
            await self._writing
        else:
            await self._writer


class _Clock(Protocol):
    """What the graces read of time: now, and a callback at a moment (an event loop is one)."""

    def time(self) -> float: ...
    def call_at(self, when: float, callback: Callable[[], object], /) -> object: ...


class _AnswerGraces:
    """The answer graces of a loop's inline runs (:class:`_InlineRun`) on one timer.

    Every grace is :data:`ANSWER_GRACE_SECONDS` from when it begins, so they end in the order they began: one
    timer for the earliest end (:data:`GRACE_SLACK_SECONDS` late, so that one firing ends the graces that ended
    meanwhile), armed again for the next one when it fires, instead of a timer armed and cancelled per call (some
    5,000 instructions a call with uvloop). A run that finished in time is dropped when its grace ends, with
    nothing to do. Time comes from ``clock``, the loop unless given: a test moves it by hand instead of sleeping
    against the graces.
    """

    __slots__ = ("_runs", "_timer", "clock", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop, clock: _Clock | None = None) -> None:
        self.loop = loop
        self.clock: _Clock = loop if clock is None else clock
        self._runs: deque[tuple[float, _InlineRun]] = deque()
        """Runs in their grace with its end (clock time), in order."""
        self._timer: object | None = None

    def add(self, run: _InlineRun) -> None:
        clock = self.clock
        ends = clock.time() + ANSWER_GRACE_SECONDS
        self._runs.append((ends, run))
        if self._timer is None:
            self._timer = clock.call_at(ends + GRACE_SLACK_SECONDS, self._expire)

    def __len__(self) -> int:
        return len(self._runs)

    def _expire(self) -> None:
        self._timer = None
        runs = self._runs
        clock = self.clock
        now = clock.time()
        while runs:
            ends, run = runs[0]
            if ends > now:
                self._timer = clock.call_at(ends + GRACE_SLACK_SECONDS, self._expire)
                return
            runs.popleft()
            run.grace_over()
