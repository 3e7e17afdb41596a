"""Audit results and their three renderings: a rich table on the terminal, a JSON document, Markdown.

Evidence is rendered from the recorded exchanges only through :func:`report_document`, which truncates
long bodies and event lists and runs every string through the run's :class:`Redactor`, so no output
path can carry a token.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from rich.console import Console
from rich.table import Table
from rich.text import Text

from .redact import Redactor, truncate
from .wire import Exchange

CheckOutcome = Literal["finding", "ok", "not_run", "not_applicable"]
"""``not_applicable``: the server does not offer what the check tests (e.g. it declares no ``tools.idempotency``);
unlike ``not_run`` it does not fail the audit, since there is nothing a client may rely on to check."""

EXIT_CLEAN = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
"""Bad usage, or a target the audit cannot talk to."""
EXIT_NOT_RUN = 3
"""No finding, but a check could not run: a CI gate must tell a misconfigured audit from a clean one."""

CHECKS: dict[str, str] = {
    "replay_leak_narrowed": "replay leaked to a narrowed token",
    "refusal_clean_end": "refusal expressed as a clean stream end",
    "unknown_event_id_empty_200": "unknown Last-Event-ID answered with an empty 200",
    "cross_session_replay": "another session's events replayed by event id",
    "cross_stream_replay": "another stream's events replayed on resume",
    "session_other_principal": "session usable by another principal",
    "resumed_stream_never_ends": "resumed completed stream never ends",
    "wrong_audience_accepted": "token for another resource accepted",
    "batch_multiplexing": "batch on a 2025-03-26 session not handled safely",
    "task_leak_narrowed": "task result delivered to a narrowed token",
    "task_denial_unknown_alike": "task denial answered like an unknown task id (or it lost the task)",
    "task_other_principal": "task readable by, or revealed to, another principal",
    "task_stream_narrowed": "task stream resumed by a narrowed token after a cut: leak or silent end",
    "idempotency_duplicate_runs": "a duplicate tools/call under the same idempotencyKey ran the tool again",
    "idempotency_concurrent_runs": "a duplicate sent while the key's first call still ran ran the tool again",
    "idempotency_conflict_accepted": "a used idempotencyKey with other arguments not refused as a conflict",
    "idempotency_replay_narrowed": "a completed key's outcome replayed to a narrowed token, or the refusal cost it",
    "idempotency_other_principal": "another principal's same key got the first's outcome or told the key exists",
}
"""Every check the audit runs, in order, with the finding it looks for."""

OUTCOME_TEXT: dict[CheckOutcome, str] = {
    "finding": "FINDING",
    "ok": "ok",
    "not_run": "not run",
    "not_applicable": "not applicable",
}
OUTCOME_STYLE: dict[CheckOutcome, str] = {
    "finding": "bold red",
    "ok": "green",
    "not_run": "yellow",
    "not_applicable": "dim",
}

END_TEXT = {
    "closed": "closed by the server",
    "dropped": "dropped by the audit",
    "deadline": "still open when the audit stopped waiting",
    "error": "failed",
}

BODY_CHARS = 800
EVENT_CHARS = 600
EVENTS_KEPT = 12


@dataclass(slots=True)
class CheckResult:
    name: str
    outcome: CheckOutcome
    summary: str
    evidence: list[Exchange] = field(default_factory=list)

    @property
    def title(self) -> str:
        return CHECKS[self.name]


@dataclass(slots=True)
class AuditReport:
    target: str
    started_at: str
    settings: dict[str, Any]
    results: list[CheckResult]
    allow_not_run: bool = False

    @property
    def findings(self) -> list[CheckResult]:
        return [r for r in self.results if r.outcome == "finding"]

    @property
    def not_run(self) -> list[CheckResult]:
        return [r for r in self.results if r.outcome == "not_run"]

    @property
    def not_applicable(self) -> list[CheckResult]:
        return [r for r in self.results if r.outcome == "not_applicable"]

    @property
    def exit_status(self) -> int:
        if self.findings:
            return EXIT_FINDINGS
        return EXIT_NOT_RUN if self.not_run and not self.allow_not_run else EXIT_CLEAN


def exchange_evidence(exchange: Exchange) -> dict[str, Any]:
    """One exchange as evidence: the request sent and what came back, long parts truncated."""
    events = [
        {"id": e.id, "event": e.event, "data": truncate(e.data, EVENT_CHARS), "at": e.at}
        for e in exchange.events[:EVENTS_KEPT]
    ]
    response: dict[str, Any] = {"status": exchange.status, "headers": exchange.response_headers}
    if exchange.body:
        response["body"] = truncate(exchange.body, BODY_CHARS)
    if exchange.is_sse:
        response["events"] = events
        if len(exchange.events) > EVENTS_KEPT:
            response["events_left_out"] = len(exchange.events) - EVENTS_KEPT
    response["end"] = exchange.end
    if exchange.error:
        response["error"] = exchange.error
    response["seconds"] = exchange.seconds
    request: dict[str, Any] = {"method": exchange.method, "url": exchange.url, "headers": exchange.request_headers}
    if exchange.request_body is not None:
        request["body"] = truncate(exchange.request_body, BODY_CHARS)
    return {"label": exchange.label, "request": request, "response": response}


def report_document(report: AuditReport, redactor: Redactor) -> dict[str, Any]:
    """The JSON report: every string scrubbed of secrets."""
    document = {
        "tool": "mcp-lossless audit",
        "target": report.target,
        "started_at": report.started_at,
        "settings": report.settings,
        "exit_status": report.exit_status,
        "findings": [r.name for r in report.findings],
        "not_run": [r.name for r in report.not_run],
        "not_applicable": [r.name for r in report.not_applicable],
        "checks": [
            {
                "name": r.name,
                "title": r.title,
                "outcome": r.outcome,
                "summary": r.summary,
                "evidence": [exchange_evidence(e) for e in r.evidence],
            }
            for r in report.results
        ],
    }
    scrubbed: dict[str, Any] = redactor.scrub_all(document)
    return scrubbed


def _evidence_markdown(item: dict[str, Any]) -> list[str]:
    request, response = item["request"], item["response"]
    lines = [f"{request['method']} {request['url']}"]
    lines += [f"{k}: {v}" for k, v in request["headers"].items()]
    if "body" in request:
        lines += ["", request["body"]]
    status = response["status"] if response["status"] is not None else "(no response)"
    lines += ["", f"→ {status} ({END_TEXT[response['end']]} after {response['seconds']} s)"]
    lines += [f"{k}: {v}" for k, v in response["headers"].items()]
    if "error" in response:
        lines.append(f"error: {response['error']}")
    if "body" in response:
        lines += ["", response["body"]]
    for event in response.get("events", []):
        lines.append(f"[{event['at']} s] id={event['id']} {event['event']}: {event['data']}")
    if response.get("events_left_out"):
        lines.append(f"… {response['events_left_out']} more events")
    longest = max((len(run) for line in lines for run in re.findall("`+", line)), default=0)
    fence = "`" * max(3, longest + 1)
    return [f"**{item['label']}**", "", fence, *lines, fence, ""]


def to_markdown(document: dict[str, Any]) -> str:
    """The Markdown report, from :func:`report_document`'s output (already scrubbed)."""
    out = [f"# mcp-lossless audit of {document['target']}", "", f"Started {document['started_at']}.", ""]
    out += ["| setting | value |", "|---|---|"]
    out += [f"| {k} | `{v}` |" for k, v in document["settings"].items()]
    out += ["", "| check | result | summary |", "|---|---|---|"]
    for check in document["checks"]:
        text = OUTCOME_TEXT[check["outcome"]]
        out.append(f"| `{check['name']}` | {text} | {' '.join(check['summary'].replace('|', '/').split())} |")
    verdict = ", ".join(document["findings"]) or "none"
    not_run = ", ".join(document["not_run"]) or "none"
    out += ["", f"Findings: {verdict}. Not run: {not_run}. Exit status {document['exit_status']}.", ""]
    if document["not_applicable"]:
        out += [f"Not applicable: {', '.join(document['not_applicable'])}.", ""]
    for check in document["checks"]:
        out += [f"## {check['name']}: {OUTCOME_TEXT[check['outcome']]}", "", f"*{check['title']}*", ""]
        out += [check["summary"], ""]
        for item in check["evidence"]:
            out += _evidence_markdown(item)
    return "\n".join(out)


def render_table(document: dict[str, Any], console: Console) -> None:
    table = Table(title=f"mcp-lossless audit of {document['target']}", show_lines=True)
    table.add_column("check", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("summary")
    for check in document["checks"]:
        outcome: CheckOutcome = check["outcome"]
        table.add_row(
            Text(check["name"]), Text(OUTCOME_TEXT[outcome], style=OUTCOME_STYLE[outcome]), Text(check["summary"])
        )
    console.print(table)
    verdict = ", ".join(document["findings"]) or "none"
    console.print(f"findings: {verdict}", markup=False)
    if document["not_run"]:
        console.print(f"not run: {', '.join(document['not_run'])}", markup=False)
    if document["not_applicable"]:
        console.print(f"not applicable: {', '.join(document['not_applicable'])}", markup=False)
