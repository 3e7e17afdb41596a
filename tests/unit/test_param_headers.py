"""``x-mcp-header`` on the client side (core/param_headers): which annotations are refused, what is mirrored."""

from __future__ import annotations

from base64 import b64decode
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core.param_headers import InvalidAnnotation, header_safe, mirrored_params, param_headers


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
