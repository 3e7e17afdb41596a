"""The SSE decoder against the WHATWG event-stream interpretation rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core.sse import SseDecoder, SseEvent, SseTooLarge


def decode(raw: bytes) -> tuple[list[SseEvent], SseDecoder]:
    decoder = SseDecoder()
    return decoder.feed(raw), decoder


def test_data_lines_join_with_newlines_and_default_type_is_message() -> None:
    events, _ = decode(b"data: first\ndata: second\ndata\n\n")
    assert events == [SseEvent("message", "first\nsecond\n", None)]


def test_event_type_and_single_leading_space_removed() -> None:
    events, _ = decode(b"event: progress\ndata:  two spaces\n\n")
    assert events == [SseEvent("progress", " two spaces", None)]


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"])
def test_every_line_ending(eol: bytes) -> None:
    raw = eol.join([b"id: 7", b"data: x", b"", b"data: y", b"", b""])
    events, decoder = decode(raw)
    assert [(e.data, e.id) for e in events] == [("x", "7"), ("y", "7")]
    assert decoder.last_event_id == "7"


def test_crlf_split_across_chunks_is_one_line_ending() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"data: a\r") == []
    assert decoder.feed(b"\n\r") == [SseEvent("message", "a", None)]
    # The CR just fed ended an empty line (dispatching nothing); the next LF must not count again.
    assert decoder.feed(b"\ndata: b\n\n") == [SseEvent("message", "b", None)]


def test_id_persists_across_events_until_changed() -> None:
    events, _ = decode(b"id: a\ndata: 1\n\ndata: 2\n\nid: b\ndata: 3\n\n")
    assert [e.id for e in events] == ["a", "a", "b"]


def test_empty_id_resets_and_id_with_nul_is_ignored() -> None:
    events, decoder = decode(b"id: a\ndata: 1\n\nid: b\x00c\ndata: 2\n\nid\ndata: 3\n\n")
    assert [e.id for e in events] == ["a", "a", None]
    assert decoder.last_event_id is None


def test_event_without_data_dispatches_nothing_but_moves_the_id() -> None:
    events, decoder = decode(b"id: only-id\n\n")
    assert events == []
    assert decoder.last_event_id == "only-id"


def test_priming_event_has_empty_data_and_carries_retry() -> None:
    events, decoder = decode(b"id: p1\r\ndata: \r\nretry: 500\r\n\r\n")
    assert events == [SseEvent("message", "", "p1")]
    assert decoder.reconnection_ms == 500


def test_retry_must_be_digits_only() -> None:
    events, decoder = decode(b"retry: 10x\ndata: a\n\nretry: -5\ndata: b\n\nretry:\ndata: c\n\n")
    assert [e.data for e in events] == ["a", "b", "c"]
    assert decoder.reconnection_ms is None


def test_retry_without_data_still_sets_reconnection_time() -> None:
    events, decoder = decode(b"retry: 250\n\n")
    assert events == []
    assert decoder.reconnection_ms == 250


def test_comments_and_unknown_fields_are_ignored() -> None:
    events, _ = decode(b": keep-alive\nfoo: bar\ndata: x\n:\n\n")
    assert events == [SseEvent("message", "x", None)]


def test_field_without_colon_has_empty_value() -> None:
    events, _ = decode(b"data\ndata\n\n")
    assert events == [SseEvent("message", "\n", None)]


def test_bom_stripped_only_at_start_even_split() -> None:
    decoder = SseDecoder()
    assert decoder.feed(b"\xef\xbb") == []
    assert decoder.feed(b"\xbfdata: a\n\n") == [SseEvent("message", "a", None)]
    # A BOM later in the stream is part of a line: here it makes the field name unknown.
    assert decoder.feed(b"\xef\xbb\xbfdata: b\n\n") == []


def test_incomplete_event_at_end_is_not_dispatched_and_keeps_id() -> None:
    decoder = SseDecoder()
    decoder.feed(b"id: 1\ndata: a\n\nid: 2\ndata: b\n")
    assert decoder.last_event_id == "1"


def test_invalid_utf8_is_replaced_not_raised() -> None:
    events, _ = decode(b"data: \xff\xfe\n\n")
    assert events == [SseEvent("message", "\ufffd\ufffd", None)]


def test_multibyte_character_split_between_chunks() -> None:
    decoder = SseDecoder()
    encoded = "data: é€\n\n".encode()
    assert decoder.feed(encoded[:7]) == []
    assert decoder.feed(encoded[7:]) == [SseEvent("message", "é€", None)]


def test_event_size_bound() -> None:
    decoder = SseDecoder(max_event_bytes=64)
    decoder.feed(b"data: " + b"x" * 40 + b"\n\n")
    with pytest.raises(SseTooLarge):
        decoder.feed(b"data: " + b"x" * 40 + b"\ndata: " + b"y" * 40 + b"\n")


def test_line_without_terminator_is_bounded() -> None:
    decoder = SseDecoder(max_event_bytes=64)
    with pytest.raises(SseTooLarge):
        decoder.feed(b"data: " + b"x" * 100)


_lines = st.lists(
    st.one_of(
        st.builds(lambda v: b"data: " + v, st.binary(max_size=12).filter(lambda b: b"\r" not in b and b"\n" not in b)),
        st.builds(lambda v: b"id: " + v.encode(), st.text("ab\x00", max_size=3)),
        st.builds(lambda v: b"retry: " + v.encode(), st.text("12x", max_size=3)),
        st.sampled_from([b"", b": c", b"event: e", b"data", b"\xef\xbb\xbf"]),
    ),
    max_size=20,
)


@given(_lines, st.sampled_from([b"\n", b"\r\n", b"\r"]), st.lists(st.integers(0, 400), max_size=8))
def test_chunking_never_changes_the_result(lines: list[bytes], eol: bytes, cuts: list[int]) -> None:
    raw = eol.join([*lines, b"", b""])
    whole, whole_decoder = decode(raw)
    decoder = SseDecoder()
    pieces: list[SseEvent] = []
    previous = 0
    for cut in sorted(c % (len(raw) + 1) for c in cuts):
        pieces += decoder.feed(raw[previous:cut])
        previous = cut
    pieces += decoder.feed(raw[previous:])
    assert pieces == whole
    assert decoder.last_event_id == whole_decoder.last_event_id
    assert decoder.reconnection_ms == whole_decoder.reconnection_ms
