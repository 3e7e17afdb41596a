"""``mcp-lossless audit``: probe any Streamable HTTP MCP server for lost or leaked tool results.

It drops streams, resumes them with narrowed, foreign and other principals' tokens, polls 2026-07-28 tasks with
them, probes SEP-3182 idempotency keys (a duplicate run, a conflict, a replay to a narrowed token or to another
principal), and reports each hazard it observes as a named finding with the requests and answers that show it.
"""

from .context import AuditCall, AuditSettings
from .redact import Redactor
from .report import CHECKS, AuditReport, CheckResult
from .run import AuditError, run_audit
from .tokens import ClientCredentialsGrant, TokenCommand, TokenSource, TokenUnavailable
from .wire import Exchange, WireEvent

__all__ = [
    "CHECKS",
    "AuditCall",
    "AuditError",
    "AuditReport",
    "AuditSettings",
    "CheckResult",
    "ClientCredentialsGrant",
    "Exchange",
    "Redactor",
    "TokenCommand",
    "TokenSource",
    "TokenUnavailable",
    "WireEvent",
    "run_audit",
]
