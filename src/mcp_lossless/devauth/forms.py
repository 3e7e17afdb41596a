"""Request parameters as OAuth sees them: repeated ``resource`` values kept, other repeats refused."""

from __future__ import annotations

from urllib.parse import parse_qs

from ..asgi import Receive, Scope, header, read_body
from .grants import OAuthError

MAX_BODY = 64 * 1024
MAX_FIELDS = 256

Params = dict[str, list[str]]


def parse_params(text: str) -> Params:
    try:
        return parse_qs(text, keep_blank_values=True, errors="strict", max_num_fields=MAX_FIELDS)
    except ValueError as exc:  # undecodable percent-escapes or too many fields
        raise OAuthError("invalid_request", f"malformed parameters: {exc}") from None


def query_params(scope: Scope) -> Params:
    return parse_params(scope["query_string"].decode("latin-1"))


async def form_params(scope: Scope, receive: Receive) -> Params:
    """The ``application/x-www-form-urlencoded`` body; raises BodyTooLarge beyond 64 KiB."""
    content_type = (header(scope, b"content-type") or "").split(";")[0].strip().lower()
    if content_type != "application/x-www-form-urlencoded":
        raise OAuthError("invalid_request", "body must be application/x-www-form-urlencoded")
    body = await read_body(receive, MAX_BODY)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise OAuthError("invalid_request", "body is not UTF-8") from None
    return parse_params(text)


def optional(params: Params, name: str) -> str | None:
    """RFC 6749 §3.1: parameters MUST NOT be included more than once."""
    values = params.get(name, [])
    if len(values) > 1:
        raise OAuthError("invalid_request", f"parameter {name!r} is repeated")
    return values[0] if values else None


def required(params: Params, name: str) -> str:
    value = optional(params, name)
    if not value:
        raise OAuthError("invalid_request", f"missing parameter {name!r}")
    return value
