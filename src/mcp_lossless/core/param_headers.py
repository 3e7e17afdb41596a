"""``x-mcp-header``: tool parameters a 2026-07-28 client mirrors into ``Mcp-Param-<Name>`` headers (SEP-2243).

A tool's ``inputSchema`` may mark a parameter with ``"x-mcp-header": "<Name>"``; every ``tools/call`` of it then
carries ``Mcp-Param-<Name>`` with the argument's value, so proxies can route on it without reading the body. A
client must exclude a tool whose annotation is malformed (empty, not a header token, on a type other than a
string, integer or boolean, or a name used twice ignoring case): calling it could only be refused, or worse,
mirror something a proxy misreads. Values go as plain visible ASCII, or in the ``=?base64?…?=`` form (UTF-8
inside) when they would not survive as a header (non-ASCII, control characters, surrounding whitespace).
Pure: the client decides which tools to keep and renders the headers from this.
"""

from __future__ import annotations

import string
from base64 import b64encode
from collections.abc import Iterator, Mapping
from typing import Any

ANNOTATION = "x-mcp-header"
PREFIX = "mcp-param-"
MIRRORABLE_TYPES = frozenset({"string", "integer", "boolean"})
"""The JSON Schema types a mirrored parameter may have (a ``number`` has no one exact text form)."""
_TOKEN = frozenset(string.ascii_letters + string.digits + "!#$%&'*+-.^_`|~")
"""RFC 9110 ``tchar``: what a header field name may be made of."""

Annotated = tuple[tuple[str, ...], object, dict[str, Any]]
"""A property carrying the annotation: its path, the annotation's value as written, the property's schema."""

Mirrored = tuple[tuple[str, ...], str]
"""A mirrored parameter: its path of ``properties`` keys in the arguments, and its header's (lower-case) name."""


class InvalidAnnotation(ValueError):
    """A tool's ``x-mcp-header`` annotation the client must not act on; the message names the parameter."""


def mirrored_params(schema: Mapping[str, Any]) -> tuple[Mirrored, ...]:
    """The parameters ``schema`` marks, reachable from its root through ``properties``;
    :class:`InvalidAnnotation` when any annotation is malformed."""
    found = tuple(_checked(annotated(schema)))
    seen: dict[str, str] = {}
    for path, header in found:
        where = ".".join(path)
        if header in seen:
            raise InvalidAnnotation(f"{where} and {seen[header]} both mirror into {PREFIX}{header}")
        seen[header] = where
    return found


def annotated(schema: Mapping[str, Any], path: tuple[str, ...] = ()) -> Iterator[Annotated]:
    """Every property reachable from the root through ``properties`` that carries :data:`ANNOTATION`, in schema
    order. The one walk: the client checks what it
    finds (:func:`mirrored_params`), the server reads its own tools' annotations from it."""
    properties = schema.get("properties")
    if not isinstance(properties, dict):
        return
    for name, prop in properties.items():
        if not isinstance(prop, dict):
            continue
        if ANNOTATION in prop:
            yield (*path, name), prop[ANNOTATION], prop
        yield from annotated(prop, (*path, name))


def _checked(found: Iterator[Annotated]) -> Iterator[Mirrored]:
    for path, header, prop in found:
        where = ".".join(path)
        if not isinstance(header, str) or not header or not set(header) <= _TOKEN:
            raise InvalidAnnotation(f"{where}: {ANNOTATION} {header!r} is not a header name token")
        kind = prop.get("type")
        if not isinstance(kind, str) or kind not in MIRRORABLE_TYPES:
            raise InvalidAnnotation(f"{where}: {ANNOTATION} on type {kind!r}, not a string, integer or boolean")
        yield path, header.lower()


def argument_at(arguments: object, path: tuple[str, ...]) -> object:
    """The argument at ``path`` of a call's ``arguments``; ``None`` when absent."""
    value = arguments
    for step in path:
        value = value.get(step) if isinstance(value, dict) else None
    return value


def header_safe(value: str) -> str:
    """Plain visible ASCII as is; anything else (or text that looks like the sentinel) in the base64 form."""
    plain = value.isascii() and value.isprintable() and value == value.strip()
    if plain and not (value.startswith("=?base64?") and value.endswith("?=")):
        return value
    return "=?base64?" + b64encode(value.encode()).decode() + "?="


def param_headers(mirrored: tuple[Mirrored, ...], arguments: object) -> dict[str, str]:
    """The ``Mcp-Param-*`` headers of a call with ``arguments``: one per mirrored argument present and not null."""
    headers: dict[str, str] = {}
    for path, header in mirrored:
        value = argument_at(arguments, path)
        if isinstance(value, bool):
            headers[PREFIX + header] = "true" if value else "false"
        elif isinstance(value, int):
            headers[PREFIX + header] = str(value)
        elif isinstance(value, str):
            headers[PREFIX + header] = header_safe(value)
    return headers
