"""Stream keys: the time they were made, then random bits drawn from ``os.urandom`` a block at a time (one system
call and one encoding per 256 streams).

A key is 8 characters of the time in milliseconds (48 bits), then 18 random bytes (144 bits), which base64url
encodes to exactly 24 characters with no padding, so the block is encoded once and each key's random part is a
slice of its text. The time is written in base64url's characters sorted as bytes (``-0-9A-Z_a-z``), so keys sort
in the order they were made: a store that indexes streams by key (SQLite, ADR 0017) then adds each new key at
the end of its index instead of on a random page. The random part alone makes a key unique and unguessable;
the time tells the client that holds a stream's event ids nothing it did not know (when it made its request).
"""

from __future__ import annotations

import binascii
import os
from time import time_ns

from ..core.eventids import new_key

_KEY_BYTES = 18
_KEY_CHARS = 24
_KEYS_PER_BLOCK = 256
_SORTED = bytes.maketrans(
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/",
    b"-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz",
)
"""Each base64 digit to the digit of the same value in an alphabet in byte order (a byte table: ``str.translate``
looks each character up in a dict, 2,500 instructions a stamp)."""
_SORTED_DIGITS = b"-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz".decode("ascii")


def stamp(milliseconds: int) -> str:
    """``milliseconds`` (below 2**48, beyond the year 10,000) as 8 characters that sort as the numbers do: its 6
    bytes are exactly 8 base64 digits, with no padding."""
    return binascii.b2a_base64(milliseconds.to_bytes(6, "big"), newline=False).translate(_SORTED).decode("ascii")


_LOW_DIGITS = tuple(a + b for a in _SORTED_DIGITS for b in _SORTED_DIGITS)
"""A stamp's last two digits (its time's low 12 bits) for each of their 4,096 values."""


class _Entropy:
    __slots__ = ("_base", "_high_stamp", "_keys", "_until")

    def __init__(self) -> None:
        self._keys: list[str] = []
        """The random parts of the current block not handed out yet (taken from the end)."""
        self._base = 0
        self._until = 0
        self._high_stamp = ""
        """The first 6 digits of the stamps of times ``_base`` to ``_until`` (excluded), 4,096 ms that share their
        bits above the low 12: a key's stamp is these, then its last two digits looked up (:data:`_LOW_DIGITS`),
        not 8 digits encoded for each new millisecond (3,000 instructions under callgrind, where every key
        falls in a new one)."""

    def next_key(self) -> str:
        milliseconds = time_ns() // 1_000_000
        if not self._base <= milliseconds < self._until:  # a new 4.096 s, or the clock went back
            self._base = milliseconds & ~4095
            self._until = self._base + 4096
            self._high_stamp = stamp(milliseconds)[:6]
        keys = self._keys
        if not keys:
            keys = self._keys = self._block()
        return f"{self._high_stamp}{_LOW_DIGITS[milliseconds - self._base]}{keys.pop()}"  # one join, not two concats

    @staticmethod
    def _block() -> list[str]:
        """A block's random parts, in reverse so that :meth:`next_key` pops them in the block's order."""
        text = new_key(os.urandom(_KEY_BYTES * _KEYS_PER_BLOCK))
        keys = [text[start : start + _KEY_CHARS] for start in range(0, len(text), _KEY_CHARS)]
        keys.reverse()
        return keys

    def forget(self) -> None:
        """After a fork: the child must never hand out keys its parent may also hand out."""
        self._keys = []


_entropy = _Entropy()
os.register_at_fork(after_in_child=_entropy.forget)


stream_key = _entropy.next_key
"""A new stream key: when it was made (sorting in that order), then 144 random bits; 32 characters, base64url."""
