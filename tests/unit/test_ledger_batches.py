"""Batches in the pending-call ledger: one stream, several calls, a token for their union, per-tool fallback."""

from __future__ import annotations

from typing import Any

from mcp_lossless.core.actions import (
    Answered,
    CallSpec,
    CancelOnServer,
    Failure,
    FailureKind,
    Reauthorize,
    Resolve,
    SendBatch,
    SendCall,
)
from mcp_lossless.core.errors import DELIVERY_REFUSED
from mcp_lossless.core.ledger import Ledger
from tests.unit.test_ledger import FETCH, SEARCH, error, ev, only, result

CHARGE = "https://mcp.example.com/tools/charge"


def spec(name: str, resource: str, idempotent: bool) -> CallSpec:
    return CallSpec("tools/call", {"name": name, "arguments": {}}, frozenset({resource}), idempotent, progress=True)


def begin(ledger: Ledger, *specs: CallSpec) -> tuple[list[int], SendBatch]:
    keys, actions = ledger.begin_batch(specs)
    (batch,) = actions
    assert isinstance(batch, SendBatch)
    return keys, batch


def refused_in_band(wire: object, cursor: str | None) -> dict[str, Any]:
    data = {"reason": "token_expired", "eventId": "e9", "requiredResources": [], "lastEventId": cursor,
            "resumable": True}  # fmt: skip
    return error(wire, DELIVERY_REFUSED, data)


def test_a_batch_is_one_post_for_the_union_and_each_call_gets_its_own_response() -> None:
    ledger = Ledger("p")
    keys, batch = begin(ledger, spec("search", SEARCH, True), spec("fetch", FETCH, True))
    assert batch.resources == {SEARCH, FETCH}
    wires = [m["id"] for m in batch.messages]
    assert len(set(wires)) == 2 and batch.calls == tuple(keys)
    assert [m["params"]["_meta"]["progressToken"] for m in batch.messages] == wires
    actions = ledger.received(batch.link, [ev("a", result(wires[1], "f")), ev("b", result(wires[0], "s"))], "b")
    outcomes = {r.call: r.outcome for r in only(actions, Resolve)}
    assert isinstance(outcomes[keys[0]], Answered) and outcomes[keys[0]].message["result"]["content"][0]["text"] == "s"
    assert isinstance(outcomes[keys[1]], Answered) and outcomes[keys[1]].message["id"] == wires[1]
    assert ledger.pending() == ()


def test_a_batch_no_token_covers_is_split_under_the_same_ids_whatever_the_tools() -> None:
    """A POST refused with 401/403 never ran: each call may go on its own, even one that is not idempotent."""
    ledger = Ledger("p")
    keys, batch = begin(ledger, spec("fetch", FETCH, True), spec("charge", CHARGE, False))
    (reauth,) = only(ledger.unauthorized(batch.link, [], "HTTP 401"), Reauthorize)
    assert reauth.resources == {FETCH, CHARGE} and reauth.cursor is None
    sends = only(ledger.reauthorization_failed(reauth.stream, "invalid_target"), SendCall)
    assert [s.call for s in sends] == keys
    assert [s.message["id"] for s in sends] == [m["id"] for m in batch.messages]
    assert [s.resources for s in sends] == [{FETCH}, {CHARGE}]
    assert len({s.link.stream for s in sends}) == 2
    for send in sends:
        (resolve,) = only(ledger.received(send.link, [ev("x", result(send.message["id"]))], "x"), Resolve)
        assert isinstance(resolve.outcome, Answered)


def test_a_batch_that_ran_falls_back_to_reissuing_idempotent_calls_and_fails_the_others() -> None:
    ledger = Ledger("p")
    keys, batch = begin(ledger, spec("search", SEARCH, True), spec("charge", CHARGE, False))
    wires = [m["id"] for m in batch.messages]
    ledger.received(batch.link, [ev("c1", None)], "c1")
    actions = ledger.received(batch.link, [ev(None, refused_in_band(w, "c1")) for w in wires], "c1")
    (reauth,) = only(actions, Reauthorize)
    assert reauth.resources == {SEARCH, CHARGE} and reauth.cursor == "c1"
    actions = ledger.reauthorization_failed(reauth.stream, "invalid_target: a single resource per token")
    (resend,) = only(actions, SendCall)
    assert resend.call == keys[0] and resend.resources == {SEARCH}
    assert resend.reissue_of == wires[0] and resend.message["id"] not in wires
    assert CancelOnServer(wires[0], "re-issued under a new id") in actions
    (failed,) = only(actions, Resolve)
    assert failed.call == keys[1] and isinstance(failed.outcome, Failure)
    assert failed.outcome.kind is FailureKind.MAY_HAVE_RUN and "may have run" in failed.outcome.reason
    assert ledger.pending() == (keys[0],)


def test_a_batch_reauthorized_before_it_ran_is_sent_again_whole() -> None:
    ledger = Ledger("p")
    _, batch = begin(ledger, spec("search", SEARCH, True), spec("fetch", FETCH, True))
    (reauth,) = only(ledger.unauthorized(batch.link, [FETCH], "HTTP 403"), Reauthorize)
    (again,) = ledger.reauthorized(reauth.stream)
    assert isinstance(again, SendBatch)
    assert again.messages == batch.messages and again.link.epoch > batch.link.epoch


def test_refused_in_band_before_any_event_id_is_not_sent_again_under_the_same_id() -> None:
    """No priming below 2025-11-25: a refusal can come before the stream has a cursor. The request ran."""
    ledger = Ledger("p")
    keys, batch = begin(ledger, spec("search", SEARCH, True), spec("charge", CHARGE, False))
    wires = [m["id"] for m in batch.messages]
    actions = ledger.received(batch.link, [ev(None, refused_in_band(w, None)) for w in wires], None)
    assert only(actions, Reauthorize) == []
    (resend,) = only(actions, SendCall)
    assert resend.call == keys[0] and resend.message["id"] not in wires and resend.reissue_of == wires[0]
    (failed,) = only(actions, Resolve)
    assert failed.call == keys[1] and isinstance(failed.outcome, Failure)
    assert failed.outcome.kind is FailureKind.MAY_HAVE_RUN and "cannot resume" in failed.outcome.reason
