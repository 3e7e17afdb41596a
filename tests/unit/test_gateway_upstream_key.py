"""The key the gateway sends upstream for its client's (ADR 0033): the same for the same principal and key on every
gateway process, another for another principal's same string, a valid SEP-3182 key that shows neither."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core.idempotency import MAX_KEY_CHARS, key_of
from mcp_lossless.core.principal import Principal
from mcp_lossless.gateway.upstream import UPSTREAM_KEY_PREFIX, upstream_key

ALICE = Principal("https://as.example", "alice", "app")
keys = st.text(min_size=1, max_size=MAX_KEY_CHARS)
names = st.text(max_size=40)


@given(keys)
def test_the_same_principal_and_key_derive_the_same_valid_key_that_shows_neither(key: str) -> None:
    derived = upstream_key(ALICE, key)
    assert derived == upstream_key(Principal(*ALICE), key), "a restarted gateway or a replica sends the same"
    assert derived.startswith(UPSTREAM_KEY_PREFIX) and key_of({"idempotencyKey": derived}) == derived
    assert len(derived) == 47 and (len(key) < 8 or key not in derived) and "alice" not in derived


@given(names, names, names, keys)
def test_another_principal_or_key_derives_another_key(issuer: str, subject: str, client: str, key: str) -> None:
    other = Principal(issuer, subject, client)
    if other != ALICE:
        assert upstream_key(other, key) != upstream_key(ALICE, key), "no principal gets another's outcome upstream"
    assert upstream_key(ALICE, key) != upstream_key(ALICE, key + "x")


def test_fields_cannot_be_shifted_into_one_another() -> None:
    """The encoding keeps ("ab", "c") and ("a", "bc") apart, whatever characters the fields hold."""
    assert upstream_key(Principal("i", "ab", "c"), "k") != upstream_key(Principal("i", "a", "bc"), "k")
    assert upstream_key(Principal("i", "a\0b", "c"), "k") != upstream_key(Principal("i", "a", "b\0c"), "k")
    assert upstream_key(Principal("i", 'a","b', "c"), "k") != upstream_key(Principal("i", "a", 'b","c'), "k")
