"""Server settings: one dataclass, filled from flags or a TOML file by the CLI, each value checked against its type.

A bad value is named with its key (``port = "x": expected an integer``), never found later as a failure of
whatever first used it.
"""

from __future__ import annotations

import difflib
import json
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Union, get_args, get_origin, get_type_hints
from urllib.parse import urlsplit

from ..core.dpop import PROOF_ALGORITHMS as DPOP_ALGORITHMS
from ..core.limits import Limits

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})
DEFAULT_DEV_CLIENTS = {"dev-client": "dev-secret"}
"""Printed in the README: a credential only for a server nobody else can reach."""
LOG_LEVELS = ("debug", "info", "warning", "error")


class ConfigError(ValueError):
    """A setting of the wrong type or out of range; the message names the key and the value."""


@dataclass(slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    path: str = "/mcp"
    public_url: str | None = None
    """Canonical server URI as clients see it (behind a proxy); default ``http://host:port/path``."""
    store: str = "sqlite:mcp-lossless.db"
    issuer: str | None = "dev"
    """``dev`` (embedded authorization server), an issuer URL, or ``None`` for ``--auth none``."""
    dev_clients: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_DEV_CLIENTS))
    auto_approve: bool = False
    """Embedded AS: issue codes without the consent page (loopback hosts only)."""
    force_dev_credentials: bool = False
    """Embedded AS: accept the published default client ``dev-client:dev-secret`` on a non-loopback host."""
    least_privilege: bool = False
    single_audience: bool = False
    token_ttl: int = 600
    dev_keys: str | None = None
    """Private JWKS file of the embedded AS, created if missing: replicas given one file accept each other's tokens."""
    token_profile: str = "rfc9068"
    """How the issuer shapes its access tokens: rfc9068 (oidc-provider, Auth0's RFC 9068 dialect), keycloak,
    auth0, entra or okta (``mcp_lossless.server.auth.PROFILES``; docs/deploy.md)."""
    token_audience: str | None = None
    """An ``aud`` value the issuer puts in tokens for this server when it is not the canonical URI (Entra's
    ``api://…`` or application id, a Keycloak client id): it counts as naming the canonical URI."""
    introspection_endpoint: str | None = None
    """RFC 7662 endpoint for opaque (non-JWT) tokens; JWTs are still verified locally."""
    introspection_client_id: str | None = None
    introspection_client_secret: str | None = None
    introspection_auth: str = "client_secret_basic"
    """How this server authenticates to the introspection endpoint: client_secret_basic or client_secret_post."""
    introspection_cache_seconds: float = 60.0
    """Longest an introspection answer is reused (never past the token's ``exp``): how late a revocation bites."""
    leeway_seconds: float = 30.0
    """Clock skew allowed on ``exp``/``nbf``, at verification and for tokens expiring mid-stream."""
    require_dpop: bool = False
    """Honour DPoP-bound tokens only (RFC 9449): a bearer token is refused, and the protected resource metadata
    says ``dpop_bound_access_tokens_required``. Bound tokens need their proof whatever this says."""
    dpop_nonce: bool = False
    """Every DPoP proof must carry a current server nonce (``DPoP-Nonce``, ``use_dpop_nonce``): a proof made
    ahead of time is useless. Nonces come from the store's secret, so replicas sharing a store agree."""
    dpop_algorithms: tuple[str, ...] = ("ES256", "EdDSA", "PS256", "RS256")
    """The proof algorithms accepted (and advertised as ``algs`` and ``dpop_signing_alg_values_supported``)."""
    dpop_window_seconds: float = 60.0
    """How far a DPoP proof's ``iat`` may be from this server's clock, either way; also how long its ``jti`` is
    remembered."""
    json_response: bool = False
    retry_ms: int = 1000
    max_body_bytes: int = 1024 * 1024
    max_batch: int = 1000
    """Most messages in one JSON-RPC batch (2025-03-26 sessions); a longer batch is refused at once with a 400
    that names this limit. Batches are handled in time linear in their length."""
    session_idle_seconds: float = 1800.0
    client_request_seconds: float = 60.0
    """Longest wait for a client's answer to a server request (sampling, elicitation)."""
    idempotency_seconds: float = 86400.0
    """How long an idempotency key (SEP-3182) and the stream holding its outcome are kept after its first use
    (Stripe's 24 h): a repeat within it is answered from the record, never run again (ADR 0029)."""
    allowed_origins: tuple[str, ...] = ()
    log_level: str = "info"
    drain_seconds: float = 30.0
    """SIGTERM: how long running calls and tasks are given to finish once the server stops accepting connections;
    what is still running then ends as execution lost (each client still gets its one outcome), then it exits."""
    metrics_token: str | None = None
    """Bearer secret ``/metrics`` requires besides the Host/Origin check of the MCP endpoint (none by default)."""
    limits: Limits = field(default_factory=Limits)
    """Every per-connection, per-principal and per-session limit (docs/limits.md); the ``[limits]`` table of a
    config file."""

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise ConfigError(f"port = {self.port}: must be between 1 and 65535")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError(f"log_level = {_shown(self.log_level)}: must be one of {', '.join(LOG_LEVELS)}")
        for name in (
            "token_ttl",
            "max_body_bytes",
            "max_batch",
            "session_idle_seconds",
            "client_request_seconds",
            "dpop_window_seconds",
            "idempotency_seconds",
        ):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} = {getattr(self, name)}: must be positive")
        for name in ("retry_ms", "leeway_seconds", "drain_seconds"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} = {getattr(self, name)}: must not be negative")
        unsupported = sorted(set(self.dpop_algorithms) - DPOP_ALGORITHMS)
        if unsupported or not self.dpop_algorithms:
            allowed = ", ".join(sorted(DPOP_ALGORITHMS))
            raise ConfigError(f"dpop_algorithms = {list(self.dpop_algorithms)}: each must be one of {allowed}")
        if not self.path.startswith("/"):
            raise ConfigError(f"path = {_shown(self.path)}: must start with /")
        if self.issuer not in (None, "dev") and not _http_url(self.issuer):
            raise ConfigError(f'issuer = {_shown(self.issuer)}: must be "dev" or an http(s) URL')
        if self.public_url is not None and not _http_url(self.public_url):
            raise ConfigError(f"public_url = {_shown(self.public_url)}: must be an absolute http(s) URL")

    @property
    def canonical_uri(self) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"http://{host}:{self.port}{self.path}"

    @property
    def base_url(self) -> str:
        parts = urlsplit(self.canonical_uri)
        return f"{parts.scheme}://{parts.netloc}"

    @property
    def dev_issuer(self) -> str:
        return f"{self.base_url}/dev-as"

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS


