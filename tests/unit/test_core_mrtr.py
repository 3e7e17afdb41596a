"""Properties of the sealed ``requestState`` and of ``inputResponses`` (multi round-trip requests)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core import mrtr
from mcp_lossless.core.principal import Principal

KEY = mrtr.state_key(b"s" * 32)
ALICE = Principal("https://as.example", "alice", "app")
BINDING = mrtr.Binding(ALICE, "tools/call", "book", {"city": "Paris"})
ANSWERS = st.dictionaries(  # what orjson parsed from a request body: integers within 64 bits
    st.text(min_size=1, max_size=8),
    st.dictionaries(st.text(max_size=5), st.integers(-(2**63), 2**63 - 1) | st.text(max_size=5)),
)


@given(ANSWERS)
def test_a_state_gives_back_its_answers_to_its_own_retry(answers: dict[str, dict[str, object]]) -> None:
    state = mrtr.seal(KEY, BINDING, answers, 100.0)
    assert mrtr.unseal(KEY, state, BINDING, 100.0 + mrtr.STATE_SECONDS) == answers
    assert state.isascii() and " " not in state


@given(st.integers(0, 200), st.sampled_from("-_.aA0="))
def test_any_altered_state_is_refused(position: int, char: str) -> None:
    state = mrtr.seal(KEY, BINDING, {"user_name": {"action": "accept", "content": {"name": "Alice"}}}, 100.0)
    position %= len(state)
    altered = state[:position] + char + state[position + 1 :]
    if altered != state:
        with pytest.raises(mrtr.BadInput):
            mrtr.unseal(KEY, altered, BINDING, 100.0)
    with pytest.raises(mrtr.BadInput, match="verification"):
        mrtr.unseal(KEY, state + "-TAMPERED", BINDING, 100.0)


def test_a_state_is_refused_for_another_principal_request_key_or_time() -> None:
    state = mrtr.seal(KEY, BINDING, {}, 100.0)
    others = [
        mrtr.Binding(Principal("https://as.example", "bob", "app"), "tools/call", "book", {"city": "Paris"}),
        mrtr.Binding(ALICE, "prompts/get", "book", {"city": "Paris"}),
        mrtr.Binding(ALICE, "tools/call", "cancel", {"city": "Paris"}),
        mrtr.Binding(ALICE, "tools/call", "book", {"city": "Rome"}),
    ]
    for other in others:
        with pytest.raises(mrtr.BadInput, match="another"):
            mrtr.unseal(KEY, state, other, 100.0)
    with pytest.raises(mrtr.BadInput, match="verification"):
        mrtr.unseal(mrtr.state_key(b"t" * 32), state, BINDING, 100.0)
    with pytest.raises(mrtr.BadInput, match="expired"):
        mrtr.unseal(KEY, state, BINDING, 100.0 + mrtr.STATE_SECONDS + 1)
    for junk in (None, 7, "", ".", "a.b", "%%%.%%%"):
        with pytest.raises(mrtr.BadInput):
            mrtr.unseal(KEY, junk, BINDING, 100.0)


def test_input_responses_must_map_keys_to_objects() -> None:
    assert mrtr.input_responses({"a": {"action": "accept"}, "b": {}}) == {"a": {"action": "accept"}, "b": {}}
    for bad in (None, [], "x", {"user_name": 12345}, {"a": {}, "b": None}):
        with pytest.raises(mrtr.BadInput, match="inputResponses"):
            mrtr.input_responses(bad)


def test_a_retry_combines_its_sealed_rounds_with_its_new_answers() -> None:
    state = mrtr.seal(KEY, BINDING, {"step1": {"action": "accept"}}, 100.0)
    params = {"requestState": state, "inputResponses": {"step2": {"action": "accept"}}}
    assert set(mrtr.answers_of(KEY, params, BINDING, 101.0)) == {"step1", "step2"}
    assert mrtr.answers_of(KEY, {}, BINDING, 101.0) == {}
