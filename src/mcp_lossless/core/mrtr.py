"""Multi round-trip requests (2026-07-28, SEP-2322): the ``inputResponses`` a retry carries and the sealed
``requestState`` that carries the answers of earlier rounds.

A request that needs client input (elicitation, sampling, roots) is answered with an ``InputRequiredResult``;
the client retries it with the answers (``inputResponses``) and the ``requestState`` echoed. This server keeps
nothing between the rounds: the retry runs the tool again from its start, and every answer the tool took in
earlier rounds rides in ``requestState`` (docs/decisions/0015). Since the state carries answers a client gave
a principal, it is sealed: an HMAC-SHA256 over the payload binds it to the principal, the method, the target
(tool or prompt name, resource URI) and a digest of the arguments, and it expires. A state that fails any of
these is refused whole, never partly used; answers are otherwise untrusted client input like any argument.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from dataclasses import dataclass
from typing import Any

import orjson

from .principal import Principal

STATE_SECONDS = 600.0
"""How long a ``requestState`` is accepted after it was issued (the SEP's "short expiry")."""
STATE_VERSION = 1
MRTR_METHODS = frozenset({"tools/call", "prompts/get", "resources/read"})
"""The requests that may be answered with ``InputRequiredResult``; no other may."""


class BadInput(ValueError):
    """``inputResponses`` or ``requestState`` that cannot be used: the message says which and why (``-32602``)."""


@dataclass(frozen=True, slots=True)
class Binding:
    """What a ``requestState`` is good for: one principal's retries of one request (method, target, arguments)."""

    principal: Principal
    method: str
    target: str
    arguments: Any

    def digest(self) -> str:
        p = self.principal
        raw = orjson.dumps(
            [p.issuer, p.subject, p.client_id, self.method, self.target, self.arguments], option=orjson.OPT_SORT_KEYS
        )
        return base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).decode()


def state_key(secret: bytes) -> bytes:
    """The MAC key of ``requestState``, derived from the store's secret: every replica sharing a store accepts
    the states of the others (the retry of a round may reach another replica)."""
    return hmac.new(secret, b"mcp-lossless/requestState/v1", hashlib.sha256).digest()


def _mac(key: bytes, body: bytes) -> bytes:
    """The MAC of a state's body, in the one (unpadded base64url) spelling a state may carry it in."""
    return base64.urlsafe_b64encode(hmac.new(key, body, hashlib.sha256).digest()).rstrip(b"=")


def seal(key: bytes, binding: Binding, answers: dict[str, dict[str, Any]], now: float) -> str:
    """The ``requestState`` of a round: the answers the tool took so far, for ``binding``, for :data:`STATE_SECONDS`."""
    payload = orjson.dumps({"v": STATE_VERSION, "b": binding.digest(), "e": now + STATE_SECONDS, "a": answers})
    body = base64.urlsafe_b64encode(payload).rstrip(b"=")
    return (body + b"." + _mac(key, body)).decode()


def _b64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def unseal(key: bytes, state: object, binding: Binding, now: float) -> dict[str, dict[str, Any]]:
    """The answers a ``requestState`` carries; :class:`BadInput` when it was altered, expired, or was issued for
    another principal or another request."""
    if not isinstance(state, str):
        raise BadInput("requestState must be the string an InputRequiredResult carried")
    body, dot, mac = state.partition(".")
    if not (dot and body.isascii() and mac.isascii() and hmac.compare_digest(mac.encode(), _mac(key, body.encode()))):
        raise BadInput("requestState failed verification: it was not issued by this server or was altered")
    try:
        payload = orjson.loads(_b64(body))
    except (binascii.Error, orjson.JSONDecodeError, ValueError):
        raise BadInput("requestState failed verification: unreadable") from None
    if not isinstance(payload, dict) or payload.get("v") != STATE_VERSION:
        raise BadInput("requestState failed verification: unknown version")
    if payload.get("b") != binding.digest():
        raise BadInput("requestState was issued for another principal, request or arguments")
    expires = payload.get("e")
    if not isinstance(expires, (int, float)) or now > expires:
        raise BadInput(f"requestState expired ({STATE_SECONDS:g} s); retry the request without it")
    answers = payload.get("a")
    if not isinstance(answers, dict):
        raise BadInput("requestState failed verification: no answers")
    return answers


def input_responses(raw: object) -> dict[str, dict[str, Any]]:
    """A request's ``inputResponses``: an object whose every value is an object (a client's result); keys the
    server never asked for are kept here and ignored by whoever looks answers up."""
    if not isinstance(raw, dict):
        raise BadInput("inputResponses must be an object mapping input request keys to the client's results")
    bad = sorted(key for key, value in raw.items() if not isinstance(value, dict))
    if bad:
        raise BadInput(f"inputResponses.{bad[0]} must be an object (the client's result for that input request)")
    return raw


def answers_of(key: bytes, params: dict[str, Any], binding: Binding, now: float) -> dict[str, dict[str, Any]]:
    """The answers a request carries: its sealed earlier rounds, then its own ``inputResponses``."""
    answers: dict[str, dict[str, Any]] = {}
    if "requestState" in params:
        answers.update(unseal(key, params["requestState"], binding, now))
    if "inputResponses" in params:
        answers.update(input_responses(params["inputResponses"]))
    return answers
