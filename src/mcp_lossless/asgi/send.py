"""Writing a complete response through ASGI ``send``: the way out of every request answered in one piece."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from .types import Headers, Send

WHOLE = "send_whole"
"""What the transport of the server's side of ``send`` (a bound ``send``'s object, uvicorn's request cycle) may
offer: ``send_whole(cycle, status, headers, body) -> bool`` writes a complete response (``headers`` without its
length) at once, as the two messages would, and says whether it did; ``False``: not now (a paused write, a
``HEAD``), send the messages. The serving protocol offers it (:func:`..server.connections.send_whole`): a
response's two messages through uvicorn cost two coroutines, two dicts and a general header walk, some 8,000
instructions more; any other ASGI server takes the messages."""


def _whole(send: Send) -> tuple[Any, Any]:
    cycle = getattr(send, "__self__", None)
    return cycle, getattr(getattr(cycle, "transport", None), WHOLE, None)


def sent_whole(send: Send, status: int, body: bytes, content_type: bytes) -> bool:
    """Whether the response went out whole at once (:data:`WHOLE`), with no coroutine of :func:`respond`'s: for the
    answer nearly every request ends with; ``False``: nothing was sent, await :func:`respond`."""
    cycle, whole = _whole(send)
    return whole is not None and bool(whole(cycle, status, [(b"content-type", content_type)], body))


async def respond(
    send: Send,
    status: int,
    body: bytes = b"",
    content_type: bytes | None = None,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> None:
    out: Headers = list(headers)
    if content_type is not None:
        out.append((b"content-type", content_type))
    cycle, whole = _whole(send)
    if whole is not None and whole(cycle, status, out, body):
        return
    out.append((b"content-length", b"%d" % len(body)))
    await send({"type": "http.response.start", "status": status, "headers": out})
    await send({"type": "http.response.body", "body": body})


async def respond_json(send: Send, status: int, value: Any, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    await respond(send, status, orjson.dumps(value), b"application/json", headers)
