"""The ledger and SEP-3182 keys (ADR 0029): a keyed call is re-issued under the same key whatever its tool, waits out
"in progress", and ends at an execution-lost that names its key; an unkeyed non-idempotent call keeps today's rule."""

from __future__ import annotations

from typing import Any

import orjson

from mcp_lossless.core.actions import CallSpec, CancelOnServer, Failure, FailureKind, Resolve, SendCall
from mcp_lossless.core.errors import EXECUTION_LOST, IDEMPOTENCY_IN_PROGRESS
from mcp_lossless.core.idempotency import IN_PROGRESS, KEY_PARAM
from mcp_lossless.core.ledger import Ledger
from tests.unit.test_ledger import error, ev, only, result

KEY = "3f1c0f9e-0d6b-4d43-9d0a-7a3c2b1e5f60"
CHARGE = "https://mcp.example.com/tools/charge"


def charge(key: str | None) -> CallSpec:
    """``charge`` is not idempotent: without a key a lost result is may-have-run."""
    params: dict[str, Any] = {"name": "charge", "arguments": {"amount": "5"}}
    if key is not None:
        params[KEY_PARAM] = key
    return CallSpec("tools/call", params, frozenset({CHARGE}), idempotency_key=key)


def begin(ledger: Ledger, key: str | None) -> SendCall:
    _, actions = ledger.begin(charge(key))
    (send,) = only(actions, SendCall)
    return send


def test_a_keyed_call_whose_stream_is_gone_is_reissued_under_the_same_key_without_cancelling_the_first() -> None:
    ledger = Ledger("c")
    send = begin(ledger, KEY)
    ledger.received(send.link, [ev("s.0.m", None)], "s.0.m")
    actions = ledger.ended(send.link, "dropped")
    (resume,) = actions
    actions = ledger.cursor_rejected(resume.link, "evicted")
    (again,) = only(actions, SendCall)
    assert again.message["params"][KEY_PARAM] == KEY and again.message["id"] != send.message["id"]
    assert not only(actions, CancelOnServer), "cancelling the first id would make 'cancelled' the key's outcome"
    assert not only(actions, Resolve)
    (done,) = only(ledger.json_body(again.link, orjson.dumps(result(again.message["id"], "charged"))), Resolve)
    assert done.outcome.message["result"]["content"][0]["text"] == "charged"  # type: ignore[union-attr]


def test_without_a_key_a_non_idempotent_call_still_ends_as_may_have_run() -> None:
    ledger = Ledger("c")
    send = begin(ledger, None)
    (resolve,) = only(ledger.lost(send.link, "reset"), Resolve)
    assert isinstance(resolve.outcome, Failure) and resolve.outcome.kind is FailureKind.MAY_HAVE_RUN


def test_in_progress_sends_the_same_key_again_after_retry_after() -> None:
    ledger = Ledger("c")
    send = begin(ledger, KEY)
    busy = error(send.message["id"], IDEMPOTENCY_IN_PROGRESS, {"type": IN_PROGRESS, KEY_PARAM: KEY, "retryAfter": 2})
    (again,) = only(ledger.json_body(send.link, orjson.dumps(busy)), SendCall)
    assert again.message["params"][KEY_PARAM] == KEY and again.retry_ms == 2000 and again.attempt == 1


def test_in_progress_for_an_unkeyed_call_is_its_answer() -> None:
    ledger = Ledger("c")
    send = begin(ledger, None)
    busy = error(send.message["id"], IDEMPOTENCY_IN_PROGRESS, {"type": IN_PROGRESS, "retryAfter": 1})
    (resolve,) = only(ledger.json_body(send.link, orjson.dumps(busy)), Resolve)
    assert not isinstance(resolve.outcome, Failure)


