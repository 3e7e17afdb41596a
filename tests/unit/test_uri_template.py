"""Level-1 RFC 6570 matching of resource templates (the gateway routes unlisted URIs by them)."""

from __future__ import annotations

import time

import pytest

from mcp_lossless.gateway.uri_template import MAX_TEMPLATE, compile_template, matches


@pytest.mark.parametrize(
    ("template", "uri", "expected"),
    [
        ("notes://topics/{topic}", "notes://topics/gateway", True),
        ("notes://topics/{topic}", "notes://topics/", False),  # a value is never empty
        ("notes://topics/{topic}", "notes://topics/a/b", False),  # '/' is reserved: expanded as %2F
        ("notes://topics/{topic}", "notes://topics/a%2Fb", True),
        ("file:///{dir}/{name}.txt", "file:///docs/readme.v2.txt", True),  # '.' in the value, then the literal
        ("file:///{dir}/{name}.txt", "file:///docs/readme.md", False),
        ("test://template/shared{n}/data", "test://template/shared1/data", True),
        ("test://template/shared{n}/data", "test://template/7/data", False),
        ("plain://fixed", "plain://fixed", True),
        ("plain://fixed", "plain://fixed/", False),
    ],
)
def test_level_one_matching(template: str, uri: str, expected: bool) -> None:
    compiled = compile_template(template)
    assert compiled is not None
    assert matches(compiled, uri) is expected


@pytest.mark.parametrize(
    "template",
    ["file:///{+path}", "q://x{?a}", "l://{a,b}", "u://{a}{b}", "o://{a", "c://a}", "x" * (MAX_TEMPLATE + 1)],
)
def test_templates_beyond_level_one_route_nothing(template: str) -> None:
    assert compile_template(template) is None


def test_matching_does_not_backtrack() -> None:
    """A URI that almost matches a template of many expressions: a backtracking regex takes exponential time."""
    compiled = compile_template("x://" + "{v}a" * 40 + "!")
    assert compiled is not None
    started = time.process_time()
    assert not matches(compiled, "x://" + "a" * 2000)
    assert time.process_time() - started < 2.0
