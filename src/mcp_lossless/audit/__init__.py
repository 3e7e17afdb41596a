"""``mcp-lossless audit``: probe any Streamable HTTP MCP server for lost or leaked tool results.

It drops streams, resumes them with narrowed, foreign and other principals' tokens, and reports each
hazard it observes as a named finding with the requests and answers that show it.
"""

from .context import AuditSettings, ToolCall
from .report import CHECKS, AuditReport, CheckResult
from .run import AuditError, run_audit

__all__ = ["CHECKS", "AuditError", "AuditReport", "AuditSettings", "CheckResult", "ToolCall", "run_audit"]
