"""SEP-2643's envelope (core/denials.py): rendered once, read back by the client's rule."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core.denials import ENVELOPE_META_KEY, refusal_fields, remedy
from mcp_lossless.core.resources import requirement

RESOURCES = st.lists(st.sampled_from([f"https://mcp.example/mcp/tools/{t}" for t in "abcd"]), unique=True)
SCOPES = st.lists(st.sampled_from(["read", "write", "admin"]), unique=True)


@given(RESOURCES, SCOPES, st.text(max_size=20))
def test_what_is_rendered_is_what_the_client_asks_for(resources: list[str], scopes: list[str], subject: str) -> None:
    data = refusal_fields(subject, requirement(resources, scopes), taskId="t")
    assert data["authorization"] is data["_meta"][ENVELOPE_META_KEY]
    assert data["authorization"]["reason"] == "insufficient_authorization"
    read = remedy(data)
    assert read.reauthorize is True
    assert read.resources == frozenset(resources) and read.scopes == frozenset(scopes)
    assert (
        read.context
        == refusal_fields(subject, requirement(resources, scopes))["authorization"]["authorizationContextId"]
    ), "the same refusal names the same handle"


def test_the_envelope_decides_where_present_and_our_fields_where_not() -> None:
    ours = {"requiredResources": ["https://r/tools/a"], "requiredScopes": [], "resumable": True}
    assert remedy(ours).reauthorize is True and remedy(ours).resources == {"https://r/tools/a"}
    unavailable = {**ours, "authorization": {"reason": "insufficient_authorization", "remediation": "unavailable"}}
    assert remedy(unavailable).reauthorize is False, "the server says no new grant helps"
    only_meta = {"_meta": {ENVELOPE_META_KEY: {"reason": "insufficient_authorization", "remediation": "undisclosed"}}}
    assert remedy(only_meta).reauthorize is True, "undisclosed leaves trying to the client"
    assert remedy({"reason": "store_unavailable"}).reauthorize is None, "not an authorization denial"
    assert remedy(None).reauthorize is None and remedy([1]).reauthorize is None
    other_reason = {"authorization": {"reason": "something_else", "remediation": "unavailable"}}
    assert remedy(other_reason).reauthorize is None, "an envelope of another reason is not ours to read"
