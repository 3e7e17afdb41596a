"""``mcp-lossless``: ``serve`` the lossless MCP server, ``gateway`` in front of others, ``audit`` any MCP server,
``call`` one tool."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn

from . import __version__

# Everything else is imported inside main (the server's modules take half a second): the console script imports
# this module before main can catch a Ctrl-C, so a Ctrl-C at start-up must find main already running.

INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT, as shells report it) of a command that was not done."""


def _dev_client(value: str) -> tuple[str, str]:
    client_id, sep, secret = value.partition(":")
    if not sep or not client_id or not secret:
        raise argparse.ArgumentTypeError("expected ID:SECRET")
    return client_id, secret


LIMIT_FLAGS: dict[str, tuple[type, str]] = {
    "max_header_bytes": (int, "request line + headers of one request, bytes (431 beyond)"),
    "max_headers": (int, "header fields of one request (431 beyond)"),
    "header_timeout": (float, "seconds to send a request's head, from connecting or the previous answer (408)"),
    "body_timeout": (float, "seconds to send a request's body once its head arrived (408)"),
    "max_connections": (
        int,
        "open connections, also capped by the open-file limit; at the cap the oldest one "
        "without a complete request is closed, else 503",
    ),
    "sessions_per_principal": (int, "sessions one principal holds at once (429)"),
    "calls_per_principal": (int, "requests of one principal running at once (429)"),
    "streams_per_session": (int, "streams one session holds: POST streams still running and its GET stream (429)"),
    "stream_backlog": (int, "events of one stream not yet sent to its client; past it the tool's next progress waits"),
    "stream_backlog_bytes": (int, "payload bytes of that backlog; past it the tool's next progress waits"),
    "running_tasks": (int, "2026-07-28 tasks this process runs at once, waiting for input included (503)"),
    "stored_bytes_per_principal": (
        int,
        "bytes one principal's sessions make the event store hold (events, streams); past it 429, or a running "
        "call ends with the refusal",
    ),
    "idempotency_keys_per_principal": (int, "idempotency keys one principal holds within their window (429)"),
}
"""Every :class:`~mcp_lossless.core.limits.Limits` field as a flag ``--max-header-bytes`` (docs/limits.md)."""


GATEWAY_HELP = "put MCP servers (Streamable HTTP or stdio) behind the lossless server: docs/gateway.md"


