"""``mcp-lossless call URL TOOL key=value …``: one tool call from the shell, its one outcome, an exit status.

The era is the server's: 2026-07-28 when its ``server/discover`` answers as a modern server (a tool it runs as a
task is followed to its outcome by its event stream, or polled), else a legacy session
(:func:`~mcp_lossless.client.modern.open_client`). Progress goes to stderr (a bar on a terminal, one line per update
otherwise), a task's from its event stream where the server offers one, and so does a task's state (its id,
status and status message, and a line if its events are gone); the outcome goes to stdout (the result's text, or with
``--json`` one JSON document) and, for errors, a sentence on stderr. Input the tool asks for is answered as
:mod:`~.cli_input` says.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from ..core import idempotency
from ..core.arguments import ArgumentError, parse_tool_arguments, text_that_looks_like_json
from ..core.errors import INVALID_PARAMS, UPSTREAM_FAILED
from .cli_input import Ask, input_handlers
from .client import Client, ToolResult
from .errors import (
    AuthorizationFailed,
    CallMayHaveRun,
    ConnectionFailed,
    DeadlineExceeded,
    McpClientError,
    RemoteError,
    ToolFailed,
)
from .handlers import InputHandler
from .modern import ModernClient, TaskUpdate, open_client
from .oauth import Auth, AuthorizationCodeGrant, LoopbackRedirect, OAuth, TokenEndpointError
from .session import ProgressUpdate

EXIT_RESULT = 0
EXIT_TOOL_ERROR = 1
EXIT_USAGE = 2
EXIT_MAY_HAVE_RUN = 3
EXIT_AUTHORIZATION = 4
EXIT_UNREACHED = 5
EXIT_SERVER = 6
SAFETY_MARGIN = 5.0
"""Seconds past ``--timeout`` after which the command gives up even if the client's own deadline did not fire."""
MINIMUM_WAIT = 0.001

EPILOG = """\
Arguments follow httpie: KEY=TEXT is the string TEXT, KEY:=JSON is raw JSON (n:=5, on:=true, tags:='["a"]').
Without --client-id no credentials are sent (enough for servers that ask for none). With --client-id and
--client-secret the client_credentials grant is used; with --client-id alone, authorization code + PKCE as a
public client (the dev AS's is dev-public; dev-client is confidential and needs --client-secret): open the
printed URL in a browser, which redirects back to a listener on 127.0.0.1.

Input the tool asks for: --root DIR lists DIR as a root; --elicit KEY=TEXT|KEY:=JSON answers an elicitation
(declined when the values miss a required field); without --elicit, on a terminal, each field is asked.
Sampling is not offered.

Exit status:
  0  the tool returned a result
  1  the tool ran and reported an error (isError)
  2  bad usage
  3  the call may have run, but its result was not received: the server (or a gateway's upstream) lost its
     execution, or stopped answering after it was sent (not sent again: the tool is not idempotent, or runs
     as a task)
  4  authorization failed (no token the server accepts could be obtained)
  5  the deadline passed, or the server (or a gateway's upstream) could not be reached: the call did not run
     or, idempotent, may be sent again
  6  the server refused the request or broke the protocol
  130  interrupted (Ctrl-C): the call may have run, its outcome was not received"""


