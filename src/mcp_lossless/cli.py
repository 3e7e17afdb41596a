"""``mcp-lossless``: ``serve`` the lossless MCP server, ``audit`` any MCP server (more commands join as they land)."""

from __future__ import annotations

import argparse
import sys
import tomllib
from dataclasses import fields
from typing import Any

from .server.config import ServerConfig


def _dev_client(value: str) -> tuple[str, str]:
    client_id, sep, secret = value.partition(":")
    if not sep or not client_id or not secret:
        raise argparse.ArgumentTypeError("expected ID:SECRET")
    return client_id, secret


def _serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the lossless MCP server (demo tools search and fetch)")
    p.add_argument("--config", help="TOML file with server settings (flags override it)")
    p.add_argument("--host")
    p.add_argument("--port", type=int)
    p.add_argument("--path", help="MCP endpoint path (default /mcp)")
    p.add_argument("--public-url", help="canonical server URI as clients see it, when behind a proxy")
    p.add_argument(
        "--store",
        help="memory | sqlite:PATH | redis://HOST:PORT[/DB][?prefix=P] (default sqlite:mcp-lossless.db)",
    )
    p.add_argument("--issuer", help="'dev' for the embedded authorization server (default) or an issuer URL")
    p.add_argument("--auth", choices=["jwt", "none"], help="'none' disables auth: loopback conformance runs only")
    p.add_argument(
        "--dev-client",
        action="append",
        type=_dev_client,
        metavar="ID:SECRET",
        help="static confidential client of the embedded AS (repeatable)",
    )
    p.add_argument(
        "--least-privilege",
        action="store_true",
        default=None,
        help="embedded AS: every refresh narrows to the resources it asks for",
    )
    p.add_argument(
        "--single-audience",
        action="store_true",
        default=None,
        help="embedded AS: refuse several resources per token (invalid_target), like oidc-provider",
    )
    p.add_argument("--token-ttl", type=int, help="embedded AS access token lifetime, seconds")
    p.add_argument(
        "--dev-keys",
        metavar="PATH",
        help="embedded AS: private JWKS file (created if missing); give replicas the same one",
    )
    p.add_argument("--json-response", action="store_true", default=None, help="answer POSTs with JSON, not SSE")
    p.add_argument("--retry-ms", type=int, help="SSE retry: the client's reconnect delay")
    p.add_argument("--max-body-bytes", type=int)
    p.add_argument("--session-idle-seconds", type=float)
    p.add_argument("--allowed-origin", action="append", dest="allowed_origins", metavar="ORIGIN")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--conformance",
        action="store_true",
        help="serve the official conformance suite's fixtures instead of the demo tools (auth off, memory store, "
        "loopback only)",
    )


def _audit_parser(sub: Any) -> None:
    from .audit.command import add_arguments

    p = sub.add_parser("audit", help="probe any Streamable HTTP MCP server for lost or leaked tool results")
    add_arguments(p)


def _call_parser(sub: Any) -> None:
    from .client.command import add_arguments

    p = sub.add_parser("call", help="call one tool of an MCP server and print its one outcome")
    add_arguments(p)


def build_config(args: argparse.Namespace) -> ServerConfig:
    settings: dict[str, Any] = {}
    if args.config:
        with open(args.config, "rb") as handle:
            settings.update(tomllib.load(handle))
    names = {f.name for f in fields(ServerConfig)}
    unknown = set(settings) - names
    if unknown:
        raise SystemExit(f"unknown settings in {args.config}: {', '.join(sorted(unknown))}")
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = value
    if args.dev_client:
        settings["dev_clients"] = dict(args.dev_client)
    if "allowed_origins" in settings:
        settings["allowed_origins"] = tuple(settings["allowed_origins"])
    if args.auth == "none" or args.conformance:
        settings["issuer"] = None  # the suite cannot send tokens
    if args.conformance:
        settings.setdefault("store", "memory")
    config = ServerConfig(**settings)
    if config.issuer is None and not config.loopback:
        what = "--conformance" if args.conformance else "--auth none"
        raise SystemExit(f"{what} is refused on a non-loopback host: it would serve tools to anyone")
    return config


def serve(args: argparse.Namespace) -> int:
    import uvicorn

    from .server.app import create_app
    from .server.conformance import conformance_app
    from .server.observability import configure_logging

    config = build_config(args)
    configure_logging(config.log_level)
    try:
        app = conformance_app(config) if args.conformance else create_app(config)
    except ValueError as exc:
        raise SystemExit(f"mcp-lossless: {exc}") from None
    print(f"mcp-lossless: MCP endpoint  {config.canonical_uri}", file=sys.stderr)
    print(f"mcp-lossless: metadata      {app.state.prm_url}", file=sys.stderr)
    if config.issuer == "dev":
        print(f"mcp-lossless: dev issuer    {config.dev_issuer}", file=sys.stderr)
        print(f"mcp-lossless: token URL     {config.dev_issuer}/token", file=sys.stderr)
        print(f"mcp-lossless: dev clients   {', '.join(config.dev_clients)}", file=sys.stderr)
    uvicorn.run(
        app,
        host=config.host,
        port=config.port,
        loop="uvloop",
        http="httptools",
        lifespan="on",
        proxy_headers=False,
        server_header=False,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=5,
    )
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="mcp-lossless", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _audit_parser(sub)
    _call_parser(sub)
    args = parser.parse_args(argv)
    if args.command == "serve":
        sys.exit(serve(args))
    if args.command == "audit":
        from .audit.command import run as audit

        sys.exit(audit(args))
    if args.command == "call":
        from .client.command import run as call

        sys.exit(call(args))
