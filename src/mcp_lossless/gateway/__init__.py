"""``mcp-lossless gateway``: any MCP server (Streamable HTTP or stdio) behind the lossless server's guarantees."""

from .config import (
    BearerFromEnv,
    CatalogRule,
    ClientCredentialsFromEnv,
    GatewayConfigError,
    UpstreamConfig,
    parse_upstreams,
)
from .gateway import Gateway, create_gateway

__all__ = [
    "BearerFromEnv",
    "CatalogRule",
    "ClientCredentialsFromEnv",
    "Gateway",
    "GatewayConfigError",
    "UpstreamConfig",
    "create_gateway",
    "parse_upstreams",
]
