"""A tool's arguments bound through :attr:`RegisteredTool.plain` (the shortcut past the model's validation) give
exactly what the model gives: the same values, or the same error, for every kind of input."""

from __future__ import annotations

import datetime
import enum
import itertools
from typing import Annotated, Any

import pydantic
import pytest

from mcp_lossless.server.demo import demo_tools
from mcp_lossless.server.tools import ToolContext, ToolInputError, ToolRegistry, plain_arguments


def _registry() -> ToolRegistry:
    registry = ToolRegistry()

    @registry.tool()
    async def typed(ctx: ToolContext, text: str, count: int = 3, ratio: float = 0.5, flag: bool = False) -> str:
        return ""

    @registry.tool()
    async def optional(label: str | None = None, note: str = "n") -> str:
        return ""

    @registry.tool()
    async def listed(items: list[int] = [1]) -> str:  # noqa: B006 - a mutable default: never shortcut
        return ""

    return registry


VALUES: list[Any] = [
    "q", "", "\ud800", "é", 0, 1, -1, 2**70, True, False, 0.0, 1.5, float("nan"), float("inf"), None, [], {}, [1],
    {"a": 1}, "3", "1.5", "true",
]  # fmt: skip


def _outcome(tool: Any, raw: object) -> tuple[str, Any]:
    try:
        return "ok", tool.bind(raw)
    except ToolInputError as exc:
        return "error", str(exc)


def _model_outcome(tool: Any, raw: object) -> tuple[str, Any]:
    """What binding gives with the shortcut switched off: the model alone decides."""
    saved, tool.plain = tool.plain, None
    try:
        return _outcome(tool, raw)
    finally:
        tool.plain = saved


def _same(left: tuple[str, Any], right: tuple[str, Any]) -> bool:
    """Equal outcomes, NaN equal to itself (the model and the shortcut pass the same float object on)."""
    if left[0] != right[0]:
        return False
    if left[0] == "error":
        return bool(left[1] == right[1])
    return left[1].keys() == right[1].keys() and all(
        a is b or a == b for a, b in ((left[1][k], right[1][k]) for k in left[1])
    )


def test_the_shortcut_is_taken_for_plain_signatures_and_only_for_them() -> None:
    tools = _registry().tools
    assert tools["typed"].plain is not None
    assert tools["listed"].plain is None  # neither a plain type nor an immutable default
    assert tools["optional"].plain is None  # str | None is not one type
    assert demo_tools().tools["search"].plain is not None  # the benchmark's tool


@pytest.mark.parametrize("name", ["typed", "optional", "listed"])
def test_binding_gives_what_the_model_gives_for_every_input(name: str) -> None:
    tool = _registry().tools[name]
    fields = [*tool.arguments.model_fields, "unknown"]  # type: ignore[union-attr]
    raws: list[object] = [None, [], "x", {}]
    for size in (1, 2):
        for names in itertools.combinations(fields, size):
            for values in itertools.product(VALUES, repeat=size):
                raws.append(dict(zip(names, values, strict=True)))
    raws.append({"text": "q", "count": 1, "ratio": 2.5, "flag": True})
    raws.append({"text": "q", "count": 1, "ratio": 2.5, "flag": True, "unknown": 1})
    for raw in raws:
        assert _same(_outcome(tool, raw), _model_outcome(tool, raw)), raw


def test_the_defaults_are_filled_in_and_the_arguments_are_not_changed() -> None:
    tool = _registry().tools["typed"]
    raw = {"text": "q", "flag": True}
    assert tool.bind(raw) == {"text": "q", "count": 3, "ratio": 0.5, "flag": True}
    assert raw == {"text": "q", "flag": True}


