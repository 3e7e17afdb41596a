"""``mcp-lossless audit URL``: arguments, token sources, outputs and the exit status.

Exit status: 0 every check ran and none found anything, 1 at least one finding, 2 bad usage or a target the
audit cannot talk to, 3 no finding but at least one check could not run (0 with ``--allow-not-run``).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx
import orjson
from rich.console import Console

from ..core.arguments import ArgumentError, parse_tool_arguments
from .context import DEFAULT_VERSION, AuditCall, AuditSettings
from .redact import Redactor
from .report import EXIT_CLEAN, EXIT_NOT_RUN, EXIT_USAGE, render_table, report_document, to_markdown
from .run import AuditError, run_audit
from .tokens import ClientCredentialsGrant, TokenCommand, TokenSource

SECRET_ENV = "MCP_LOSSLESS_AUDIT_SECRET"
SECOND_SECRET_ENV = "MCP_LOSSLESS_AUDIT_SECOND_SECRET"

EPILOG = """\
The call (--call) should send several progress notifications over a second or more (e.g. a tool with
steps=5 delay_ms=200): the audit drops its stream after the first one and resumes it. The narrowed set
(--narrow-resource) must NOT cover the call, e.g. another tool's resource indicator. Token commands get
{resources} replaced by the resource indicators, shell-quoted and space-separated, and print one token.
Call arguments follow httpie: KEY=TEXT is a string, KEY:=JSON raw JSON (steps:=5).

