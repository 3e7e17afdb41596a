"""Properties of the pure core: resource canonicalization, event ids, replay planning and live delivery."""

from __future__ import annotations

import string

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from mcp_lossless.core.eventids import Cursor, CursorProblem, EventIdCodec, Unverified, new_key
from mcp_lossless.core.events import StoredEvent
from mcp_lossless.core.principal import Grant, Principal
from mcp_lossless.core.replay import DeliveryGate, RefusalReason, plan_replay
from mcp_lossless.core.resources import AudiencePolicy, InvalidResource, canonical_resource, tool_resource

# --- resources ----------------------------------------------------------------------------------

SCHEMES = st.sampled_from(["http", "https"])
LABELS = st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True)
HOSTS = st.lists(LABELS, min_size=1, max_size=3).map(".".join)
PORTS = st.one_of(st.just(""), st.integers(1, 65535).map(lambda port: f":{port}"))
SEGMENTS = st.lists(st.text(string.ascii_letters + string.digits + "-._~", min_size=1, max_size=8), max_size=4)
QUERIES = st.one_of(st.just(""), st.from_regex(r"\?[a-z0-9=&]{1,10}", fullmatch=True))


def mixed_case(text: str, flips: list[bool]) -> str:
    return "".join(c.upper() if flip else c for c, flip in zip(text, flips + [False] * len(text), strict=False))


@st.composite
def resource_parts(draw: st.DrawFn) -> tuple[str, str, str, str]:
    """(scheme, authority, path, query) of a well-formed absolute resource indicator."""
    path = "".join("/" + segment for segment in draw(SEGMENTS))
    return draw(SCHEMES), draw(HOSTS) + draw(PORTS), path, draw(QUERIES)


@given(st.text())
@example("https://mcp.example/tool /")
def test_canonical_resource_is_idempotent_on_any_accepted_text(text: str) -> None:
    try:
        once = canonical_resource(text)
    except InvalidResource:
        return
    assert canonical_resource(once) == once


@given(resource_parts())
def test_canonical_resource_is_idempotent_on_indicators(parts: tuple[str, str, str, str]) -> None:
    scheme, authority, path, query = parts
    once = canonical_resource(f"{scheme}://{authority}{path}{query}")
    assert canonical_resource(once) == once


def test_a_tool_resource_defaults_to_the_tools_path_under_the_canonical_uri() -> None:
    assert tool_resource("https://mcp.example.com/mcp", "fetch") == "https://mcp.example.com/mcp/tools/fetch"
    assert (
        tool_resource("https://mcp.example.com/mcp", "fetch", "HTTPS://Other.example/x/") == "https://other.example/x"
    )
    with pytest.raises(InvalidResource):
        tool_resource("https://mcp.example.com/mcp", "fetch", "relative/path")


@given(resource_parts(), st.lists(st.booleans()), st.lists(st.booleans()), st.integers(0, 3))
def test_equivalent_spellings_compare_equal(
    parts: tuple[str, str, str, str], scheme_flips: list[bool], host_flips: list[bool], slashes: int
) -> None:
    scheme, authority, path, query = parts
    plain = f"{scheme}://{authority}{path}{query}"
    respelled = f"{mixed_case(scheme, scheme_flips)}://{mixed_case(authority, host_flips)}{path}{'/' * slashes}{query}"
    assert canonical_resource(respelled) == canonical_resource(plain)


@given(resource_parts(), resource_parts())
def test_distinct_resources_stay_distinct(a: tuple[str, str, str, str], b: tuple[str, str, str, str]) -> None:
    assume((a[0], a[1].lower(), a[2], a[3]) != (b[0], b[1].lower(), b[2], b[3]))
    assert canonical_resource("".join((a[0], "://", *a[1:]))) != canonical_resource("".join((b[0], "://", *b[1:])))


@given(resource_parts())
def test_path_case_is_significant(parts: tuple[str, str, str, str]) -> None:
    scheme, authority, path, query = parts
    assume(path.lower() != path)
    lower = canonical_resource(f"{scheme}://{authority}{path.lower()}{query}")
    assert canonical_resource(f"{scheme}://{authority}{path}{query}") != lower


@given(resource_parts(), st.text())
@example(("http", "mcp.example", "", ""), "\r")
def test_fragments_are_rejected(parts: tuple[str, str, str, str], fragment: str) -> None:
    scheme, authority, path, query = parts
    with pytest.raises(InvalidResource):
        canonical_resource(f"{scheme}://{authority}{path}{query}#{fragment}")


@given(resource_parts(), st.sampled_from(["{path}", "{authority}{path}", "//{authority}{path}", "{scheme}:{path}"]))
def test_relative_references_are_rejected(parts: tuple[str, str, str, str], shape: str) -> None:
    scheme, authority, path, _query = parts
    with pytest.raises(InvalidResource):
        canonical_resource(shape.format(scheme=scheme, authority=authority, path=path or "/x"))


