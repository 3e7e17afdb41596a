"""Stream keys come from a block of urandom bytes; a forked child must not repeat its parent's next keys."""

from __future__ import annotations

import base64
import os

from mcp_lossless.server.keys import stream_key


def test_keys_are_distinct_across_blocks() -> None:
    keys = [stream_key() for _ in range(1000)]  # several 256-key blocks
    assert len(set(keys)) == len(keys)
    assert all(len(key) == 24 and "=" not in key for key in keys)  # 18 bytes, base64url without padding
    assert all(len(base64.urlsafe_b64decode(key)) == 18 for key in keys)


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
