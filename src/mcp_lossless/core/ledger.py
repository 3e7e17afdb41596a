"""The client's pending-call ledger: every request id ends in exactly one terminal outcome.

The ledger is a pure state machine. The adapter feeds it what happened on the wire (events received,
a connection that ended, an HTTP refusal, a deadline) and executes the actions it returns (send,
resume, re-authorize, re-issue, resolve). Each action carries the reason it was taken, so every
recovery decision can be logged.

Rules it enforces (invariant 3):

* A response is matched to a pending request by its JSON-RPC id on that request's stream and is never
  re-labelled; a response whose id is not pending there is dropped and reported.
* A stream that ends, or a connection that drops, is never completion: the stream is resumed from the
  last event id actually received (priming ids included), within a bounded number of fruitless tries.
* Events seen before (same event id after a resume, or progress not beyond what was delivered) are not
  delivered twice.
* ``DELIVERY_REFUSED`` with ``resumable: true`` is not terminal: the stream waits for re-authorization
  and resumes from the same cursor. ``EXECUTION_LOST`` is terminal unless the call may be re-issued.
* A call may be re-issued (with a new id) only when its tool is idempotent, the caller opted in, or it carries
  an idempotency key (SEP-3182: the server runs a key once, so a re-issue is safe for every tool); otherwise it
  fails with "may have run, result not received". A keyed call answered "in progress" is sent again, same key,
  after the server's ``retryAfter``; one answered execution-lost *naming its key* is final (the key is never run
  again, so sending it again cannot help).

The types it takes and returns live in :mod:`mcp_lossless.core.actions`. Each stream (one POST and its
resumptions) is in one of three states; every state change goes through ``_enter`` and every new
connection through ``_new_link``, and each of the two bumps the stream's ``epoch``, so that whatever a
superseded :class:`Link` still reports is ignored::

                 begin, begin_batch, a re-issue or a split (epoch 0)
                               │
                               ▼
      a resume  ┌──────────────────────┐  refused delivery, HTTP 401/403   ┌────────────────────┐
   (_new_link)  │         LIVE         │ ────────────────────────────────▶ │       REAUTH       │
        ┌─────▶ │ a connection is open │        (_enter: REAUTH)           │ waiting for grant  │
        └────── │  or being opened     │ ◀──────────────────────────────── │                    │
                └──────────────────────┘   reauthorized: resume or send    └────────────────────┘
                               │            again (_new_link)                         │
                               │ its last call resolved,          its last call resolved or given
                               │ re-issued or split away          up (reauthorization_failed: each
                               ▼ (_enter: CLOSED)                 re-issued, split or failed) │
                ┌──────────────────────┐                                              │
                │        CLOSED        │ ◀────────────────────────────────────────────┘
                │  forgotten at once   │
                └──────────────────────┘
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

import orjson

from .actions import (
    Action,
    Answered,
    CallKey,
    CallOutcome,
    CallSpec,
    CancelOnServer,
    CloseStream,
    Failure,
    FailureKind,
    Incoming,
    Link,
    Progress,
    Reauthorize,
    RecoveryPolicy,
    Report,
    Resolve,
    Resume,
    SendBatch,
    SendCall,
    StreamKey,
)
from .denials import remedy
from .errors import DELIVERY_REFUSED, EXECUTION_LOST, IDEMPOTENCY_IN_PROGRESS
from .idempotency import KEY_PARAM
from .sse import SseEvent

# ---- state -----------------------------------------------------------------------------------------


class _State(Enum):
    LIVE = "live"
    """A connection is open or being opened."""
    REAUTH = "reauth"
    """Waiting for a fresh grant before resuming."""
    CLOSED = "closed"
    """No call rides on it any more; the ledger has forgotten it."""


@dataclass(slots=True)
class _Call:
    key: CallKey
    spec: CallSpec
    wire_id: str | int
    stream: StreamKey
    reissues: int = 0
    refused: bool = False
    last_progress: float | None = None


@dataclass(slots=True)
class _Stream:
    key: StreamKey
    calls: set[CallKey]
    epoch: int = 0
    cursor: str | None = None
    seen: set[str] = field(default_factory=set)
    link_id: str | None = None
    """The id buffer before the last event on the current connection (tells new id lines apart)."""
    fresh: bool = False
    fruitless: int = 0
    reauths: int = 0
    retry_ms: int | None = None
    required: set[str] = field(default_factory=set)
    required_scopes: set[str] = field(default_factory=set)
    violations: list[str] = field(default_factory=list)
    state: _State = _State.LIVE


class Ledger:
    """All pending calls of one client session, and the streams they ride on."""

    def __init__(self, id_prefix: str, policy: RecoveryPolicy | None = None) -> None:
        """``id_prefix`` should be unguessable: wire ids then never collide with another client's."""
        self._prefix = id_prefix
        self.policy = policy or RecoveryPolicy()
        self._next_id = 0
        self._next_key = 0
        self._next_stream = 0
        self._calls: dict[CallKey, _Call] = {}
        self._by_wire: dict[str | int, CallKey] = {}
        self._streams: dict[StreamKey, _Stream] = {}

    # ---- queries ------------------------------------------------------------------------------------

    def pending(self) -> tuple[CallKey, ...]:
        return tuple(self._calls)

    def cursor(self, stream: StreamKey) -> str | None:
        return self._streams[stream].cursor if stream in self._streams else None

    def calls_on(self, stream: StreamKey) -> frozenset[CallKey]:
        """The pending calls riding on ``stream`` (where a notification it carried belongs)."""
        record = self._streams.get(stream)
        return frozenset(record.calls) if record is not None else frozenset()

    def is_current(self, link: Link) -> bool:
        record = self._streams.get(link.stream)
        return record is not None and record.state is _State.LIVE and record.epoch == link.epoch

    # ---- starting calls -----------------------------------------------------------------------------

    def begin(self, spec: CallSpec) -> tuple[CallKey, list[Action]]:
        """Register a call and return the :class:`SendCall` that puts it on the wire."""
        key = self._next_key
        self._next_key += 1
        wire = self._new_wire_id()
        stream = self._new_stream(key)
        call = _Call(key, spec, wire, stream.key)
        self._calls[key] = call
        self._by_wire[wire] = key
        return key, [SendCall(self._link(stream), key, self._message(call), spec.resources, "new call")]

    def begin_batch(self, specs: Sequence[CallSpec]) -> tuple[list[CallKey], list[Action]]:
        """Register several calls on one stream and return the :class:`SendBatch` that sends them together.

        The stream's token must cover the union of their resources; if no authorization server will mint
        one, the calls are split (see :meth:`reauthorization_failed`).
        """
        if not specs:
            raise ValueError("a batch needs at least one call")
        keys = list(range(self._next_key, self._next_key + len(specs)))
        self._next_key += len(specs)
        stream = self._new_stream(*keys)
        for key, spec in zip(keys, specs, strict=True):
            wire = self._new_wire_id()
            self._calls[key] = _Call(key, spec, wire, stream.key)
            self._by_wire[wire] = key
        return keys, [self._send_all(stream, self._link(stream), "new batch")]

    # ---- what arrived -------------------------------------------------------------------------------

    def received(
        self, link: Link, events: Sequence[SseEvent], last_event_id: str | None, reconnection_ms: int | None = None
    ) -> list[Action]:
        """Events decoded from ``link``; ``last_event_id`` and ``reconnection_ms`` are the decoder's id and
        ``retry:`` after them: the server's reconnection time is the wait before the next resume (the spec's
        client MUST respect it), sent in an event's block or in a block of its own."""
        stream = self._live(link)
        if stream is None:
            return [Report(link.stream, "stale_events", f"{len(events)} event(s) from a superseded connection")]
        if reconnection_ms is not None:
            stream.retry_ms = reconnection_ms
        out: list[Action] = []
        for event in events:
            if not self._note_id(stream, event.id, out):
                continue
            if event.event != "message":
                self._violation(stream, f"unknown SSE event type {event.event!r}", out)
                continue
            if event.data:
                out += self._messages(stream, event.data.encode())
            if stream.state is not _State.LIVE:
                break
        if stream.state is _State.LIVE and last_event_id is not None:
            self._note_id(stream, last_event_id, out)
        return out

    def json_body(self, link: Link, body: bytes) -> list[Action]:
        """A POST answered with ``application/json``: the body must hold the response, and only once."""
        stream = self._live(link)
        if stream is None:
            return [Report(link.stream, "stale_events", "JSON body from a superseded connection")]
        out = self._messages(stream, body)
        if stream.state is _State.LIVE and stream.calls:
            out += self._recover(stream, FailureKind.PROTOCOL, "the JSON response did not answer the request")
        return out

    def ended(self, link: Link, detail: str) -> list[Action]:
        """The SSE body of ``link`` ended (cleanly or not). Never completion: resume or recover."""
        stream = self._live(link)
        if stream is None:
            return []
        refused = [c for c in self._calls_on(stream) if c.refused]
        if refused:
            return self._ask_reauthorization(stream, f"stream ended after refusing delivery ({detail})")
        if not stream.calls:
            return []
        if stream.cursor is None:
            kind = FailureKind.PROTOCOL if stream.violations else FailureKind.MAY_HAVE_RUN
            return self._recover(stream, kind, f"stream ended before any event id, cannot resume ({detail})")
        stream.fruitless = 0 if stream.fresh else stream.fruitless + 1
        if stream.fruitless >= self.policy.max_fruitless_reconnects:
            kind = FailureKind.PROTOCOL if stream.violations else FailureKind.MAY_HAVE_RUN
            why = f"stream ended {stream.fruitless} times in a row without a new event"
            if stream.violations:
                why += "; " + "; ".join(dict.fromkeys(stream.violations))
            return self._recover(stream, kind, why)
        return [self._resume(stream, f"stream ended without a response ({detail})")]

    def accepted(self, link: Link) -> list[Action]:
        """HTTP 202 to a request: the server will never answer on this stream."""
        stream = self._live(link)
        if stream is None:
            return []
        return self._recover(stream, FailureKind.PROTOCOL, "the server answered a request with 202 Accepted")

    # ---- what went wrong at the HTTP level ----------------------------------------------------------

    def not_sent(self, link: Link, detail: str) -> list[Action]:
        """The POST never reached the server (connection refused, DNS): safe to send again."""
        stream = self._live(link)
        if stream is None:
            return []
        out: list[Action] = []
        for call in self._calls_on(stream):
            if call.reissues < self.policy.max_reissues:
                out += self._reissue(call, stream, f"request not sent ({detail}); sending it again")
            else:
                out += self._fail(call, FailureKind.NOT_SENT, f"request not sent: {detail}")
        return out

    def lost(self, link: Link, detail: str) -> list[Action]:
        """The connection broke before any response: resume if there is a cursor, else recover."""
        stream = self._live(link)
        if stream is None:
            return []
        if stream.cursor is not None:
            return self.ended(link, detail)
        return self._recover(stream, FailureKind.MAY_HAVE_RUN, f"connection lost before a response ({detail})")

    def unauthorized(
        self, link: Link, required: Iterable[str], detail: str, scopes: Iterable[str] = ()
    ) -> list[Action]:
        """HTTP 401/403 on a POST or a resume: the token must be replaced before anything else."""
        stream = self._live(link)
        if stream is None:
            return []
        stream.required.update(required)
        stream.required_scopes.update(scopes)
        return self._ask_reauthorization(stream, detail)

    def cursor_rejected(self, link: Link, detail: str) -> list[Action]:
        """The server cannot resume from our cursor (unknown, evicted, foreign, no GET support)."""
        stream = self._live(link)
        if stream is None:
            return []
        return self._recover(stream, FailureKind.MAY_HAVE_RUN, f"resume refused: {detail}")

    def rejected(self, link: Link, detail: str) -> list[Action]:
        """The server refused the request itself (HTTP 4xx): it did not run, and sending it again won't help."""
        stream = self._live(link)
        if stream is None:
            return []
        out: list[Action] = []
        for call in self._calls_on(stream):
            out += self._fail(call, FailureKind.REJECTED, detail)
        return out

    def server_failed(self, link: Link, detail: str) -> list[Action]:
        """HTTP 5xx. On a resume it is one more fruitless try; on a POST the call may have run."""
        stream = self._live(link)
        if stream is None:
            return []
        if stream.cursor is not None:
            return self.ended(link, detail)
        return self._recover(stream, FailureKind.MAY_HAVE_RUN, f"server error before a response: {detail}")

    def session_lost(self, detail: str, refused: Link | None = None) -> list[Action]:
        """The session is gone (HTTP 404): recover every pending call.

        ``refused`` is the connection whose request the 404 answered: that request was not processed, so
        its calls are sent again like :meth:`not_sent`. Sends wait, in the adapter, for the new session.
        """
        others = [s for s in self._streams.values() if s.calls and (refused is None or s.key != refused.stream)]
        out: list[Action] = []
        if refused is not None and self._live(refused) is not None:
            out += self.not_sent(refused, f"session lost: {detail}")
        for stream in others:
            out += self._recover(stream, FailureKind.SESSION_LOST, f"session lost: {detail}")
        return out

    def session_failed(self, detail: str) -> list[Action]:
        """No new session could be started: every pending call ends as session-lost."""
        out: list[Action] = []
        for key in list(self._calls):
            out += self._fail(self._calls[key], FailureKind.SESSION_LOST, detail)
        return out

    # ---- re-authorization ---------------------------------------------------------------------------

    def reauthorized(self, stream_key: StreamKey) -> list[Action]:
        """A fresh grant covers the stream: resume from the same cursor (or re-send an unanswered POST)."""
        stream = self._streams.get(stream_key)
        if stream is None or stream.state is not _State.REAUTH:
            return []
        stream.required.clear()
        stream.required_scopes.clear()
        for call in self._calls_on(stream):
            call.refused = False
        if stream.cursor is not None:
            return [self._resume(stream, "re-authorized; resuming from the same cursor")]
        return [self._send_all(stream, self._new_link(stream), "re-authorized; sending again")]

    def reauthorization_failed(self, stream_key: StreamKey, detail: str) -> list[Action]:
        """No grant covers the stream: abandon it; re-issue each call with its own token, or fail it."""
        stream = self._streams.get(stream_key)
        if stream is None or stream.state is not _State.REAUTH:
            return []
        if stream.cursor is None and len(stream.calls) > 1:
            return self._split(stream, f"no token covers the whole batch ({detail}); sending each call on its own")
        if stream.cursor is None:
            out: list[Action] = []
            for call in self._calls_on(stream):
                out += self._fail(call, FailureKind.AUTHORIZATION, detail)
            return out
        return self._recover(stream, FailureKind.MAY_HAVE_RUN, f"re-authorization failed: {detail}")

    # ---- the caller gives up ------------------------------------------------------------------------

    def expire(self, call: CallKey) -> list[Action]:
        return self._give_up(call, FailureKind.DEADLINE, "deadline exceeded")

    def cancel(self, call: CallKey, reason: str) -> list[Action]:
        return self._give_up(call, FailureKind.CANCELLED, reason)

    def _give_up(self, key: CallKey, kind: FailureKind, reason: str) -> list[Action]:
        call = self._calls.get(key)
        if call is None:
            return []
        return [CancelOnServer(call.wire_id, reason), *self._fail(call, kind, reason)]

    # ---- internals: messages ------------------------------------------------------------------------

    def _messages(self, stream: _Stream, raw: bytes) -> list[Action]:
        try:
            parsed = orjson.loads(raw)
        except orjson.JSONDecodeError:
            out: list[Action] = []
            self._violation(stream, "a frame that is not JSON", out)
            return out
        items = parsed if isinstance(parsed, list) else [parsed]
        out = []
        for item in items:
            if stream.state is not _State.LIVE:
                break
            if isinstance(item, dict):
                out += self._message_in(stream, item)
            else:
                self._violation(stream, "a JSON value that is not a JSON-RPC message", out)
        return out

    def _message_in(self, stream: _Stream, msg: dict[str, Any]) -> list[Action]:
        if "method" in msg:
            if msg.get("method") == "notifications/progress" and "id" not in msg:
                return self._progress(stream, msg)
            return [Incoming(stream.key, msg)]
        if "id" in msg and ("result" in msg or "error" in msg):
            return self._response(stream, msg)
        out: list[Action] = []
        self._violation(stream, "a JSON object that is not a JSON-RPC message", out)
        return out

    def _response(self, stream: _Stream, msg: dict[str, Any]) -> list[Action]:
        wire = msg["id"]
        key = self._by_wire.get(wire) if isinstance(wire, str | int) else None
        call = self._calls.get(key) if key is not None else None
        if call is None or call.stream != stream.key:
            where = "not pending" if call is None else "pending on another stream"
            out: list[Action] = [Report(stream.key, "foreign_response", f"dropped a response for id {wire!r}: {where}")]
            stream.violations.append("a response for an id that is not pending on this stream")
            return out
        error = msg.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            data = error.get("data")
            resumable = isinstance(data, dict) and data.get("resumable") is True
            if code == DELIVERY_REFUSED and resumable and isinstance(data, dict):
                return self._refused(stream, call, data)
            keyed = call.spec.idempotency_key is not None
            if code == IDEMPOTENCY_IN_PROGRESS and keyed and isinstance(data, dict):
                return self._in_progress(stream, call, data.get("retryAfter"))
            if code == EXECUTION_LOST:
                reason = f"the server lost the execution of {wire!r}: {error.get('message', '')}"
                if keyed and isinstance(data, dict) and data.get(KEY_PARAM) == call.spec.idempotency_key:
                    # The key is never run again. A tool safe to run twice is tried once more as a new operation,
                    # under a new key (the SEP's way to ask again); any other ends here, as may-have-run.
                    if not self._may_run_again(call):
                        return self._fail(call, FailureKind.MAY_HAVE_RUN, f"{reason}; the key is not run again", error)
                    self._rekey(call)
                return self._recover_calls(stream, [call], FailureKind.MAY_HAVE_RUN, reason, error)
        return self._resolve(call, Answered(msg))

    def _in_progress(self, stream: _Stream, call: _Call, retry_after: object) -> list[Action]:
        """The key's first use still runs: the same key again after ``retryAfter`` (the server's wait, in seconds),
        on a stream of its own; not a failure, so it counts as a re-issue only against the keyed bound."""
        seconds = retry_after if isinstance(retry_after, int | float) and not isinstance(retry_after, bool) else 1
        if call.reissues >= self.policy.max_keyed_reissues:
            return self._fail(call, FailureKind.MAY_HAVE_RUN, "the key's first use was still running at the last try")
        return self._reissue(call, stream, "the key's first use is still running", max(0, int(seconds * 1000)))

    def _refused(self, stream: _Stream, call: _Call, data: Mapping[str, Any]) -> list[Action]:
        if stream.cursor is None:
            # Refused before any event id (no priming below 2025-11-25): the request ran, and there is no
            # cursor to resume it from, so sending it again under its id would be a duplicate request.
            reason = f"delivery refused before any event id ({data.get('reason', 'refused')}), cannot resume"
            return self._recover_calls(stream, [call], FailureKind.MAY_HAVE_RUN, reason)
        helps = remedy(data)  # the SEP-2643 envelope where the server sent one, our own fields where not
        if helps.reauthorize is False:
            reason = f"delivery refused at event {data.get('eventId')!r}; the server says re-authorizing cannot help"
            return self._fail(call, FailureKind.AUTHORIZATION, reason)
        call.refused = True
        stream.required.update(helps.resources)
        stream.required_scopes.update(helps.scopes)
        out: list[Action] = []
        theirs = data.get("lastEventId")
        if theirs is not None and theirs != stream.cursor:
            out.append(
                Report(stream.key, "cursor_mismatch", f"server says last event {theirs!r}, we hold {stream.cursor!r}")
            )
        if all(c.refused for c in self._calls_on(stream)):
            out += self._ask_reauthorization(stream, f"delivery refused at event {data.get('eventId')!r}")
        return out

    def _progress(self, stream: _Stream, msg: dict[str, Any]) -> list[Action]:
        params = msg.get("params")
        params = params if isinstance(params, dict) else {}
        token = params.get("progressToken")
        value = params.get("progress")
        key = self._by_wire.get(token) if isinstance(token, str | int) else None
        call = self._calls.get(key) if key is not None else None
        if call is None or call.stream != stream.key:
            return [Report(stream.key, "foreign_progress", f"dropped progress for token {token!r}")]
        if not isinstance(value, int | float) or isinstance(value, bool):
            return [Report(stream.key, "bad_progress", f"dropped progress without a number for {token!r}")]
        if call.last_progress is not None and value <= call.last_progress:
            return [Report(stream.key, "duplicate_progress", f"progress {value} for {token!r} already delivered")]
        call.last_progress = value
        total = params.get("total")
        text = params.get("message")
        return [
            Progress(
                call.key,
                float(value),
                float(total) if isinstance(total, int | float) and not isinstance(total, bool) else None,
                text if isinstance(text, str) else None,
            )
        ]

    # ---- internals: streams and recovery ------------------------------------------------------------

    def _note_id(self, stream: _Stream, event_id: str | None, out: list[Action]) -> bool:
        """Record an event id; ``False`` if it marks an event delivered before (skip the event)."""
        if event_id is None or event_id == stream.link_id:
            return True
        stream.link_id = event_id
        if event_id in stream.seen:
            out.append(Report(stream.key, "duplicate_event", f"event {event_id!r} was delivered before"))
            return False
        stream.seen.add(event_id)
        stream.cursor = event_id
        stream.fresh = True
        stream.reauths = 0  # a grant that let new events through worked; only repeated failures count
        return True

    def _violation(self, stream: _Stream, what: str, out: list[Action]) -> None:
        stream.violations.append(what)
        out.append(Report(stream.key, "protocol_violation", f"dropped {what}"))

    def _ask_reauthorization(self, stream: _Stream, why: str) -> list[Action]:
        if stream.reauths >= self.policy.max_reauthorizations:
            why = f"{why}; gave up after {stream.reauths} re-authorizations"
            if stream.cursor is not None:
                return self._recover(stream, FailureKind.MAY_HAVE_RUN, why)
            # Not re-issued, idempotent or not: a new id would meet the same refusal and start the count
            # of authorizations over (MCP: clients limit scope step-up retries).
            return [a for call in self._calls_on(stream) for a in self._fail(call, FailureKind.AUTHORIZATION, why)]
        stream.reauths += 1
        self._enter(stream, _State.REAUTH)
        resources = frozenset(stream.required).union(*(c.spec.resources for c in self._calls_on(stream)))
        scopes = frozenset(stream.required_scopes)
        return [CloseStream(stream.key, why), Reauthorize(stream.key, resources, stream.cursor, why, scopes)]

    def _resume(self, stream: _Stream, why: str) -> Resume:
        assert stream.cursor is not None
        link = self._new_link(stream)
        resources = frozenset[str]().union(*(c.spec.resources for c in self._calls_on(stream)))
        return Resume(link, stream.cursor, stream.fruitless, stream.retry_ms, resources, why)

    def _recover(
        self, stream: _Stream, kind: FailureKind, reason: str, error: Mapping[str, Any] | None = None
    ) -> list[Action]:
        return self._recover_calls(stream, self._calls_on(stream), kind, reason, error)

    def _recover_calls(
        self,
        stream: _Stream,
        calls: Sequence[_Call],
        kind: FailureKind,
        reason: str,
        error: Mapping[str, Any] | None = None,
    ) -> list[Action]:
        """Abandon ``calls`` on ``stream``: re-issue those the policy allows, fail the others."""
        out: list[Action] = []
        for call in calls:
            if self._may_reissue(call):
                same = " under the same idempotency key" if call.spec.idempotency_key is not None else ""
                out += self._reissue(call, stream, f"{reason}; re-issuing with a new id{same}")
            else:
                why = reason
                if kind in (FailureKind.MAY_HAVE_RUN, FailureKind.SESSION_LOST):
                    why = f"{reason}; the tool may have run and its result was not received"
                out += self._fail(call, kind, why, error)
        return out

    def _may_reissue(self, call: _Call) -> bool:
        """Whether ``call`` may be sent again: under its key, always (the server runs a key once), within the keyed
        bound; without one, only a tool safe to run twice (idempotent, or the caller opted in)."""
        if call.spec.idempotency_key is not None and call.spec.reissue is not False:
            return call.reissues < self.policy.max_keyed_reissues
        if call.reissues >= self.policy.max_reissues:
            return False
        if call.spec.reissue is not None:
            return call.spec.reissue
        return call.spec.idempotent and self.policy.reissue_idempotent

    def _may_run_again(self, call: _Call) -> bool:
        """Whether a keyed call whose key's execution was lost may run again as a new operation (a new key): only a
        tool safe to run twice (idempotent, or the caller opted in). Its re-issues so far were under a key, each
        safe whatever its count, so the keyed bound applies, not the bound of re-issues without a key."""
        if call.reissues >= self.policy.max_keyed_reissues:
            return False
        if call.spec.reissue is not None:
            return call.spec.reissue
        return call.spec.idempotent and self.policy.reissue_idempotent

    def _reissue(self, call: _Call, old: _Stream, why: str, retry_ms: int | None = None) -> list[Action]:
        old_wire = call.wire_id
        self._detach(call, old)
        del self._by_wire[old_wire]
        call.wire_id = self._new_wire_id()
        call.reissues += 1
        call.refused = False
        call.last_progress = None
        stream = self._new_stream(call.key)
        call.stream = stream.key
        self._by_wire[call.wire_id] = call.key
        # A keyed call's re-issue is to reach the same execution (its outcome, or "in progress"): cancelling the
        # old id would cancel that execution and make "cancelled" the outcome the key replays.
        keyed = call.spec.idempotency_key is not None
        out: list[Action] = [] if keyed else [CancelOnServer(old_wire, "re-issued under a new id")]
        if old.state is _State.CLOSED:
            out.append(CloseStream(old.key, why))
        message = self._message(call)
        link = self._link(stream)
        out.append(SendCall(link, call.key, message, call.spec.resources, why, old_wire, call.reissues, retry_ms))
        return out

    @staticmethod
    def _rekey(call: _Call) -> None:
        """A new key for ``call``, derived from its first (still unique to the caller): a new logical operation."""
        first = call.spec.idempotency_key
        assert first is not None
        key = f"{first}.{call.reissues + 1}"
        call.spec = replace(call.spec, params={**call.spec.params, KEY_PARAM: key}, idempotency_key=key)

    def _split(self, old: _Stream, why: str) -> list[Action]:
        """Send each call of a batch the server never processed on a stream of its own, under the same id."""
        out: list[Action] = []
        for call in self._calls_on(old):
            self._detach(call, old)
            stream = self._new_stream(call.key)
            call.stream = stream.key
            out.append(SendCall(self._link(stream), call.key, self._message(call), call.spec.resources, why))
        return [CloseStream(old.key, why), *out]

    def _send_all(self, stream: _Stream, link: Link, why: str) -> SendCall | SendBatch:
        """Put every call of a stream that has not reached the server (yet) on the wire: one POST on ``link``."""
        calls = self._calls_on(stream)
        if len(calls) == 1:
            (call,) = calls
            return SendCall(link, call.key, self._message(call), call.spec.resources, why)
        resources = frozenset[str]().union(*(c.spec.resources for c in calls))
        return SendBatch(link, tuple(c.key for c in calls), tuple(self._message(c) for c in calls), resources, why)

    def _fail(
        self, call: _Call, kind: FailureKind, reason: str, error: Mapping[str, Any] | None = None
    ) -> list[Action]:
        return self._resolve(call, Failure(kind, reason, error))

    def _resolve(self, call: _Call, outcome: CallOutcome) -> list[Action]:
        stream = self._streams[call.stream]
        self._detach(call, stream)
        del self._calls[call.key]
        del self._by_wire[call.wire_id]
        out: list[Action] = [Resolve(call.key, call.wire_id, outcome)]
        if stream.state is _State.CLOSED:
            out.append(CloseStream(stream.key, "every call on it is resolved"))
        return out

    def _detach(self, call: _Call, stream: _Stream) -> None:
        stream.calls.discard(call.key)
        if not stream.calls:
            self._enter(stream, _State.CLOSED)
            del self._streams[stream.key]

    # ---- internals: the only places a stream's state or epoch changes -------------------------------

    @staticmethod
    def _enter(stream: _Stream, state: _State) -> None:
        """Leave LIVE (for REAUTH or CLOSED): the current connection, if any, is superseded."""
        stream.state = state
        stream.epoch += 1

    @staticmethod
    def _new_link(stream: _Stream) -> Link:
        """A new connection of ``stream`` (a resume, or a re-send after re-authorization): LIVE again.

        Every older link becomes stale, and the per-connection bookkeeping starts over.
        """
        stream.state = _State.LIVE
        stream.epoch += 1
        stream.link_id = None
        stream.fresh = False
        return Link(stream.key, stream.epoch)

    @staticmethod
    def _link(stream: _Stream) -> Link:
        """The stream's current connection, for the first POST on a new stream."""
        return Link(stream.key, stream.epoch)

    def _live(self, link: Link) -> _Stream | None:
        stream = self._streams.get(link.stream)
        if stream is None or stream.state is not _State.LIVE or stream.epoch != link.epoch:
            return None
        return stream

    def _calls_on(self, stream: _Stream) -> list[_Call]:
        return [self._calls[k] for k in sorted(stream.calls)]

    def _new_stream(self, *calls: CallKey) -> _Stream:
        stream = _Stream(self._next_stream, set(calls))
        self._next_stream += 1
        self._streams[stream.key] = stream
        return stream

    def _new_wire_id(self) -> str:
        self._next_id += 1
        return f"{self._prefix}-{self._next_id}"

    def _message(self, call: _Call) -> dict[str, Any]:
        params = dict(call.spec.params)
        if call.spec.progress:
            meta = dict(params.get("_meta") or {})
            meta["progressToken"] = call.wire_id
            params["_meta"] = meta
        return {"jsonrpc": "2.0", "id": call.wire_id, "method": call.spec.method, "params": params}
