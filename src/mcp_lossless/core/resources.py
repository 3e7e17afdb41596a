"""What a token must hold to receive an event: RFC 8707 resource indicators and OAuth scopes.

Indicators are compared canonically (absolute URI, no fragment, lowercase scheme and host, no trailing
slash) so that ``HTTPS://Example.com/mcp/`` and ``https://example.com/mcp`` name the same resource.

A tool's *requirement* is one tag set: its resource indicators, and its scopes as :func:`scope_tag` tags.
Events and stream records carry that set unchanged (every store already persists it), so scopes are
authorized per event, per replay and per refusal exactly as resources are: one set, one gap.
"""

from __future__ import annotations

from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

Audience = frozenset[str]
"""A token's audience: the canonical resource indicators of its ``aud`` claim."""

SCOPE_TAG = "scope "
"""Prefix of a scope's tag. RFC 6749 scope tokens hold no space and canonical indicators no whitespace,
so a scope tag never equals a resource indicator, whatever the scope looks like (``api://x/read``)."""

NO_SCOPES: frozenset[str] = frozenset()


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


def scope_tag(scope: str) -> str:
    return SCOPE_TAG + scope


def is_scope_tag(tag: str) -> bool:
    return tag.startswith(SCOPE_TAG)


def requirement(resources: Iterable[str], scopes: Iterable[str] = ()) -> frozenset[str]:
    """The tag set of a tool: what a token must hold to call it and to receive its events."""
    return frozenset(resources) | {scope_tag(s) for s in scopes}


def resources_in(tags: Iterable[str]) -> tuple[str, ...]:
    """The resource indicators among ``tags``, sorted."""
    return tuple(sorted(t for t in tags if not is_scope_tag(t)))


def scopes_in(tags: Iterable[str]) -> tuple[str, ...]:
    """The scopes among ``tags`` (without their prefix), sorted."""
    return tuple(sorted(t[len(SCOPE_TAG) :] for t in tags if is_scope_tag(t)))


def describe(tags: Iterable[str]) -> str:
    """``tags`` for people: ``https://h/mcp/tools/fetch, scope files:write``."""
    listed = list(tags)
    return ", ".join([*resources_in(listed), *(f"scope {s}" for s in scopes_in(listed))])


class AudiencePolicy:
    """Who may receive what: the server's canonical URI is the aggregate of all its tool resources.

    An event tagged with nothing belongs to the session itself (priming, unrelated notifications) and is
    covered by any admitted token. Otherwise a token covers an event when its audience holds the canonical
    URI or every one of the event's resources, *and* its scopes hold every one of the event's scopes (an
    aggregate audience stands for every tool resource, never for a scope).
    """

    __slots__ = ("canonical", "tool_resources")

    def __init__(self, canonical: str, tool_resources: Iterable[str] = ()) -> None:
        self.canonical = canonical_resource(canonical)
        self.tool_resources = frozenset(canonical_resource(r) for r in tool_resources)

    def admits(self, audience: Audience) -> bool:
        """A token is admitted at the transport when it names this server or any of its tools."""
        return self.canonical in audience or not audience.isdisjoint(self.tool_resources)

    def covers(self, audience: Audience, required: frozenset[str], scopes: frozenset[str] = NO_SCOPES) -> bool:
        return not self.missing(audience, required, scopes)

    def covers_all(
        self, audience: Audience, tag_sets: Iterable[frozenset[str]], scopes: frozenset[str] = NO_SCOPES
    ) -> bool:
        """Whether the token covers every one of ``tag_sets`` (a stream's possible event tags)."""
        return all(not self.missing(audience, tags, scopes) for tags in tag_sets)

    def missing(
        self, audience: Audience, required: frozenset[str], scopes: frozenset[str] = NO_SCOPES
    ) -> frozenset[str]:
        """The tags of ``required`` the token lacks. ``scopes`` left out means none: safe, never a leak."""
        gap = required - audience  # a scope tag is never in an audience
        if not gap:
            return gap
        whole = self.canonical in audience
        if whole and gap <= self.tool_resources:  # tool resources only (no scope tag): the aggregate covers them
            return frozenset()
        return frozenset(t for t in gap if (t[len(SCOPE_TAG) :] not in scopes if is_scope_tag(t) else not whole))
