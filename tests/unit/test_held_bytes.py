"""The per-principal counts behind ``stored_bytes_per_principal`` (stores/held.py): sessions add to their principal
only, forgetting a session releases all it held, what is queued counts until it lands, and a store whose streams
expire by themselves (Redis) releases a completed stream after its retention, on an injected clock."""

from __future__ import annotations

import pytest

from mcp_lossless.core.errors import LIMIT_EXCEEDED
from mcp_lossless.core.limits import Limits
from mcp_lossless.core.principal import Principal
from mcp_lossless.server.errors import Refused
from mcp_lossless.server.sessions import SessionRegistry
from mcp_lossless.stores.held import ROW_BYTES, STREAM_BYTES, ExpiringHeld, HeldBytes, HeldKeys
from mcp_lossless.stores.memory import MemoryStore

ALICE = Principal("https://as.example", "alice", "client")
BOB = Principal("https://as.example", "bob", "client")


def test_sessions_add_to_their_own_principal_and_forgetting_one_releases_all_it_held() -> None:
    counts = HeldBytes()
    counts.bind("a1", ALICE)
    counts.bind("a2", ALICE)
    counts.bind("b1", BOB)
    counts.add("a1", 100)
    counts.add("a2", 50)
    counts.add("b1", 7)
    counts.add("nobody", 1000)  # a session the store was never told of is not counted
    assert (counts.held(ALICE), counts.held(BOB)) == (150, 7)
    counts.add("a1", -400)  # a release never takes a session below nothing, nor its principal's other sessions
    assert counts.held(ALICE) == 50
    counts.forget("a2")
    counts.forget("a2")
    assert (counts.held(ALICE), counts.held(BOB)) == (0, 7)


def test_what_is_queued_counts_until_it_lands_even_if_its_session_goes_meanwhile() -> None:
    counts = HeldBytes()
    counts.bind("a1", ALICE)
    counts.queue("a1", 300)
    counts.queue("a1", 200)
    assert counts.held(ALICE) == 500
    counts.add("a1", 300)  # the writer committed the first one: counted twice until it lands, never less
    counts.landed({"a1": 300})
    assert counts.held(ALICE) == 500
    counts.forget("a1")
    counts.landed({"a1": 200})
    assert counts.held(ALICE) == 0


def test_queued_bytes_of_two_sessions_of_one_principal_land_apart_and_count_together() -> None:
    """Each session's queued bytes land on their own; the principal's figure is their sum until the last lands, and
    what is queued after that counts afresh."""
    counts = HeldBytes()
    counts.bind("a1", ALICE)
    counts.bind("a2", ALICE)
    counts.bind("b1", BOB)
    counts.queue("a1", 100)
    counts.queue("a2", 40)
    counts.queue("b1", 5)
    assert (counts.held(ALICE), counts.held(BOB)) == (140, 5)
    counts.landed({"a1": 100, "b1": 5})
    assert (counts.held(ALICE), counts.held(BOB)) == (40, 0)
    counts.queue("a1", 7)
    counts.landed({"a2": 40})
    assert counts.held(ALICE) == 7
    counts.landed({"a1": 1000})  # more than is queued lands: nothing goes below nothing
    counts.queue("a2", 3)
    assert (counts.held(ALICE), counts.held(BOB)) == (3, 0)


def test_a_completed_stream_is_released_when_its_keys_expire_and_a_purged_session_at_once() -> None:
    now = [0.0]
    held = ExpiringHeld(retention_seconds=60, clock=lambda: now[0])
    held.counts.bind("s1", ALICE)
    held.counts.bind("s2", ALICE)
    held.opened("s1", "k1")
    held.appended("s1", "k1", 1000, completes=False)
    held.appended("s1", "k1", 10, completes=True)
    held.opened("s2", "k2")
    held.appended("s2", "k2", 500, completes=False)
    stream1 = STREAM_BYTES + 1010 + 2 * ROW_BYTES
    stream2 = STREAM_BYTES + 500 + ROW_BYTES
    assert held.held(ALICE) == stream1 + stream2
    now[0] = 59.9
    assert held.held(ALICE) == stream1 + stream2
    now[0] = 60.0
    assert held.held(ALICE) == stream2
    held.forget("s2", ["k2"])
    held.completed("k2")  # a stream of a purged session has nothing left to release
    now[0] = 1000.0
    assert held.held(ALICE) == 0


@pytest.mark.anyio
async def test_a_post_of_a_principal_holding_its_bound_is_refused_before_anything_is_stored() -> None:
    class Full(MemoryStore):
        def stored_bytes(self, principal: Principal) -> int:
            return 1024 if principal == ALICE else 0

    refused: list[str] = []
    registry = SessionRegistry(Full(), Limits(stored_bytes_per_principal=1024), refused.append)
    alice = await registry.create(ALICE, "2025-11-25", 0.0)
    bob = await registry.create(BOB, "2025-11-25", 0.0)
    with pytest.raises(Refused) as caught:
        registry.admit(alice, 0)  # even a ping stores its answer
    assert caught.value.status == 429
    assert caught.value.body["error"]["code"] == LIMIT_EXCEEDED
    assert caught.value.body["error"]["data"]["limit"] == "stored_bytes_per_principal"
    registry.admit(bob, 1)
    assert refused == ["stored_bytes_per_principal"]


def test_held_keys_count_and_know_each_key_until_it_expires_and_a_purge_forgets_them() -> None:
    alice, bob = Principal("iss", "alice", "c"), Principal("iss", "bob", "c")
    keys = HeldKeys()
    keys.add(alice, "k1", 10.0, 1)
    keys.add(alice, "k2", 20.0, 2)
    keys.add(bob, "k1", 10.0, 3)
    assert (keys.held(alice, 5.0), keys.known(alice, "k1", 5.0), keys.known(alice, "k3", 5.0)) == (2, 1, None)
    assert keys.held(alice, 10.0) == 1 and keys.known(alice, "k1", 10.0) is None, "expired at its time"
    keys.add(alice, "k1", 30.0, 4)  # recorded again once expired: the new expiry and row count
    assert keys.held(alice, 25.0) == 1 and keys.known(alice, "k1", 25.0) == 4 and keys.known(alice, "k2", 25.0) is None
    keys.purge(40.0)
    assert (keys.held(alice, 0.0), keys.held(bob, 0.0), keys.known(bob, "k1", 0.0)) == (0, 0, None)
