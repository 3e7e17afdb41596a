"""The gateway's upstreams as data: parsed from the ``[[upstream]]`` tables of a TOML file, every mistake named.

    [[upstream]]
    name = "docs"
    url = "http://127.0.0.1:9001/mcp"               # Streamable HTTP
    auth = { bearer_env = "DOCS_TOKEN" }             # or { client_id = "…", secret_env = "…" }; default none
                                                     # or { exchange = { client_id = "…", secret_env = "…" } }
    [[upstream]]
    name = "everything"
    command = ["npx", "-y", "@modelcontextprotocol/server-everything"]   # stdio, spawned and supervised
    prefix = "ev_"                                   # exposed names: prefix + upstream tool (default "<name>_")
    allow = ["echo", "trigger-long-running-operation"]                  # or deny = [...]
    idempotent = ["echo"]                            # safe to re-issue when the answer is lost
    scopes = { echo = ["echo:run"], "*" = ["ev"] }   # OAuth scopes a client's token needs per tool ("*": all)
    prompts = { deny = ["secret"], scopes = ["ev:prompts"] }   # exposed prompts: ev_<prompt>; or false: none
    resources = { allow = ["file:///readme"] }       # exposed resources keep their URIs; or false: none

The credentials of an upstream are its own: a client's token never travels on (no token passthrough). With
``exchange`` the gateway trades each caller's token for one of the upstream's that names the caller (RFC 8693,
:mod:`.exchange`).
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..server.tools import scope_tokens

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
_KNOWN = frozenset(
    {
        "name",
        "url",
        "command",
        "env",
        "auth",
        "prefix",
        "allow",
        "deny",
        "idempotent",
        "timeout",
        "sessions",
        "max_restarts",
        "scopes",
        "era",
        "prompts",
        "resources",
        "relist_seconds",
    }
)


class GatewayConfigError(ValueError):
    """The gateway configuration is wrong; the message says where and how."""


@dataclass(frozen=True, slots=True)
class BearerFromEnv:
    """A static bearer token read from an environment variable of the gateway's process at start."""

    variable: str

    def token(self) -> str:
        value = os.environ.get(self.variable)
        if not value:
            raise GatewayConfigError(f"environment variable {self.variable} (an upstream's bearer token) is not set")
        return value


@dataclass(frozen=True, slots=True)
class ClientCredentialsFromEnv:
    """OAuth ``client_credentials`` against whatever authorization server the upstream names (RFC 9728)."""

    client_id: str
    secret_env: str | None = None
    scope: str | None = None

    def secret(self) -> str | None:
        if self.secret_env is None:
            return None
        value = os.environ.get(self.secret_env)
        if not value:
            raise GatewayConfigError(f"environment variable {self.secret_env} (an upstream's secret) is not set")
        return value


@dataclass(frozen=True, slots=True)
class TokenExchangeFromEnv:
    """RFC 8693 token exchange of each caller's token, by the gateway's client ``client_id`` at the upstream's
    authorization server (whose ``client_credentials`` tokens serve the requests without a caller); ``audience``
    is sent besides the upstream's ``resource`` to an AS that names its resources by logical names."""

    credentials: ClientCredentialsFromEnv
    audience: str | None = None


UpstreamAuth = BearerFromEnv | ClientCredentialsFromEnv | TokenExchangeFromEnv | None
Era = Literal["auto", "modern", "legacy"]
"""Which protocol era to speak to an upstream (HTTP or stdio): ``auto`` tries 2026-07-28 first and falls back to
the legacy handshake revisions."""
ERAS: tuple[Era, ...] = ("auto", "modern", "legacy")


