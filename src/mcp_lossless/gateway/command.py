"""``mcp-lossless gateway --config gateway.toml``: the ``serve`` options, plus the file's ``[[upstream]]`` tables."""

from __future__ import annotations

import argparse
import tomllib


def run(args: argparse.Namespace) -> int:
    from ..serve import STARTUP_FAILURE, UsageError, build_config
    from ..server.observability import configure_logging
    from ..server.serving import lossless_server
    from ..tracing import configure_export
    from .config import GatewayConfigError, parse_upstreams
    from .gateway import create_gateway

    config = build_config(args, reserved=("upstream",))
    try:
        with open(args.config, "rb") as handle:  # build_config has read it: it exists and is TOML
            upstreams = parse_upstreams(tomllib.load(handle).get("upstream"))
        for upstream in upstreams:
            upstream.require_executable()
        gateway = create_gateway(config, upstreams, lenient_config=args.lenient_config)
    except (GatewayConfigError, ValueError) as exc:
        raise UsageError(f"{args.config}: {exc}") from None
    configure_logging(config.log_level)
    configure_export()
    banner = [
        f"mcp-lossless gateway: MCP endpoint  {config.canonical_uri}",
        f"mcp-lossless gateway: metadata      {gateway.state.prm_url}",
        *(
            f"mcp-lossless gateway: upstream      {upstream.name}: {upstream.url or ' '.join(upstream.command or ())}"
            for upstream in upstreams
        ),
    ]
    if config.issuer == "dev":  # what a client's OAuth settings ask for: the issuer (the Inspector's), the token URL
        clients = ", ".join(config.dev_clients)
        consent = (
            "auto-approved (--auto-approve)"
            if config.auto_approve
            else f"consent page at {config.dev_issuer}/authorize"
        )
        banner += [
            f"mcp-lossless gateway: dev issuer    {config.dev_issuer}",
            f"mcp-lossless gateway: token URL     {config.dev_issuer}/token",
            f"mcp-lossless gateway: dev clients   {clients} (confidential), dev-public (public, PKCE)",
            f"mcp-lossless gateway: authorization {consent}",
        ]
    elif config.issuer is not None:
        banner.append(f"mcp-lossless gateway: issuer        {config.issuer}")
    server = lossless_server(gateway.app, asgi=gateway, banner=banner)
    server.run()
    return 0 if server.started else STARTUP_FAILURE
