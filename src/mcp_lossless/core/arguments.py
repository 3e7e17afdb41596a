"""Tool arguments written on a command line, in httpie's convention: ``key=value`` is a string, ``key:=json``
is raw JSON.

One home for ``call`` and ``audit --call``. Guessing (JSON when it parses, else a string) made ``query=5`` an
integer and forced ``query='"5"'`` for a string; with two explicit forms, what a user types is what the
tool receives.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import orjson

FORMS = 'KEY=TEXT is the string TEXT; KEY:=JSON is raw JSON (5, true, null, [1], {"a": 1})'


class ArgumentError(ValueError):
    """A command-line argument that is neither form, names a key twice, or carries JSON that does not parse."""


def parse_tool_arguments(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        is_json = key.endswith(":")
        if is_json:
            key = key[:-1]
        if not sep or not key:
            raise ArgumentError(f"argument {pair!r} is neither KEY=TEXT nor KEY:=JSON")
        if key in out:
            raise ArgumentError(f"argument {key!r} given twice")
        if not is_json:
            out[key] = raw
            continue
        try:
            out[key] = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise ArgumentError(f"argument {key!r}: {raw!r} is not JSON ({exc}); for a string write {key}=…") from None
    return out


def text_that_looks_like_json(pairs: Sequence[str], refusal: str) -> list[str]:
    """The ``KEY=TEXT`` pairs whose text is JSON of another type (``steps=3``, ``on=true``) and whose key the
    server's ``refusal`` names, each as the ``KEY:=JSON`` a user probably meant: said beside an invalid-arguments
    refusal, since a tool holds its arguments to its published schema and the text ``"3"`` is not an integer."""
    meant: list[str] = []
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key or key.endswith(":") or not re.search(rf"\b{re.escape(key)}\b", refusal):
            continue
        try:
            value = orjson.loads(raw)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(value, str):
            meant.append(f"{key}:={raw}")
    return meant