def test_a_model_with_any_other_setting_is_not_shortcut() -> None:
    strict = pydantic.create_model("strict", __config__=pydantic.ConfigDict(extra="forbid", strict=True), a=(str, ...))
    allowing = pydantic.create_model("allowing", a=(str, ...))
    aliased = pydantic.create_model(
        "aliased", __config__=pydantic.ConfigDict(extra="forbid"), a=(str, pydantic.Field(alias="b"))
    )
    constrained = pydantic.create_model(
        "constrained", __config__=pydantic.ConfigDict(extra="forbid"), a=(Annotated[int, pydantic.Field(ge=0)], ...)
    )
    plain = pydantic.create_model("plain", __config__=pydantic.ConfigDict(extra="forbid"), a=(str, ...))
    assert plain_arguments(strict) is None
    assert plain_arguments(allowing) is None
    assert plain_arguments(aliased) is None
    assert plain_arguments(constrained) is None
    assert plain_arguments(plain) == ({"a": str}, {}, frozenset({"a"}))


def test_a_constraint_in_the_signature_is_enforced_and_published() -> None:
    """``Annotated[int, Field(ge=1)]`` reaches the model: type hints read without their extras dropped it silently."""
    registry = ToolRegistry()

    @registry.tool()
    async def bounded(count: Annotated[int, pydantic.Field(ge=1, le=10)], label: Annotated[str, "a note"] = "x") -> str:
        return ""

    tool = registry.tools["bounded"]
    assert tool.plain is None  # a constrained field is never shortcut
    assert tool.bind({"count": 3}) == {"count": 3, "label": "x"}
    for wrong in (0, 11):
        with pytest.raises(ToolInputError, match="count: Input should be"):
            tool.bind({"count": wrong})
    assert tool.input_schema()["properties"]["count"] == {
        "maximum": 10,
        "minimum": 1,
        "title": "Count",
        "type": "integer",
    }


class Colour(enum.Enum):
    RED = "red"


def test_arguments_are_held_to_the_published_schema() -> None:
    """Lax pydantic took ``"3"`` and ``true`` for ``{"type": "integer"}``: each JSON primitive now takes what its
    JSON Schema type takes, at any depth; other types keep the strings their schema asks for."""
    registry = ToolRegistry()

    @registry.tool()
    async def kinds(
        count: int = 0,
        ratio: float = 0.0,
        flag: bool = False,
        text: str = "",
        items: list[int] = [],  # noqa: B006 - never called
        maybe: int | None = None,
        bounded: Annotated[int, pydantic.Field(ge=1)] = 1,
        colour: Colour = Colour.RED,
        when: datetime.date = datetime.date(2026, 1, 1),
    ) -> str:
        return ""

    tool = registry.tools["kinds"]
    refused: list[tuple[str, object]] = [
        ("count", "3"), ("count", True), ("count", 2.5), ("count", None), ("ratio", "1.5"), ("ratio", True),
        ("flag", 1), ("flag", "true"), ("text", 3), ("items", ["1"]), ("items", [True]), ("maybe", "1"),
        ("maybe", False), ("bounded", "2"), ("bounded", 0),
    ]  # fmt: skip
    for name, value in refused:
        with pytest.raises(ToolInputError, match=f"^{name}"):
            tool.bind({name: value})
    bound: list[tuple[str, object, object]] = [
        ("count", 3, 3), ("count", 3.0, 3), ("ratio", 2, 2.0), ("flag", True, True), ("text", "3", "3"),
        ("items", [1, 2.0], [1, 2]), ("maybe", None, None), ("maybe", 4.0, 4), ("bounded", 2.0, 2),
        ("colour", "red", Colour.RED), ("when", "2026-12-08", datetime.date(2026, 12, 8)),
    ]  # fmt: skip
    for name, value, expected in bound:
        got = tool.bind({name: value})[name]
        assert got == expected and type(got) is type(expected), (name, value, got)
    properties = tool.input_schema()["properties"]
    assert properties["count"] == {"default": 0, "title": "Count", "type": "integer"}
    assert properties["items"]["items"] == {"type": "integer"}
    assert properties["bounded"] == {"default": 1, "minimum": 1, "title": "Bounded", "type": "integer"}
