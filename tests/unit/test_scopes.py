"""Per-tool scopes are the second dimension of one invariant: properties of the requirement tags and the
policy's gap, and of replay planning and live delivery over events that require scopes."""

from __future__ import annotations

import contextlib

from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core.events import StoredEvent
from mcp_lossless.core.principal import Grant, Principal
from mcp_lossless.core.replay import DeliveryGate, plan_replay
from mcp_lossless.core.resources import (
    AudiencePolicy,
    canonical_resource,
    describe,
    is_scope_tag,
    requirement,
    resources_in,
    scope_tag,
    scopes_in,
)

CANONICAL = "https://mcp.example/mcp"
RESOURCES = [f"{CANONICAL}/tools/{name}" for name in "abc"]
SCOPES = ["files:read", "files:write", "admin", "api://app/.default", "https://graph.example/User.Read"]
"""Scope tokens may look like URIs (Entra ID's do): their tags must still never be taken for resources."""
POLICY = AudiencePolicy(CANONICAL, RESOURCES)
AUDIENCES = st.frozensets(st.sampled_from([*RESOURCES, CANONICAL, "https://elsewhere.example"]))
HELD_SCOPES = st.frozensets(st.sampled_from([*SCOPES, "unrelated"]))
REQUIREMENTS = st.builds(
    requirement, st.frozensets(st.sampled_from(RESOURCES), max_size=2), st.frozensets(st.sampled_from(SCOPES))
)
NQCHAR = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters='"\\'), min_size=1)
"""RFC 6749 §3.3: a scope token is one or more NQCHAR."""
PRINCIPAL = Principal("https://as.example", "alice", "app")


def expected_gap(audience: frozenset[str], required: frozenset[str], scopes: frozenset[str]) -> frozenset[str]:
    """The rule written out independently: resources unless the aggregate is held, and scopes never by audience."""
    resources = set() if CANONICAL in audience else set(resources_in(required)) - audience
    return frozenset(resources) | {scope_tag(s) for s in scopes_in(required) if s not in scopes}


@given(AUDIENCES, HELD_SCOPES, REQUIREMENTS)
def test_the_gap_is_missing_resources_and_missing_scopes(
    audience: frozenset[str], scopes: frozenset[str], required: frozenset[str]
) -> None:
    gap = POLICY.missing(audience, required, scopes)
    assert gap == expected_gap(audience, required, scopes)
    assert POLICY.covers(audience, required, scopes) == (not gap)
    assert gap <= required


@given(REQUIREMENTS, HELD_SCOPES)
def test_the_aggregate_audience_never_stands_for_a_scope(required: frozenset[str], scopes: frozenset[str]) -> None:
    gap = POLICY.missing(frozenset({CANONICAL}), required, scopes)
    assert all(is_scope_tag(t) for t in gap)
    assert set(scopes_in(gap)) == set(scopes_in(required)) - scopes


@given(AUDIENCES, AUDIENCES, HELD_SCOPES, HELD_SCOPES, REQUIREMENTS)
def test_holding_more_never_lacks_more(
    a1: frozenset[str], a2: frozenset[str], s1: frozenset[str], s2: frozenset[str], required: frozenset[str]
) -> None:
    assert POLICY.missing(a1 | a2, required, s1 | s2) <= POLICY.missing(a1, required, s1)


@given(AUDIENCES, REQUIREMENTS)
def test_a_caller_that_passes_no_scopes_refuses_every_scoped_event(
    audience: frozenset[str], required: frozenset[str]
) -> None:
    """Leaving ``scopes`` out can only refuse more, never deliver an event its token does not cover."""
    assert set(scopes_in(POLICY.missing(audience, required))) == set(scopes_in(required))


@given(st.frozensets(st.sampled_from(RESOURCES)), st.frozensets(NQCHAR, max_size=4))
def test_tags_round_trip_and_scope_tags_never_collide_with_resources(
    resources: frozenset[str], scopes: frozenset[str]
) -> None:
    tags = requirement(resources, scopes)
    assert resources_in(tags) == tuple(sorted(resources))
    assert scopes_in(tags) == tuple(sorted(scopes))
    for scope in scopes:
        assert scope_tag(scope) not in resources
        with contextlib.suppress(ValueError):  # most scope tags are not even indicators
            assert canonical_resource(scope_tag(scope)) != scope_tag(scope)
    assert len(tags) == len(resources) + len(scopes)


def test_describe_names_resources_then_scopes() -> None:
    tags = requirement([RESOURCES[0]], ["files:write", "admin"])
    assert describe(tags) == f"{RESOURCES[0]}, scope admin, scope files:write"


# --- replay and live delivery over scoped events --------------------------------------------------

TAGGED = st.lists(REQUIREMENTS, min_size=1, max_size=12)


def events_of(tag_list: list[frozenset[str]]) -> list[StoredEvent]:
    return [
        StoredEvent("s", "k", seq, f"e{seq}", b"{}", request_id=seq % 3, resources=tags)
        for seq, tags in enumerate(tag_list, start=1)
    ]


@given(TAGGED, AUDIENCES, HELD_SCOPES)
def test_replay_is_refused_before_any_byte_exactly_when_an_event_lacks_a_resource_or_a_scope(
    tag_list: list[frozenset[str]], audience: frozenset[str], scopes: frozenset[str]
) -> None:
    events = events_of(tag_list)
    grant = Grant(PRINCIPAL, audience, None, scopes)
    refusal = plan_replay(events, grant, POLICY, "c0", set(tag_list))
    gaps = [expected_gap(audience, e.resources, scopes) for e in events]
    if not any(gaps):
        assert refusal is None
        return
    assert refusal is not None
    first = next(e for e, gap in zip(events, gaps, strict=True) if gap)
    assert refusal.event_id == first.event_id and refusal.cursor == "c0", "the cursor does not move"
    assert set(refusal.missing) == set().union(*gaps), "one refusal names everything lacking, scopes included"


@given(TAGGED, AUDIENCES, HELD_SCOPES)
def test_live_delivery_stops_at_the_first_event_lacking_a_scope_and_keeps_the_cursor_there(
    tag_list: list[frozenset[str]], audience: frozenset[str], scopes: frozenset[str]
) -> None:
    events = events_of(tag_list)
    gate = DeliveryGate(Grant(PRINCIPAL, audience, None, scopes), POLICY, "c0")
    admitted, refusal = gate.admit(events, now=0.0)
    gaps = [expected_gap(audience, e.resources, scopes) for e in events]
    assert not any(gaps[:admitted])
    if admitted == len(events):
        assert refusal is None and gate.last_delivered == events[-1].event_id
        return
    assert refusal is not None and set(refusal.missing) == gaps[admitted]
    assert gate.last_delivered == (events[admitted - 1].event_id if admitted else "c0")
    assert refusal.cursor == gate.last_delivered
