"""Which OAuth scopes the client asks for: the MCP scope selection strategy (2025-11-25 authorization).

1. The scopes the application configured, plus every scope a ``WWW-Authenticate`` challenge named. A
   step-up keeps what was asked for before and adds the challenged scope (the union, SEP-2350), so a
   second authorization never loses what the first one granted.
2. Failing those, every scope the protected resource metadata lists in ``scopes_supported``.
3. Failing that, no ``scope`` parameter at all: the authorization server applies its default.
"""

from __future__ import annotations

from collections.abc import Iterable


class ScopeSelection:
    """The scope set for the next authorization or token request, learnt from challenges and metadata."""

    def __init__(self, configured: str | None = None) -> None:
        self._requested: set[str] = set(configured.split()) if configured else set()
        self._supported: frozenset[str] = frozenset()

    def challenged(self, scope: str | None) -> None:
        """A challenge named ``scope`` (space-separated): add it to what is requested."""
        if scope:
            self._requested.update(scope.split())

    def advertised(self, scopes_supported: object) -> None:
        """Protected resource metadata listed ``scopes_supported``; a non-list is ignored, as RFC 9728 allows."""
        if isinstance(scopes_supported, list):
            self._supported = frozenset(s for s in scopes_supported if isinstance(s, str) and s)

    def current(self) -> str | None:
        """The ``scope`` parameter to send, or ``None`` to omit it."""
        chosen: Iterable[str] = self._requested or self._supported
        return " ".join(sorted(chosen)) or None