@dataclass(frozen=True, slots=True)
class CatalogRule:
    """Which of an upstream's prompts (by name) or resources (by URI) are exposed, and what a token needs for them."""

    exposed: bool = True
    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()
    scopes: tuple[str, ...] | None = None
    """OAuth scopes a client's token must hold to get or read any of them; ``None``: the tools' ``"*"`` scopes."""

    def exposes(self, key: str) -> bool:
        return self.exposed and (self.allow is None or key in self.allow) and key not in self.deny


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    name: str
    url: str | None = None
    command: tuple[str, ...] | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    """Extra environment of a stdio child (the gateway's own environment is not passed on beyond PATH and HOME)."""
    auth: UpstreamAuth = None
    prefix: str | None = None
    allow: frozenset[str] | None = None
    deny: frozenset[str] = frozenset()
    idempotent: frozenset[str] = frozenset()
    """Upstream tools that may be re-issued under a new id when their answer is lost (besides annotated ones)."""
    timeout: float = 60.0
    """Each call's deadline upstream, seconds: an upstream that hangs ends the call with the deadline error."""
    sessions: int = 4
    """HTTP: sessions kept with the upstream (calls go to the least busy one)."""
    max_restarts: int = 5
    """A stdio child that keeps dying is given up after this many restarts in a row without a successful call."""
    scopes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """OAuth scopes a client's token must hold per upstream tool name (``"*"``: every tool of the upstream)."""
    era: Era = "auto"
    prompts: CatalogRule = CatalogRule()
    resources: CatalogRule = CatalogRule()
    relist_seconds: float = 30.0
    """HTTP: how often the tools of an upstream that announces no list changes are listed again (a tool it gained
    after a restart appears, its configuration is checked again, and the listing probes that it is up)."""

    @property
    def exposed_prefix(self) -> str:
        return f"{self.name}_" if self.prefix is None else self.prefix

    def exposes(self, tool: str) -> bool:
        return (self.allow is None or tool in self.allow) and tool not in self.deny

    def scopes_of(self, tool: str) -> tuple[str, ...]:
        """What a token must hold to call ``tool`` here (and to receive its events): its own and the ``"*"`` ones."""
        return tuple(sorted({*self.scopes.get("*", ()), *self.scopes.get(tool, ())}))

    def catalog_scopes(self, rule: CatalogRule) -> tuple[str, ...]:
        """What a token must hold for this upstream's prompts or resources: the rule's scopes, else the ``"*"`` ones
        (an operator who guarded every tool of an upstream has not opened its prompts and resources wider)."""
        return rule.scopes if rule.scopes is not None else tuple(self.scopes.get("*", ()))

    def require_executable(self) -> None:
        """A stdio upstream's command must be where its child will look (its PATH): a typo would otherwise be
        started again with backoff for as long as the gateway runs, every call failing as unreachable."""
        if self.command is None:
            return
        if shutil.which(self.command[0], path=self.env.get("PATH", os.environ.get("PATH"))) is None:
            raise GatewayConfigError(
                f"upstream {self.name!r}: command {self.command[0]!r} is not an executable on PATH"
            )


