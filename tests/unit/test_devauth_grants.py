"""The development AS's resource rules and grant store, without HTTP."""

from __future__ import annotations

import pytest

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