RESOURCE_UNIVERSE = [f"https://mcp.example/tools/{name}" for name in "abcd"]
CANONICAL = "https://mcp.example/mcp"
TAG_SETS = st.frozensets(st.sampled_from(RESOURCE_UNIVERSE))
AUDIENCES = st.frozensets(st.sampled_from([*RESOURCE_UNIVERSE, CANONICAL, "https://elsewhere.example"]))
POLICY = AudiencePolicy(CANONICAL, RESOURCE_UNIVERSE)


@given(AUDIENCES, TAG_SETS)
def test_covers_exactly_when_nothing_is_missing(audience: frozenset[str], required: frozenset[str]) -> None:
    missing = POLICY.missing(audience, required)
    assert POLICY.covers(audience, required) == (not missing)
    assert missing <= required
    assert missing.isdisjoint(audience)


# --- event ids ----------------------------------------------------------------------------------

SECRETS = st.binary(min_size=16, max_size=64)
STREAM_KEYS = st.binary(min_size=12, max_size=48).map(new_key)
SEQS = st.integers(0, 2**48 - 1)
SESSIONS = st.text(min_size=1, max_size=40)
ID_ALPHABET = string.ascii_letters + string.digits + "-_." + "+/=: \x00é"


@given(SECRETS, SESSIONS, STREAM_KEYS, SEQS)
def test_event_id_round_trips_for_its_session(secret: bytes, session: str, stream: str, seq: int) -> None:
    codec = EventIdCodec(secret)
    assert codec.decode(codec.encode(stream, seq, codec.stream_mac(session, stream)), session) == Cursor(stream, seq)


@given(SECRETS, SESSIONS, SESSIONS, STREAM_KEYS, SEQS)
def test_event_id_never_verifies_for_another_session(
    secret: bytes, session: str, other: str, stream: str, seq: int
) -> None:
    assume(session != other)
    codec = EventIdCodec(secret)
    assert codec.decode(codec.encode(stream, seq, codec.stream_mac(session, stream)), other) == Unverified(stream, seq)


@given(SECRETS, SECRETS, SESSIONS, STREAM_KEYS, SEQS)
def test_event_id_never_verifies_under_another_secret(
    secret: bytes, other_secret: bytes, session: str, stream: str, seq: int
) -> None:
    assume(secret != other_secret)
    codec = EventIdCodec(secret)
    raw = codec.encode(stream, seq, codec.stream_mac(session, stream))
    assert not isinstance(EventIdCodec(other_secret).decode(raw, session), Cursor)


@given(SECRETS, SESSIONS, STREAM_KEYS, SEQS, st.data())
def test_single_character_mutation_never_yields_another_cursor(
    secret: bytes, session: str, stream: str, seq: int, data: st.DataObject
) -> None:
    """An edit of the stream or MAC never verifies; an edit of the position names another position of the same
    stream, which only its holder could have asked for (positions are not authenticated, ADR 0007)."""
    codec = EventIdCodec(secret)
    raw = codec.encode(stream, seq, codec.stream_mac(session, stream))
    index = data.draw(st.integers(0, len(raw) - 1))
    replacement = data.draw(st.sampled_from(ID_ALPHABET).filter(lambda c: c != raw[index]))
    mutated = raw[:index] + replacement + raw[index + 1 :]

    decoded = codec.decode(mutated, session)

    if isinstance(decoded, Cursor):
        assert decoded.stream == stream
        assert mutated.split(".")[0] == stream and mutated.split(".")[2] == raw.split(".")[2]
    else:
        assert decoded is CursorProblem.MALFORMED or isinstance(decoded, Unverified)


@given(SECRETS, SESSIONS, STREAM_KEYS, STREAM_KEYS, SEQS)
def test_a_streams_mac_never_verifies_for_another_stream(
    secret: bytes, session: str, stream: str, other: str, seq: int
) -> None:
    assume(stream != other)
    codec = EventIdCodec(secret)
    spliced = codec.encode(other, seq, codec.stream_mac(session, stream))
    assert codec.decode(spliced, session) == Unverified(other, seq)


@given(SECRETS, SESSIONS, st.text())
def test_decoding_arbitrary_text_never_crashes(secret: bytes, session: str, raw: str) -> None:
    decoded = EventIdCodec(secret).decode(raw, session)
    assert decoded is CursorProblem.MALFORMED or isinstance(decoded, Unverified)


@given(SECRETS, SESSIONS, st.from_regex(r"[A-Za-z0-9_-]{16,64}\.[0-9a-f]{1,12}\.[A-Za-z0-9_-]{16}", fullmatch=True))
def test_well_formed_guesses_do_not_verify(secret: bytes, session: str, raw: str) -> None:
    decoded = EventIdCodec(secret).decode(raw, session)
    assert isinstance(decoded, Unverified)