def test_execution_lost_naming_the_key_is_final_and_one_not_naming_it_is_reissued() -> None:
    ledger = Ledger("c")
    send = begin(ledger, KEY)
    ledger.received(send.link, [ev("s.0.m", None)], "s.0.m")
    lost = error(send.message["id"], EXECUTION_LOST, {"reason": "execution_lost", "requestId": send.message["id"]})
    (again,) = only(ledger.received(send.link, [ev(None, lost)], "s.0.m"), SendCall)
    assert again.message["params"][KEY_PARAM] == KEY
    named = error(again.message["id"], EXECUTION_LOST, {"reason": "execution_lost", KEY_PARAM: KEY})
    actions = ledger.json_body(again.link, orjson.dumps(named))
    (resolve,) = only(actions, Resolve)
    assert not only(actions, SendCall)
    assert isinstance(resolve.outcome, Failure) and resolve.outcome.kind is FailureKind.MAY_HAVE_RUN
    assert resolve.outcome.error is not None and resolve.outcome.error["data"][KEY_PARAM] == KEY


def test_a_keyed_call_the_caller_forbade_to_reissue_is_not_reissued() -> None:
    ledger = Ledger("c")
    _, actions = ledger.begin(
        CallSpec("tools/call", {"name": "charge", KEY_PARAM: KEY}, idempotency_key=KEY, reissue=False)
    )
    (send,) = only(actions, SendCall)
    (resolve,) = only(ledger.lost(send.link, "reset"), Resolve)
    assert isinstance(resolve.outcome, Failure) and resolve.outcome.kind is FailureKind.MAY_HAVE_RUN


def test_keyed_reissues_are_bounded() -> None:
    ledger = Ledger("c")
    send = begin(ledger, KEY)
    for _ in range(ledger.policy.max_keyed_reissues):
        (send,) = only(ledger.lost(send.link, "reset"), SendCall)
    (resolve,) = only(ledger.lost(send.link, "reset"), Resolve)
    assert isinstance(resolve.outcome, Failure) and resolve.outcome.kind is FailureKind.MAY_HAVE_RUN


def test_an_idempotent_tool_whose_key_was_lost_is_tried_again_under_a_new_key() -> None:
    ledger = Ledger("c")
    spec = CallSpec("tools/call", {"name": "search", KEY_PARAM: KEY}, idempotent=True, idempotency_key=KEY)
    _, actions = ledger.begin(spec)
    (send,) = only(actions, SendCall)
    named = error(send.message["id"], EXECUTION_LOST, {"reason": "execution_lost", KEY_PARAM: KEY})
    (again,) = only(ledger.json_body(send.link, orjson.dumps(named)), SendCall)
    assert again.message["params"][KEY_PARAM] not in (KEY, None)


def test_an_idempotent_tool_is_tried_again_under_a_new_key_after_more_keyed_reissues_than_the_unkeyed_bound() -> None:
    """A keyed call re-issued under its key more often than an unkeyed call may be (each safe: the server runs a key
    once), whose key's execution was then lost, still runs once more under a new key: it is safe to run twice."""
    ledger = Ledger("c")
    spec = CallSpec("tools/call", {"name": "search", KEY_PARAM: KEY}, idempotent=True, idempotency_key=KEY)
    _, actions = ledger.begin(spec)
    (send,) = only(actions, SendCall)
    for _ in range(ledger.policy.max_reissues + 1):
        busy = error(
            send.message["id"], IDEMPOTENCY_IN_PROGRESS, {"type": IN_PROGRESS, KEY_PARAM: KEY, "retryAfter": 0}
        )
        (send,) = only(ledger.json_body(send.link, orjson.dumps(busy)), SendCall)
        assert send.message["params"][KEY_PARAM] == KEY
    named = error(send.message["id"], EXECUTION_LOST, {"reason": "execution_lost", KEY_PARAM: KEY})
    (again,) = only(ledger.json_body(send.link, orjson.dumps(named)), SendCall)
    assert again.message["params"][KEY_PARAM] not in (KEY, None), "a new operation, not a may-have-run"
