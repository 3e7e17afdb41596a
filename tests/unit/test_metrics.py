"""The hot-path metrics render as Prometheus text with the bucket semantics Prometheus expects."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from mcp_lossless.server.observability import STORE_BUCKETS, Metrics


def _series(text: str, name: str) -> dict[str, float]:
    return {labels: float(value) for labels, value in re.findall(rf"^{name}\{{(.*?)\}} (\S+)$", text, re.M)}


@given(st.lists(st.floats(min_value=0, max_value=2, allow_nan=False), max_size=40))
def test_latency_buckets_are_cumulative_and_le_inclusive(samples: list[float]) -> None:
    metrics = Metrics()
    for seconds in samples:
        metrics.append_latency.observe(seconds)
    text = metrics.render().decode()
    buckets = _series(text, "mcp_lossless_store_seconds_bucket")
    for bound in STORE_BUCKETS:
        expected = sum(1 for seconds in samples if seconds <= bound)
        assert buckets[f'le="{bound}",op="append"'] == expected
    assert buckets['le="+Inf",op="append"'] == len(samples)
    assert _series(text, "mcp_lossless_store_seconds_count")['op="append"'] == len(samples)
    assert buckets['le="+Inf",op="read"'] == 0


def test_stream_tallies_render_as_counters() -> None:
    metrics = Metrics()
    for _ in range(3):
        metrics.post_streams.inc()
    metrics.get_streams.inc()
    text = metrics.render().decode()
    assert "# TYPE mcp_lossless_streams_total counter" in text
    assert _series(text, "mcp_lossless_streams_total") == {'kind="post"': 3.0, 'kind="get"': 1.0}
