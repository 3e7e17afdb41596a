"""The 2026-07-28 leg's memory of decoded ``Mcp-Method``/``Mcp-Name`` values gives what decoding gives, raises what
decoding raises, and stays bounded."""

from __future__ import annotations

import pytest

from mcp_lossless.core import param_headers
from mcp_lossless.server.modern.routing import HEADER_TEXTS, HeaderTexts


@pytest.mark.parametrize("raw", [b"tools/call", b"  search\t", b"=?base64?w6k=?=", b""])
def test_a_remembered_value_is_its_decoding(raw: bytes) -> None:
    texts = HeaderTexts()
    assert texts[raw] == param_headers.header_value(raw)
    assert texts[raw] == param_headers.header_value(raw)  # remembered
    assert raw in texts


@pytest.mark.parametrize("raw", [b"caf\xc3\xa9", b"=?base64?***?=", b"a\x01"])
def test_a_value_that_does_not_decode_raises_the_same_and_is_not_remembered(raw: bytes) -> None:
    texts = HeaderTexts()
    with pytest.raises(param_headers.HeaderMismatch) as expected:
        param_headers.header_value(raw)
    for _ in range(2):
        with pytest.raises(param_headers.HeaderMismatch) as got:
            texts[raw]
        assert str(got.value) == str(expected.value)
    assert not texts


def test_the_memory_is_bounded() -> None:
    most, longest = HEADER_TEXTS
    texts = HeaderTexts()
    for n in range(most * 3):
        assert texts[b"tool-%d" % n] == f"tool-{n}"
        assert len(texts) <= most
    assert texts[b"x" * (longest + 1)] == "x" * (longest + 1)
    assert b"x" * (longest + 1) not in texts
