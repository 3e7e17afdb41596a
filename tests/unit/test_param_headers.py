"""``x-mcp-header`` (core/param_headers): which annotations the client refuses, what it mirrors, and the server's
reading of the headers back, held to the encoder by a round-trip property."""

from __future__ import annotations

from base64 import b64decode
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from mcp_lossless.core.param_headers import (
    HeaderMismatch,
    InvalidAnnotation,
    check_mirrored,
    header_safe,
    header_value,
    mirrored_params,
    param_headers,
    same_value,
    server_mirrors,
)


def _schema(**properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties}


def test_marked_parameters_are_found_through_properties_and_named_in_lower_case() -> None:
    schema = _schema(
        region={"type": "string", "x-mcp-header": "Region"},
        query={"type": "string"},
        nested={"type": "object", "properties": {"flag": {"type": "boolean", "x-mcp-header": "Flag"}}},
    )
    assert mirrored_params(schema) == ((("region",), "region"), (("nested", "flag"), "flag"))


@pytest.mark.parametrize(
    ("prop", "why"),
    [
        ({"type": "string", "x-mcp-header": ""}, "not a header name token"),
        ({"type": "string", "x-mcp-header": "My Region"}, "not a header name token"),
        ({"type": "string", "x-mcp-header": "Region:Primary"}, "not a header name token"),
        ({"type": "string", "x-mcp-header": "Région"}, "not a header name token"),
        ({"type": "string", "x-mcp-header": "Region\t1"}, "not a header name token"),
        ({"type": "string", "x-mcp-header": 7}, "not a header name token"),
        ({"type": "object", "x-mcp-header": "Data"}, "on type 'object'"),
        ({"type": "array", "x-mcp-header": "Items"}, "on type 'array'"),
        ({"type": "null", "x-mcp-header": "Nil"}, "on type 'null'"),
        ({"type": "number", "x-mcp-header": "Score"}, "on type 'number'"),
        ({"type": ["string", "null"], "x-mcp-header": "Either"}, "on type ['string', 'null']"),
        ({"x-mcp-header": "Untyped"}, "on type None"),
    ],
)
def test_a_malformed_annotation_is_refused_naming_the_parameter(prop: dict[str, Any], why: str) -> None:
    with pytest.raises(InvalidAnnotation, match=r"^value: ") as refused:
        mirrored_params(_schema(value=prop))
    assert why in str(refused.value)


def test_two_parameters_mirroring_into_one_header_ignoring_case_are_refused() -> None:
    schema = _schema(a={"type": "string", "x-mcp-header": "MyField"}, b={"type": "string", "x-mcp-header": "myfield"})
    with pytest.raises(InvalidAnnotation, match="b and a both mirror into mcp-param-myfield"):
        mirrored_params(schema)


def test_present_values_are_rendered_by_type_and_null_or_absent_ones_omitted() -> None:
    mirrored = mirrored_params(
        _schema(
            region={"type": "string", "x-mcp-header": "Region"},
            priority={"type": "integer", "x-mcp-header": "Priority"},
            verbose={"type": "boolean", "x-mcp-header": "Verbose"},
            debug={"type": "boolean", "x-mcp-header": "Debug"},
            gone={"type": "string", "x-mcp-header": "Gone"},
        )
    )
    arguments = {"region": "us-west1", "priority": 42, "verbose": False, "debug": None, "query": "q"}
    assert param_headers(mirrored, arguments) == {
        "mcp-param-region": "us-west1",
        "mcp-param-priority": "42",
        "mcp-param-verbose": "false",
    }


@given(st.text())
def test_every_value_becomes_a_visible_ascii_header_that_decodes_to_itself(value: str) -> None:
    rendered = header_safe(value)
    assert rendered.isascii() and rendered.isprintable() and rendered == rendered.strip()
    if rendered.startswith("=?base64?") and rendered.endswith("?="):
        assert b64decode(rendered[9:-2]).decode() == value
    else:
        assert rendered == value


