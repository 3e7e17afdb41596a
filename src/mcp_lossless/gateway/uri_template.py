"""Which URIs an upstream's resource template (RFC 6570) names: level 1, simple string expansion (pure, no I/O).

A template is literal text and ``{var}`` expressions. Simple expansion percent-encodes every character of a
value but the unreserved ones (``A-Za-z0-9-._~``), so a URI is matched when each expression stands for a
non-empty run of unreserved characters and ``%`` escapes, and the literals match exactly. Templates with other
expressions (``{+path}``, ``{?q}``, ``{a,b}``: levels 2-4) are listed but name no URI here.

Matching runs the template as an automaton over the URI, one character at a time, keeping the set of template
positions reachable so far: no backtracking, at most ``len(uri) * (len(template) + 1)`` steps. Both lengths are
bounded (:data:`MAX_URI`, :data:`MAX_TEMPLATE`), so a hostile URI or template costs little.
"""

from __future__ import annotations

import re
import string

MAX_URI = 2048
"""The longest URI matched against templates; a longer one is refused (the gateway's error says so)."""
MAX_TEMPLATE = 512
"""The longest template that names URIs; a longer one is listed but routes nothing."""

_VALUE = frozenset(string.ascii_letters + string.digits + "-._~%")
_VARNAME = re.compile(r"[A-Za-z0-9_]+")
_VAR = None
"""A position of the compiled template that stands for one expression."""

Compiled = tuple[str | None, ...]
"""A template as positions: each a literal character, or ``None`` for an expression (one or more value chars)."""


def compile_template(template: str) -> Compiled | None:
    """The template's positions, or ``None`` when it is not a level-1 template this module matches."""
    if not template or len(template) > MAX_TEMPLATE:
        return None
    positions: list[str | None] = []
    i = 0
    while i < len(template):
        c = template[i]
        if c == "}":
            return None
        if c != "{":
            positions.append(c)
            i += 1
            continue
        end = template.find("}", i)
        if end < 0 or not _VARNAME.fullmatch(template, i + 1, end):
            return None  # unclosed, or an operator or a list: not level 1
        if positions and positions[-1] is _VAR:
            return None  # {a}{b}: where one value ends is anyone's guess
        positions.append(_VAR)
        i = end + 1
    return tuple(positions)


def matches(compiled: Compiled, uri: str) -> bool:
    """Whether ``uri`` is an expansion of the template (the caller bounds ``len(uri)`` by :data:`MAX_URI`)."""
    n = len(compiled)
    states = {0}
    for c in uri:
        after: set[int] = set()
        for s in states:
            if s == n:
                continue
            p = compiled[s]
            if p is _VAR:
                if c in _VALUE:
                    after.add(s)  # the value goes on
                    after.add(s + 1)  # or ends here
            elif p == c:
                after.add(s + 1)
        if not after:
            return False
        states = after
    return n in states
