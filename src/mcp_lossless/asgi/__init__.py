"""The few raw-ASGI helpers every adapter shares, by the leg of a request that uses them: the request's headers
(here, read on the way in), its body (:mod:`.receive`) and the response (:mod:`.send`, on the way out).

Split so, a request walks each once: the entry indexes the headers, the transport reads the body, the leg that
decided writes the answer (issue 26's walk, ``tests/unit/test_request_walk.py``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from .receive import BodyTooLarge, ClientGone, disconnected, read_body
from .send import respond, respond_json, sent_whole
from .types import ASGIApp, HeaderIndex, Headers, Message, Receive, Scope, Send

__all__ = [
    "ASGIApp",
    "BodyTooLarge",
    "ClientGone",
    "HeaderIndex",
    "Headers",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "disconnected",
    "header",
    "headers",
    "read_body",
    "respond",
    "respond_json",
    "run_lifespan",
    "sent_whole",
]


def headers(scope: Scope) -> HeaderIndex:
    """The request's headers by lowercase name, indexed once per request under an extension key of the scope
    (a request is asked for half a dozen of them)."""
    index: HeaderIndex | None = scope.get("mcp_lossless.headers")
    if index is None:
        index = scope["mcp_lossless.headers"] = dict(scope["headers"])
    return index


def header(scope: Scope, name: bytes) -> str | None:
    """The value of header ``name`` (lowercase bytes), decoded as latin-1."""
    value = headers(scope).get(name)
    return None if value is None else value.decode("latin-1")


async def run_lifespan(
    receive: Receive,
    send: Send,
    startup: Callable[[], Awaitable[None]],
    shutdown: Callable[[], Awaitable[None]],
    explained: tuple[type[Exception], ...] = (),
) -> None:
    """Answer an ASGI lifespan scope: ``startup`` on start (a failure is reported, and logged), ``shutdown`` on stop.

    A failure of an ``explained`` kind (a store that cannot open, an issuer without metadata) is one the
    operator fixes from its message alone: it is logged without a traceback. Any other keeps its traceback.
    """
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            try:
                await startup()
            except Exception as exc:
                log = logging.getLogger("mcp_lossless")
                if isinstance(exc, explained):
                    log.error("startup failed: %s", exc)
                else:
                    log.exception("startup failed")
                await send({"type": "lifespan.startup.failed"})  # no message: the server would log it again
                return
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await shutdown()
            await send({"type": "lifespan.shutdown.complete"})
            return
