"""Random stream keys, drawn from ``os.urandom`` a block at a time: one system call per 256 streams, not per call."""

from __future__ import annotations

import os

from ..core.eventids import new_key

_KEY_BYTES = 16
_BLOCK_BYTES = 256 * _KEY_BYTES


class _Entropy:
    __slots__ = ("_block", "_used")

    def __init__(self) -> None:
        self._block = b""
        self._used = 0

    def take(self, size: int) -> bytes:
        if self._used + size > len(self._block):
            self._block = os.urandom(_BLOCK_BYTES)
            self._used = 0
        start = self._used
        self._used = start + size
        return self._block[start : self._used]

    def forget(self) -> None:
        """After a fork: the child must never hand out bytes its parent may also hand out."""
        self._block = b""
        self._used = 0


_entropy = _Entropy()
os.register_at_fork(after_in_child=_entropy.forget)


def stream_key() -> str:
    """A new stream key: 128 random bits, base64url."""
    return new_key(_entropy.take(_KEY_BYTES))
