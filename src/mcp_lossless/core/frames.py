"""Wire frames: SSE events and the JSON-RPC messages that make refusals explicit.

JSON is encoded with orjson, which never emits a raw newline, so a message always fits one ``data:``
line. Error frames carry no ``id:`` line: an SSE ``id`` moves the client's Last-Event-ID, and the
cursor must stay on the last event actually delivered.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from . import denials
from .errors import DELIVERY_REFUSED, EXECUTION_LOST
from .events import EventRows, Loss, RequestId, StoredEvent
from .replay import Refusal, RefusalReason
from .resources import describe

REFUSAL_LOGGER = "mcp-lossless"


def sse(event_id: str | None, data: bytes, retry_ms: int | None = None) -> bytes:
    """One SSE event. ``event_id=None`` leaves the client's cursor where it is."""
    head = b""
    if event_id is not None:
        head = b"id: " + event_id.encode("ascii") + b"\n"
    if retry_ms is not None:
        head += b"retry: %d\n" % retry_ms
    return head + b"data: " + data + b"\n\n"


def sse_events(events: Iterable[StoredEvent], retry_ms: int) -> bytes:
    """The frames of stored events, joined: each exactly :func:`sse` of its id and data (``retry`` on an event with
    no data). One pass gathering parts, with no call, concatenation or formatting per event: a replay or a busy
    stream frames thousands per write. :class:`~.events.EventRows` are framed from their rows, with no event built."""
    empty = b"\nretry: %d\ndata: " % retry_ms
    parts: list[bytes] = []
    if type(events) is EventRows:
        for event_id, data, _request, _tool, _tags, _terminal in events.rows:
            parts += (b"id: ", event_id.encode("ascii"), b"\ndata: " if data else empty, data, b"\n\n")
        return b"".join(parts)
    for event in events:
        data = event.data
        parts += (b"id: ", event.event_id.encode("ascii"), b"\ndata: " if data else empty, data, b"\n\n")
    return b"".join(parts)


def result(request_id: RequestId, value: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "id": request_id, "result": value})


def error_message(request_id: RequestId | None, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error response as an object (HTTP error bodies are built from this too)."""
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": err}


def error(request_id: RequestId | None, code: int, message: str, data: Any = None) -> bytes:
    return orjson.dumps(error_message(request_id, code, message, data))


def notification(method: str, params: dict[str, Any]) -> bytes:
    return orjson.dumps({"jsonrpc": "2.0", "method": method, "params": params})


def refusal_data(refusal: Refusal) -> dict[str, Any]:
    """The documented ``data`` of a DELIVERY_REFUSED error and of a pre-commit 403 body (with the SEP-2643
    envelope, :mod:`.denials`)."""
    return denials.refusal_fields(
        refusal.event_id,
        refusal.missing,
        reason=refusal.reason.value,
        eventId=refusal.event_id,
        lastEventId=refusal.cursor,
        resumable=True,
    )


def refusal_message(refusal: Refusal) -> str:
    what = "has expired" if refusal.reason is RefusalReason.TOKEN_EXPIRED else "does not cover"
    resources = describe(refusal.missing) or "this stream"
    return (
        f"event {refusal.event_id} not delivered: the token {what} {resources}; "
        f"re-authorize and resume from Last-Event-ID {refusal.cursor}"
    )


def refusal_frames(refusal: Refusal, unanswered: Iterable[RequestId]) -> bytes:
    """In-band refusal on a committed stream: a log notification, then an error per unanswered request.

    Stock clients understand both: logging notifications are surfaced, and the error response ends each
    affected call explicitly. None of the frames has an ``id:`` line.
    """
    data = refusal_data(refusal)
    message = refusal_message(refusal)
    out = [
        sse(
            None,
            notification(
                "notifications/message",
                {"level": "error", "logger": REFUSAL_LOGGER, "data": {**data, "message": message}},
            ),
        )
    ]
    out.extend(sse(None, error(rid, DELIVERY_REFUSED, message, data)) for rid in unanswered)
    return b"".join(out)


def execution_lost(request_id: RequestId) -> bytes:
    return error(
        request_id,
        EXECUTION_LOST,
        "execution lost: the process running this request ended before it answered; the tool may have run",
        {"reason": "execution_lost", "requestId": request_id, "resumable": False},
    )


def events_lost(request_id: RequestId, held: str | None) -> bytes:
    """The store lost events of this request's stream that it had acknowledged: its outcome cannot be delivered."""
    holds = f"it holds the stream up to event {held}" if held is not None else "it holds nothing of the stream"
    return error(
        request_id,
        EXECUTION_LOST,
        f"events lost by the store (a failover to a replica that had not received them): {holds}; the tool may"
        " have run",
        {"reason": "events_lost", "requestId": request_id, "heldEventId": held, "resumable": False},
    )


def lost_frames(loss: Loss, held: str | None, unanswered: Iterable[RequestId]) -> bytes:
    """The end of a stream that ended without its producer (ADR 0025): each unanswered request's explicit outcome,
    from the stream's record, without an ``id:`` (no position was written for it). ``held``: the id of the last
    event the store holds."""
    if loss is Loss.OWNER:
        return b"".join(sse(None, execution_lost(rid)) for rid in unanswered)
    return b"".join(sse(None, events_lost(rid, held)) for rid in unanswered)


def store_unavailable_frames(cursor: str | None, unanswered: Iterable[RequestId]) -> bytes:
    """The event store failed under a committed stream: say so per request; resuming later from ``cursor`` may
    succeed (with no ``cursor`` the client has nothing to resume from: its ledger reports the call as may have run)."""
    data: dict[str, Any] = {
        "reason": "store_unavailable",
        "requiredResources": [],
        "lastEventId": cursor,
        "resumable": True,
    }
    if cursor is None:  # no id was sent (the stream's record, or its first event, could not be stored)
        message = "event store unavailable before any event id of this stream, which cannot be resumed; it may have run"
    else:
        message = f"event store unavailable; resume later from Last-Event-ID {cursor}"
    return b"".join(sse(None, error(rid, DELIVERY_REFUSED, message, data)) for rid in unanswered)