# ---- the server reads back what the client wrote ---------------------------------------------------

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
"""Any JSON value: what the arguments around the mirrored ones may hold."""
MIRRORABLE = st.booleans() | st.integers() | st.text()
"""Every value the encoder writes a header for (the types ``x-mcp-header`` may annotate)."""


def _schema_type(value: object) -> str:
    return "boolean" if isinstance(value, bool) else "integer" if isinstance(value, int) else "string"


@given(MIRRORABLE, MIRRORABLE | st.none(), JSON_VALUES)
@example(2**53 + 1, None, None)  # a float compare reads it as 2**53: the header of a correct call was refused
@example(" padded\t", "=?base64?x?=", "")  # surrounding whitespace, and a value that looks like the sentinel
@example("Zürich", "line\nbreak", {"nested": [1.5, None]})
def test_what_the_client_mirrors_the_server_reads_back_as_the_argument(
    top: object, inner: object, other: object
) -> None:
    schema = _schema(
        top={"type": _schema_type(top), "x-mcp-header": "Top"},
        nested={"type": "object", "properties": {"inner": {"type": _schema_type(inner), "x-mcp-header": "In-Ner"}}},
        other={"x-other": True},
    )
    arguments = {"top": top, "nested": {"inner": inner}, "other": other}
    sent = param_headers(mirrored_params(schema), arguments)
    index = {name.encode("latin-1"): value.encode("latin-1") for name, value in sent.items()}  # as ASGI hands them
    assert [header for _, header in server_mirrors(schema)] == [b"mcp-param-top", b"mcp-param-in-ner"]
    check_mirrored(index, arguments, server_mirrors(schema))  # raises on any header it does not read back
    assert same_value(header_value(index[b"mcp-param-top"]), top)
    if isinstance(top, str):
        assert header_value(index[b"mcp-param-top"]) == top
    assert (b"mcp-param-in-ner" in index) is (inner is not None)


def test_optional_whitespace_around_a_plain_value_is_not_part_of_it() -> None:
    assert header_value(b" \tus-west1 \t") == "us-west1"


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"=?base64?not base64!?=", "not valid base64 UTF-8"),
        (b"=?base64?/w==?=", "not valid base64 UTF-8"),
        (b"caf\xc3\xa9", "outside visible ASCII"),
        (b"a\x00b", "outside visible ASCII"),
    ],
)
def test_an_undecodable_header_value_is_a_mismatch(raw: bytes, why: str) -> None:
    with pytest.raises(HeaderMismatch, match=why):
        header_value(raw)


def test_a_missing_or_different_header_is_a_mismatch_naming_it_and_the_argument() -> None:
    mirrors = server_mirrors(_schema(region={"type": "string", "x-mcp-header": "Region"}))
    with pytest.raises(HeaderMismatch, match=r"^mcp-param-region header required: arguments.region is set$"):
        check_mirrored({}, {"region": "eu"}, mirrors)
    with pytest.raises(HeaderMismatch, match=r"^mcp-param-region header does not match arguments.region$"):
        check_mirrored({b"mcp-param-region": b"us"}, {"region": "eu"}, mirrors)
    check_mirrored({}, {"region": None}, mirrors)  # null: no header expected


@pytest.mark.parametrize(
    ("text", "value", "same"),
    [("42", 42, True), ("4.2e1", 42, True), ("42.5", 42, False), ("true", True, True), ("1", True, False),
     ("false", 0, False), ("x", "x", True), ("x", 1.5, False),
     # a number only as JSON writes one, compared exactly: what a proxy reads is what the tool gets
     ("1_0", 10, False), ("\u0664\u0662", 42, False), ("\uff14\uff12", 42, False), ("042", 42, False),
     ("9007199254740993", 2**53, False), ("9007199254740993.0", 2**53, False), ("9007199254740992.0", 2**53, True),
     ("-0", 0, True), ("1e9999999999999999999999", 1, False), ("+42", 42, False)],
)  # fmt: skip
def test_a_decoded_header_is_compared_to_its_argument_by_the_argument_s_type(
    text: str, value: object, same: bool
) -> None:
    assert same_value(text, value) is same
