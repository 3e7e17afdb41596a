"""MCP protocol revisions this implementation speaks, and what each allows."""

from __future__ import annotations

LATEST = "2025-11-25"
"""The newest revision negotiated by ``initialize``: what a server answers a revision it does not know with."""
HANDSHAKE_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26")
"""The revisions negotiated by ``initialize``, with sessions and resumption (the legacy leg), newest first."""
STATELESS = "2026-07-28"
"""The stateless revision: no sessions, no resumption; served by the modern leg beside the legacy ones (ADR 0012)."""
SERVED_VERSIONS = (STATELESS, *HANDSHAKE_VERSIONS)
"""Every revision the server serves, the modern one first: ``server/discover``'s list, and ``-32022``'s
``data.supported`` on the modern leg."""
BATCHING = "2025-03-26"
"""The one revision with JSON-RPC batches."""
RESOURCE_META_KEY = "io.github.mcp-lossless/resource"
"""Where an mcp-lossless server publishes each tool's RFC 8707 resource indicator in ``tools/list`` (a tool's
``_meta``); the client and the audit read it there. Any server may adopt the convention."""
SCOPES_META_KEY = "io.github.mcp-lossless/scopes"
"""Where ``tools/list`` names the OAuth scopes a tool needs besides its resource (when it declares any)."""


def negotiate(requested: object) -> str:
    """The version a server answers an ``initialize`` with: the client's if supported, else the latest."""
    return requested if isinstance(requested, str) and requested in HANDSHAKE_VERSIONS else LATEST


def allows_batches(version: str) -> bool:
    return version == BATCHING


def primes_streams(version: str) -> bool:
    """Priming events (id + empty data) only for clients that can parse them (>= 2025-11-25)."""
    return version >= LATEST


# The ``_meta`` keys of 2026-07-28, which has no handshake: every request says what ``initialize`` said once.
VERSION_META_KEY = "io.modelcontextprotocol/protocolVersion"
"""Where a 2026-07-28 request carries its revision (``params._meta``): such a request never has a session."""
CAPABILITIES_META_KEY = "io.modelcontextprotocol/clientCapabilities"
"""Where a 2026-07-28 request carries its client's capabilities (an object)."""
CLIENT_INFO_META_KEY = "io.modelcontextprotocol/clientInfo"
"""Where a 2026-07-28 request carries its client's name and version."""
SERVER_INFO_META_KEY = "io.modelcontextprotocol/serverInfo"
"""Where ``server/discover``'s result carries the server's name and version."""
LOG_LEVEL_META_KEY = "io.modelcontextprotocol/logLevel"
"""The level from which a 2026-07-28 request asks for its log messages (``logging/setLevel`` is gone)."""
SUBSCRIPTION_META_KEY = "io.modelcontextprotocol/subscriptionId"
"""Where a ``subscriptions/listen`` stream's notifications name the request that opened it."""
LOGGING_LEVELS = ("debug", "info", "notice", "warning", "error", "critical", "alert", "emergency")
"""MCP's ``LoggingLevel`` (RFC 5424's severities), least severe first."""
NAME_PARAMS = {
    "tools/call": "name",
    "resources/read": "uri",
    "prompts/get": "name",
    "tasks/get": "taskId",
    "tasks/update": "taskId",
    "tasks/cancel": "taskId",
    "tasks/stream": "taskId",
}
"""The 2026-07-28 requests whose ``Mcp-Name`` header mirrors a parameter, and which one (SEP-2243)."""
ACCEPT_POST = "application/json, text/event-stream"
"""The ``Accept`` of every POST: a server answers with JSON or opens an SSE stream, as it chooses."""
