"""The request core both eras share (server/requests.py, ADR 0034), without a server: which leg serves a request,
the method table each router reads, the coverage refusal's words and data.

The same decisions are held over the wire, both eras side by side, by
``tests/integration/test_request_core_asgi.py``; here each is held to its table.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core.protocol import HANDSHAKE_VERSIONS, STATELESS, VERSION_META_KEY
from mcp_lossless.core.resources import is_scope_tag, scope_tag
from mcp_lossless.server.observability import Metrics
from mcp_lossless.server.requests import (
    LEGACY_METHODS,
    METHODS,
    NEVER_STATELESS,
    STATELESS_METHODS,
    Leg,
    era,
    extra,
    uncovered,
)

SESSION = {b"mcp-session-id": b"s1"}
WRITE = scope_tag("files:write")


def message(version: str | None = None, **params: Any) -> dict[str, Any]:
    """A request whose ``_meta`` carries ``version`` (none when ``None``)."""
    if version is not None:
        params["_meta"] = {VERSION_META_KEY: version}
    return {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": params}


def versioned(version: str, **more: bytes) -> dict[bytes, bytes]:
    return {b"mcp-protocol-version": version.encode(), **{k.encode(): v for k, v in more.items()}}


@pytest.mark.parametrize(
    ("index", "first", "alone", "decided"),
    [
        ({}, message(STATELESS), True, Leg.MODERN),  # _meta alone decides: the modern way
        (SESSION, message(STATELESS), True, Leg.MODERN),  # even beside a session
        (versioned(STATELESS), message(), True, Leg.MODERN),  # the modern version without a session
        (versioned("2099-01-01"), message(), True, Leg.MODERN),  # a version no session has: the leg's validation
        (versioned(STATELESS) | SESSION, message(), True, STATELESS),  # on a session: legacy, refused unserved
        (versioned("2025-11-25"), message(), True, "2025-11-25"),
        ({}, message(), True, None),  # the session's revision
        ({}, message("2025-06-18"), False, "2025-06-18"),  # a batch: legacy, its first message's _meta revision
        ({}, message(STATELESS), False, STATELESS),  # a batch never opens the modern way
        (versioned("2025-03-26"), message("2025-06-18"), False, "2025-03-26"),  # the header before _meta
        ({}, {"jsonrpc": "2.0", "id": 1, "method": "m", "params": {"_meta": {VERSION_META_KEY: 7}}}, True, Leg.MODERN),
        ({}, {"jsonrpc": "2.0", "id": 1, "method": "m", "params": {"_meta": {VERSION_META_KEY: 7}}}, False, None),
        (versioned(STATELESS), None, False, STATELESS),  # a GET: no message, never the modern way
    ],
)
def test_which_leg_serves_a_request(
    index: dict[bytes, bytes], first: dict[str, Any] | None, alone: bool, decided: object
) -> None:
    assert era(index, first, alone) == decided


@given(st.one_of(st.none(), st.sampled_from([*HANDSHAKE_VERSIONS, STATELESS]), st.text(max_size=12)), st.booleans())
def test_a_get_is_never_served_by_the_modern_leg_and_asks_for_its_header(version: str | None, session: bool) -> None:
    index = {} if version is None else {b"mcp-protocol-version": version.encode("utf-8")}
    if session:
        index |= SESSION
    decided = era(index, None, False)
    assert decided is not Leg.MODERN
    assert decided == (None if version is None else version.encode("utf-8").decode("latin-1"))


def test_the_method_table_s_two_views_are_the_eras_columns() -> None:
    assert {m: kind for m, (kind, legacy, _) in METHODS.items() if legacy} == LEGACY_METHODS
    assert {m: kind for m, (kind, _, modern) in METHODS.items() if modern} == STATELESS_METHODS
    assert LEGACY_METHODS.keys() & STATELESS_METHODS.keys() == {"tools/call", "tools/list"}
    assert {"ping", "logging/setLevel"} <= LEGACY_METHODS.keys() & NEVER_STATELESS
    assert not STATELESS_METHODS.keys() & NEVER_STATELESS, "a removed method is never served statelessly"


def test_an_extra_method_is_served_unless_the_stateless_revision_removed_it() -> None:
    extras = {"prompts/get", "resources/subscribe"}
    assert extra("prompts/get", False, extras) == extra("prompts/get", True, extras) == "extra"
    assert extra("resources/subscribe", False, extras) == "extra"
    assert extra("resources/subscribe", True, extras) is None
    assert extra("nothing/here", False, extras) is extra("nothing/here", True, extras) is None


@pytest.mark.parametrize(
    ("missing", "words"),
    [
        (["https://h/mcp/tools/fetch"], "token audience does not cover https://h/mcp/tools/fetch"),
        ([WRITE], "token lacks scope files:write"),
        (
            ["https://h/mcp/tools/fetch", WRITE],
            "token audience does not cover https://h/mcp/tools/fetch, scope files:write",
        ),
    ],
)
def test_the_coverage_refusal_says_what_the_token_lacks_and_challenges_for_it(missing: list[str], words: str) -> None:
    metrics = Metrics()
    needed = {"https://h/mcp/tools/fetch", WRITE}
    refusal = uncovered(missing, needed, "https://h/.well-known/oauth-protected-resource/mcp", metrics)
    assert refusal.description == words
    assert refusal.data["requiredResources"] == [t for t in missing if not is_scope_tag(t)]
    assert refusal.data["authorization"]["reason"] == "insufficient_authorization"
    [(name, challenge)] = refusal.challenge
    assert name == b"www-authenticate" and f'error_description="{words}"'.encode() in challenge
    assert metrics.refusals.labels("insufficient_audience", "call")._value.get() == 1
