"""Opaque, unguessable event ids that carry their own proof of origin.

An id is ``<stream>.<seq>.<mac>``: the stream key (random, base64url), the position in that stream
(hex), and a MAC over (session, stream): keyed BLAKE2b with the server secret, a MAC by design and 3x
cheaper than HMAC-SHA256 through OpenSSL 3 here, computed once per stream (ADR 0007). The MAC makes ids
of a stream unforgeable for anyone who has not been sent one, binds them to their session without a
lookup, and keeps working across restarts and replicas that share the secret. The position is not
authenticated: only a holder of the stream can name one, and naming a later one than received only
skips events the holder itself gives up. The stream key lets the server find the stream without a scan.
"""

from __future__ import annotations

import binascii
import hashlib
import hmac
import re
from dataclasses import dataclass
from enum import Enum

_MAC_BYTES = 12
_ID_RE = re.compile(r"^([A-Za-z0-9_-]{16,64})\.([0-9a-f]{1,12})\.([A-Za-z0-9_-]{16})$")


_URLSAFE = bytes.maketrans(b"+/", b"-_")


def _b64(raw: bytes) -> str:
    """Unpadded base64url (``base64.urlsafe_b64encode`` costs three more calls; this runs per event)."""
    return binascii.b2a_base64(raw, newline=False).translate(_URLSAFE).rstrip(b"=").decode("ascii")


def new_key(random_bytes: bytes) -> str:
    """A stream key or session id from caller-supplied entropy (the core never reads a RNG)."""
    return _b64(random_bytes)


@dataclass(frozen=True, slots=True)
class Cursor:
    """A verified position: the last event the client received on ``stream``."""

    stream: str
    seq: int


class CursorProblem(Enum):
    """Why a ``Last-Event-ID`` cannot be used, as the server reports it."""

    MALFORMED = "malformed"
    UNKNOWN = "unknown"
    FOREIGN_SESSION = "foreign_session"
    FOREIGN_STREAM = "foreign_stream"
    EVICTED = "evicted"
    LOST = "lost"

    @property
    def status(self) -> int:
        """The HTTP status of a resume refused for this reason (ADR 0002), as h11's ``error_status_hint``."""
        return CURSOR_STATUS[self]

    @property
    def description(self) -> str:
        """What the refusal's body says to the client."""
        return CURSOR_TEXT[self]


CURSOR_STATUS = {
    CursorProblem.MALFORMED: 400,
    CursorProblem.UNKNOWN: 400,
    CursorProblem.FOREIGN_SESSION: 409,
    CursorProblem.FOREIGN_STREAM: 409,
    CursorProblem.EVICTED: 410,
    CursorProblem.LOST: 410,
}
"""404 stays with its spec meaning (the session is unknown or not yours: initialize again)."""
CURSOR_TEXT = {
    CursorProblem.MALFORMED: "Last-Event-ID is not an event id this server issues",
    CursorProblem.UNKNOWN: "Last-Event-ID names no event of this session",
    CursorProblem.FOREIGN_SESSION: "Last-Event-ID belongs to another session",
    CursorProblem.FOREIGN_STREAM: "Last-Event-ID does not belong to the stream it names",
    CursorProblem.EVICTED: "events after Last-Event-ID are no longer retained; replaying the rest would lose them",
    CursorProblem.LOST: "the event store lost events it had acknowledged (a failover?): it no longer holds"
    " Last-Event-ID, so the rest of this stream cannot be replayed; re-issue the call",
}


@dataclass(frozen=True, slots=True)
class Unverified:
    """Well-formed but its MAC does not hold for this session: forged, spliced, or another session's."""

    stream: str
    seq: int


class EventIdCodec:
    """Encodes and verifies event ids with one server secret."""

    __slots__ = ("_keyed",)

    def __init__(self, secret: bytes) -> None:
        if not 16 <= len(secret) <= 64:
            raise ValueError("event id secret must be 16 to 64 bytes (a BLAKE2b key)")
        self._keyed = hashlib.blake2b(key=secret, digest_size=_MAC_BYTES)
        """The hash state after the key block: copying it is cheaper than keying a new hash per id."""

    def stream_mac(self, session_id: str, stream: str) -> str:
        """The MAC every id of ``stream`` carries; a producer computes it once per stream."""
        mac = self._keyed.copy()
        mac.update(f"{session_id}\x00{stream}".encode())
        return _b64(mac.digest())

    @staticmethod
    def encode(stream: str, seq: int, mac: str) -> str:
        """The id of position ``seq`` of ``stream``, whose :meth:`stream_mac` is ``mac``."""
        return f"{stream}.{seq:x}.{mac}"

    def decode(self, raw: str, session_id: str) -> Cursor | Unverified | CursorProblem:
        """Parse ``raw``; a :class:`Cursor` only when it was issued for ``session_id``."""
        match = _ID_RE.match(raw)
        if match is None:
            return CursorProblem.MALFORMED
        stream, seq_hex, mac = match.groups()
        seq = int(seq_hex, 16)
        if hmac.compare_digest(mac, self.stream_mac(session_id, stream)):
            return Cursor(stream, seq)
        return Unverified(stream, seq)
