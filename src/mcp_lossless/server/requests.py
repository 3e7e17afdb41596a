"""The request core both protocol eras share (docs/decisions/0034): which era serves a request, decided once.

The legacy leg (:mod:`.transport`, :mod:`.dispatch`: sessions, streams, resumption) and the 2026-07-28 leg
(:mod:`.modern`: statelessness, tasks, multi round-trip input) keep what is theirs; what a request means in
either lives here once, as uvicorn's two HTTP implementations share ``flow_control``.
"""

from __future__ import annotations

import enum
from typing import Any, Literal

from ..core import protocol


class Leg(enum.Enum):
    """The era a POST opens when it is not the legacy one (whose revision is a string, or ``None``)."""

    MODERN = protocol.STATELESS
    """Served statelessly by the 2026-07-28 leg: no session, per-request ``_meta``."""


Requested = Literal[Leg.MODERN] | str | None
"""What :func:`era` decides: the modern leg, or the revision a legacy request asks for (``None``: its session's)."""


def era(index: dict[bytes, bytes], first: dict[str, Any] | None, alone: bool) -> Requested:
    """Which era serves a request, from its headers and its first message (``None`` for a GET), asked once per
    request. A message alone in its POST opens the modern way when its ``_meta`` carries the protocol version, or
    when it has no session and names a version no legacy session could have (the modern leg's validation then
    answers it). Otherwise it is legacy, asking for the ``MCP-Protocol-Version`` header's revision, else its
    ``_meta``'s (:func:`.checks.served_revision` refuses one not served; ``initialize`` negotiates instead).
    """
    raw = index.get(b"mcp-protocol-version")
    requested = None if raw is None else raw.decode("latin-1")
    meta = None
    if first is not None:
        params = first.get("params")
        meta = params.get("_meta") if isinstance(params, dict) else None
        if alone:
            if isinstance(meta, dict) and protocol.VERSION_META_KEY in meta:
                return Leg.MODERN
            if (
                requested is not None
                and b"mcp-session-id" not in index
                and requested not in protocol.HANDSHAKE_VERSIONS
            ):
                return Leg.MODERN
    if requested is None and isinstance(meta, dict):
        value = meta.get(protocol.VERSION_META_KEY)
        requested = value if isinstance(value, str) else None
    return requested
