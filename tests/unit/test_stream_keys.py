"""Stream keys: a time stamp that sorts as the time does, then random bits from a block of urandom bytes; a forked
child must not repeat its parent's next keys."""

from __future__ import annotations

import base64
import os
import random

import pytest

from mcp_lossless.server import keys
from mcp_lossless.server.keys import stamp, stream_key


def test_keys_are_distinct_across_blocks() -> None:
    keys = [stream_key() for _ in range(1000)]  # several 256-key blocks
    assert len(set(keys)) == len(keys)
    assert all(len(key) == 32 and "=" not in key for key in keys)  # a stamp, then 18 bytes of base64url
    assert all(len(base64.urlsafe_b64decode(key[8:])) == 18 for key in keys)
    assert len({key[8:] for key in keys}) == len(keys), "the random part alone is unique"
    assert [key[:8] for key in keys] == sorted(key[:8] for key in keys), "made in order, they sort in order"


def test_stamps_sort_as_the_times_do() -> None:
    chosen = random.Random(11)
    times = [0, 1, 63, 64, 2**47, 2**48 - 1, *(chosen.randrange(2**48) for _ in range(2_000))]
    stamps = {t: stamp(t) for t in times}
    digits = set("-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz")
    assert all(len(text) == 8 and set(text) <= digits for text in stamps.values())
    assert sorted(times, key=stamps.__getitem__) == sorted(times)
    assert len(set(stamps.values())) == len(set(times))


def test_a_forked_child_draws_fresh_bytes() -> None:
    stream_key()  # the parent holds a partly used block
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report the next key, then leave without running the test runner's exit hooks
        os.close(read_end)
        os.write(write_end, stream_key().encode())
        os._exit(0)
    os.close(write_end)
    child_key = os.read(read_end, 64).decode()
    os.close(read_end)
    os.waitpid(pid, 0)
    parent_next = [stream_key() for _ in range(4)]
    assert child_key and child_key not in parent_next


def test_a_keys_stamp_is_its_times_across_the_cached_high_digits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys reuse the stamp's first 6 digits for 4,096 ms: each key's stamp is still exactly its own time's, across
    a boundary of those digits, a jump forward and a clock that goes back."""
    entropy = keys._Entropy()
    times = [4095, 4096, 4097, 8191, 8192, 2**40 + 5, 2**40 + 4095, 2**40 + 4096, 9_000, 4096, 0, 2**48 - 1, 2**47]
    times += random.Random(12).sample(range(2**41, 2**41 + 3 * 4096), 300)
    for milliseconds in times:
        monkeypatch.setattr(keys, "time_ns", lambda ms=milliseconds: ms * 1_000_000 + 999_999)
        key = entropy.next_key()
        assert key[:8] == stamp(milliseconds), milliseconds
        assert len(key) == 32
