"""Every way a call can end other than with a result, as a distinct exception type.

Each class has a stable ``kind`` keyword (for ``--json`` output and exit statuses) and a ``reason``
that says what happened in words. No message ever contains a token.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Mapping
from typing import Any

import httpx


class McpClientError(Exception):
    """Base of every error the client raises for a call or the session."""

    kind = "error"

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class ToolFailed(McpClientError):
    """The tool ran and reported failure (``isError: true``); ``result`` is what it returned.

    The caller's side of a failed tool: the server's :class:`mcp_lossless.server.ToolError` is what a tool
    raises to report failure, and this is what arrives. Named like its siblings, after what happened.
    """

    kind = "tool_error"

    def __init__(self, reason: str, result: Any) -> None:
        super().__init__(reason)
        self.result = result


class RemoteError(McpClientError):
    """The server answered the request with a JSON-RPC error."""

    kind = "remote_error"

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"server error {code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class CallMayHaveRun(McpClientError):
    """The request may have been executed, but its result was not received and never will be.

    Raised instead of re-sending when the tool is not known to be idempotent and the caller did not
    opt in: running it twice could do twice what it does.
    """

    kind = "may_have_run"

    def __init__(self, reason: str, error: Mapping[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.error = error


class SessionLost(CallMayHaveRun):
    """The server ended the session (HTTP 404) while the call was pending."""

    kind = "session_lost"


class DeadlineExceeded(McpClientError, TimeoutError):
    """The call's deadline passed; the client told the server to cancel it."""

    kind = "deadline"


class AuthorizationFailed(McpClientError):
    """No token the server accepts could be obtained for this call or session."""

    kind = "authorization"


class ProtocolViolation(McpClientError):
    """The server broke the protocol (bad frames, unknown events, foreign ids, no answer)."""

    kind = "protocol"


class RequestRejected(McpClientError):
    """The server refused the request outright (an HTTP 4xx); it did not run."""

    kind = "rejected"


class ConnectionFailed(McpClientError):
    """The server could not be reached; the request was never delivered."""

    kind = "connection"


class InputUnanswered(McpClientError):
    """The server needed client input this client could not give: no handler registered for what it asked
    (or the server refused to ask for lack of the capability), the handler failed (its exception is the
    cause), or the server kept asking past
    :data:`~mcp_lossless.client.handlers.MAX_INPUT_ROUNDS`. The call did not complete; a task it started was
    cancelled."""

    kind = "input_unanswered"


class ClientClosed(McpClientError):
    """The client was closed while the call was pending."""

    kind = "closed"


def describe_failure(exc: BaseException) -> str:
    """What a failed request or handler met, in words for the person reading the error (an exception's repr
    names our library's classes, not what happened). Logs may keep the repr."""
    causes = _causes(exc)
    if isinstance(exc, httpx.ConnectTimeout):
        return "connecting timed out"
    if isinstance(exc, httpx.ConnectError):
        if any(isinstance(cause, ConnectionRefusedError) for cause in causes):
            return "connection refused"
        if any(isinstance(cause, socket.gaierror) for cause in causes):
            return "the host name did not resolve"
        refused = next((c for c in causes if isinstance(c, ssl.SSLCertVerificationError)), None)
        if refused is not None:
            return f"its TLS certificate was not accepted ({getattr(refused, 'verify_message', '') or refused})"
        tls = next((c for c in causes if isinstance(c, ssl.SSLError)), None)
        if tls is not None:
            plain = ": a plain http:// server?" if tls.reason == "WRONG_VERSION_NUMBER" else ""
            return f"the TLS handshake failed ({tls.reason or tls}{plain})"
    for kind, words in _WORDS:
        if isinstance(exc, kind):
            detail = str(exc).strip()
            return f"{words}: {detail}" if detail else words
    detail = str(exc).strip()
    if isinstance(exc, httpx.HTTPError | McpClientError):
        return detail or type(exc).__name__
    return f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__  # someone's code failed: name how


def unreachable(url: str, exc: BaseException) -> ConnectionFailed:
    """The one sentence for a server that could not be reached, with what to check."""
    return ConnectionFailed(
        f"cannot reach {url}: {describe_failure(exc)}; check that the server is running at that URL"
    )


_WORDS: tuple[tuple[type[BaseException], str], ...] = (
    (httpx.ConnectError, "could not connect"),
    (httpx.PoolTimeout, "no connection was free in time"),
    (httpx.ReadTimeout, "the server sent nothing within the read timeout"),
    (httpx.WriteTimeout, "sending the request timed out"),
    (httpx.TimeoutException, "timed out"),
    (httpx.RemoteProtocolError, "the server broke off the HTTP exchange"),
    (httpx.ReadError, "the connection broke while reading the response"),
    (httpx.WriteError, "the connection broke while sending the request"),
    (httpx.UnsupportedProtocol, "the URL's scheme is not http or https"),
    (EOFError, "input ended"),  # stdin closed while the terminal asked
)


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc``'s causes, exception groups opened (anyio raises one for every address a connect tried)."""
    seen: list[BaseException] = []
    todo = [exc]
    while todo and len(seen) < 32:
        current = todo.pop()
        if any(current is s for s in seen):
            continue
        seen.append(current)
        if isinstance(current, BaseExceptionGroup):
            todo.extend(current.exceptions)
        for nxt in (current.__cause__, current.__context__):
            if nxt is not None:
                todo.append(nxt)
    return seen
