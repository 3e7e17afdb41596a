"""The idempotency-key decision and the canonical argument hash (SEP-3182, ADR 0029), property-tested without a
server: :func:`decide_duplicate` against an oracle written out here on its own terms, :func:`argument_hash`
against a direct comparison of the parsed values."""

from __future__ import annotations

import json
import random
from fractions import Fraction
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core import errors
from mcp_lossless.core.idempotency import (
    CONFLICT,
    IN_PROGRESS,
    KEY_PARAM,
    MAX_KEY_CHARS,
    Conflict,
    DuplicateFacts,
    InProgress,
    InvalidKey,
    KeyRecord,
    Lost,
    Refuse,
    Replay,
    Run,
    Settle,
    StreamTarget,
    TargetState,
    TaskTarget,
    _reference_text,
    argument_hash,
    canonical_text,
    decide_duplicate,
    key_of,
)
from mcp_lossless.core.principal import Grant, Principal
from mcp_lossless.core.resources import AudiencePolicy

CANONICAL = "https://mcp.example/mcp"
TOOLS = [f"https://mcp.example/tools/{name}" for name in ("charge", "echo")]
POLICY = AudiencePolicy(CANONICAL, TOOLS)
ALICE = Principal("https://issuer.example", "alice", "client-1")
MALLORY = Principal("https://issuer.example", "mallory", "client-1")
ALICE_OTHER_CLIENT = Principal("https://issuer.example", "alice", "client-2")
NOW = 1_000_000.0

# ---- canonical arguments --------------------------------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)


def same(a: Any, b: Any) -> bool:
    """The oracle: equal as parsed JSON values, numbers by their mathematical value, a bool never a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return Fraction(a) == Fraction(b)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


def variant(value: Any, rng: random.Random) -> Any:
    """The same parsed value written otherwise: keys reordered, integers as floats where exact, floats as ints."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return float(value) if abs(value) < 2**53 and rng.random() < 0.5 else value
    if isinstance(value, float):
        return int(value) if value.is_integer() and rng.random() < 0.5 else value
    if isinstance(value, list):
        return [variant(v, rng) for v in value]
    items = [(k, variant(v, rng)) for k, v in value.items()]
    rng.shuffle(items)
    return dict(items)


@given(JSON, st.randoms(use_true_random=False))
def test_the_same_parsed_value_written_otherwise_hashes_alike(value: Any, rng: random.Random) -> None:
    other = variant(value, rng)
    assert same(value, other)
    assert argument_hash(value) == argument_hash(other)


@given(JSON, JSON)
def test_two_values_hash_alike_exactly_when_they_are_the_same_value(a: Any, b: Any) -> None:
    assert (argument_hash(a) == argument_hash(b)) == same(a, b)


@given(st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=4))
def test_escapes_and_whitespace_are_what_parsing_made_of_them(value: dict[str, str]) -> None:
    """One text escaped to ASCII and indented, the other raw UTF-8: parsed alike, hashed alike."""
    escaped = json.loads(json.dumps(value, ensure_ascii=True, indent=2))
    raw = orjson.loads(orjson.dumps(value))
    assert argument_hash(escaped) == argument_hash(raw)


@given(JSON)
def test_the_fast_canonical_text_is_the_reference_one(value: Any) -> None:
    """Whichever way it is written (``orjson`` for a value without floats), the text is the defined one, so a hash
    stored before the fast path is found again."""
    assert canonical_text(value) == _reference_text(value)


@pytest.mark.parametrize(
    "value", [{"a": "\x00\x1f\x7f\u2028\ufeff\U0001f600"}, {"\ud800": 1}, [2**64, -(2**63) - 1], [1e16]]
)
def test_the_fast_canonical_text_is_the_reference_one_at_its_edges(value: Any) -> None:
    assert canonical_text(value) == _reference_text(value)


def test_the_seps_own_examples() -> None:
    assert argument_hash(json.loads('{"a": 1, "b": 2}')) == argument_hash(json.loads('{"b":2,"a":1}'))
    assert argument_hash(json.loads('{"n": 1}')) == argument_hash(json.loads('{"n": 1.0}'))
    assert argument_hash(json.loads('{"s": "\\u00e9"}')) == argument_hash(json.loads('{"s": "é"}'))
    assert argument_hash({"n": True}) != argument_hash({"n": 1})
    assert argument_hash({"n": 2**53 + 1}) != argument_hash({"n": float(2**53 + 1)})


# ---- the key parameter ----------------------------------------------------------------------------------


def test_a_key_is_a_bounded_non_empty_string_and_continuations_carry_none() -> None:
    assert key_of({"name": "echo"}) is None
    assert key_of({"name": "echo", KEY_PARAM: "k"}) == "k"
    assert key_of({"name": "echo", KEY_PARAM: "k", "requestState": "s"}) is None
    assert key_of({"name": "echo", KEY_PARAM: "k", "inputResponses": {}}) is None
    assert key_of({KEY_PARAM: "x" * MAX_KEY_CHARS}) == "x" * MAX_KEY_CHARS
    for bad in ("", "x" * (MAX_KEY_CHARS + 1), 7, None, ["k"]):
        with pytest.raises(InvalidKey):
            key_of({KEY_PARAM: bad})