def _serve_parser(sub: Any, command: str = "serve") -> None:
    """``serve``'s options; ``gateway`` takes the same but TARGET and --conformance, and needs --config."""
    from .server.config import LOG_LEVELS, ServerConfig

    d = ServerConfig()

    def default(value: object) -> str:
        return f"(default: {value})"

    if command == "serve":
        p = sub.add_parser(
            "serve",
            help="run the lossless MCP server: your tools (TARGET) or the demo tools search and fetch",
            description="Serve the tools of TARGET (or the demo tools) over Streamable HTTP. Every setting can also "
            "come from --config FILE.toml (see examples/server.toml); flags override the file.",
        )
        p.add_argument(
            "target",
            nargs="?",
            metavar="TARGET",
            help="the ToolRegistry to serve: path/to/file.py:NAME or package.module:NAME (default: the demo tools)",
        )
        p.add_argument(
            "--config",
            metavar="FILE.toml",
            help="TOML file with server settings, as examples/server.toml; flags override it (default: none)",
        )
    else:
        p = sub.add_parser(command, help=GATEWAY_HELP, description=GATEWAY_HELP)
        p.add_argument(
            "--config",
            metavar="FILE.toml",
            required=True,
            help="TOML file: server settings as for serve, and one [[upstream]] table per upstream",
        )
        p.add_argument(
            "--lenient-config",
            action="store_true",
            help="expose an upstream whose allow/deny/scopes/idempotent name what it does not offer, with a warning; "
            "each such deny and scope is kept on the closest real name, or on all of the upstream (default: such an "
            "upstream is not exposed)",
        )
        p.set_defaults(target=None, conformance=False)
    p.add_argument("--host", help=f"interface to listen on {default(d.host)}")
    p.add_argument("--port", type=int, help=f"TCP port {default(d.port)}")
    p.add_argument("--path", help=f"MCP endpoint path {default(d.path)}")
    p.add_argument(
        "--public-url",
        metavar="URL",
        help="canonical server URI as clients see it, when behind a proxy (default: http://HOST:PORT/PATH)",
    )
    p.add_argument(
        "--store",
        help="memory | sqlite:PATH[?S=V&…] | redis://HOST:PORT[/DB][?S=V&…] | "
        "redis+sentinel://HOST:PORT[,HOST:PORT…]/SERVICE[/DB][?S=V&…] | "
        "redis+cluster://HOST:PORT[,HOST:PORT…][?S=V&…], settings in docs/stores.md "
        f"{default(d.store)}",
    )
    p.add_argument(
        "--issuer", help=f"'dev' for the embedded authorization server, or an issuer URL {default(d.issuer)}"
    )
    p.add_argument(
        "--auth", choices=["jwt", "none"], help="'none' disables auth: loopback conformance runs only (default: jwt)"
    )
    from .server.auth import PROFILES

    p.add_argument(
        "--token-profile",
        choices=list(PROFILES),
        help=f"how --issuer shapes its access tokens, docs/deploy.md {default(d.token_profile)}",
    )
    p.add_argument(
        "--dev-client",
        action="append",
        type=_dev_client,
        metavar="ID:SECRET",
        help="static confidential client of the embedded AS, repeatable (default: dev-client:dev-secret)",
    )
    p.add_argument(
        "--auto-approve",
        action="store_true",
        default=None,
        help="embedded AS: no consent page, codes issued at once (subject from login_hint); loopback hosts only "
        "(default: off)",
    )
    p.add_argument(
        "--force-dev-credentials",
        action="store_true",
        default=None,
        help="embedded AS: allow the published client dev-client:dev-secret on a non-loopback host (default: off)",
    )
    p.add_argument(
        "--least-privilege",
        action="store_true",
        default=None,
        help="embedded AS: every refresh narrows to the resources it asks for (default: off)",
    )
    p.add_argument(
        "--single-audience",
        action="store_true",
        default=None,
        help="embedded AS: refuse several resources per token (invalid_target), like oidc-provider (default: off)",
    )
    p.add_argument(
        "--token-ttl", type=int, metavar="SECONDS", help=f"embedded AS access token lifetime {default(d.token_ttl)}"
    )
    p.add_argument(
        "--dev-keys",
        metavar="PATH",
        help="embedded AS: private JWKS file (created if missing); give replicas the same one "
        "(default: a new key per process)",
    )
    p.add_argument(
        "--json-response",
        action="store_true",
        default=None,
        help="answer POSTs with JSON, not SSE (default: off)",
    )
    p.add_argument(
        "--retry-ms", type=int, metavar="MS", help=f"SSE retry: the client's reconnect delay {default(d.retry_ms)}"
    )
    p.add_argument(
        "--max-body-bytes",
        type=int,
        metavar="BYTES",
        help=f"largest request body accepted, bytes (413) {default(d.max_body_bytes)}",
    )
    p.add_argument(
        "--max-batch",
        type=int,
        metavar="N",
        help=f"most messages in one JSON-RPC batch, 2025-03-26 sessions (400 beyond) {default(d.max_batch)}",
    )
    p.add_argument(
        "--session-idle-seconds",
        type=float,
        metavar="SECONDS",
        help=f"a session unused this long expires {default(d.session_idle_seconds)}",
    )
    p.add_argument(
        "--allowed-origin",
        action="append",
        dest="allowed_origins",
        metavar="ORIGIN",
        help="an Origin accepted besides the server's own (and loopback ones on loopback), repeatable (default: none)",
    )
    p.add_argument("--log-level", choices=LOG_LEVELS, help=default(d.log_level))
    p.add_argument(
        "--drain-seconds",
        type=float,
        metavar="SECONDS",
        help="on SIGTERM, how long running calls and tasks may finish before they end as execution lost "
        f"{default(d.drain_seconds)}",
    )
    p.add_argument(
        "--metrics-token",
        metavar="SECRET",
        help="/metrics requires 'Authorization: Bearer SECRET' (default: none; the Host/Origin check always applies)",
    )
    p.add_argument(
        "--require-dpop",
        action="store_true",
        default=None,
        help="honour DPoP-bound tokens only, with a proof on every request (RFC 9449; default: bearer tokens too)",
    )
    p.add_argument(
        "--dpop-nonce",
        action="store_true",
        default=None,
        help="every DPoP proof must carry a current server nonce (DPoP-Nonce; default: off)",
    )
    for name, (kind, text) in LIMIT_FLAGS.items():
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=kind,
            dest=f"limit_{name}",
            metavar="SECONDS" if kind is float else "BYTES" if name.endswith("bytes") else "N",
            help=f"{text} {default(getattr(d.limits, name))}",
        )
    if command != "serve":
        return
    p.add_argument(
        "--conformance",
        action="store_true",
        help="serve the official conformance suite's fixtures instead of the demo tools (auth off, memory store, "
        "loopback only; default: off)",
    )