def _strings(where: str, key: str, value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise GatewayConfigError(f"{where}: {key} must be a list of non-empty strings")
    return tuple(value)


def _auth(where: str, value: object) -> UpstreamAuth:
    if value is None or value == "none":
        return None
    if not isinstance(value, dict):
        raise GatewayConfigError(f'{where}: auth must be "none", {{ bearer_env = "VAR" }} or {{ client_id = "…" }}')
    if set(value) == {"bearer_env"} and isinstance(value["bearer_env"], str) and value["bearer_env"]:
        return BearerFromEnv(value["bearer_env"])
    if set(value) == {"exchange"}:
        exchange = value["exchange"]
        if not isinstance(exchange, dict) or "client_id" not in exchange:
            raise GatewayConfigError(
                f"{where}: auth.exchange must be a table with client_id (and secret_env, audience)"
            )
        unknown = set(exchange) - {"client_id", "secret_env", "audience"}
        if unknown or not all(isinstance(v, str) and v for v in exchange.values()):
            raise GatewayConfigError(
                f"{where}: auth.exchange takes non-empty strings client_id, secret_env and audience"
                + (f" (unknown: {', '.join(sorted(unknown))})" if unknown else "")
            )
        credentials = ClientCredentialsFromEnv(exchange["client_id"], exchange.get("secret_env"))
        return TokenExchangeFromEnv(credentials, exchange.get("audience"))
    if "client_id" in value and set(value) <= {"client_id", "secret_env", "scope"}:
        if not all(isinstance(v, str) and v for v in value.values()):
            raise GatewayConfigError(f"{where}: auth values must be non-empty strings")
        return ClientCredentialsFromEnv(value["client_id"], value.get("secret_env"), value.get("scope"))
    raise GatewayConfigError(
        f"{where}: auth has unknown keys {sorted(value)}; use bearer_env, client_id + secret_env, or exchange"
    )


def _catalog_rule(where: str, key: str, value: object) -> CatalogRule:
    if value is False:
        return CatalogRule(exposed=False)
    if not isinstance(value, dict) or not set(value) <= {"allow", "deny", "scopes"}:
        raise GatewayConfigError(f"{where}: {key} must be false or a table of allow, deny and scopes lists")
    scopes = None
    if "scopes" in value:
        try:
            scopes = scope_tokens(f"{where}: {key}.scopes", _strings(where, f"{key}.scopes", value["scopes"]))
        except ValueError as exc:
            raise GatewayConfigError(str(exc)) from None
    return CatalogRule(
        allow=frozenset(_strings(where, f"{key}.allow", value["allow"])) if "allow" in value else None,
        deny=frozenset(_strings(where, f"{key}.deny", value.get("deny", []))),
        scopes=scopes,
    )


def _meant(key: str) -> str:
    """The upstream key an unknown one probably meant, as the server's settings name theirs: a typo of ``name``
    or ``timeout`` is otherwise read as a key the operator never wrote."""
    close = difflib.get_close_matches(key, sorted(_KNOWN), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def parse_upstream(raw: Mapping[str, Any], index: int = 0) -> UpstreamConfig:
    where = f"upstream #{index + 1}"
    if not isinstance(raw, Mapping):
        raise GatewayConfigError(f"{where} must be a table")
    unknown = set(raw) - _KNOWN
    if unknown:
        named = ", ".join(key + _meant(key) for key in sorted(unknown))
        raise GatewayConfigError(f"{where}: unknown keys {named}")
    name = raw.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise GatewayConfigError(f"{where}: name must be 1-64 letters, digits, '_', '.', '-' (got {name!r})")
    where = f"upstream {name!r}"
    url, command = raw.get("url"), raw.get("command")
    if (url is None) == (command is None):
        raise GatewayConfigError(f"{where}: give exactly one of url (Streamable HTTP) or command (stdio)")
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise GatewayConfigError(f"{where}: url must be an http(s) URL")
    argv = _strings(where, "command", command) if command is not None else None
    if argv is not None and not argv:
        raise GatewayConfigError(f"{where}: command must not be empty")
    env = raw.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise GatewayConfigError(f"{where}: env must be a table of strings")
    prefix = raw.get("prefix")
    if prefix is not None and (not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z0-9_.-]*", prefix)):
        raise GatewayConfigError(f"{where}: prefix may hold letters, digits, '_', '.', '-' only")
    allow = frozenset(_strings(where, "allow", raw["allow"])) if "allow" in raw else None
    deny = frozenset(_strings(where, "deny", raw.get("deny", [])))
    timeout = raw.get("timeout", 60.0)
    if not isinstance(timeout, int | float) or isinstance(timeout, bool) or not 0 < timeout <= 86400:
        raise GatewayConfigError(f"{where}: timeout must be a number of seconds in (0, 86400]")
    sessions = raw.get("sessions", 4)
    if not isinstance(sessions, int) or isinstance(sessions, bool) or not 1 <= sessions <= 64:
        raise GatewayConfigError(f"{where}: sessions must be an integer in [1, 64]")
    restarts = raw.get("max_restarts", 5)
    if not isinstance(restarts, int) or isinstance(restarts, bool) or restarts < 0:
        raise GatewayConfigError(f"{where}: max_restarts must be a non-negative integer")
    scopes = raw.get("scopes", {})
    if not isinstance(scopes, dict):
        raise GatewayConfigError(f'{where}: scopes must be a table of tool name = ["scope", ...] ("*": every tool)')
    required: dict[str, tuple[str, ...]] = {}
    for tool, listed in scopes.items():
        try:
            required[tool] = scope_tokens(f"{where}: scopes.{tool}", _strings(where, f"scopes.{tool}", listed))
        except ValueError as exc:
            raise GatewayConfigError(str(exc)) from None
    relist = raw.get("relist_seconds", 30.0)
    if not isinstance(relist, int | float) or isinstance(relist, bool) or not 1 <= relist <= 86400:
        raise GatewayConfigError(f"{where}: relist_seconds must be a number of seconds in [1, 86400]")
    era = raw.get("era", "auto")
    if era not in ERAS:
        raise GatewayConfigError(f"{where}: era must be one of {', '.join(ERAS)} (got {era!r})")
    auth = _auth(where, raw.get("auth"))
    if isinstance(auth, TokenExchangeFromEnv) and (era == "legacy" or url is None):
        raise GatewayConfigError(
            f"{where}: auth.exchange needs a 2026-07-28 HTTP upstream (a legacy session is bound to the principal "
            "that opened it, and one session serves every caller)"
        )
    return UpstreamConfig(
        name=name,
        url=url,
        command=argv,
        env=dict(env),
        auth=auth,
        prefix=prefix,
        allow=allow,
        deny=deny,
        idempotent=frozenset(_strings(where, "idempotent", raw.get("idempotent", []))),
        timeout=float(timeout),
        sessions=sessions,
        max_restarts=restarts,
        scopes=required,
        era=era,
        prompts=_catalog_rule(where, "prompts", raw.get("prompts", {})),
        resources=_catalog_rule(where, "resources", raw.get("resources", {})),
        relist_seconds=float(relist),
    )


def parse_upstreams(raw: object) -> tuple[UpstreamConfig, ...]:
    """The ``upstream`` array of tables; names and prefixes must keep exposed names apart."""
    if isinstance(raw, dict):  # a single [upstream] table: TOML's array of tables needs the double brackets
        raise GatewayConfigError("upstream is a table: write each upstream as [[upstream]], not [upstream]")
    if not isinstance(raw, list) or not raw:
        raise GatewayConfigError("the gateway needs at least one [[upstream]] table")
    upstreams = tuple(parse_upstream(entry, i) for i, entry in enumerate(raw))
    names = [u.name for u in upstreams]
    if len(set(names)) != len(names):
        raise GatewayConfigError(f"upstream names must be unique: {names}")
    return upstreams
