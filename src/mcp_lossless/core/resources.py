"""RFC 8707 resource indicators: canonical form and audience coverage.

Indicators are compared canonically (absolute URI, no fragment, lowercase scheme and host, no trailing
slash) so that ``HTTPS://Example.com/mcp/`` and ``https://example.com/mcp`` name the same resource.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

Audience = frozenset[str]
"""A token's audience: the canonical resource indicators of its ``aud`` claim."""


class InvalidResource(ValueError):
    """A resource indicator that RFC 8707 forbids: relative, with a fragment, or not a URI."""


def canonical_resource(uri: str) -> str:
    """Return the canonical form of ``uri`` or raise :class:`InvalidResource`."""
    text = uri.strip()
    if not text.isprintable() or any(c.isspace() for c in text):
        raise InvalidResource(f"resource indicator must not contain whitespace or control characters: {uri!r}")
    try:
        parts = urlsplit(text)
    except ValueError as exc:
        raise InvalidResource(f"not a URI: {uri!r}") from exc
    if not parts.scheme or not parts.netloc:
        raise InvalidResource(f"resource indicator must be an absolute URI: {uri!r}")
    if "#" in text:
        raise InvalidResource(f"resource indicator must not contain a fragment: {uri!r}")
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


def tool_resource(canonical: str, name: str, explicit: str | None = None) -> str:
    """The canonical resource indicator of tool ``name``: ``explicit`` if given, else ``<canonical>/tools/<name>``."""
    return canonical_resource(explicit or f"{canonical}/tools/{name}")


def audience_of(aud: str | Iterable[str] | None) -> Audience:
    """The canonical audience of a JWT ``aud`` claim; entries that are not indicators are dropped."""
    if aud is None:
        return frozenset()
    values = [aud] if isinstance(aud, str) else list(aud)
    out: set[str] = set()
    for value in values:
        if isinstance(value, str):
            try:
                out.add(canonical_resource(value))
            except InvalidResource:
                continue
    return frozenset(out)


class AudiencePolicy:
    """Who may receive what: the server's canonical URI is the aggregate of all its tool resources.

    An event tagged with no resources belongs to the session itself (priming, unrelated notifications)
    and is covered by any admitted token. An event tagged with tool resources is covered when the
    audience holds the canonical URI or every one of those resources.
    """

    __slots__ = ("canonical", "tool_resources")

    def __init__(self, canonical: str, tool_resources: Iterable[str] = ()) -> None:
        self.canonical = canonical_resource(canonical)
        self.tool_resources = frozenset(canonical_resource(r) for r in tool_resources)

    def admits(self, audience: Audience) -> bool:
        """A token is admitted at the transport when it names this server or any of its tools."""
        return self.canonical in audience or not audience.isdisjoint(self.tool_resources)

    def covers(self, audience: Audience, required: frozenset[str]) -> bool:
        return self.canonical in audience or required <= audience

    def covers_all(self, audience: Audience, tag_sets: Iterable[frozenset[str]]) -> bool:
        """Whether ``audience`` covers every one of ``tag_sets`` (a stream's possible event tags)."""
        return self.canonical in audience or all(tags <= audience for tags in tag_sets)

    def missing(self, audience: Audience, required: frozenset[str]) -> frozenset[str]:
        if self.canonical in audience:
            return frozenset()
        return required - audience
