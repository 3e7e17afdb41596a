"""Metrics (Prometheus text at ``/metrics``) and structured JSON logs with one line per resume decision."""

from __future__ import annotations

import hashlib
import logging
import sys
import time
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

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
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()


def configure_logging(level: str = "info") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("mcp_lossless")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def fingerprint(secret: str) -> str:
    """A short stable hash for logs: session ids are capabilities and never logged whole."""
    return hashlib.sha256(secret.encode()).hexdigest()[:12]


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.sessions = Gauge("mcp_lossless_sessions", "Sessions held in this process", registry=r)
        self.streams = Counter("mcp_lossless_streams_total", "SSE streams opened", ["kind"], registry=r)
        self.post_streams = self.streams.labels("post")
        """Pre-bound: a label lookup per request showed in the hot-path profile."""
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
        self.lost = Counter(
            "mcp_lossless_execution_lost_total",
            "Requests ended with EXECUTION_LOST after their process died",
            registry=r,
        )
        self.store_latency = Histogram(
            "mcp_lossless_store_seconds",
            "Event store operation latency",
            ["op"],
            registry=r,
            buckets=(0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5),
        )
        self.append_latency = self.store_latency.labels("append")
        self.read_latency = self.store_latency.labels("read")

    def render(self) -> bytes:
        return bytes(generate_latest(self.registry))


def log_decision(event: str, **fields: Any) -> None:
    log.info(event, extra={"fields": {"event": event, **fields}})


def now() -> float:
    return time.time()
