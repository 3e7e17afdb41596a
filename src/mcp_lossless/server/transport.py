"""The Streamable HTTP endpoint: POST opens a stream per request batch, GET resumes or listens, DELETE ends.

Everything a client can get wrong is answered with a status and a JSON body saying what; nothing raises to
the ASGI server. Replays are planned against the resuming token before any byte is committed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from time import perf_counter
from typing import Any

import orjson

from .. import __version__
from ..asgi import BodyTooLarge, ClientGone, Receive, Scope, Send, header, headers, read_body, respond, respond_json
from ..core import errors, frames, protocol
from ..core.events import PendingRequest, RequestId, StoredEvent, StreamKind, StreamRecord
from ..core.principal import Grant
from ..core.replay import DeliveryGate, Refusal
from ..core.resume import (
    CursorRejected,
    Lookup,
    NeedEvents,
    NeedOwner,
    NeedStream,
    ReplayPlan,
    ResumeFacts,
    SettleOrphan,
    Tail,
    decide_resume,
    stream_tags,
)
from ..stores.base import EventsEvicted, StoreUnavailable
from .auth import InvalidToken
from .dispatch import Dispatcher, is_request_id
from .keys import stream_key
from .observability import fingerprint, log_decision, now
from .sessions import Session
from .state import ServerState
from .streams import LiveStream
from .writer import LiveSource, SseWriter, StoredSource

log = logging.getLogger("mcp_lossless.transport")


def rpc_error(code: int, message: str, request_id: RequestId | None = None, data: Any = None) -> dict[str, Any]:
    """The body of an HTTP-level refusal: a JSON-RPC error, so stock clients can read it."""
    return frames.error_message(request_id, code, message, data)


class Transport:
    def __init__(self, state: ServerState) -> None:
        self.s = state
        self.dispatcher = Dispatcher(state)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        method = scope["method"]
        try:
            if method == "POST":
                await self.post(scope, receive, send)
            elif method == "GET":
                await self.get(scope, receive, send)
            elif method == "DELETE":
                await self.delete(scope, send)
            else:
                await respond_json(
                    send,
                    405,
                    rpc_error(errors.INVALID_REQUEST, "use POST, GET or DELETE"),
                    [(b"allow", b"GET, POST, DELETE")],
                )
        except StoreUnavailable:
            await respond_json(
                send,
                503,
                rpc_error(errors.INTERNAL_ERROR, "event store unavailable; retry later"),
                [(b"retry-after", b"1")],
            )

    # -- shared checks -------------------------------------------------------------------------------

    async def _authenticate(self, scope: Scope, send: Send) -> Grant | None:
        s = self.s
        if s.verifier is None:
            return s.anonymous
        raw = header(scope, b"authorization")
        prm = s.prm_url
        if raw is None or not raw.lower().startswith("bearer "):
            await respond_json(
                send,
                401,
                rpc_error(errors.INVALID_REQUEST, "authorization required"),
                [(b"www-authenticate", s.challenge(None, None, prm))],
            )
            return None
        try:
            grant = await s.verifier.verify(raw[7:].strip())
        except InvalidToken as exc:
            await self._invalid_token(send, exc.description)
            return None
        if not s.policy.admits(grant.audience):
            await self._invalid_token(send, "token audience does not include this server or any of its tools")
            return None
        return grant

    async def _invalid_token(self, send: Send, description: str) -> None:
        await respond_json(
            send,
            401,
            rpc_error(errors.INVALID_REQUEST, description),
            [(b"www-authenticate", self.s.challenge("invalid_token", description, self.s.prm_url))],
        )

    def _version(self, scope: Scope, session: Session) -> str:
        """The request's protocol version: its header's (maybe unsupported), else the session's."""
        value = header(scope, b"mcp-protocol-version")
        return session.version if value is None else value

    async def _unsupported_version(self, send: Send, value: str) -> None:
        if value == protocol.STATELESS:
            message = (
                f"protocol {value} (stateless, no resumption) is not served here; "
                f"initialize with one of {', '.join(protocol.SUPPORTED)}"
            )
        else:
            message = f"unsupported MCP-Protocol-Version {value!r}; supported: {', '.join(protocol.SUPPORTED)}"
        await respond_json(
            send, 400, rpc_error(errors.INVALID_REQUEST, message, data={"supported": list(protocol.SUPPORTED)})
        )

    async def _session(self, scope: Scope, send: Send, grant: Grant) -> Session | None:
        session_id = header(scope, b"mcp-session-id")
        if session_id is None:
            await respond_json(send, 400, rpc_error(errors.INVALID_REQUEST, "Mcp-Session-Id header required"))
            return None
        session = await self.s.sessions.find(session_id, grant.principal)
        if session is None:
            await respond_json(send, 404, rpc_error(errors.INVALID_REQUEST, "session not found"))
            return None
        await self.s.sessions.touch(session, now())
        return session

    # -- POST ----------------------------------------------------------------------------------------

    async def post(self, scope: Scope, receive: Receive, send: Send) -> None:
        s = self.s
        grant = await self._authenticate(scope, send)
        if grant is None:
            return
        index = headers(scope)
        accept = index.get(b"accept", b"")
        if b"application/json" not in accept or b"text/event-stream" not in accept:
            await respond_json(
                send,
                406,
                rpc_error(errors.INVALID_REQUEST, "Accept must list both application/json and text/event-stream"),
            )
            return
        if not index.get(b"content-type", b"").lower().startswith(b"application/json"):
            await respond_json(send, 415, rpc_error(errors.INVALID_REQUEST, "Content-Type must be application/json"))
            return
        try:
            body = await read_body(receive, s.config.max_body_bytes)
        except BodyTooLarge:
            await respond_json(
                send, 413, rpc_error(errors.INVALID_REQUEST, f"body exceeds {s.config.max_body_bytes} bytes")
            )
            return
        except ClientGone:
            return
        try:
            payload = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            await respond_json(send, 400, rpc_error(errors.PARSE_ERROR, f"body is not JSON: {exc.msg}"))
            return
        messages = payload if isinstance(payload, list) else [payload]
        problem = _validate(messages)
        if problem is not None:
            await respond_json(send, 400, rpc_error(errors.INVALID_REQUEST, problem))
            return
        first = messages[0]
        if first.get("method") == "initialize" and "id" in first:
            if len(messages) > 1:
                await respond_json(send, 400, rpc_error(errors.INVALID_REQUEST, "initialize cannot be batched"))
                return
            await self._initialize(send, grant, first)
            return
        session = await self._session(scope, send, grant)
        if session is None:
            return
        version = self._version(scope, session)
        if version not in protocol.SUPPORTED:
            await self._unsupported_version(send, version)
            return
        if isinstance(payload, list) and not protocol.allows_batches(session.version):
            await respond_json(
                send,
                400,
                rpc_error(
                    errors.INVALID_REQUEST,
                    "JSON-RPC batches are only accepted on sessions negotiated at 2025-03-26 "
                    f"(this one: {session.version})",
                ),
            )
            return
        requests = []
        for message in messages:
            if "method" in message and "id" in message:
                requests.append(message)
            elif "method" not in message:
                self.dispatcher.deliver(session, message)
            elif message.get("method") == "notifications/cancelled":
                self.dispatcher.cancel(session, message.get("params"))
        if not requests:
            await respond(send, 202)
            return
        pending, refused = self._plan_requests(requests, grant)
        if refused:
            await self._forbid_call(send, refused, requests)
            return
        await self._open_post_stream(
            scope, receive, send, session, grant, version, requests, pending, batch=isinstance(payload, list)
        )

    async def _initialize(self, send: Send, grant: Grant, message: dict[str, Any]) -> None:
        params = message.get("params")
        version = protocol.negotiate(params.get("protocolVersion") if isinstance(params, dict) else None)
        session = await self.s.sessions.create(grant.principal, version, now())
        self.s.metrics.sessions.set(len(self.s.sessions))
        result = {
            "protocolVersion": version,
            "capabilities": self.s.capabilities,
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

    def _plan_requests(self, requests: list[dict[str, Any]], grant: Grant) -> tuple[list[PendingRequest], list[str]]:
        """Each request with the resources its events need; the resources the token lacks for any call."""
        s = self.s
        pending = []
        refused: set[str] = set()
        for message in requests:
            method = message["method"]
            tool = None
            if method == "tools/call":
                params = message.get("params")
                name = params.get("name") if isinstance(params, dict) else None
                tool = s.tools.get(name) if isinstance(name, str) else None
            if tool is None:
                pending.append(PendingRequest(message["id"], method))
                continue
            resources = s.tool_tags[tool.name]
            gap = s.policy.missing(grant.audience, resources)
            if gap:
                refused |= gap
            pending.append(PendingRequest(message["id"], method, tool.name, resources))
        return pending, sorted(refused)

    async def _forbid_call(self, send: Send, missing: list[str], requests: list[dict[str, Any]]) -> None:
        s = self.s
        description = f"token audience does not cover {' '.join(missing)}"
        self.s.metrics.refusals.labels("insufficient_audience", "call").inc()
        body = [rpc_error(errors.FORBIDDEN, description, m["id"], {"requiredResources": missing}) for m in requests]
        await respond_json(
            send,
            403,
            body if len(body) > 1 else body[0],
            [(b"www-authenticate", s.challenge("insufficient_scope", description, s.prm_url_for(missing[0]), missing))],
        )

    async def _open_post_stream(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        session: Session,
        grant: Grant,
        version: str,
        requests: list[dict[str, Any]],
        pending: list[PendingRequest],
        batch: bool,
    ) -> None:
        s = self.s
        # Position 0 is the stream's start: the priming event's id names it, and it is never stored.
        record = StreamRecord(session.id, stream_key(), StreamKind.POST, s.instance, tuple(pending), 0)
        await s.store.open_stream(record)
        live = s.live_stream(record)
        session.live[record.stream] = live
        s.metrics.post_streams.inc()
        head = b"" if s.config.json_response else self._priming(live, version)  # names position 0
        run = None
        if len(requests) == 1:
            run = await self.dispatcher.dispatch(session, live, grant, requests[0], pending[0], inline=True)
        else:
            for message, request in zip(requests, pending, strict=True):
                await self.dispatcher.dispatch(session, live, grant, message, request)
        if s.config.json_response:
            if run is not None:
                await run
            await self._write_json(live, send, batch)
            return
        # Every call the token does not cover was refused above, so it covers every event this stream can carry.
        gate = DeliveryGate(grant, s.policy, None, s.leeway, covers_stream=True)
        writer = SseWriter(s, session.id, record.stream, gate, record.requests)
        writing = writer.run(receive, send, LiveSource(live, 0, has_cursor=bool(head)), head)
        if run is None:
            await writing
        else:
            await _run_then_write(s.loop, run, writing)
        self._release(session, live)

    def _priming(self, live: LiveStream, version: str) -> bytes:
        """The priming event (SEP-1699): an id for the stream's current position, empty data, ``retry``.

        Only for clients at 2025-11-25 or later: older ones cannot parse an event with empty data.
        """
        if not protocol.primes_streams(version):
            return b""
        return frames.sse(live.event_id(live.record.last_seq), b"", self.s.config.retry_ms)

    def _release(self, session: Session, live: LiveStream) -> None:
        """Forget a finished stream once no request of it runs; later resumes read it from the store."""
        if live.done and not session.tasks.keys() & {r.request_id for r in live.record.requests}:
            session.live.pop(live.record.stream, None)

    async def _write_json(self, live: LiveStream, send: Send, batch: bool) -> None:
        while not (live.done or live.broken):
            await live.waiter()
        answers = [e.data for e in live.events if e.terminal]
        if live.broken or not answers:
            await respond_json(send, 503, rpc_error(errors.INTERNAL_ERROR, "the answer could not be stored"))
            return
        body = b"[" + b",".join(answers) + b"]" if batch else answers[0]
        await respond(send, 200, body, b"application/json")

    # -- GET -----------------------------------------------------------------------------------------

    async def get(self, scope: Scope, receive: Receive, send: Send) -> None:
        grant = await self._authenticate(scope, send)
        if grant is None:
            return
        accept = header(scope, b"accept") or ""
        if "text/event-stream" not in accept:
            await respond_json(send, 406, rpc_error(errors.INVALID_REQUEST, "Accept must list text/event-stream"))
            return
        session = await self._session(scope, send, grant)
        if session is None:
            return
        version = self._version(scope, session)
        if version not in protocol.SUPPORTED:
            await self._unsupported_version(send, version)
            return
        last_event_id = header(scope, b"last-event-id")
        if last_event_id is None:
            await self._listen(receive, send, session, grant)
        else:
            await self._resume(receive, send, session, grant, last_event_id.strip())

    async def _listen(self, receive: Receive, send: Send, session: Session, grant: Grant) -> None:
        """The standalone GET stream: server messages unrelated to any request, one listener at a time."""
        s = self.s
        live = session.live.get(session.get_stream) if session.get_stream else None
        if live is None:
            record = StreamRecord(session.id, stream_key(), StreamKind.GET, s.instance, (), 0)
            await s.store.open_stream(record)
            live = s.live_stream(record)
            session.live[record.stream] = live
            session.get_stream = record.stream
        elif live.writer is not None:
            await respond_json(send, 409, rpc_error(errors.INVALID_REQUEST, "a GET stream is already open"))
            return
        s.metrics.get_streams.inc()
        head = self._priming(live, session.version)
        covers = s.policy.covers_all(grant.audience, stream_tags(live.record))
        gate = DeliveryGate(grant, s.policy, None, s.leeway, covers)
        writer = SseWriter(s, session.id, live.record.stream, gate, ())
        await writer.run(receive, send, LiveSource(live, live.record.last_seq, has_cursor=bool(head)), head)

    async def _resume(self, receive: Receive, send: Send, session: Session, grant: Grant, last_event_id: str) -> None:
        """Answer what :func:`~..core.resume.decide_resume` asks, then render its outcome."""
        s = self.s
        facts = ResumeFacts(session.id, last_event_id, s.codec.decode(last_event_id, session.id))
        live: LiveStream | None = None
        while True:
            step = decide_resume(facts, grant, s.policy)
            if isinstance(step, NeedStream):
                live = self._live(session, step.stream)
                facts.live = live is not None
                facts.record = (
                    live.record if live is not None else await s.store.get_stream(step.stream) or Lookup.ABSENT
                )
            elif isinstance(step, NeedOwner):
                facts.owner_alive = await self._owner_alive(step.owner)
            elif isinstance(step, SettleOrphan):
                facts.record, facts.settled = await self._end_orphan(step.record), True
            elif isinstance(step, NeedEvents):
                facts.events = live.after(step.seq) if live is not None else await self._read_after(step)
            else:
                break
        if isinstance(step, CursorRejected):
            await self._cursor_problem(send, session, step)
        elif isinstance(step, Refusal):
            await self._refuse_replay(send, session, step)
        else:
            await self._replay(receive, send, session, grant, last_event_id, step, live)

    @staticmethod
    def _live(session: Session, stream: str) -> LiveStream | None:
        """The session's live stream ``stream``; one whose producer could not store an answer is settled instead."""
        live = session.live.get(stream)
        if live is not None and live.broken:
            session.live.pop(stream, None)
            return None
        return live

    async def _read_after(self, step: NeedEvents) -> list[StoredEvent] | Lookup:
        started = perf_counter()
        try:
            events = await self.s.store.read_after(step.stream, step.seq)
        except EventsEvicted:
            return Lookup.ABSENT
        self.s.metrics.read_latency.observe(perf_counter() - started)
        return events

    async def _replay(
        self,
        receive: Receive,
        send: Send,
        session: Session,
        grant: Grant,
        last_event_id: str,
        plan: ReplayPlan,
        live: LiveStream | None,
    ) -> None:
        s = self.s
        stream = plan.cursor.stream
        s.metrics.resumes.labels("replayed").inc()
        s.metrics.replayed.inc(len(plan.events))
        log_decision(
            "resume",
            session=fingerprint(session.id),
            stream=stream,
            cursor=last_event_id,
            decision="replay",
            events=len(plan.events),
            tail=plan.tail.value,
        )
        gate = DeliveryGate(grant, s.policy, last_event_id, s.leeway, plan.covers_stream)
        writer = SseWriter(s, session.id, stream, gate, plan.record.requests, plan.settled)
        source: LiveSource | StoredSource
        if live is not None:
            source = LiveSource(live, plan.cursor.seq, has_cursor=True)
        else:
            tail = (s.store, stream, self._owner_alive, self._end_orphan) if plan.tail is Tail.REPLICA else None
            source = StoredSource(plan.events, plan.cursor.seq, tail)
        await writer.run(receive, send, source, b"retry: %d\n\n" % s.config.retry_ms)

    async def _cursor_problem(self, send: Send, session: Session, rejected: CursorRejected) -> None:
        self.s.metrics.resumes.labels(rejected.problem.value).inc()
        log_decision(
            "resume",
            session=fingerprint(session.id),
            decision="rejected",
            reason=rejected.problem.value,
            cursor=rejected.cursor[:80],
        )
        await respond_json(send, rejected.status, rejected.body)

    async def _refuse_replay(self, send: Send, session: Session, refusal: Refusal) -> None:
        s = self.s
        s.metrics.resumes.labels("refused").inc()
        s.metrics.refusals.labels(refusal.reason.value, "replay").inc()
        log_decision(
            "resume",
            session=fingerprint(session.id),
            decision="refused",
            reason=refusal.reason.value,
            event_id=refusal.event_id,
            missing=list(refusal.missing),
            cursor=refusal.cursor,
        )
        description = frames.refusal_message(refusal)
        body = {"error": "replay_refused", "error_description": description, **frames.refusal_data(refusal)}
        await respond_json(
            send,
            403,
            body,
            [
                (
                    b"www-authenticate",
                    s.challenge("insufficient_scope", description, s.prm_url_for(refusal.missing[0]), refusal.missing),
                )
            ],
        )

    async def _owner_alive(self, owner: str) -> bool:
        """Whether another live process produces the stream (this one would hold it in ``session.live``)."""
        return owner != self.s.instance and await self.s.store.owner_alive(owner)

    async def _end_orphan(self, record: StreamRecord) -> StreamRecord:
        """A call whose process died: record EXECUTION_LOST for each unanswered request so the stream ends."""
        s = self.s
        async with s.orphan_lock:
            if record.owner != s.instance and not await s.store.claim_stream(record.stream, record.owner, s.instance):
                return await s.store.get_stream(record.stream) or record  # another replica settles it
            fresh = await s.store.get_stream(record.stream)
            if fresh is None or fresh.completed:
                return fresh or record
            live = s.live_stream(fresh)
            lost = [r.request_id for r in fresh.unanswered()]
            if not lost:  # answered, yet open: recorded by a version that stored completion in a write of its own
                fresh.completed = True
                await s.store.complete_stream(fresh.stream)
                return fresh
            for request in fresh.unanswered():
                await live.append(frames.execution_lost(request.request_id), request, terminal=True)
                s.metrics.lost.inc()
            log_decision("execution_lost", stream=record.stream, requests=lost)
            return live.record

    # -- DELETE --------------------------------------------------------------------------------------

    async def delete(self, scope: Scope, send: Send) -> None:
        grant = await self._authenticate(scope, send)
        if grant is None:
            return
        session = await self._session(scope, send, grant)
        if session is None:
            return
        await self.s.sessions.delete(session)
        self.s.metrics.sessions.set(len(self.s.sessions))
        log_decision("session_deleted", session=fingerprint(session.id))
        await respond(send, 204)


async def _run_then_write(
    loop: asyncio.AbstractEventLoop, run: Coroutine[Any, Any, None], writing: Coroutine[Any, Any, None]
) -> None:
    """Run a POST's one request in the request's own task, then write its stream.

    A call that answers without suspending needs no second task: its stream is written whole once it
    returns. If it suspends, the writer starts in a task of its own on the next loop turn, so the priming
    event and progress go out while the call runs (as for a POST with several requests).
    """
    writer: asyncio.Task[None] | None = None

    def start_writer() -> None:
        nonlocal writer
        writer = loop.create_task(writing)

    turn = loop.call_soon(start_writer)
    try:
        await run
    except BaseException:
        if writer is None:
            turn.cancel()
            writing.close()
        raise
    if writer is None:
        turn.cancel()
        await writing
    else:
        await writer


def _validate(messages: list[Any]) -> str | None:
    """Why a body is not a JSON-RPC message or batch, or ``None``."""
    if not messages:
        return "empty batch"
    for message in messages:
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            return 'each message must be a JSON object with "jsonrpc": "2.0"'
        if "method" in message:
            if not isinstance(message["method"], str):
                return "method must be a string"
            if "id" in message and not is_request_id(message["id"]):
                return "request id must be a string or an integer"
            if "params" in message and not isinstance(message["params"], (dict, list)):
                return "params must be an object"
        elif "id" not in message or ("result" not in message and "error" not in message):
            return "message is neither a request, a notification nor a response"
    return None
