"""The error codes' comment in ``core/errors.py`` agrees with the codes the 2026-07-28 leg sends (docs/errors.md).

2026-07-28 reserves -32020..-32099 for the specification; a project code the modern leg sends inside that range is
an exception the comment must name, or a reader trusts a rule the wire breaks (it said every modern-leg code
lived at -31xxx while -32044 was sent).
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from mcp_lossless.core import errors

DOCS = Path(__file__).parents[2] / "docs" / "errors.md"
RESERVED = range(-32099, -32019)
SPEC_CODES = {errors.HEADER_MISMATCH, errors.MISSING_REQUIRED_CLIENT_CAPABILITY, errors.UNSUPPORTED_PROTOCOL_VERSION}


def modern_leg_codes(text: str) -> set[int]:
    """The codes in the first column of the 2026-07-28 leg's table."""
    section = text.split("## The 2026-07-28 leg", 1)[1].split("\n## ", 1)[0]
    return {int(code) for row in re.findall(r"^\| ([-\d /]+) \|", section, re.M) for code in row.split(" / ")}


def comment_of(source: str) -> str:
    return " ".join(line.strip("# ") for line in source.splitlines() if line.startswith("#"))


def test_every_project_code_the_modern_leg_sends_in_the_reserved_range_is_named_as_an_exception() -> None:
    names = {value: name for name, value in vars(errors).items() if name.isupper() and isinstance(value, int)}
    sent = modern_leg_codes(DOCS.read_text(encoding="utf-8"))
    assert errors.LIMIT_EXCEEDED in sent and errors.TASK_DENIED in sent
    exceptions = sorted(names[code] for code in sent if code in RESERVED and code not in SPEC_CODES)
    assert exceptions == ["LIMIT_EXCEEDED", "UPSTREAM_FAILED"]
    comment = comment_of(inspect.getsource(errors))
    assert [name for name in exceptions if name not in comment] == []


def test_the_codes_only_the_modern_leg_sends_are_outside_the_json_rpc_range() -> None:
    only_modern = [
        errors.TASK_DENIED,
        errors.TASK_EXECUTION_LOST,
        errors.TOOL_FORBIDDEN,
        errors.CLIENT_INPUT_UNAVAILABLE,
    ]
    assert all(not -32768 <= code <= -32000 for code in only_modern)
