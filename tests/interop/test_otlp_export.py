"""Traces leave `serve` over real OTLP/HTTP: the standard `OTEL_*` variables, the SDK's exporter, protobuf on the wire.

The receiver is an OTLP/HTTP endpoint in the test process (`POST /v1/traces`, `application/x-protobuf`) that
decodes each export with the protocol's own message types (`opentelemetry-proto`), as a collector does: what it
reads is what any OTLP backend would receive. The server is a real `mcp-lossless serve` process; the call carries
a W3C trace context in `_meta.traceparent`, and its span must arrive in that trace.
"""

from __future__ import annotations

import contextlib
import secrets
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from tests.support.mcp_http import Peer, call, dev_token
from tests.support.processes import ServerProcess, free_port

pytestmark = pytest.mark.anyio


class Receiver:
    """Spans received, as (service name, span name, trace id hex, attributes); ``arrived`` once ``wanted`` came."""

    def __init__(self, wanted: str) -> None:
        self.wanted = wanted
        self.spans: list[tuple[str, str, str, dict[str, Any]]] = []
        self.arrived = threading.Event()
        self.content_types: set[str] = set()
        self._lock = threading.Lock()

    def take(self, body: bytes, content_type: str) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        with self._lock:
            self.content_types.add(content_type)
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope in resource_spans.scope_spans:
                    for span in scope.spans:
                        attributes = {a.key: a.value.string_value for a in span.attributes}
                        self.spans.append(
                            (resource.get("service.name", ""), span.name, span.trace_id.hex(), attributes)
                        )
                        if span.name == self.wanted:
                            self.arrived.set()


@contextlib.contextmanager
def otlp_receiver(wanted: str) -> Iterator[tuple[str, Receiver]]:
    receiver = Receiver(wanted)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            receiver.take(body, self.headers.get("content-type", ""))
            reply = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="otlp receiver", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", receiver
    finally:
        server.shutdown()
        server.server_close()


async def test_a_calls_span_reaches_an_otlp_receiver_in_the_callers_trace(
    tmp_path: Path, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    with otlp_receiver("tools/call search") as (endpoint, receiver), contextlib.ExitStack() as stack:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)  # the child process inherits them
        monkeypatch.setenv("OTEL_SERVICE_NAME", "lossless-under-test")
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")  # the batch processor's export interval, in ms
        server = ServerProcess(["--store", "memory"], free_port(), tmp_path / "serve.log")
        stack.callback(server.stop)
        await anyio.to_thread.run_sync(server.start)
        peer = Peer(http, server.base, await dev_token(http, server.base, f"{server.base}/mcp"))
        await peer.initialize()
        trace_id, parent = secrets.token_hex(16), secrets.token_hex(8)
        message = call(7, "search", query="traced", steps=1, delay_ms=0)
        message["params"]["_meta"] = {"traceparent": f"00-{trace_id}-{parent}-01"}
        answered = await peer.post(message)
        assert answered.messages[-1]["id"] == 7 and "result" in answered.messages[-1]

        assert await anyio.to_thread.run_sync(receiver.arrived.wait, 30), f"no call span: {receiver.spans}"

    spans = [span for span in receiver.spans if span[1] == "tools/call search"]
    assert [(service, trace) for service, _name, trace, _attributes in spans] == [("lossless-under-test", trace_id)], (
        "the call's span, in the caller's trace, from the named service"
    )
    assert spans[0][3].get("gen_ai.tool.name") == "search"
    assert receiver.content_types == {"application/x-protobuf"}
