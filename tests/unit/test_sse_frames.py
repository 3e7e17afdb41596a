"""A writer frames a batch of stored events in one pass (:func:`~mcp_lossless.core.frames.sse_events`): its bytes
are exactly the events' single frames (:func:`~mcp_lossless.core.frames.sse`) one after another, ``retry`` on
an event without data, whatever the ids and payloads."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.core import frames
from mcp_lossless.core.events import StoredEvent

IDS = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=60)
PAYLOADS = st.one_of(st.just(b""), st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")))
EVENTS = st.lists(
    st.builds(
        StoredEvent,
        st.just("session"),
        st.just("stream"),
        st.integers(0, 1 << 40),
        IDS,
        PAYLOADS,
        st.one_of(st.none(), st.integers(), st.text(max_size=5)),
        st.none(),
        st.just(frozenset[str]()),
        st.booleans(),
    ),
    max_size=20,
)


@given(EVENTS, st.integers(0, 100_000))
def test_a_batch_is_its_events_single_frames_in_order(events: list[StoredEvent], retry_ms: int) -> None:
    single = b"".join(frames.sse(e.event_id, e.data, None if e.data else retry_ms) for e in events)
    assert frames.sse_events(events, retry_ms) == single


def test_an_event_without_data_carries_retry() -> None:
    event = StoredEvent("session", "stream", 0, "s.0.mac", b"", None, None, frozenset(), False)
    assert frames.sse_events([event], 1500) == b"id: s.0.mac\nretry: 1500\ndata: \n\n"
