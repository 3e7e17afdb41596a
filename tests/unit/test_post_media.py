"""The POST media check remembers only pairs that passed: a refused pair is refused every time, alike; the memory
stays bounded."""

from __future__ import annotations

import pytest

from mcp_lossless.server import checks
from mcp_lossless.server.errors import Refused

BOTH = b"application/json, text/event-stream"


def _verdict(accept: bytes | None, content_type: bytes | None) -> tuple[int, object] | None:
    index = {name: value for name, value in ((b"accept", accept), (b"content-type", content_type)) if value is not None}
    try:
        checks.require_post_media(index)
    except Refused as refusal:
        return refusal.status, refusal.body
    return None


@pytest.mark.parametrize(
    ("accept", "content_type", "status"),
    [
        (BOTH, b"application/json", None),
        (BOTH, b"Application/JSON; charset=utf-8", None),
        (b"application/json", b"application/json", 406),
        (None, b"application/json", 406),
        (BOTH, b"text/plain", 415),
        (BOTH, None, 415),
    ],
)
def test_each_pair_gets_the_same_verdict_every_time(
    accept: bytes | None, content_type: bytes | None, status: int | None
) -> None:
    first = _verdict(accept, content_type)
    assert (first if first is None else first[0]) == status
    for _ in range(3):
        assert _verdict(accept, content_type) == first
    assert ((accept, content_type) in checks._MEDIA_PASSED) == (status is None)


def test_the_memory_is_bounded_and_keeps_no_long_value() -> None:
    most, longest = checks.MEDIA_MEMO
    for n in range(most * 3):
        assert _verdict(BOTH + b", x/%d" % n, b"application/json") is None
        assert len(checks._MEDIA_PASSED) <= most
    long = BOTH + b", " + b"x" * longest
    assert _verdict(long, b"application/json") is None
    assert (long, b"application/json") not in checks._MEDIA_PASSED
