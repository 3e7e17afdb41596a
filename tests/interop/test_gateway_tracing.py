"""Issue 31 item 3: one call's trace, from our client through the gateway to the official SDK's server.

The gateway runs in this process with OpenTelemetry's SDK and its in-memory exporter; the SDK's test upstream
runs as its own process over Streamable HTTP and records the ``_meta`` of every request it receives. A call made
inside a client span shows, in one trace: the gateway's server span (its parent the client's, from the request's
``_meta.traceparent``), the commit of its answer to the store, the gateway's client span for the upstream call,
and the upstream request's ``_meta.traceparent`` naming that client span; the ``upstream_call`` JSON log line
carries the trace id. Both eras of the gateway's own leg, and both of the upstream's.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterator

import httpx
import orjson
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from mcp_lossless.client import Client, OAuth
from mcp_lossless.client.modern import ModernClient
from mcp_lossless.gateway import UpstreamConfig
from mcp_lossless.server.observability import JsonFormatter
from tests.support.gateway_deployment import Deployment, sdk_upstream, serve_gateway
from tests.support.mcp_http import Peer, call, dev_token

pytestmark = pytest.mark.anyio

UPSTREAM_TOKEN = "gateway-tracing-credential"
TOKEN_ENV = "MCP_LOSSLESS_TEST_TRACING_TOKEN"
EXPORTED = InMemorySpanExporter()


class Lines(logging.Handler):
    """The gateway's log lines as the JSON formatter writes them."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.setFormatter(JsonFormatter())
        self.entries: list[dict[str, object]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.entries.append(orjson.loads(self.format(record)))


@pytest.fixture(scope="module")
def provider() -> TracerProvider:
    """The process's tracer provider (OpenTelemetry sets it once per process), exporting to memory."""
    installed = TracerProvider()
    installed.add_span_processor(SimpleSpanProcessor(EXPORTED))
    trace.set_tracer_provider(installed)
    assert trace.get_tracer_provider() is installed, "another test set the process's provider first"
    return installed


@pytest.fixture(scope="module")
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger = logging.getLogger("mcp_lossless")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, provider: TracerProvider, lines: Lines
) -> Iterator[Deployment]:
    with sdk_upstream(tmp_path_factory.mktemp("sdk"), UPSTREAM_TOKEN, TOKEN_ENV) as (sdk, auth):
        upstreams = [
            UpstreamConfig(name="legacy", url=sdk.url, auth=auth, sessions=1, era="legacy"),
            UpstreamConfig(name="modern", url=sdk.url, auth=auth, sessions=1, era="modern"),
        ]
        with serve_gateway(upstreams, sdk) as d:
            yield d


def hex_id(value: int, width: int) -> str:
    return format(value, f"0{width}x")


def in_trace(trace_id: int) -> list[ReadableSpan]:
    return [s for s in EXPORTED.get_finished_spans() if s.context is not None and s.context.trace_id == trace_id]


@pytest.mark.parametrize(("leg", "upstream"), [("legacy", "legacy"), ("legacy", "modern"), ("modern", "legacy"),
                                               ("modern", "modern")])  # fmt: skip
async def test_one_call_is_one_trace_from_the_client_through_the_gateway_to_the_upstream(
    deployment: Deployment, lines: Lines, leg: str, upstream: str
) -> None:
    d = deployment
    tool, key = f"{upstream}_lookup", f"{leg}-{upstream}"
    tracer = trace.get_tracer("test")
    with tracer.start_as_current_span("client call") as root:
        if leg == "legacy":
            async with Client(d.mcp, auth=OAuth("dev-client", "dev-secret")) as client:
                result = await client.call_tool(tool, {"key": key, "steps": 0})
        else:
            async with ModernClient(d.mcp, auth=OAuth("dev-client", "dev-secret")) as modern:
                result = await modern.call_tool(tool, {"key": key, "steps": 0})
    assert result.text == f"value of {key}"
    trace_id = root.get_span_context().trace_id

    spans = in_trace(trace_id)
    served = [s for s in spans if s.name == f"tools/call {tool}" and s.kind is trace.SpanKind.SERVER]
    assert len(served) == 1, [s.name for s in spans]
    (server,) = served
    assert server.parent is not None and server.parent.span_id == root.get_span_context().span_id
    assert server.attributes is not None and server.attributes["gen_ai.tool.name"] == tool
    (upstream_span,) = [s for s in spans if s.name == "tools/call lookup" and s.kind is trace.SpanKind.CLIENT]
    assert upstream_span.parent is not None and upstream_span.parent.span_id == server.context.span_id
    if leg == "legacy":  # the legacy leg stores the call's events: its answer's commit is in the call's trace
        commits = [s for s in spans if s.name == "store commit"]
        assert commits and all(c.parent is not None and c.parent.span_id == server.context.span_id for c in commits)

    sent = [
        m
        for m in d.sdk.messages()
        if m["method"] == "tools/call" and m["params"].get("arguments", {}).get("key") == key
    ]
    assert sent, "the upstream received the call"
    traceparent = sent[-1]["params"]["_meta"]["traceparent"]
    version, carried_trace, parent_span, _flags = traceparent.split("-")
    assert (version, carried_trace) == ("00", hex_id(trace_id, 32)), traceparent
    assert parent_span == hex_id(upstream_span.context.span_id, 16), "its parent: the gateway's upstream call"

    logged = [e for e in lines.entries if e.get("event") == "upstream_call" and e.get("exposed") == tool]
    assert logged and logged[-1]["trace_id"] == hex_id(trace_id, 32)


async def test_a_resume_joins_the_trace_its_traceparent_header_names(deployment: Deployment) -> None:
    """A resume is a GET, with no body and no ``_meta``: its caller's trace comes in the W3C ``traceparent`` header,
    and the resume's spans (the GET, its replay) are in that trace."""
    d = deployment
    async with httpx.AsyncClient(timeout=30) as http:
        peer = Peer(http, d.mcp.removesuffix("/mcp"), await dev_token(http, d.mcp.removesuffix("/mcp"), d.mcp))
        await peer.initialize()
        done = await peer.post(call(1, "legacy_lookup", progress="p", key="resumed", steps=2))
        assert done.ids, done.body
        trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
        headers = peer.headers(**{"last-event-id": done.ids[0], "traceparent": f"00-{trace_id}-{parent}-01"})
        headers.pop("content-type")
        response = await http.get(peer.url, headers=headers)
        assert response.status_code == 200
    spans = in_trace(int(trace_id, 16))
    names = sorted(s.name for s in spans)
    assert names == ["GET resume", "resume"], names
    (outer,) = [s for s in spans if s.name == "GET resume"]
    assert outer.parent is not None and hex_id(outer.parent.span_id, 16) == parent, "the caller's span is its parent"
