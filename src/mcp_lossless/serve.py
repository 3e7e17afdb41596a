"""``mcp-lossless serve``: settings from ``--config`` and the flags, and the server they describe, run.

The command line's parser (``cli.py``) only parses and dispatches; what a parsed ``serve`` (and the
``gateway``, which takes the same options) does lives here, so that the gateway's command imports this module
and nothing imports the parser back.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .core.limits import Limits

if TYPE_CHECKING:
    from .server.config import ServerConfig

STARTUP_FAILURE = 3
"""Exit status when the server could not start listening (uvicorn's)."""


class UsageError(Exception):
    """Bad input on the command line or in the config file: reported in one line, exit status 2."""


def _read_config(path: str) -> dict[str, Any]:
    import tomllib

    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise UsageError(f"cannot read config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"{path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError as exc:  # TOML is UTF-8 text; tomllib decodes before it parses
        raise UsageError(f"{path} is not valid TOML: not UTF-8 text (byte {exc.start})") from None


def build_config(args: argparse.Namespace, reserved: tuple[str, ...] = ()) -> ServerConfig:
    """Settings from ``--config`` and the flags; the file's ``reserved`` keys are the caller's (the gateway's)."""
    from .server.config import DEFAULT_DEV_CLIENTS, ConfigError, ServerConfig, config_from

    settings: dict[str, Any] = _read_config(args.config) if args.config else {}
    for key in reserved:
        settings.pop(key, None)
    if "upstream" in settings:  # reserved by the gateway, popped above
        raise UsageError(f"{args.config}: [[upstream]] tables are for mcp-lossless gateway --config, not serve")
    if settings:
        try:
            config_from(settings)  # the file alone first, so that a bad value is blamed on it
        except ConfigError as exc:
            raise UsageError(f"{args.config}: {exc}") from None
    for name in ServerConfig.__dataclass_fields__:
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = value
    limits = {
        name: getattr(args, f"limit_{name}")
        for name in Limits.__dataclass_fields__
        if getattr(args, f"limit_{name}") is not None
    }
    if limits:
        table = settings.get("limits")
        settings["limits"] = {**(table if isinstance(table, dict) else {}), **limits}
    if args.dev_client:
        settings["dev_clients"] = dict(args.dev_client)
    if args.auth == "none" or args.conformance:
        settings["issuer"] = None  # the suite cannot send tokens
    if args.conformance:
        settings.setdefault("store", "memory")
    try:
        config = config_from(settings)
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    if config.issuer is None and not config.loopback:
        what = "--conformance" if args.conformance else "--auth none"
        raise UsageError(f"{what} is refused on a non-loopback host: it would serve tools to anyone")
    if config.issuer == "dev" and not config.loopback:
        if config.auto_approve:
            raise UsageError(
                "--auto-approve is refused on a non-loopback host: anyone could mint tokens for any subject"
            )
        if config.dev_clients == DEFAULT_DEV_CLIENTS and not config.force_dev_credentials:
            raise UsageError(
                "the default dev client dev-client:dev-secret is public: on a non-loopback host give "
                "--dev-client ID:SECRET (or --force-dev-credentials)"
            )
    return config


def serve(args: argparse.Namespace) -> int:
    from .conformance_fixtures import conformance_app
    from .server.app import create_app
    from .server.observability import configure_logging
    from .server.serving import freeze_startup_heap, lossless_server
    from .server.targets import TargetError, load_registry
    from .tracing import configure_export

    config = build_config(args)
    if args.target is not None and args.conformance:
        raise UsageError("--conformance serves its own fixtures: give no TARGET")
    configure_logging(config.log_level)
    configure_export()
    try:
        tools = None if args.target is None else load_registry(args.target)
    except TargetError as exc:
        raise UsageError(f"TARGET: {exc}") from None
    try:
        app = conformance_app(config) if args.conformance else create_app(config, tools)
    except ValueError as exc:  # a setting only the app can judge (the store's spec): a bad flag like the others
        raise UsageError(str(exc)) from None
    banner = [f"mcp-lossless: MCP endpoint  {config.canonical_uri}", f"mcp-lossless: metadata      {app.state.prm_url}"]
    if config.issuer == "dev":
        consent = (
            "auto-approved (--auto-approve)"
            if config.auto_approve
            else f"consent page at {config.dev_issuer}/authorize"
        )
        banner += [
            f"mcp-lossless: dev issuer    {config.dev_issuer}",
            f"mcp-lossless: token URL     {config.dev_issuer}/token",
            f"mcp-lossless: dev clients   {', '.join(config.dev_clients)} (confidential), dev-public (public, PKCE)",
            f"mcp-lossless: registration  {config.dev_issuer}/register (RFC 7591) and client ID metadata documents",
            f"mcp-lossless: authorization {consent}",
        ]
    server = lossless_server(app, banner=banner)
    freeze_startup_heap()
    server.run()
    return 0 if server.started else STARTUP_FAILURE
