"""Server settings: one dataclass, filled from flags or a TOML file by the CLI."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import urlsplit

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


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
    dev_clients: dict[str, str] = field(default_factory=lambda: {"dev-client": "dev-secret"})
    least_privilege: bool = False
    single_audience: bool = False
    token_ttl: int = 600
    dev_keys: str | None = None
    """Private JWKS file of the embedded AS, created if missing: replicas given one file accept each other's tokens."""
    leeway_seconds: float = 30.0
    """Clock skew allowed on ``exp``/``nbf``, at verification and for tokens expiring mid-stream."""
    json_response: bool = False
    retry_ms: int = 1000
    max_body_bytes: int = 1024 * 1024
    max_batch: int = 1000
    """Most messages in one JSON-RPC batch (2025-03-26 sessions); a longer batch is refused at once with a 400
    that names this limit. Batches are handled in time linear in their length."""
    session_idle_seconds: float = 1800.0
    client_request_seconds: float = 60.0
    """Longest wait for a client's answer to a server request (sampling, elicitation)."""
    allowed_origins: tuple[str, ...] = ()
    log_level: str = "info"

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