def config_from(settings: Mapping[str, Any]) -> ServerConfig:
    """A :class:`ServerConfig` from loosely typed settings (a parsed TOML file merged with flags): every key must be
    a setting, every value of its setting's type (an integer where a number is asked is fine); ``limits`` is a
    table of :class:`~mcp_lossless.core.limits.Limits` fields."""
    values = {name: _typed(name, value, _HINTS[name]) for name, value in _known(settings, _HINTS, "").items()}
    if isinstance(values.get("limits"), dict):
        table = _known(values["limits"], _LIMIT_HINTS, "limits.")
        values["limits"] = _limits({k: _typed(f"limits.{k}", v, _LIMIT_HINTS[k]) for k, v in table.items()})
    return ServerConfig(**values)


def _known(settings: Mapping[str, Any], hints: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    unknown = sorted(set(settings) - set(hints))
    if unknown:
        named = ", ".join(prefix + k + _meant(k, hints, prefix) for k in unknown)
        raise ConfigError(f"unknown setting{'s' if len(unknown) > 1 else ''}: {named}")
    return settings


def _meant(name: str, hints: Mapping[str, Any], prefix: str) -> str:
    """What an unknown setting probably meant: a limit outside ``[limits]`` (or a setting inside it), else the
    closest name; a typo in a setting that has a default is otherwise easy to miss until it matters."""
    if not prefix and name in _LIMIT_HINTS:
        return " (a limit: put it under [limits])"
    if prefix and name in _HINTS:
        return " (not a limit: put it before [limits])"
    close = difflib.get_close_matches(name, list(hints), n=1)
    return f" (did you mean {prefix}{close[0]}?)" if close else ""


def _limits(values: dict[str, Any]) -> Limits:
    try:
        return Limits(**values)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


_EXPECTED = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


def _typed(name: str, value: Any, hint: Any) -> Any:
    """``value`` as setting ``name`` of type ``hint``, or :class:`ConfigError` naming both."""
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType):
        if value is None:
            return None
        (hint,) = [a for a in args if a is not type(None)]
        origin, args = get_origin(hint), get_args(hint)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint in _EXPECTED:
        if isinstance(value, hint) and (hint is bool or not isinstance(value, bool)):
            return value
        raise ConfigError(f"{name} = {_shown(value)}: expected {_EXPECTED[hint]}")
    if origin is tuple:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return tuple(value)
        raise ConfigError(f"{name} = {_shown(value)}: expected a list of strings")
    if origin is dict:
        if isinstance(value, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            return dict(value)
        raise ConfigError(f"{name} = {_shown(value)}: expected a table of strings")
    if hint is Limits:
        if isinstance(value, (Limits, dict)):
            return value  # a table's own keys are checked by the caller
        raise ConfigError(f"{name} = {_shown(value)}: expected a table")
    raise TypeError(f"setting {name} has a type this loader does not know: {hint}")


def _http_url(value: str) -> bool:
    """Whether ``value`` is an absolute http(s) URL with a host: what a discovery request or a client can reach."""
    parts = urlsplit(value)
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _shown(value: Any) -> str:
    """A value as a TOML file would spell it."""
    try:
        return json.dumps(value)
    except TypeError:
        return repr(value)


_HINTS = get_type_hints(ServerConfig)
_LIMIT_HINTS = get_type_hints(Limits)
