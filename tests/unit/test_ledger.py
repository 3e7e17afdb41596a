"""The pending-call ledger: one terminal outcome per call, never a foreign result, never a duplicate."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcp_lossless.core.actions import (
    Action,
    Answered,
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
    SendCall,
)
from mcp_lossless.core.errors import DELIVERY_REFUSED, EXECUTION_LOST
from mcp_lossless.core.ledger import Ledger
from mcp_lossless.core.sse import SseEvent

FETCH = "https://mcp.example.com/tools/fetch"
SEARCH = "https://mcp.example.com/tools/search"


def call_spec(idempotent: bool = False, reissue: bool | None = None) -> CallSpec:
    return CallSpec(
        "tools/call",
        {"name": "fetch", "arguments": {"url": "u"}},
        frozenset({FETCH}),
        idempotent=idempotent,
        reissue=reissue,
        progress=True,
    )


def start(ledger: Ledger, spec: CallSpec | None = None) -> tuple[int, SendCall]:
    key, actions = ledger.begin(spec or call_spec())
    (send,) = actions
    assert isinstance(send, SendCall)
    return key, send


def ev(event_id: str | None, message: dict[str, Any] | None, event: str = "message") -> SseEvent:
    return SseEvent(event, "" if message is None else orjson.dumps(message).decode(), event_id)


def progress(token: object, value: float) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": token, "progress": value}}


def result(wire: object, text: str = "ok") -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": wire, "result": {"content": [{"type": "text", "text": text}]}}


def error(wire: object, code: int, data: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": wire, "error": {"code": code, "message": "m", "data": data}}


def refusal(cursor: str | None) -> dict[str, Any]:
    return {"reason": "insufficient_audience", "eventId": "e9", "requiredResources": [FETCH], "lastEventId": cursor,
            "resumable": True}  # fmt: skip


def only(actions: list[Action], kind: type[Any]) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


def test_wire_ids_are_prefixed_and_double_as_progress_tokens() -> None:
    ledger = Ledger("k3y")
    _, send = start(ledger)
    wire = send.message["id"]
    assert wire == "k3y-1"
    assert send.message["params"]["_meta"]["progressToken"] == wire
    assert send.message["method"] == "tools/call"
    assert send.resources == frozenset({FETCH})


def test_happy_path_progress_then_result() -> None:
    ledger = Ledger("p")
    key, send = start(ledger)
    wire = send.message["id"]
    actions = ledger.received(
        send.link, [ev("e0", None), ev("e1", progress(wire, 1)), ev("e2", progress(wire, 2)), ev("e3", result(wire))],
        "e3",
    )  # fmt: skip
    assert only(actions, Progress) == [Progress(key, 1.0, None, None), Progress(key, 2.0, None, None)]
    (resolve,) = only(actions, Resolve)
    assert resolve == Resolve(key, wire, Answered(result(wire)))
    assert only(actions, CloseStream)
    assert ledger.pending() == ()
    assert ledger.ended(send.link, "server closed") == []


def test_drop_resumes_from_last_received_id_priming_included() -> None:
    ledger = Ledger("p")
    _, send = start(ledger)
    retry_priming = SseEvent("message", "", "prime-1")
    assert ledger.received(send.link, [retry_priming], "prime-1", 500) == []
    (resume,) = ledger.ended(send.link, "connection reset")
    assert isinstance(resume, Resume)
    assert resume.cursor == "prime-1"
    assert resume.retry_ms == 500
    assert resume.attempt == 0
    assert resume.link.stream == send.link.stream
    assert resume.link.epoch > send.link.epoch


def test_id_only_dispatch_moves_the_cursor() -> None:
    ledger = Ledger("p")
    _, send = start(ledger)
    ledger.received(send.link, [], "only-id")
    (resume,) = ledger.ended(send.link, "closed")
    assert isinstance(resume, Resume)
    assert resume.cursor == "only-id"


def test_duplicates_after_resume_are_not_delivered_twice() -> None:
    ledger = Ledger("p")
    key, send = start(ledger)
    wire = send.message["id"]
    ledger.received(send.link, [ev("e0", None), ev("e1", progress(wire, 1))], "e1")
    (resume,) = ledger.ended(send.link, "drop")
    assert isinstance(resume, Resume)
    # A server that replays too much: e1 again (same event id), then progress 1 again with no id line.
    replay = [ev("e1", progress(wire, 1)), ev("e1", progress(wire, 1)), ev("e2", progress(wire, 2))]
    actions = ledger.received(resume.link, replay, "e2")
    assert only(actions, Progress) == [Progress(key, 2.0, None, None)]
    reports = {r.what for r in only(actions, Report)}
    assert reports == {"duplicate_event", "duplicate_progress"}


def test_foreign_response_is_dropped_and_reported_never_relabelled() -> None:
    ledger = Ledger("p")
    key, send = start(ledger)
    wire = send.message["id"]
    actions = ledger.received(send.link, [ev("e1", result("someone-else", "SECRET")), ev("e2", result(2, "x"))], "e2")
    assert only(actions, Resolve) == []
    assert [r.what for r in only(actions, Report)] == ["foreign_response", "foreign_response"]
    assert ledger.pending() == (key,)
    actions = ledger.received(send.link, [ev("e3", result(wire, "mine"))], "e3")
    assert only(actions, Resolve) == [Resolve(key, wire, Answered(result(wire, "mine")))]


def test_response_on_another_calls_stream_is_dropped() -> None:
    ledger = Ledger("p")
    key_a, send_a = start(ledger)
    key_b, send_b = start(ledger)
    wire_b = send_b.message["id"]
    actions = ledger.received(send_a.link, [ev("a1", result(wire_b))], "a1")
    assert only(actions, Resolve) == []
    assert set(ledger.pending()) == {key_a, key_b}


def test_second_response_for_a_resolved_id_is_dropped() -> None:
    ledger = Ledger("p")
    key, send = start(ledger)
    wire = send.message["id"]
    first = ledger.received(send.link, [ev("e1", result(wire, "one")), ev("e2", result(wire, "two"))], "e2")
    assert only(first, Resolve) == [Resolve(key, wire, Answered(result(wire, "one")))]


def test_stream_end_without_cursor_is_not_completion() -> None:
    ledger = Ledger("p")
    _key, send = start(ledger)
    actions = ledger.ended(send.link, "closed")
    (resolve,) = only(actions, Resolve)
    assert only(actions, CloseStream)
    assert isinstance(resolve.outcome, Failure)
    assert resolve.outcome.kind is FailureKind.MAY_HAVE_RUN
    assert "may have run" in resolve.outcome.reason


def test_fruitless_reconnects_are_bounded() -> None:
    ledger = Ledger("p", RecoveryPolicy(max_fruitless_reconnects=3))
    _key, send = start(ledger)
    ledger.received(send.link, [ev("e0", None)], "e0")
    actions = ledger.ended(send.link, "close")
    attempts = []
    while True:
        action = actions[0]
        if isinstance(action, Resolve):
            break
        assert isinstance(action, Resume)
        attempts.append(action.attempt)
        actions = ledger.ended(action.link, "empty 200")
    assert attempts == [0, 1, 2]
    assert isinstance(action.outcome, Failure)
    assert action.outcome.kind is FailureKind.MAY_HAVE_RUN


def test_new_events_reset_the_fruitless_count() -> None:
    ledger = Ledger("p", RecoveryPolicy(max_fruitless_reconnects=2))
    _, send = start(ledger)
    link = send.link
    for n in range(6):
        ledger.received(link, [ev(f"e{n}", None)], f"e{n}")
        (resume,) = ledger.ended(link, "poll")
        assert isinstance(resume, Resume)
        assert resume.attempt == 0
        link = resume.link


def test_unknown_event_types_end_in_a_protocol_error() -> None:
    ledger = Ledger("p", RecoveryPolicy(max_fruitless_reconnects=2))
    _key, send = start(ledger)
    actions = ledger.received(send.link, [ev("e0", None), ev(None, {"x": 1}, event="error")], "e0")
    assert [r.what for r in only(actions, Report)] == ["protocol_violation"]
    link = send.link
    while True:
        action = ledger.ended(link, "closed")[0]
        if isinstance(action, Resolve):
            break
        assert isinstance(action, Resume)
        link = action.link
        ledger.received(link, [ev(None, {"x": 1}, event="error")], None)
    assert isinstance(action.outcome, Failure)
    assert action.outcome.kind is FailureKind.PROTOCOL
    assert "unknown SSE event type 'error'" in action.outcome.reason


def test_non_json_frame_is_a_violation_not_a_crash() -> None:
    ledger = Ledger("p")
    _, send = start(ledger)
    actions = ledger.received(send.link, [SseEvent("message", "{not json", "e1")], "e1")
    assert [r.what for r in only(actions, Report)] == ["protocol_violation"]


def test_delivery_refused_is_not_terminal_reauthorize_then_resume_same_cursor() -> None:
    ledger = Ledger("p")
    key, send = start(ledger)
    wire = send.message["id"]
    ledger.received(send.link, [ev("e0", None), ev("e1", progress(wire, 1))], "e1")
    notice = {"jsonrpc": "2.0", "method": "notifications/message",
              "params": {"level": "error", "logger": "mcp-lossless", "data": refusal("e1")}}  # fmt: skip
    # No id lines on refusal frames: the decoder's id buffer still says e1.
    actions = ledger.received(
        send.link, [ev("e1", notice), ev("e1", error(wire, DELIVERY_REFUSED, refusal("e1")))], "e1"
    )
    assert only(actions, Resolve) == []
    assert len(only(actions, Incoming)) == 1
    (reauth,) = only(actions, Reauthorize)
    assert reauth.resources == frozenset({FETCH})
    assert reauth.cursor == "e1"
    assert only(actions, CloseStream)
    assert ledger.ended(send.link, "stream ended") == []  # the old connection is superseded
    (resume,) = ledger.reauthorized(reauth.stream)
    assert isinstance(resume, Resume)
    assert resume.cursor == "e1"
    actions = ledger.received(resume.link, [ev("e2", progress(wire, 2)), ev("e3", result(wire))], "e3")
    assert only(actions, Resolve) == [Resolve(key, wire, Answered(result(wire)))]


def test_an_in_band_refusal_naming_scopes_asks_for_them_once_and_the_next_refusal_starts_afresh() -> None:
    """``requiredScopes`` of a DELIVERY_REFUSED reach the re-authorization (the client asks for the union); a
    fresh grant clears them, so a later refusal names only its own."""
    ledger = Ledger("p")
    _, send = start(ledger)
    wire = send.message["id"]
    ledger.received(send.link, [ev("e0", None), ev("e1", progress(wire, 1))], "e1")
    scoped = {**refusal("e1"), "requiredResources": [], "requiredScopes": ["files:read", "files:admin"]}
    (reauth,) = only(ledger.received(send.link, [ev("e1", error(wire, DELIVERY_REFUSED, scoped))], "e1"), Reauthorize)
    assert (reauth.scopes, reauth.resources) == (frozenset({"files:read", "files:admin"}), frozenset({FETCH}))
    (resume,) = ledger.reauthorized(reauth.stream)
    actions = ledger.received(resume.link, [ev("e2", progress(wire, 2))], "e2")
    assert only(actions, Reauthorize) == []
    actions = ledger.received(resume.link, [ev("e2", error(wire, DELIVERY_REFUSED, refusal("e2")))], "e2")
    (again,) = only(actions, Reauthorize)
    assert again.scopes == frozenset(), "the scopes of the repaired refusal are not asked for again"


def test_an_envelope_saying_no_grant_helps_ends_the_call_without_reauthorizing() -> None:
    """SEP-2643: where the envelope says ``remediation: unavailable``, no fresh grant is asked for; the call fails
    as an authorization failure (the envelope decides over our own fields)."""
    ledger = Ledger("p")
    key, send = start(ledger)
    wire = send.message["id"]
    ledger.received(send.link, [ev("e0", None), ev("e1", progress(wire, 1))], "e1")
    envelope = {"reason": "insufficient_authorization", "remediation": "unavailable"}
    actions = ledger.received(
        send.link, [ev("e1", error(wire, DELIVERY_REFUSED, {**refusal("e1"), "authorization": envelope}))], "e1"
    )
    assert only(actions, Reauthorize) == []
    (resolved,) = only(actions, Resolve)
    assert resolved.call == key
    assert isinstance(resolved.outcome, Failure) and resolved.outcome.kind is FailureKind.AUTHORIZATION


def test_refusal_without_resumable_is_an_ordinary_error() -> None:
    ledger = Ledger("p")
    key, send = start(ledger)
    wire = send.message["id"]
    message = error(wire, DELIVERY_REFUSED, {"resumable": False})
    actions = ledger.received(send.link, [ev("e1", message)], "e1")
    assert only(actions, Resolve) == [Resolve(key, wire, Answered(message))]


def test_failed_reauthorization_reissues_idempotent_calls_with_new_ids() -> None:
    ledger = Ledger("p")
    key, send = start(ledger, call_spec(idempotent=True))
    wire = send.message["id"]
    ledger.received(send.link, [ev("e1", error(wire, DELIVERY_REFUSED, refusal(None)))], "e1")
    actions = ledger.reauthorization_failed(send.link.stream, "invalid_target")
    (reissue,) = only(actions, SendCall)
    assert reissue.call == key
    assert reissue.reissue_of == wire
    assert reissue.message["id"] != wire
    assert reissue.message["params"]["_meta"]["progressToken"] == reissue.message["id"]
    assert reissue.resources == frozenset({FETCH})
    assert only(actions, CancelOnServer) == [CancelOnServer(wire, "re-issued under a new id")]
    # A late answer to the abandoned id is not the call's answer any more.
    late = ledger.received(reissue.link, [ev("r1", result(wire, "late"))], "r1")
    assert only(late, Resolve) == []
    new_wire = reissue.message["id"]
    done = ledger.received(reissue.link, [ev("r2", result(new_wire, "fresh"))], "r2")
    assert only(done, Resolve) == [Resolve(key, new_wire, Answered(result(new_wire, "fresh")))]


def test_failed_reauthorization_fails_non_idempotent_call_as_may_have_run() -> None:
    ledger = Ledger("p")
    _key, send = start(ledger)
    wire = send.message["id"]
    ledger.received(send.link, [ev("e1", error(wire, DELIVERY_REFUSED, refusal(None)))], "e1")
    (resolve, close) = ledger.reauthorization_failed(send.link.stream, "invalid_target")
    assert isinstance(resolve, Resolve)
    assert isinstance(resolve.outcome, Failure)
    assert resolve.outcome.kind is FailureKind.MAY_HAVE_RUN
    assert "invalid_target" in resolve.outcome.reason
    assert isinstance(close, CloseStream)


def test_caller_opt_in_and_opt_out_override_the_annotation() -> None:
    ledger = Ledger("p")
    _, send = start(ledger, call_spec(idempotent=False, reissue=True))
    assert only(ledger.ended(send.link, "closed"), SendCall)
    _, send = start(ledger, call_spec(idempotent=True, reissue=False))
    (resolve,) = only(ledger.ended(send.link, "closed"), Resolve)
    assert resolve.outcome.kind is FailureKind.MAY_HAVE_RUN
    ledger = Ledger("p", RecoveryPolicy(reissue_idempotent=False))
    _, send = start(ledger, call_spec(idempotent=True))
    assert only(ledger.ended(send.link, "closed"), Resolve)


def test_reissues_are_bounded() -> None:
    ledger = Ledger("p", RecoveryPolicy(max_reissues=2))
    _, send = start(ledger, call_spec(idempotent=True))
    sends = 0
    while True:
        actions = ledger.ended(send.link, "closed")
        next_send = only(actions, SendCall)
        if not next_send:
            break
        sends += 1
        send = next_send[0]
    assert sends == 2
    assert only(actions, Resolve)[0].outcome.kind is FailureKind.MAY_HAVE_RUN


def test_execution_lost_is_terminal_unless_reissued() -> None:
    ledger = Ledger("p")
    _, send = start(ledger)
    wire = send.message["id"]
    lost = error(wire, EXECUTION_LOST, {"resumable": False})
    (resolve,) = only(ledger.received(send.link, [ev("e1", lost)], "e1"), Resolve)
    assert isinstance(resolve.outcome, Failure)
    assert resolve.outcome.kind is FailureKind.MAY_HAVE_RUN
    assert resolve.outcome.error == lost["error"]
    _key, send = start(ledger, call_spec(idempotent=True))
    wire = send.message["id"]
    actions = ledger.received(send.link, [ev("f1", error(wire, EXECUTION_LOST))], "f1")
    assert only(actions, Resolve) == []
    assert only(actions, SendCall)[0].reissue_of == wire


def test_unauthorized_post_is_sent_again_with_the_same_id_after_reauthorization() -> None:
    ledger = Ledger("p")
    _key, send = start(ledger)
    actions = ledger.unauthorized(send.link, [SEARCH], "401 invalid_token")
    (reauth,) = only(actions, Reauthorize)
    assert reauth.cursor is None
    assert reauth.resources == frozenset({FETCH, SEARCH})
    (again,) = ledger.reauthorized(reauth.stream)
    assert isinstance(again, SendCall)
    assert again.message == send.message


def test_authorization_retries_are_limited() -> None:
    ledger = Ledger("p", RecoveryPolicy(max_reauthorizations=3))
    _key, send = start(ledger)
    link = send.link
    rounds = 0
    while True:
        actions = ledger.unauthorized(link, [], "403 insufficient_scope")
        reauth = only(actions, Reauthorize)
        if not reauth:
            break
        rounds += 1
        (again,) = ledger.reauthorized(reauth[0].stream)
        assert isinstance(again, SendCall)
        link = again.link
    assert rounds == 3
    (resolve,) = only(actions, Resolve)
    assert resolve.outcome.kind is FailureKind.AUTHORIZATION


def test_reauthorization_failure_on_unanswered_post_is_an_authorization_error() -> None:
    ledger = Ledger("p")
    _, send = start(ledger, call_spec(idempotent=True))
    ledger.unauthorized(send.link, [], "401")
    (resolve, _) = ledger.reauthorization_failed(send.link.stream, "invalid_client")
    assert isinstance(resolve, Resolve)
    assert isinstance(resolve.outcome, Failure)
    assert resolve.outcome.kind is FailureKind.AUTHORIZATION


def test_not_sent_is_sent_again_even_when_not_idempotent() -> None:
    ledger = Ledger("p", RecoveryPolicy(max_reissues=1))
    _key, send = start(ledger)
    (again,) = only(ledger.not_sent(send.link, "connection refused"), SendCall)
    (resolve,) = only(ledger.not_sent(again.link, "connection refused"), Resolve)
    assert resolve.outcome.kind is FailureKind.NOT_SENT


def test_session_lost_fails_or_reissues_every_pending_call() -> None:
    ledger = Ledger("p")
    key_a, _ = start(ledger)
    key_b, _ = start(ledger, call_spec(idempotent=True))
    actions = ledger.session_lost("404")
    (resolve,) = only(actions, Resolve)
    assert resolve.call == key_a
    assert resolve.outcome.kind is FailureKind.SESSION_LOST
    (send,) = only(actions, SendCall)
    assert send.call == key_b


def test_expire_cancels_on_server_and_fails_once() -> None:
    ledger = Ledger("p")
    key, send = start(ledger)
    actions = ledger.expire(key)
    assert actions[0] == CancelOnServer(send.message["id"], "deadline exceeded")
    assert only(actions, Resolve)[0].outcome.kind is FailureKind.DEADLINE
    assert ledger.expire(key) == []
    assert ledger.cancel(key, "user") == []


def test_stale_link_inputs_are_ignored() -> None:
    ledger = Ledger("p")
    key, send = start(ledger)
    ledger.received(send.link, [ev("e0", None)], "e0")
    (resume,) = ledger.ended(send.link, "drop")
    assert isinstance(resume, Resume)
    old = send.link
    assert not ledger.is_current(old)
    assert ledger.ended(old, "late end") == []
    stale = ledger.received(old, [ev("x", result(send.message["id"]))], "x")
    assert only(stale, Resolve) == []
    assert ledger.pending() == (key,)


def test_json_body_answer_and_json_body_without_answer() -> None:
    ledger = Ledger("p")
    key, send = start(ledger)
    wire = send.message["id"]
    actions = ledger.json_body(send.link, orjson.dumps(result(wire)))
    assert only(actions, Resolve) == [Resolve(key, wire, Answered(result(wire)))]
    key, send = start(ledger)
    actions = ledger.json_body(send.link, b'{"jsonrpc": "2.0", "id": null, "error": {"code": -1, "message": "?"}}')
    (resolve,) = only(actions, Resolve)
    assert resolve.outcome.kind is FailureKind.PROTOCOL


def test_server_requests_and_notifications_pass_through() -> None:
    ledger = Ledger("p")
    _, send = start(ledger)
    ping = {"jsonrpc": "2.0", "id": 5, "method": "ping"}
    actions = ledger.received(send.link, [ev("e1", ping)], "e1")
    assert actions == [Incoming(send.link.stream, ping)]


def test_lost_connection_and_5xx_before_a_cursor_may_have_run() -> None:
    ledger = Ledger("p")
    _, send = start(ledger)
    (resolve,) = only(ledger.lost(send.link, "reset"), Resolve)
    assert resolve.outcome.kind is FailureKind.MAY_HAVE_RUN
    _, send = start(ledger)
    (resolve,) = only(ledger.server_failed(send.link, "502"), Resolve)
    assert resolve.outcome.kind is FailureKind.MAY_HAVE_RUN


def test_5xx_on_resume_is_one_more_try() -> None:
    ledger = Ledger("p")
    _, send = start(ledger)
    ledger.received(send.link, [ev("e0", None)], "e0")
    (resume,) = ledger.ended(send.link, "drop")
    assert isinstance(resume, Resume)
    (again,) = ledger.server_failed(resume.link, "503")
    assert isinstance(again, Resume)
    assert again.attempt == 1


def test_rejected_and_cursor_rejected() -> None:
    ledger = Ledger("p")
    _, send = start(ledger, call_spec(idempotent=True))
    (resolve,) = only(ledger.rejected(send.link, "400 bad request"), Resolve)
    assert resolve.outcome.kind is FailureKind.REJECTED
    _, send = start(ledger)
    ledger.received(send.link, [ev("e0", None)], "e0")
    (resume,) = ledger.ended(send.link, "drop")
    assert isinstance(resume, Resume)
    (resolve,) = only(ledger.cursor_rejected(resume.link, "evicted"), Resolve)
    assert resolve.outcome.kind is FailureKind.MAY_HAVE_RUN
    assert "evicted" in resolve.outcome.reason


def test_accepted_202_for_a_request_is_a_protocol_error() -> None:
    ledger = Ledger("p")
    _, send = start(ledger)
    (resolve,) = only(ledger.accepted(send.link), Resolve)
    assert resolve.outcome.kind is FailureKind.PROTOCOL


# ---- property: random interleavings against a simulated server ----------------------------------------------

STEPS = 3


@dataclass
class _Execution:
    """What the server does for one wire id: priming, progress n*100+1.., then the true result."""

    wire: str
    n: int
    events: list[tuple[str, dict[str, Any] | None]]


@dataclass
class _Conn:
    link: Link
    execution: _Execution
    pos: int
    buffer: str | None = None


class _Sim:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.by_wire: dict[str, _Execution] = {}
        self.by_event: dict[str, tuple[_Execution, int]] = {}
        self.conns: dict[int, _Conn] = {}
        self.waiting_reauth: list[int] = []
        self.truth: dict[int, int] = {}
        self.current_wire: dict[int, object] = {}
        self.outcomes: dict[int, Any] = {}
        self.progress: dict[int, list[float]] = {}
        self.resume_rewind = 0
        self.evict_next = False
        self.drops_need_cursor = False
        """Only drop connections once the stream holds a cursor (a drop before it is unrecoverable)."""

    def begin(self, n: int, idempotent: bool, reissue: bool | None) -> None:
        spec = CallSpec("tools/call", {"name": "t", "arguments": {"n": n}}, frozenset({FETCH}), idempotent,
                        reissue, progress=True)  # fmt: skip
        key, actions = self.ledger.begin(spec)
        self.truth[key] = n
        self.run(actions)

    def run(self, actions: list[Action]) -> None:
        queue = list(actions)
        while queue:
            action = queue.pop(0)
            queue += self.execute(action)

    def execute(self, action: Action) -> list[Action]:
        if isinstance(action, SendCall):
            wire = action.message["id"]
            n = action.message["params"]["arguments"]["n"]
            events: list[tuple[str, dict[str, Any] | None]] = [(f"{wire}/0", None)]
            events += [(f"{wire}/{i}", progress(wire, n * 100 + i)) for i in range(1, STEPS + 1)]
            events.append((f"{wire}/{STEPS + 1}", result(wire, f"out-{n}")))
            execution = _Execution(wire, n, events)
            self.by_wire[wire] = execution
            for index, (event_id, _) in enumerate(events):
                self.by_event[event_id] = (execution, index)
            self.conns[action.link.stream] = _Conn(action.link, execution, 0)
            self.current_wire[action.call] = wire
            self.progress[action.call] = []
            return []
        if isinstance(action, Resume):
            found = self.by_event.get(action.cursor)
            if found is None or self.evict_next:
                self.evict_next = False
                return self.ledger.cursor_rejected(action.link, "evicted")
            execution, index = found
            start = max(0, index + 1 - self.resume_rewind)
            self.conns[action.link.stream] = _Conn(action.link, execution, start)
            return []
        if isinstance(action, CloseStream):
            self.conns.pop(action.stream, None)
            return []
        if isinstance(action, Reauthorize):
            self.conns.pop(action.stream, None)
            self.waiting_reauth.append(action.stream)
            return []
        if isinstance(action, Resolve):
            assert action.call not in self.outcomes, "a second outcome for one call"
            self.outcomes[action.call] = action.outcome
            if isinstance(action.outcome, Answered):
                message = action.outcome.message
                assert message["id"] == self.current_wire[action.call] == action.wire_id
                text = message["result"]["content"][0]["text"]
                assert text == f"out-{self.truth[action.call]}", "a foreign result surfaced"
            return []
        if isinstance(action, Progress):
            seen = self.progress[action.call]
            assert not seen or action.progress > seen[-1], "duplicate or regressing progress"
            assert action.progress // 100 == self.truth[action.call], "foreign progress surfaced"
            seen.append(action.progress)
            return []
        return []

    def conn(self, index: int) -> _Conn | None:
        if not self.conns:
            return None
        return self.conns[sorted(self.conns)[index % len(self.conns)]]

    def deliver(self, conn: _Conn, count: int) -> None:
        batch = conn.execution.events[conn.pos : conn.pos + count]
        conn.pos += len(batch)
        events = []
        for event_id, message in batch:
            conn.buffer = event_id
            events.append(ev(event_id, message))
        self.run(self.ledger.received(conn.link, events, conn.buffer))
        if conn.pos >= len(conn.execution.events) and self.conns.get(conn.link.stream) is conn:
            self.run(self.ledger.ended(conn.link, "server finished"))

    def inject(self, conn: _Conn, messages: list[dict[str, Any]], end: bool) -> None:
        events = [ev(conn.buffer, m) for m in messages]
        self.run(self.ledger.received(conn.link, events, conn.buffer))
        if end and self.conns.get(conn.link.stream) is conn:
            self.run(self.ledger.ended(conn.link, "server closed"))

    def step(self, op: tuple[str, int, int]) -> None:
        name, a, b = op
        conn = self.conn(a)
        if name == "deliver" and conn is not None:
            self.deliver(conn, b)
        elif name == "drop" and conn is not None:
            if self.drops_need_cursor and self.ledger.cursor(conn.link.stream) is None:
                return
            self.run((self.ledger.ended if b % 2 else self.ledger.lost)(conn.link, "dropped"))
        elif name == "foreign" and conn is not None:
            others = [w for w in self.by_wire if w != conn.execution.wire]
            wire = others[b % len(others)] if others and b % 3 else "intruder-1"
            self.inject(conn, [result(wire, "FOREIGN"), progress(wire, 999_900 + b)], end=False)
        elif name == "refuse" and conn is not None:
            wire = conn.execution.wire
            self.inject(conn, [error(wire, DELIVERY_REFUSED, refusal(conn.buffer))], end=True)
        elif name == "exec_lost" and conn is not None:
            self.inject(conn, [error(conn.execution.wire, EXECUTION_LOST, {"resumable": False})], end=True)
        elif name == "unauthorized" and conn is not None:
            self.run(self.ledger.unauthorized(conn.link, [SEARCH], "403 insufficient_scope"))
        elif name == "reauth" and self.waiting_reauth:
            stream = self.waiting_reauth.pop(a % len(self.waiting_reauth))
            outcome = self.ledger.reauthorized(stream) if b % 2 else self.ledger.reauthorization_failed(stream, "no")
            self.run(outcome)
        elif name == "rewind" and conn is not None:
            # The server will replay from before our cursor, and the connection drops now.
            self.resume_rewind = b % 4
            if self.ledger.cursor(conn.link.stream) is not None:
                self.run(self.ledger.ended(conn.link, "dropped"))
        elif name == "repeat_progress" and conn is not None and conn.pos > 1:
            # Progress already delivered, sent again without an id line.
            _, message = conn.execution.events[min(conn.pos - 1, STEPS)]
            if message is not None and "method" in message:
                self.inject(conn, [message], end=False)
        elif name == "evict":
            self.evict_next = True
        elif name == "session_lost":
            self.conns.clear()
            self.run(self.ledger.session_lost("404"))
        elif name == "expire" and self.truth:
            self.run(self.ledger.expire(sorted(self.truth)[a % len(self.truth)]))

    def settle(self) -> None:
        self.resume_rewind = 0
        for _ in range(500):
            if self.waiting_reauth:
                self.run(self.ledger.reauthorized(self.waiting_reauth.pop()))
            elif self.conns:
                conn = self.conns[min(self.conns)]
                self.deliver(conn, len(conn.execution.events))
            else:
                return
        raise AssertionError("the ledger did not settle")


_ops = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "deliver",
                "deliver",
                "deliver",
                "drop",
                "foreign",
                "refuse",
                "exec_lost",
                "unauthorized",
                "reauth",
                "rewind",
                "repeat_progress",
                "evict",
                "session_lost",
                "expire",
            ]
        ),
        st.integers(0, 7),
        st.integers(1, 7),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.tuples(st.booleans(), st.sampled_from([None, True, False])), min_size=1, max_size=4),
    _ops,
    st.integers(1, 4),
)
def test_random_interleavings_resolve_every_call_exactly_once(
    calls: list[tuple[bool, bool | None]], ops: list[tuple[str, int, int]], reissues: int
) -> None:
    sim = _Sim(Ledger("x", RecoveryPolicy(max_reissues=reissues)))
    for n, (idempotent, reissue) in enumerate(calls, start=1):
        sim.begin(n, idempotent, reissue)
    for op in ops:
        sim.step(op)
    sim.settle()
    for key in list(sim.ledger.pending()):
        sim.run(sim.ledger.expire(key))
    assert sim.ledger.pending() == ()
    assert set(sim.outcomes) == set(sim.truth)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(1, 4),
    st.lists(
        st.tuples(
            st.sampled_from(["deliver", "drop", "rewind", "foreign", "repeat_progress"]),
            st.integers(0, 7),
            st.integers(1, 7),
        ),
        max_size=30,
    ),
)
def test_without_refusals_or_loss_every_call_gets_its_true_result(count: int, ops: list[tuple[str, int, int]]) -> None:
    """Drops, duplicate replays and foreign frames alone never cost a result (drops are bounded here)."""
    sim = _Sim(Ledger("x", RecoveryPolicy(max_fruitless_reconnects=len(ops) + 2)))
    sim.drops_need_cursor = True
    for n in range(1, count + 1):
        sim.begin(n, False, None)
    for op in ops:
        sim.step(op)
    sim.settle()
    assert all(isinstance(outcome, Answered) for outcome in sim.outcomes.values()), sim.outcomes
    assert set(sim.outcomes) == set(sim.truth)


def test_session_lost_resends_the_request_the_404_answered() -> None:
    ledger = Ledger("p")
    key_a, _send_a = start(ledger)
    key_b, send_b = start(ledger)
    actions = ledger.session_lost("404", refused=send_b.link)
    (resend,) = only(actions, SendCall)
    assert resend.call == key_b
    assert resend.reissue_of == send_b.message["id"]
    (resolve,) = only(actions, Resolve)
    assert resolve.call == key_a
    assert resolve.outcome.kind is FailureKind.SESSION_LOST
    assert ledger.pending() == (key_b,)


def test_new_events_after_a_reauthorization_reset_the_reauthorization_budget() -> None:
    ledger = Ledger("p", RecoveryPolicy(max_reauthorizations=1))
    _key, send = start(ledger)
    wire = send.message["id"]
    link = send.link
    for n in range(4):  # e.g. a token that expires every few events on a long call
        actions = ledger.received(
            link,
            [ev(f"e{n}", progress(wire, n + 1)), ev(None, error(wire, DELIVERY_REFUSED, refusal(f"e{n}")))],
            f"e{n}",
        )
        (reauth,) = only(actions, Reauthorize)
        (resume,) = ledger.reauthorized(reauth.stream)
        assert isinstance(resume, Resume)
        link = resume.link
    # The last grant let nothing new through: with a budget of one, the next refusal ends the call.
    actions = ledger.received(link, [ev(None, error(wire, DELIVERY_REFUSED, refusal("e3")))], None)
    assert only(actions, Reauthorize) == []
    assert only(actions, Resolve)[0].outcome.kind is FailureKind.MAY_HAVE_RUN


def test_session_failed_ends_every_pending_call_once() -> None:
    ledger = Ledger("p")
    key_a, _ = start(ledger)
    key_b, _ = start(ledger, call_spec(idempotent=True))
    actions = ledger.session_failed("no new session")
    outcomes = {r.call: r.outcome for r in only(actions, Resolve)}
    assert set(outcomes) == {key_a, key_b}
    assert all(isinstance(o, Failure) and o.kind is FailureKind.SESSION_LOST for o in outcomes.values())
    assert ledger.pending() == ()
    assert ledger.session_failed("again") == []
