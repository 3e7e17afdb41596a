"""JSON-RPC error codes: the standard ones and the ones this project defines (documented in docs/errors.md)."""

from __future__ import annotations

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800
RESOURCE_NOT_FOUND = -32002
"""MCP's code (to 2025-11-25) for a ``resources/read`` of a URI the server does not have; 2026-07-28 forbids it
and answers with ``INVALID_PARAMS``."""

DELIVERY_REFUSED = -32041
"""An event of this request could not be delivered to the stream's token; re-authorize and resume."""

EXECUTION_LOST = -32042
"""The process running this request ended before it answered; the tool may have run."""

FORBIDDEN = -32043
"""A tools/call whose token does not cover the tool's resource indicator."""

HEADER_MISMATCH = -32020
MISSING_REQUIRED_CLIENT_CAPABILITY = -32021
"""Two of the three codes 2026-07-28 defines (its modern leg only; each with HTTP 400)."""

UNSUPPORTED_PROTOCOL_VERSION = -32022
"""The spec's code (2026-07-28) for a request at a revision the server does not serve; ``data.supported`` lists
the ones it does, so a client can fall back (to ``initialize`` when none of them is modern)."""

LIMIT_EXCEEDED = -32044
"""A request past one of the server's limits; ``data.limit`` names it (docs/limits.md), ``data.retryAfter`` when
waiting helps."""

UPSTREAM_FAILED = -32045
"""A gateway's upstream gave no answer: unreachable, refused, broke the protocol, or passed the deadline."""

IDEMPOTENCY_IN_PROGRESS = -32046
"""A ``tools/call`` whose idempotency key's first use still runs (SEP-3182 ``idempotency_key_in_progress`` in
``data.type``); ``data.retryAfter`` says when to send it again, ``data.lastEventId`` where a legacy stream resumes."""

# 2026-07-28 reserves -32020..-32099 for the specification and asks implementations to allocate codes outside
# the JSON-RPC range (-32768..-32000): the codes only the modern leg sends live at -31xxx, below. Two legacy codes
# inside the reserved range reach 2026-07-28 clients too, so that one condition has one code in both eras:
# LIMIT_EXCEEDED (a limit, docs/limits.md) and UPSTREAM_FAILED (a gateway's upstream gave no answer).
TASK_DENIED = -31041
"""The owner's task, whose tool the poll's token no longer covers: re-authorize and poll the same id (HTTP 403)."""

TASK_EXECUTION_LOST = -31042
"""A task's process ended before the task finished (its ``error`` once ``failed``); the tool may have run."""

TOOL_FORBIDDEN = -31043
"""A 2026-07-28 ``tools/call`` whose token does not cover the tool (HTTP 403; the legacy leg's FORBIDDEN)."""

CLIENT_INPUT_UNAVAILABLE = -31044
"""A tool asked the client for input (sampling, elicitation), which the 2026-07-28 leg does not offer."""
