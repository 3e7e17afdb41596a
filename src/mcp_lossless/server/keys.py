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
import time

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


def stamp(milliseconds: int) -> str:
    """``milliseconds`` (below 2**48, beyond the year 10,000) as 8 characters that sort as the numbers do: its 6
    bytes are exactly 8 base64 digits, with no padding."""
    return binascii.b2a_base64(milliseconds.to_bytes(6, "big"), newline=False).translate(_SORTED).decode("ascii")


class _Entropy:
    __slots__ = ("_milliseconds", "_stamp", "_text", "_used")

    def __init__(self) -> None:
        self._text = ""
        self._used = _KEYS_PER_BLOCK
        self._milliseconds = -1
        self._stamp = ""
        """The last time stamp made, and its time: streams opened in the same millisecond share it."""

    def now(self) -> str:
        milliseconds = time.time_ns() // 1_000_000
        if milliseconds != self._milliseconds:
            self._milliseconds = milliseconds
            self._stamp = stamp(milliseconds)
        return self._stamp

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
    """A new stream key: when it was made (sorting in that order), then 144 random bits; 32 characters, base64url."""
    return _entropy.now() + _entropy.next_key()
