"""OpenTelemetry traces when the ``otel`` extra is installed (``pip install mcp-lossless[otel]``); nothing otherwise.

W3C Trace Context travels in each request's ``params._meta`` under ``traceparent``, ``tracestate`` and ``baggage``
(SEP-414, as the OpenTelemetry semantic conventions for MCP ask): per message, since one HTTP request may carry
several and a stdio pipe has no headers. A server span takes its parent from there; our clients write the
current context there on every request they send, so a gateway's upstream request carries its caller's trace.

Spans are named as the conventions name MCP's (``tools/call search``), with ``mcp.method.name``,
``gen_ai.tool.name`` and ``jsonrpc.request.id``. Export is configured the standard way: ``OTEL_*`` variables
(:func:`configure_export`); without the extra, spans cost one flag test; with it but no tracer provider set, a
span with no parent in its carrier costs two look-ups (:func:`silent`).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
from collections.abc import Iterator, Mapping, MutableMapping
from typing import Any, Literal

from . import __version__

try:
    from opentelemetry import context as otel_context
    from opentelemetry import propagate, trace
    from opentelemetry.environment_variables import OTEL_PYTHON_TRACER_PROVIDER

    ENABLED = True
except ImportError:  # the extra is not installed
    ENABLED = False

CARRIER_KEYS = ("traceparent", "tracestate", "baggage")
"""The ``_meta`` keys of W3C Trace Context and Baggage (SEP-414: root keys, an exception to DNS prefixes)."""
SpanKind = Literal["server", "client", "internal"]
log = logging.getLogger("mcp_lossless.tracing")


def span(
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    carrier: Mapping[str, Any] | None = None,
    kind: SpanKind = "internal",
) -> contextlib.AbstractContextManager[None]:
    """A span around the block, current inside it; its parent the trace context in ``carrier`` (a request's
    ``_meta``) when that has one, else the current span. ``None`` attributes are left out. A span that would change
    nothing (:func:`silent`) is one shared empty context manager: no generator, no call into the API."""
    if silent(carrier):
        return UNTRACED
    found = _carried(carrier)
    return _span(name, attributes, propagate.extract(found) if found else None, kind)


def silent(carrier: Mapping[str, Any] | None = None) -> bool:
    """Whether a span here, its parent in ``carrier``, would change nothing (:func:`span` then returns the shared
    empty context manager). Asked once by a caller whose request's spans (the call's, and its answer's commit inside
    it) all follow from that one answer, so an untraced request pays for one test, not one a span.

    Nothing changes when the extra is not installed, or when ``carrier`` holds no trace context, no tracer provider
    is set (the API's no-op tracer would answer) and the current span is not recording. The no-op tracer's span is
    then the current span itself, made current again, so the trace context that :func:`inject` and :func:`log_ids`
    read stays what it was; skipping it saves the API's four context managers and its context switch (~8 µs a
    request, a tenth of a stateless call's CPU). With a parent in the carrier the no-op span is not skipped: it
    carries that trace on to what the block sends.

    Whether a provider is set is read from the API's module global: ``trace.get_tracer_provider()`` looks the
    environment up on every call until one is set (a ``KeyError`` raised and caught inside ``os.environ``, about
    as dear as the rest of this test). An API without that global is taken as traced: the span is made. An empty
    current context (nothing attached: nearly every request) has no span, so nothing recording, and the span is not
    looked up in it (two calls fewer). The test is written out here, not in helpers: it runs once a request, in both
    eras."""
    if not ENABLED:
        return True
    if carrier is not None and not carrier.keys().isdisjoint(CARRIER_KEYS) and _carried(carrier):
        return False
    return (
        not _PROVIDER_FROM_ENVIRONMENT
        and getattr(trace, "_TRACER_PROVIDER", trace) is None
        and (not (current := _current_context()) or not trace.get_current_span(current).is_recording())
    )


def _carried(carrier: Mapping[str, Any] | None) -> dict[str, str]:
    """The trace context ``carrier`` holds (its string-valued :data:`CARRIER_KEYS`): a span's parent when not empty."""
    if carrier is None or carrier.keys().isdisjoint(CARRIER_KEYS):
        return {}
    return {key: value for key in CARRIER_KEYS if isinstance(value := carrier.get(key), str)}


@contextlib.contextmanager
def _span(name: str, attributes: Mapping[str, Any] | None, parent: Any, kind: SpanKind) -> Iterator[None]:
    kinds = {"server": trace.SpanKind.SERVER, "client": trace.SpanKind.CLIENT, "internal": trace.SpanKind.INTERNAL}
    tracer = trace.get_tracer("mcp_lossless", __version__)
    shown = {key: value for key, value in (attributes or {}).items() if value is not None}
    with tracer.start_as_current_span(name, context=parent, kind=kinds[kind], attributes=shown):
        yield


def _context_reader() -> Any:
    """What :func:`silent` reads the current context with: the API's ``get_current``, or, with the API's own runtime
    context (a ``ContextVar``, the default), that variable's ``get``, the same answer without the API's two Python
    calls in between."""
    runtime = getattr(otel_context, "_RUNTIME_CONTEXT", None)
    variable = getattr(runtime, "_current_context", None)
    if type(runtime).__name__ == "ContextVarsRuntimeContext" and isinstance(variable, contextvars.ContextVar):
        return variable.get
    return otel_context.get_current


_current_context: Any = _context_reader() if ENABLED else None

UNTRACED: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
"""The span that changes nothing (:func:`span` returns it; a caller that found :func:`silent` uses it as is)."""
_PROVIDER_FROM_ENVIRONMENT = ENABLED and OTEL_PYTHON_TRACER_PROVIDER in os.environ
"""A provider named by the environment is loaded by the API's first ``get_tracer_provider()``: traced from the
start."""


def decision(name: str, attributes: Mapping[str, Any]) -> None:
    """A decision taken at once (a resume refused or rejected) as a span of its own: when and what, no duration."""
    if ENABLED:
        with span(name, attributes, kind="server"):
            pass


def annotate(attributes: Mapping[str, Any]) -> None:
    """Set attributes on the current span (an outcome known only at its end)."""
    if ENABLED:
        current = trace.get_current_span()
        for key, value in attributes.items():
            if value is not None:
                current.set_attribute(key, value)


def inject(meta: MutableMapping[str, Any]) -> None:
    """Write the current trace context into an outgoing request's ``_meta`` (nothing when no span is current)."""
    if ENABLED:
        propagate.inject(meta)


def with_trace(params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` of an outgoing request, its ``_meta`` carrying the current trace context when there is one."""
    out = dict(params)
    if ENABLED:
        meta = dict(out.get("_meta") or {})
        inject(meta)
        if meta:
            out["_meta"] = meta
    return out


def log_ids() -> dict[str, str]:
    """The current span's trace and span ids, as a JSON log line carries them (none outside a span)."""
    if not ENABLED:
        return {}
    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return {}
    return {"trace_id": format(context.trace_id, "032x"), "span_id": format(context.span_id, "016x")}


def configure_export() -> None:
    """OTLP over HTTP to ``OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT``, configured by the standard ``OTEL_*`` variables
    (headers, timeout, ``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``; ``OTEL_SDK_DISABLED=true`` turns it off),
    for ``serve`` and ``gateway``. Without an endpoint nothing is exported; an embedding app configures its own."""
    if not ENABLED or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return
    if not (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning("an OTLP endpoint is set, but the otel extra is not installed: pip install mcp-lossless[otel]")
        return
    service = os.environ.get("OTEL_SERVICE_NAME", "mcp-lossless")
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
