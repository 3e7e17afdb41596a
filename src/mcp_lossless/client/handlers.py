"""The client's answers to a server's requests for client input: one handler per method, registered by the user.

A 2026-07-28 server asks for input (elicitation, sampling, the roots) by answering a request ``input_required``
or by a task waiting ``input_required`` (docs/decisions/0015); the client answers from these handlers and
declares, in every request's capabilities, exactly the methods it has a handler for, so a server never asks
what nobody here can answer. A handler gets the request's ``params`` and returns its result (an
``ElicitResult``, a ``CreateMessageResult``, a ``ListRootsResult``). The legacy
:class:`~mcp_lossless.client.Client` takes the same handlers for the requests a 2025-11-25 server sends on a
call's stream, and answers one whose handler raises with an error (the tool waiting for it goes on). On
2026-07-28 a handler that raises, input the client cannot give and asking past :data:`MAX_INPUT_ROUNDS` end the
call with :class:`~mcp_lossless.client.InputUnanswered`: never a wait that cannot end, never an answer made up.

Handlers are given per client and per call (``call_tool(..., input_handlers=)``): a call's handlers answer what
that call asks, the client's the methods the call has none for (:func:`for_call`). A legacy session's request
names its call by the stream it arrives on; one on a stream that carries no single call with handlers of its
own is answered by the client's. A handler that raises :class:`InputRefused` has the server's request answered
with that error's code and message (a gateway passes its own client's refusal on as it came).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Any

from .errors import InputUnanswered, ProtocolViolation, describe_failure

InputHandler = Callable[[dict[str, Any]], Awaitable[Mapping[str, Any]]]
"""Answers one request for client input: its ``params`` in, its result out."""

CAPABILITIES = {"elicitation/create": "elicitation", "sampling/createMessage": "sampling", "roots/list": "roots"}
"""The client capability a handler of each method declares (the only three requests a server may send)."""

MAX_INPUT_ROUNDS = 16
"""Rounds of input per call (retries of an ``input_required`` request, or ``tasks/update`` of one task): a
server that keeps asking past them ends the call with :class:`InputUnanswered`."""


class InputRefused(Exception):
    """Raised by a handler: the server's request is answered with this JSON-RPC error (legacy sessions), and on
    2026-07-28 the call ends with :class:`InputUnanswered` as for any handler that raises."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def for_call(client: Mapping[str, InputHandler], call: Mapping[str, InputHandler] | None) -> dict[str, InputHandler]:
    """The handlers answering one call: its own (checked), over the client's for the methods it has none for."""
    return {**client, **checked(call)} if call else dict(client)


def checked(handlers: Mapping[str, InputHandler] | None) -> dict[str, InputHandler]:
    """The handlers, refused at construction when one is for a method a server cannot ask."""
    found = dict(handlers or {})
    unknown = sorted(set(found) - CAPABILITIES.keys())
    if unknown:
        raise ValueError(f"no server asks a client for {unknown}; input handlers are for {sorted(CAPABILITIES)}")
    return found


def offered(handlers: Mapping[str, InputHandler], methods: Collection[str]) -> dict[str, Any]:
    """The capabilities a legacy session offers: its handlers' and those of ``methods``, which its calls bring
    handlers for; refused at construction when a method is one a server cannot ask."""
    unknown = sorted(set(methods) - CAPABILITIES.keys())
    if unknown:
        raise ValueError(f"no server asks a client for {unknown}; input methods are {sorted(CAPABILITIES)}")
    return {**capabilities(handlers), **{CAPABILITIES[method]: {} for method in methods}}


def capabilities(handlers: Mapping[str, InputHandler]) -> dict[str, Any]:
    """The client capabilities the handlers declare."""
    return {CAPABILITIES[method]: {} for method in handlers}


async def answer_input(
    handlers: Mapping[str, InputHandler], requests: object, what: str, given: Mapping[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """The answers to ``requests`` (the wire's ``inputRequests``: ``{key: {method, params}}``), by key, in order.

    A key in ``given`` is answered as before without asking again (a task may show a key it already got
    while the answer travels to its owner). :class:`ProtocolViolation` for a malformed request,
    :class:`InputUnanswered` for a method without a handler.
    """
    if not isinstance(requests, dict) or not requests:
        raise ProtocolViolation(f"{what}: input was required but inputRequests is not a non-empty object")
    answers: dict[str, dict[str, Any]] = {}
    for key, request in requests.items():
        if given is not None and key in given:
            answers[key] = given[key]
            continue
        method = request.get("method") if isinstance(request, dict) else None
        params = request.get("params", {}) if isinstance(request, dict) else None
        if not isinstance(method, str) or not isinstance(params, dict):
            raise ProtocolViolation(f"{what}: input request {key!r} is not a {{method, params}} object")
        handler = handlers.get(method)
        if handler is None:
            raise InputUnanswered(f"{what} asks for {method} (input {key!r}) and no handler for it is registered")
        try:
            result = await handler(params)
        except Exception as exc:
            raise InputUnanswered(f"{what}: the {method} handler failed: {describe_failure(exc)}") from exc
        if not isinstance(result, Mapping):
            raise InputUnanswered(f"{what}: the {method} handler returned {type(result).__name__}, not an object")
        answers[key] = dict(result)
    return answers
