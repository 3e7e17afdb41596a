"""A call that keeps being refused after re-authorizing is failed, not re-issued into a new round of grants."""

from __future__ import annotations

from mcp_lossless.core.actions import (
    CallSpec,
    Failure,
    FailureKind,
    Reauthorize,
    RecoveryPolicy,
    Resolve,
    SendCall,
)
from mcp_lossless.core.ledger import Ledger


def test_an_idempotent_call_is_not_reissued_when_reauthorization_is_exhausted() -> None:
    ledger = Ledger("p", RecoveryPolicy(max_reauthorizations=3, max_reissues=2))
    key, (send,) = ledger.begin(CallSpec("tools/list", idempotent=True))
    assert isinstance(send, SendCall)
    link, grants = send.link, 0
    while True:
        actions = ledger.unauthorized(link, [], "403 insufficient_scope")
        reauths = [a for a in actions if isinstance(a, Reauthorize)]
        if not reauths:
            break
        grants += 1
        (again,) = ledger.reauthorized(reauths[0].stream)
        assert isinstance(again, SendCall)
        link = again.link
    assert grants == 3
    assert not [a for a in actions if isinstance(a, SendCall)], "no re-issue: it would start three more grants"
    (resolve,) = [a for a in actions if isinstance(a, Resolve)]
    assert resolve.call == key
    assert isinstance(resolve.outcome, Failure) and resolve.outcome.kind is FailureKind.AUTHORIZATION
    assert "gave up after 3 re-authorizations" in resolve.outcome.reason
    assert ledger.pending() == ()
