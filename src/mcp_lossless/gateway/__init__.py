"""``mcp-lossless gateway``: any MCP server (Streamable HTTP or stdio) behind the lossless server's guarantees."""

from .config import (
    BearerFromEnv,
    CatalogRule,
    ClientCredentialsFromEnv,
    GatewayConfigError,
    TokenExchangeFromEnv,
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
    "TokenExchangeFromEnv",
    "UpstreamConfig",
    "create_gateway",
    "parse_upstreams",
]