class CallUsageError(Exception):
    """Bad ``call`` arguments (exit status 2); the audit's is ``AuditUsageError``, the CLI's own ``UsageError``."""


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("url", help="the MCP endpoint with its scheme, e.g. http://127.0.0.1:8000/mcp")
    p.add_argument("tool", help="the tool to call")
    p.add_argument("arguments", nargs="*", metavar="KEY=TEXT|KEY:=JSON", help="the tool's arguments")
    p.add_argument(
        "--client-id", metavar="ID", help="OAuth client id (client_credentials with --client-secret, else code + PKCE)"
    )
    p.add_argument("--client-secret", metavar="SECRET", help="OAuth client secret")
    p.add_argument("--timeout", type=float, default=60.0, metavar="SECONDS", help="deadline of the call (default 60)")
    p.add_argument("--json", action="store_true", help="print one JSON document: the outcome, for machines")
    p.add_argument(
        "--root", action="append", default=[], metavar="DIR", help="a root to list when the tool asks (repeatable)"
    )
    p.add_argument(
        "--elicit",
        action="append",
        metavar="KEY=TEXT|KEY:=JSON",
        help="answer the tool's elicitation with these values (repeatable); without it a terminal asks",
    )
    p.add_argument(
        "--idempotency-key",
        metavar="KEY",
        help="the call's SEP-3182 key when the server declares tools.idempotency (default a fresh UUID 4); run the "
        "command again with the same key after a crash or a lost answer and the server replays the outcome of the "
        "tool's one run",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log the client's recovery decisions to stderr")


UPSTREAM_UNREACHED = frozenset({"unreachable", "deadline"})
"""``UPSTREAM_FAILED`` reasons that are the upstream's :data:`EXIT_UNREACHED` (docs/gateway.md); the others
(``rejected``, ``unauthorized``, ``protocol``, ``closed``) are a refusal, unless the tool may have run."""


def exit_status(error: BaseException) -> int:
    """The exit status of an outcome other than a result: what the caller may do next (the epilog's table).

    A gateway's ``UPSTREAM_FAILED`` arrives as a JSON-RPC error, but its ``data`` tells the same outcomes apart as
    the client's own exceptions do, so it gets the same statuses."""
    if isinstance(error, ToolFailed):
        return EXIT_TOOL_ERROR
    if isinstance(error, CallMayHaveRun):
        return EXIT_MAY_HAVE_RUN
    if isinstance(error, AuthorizationFailed):
        return EXIT_AUTHORIZATION
    if isinstance(error, DeadlineExceeded | ConnectionFailed | TimeoutError):
        return EXIT_UNREACHED
    if isinstance(error, RemoteError) and error.code == UPSTREAM_FAILED and isinstance(error.data, dict):
        if error.data.get("mayHaveRun") is True:
            return EXIT_MAY_HAVE_RUN
        if error.data.get("reason") in UPSTREAM_UNREACHED:
            return EXIT_UNREACHED
    return EXIT_SERVER


def run(args: argparse.Namespace) -> int:
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("mcp-lossless call: %(message)s"))
    client_log = logging.getLogger("mcp_lossless")
    client_log.addHandler(handler)
    client_log.setLevel(logging.INFO if args.verbose else logging.CRITICAL)
    try:
        if not args.url.startswith(("http://", "https://")):
            raise CallUsageError(f"{args.url!r} is not an http:// or https:// URL")
        arguments = parse_tool_arguments(args.arguments)
        try:
            given = parse_tool_arguments(args.elicit) if args.elicit is not None else None
        except ArgumentError as exc:
            raise CallUsageError(f"--elicit: {exc}") from None
        missing = [root for root in args.root if not Path(root).exists()]
        if missing:  # found now, not when (and if) the tool asks for its roots
            raise CallUsageError(f"--root {missing[0]!r}: no such file or directory")
        if args.timeout <= 0:
            raise CallUsageError("--timeout must be positive")
        if args.client_secret is not None and args.client_id is None:
            raise CallUsageError("--client-secret needs --client-id")
        if args.idempotency_key is not None:  # an empty one was replaced by a fresh key without a word
            try:
                idempotency.key_of({idempotency.KEY_PARAM: args.idempotency_key})
            except idempotency.InvalidKey as exc:
                raise CallUsageError(f"--idempotency-key {args.idempotency_key!r}: {exc}") from None
    except (CallUsageError, ArgumentError) as exc:
        err.print(f"mcp-lossless call: {exc}", markup=False)
        return EXIT_USAGE
    try:
        result = anyio.run(_call, args, arguments, given, err)
    except (McpClientError, TimeoutError) as exc:
        return _failed(args, exc, err)
    if args.json:
        print(orjson.dumps({"outcome": "result", "result": result.raw, "replayed": result.replayed}).decode())
    else:
        if result.replayed:  # stderr: stdout is the outcome's
            err.print("mcp-lossless call: outcome replayed: the tool ran once, for an earlier try", markup=False)
        print(result.text if result.text else orjson.dumps(result.raw.get("content", [])).decode())
    return EXIT_RESULT


async def _call(
    args: argparse.Namespace, arguments: dict[str, Any], given: dict[str, Any] | None, err: Console
) -> ToolResult:
    with _progress_display(err, args.tool) as show:
        interactive = given is None and err.is_terminal and sys.stdin.isatty()
        handlers = input_handlers(args.root, given, _terminal(show) if interactive else None)
        if args.client_id is not None and args.client_secret is None:
            async with LoopbackRedirect(lambda url: err.print(f"Open to authorize: {url}", markup=False)) as redirect:
                auth = OAuth(args.client_id, grant=AuthorizationCodeGrant(redirect.uri, redirect))
                return await _call_with(args, arguments, auth, show, handlers)
        credentials = OAuth(args.client_id, args.client_secret) if args.client_id is not None else Auth()
        return await _call_with(args, arguments, credentials, show, handlers)


def _terminal(show: Display) -> Ask:
    """Asks on the terminal (stderr and stdin: stdout is the outcome's), the progress bar put aside meanwhile."""

    def ask(prompt: str) -> str:
        with show.pause():
            sys.stderr.write(prompt)
            sys.stderr.flush()
            line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")

    return ask


