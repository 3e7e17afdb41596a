"""The lossless MCP client: every call ends in exactly one explicit outcome.

    async with Client(url, auth=OAuth("id", "secret")) as client:
        result = await client.call_tool("fetch", {"url": u}, on_progress=print, timeout=30)

Outcomes other than a result are the exceptions below (each with a stable ``kind``); :class:`SyncClient`
offers the same for scripts.
"""

from ..core.actions import RecoveryPolicy
from .assertions import IdJagFromIdp, JwtBearerGrant, PrivateKeyJwt
from .catalog import Prompt, PromptResult, Resource, ResourceTemplate
from .client import Client, Tool, ToolCall, ToolResult
from .dpop import DpopKey
from .errors import (
    AuthorizationFailed,
    CallMayHaveRun,
    ClientClosed,
    ConnectionFailed,
    DeadlineExceeded,
    InputUnanswered,
    McpClientError,
    ProtocolViolation,
    RemoteError,
    RequestRejected,
    SessionLost,
    ToolFailed,
)
from .handlers import InputHandler, InputRefused
from .journal import FileJournal, Journal, PendingCall
from .oauth import Auth, AuthorizationCodeGrant, BearerToken, Challenge, ExchangedToken, LoopbackRedirect, OAuth
from .registration import ClientRegistration
from .session import ProgressUpdate, ServerInfo
from .sync import SyncClient
from .transport import Backoff, HttpPool, Response, ResponseTooLarge

__all__ = [
    "Auth",
    "AuthorizationCodeGrant",
    "AuthorizationFailed",
    "Backoff",
    "BearerToken",
    "CallMayHaveRun",
    "Challenge",
    "Client",
    "ClientClosed",
    "ClientRegistration",
    "ConnectionFailed",
    "DeadlineExceeded",
    "DpopKey",
    "ExchangedToken",
    "FileJournal",
    "HttpPool",
    "IdJagFromIdp",
    "InputHandler",
    "InputRefused",
    "InputUnanswered",
    "Journal",
    "JwtBearerGrant",
    "LoopbackRedirect",
    "McpClientError",
    "OAuth",
    "PendingCall",
    "PrivateKeyJwt",
    "ProgressUpdate",
    "Prompt",
    "PromptResult",
    "ProtocolViolation",
    "RecoveryPolicy",
    "RemoteError",
    "RequestRejected",
    "Resource",
    "ResourceTemplate",
    "Response",
    "ResponseTooLarge",
    "ServerInfo",
    "SessionLost",
    "SyncClient",
    "Tool",
    "ToolCall",
    "ToolFailed",
    "ToolResult",
]