Exit status:
  0  every check ran; no findings
  1  at least one finding
  2  bad usage, or the target could not be talked to
  3  no finding, but at least one check could not run (see "not run"); --allow-not-run turns this into 0
  130  interrupted (Ctrl-C)"""


class AuditUsageError(Exception):
    pass


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("url", help="the MCP endpoint, e.g. https://mcp.example.com/mcp")
    p.add_argument(
        "--call",
        nargs="+",
        required=True,
        metavar="TOOL [KEY=TEXT|KEY:=JSON ...]",
        help="the call to audit with; KEY=TEXT is a string, KEY:=JSON raw JSON (steps:=5)",
    )
    p.add_argument(
        "--resource",
        action="append",
        default=[],
        metavar="TOOL=URI",
        help="a tool's resource indicator, when tools/list does not publish it (_meta io.github.mcp-lossless/resource)",
    )
    p.add_argument(
        "--narrow-resource",
        action="append",
        default=[],
        metavar="URI",
        help="the narrowed token's resources (repeatable); must not cover the call",
    )
    p.add_argument(
        "--foreign-resource",
        default="https://not-this-server.example/mcp",
        metavar="URI",
        help="a resource of another server, for the wrong-audience check",
    )
    p.add_argument("--token-endpoint", metavar="URL", help="OAuth token endpoint (client_credentials grant)")
    p.add_argument("--client", metavar="ID[:SECRET]", help=f"client credentials (secret else from ${SECRET_ENV})")
    p.add_argument(
        "--second-client", metavar="ID[:SECRET]", help=f"a second principal (secret else from ${SECOND_SECRET_ENV})"
    )
    p.add_argument("--token-command", metavar="CMD", help="a command printing a token for {resources}")
    p.add_argument("--second-token-command", metavar="CMD", help="the same, for a second principal")
    p.add_argument("--protocol-version", default=DEFAULT_VERSION, metavar="VERSION", help=f"default {DEFAULT_VERSION}")
    p.add_argument(
        "--read-seconds", type=float, default=10.0, metavar="SECONDS", help="longest wait on one stream (default 10)"
    )
    p.add_argument(
        "--open-seconds",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="a completed stream open this long never ends (default 5)",
    )
    p.add_argument("--json", dest="json_path", metavar="PATH", help="write the JSON report here")
    p.add_argument("--markdown", dest="markdown_path", metavar="PATH", help="write the Markdown report here")
    p.add_argument(
        "--allow-not-run",
        action="store_true",
        help=f"exit {EXIT_CLEAN} rather than {EXIT_NOT_RUN} when no finding was made but some check could not run",
    )


def parse_call(words: list[str]) -> AuditCall:
    tool, *pairs = words
    try:
        return AuditCall(tool, parse_tool_arguments(pairs))
    except ArgumentError as exc:
        raise AuditUsageError(f"--call: {exc}") from None


def _tool_resources(values: list[str]) -> dict[str, str]:
    out = {}
    for value in values:
        tool, sep, uri = value.partition("=")
        if not sep or not tool or not uri:
            raise AuditUsageError(f"--resource {value!r} is not TOOL=URI")
        out[tool] = uri
    return out


def _client(value: str, env: str) -> tuple[str, str]:
    client_id, sep, secret = value.partition(":")
    secret = secret if sep else os.environ.get(env, "")
    if not client_id or not secret:
        raise AuditUsageError(f"client {client_id!r}: give ID:SECRET or set ${env}")
    return client_id, secret


def settings_from(args: argparse.Namespace) -> AuditSettings:
    if not args.url.startswith(("http://", "https://")):
        raise AuditUsageError(f"{args.url!r} is not an http(s) URL")
    if args.read_seconds <= 0 or args.open_seconds <= 0:
        raise AuditUsageError("--read-seconds and --open-seconds must be positive")
    return AuditSettings(
        url=args.url,
        call=parse_call(args.call),
        narrow_resources=tuple(dict.fromkeys(args.narrow_resource)),
        foreign_resource=args.foreign_resource,
        tool_resources=_tool_resources(args.resource),
        version=args.protocol_version,
        read_seconds=args.read_seconds,
        open_seconds=args.open_seconds,
        allow_not_run=args.allow_not_run,
    )


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from(args)
        if args.token_endpoint and args.token_command:
            raise AuditUsageError("give --token-endpoint (with --client) or --token-command, not both")
        if (args.client or args.second_client) and not args.token_endpoint:
            raise AuditUsageError("--client and --second-client need --token-endpoint")
        if args.token_endpoint and not args.client:
            raise AuditUsageError("--token-endpoint needs --client")
        if args.second_client and args.second_token_command:
            raise AuditUsageError("give --second-client or --second-token-command, not both")
        first = _client(args.client, SECRET_ENV) if args.client else None
        second = _client(args.second_client, SECOND_SECRET_ENV) if args.second_client else None
    except AuditUsageError as exc:
        print(f"mcp-lossless audit: {exc}", file=sys.stderr)
        return EXIT_USAGE
    outcome = anyio.run(_audit, args, settings, first, second)
    if isinstance(outcome, str):
        print(f"mcp-lossless audit: {outcome}", file=sys.stderr)
        return EXIT_USAGE
    document, status = outcome
    render_table(document, Console())
    try:
        if args.json_path:
            Path(args.json_path).write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2) + b"\n")
        if args.markdown_path:
            Path(args.markdown_path).write_text(to_markdown(document) + "\n")
    except OSError as exc:
        print(f"mcp-lossless audit: cannot write the report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return status


async def _audit(
    args: argparse.Namespace,
    settings: AuditSettings,
    first: tuple[str, str] | None,
    second: tuple[str, str] | None,
) -> tuple[dict[str, Any], int] | str:
    """The scrubbed report document and exit status, or why the audit could not run."""
    redactor = Redactor()
    async with httpx.AsyncClient(timeout=httpx.Timeout(10.0, read=settings.read_seconds + 5)) as http:
        principal: TokenSource | None = None
        other: TokenSource | None = None
        if first is not None:
            redactor.register(first[1], "client secret")
            principal = ClientCredentialsGrant(http, args.token_endpoint, *first)
        elif args.token_command:
            principal = TokenCommand(args.token_command)
        if second is not None:
            redactor.register(second[1], "second client secret")
            other = ClientCredentialsGrant(http, args.token_endpoint, *second)
        elif args.second_token_command:
            other = TokenCommand(args.second_token_command)
        try:
            report = await run_audit(settings, http, redactor, principal, other)
        except AuditError as exc:
            return redactor.scrub(str(exc))
    return report_document(report, redactor), report.exit_status
