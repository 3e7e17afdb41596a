"""A tool's published ``inputSchema`` is the contract its calls are held to (docs/decisions/0038).

pydantic validates in lax mode: a field ``n: int``, published ``{"type": "integer"}``, would take ``"3"`` and
``true``, values the schema refuses, and a ``bool`` would take ``1`` and ``"yes"``. :func:`json_typed` rewrites a
signature's hint so that each JSON primitive in it (``str``, ``int``, ``float``, ``bool``, at any depth: in a union,
a list's items, a dict's values) takes exactly what JSON Schema's type takes: ``integer`` a JSON number with no
fractional part (``3`` and ``3.0``, the latter bound as the int ``3``), ``number`` any number (an int bound as its
float), ``boolean`` only ``true``/``false``, ``string`` only a string. The published schema does not change. Other
types (``datetime``, an ``Enum``, a nested model) keep pydantic's own validation: strict mode there would refuse the
strings their schema asks for.
"""

from __future__ import annotations

import types
import typing
from typing import Annotated, Any, Final, Union, get_args, get_origin

import pydantic


def _integral(value: object) -> object:
    """A float with no fractional part is an ``integer`` to JSON Schema: bound as the int it equals."""
    return int(value) if type(value) is float and value.is_integer() else value


JSON_STRICT: Final[dict[type, tuple[object, ...]]] = {
    str: (pydantic.Strict(),),
    int: (pydantic.Strict(), pydantic.BeforeValidator(_integral)),
    float: (pydantic.Strict(),),
    bool: (pydantic.Strict(),),
}
"""What each JSON primitive's field carries after its own metadata (its constraints, which must come first to be
published): strict mode, which refuses other types (a ``bool`` for an ``int``, a string for a number); for
``integer``, first the binding of an integral float."""

_CONTAINERS: Final = (list, set, frozenset, tuple, dict)


def json_typed(hint: Any) -> Any:
    """``hint`` with :data:`JSON_STRICT`'s metadata on each JSON primitive in it (a signature's type hint, its
    ``Annotated`` extras kept)."""
    if isinstance(hint, type) and hint in JSON_STRICT:
        return Annotated[(hint, *JSON_STRICT[hint])]
    origin = get_origin(hint)
    args = get_args(hint)
    if origin is Annotated:
        inner, *metadata = args
        if isinstance(inner, type) and inner in JSON_STRICT:
            return Annotated[(inner, *metadata, *JSON_STRICT[inner])]
        return Annotated[(json_typed(inner), *metadata)]
    if origin is Union or origin is types.UnionType:
        return typing.Union[tuple(json_typed(arg) for arg in args)]  # noqa: UP007 - built from a tuple
    if origin in _CONTAINERS and args:
        return origin[tuple(arg if arg is Ellipsis else json_typed(arg) for arg in args)]
    return hint