def _audit_parser(sub: Any) -> None:
    from .audit.command import add_arguments

    p = sub.add_parser("audit", help="probe any Streamable HTTP MCP server for lost or leaked tool results")
    add_arguments(p)


def _call_parser(sub: Any) -> None:
    from .client.command import add_arguments

    p = sub.add_parser("call", help="call one tool of an MCP server and print its one outcome")
    add_arguments(p)


def main(argv: list[str] | None = None) -> None:
    """The console script: a Ctrl-C at any point (its imports and parsers included) is one line and exit 130."""
    command = ""
    try:
        args = _parse(argv)
        command = args.command
        _run(args)
    except KeyboardInterrupt:  # a running server stops cleanly instead (LosslessServer.run): this is the rest
        print(f"mcp-lossless{' ' + command if command else ''}: interrupted", file=sys.stderr)
        sys.exit(INTERRUPTED)


class _Parser(argparse.ArgumentParser):
    """A bad flag is one line naming it (argparse would print the whole usage first: 24 lines for serve) and exit
    status 2, like every other usage error; its subcommands' parsers are of this class too."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {message} (see {self.prog} --help)\n")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = _Parser(
        prog="mcp-lossless",
        description="serve the lossless MCP server, put other MCP servers behind it (gateway), audit any MCP server "
        "for lost or leaked tool results, or call one tool",
    )
    parser.add_argument("--version", action="version", version=f"mcp-lossless {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _serve_parser(sub, "gateway")
    _audit_parser(sub)
    _call_parser(sub)
    args, extra = parser.parse_known_args(argv)
    if args.command == "call" and extra and not any(e.startswith("-") for e in extra):
        args.arguments += extra  # tool arguments after an option: `call URL fetch --timeout 5 url=…`
    elif extra:
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _run(args: argparse.Namespace) -> None:
    if args.command == "serve":
        from .serve import UsageError, serve

        try:
            sys.exit(serve(args))
        except UsageError as exc:
            print(f"mcp-lossless serve: {exc}", file=sys.stderr)
            sys.exit(2)
    if args.command == "gateway":
        from .gateway.command import run as gateway
        from .serve import UsageError

        try:
            sys.exit(gateway(args))
        except UsageError as exc:
            print(f"mcp-lossless gateway: {exc}", file=sys.stderr)
            sys.exit(2)
    if args.command == "audit":
        from .audit.command import run as audit

        sys.exit(audit(args))
    if args.command == "call":
        from .client.command import run as call

        sys.exit(call(args))