# --- replay planning and live delivery ----------------------------------------------------------

ALICE = Principal("https://issuer.example", "alice", "client-1")


@st.composite
def event_logs(draw: st.DrawFn) -> list[StoredEvent]:
    tag_sets = draw(st.lists(TAG_SETS, max_size=12))
    return [
        StoredEvent("s1", "k1", seq, f"k1.{seq:x}.mac", b"{}", seq % 3, None, tags, False)
        for seq, tags in enumerate(tag_sets)
    ]


def gap(audience: frozenset[str], event: StoredEvent) -> frozenset[str]:
    return POLICY.missing(audience, event.resources)


@given(event_logs(), AUDIENCES)
def test_plan_replay_refuses_exactly_when_an_event_is_uncovered(
    events: list[StoredEvent], audience: frozenset[str]
) -> None:
    refusal = plan_replay(events, Grant(ALICE, audience), POLICY, "k1.0.cursor")
    uncovered = [e for e in events if not POLICY.covers(audience, e.resources)]

    if not uncovered:
        assert refusal is None
        return
    assert refusal is not None
    assert refusal.reason is RefusalReason.INSUFFICIENT_AUDIENCE
    assert refusal.event_id == uncovered[0].event_id
    assert refusal.request_id == uncovered[0].request_id
    assert refusal.missing == tuple(sorted(frozenset().union(*(gap(audience, e) for e in events))))
    assert refusal.cursor == "k1.0.cursor"


@given(event_logs().flatmap(lambda events: st.tuples(st.just(events), st.permutations(events))), AUDIENCES)
def test_plan_replay_missing_does_not_depend_on_order(
    logs: tuple[list[StoredEvent], list[StoredEvent]], audience: frozenset[str]
) -> None:
    events, shuffled = logs
    grant = Grant(ALICE, audience)
    in_order = plan_replay(events, grant, POLICY, "c")
    reordered = plan_replay(shuffled, grant, POLICY, "c")
    assert (in_order is None) == (reordered is None)
    if in_order is not None and reordered is not None:
        assert in_order.missing == reordered.missing


@given(event_logs(), AUDIENCES, st.lists(st.integers(1, 5)))
def test_delivery_gate_admits_only_covered_events_and_moves_cursor_on_delivery(
    events: list[StoredEvent], audience: frozenset[str], sizes: list[int]
) -> None:
    gate = DeliveryGate(Grant(ALICE, audience, expires_at=1000.0), POLICY, "start")
    expected_cursor = "start"
    position = 0
    for size in [*sizes, len(events)]:
        batch = events[position : position + size]
        admitted, refusal = gate.admit(batch, now=10.0)
        assert all(POLICY.covers(audience, event.resources) for event in batch[:admitted])
        if admitted:
            expected_cursor = batch[admitted - 1].event_id
        assert gate.last_delivered == expected_cursor
        if refusal is None:
            assert admitted == len(batch)
        else:
            refused = batch[admitted]
            assert refusal.reason is RefusalReason.INSUFFICIENT_AUDIENCE
            assert refusal.event_id == refused.event_id
            assert refusal.missing == tuple(sorted(gap(audience, refused)))
            assert refusal.cursor == expected_cursor
            return
        position += size
        if position >= len(events):
            return


@given(event_logs(), st.floats(0, 1e9), st.floats(0, 600), st.floats(1e-3, 1e6))
def test_delivery_gate_refuses_everything_once_the_grant_expired(
    events: list[StoredEvent], expires_at: float, leeway: float, late_by: float
) -> None:
    gate = DeliveryGate(Grant(ALICE, frozenset({CANONICAL}), expires_at=expires_at), POLICY, "start", leeway)
    now = expires_at + leeway + late_by
    assume(now > expires_at + leeway)
    for start in range(len(events)):
        admitted, refusal = gate.admit(events[start:], now)
        assert admitted == 0 and refusal is not None
        assert refusal.reason is RefusalReason.TOKEN_EXPIRED
        assert refusal.event_id == events[start].event_id
        assert refusal.cursor == "start"
    assert gate.last_delivered == "start"


@given(event_logs(), AUDIENCES)
def test_planning_with_the_stream_tags_decides_like_planning_event_by_event(
    events: list[StoredEvent], audience: frozenset[str]
) -> None:
    grant = Grant(ALICE, audience)
    tags = {e.resources for e in events} | {frozenset()}
    with_tags = plan_replay(events, grant, POLICY, "c", tags)
    without = plan_replay(events, grant, POLICY, "c")
    assert with_tags == without
    fast = DeliveryGate(grant, POLICY, "c", 0.0, POLICY.covers_all(audience, tags))
    slow = DeliveryGate(grant, POLICY, "c")
    assert fast.admit(events, 1.0) == slow.admit(events, 1.0)
    assert fast.last_delivered == slow.last_delivered
