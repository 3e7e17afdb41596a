"""The shapes every part of the 2026-07-28 leg answers in: a refusal raised to the transport, the 403 challenge,
a result with its ``resultType``. One home, so the routing, the tasks and the listen stream refuse alike."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...asgi import Send, respond
from ...core import errors, frames
from ...core.events import RequestId
from ...core.tasks import extension_required
from .. import metadata
from ..errors import Refused


def refused(
    status: int, code: int, message: str, data: Any = None, headers: Iterable[tuple[bytes, bytes]] = ()
) -> Refused:
    """A modern request refused with a JSON-RPC error at an HTTP status; :meth:`.ModernLeg.serve` adds the id."""
    return Refused.rpc(status, code, message, data=data, headers=headers)


def missing_extension() -> Refused:
    """A task method (or a task-only tool) called by a client that did not declare the tasks extension."""
    return refused(
        400, errors.MISSING_REQUIRED_CLIENT_CAPABILITY, "Missing required client capability", extension_required()
    )


def scope_challenge(
    prm_url: str, description: str, missing: Iterable[str], needed: Iterable[str]
) -> list[tuple[bytes, bytes]]:
    """The challenge a refused call gets (:func:`.metadata.insufficient_scope`): what a new token must hold."""
    return [(b"www-authenticate", metadata.insufficient_scope(description, prm_url, missing, needed))]


async def answer(send: Send, rid: RequestId, result: dict[str, Any], kind: str = "complete") -> None:
    """A JSON result with its ``resultType`` (``complete``, ``task``, ``input_required``)."""
    await respond(send, 200, frames.result(rid, {**result, "resultType": kind}), b"application/json")


async def invalid_params(send: Send, rid: RequestId, message: str) -> None:
    """A ``-32602`` answered in band (200): the request was well formed, its parameters were not."""
    await respond(send, 200, frames.error(rid, errors.INVALID_PARAMS, message), b"application/json")
