"""Random stream keys, drawn from ``os.urandom`` a block at a time: one system call and one encoding per 256 streams.

A key is 18 random bytes (144 bits), which base64url encodes to exactly 24 characters with no padding, so the
block is encoded once and each key is a slice of its text.
"""

from __future__ import annotations

import os

from ..core.eventids import new_key

_KEY_BYTES = 18
_KEY_CHARS = 24
_KEYS_PER_BLOCK = 256


class _Entropy:
    __slots__ = ("_text", "_used")

    def __init__(self) -> None:
        self._text = ""
        self._used = _KEYS_PER_BLOCK

    def next_key(self) -> str:
        used = self._used
        if used == _KEYS_PER_BLOCK:
            self._text = new_key(os.urandom(_KEY_BYTES * _KEYS_PER_BLOCK))
            used = 0
        self._used = used + 1
        start = used * _KEY_CHARS
        return self._text[start : start + _KEY_CHARS]

    def forget(self) -> None:
        """After a fork: the child must never hand out keys its parent may also hand out."""
        self._text = ""
        self._used = _KEYS_PER_BLOCK


_entropy = _Entropy()
os.register_at_fork(after_in_child=_entropy.forget)


def stream_key() -> str:
    """A new stream key: 144 random bits, base64url."""
    return _entropy.next_key()
