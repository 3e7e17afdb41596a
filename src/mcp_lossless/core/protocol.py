"""MCP protocol revisions this implementation speaks, and what each allows."""

from __future__ import annotations

LATEST = "2025-11-25"
SUPPORTED = ("2025-11-25", "2025-06-18", "2025-03-26")
STATELESS = "2026-07-28"
"""The stateless revision: no sessions, no resumption; served by the modern leg beside the legacy ones (ADR 0012)."""
BATCHING = "2025-03-26"
"""The one revision with JSON-RPC batches."""
RESOURCE_META_KEY = "io.github.mcp-lossless/resource"
"""Where an mcp-lossless server publishes each tool's RFC 8707 resource indicator in ``tools/list`` (a tool's
``_meta``); the client and the audit read it there. Any server may adopt the convention."""
SCOPES_META_KEY = "io.github.mcp-lossless/scopes"
"""Where ``tools/list`` names the OAuth scopes a tool needs besides its resource (when it declares any)."""


def negotiate(requested: object) -> str:
    """The version a server answers an ``initialize`` with: the client's if supported, else the latest."""
    return requested if isinstance(requested, str) and requested in SUPPORTED else LATEST


def allows_batches(version: str) -> bool:
    return version == BATCHING


def primes_streams(version: str) -> bool:
    """Priming events (id + empty data) only for clients that can parse them (>= 2025-11-25)."""
    return version >= "2025-11-25"


VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
"""Where a 2026-07-28 request carries its revision (``params._meta``): such a request never has a session."""