async def _call_with(
    args: argparse.Namespace,
    arguments: dict[str, Any],
    auth: Auth,
    show: Display,
    handlers: dict[str, InputHandler],
) -> ToolResult:
    """The era probe (or handshake), the tool list and the call share one deadline; the call's own fires first."""
    deadline = anyio.current_time() + args.timeout
    with anyio.fail_after(args.timeout + SAFETY_MARGIN):
        async with open_client(args.url, auth=auth, timeout=args.timeout, input_handlers=handlers) as client:
            remaining = max(deadline - anyio.current_time(), MINIMUM_WAIT)
            if isinstance(client, ModernClient):
                return await client.call_tool(
                    args.tool,
                    arguments,
                    on_progress=show.progress,
                    timeout=remaining,
                    on_task_update=show.task,
                    idempotency_key=args.idempotency_key,
                )
            assert isinstance(client, Client)
            return await client.call_tool(
                args.tool, arguments, on_progress=show.progress, timeout=remaining, idempotency_key=args.idempotency_key
            )


@dataclass(frozen=True, slots=True)
class Display:
    """Where a call's progress and its task's state go (stderr)."""

    progress: Callable[[ProgressUpdate], None]
    task: Callable[[TaskUpdate], None]
    pause: Callable[[], AbstractContextManager[None]]
    """Puts the display aside while the terminal asks for input."""


def _task_line(update: TaskUpdate) -> str:
    return f"task {update.task_id} {update.status}" + (f": {update.message}" if update.message else "")


@contextmanager
def _progress_display(err: Console, tool: str) -> Iterator[Display]:
    """A bar on a terminal; one line per update when stderr is a file or a pipe."""
    if not err.is_terminal:

        def line(update: ProgressUpdate) -> None:
            total = f"/{update.total:g}" if update.total is not None else ""
            message = f" {update.message}" if update.message else ""
            print(f"progress {update.progress:g}{total}{message}", file=sys.stderr, flush=True)

        def task_line(update: TaskUpdate) -> None:
            print(_task_line(update), file=sys.stderr, flush=True)

        yield Display(line, task_line, nullcontext)
        return
    with Progress(
        TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[note]}"), TimeElapsedColumn(),
        console=err, transient=True,
    ) as bar:  # fmt: skip
        task: TaskID = bar.add_task(tool, total=None, note="")

        def update_bar(update: ProgressUpdate) -> None:
            bar.update(task, completed=update.progress, total=update.total, note=update.message or "")

        def update_task(update: TaskUpdate) -> None:
            note = update.status + (f": {update.message}" if update.message else "")
            bar.update(task, description=f"{tool} (task {update.task_id[:8]}…)", note=note)

        @contextmanager
        def pause() -> Iterator[None]:
            bar.stop()
            try:
                yield
            finally:
                bar.start()

        yield Display(update_bar, update_task, pause)


def _failed(args: argparse.Namespace, error: BaseException, err: Console) -> int:
    status = exit_status(error)
    kind = error.kind if isinstance(error, McpClientError) else "deadline"
    if isinstance(error, TimeoutError):  # the client's own DeadlineExceeded too: name the budget the user gave
        reason = f"no outcome within --timeout {args.timeout:g} s"
    else:
        reason = error.reason if isinstance(error, McpClientError) else str(error)
    if args.json:
        document: dict[str, Any] = {"outcome": "error", "kind": kind, "reason": reason, "exit": status}
        if isinstance(error, ToolFailed) and isinstance(error.result, ToolResult):
            document["result"] = error.result.raw
        print(orjson.dumps(document).decode())
    else:
        if isinstance(error, ToolFailed):
            print(error.reason)
        hint = ""
        if status == EXIT_AUTHORIZATION and not args.client_id:
            hint = "; give --client-id (and --client-secret)"
        elif isinstance(error, TokenEndpointError) and error.secretless is not None and args.client_secret is None:
            hint = "; give --client-secret (client_credentials, no browser), or the id of a public client"
        elif (
            isinstance(error, RemoteError)
            and error.code == INVALID_PARAMS
            and (meant := text_that_looks_like_json(args.arguments, reason))
        ):
            hint = f"; KEY=TEXT sends text: for JSON write {' '.join(meant)}"
        err.print(f"mcp-lossless call: {_headline(status)} ({kind}): {reason}{hint}", markup=False)
    return status


def _headline(status: int) -> str:
    return {
        EXIT_TOOL_ERROR: "the tool reported an error",
        EXIT_MAY_HAVE_RUN: "the call may have run, but its result was not received",
        EXIT_AUTHORIZATION: "authorization failed",
        EXIT_UNREACHED: "no outcome",
        EXIT_SERVER: "the server refused or broke the protocol",
    }[status]
