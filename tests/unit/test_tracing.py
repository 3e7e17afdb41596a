"""What a server span leaves current: the trace context that :func:`tracing.inject` and :func:`tracing.log_ids`
read. Without a tracer provider a span with no parent in its carrier is skipped (:func:`tracing.silent`); these
hold whether the span is skipped or made, so the shortcut changes nothing a client, a log line or an upstream sees.
"""

from __future__ import annotations

from typing import Any

from mcp_lossless import tracing

TRACE = "0af7651916cd43dd8448eb211c80319c"
TRACEPARENT = f"00-{TRACE}-b7ad6b7169203331-01"


def injected() -> dict[str, Any]:
    meta: dict[str, Any] = {}
    tracing.inject(meta)
    return meta


def test_a_span_without_a_parent_leaves_no_trace_context_behind() -> None:
    with tracing.span("tools/call search", {"mcp.method.name": "tools/call"}, carrier={}, kind="server"):
        ids = tracing.log_ids()  # none without a tracer provider; with one, a trace of the span's own
        assert not ids or ids["trace_id"] != TRACE
        assert TRACE not in str(injected())
    assert tracing.log_ids() == {}
    assert injected() == {}


def test_the_carriers_trace_is_current_inside_the_span_and_goes_on_to_what_it_sends() -> None:
    with tracing.span("tools/call search", carrier={"traceparent": TRACEPARENT}, kind="server"):
        assert tracing.log_ids()["trace_id"] == TRACE
        assert TRACE in injected()["traceparent"]
        with tracing.span("store commit"):  # an inner span, no carrier: the same trace stays current
            assert tracing.log_ids()["trace_id"] == TRACE
            assert TRACE in injected()["traceparent"]
        assert tracing.log_ids()["trace_id"] == TRACE
    assert tracing.log_ids() == {}


def test_silent_answers_exactly_when_a_span_would_be_the_empty_one() -> None:
    """A legacy call asks :func:`tracing.silent` once and then makes neither its span nor its commit's: that is
    only sound if the answer is the one :func:`tracing.span` would give, for every kind of carrier, inside a span
    with a parent or not."""
    carriers: list[dict[str, Any] | None] = [None, {}, {"traceparent": TRACEPARENT}, {"traceparent": 7}, {"x": "y"}]
    for carrier in carriers:
        assert tracing.silent(carrier) == (tracing.span("s", carrier=carrier) is tracing.UNTRACED)
        with tracing.span("outer", carrier={"traceparent": TRACEPARENT}, kind="server"):
            assert tracing.silent(carrier) == (tracing.span("s", carrier=carrier) is tracing.UNTRACED)
    assert not tracing.silent({"traceparent": TRACEPARENT}) or not tracing.ENABLED
