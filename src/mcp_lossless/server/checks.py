"""The checks of a request that need nothing but the request: each raises :class:`.errors.Refused` or passes.

:class:`.transport.Transport` calls them in the protocol's order; the checks that need the server's state
(the token, the session, the tools) are its own methods and refuse the same way.
"""

from __future__ import annotations

from typing import Any

import orjson

from ..asgi import HeaderIndex
from ..core import errors, protocol
from ..core.events import RequestId
from .errors import Refused


def is_request_id(value: object) -> bool:
    # A tuple, not ``str | int``: the union is built anew on every call, and this runs twice per request.
    return isinstance(value, (str, int)) and not isinstance(value, bool)


_ID_TYPES = (str, int)
"""The types of nearly every request id, passed on a type test (a subclass of either is asked :func:`is_request_id`)."""


def _invalid(message: str, status: int = 400) -> Refused:
    return Refused.rpc(status, errors.INVALID_REQUEST, message)


def _accept(index: HeaderIndex) -> str:
    """The Accept header as text: ``in`` on bytes first tries its operand as an integer, and raises and formats a
    ``TypeError`` inside before it searches (about 2,000 instructions a test); on text it only searches."""
    return index.get(b"accept", b"").decode("latin-1")


def require_get_accept(index: HeaderIndex) -> None:
    """A GET must accept an event stream (406); judged from the request's header ``index``."""
    if "text/event-stream" not in _accept(index):
        raise _invalid("Accept must list text/event-stream", 406)


MEDIA_MEMO = (64, 256)
"""(Accept, Content-Type) pairs :func:`require_post_media` remembers as passing at most, and the longest value."""
_MEDIA_PASSED: set[tuple[bytes | None, bytes | None]] = set()


def require_post_media(index: HeaderIndex) -> None:
    """What a POST must say of its media types: it accepts both answers (406), and its body is JSON (415); judged
    from the request's header ``index`` (taken, not read here: the checks never step back into the ASGI layer).

    A client sends the same pair on every POST: a pair that passed is remembered (a set look-up, where the test is
    a decode and three searches); a refused one is judged again each time, so its refusal is raised afresh. Full,
    the memory starts afresh; a value longer than :data:`MEDIA_MEMO`'s bound is never remembered."""
    pair = (index.get(b"accept"), index.get(b"content-type"))
    if pair in _MEDIA_PASSED:
        return
    accept = _accept(index)
    if "application/json" not in accept or "text/event-stream" not in accept:
        raise _invalid("Accept must list both application/json and text/event-stream", 406)
    if not index.get(b"content-type", b"").lower().startswith(b"application/json"):
        raise _invalid("Content-Type must be application/json", 415)
    most, longest = MEDIA_MEMO
    if len(pair[0] or b"") <= longest and len(pair[1] or b"") <= longest:
        if len(_MEDIA_PASSED) >= most:
            _MEDIA_PASSED.clear()
        _MEDIA_PASSED.add(pair)


def parse_body(body: bytes) -> tuple[list[Any], bool]:
    """The body's JSON values, not yet looked at, and whether they came as a batch (whose length the caller
    checks against ``max_batch`` before :func:`check_messages` walks it)."""
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise Refused.rpc(400, errors.PARSE_ERROR, f"body is not JSON: {exc.msg}") from None
    batch = isinstance(payload, list)
    return (payload if batch else [payload]), batch


def check_messages(messages: list[Any]) -> list[dict[str, Any]]:
    """``messages`` as JSON-RPC messages, each checked: a request, a notification or a response."""
    if not messages:
        raise _invalid("empty batch")
    for message in messages:  # each message: a request, a notification or a response
        if not isinstance(message, dict) or message.get("jsonrpc") != "2.0":
            raise _invalid('each message must be a JSON object with "jsonrpc": "2.0"')
        if "method" in message:
            if not isinstance(message["method"], str):
                raise _invalid("method must be a string")
            # is_request_id written out: this runs for every message
            if "id" in message and (type(rid := message["id"]) not in _ID_TYPES and not is_request_id(rid)):
                raise _invalid("request id must be a string or an integer")
            if "params" in message and not isinstance(message["params"], (dict, list)):
                raise _invalid("params must be an object")
        elif "id" not in message or ("result" not in message and "error" not in message):
            raise _invalid("message is neither a request, a notification nor a response")
        elif message["id"] is not None and not is_request_id(message["id"]):
            raise _invalid("response id must be a string, an integer or null")
    return messages


def require_alone(messages: list[dict[str, Any]]) -> None:
    if len(messages) > 1:
        raise _invalid("initialize cannot be batched")


def served_revision(requested: str | None, messages: list[dict[str, Any]]) -> str | None:
    """The revision a legacy request asks for (:func:`.requests.era`), refused unless served; ``None``: the
    session's (negotiated, so served). Checked before the session: a 2026-07-28 client has none, and must get the
    ``-32022`` answer it falls back on, not "session required"."""
    if requested is None or requested in protocol.HANDSHAKE_VERSIONS:
        return requested
    request_id = messages[0].get("id") if len(messages) == 1 and "method" in messages[0] else None
    raise unsupported_version(requested, request_id)


def unsupported_version(requested: str, request_id: RequestId | None = None) -> Refused:
    supported = ", ".join(protocol.HANDSHAKE_VERSIONS)
    if requested == protocol.STATELESS:
        message = (
            f"protocol {requested} is served statelessly (per-request _meta, no session), not on a session; "
            f"a session speaks one of {supported}"
        )
    else:
        message = f"unsupported MCP-Protocol-Version {requested!r}; supported: {supported}"
    data = {"supported": list(protocol.HANDSHAKE_VERSIONS), "requested": requested}
    return Refused.rpc(400, errors.UNSUPPORTED_PROTOCOL_VERSION, message, data=data, request_id=request_id)


def require_batches_allowed(session_version: str) -> None:
    if not protocol.allows_batches(session_version):
        raise _invalid(
            f"JSON-RPC batches are only accepted on sessions negotiated at 2025-03-26 (this one: {session_version})"
        )