# ---- the decision ---------------------------------------------------------------------------------------

TARGETS = st.sampled_from([StreamTarget("stream-1", "r-1"), StreamTarget("stream-1", 7), TaskTarget("task-1")])


@st.composite
def worlds(draw: st.DrawFn) -> tuple[DuplicateFacts, Grant]:
    tool = draw(st.sampled_from(["charge", "echo"]))
    required = frozenset({f"https://mcp.example/tools/{tool}"})
    hashes = ["h1", "h2"]
    record = None
    if draw(st.booleans()):
        record = KeyRecord(
            principal=draw(st.sampled_from([ALICE, ALICE, MALLORY, ALICE_OTHER_CLIENT])),
            key="key-1",
            tool=draw(st.sampled_from(["charge", "echo"])),
            arguments_hash=draw(st.sampled_from(hashes)),
            target=draw(TARGETS),
            created=NOW - 10,
            expires=NOW + draw(st.sampled_from([-1.0, 0.0, 1.0, 86_400.0])),
        )
    state = draw(st.sampled_from(TargetState)) if record is not None else None
    facts = DuplicateFacts(
        record=record,
        state=state,
        tool=tool,
        arguments_hash=draw(st.sampled_from(hashes)),
        required=required,
        now=NOW,
        last_event_id=draw(st.sampled_from([None, "stream-1.4.mac"])),
    )
    audience = draw(st.frozensets(st.sampled_from([*TOOLS, CANONICAL])))
    return facts, Grant(ALICE, audience)


def oracle(facts: DuplicateFacts, grant: Grant) -> str:
    """The table of ADR 0029, row by row, first match wins."""
    r = facts.record
    rows: list[tuple[bool, str]] = [
        (r is None, "run"),
        (r is not None and r.principal != grant.principal, "run"),  # another principal's key is another key
        (r is not None and r.expires <= facts.now, "run"),  # past its retention, a key is new
        (CANONICAL not in grant.audience and not facts.required <= grant.audience, "refuse"),
        (r is not None and (r.tool, r.arguments_hash) != (facts.tool, facts.arguments_hash), "conflict"),
        (facts.state in (TargetState.GONE, None), "lost: outcome_gone"),
        (r is not None and isinstance(r.target, TaskTarget), "replay"),
        (facts.state is TargetState.ANSWERED, "replay"),
        (facts.state is TargetState.RUNNING, "in progress"),
        (facts.state is TargetState.OWNER_DEAD, "settle"),
        (facts.state is TargetState.LOST, "lost: execution_lost"),
    ]
    return next(answer for matched, answer in rows if matched)


def named(verdict: object) -> str:
    match verdict:
        case Run():
            return "run"
        case Refuse():
            return "refuse"
        case Conflict():
            return "conflict"
        case Replay():
            return "replay"
        case InProgress():
            return "in progress"
        case Settle():
            return "settle"
        case Lost(reason=reason):
            return f"lost: {reason}"
    raise AssertionError(verdict)


@given(worlds())
def test_the_decision_is_the_tables(world: tuple[DuplicateFacts, Grant]) -> None:
    facts, grant = world
    verdict = decide_duplicate(facts, grant, POLICY)
    assert named(verdict) == oracle(facts, grant)


@given(worlds())
def test_only_a_live_key_of_ones_own_is_not_run(world: tuple[DuplicateFacts, Grant]) -> None:
    """Invariant 4 (no oracle across principals) and the SEP's MUST NOT execute twice, stated directly."""
    facts, grant = world
    verdict = decide_duplicate(facts, grant, POLICY)
    live = facts.record is not None and facts.record.principal == ALICE and facts.record.expires > NOW
    assert isinstance(verdict, Run) == (not live)
    if isinstance(verdict, Replay | InProgress | Settle | Lost):
        assert POLICY.covers(grant.audience, facts.required, grant.scopes)  # invariant 1: nothing uncovered


@given(worlds())
def test_the_verdicts_errors_name_the_key_and_the_seps_type(world: tuple[DuplicateFacts, Grant]) -> None:
    facts, grant = world
    verdict = decide_duplicate(facts, grant, POLICY)
    if isinstance(verdict, Conflict):
        assert verdict.error()["data"] == {"type": CONFLICT, KEY_PARAM: "key-1"}
        assert verdict.error()["code"] == errors.INVALID_PARAMS
    if isinstance(verdict, InProgress):
        data = verdict.error()["data"]
        assert data["type"] == IN_PROGRESS and data[KEY_PARAM] == "key-1" and data["retryAfter"] >= 1
        assert data.get("lastEventId") == facts.last_event_id
    if isinstance(verdict, Lost):
        error = verdict.error()
        assert error["code"] == errors.EXECUTION_LOST and error["data"][KEY_PARAM] == "key-1"
        assert error["data"]["resumable"] is False
