"""``x-mcp-header``: tool parameters a 2026-07-28 client mirrors into ``Mcp-Param-<Name>`` headers (SEP-2243).

A tool's ``inputSchema`` may mark a parameter with ``"x-mcp-header": "<Name>"``; every ``tools/call`` of it then
carries ``Mcp-Param-<Name>`` with the argument's value, so proxies can route on it without reading the body. A
client must exclude a tool whose annotation is malformed (empty, not a header token, on a type other than a
string, integer or boolean, or a name used twice ignoring case): calling it could only be refused, or worse,
mirror something a proxy misreads. Values go as plain visible ASCII, or in the ``=?base64?…?=`` form (UTF-8
inside) when they would not survive as a header (non-ASCII, control characters, surrounding whitespace).
Pure: the client decides which tools to keep and renders the headers from this; the server reads them back with
:func:`header_value` and :func:`check_mirrored`, the inverse of :func:`param_headers`, kept beside it so the two
cannot drift apart (``tests/unit/test_param_headers.py`` holds them to a round-trip property).
"""

from __future__ import annotations

import binascii
import re
import string
from base64 import b64decode, b64encode
from collections.abc import Iterable, Iterator, Mapping
from decimal import Decimal, InvalidOperation
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

HeaderMirror = tuple[tuple[str, ...], bytes]
"""A mirrored parameter as the server looks it up: its path, and its full header name (``mcp-param-…``) as the
lower-case bytes an ASGI header index is keyed by."""

_JSON_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?", re.ASCII)
"""A number as JSON writes one (RFC 8259 §6): how a mirrored integer's header may spell it."""
_SENTINEL_PREFIX, _SENTINEL_SUFFIX = "=?base64?", "?="
_OUTSIDE_FIELD_VALUE = re.compile(rb"[^\x20-\x7e\t]")
"""A byte a plain header value may not hold: anything but visible ASCII, space and tab."""


class HeaderMismatch(ValueError):
    """A mirrored header (``Mcp-Method``, ``Mcp-Name``, ``Mcp-Param-*``) the request may not carry: undecodable,
    missing, or not equal to the body; the message says which (the server answers it ``-32020``, 400)."""


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
    if plain and not (value.startswith(_SENTINEL_PREFIX) and value.endswith(_SENTINEL_SUFFIX)):
        return value
    return _SENTINEL_PREFIX + b64encode(value.encode()).decode() + _SENTINEL_SUFFIX


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


# ---- the server's side: reading the headers back -------------------------------------------------


def server_mirrors(schema: Mapping[str, Any]) -> tuple[HeaderMirror, ...]:
    """The parameters a server's own tool schema marks with a non-empty name (taken as written, not checked as a
    client checks a server's: the server wrote them)."""
    return tuple(
        (path, (PREFIX + header.lower()).encode("latin-1"))
        for path, header, _ in annotated(schema)
        if isinstance(header, str) and header
    )


def header_value(raw: bytes) -> str:
    """A mirrored header's value without surrounding whitespace (RFC 9110 §5.5): plain visible ASCII, or the
    ``=?base64?…?=`` sentinel form (UTF-8 inside), which :func:`header_safe` writes."""
    raw = raw.strip(b" \t")
    if raw.startswith(b"=?base64?") and raw.endswith(b"?=") and len(raw) >= 11:
        try:
            return b64decode(raw[9:-2], validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            raise HeaderMismatch("header value is not valid base64 UTF-8") from None
    if _OUTSIDE_FIELD_VALUE.search(raw) is not None:
        raise HeaderMismatch("header value has characters outside visible ASCII")
    return raw.decode("ascii")


def same_value(text: str, value: object) -> bool:
    """A mirrored header's decoded text against the argument it mirrors: booleans as ``true``/``false``, strings
    exactly, integers as numbers: the text must be a JSON number (``42``, ``42.0``, ``4.2e1``) equal to the argument
    exactly. Not Python's ``int``/``float`` reading, which takes ``1_0``, non-ASCII digits (``٤٢``, inside the
    base64 form) and a sign, and rounds past 2**53: a proxy routing on the header would read another number, or
    none, than the tool gets."""
    if isinstance(value, bool):
        return text == ("true" if value else "false")
    if isinstance(value, int):
        if _JSON_NUMBER.fullmatch(text) is None:
            return False
        try:
            return Decimal(text) == value  # exact, whatever the spelling's exponent
        except InvalidOperation:  # an exponent past what a decimal holds: no integer argument is that
            return False
    return isinstance(value, str) and text == value


def check_mirrored(headers: Mapping[bytes, bytes], arguments: object, mirrored: Iterable[HeaderMirror]) -> None:
    """Each mirrored argument present in ``arguments`` must come with its ``Mcp-Param-*`` header, equal after
    decoding (:class:`HeaderMismatch` otherwise); an absent or null argument expects no header."""
    for path, header in mirrored:
        value = argument_at(arguments, path)
        if value is None:
            continue
        name = header.decode("latin-1")
        raw = headers.get(header)
        if raw is None:
            raise HeaderMismatch(f"{name} header required: arguments.{'.'.join(path)} is set")
        if not same_value(header_value(raw), value):
            raise HeaderMismatch(f"{name} header does not match arguments.{'.'.join(path)}")
