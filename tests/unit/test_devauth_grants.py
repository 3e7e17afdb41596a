"""The development AS's resource rules and grant store, without HTTP."""

from __future__ import annotations

import pytest

from mcp_lossless.devauth import grants
from mcp_lossless.devauth.grants import GrantStore, OAuthError, ResourceRules, s256

AGGREGATE = "https://mcp.example/mcp"
SEARCH = "https://mcp.example/mcp/tools/search"
FETCH = "https://mcp.example/mcp/tools/fetch"
VERIFIER = "v" * 43


def rules(*, least_privilege: bool = False, single_audience: bool = False) -> ResourceRules:
    return ResourceRules([SEARCH, FETCH], AGGREGATE, least_privilege=least_privilege, single_audience=single_audience)


def test_parse_canonicalizes_deduplicates_and_keeps_order() -> None:
    assert rules().parse(["HTTPS://MCP.EXAMPLE/mcp/tools/fetch/", SEARCH, FETCH]) == (FETCH, SEARCH)


@pytest.mark.parametrize(
    ("granted", "requested", "least", "audience"),
    [
        ((SEARCH, FETCH), (), False, (SEARCH, FETCH)),
        ((SEARCH, FETCH), (FETCH,), False, (FETCH,)),
        ((AGGREGATE,), (SEARCH,), False, (SEARCH, AGGREGATE)),
        ((AGGREGATE,), (SEARCH,), True, (SEARCH,)),
        ((AGGREGATE,), (AGGREGATE,), False, (AGGREGATE,)),
        ((AGGREGATE,), (), True, (AGGREGATE,)),
    ],
)
def test_refresh_audience(
    granted: tuple[str, ...], requested: tuple[str, ...], least: bool, audience: tuple[str, ...]
) -> None:
    subject = rules(least_privilege=least)
    subject.check_within(requested, granted)
    assert subject.refresh_audience(requested, granted) == audience


def test_tools_are_within_the_aggregate_but_not_the_reverse() -> None:
    rules().check_within((SEARCH, FETCH), (AGGREGATE,))
    with pytest.raises(OAuthError) as info:
        rules().check_within((AGGREGATE,), (SEARCH, FETCH))
    assert info.value.error == "invalid_target"


def test_expired_codes_and_refresh_tokens_are_swept() -> None:
    now = [0.0]
    store = GrantStore(rules(), refresh_ttl=100, clock=lambda: now[0])

    def new_code() -> str:
        return store.issue_code(
            client_id="c",
            redirect_uri="http://127.0.0.1/cb",
            challenge=s256(VERIFIER),
            subject="s",
            resources=(SEARCH,),
            scope="",
        )

    code = new_code()
    issue = store.exchange_code(
        code,
        client_id="c",
        redirect_uri="http://127.0.0.1/cb",
        verifier=VERIFIER,
        requested=(),
        scope=None,
        public_client=False,
    )
    assert issue.refresh_token is not None
    new_code()
    assert (len(store._codes), len(store._refresh), len(store._grants)) == (2, 1, 1)
    now[0] = 101.0
    new_code()
    assert (len(store._codes), len(store._refresh), len(store._grants)) == (1, 0, 0)


def _grant(store: GrantStore, client_id: str = "c") -> str:
    code = store.issue_code(
        client_id=client_id,
        redirect_uri="http://127.0.0.1/cb",
        challenge=s256(VERIFIER),
        subject="s",
        resources=(SEARCH,),
        scope="",
    )
    issue = store.exchange_code(
        code,
        client_id=client_id,
        redirect_uri="http://127.0.0.1/cb",
        verifier=VERIFIER,
        requested=(),
        scope=None,
        public_client=True,
    )
    assert issue.refresh_token is not None
    return issue.refresh_token


def test_a_clients_grants_are_capped_oldest_first_and_the_total_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    store = GrantStore(rules(), refresh_ttl=1000, clock=lambda: 0.0)
    tokens = [_grant(store) for _ in range(grants.MAX_GRANTS_PER_CLIENT + 5)]
    assert len(store) == grants.MAX_GRANTS_PER_CLIENT
    with pytest.raises(OAuthError, match="unknown, expired or revoked"):
        store.refresh(tokens[0], client_id="c", requested=(), scope=None)
    assert store.refresh(tokens[-1], client_id="c", requested=(), scope=None).audience == (SEARCH,)
    monkeypatch.setattr(grants, "MAX_GRANTS", len(store) + 1)
    _grant(store, "other")
    with pytest.raises(OAuthError) as full:
        _grant(store, "third")
    assert full.value.error == "temporarily_unavailable"


def test_a_grant_ends_at_a_fixed_time_however_often_it_rotates() -> None:
    now = [0.0]
    store = GrantStore(rules(), refresh_ttl=100, clock=lambda: now[0])
    token = _grant(store)
    for step in range(1, 5):  # a public client's token rotates on each refresh, each time before it expires
        now[0] = step * 24.0
        rotated = store.refresh(token, client_id="c", requested=(), scope=None).refresh_token
        assert rotated is not None
        token = rotated
    now[0] = 100.5
    with pytest.raises(OAuthError, match="unknown, expired or revoked"):
        store.refresh(token, client_id="c", requested=(), scope=None)


def test_outstanding_codes_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(grants, "MAX_CODES", 3)
    store = GrantStore(rules(), refresh_ttl=100, clock=lambda: 0.0)
    for _ in range(3):
        store.issue_code(
            client_id="c", redirect_uri="http://127.0.0.1/cb", challenge="x", subject="s", resources=(), scope=""
        )
    with pytest.raises(OAuthError) as full:
        store.issue_code(
            client_id="c", redirect_uri="http://127.0.0.1/cb", challenge="x", subject="s", resources=(), scope=""
        )
    assert full.value.error == "temporarily_unavailable"
