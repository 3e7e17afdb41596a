"""Metrics (Prometheus text at ``/metrics``) and structured JSON logs with one line per resume decision."""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from .. import tracing

log = logging.getLogger("mcp_lossless")


class JsonFormatter(logging.Formatter):
    """One JSON object per line; structured fields come from ``extra={"fields": {...}}``."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update(tracing.log_ids())  # formatted in the logging call's context: its span's trace
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: str = "info") -> None:
    """One JSON line per record on stderr, for ours and for uvicorn's (its errors: a port in use, a failed
    start), so that a log reader parses every line the process writes."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name, name_level in (("mcp_lossless", level.upper()), ("uvicorn", "WARNING")):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(name_level)
        logger.propagate = False


def fingerprint(secret: str) -> str:
    """A short stable hash for logs: session ids are capabilities and never logged whole."""
    return hashlib.sha256(secret.encode()).hexdigest()[:12]


class Tally:
    """A count bumped on every request: a plain number, read at scrape time.

    ``prometheus_client`` takes a lock per update and walks the buckets in Python; on the per-call path
    that cost several microseconds a call. This process is single-threaded (one event loop), so no lock.
    """

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Latency:
    """A latency histogram updated per answer: one ``bisect`` and two additions."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs ending with ``+Inf``, as the exposition format wants them."""
        out = []
        running = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


STORE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5)


class _HotPath(Collector):
    """Exposes the :class:`Tally` and :class:`Latency` values of :class:`Metrics` at scrape time."""

    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[Metric]:
        m = self._m
        streams = CounterMetricFamily("mcp_lossless_streams", "SSE streams opened", labels=["kind"])
        streams.add_metric(["post"], m.post_streams.value)
        streams.add_metric(["get"], m.get_streams.value)
        yield streams
        latency = HistogramMetricFamily("mcp_lossless_store_seconds", "Event store operation latency", labels=["op"])
        for op, histogram in (("append", m.append_latency), ("read", m.read_latency)):
            latency.add_metric([op], histogram.buckets(), histogram.total)
        yield latency


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Gauge("mcp_lossless_sessions", "Sessions held in this process", registry=r)
        self.post_streams = Tally()
        self.get_streams = Tally()
        self.append_latency = Latency(STORE_BUCKETS)
        self.read_latency = Latency(STORE_BUCKETS)
        r.register(_HotPath(self))
        self.resumes = Counter(
            "mcp_lossless_resumes_total", "Resume attempts (GET + Last-Event-ID) by outcome", ["outcome"], registry=r
        )
        self.refusals = Counter(
            "mcp_lossless_refusals_total",
            "Events withheld from a token, by reason and phase",
            ["reason", "phase"],
            registry=r,
        )
        self.replayed = Counter("mcp_lossless_replayed_events_total", "Events delivered by replay", registry=r)
        self.limit_refusals = Counter(
            "mcp_lossless_limit_refusals_total",
            "Requests and connections refused or closed at one of the limits (docs/limits.md), by limit",
            ["limit"],
            registry=r,
        )
        self.lost = Counter(
            "mcp_lossless_execution_lost_total",
            "Requests ended with EXECUTION_LOST after their process died",
            registry=r,
        )

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


def log_decision(event: str, **fields: Any) -> None:
    log.info(event, extra={"fields": {"event": event, **fields}})


now = time.time
"""The server's wall clock (seconds): the clock itself, not a function around it, so reading it costs no Python
frame on the hot path and takes no request back into this module (issue 26's walk)."""
