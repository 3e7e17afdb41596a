"""``auth = { exchange = { ... } }``: parsed, and every mistake (including an era it cannot serve) named."""

from __future__ import annotations

import pytest

from mcp_lossless.gateway.config import (
    ClientCredentialsFromEnv,
    GatewayConfigError,
    TokenExchangeFromEnv,
    parse_upstream,
)


def test_an_exchanging_upstream_parses() -> None:
    exchange = {"client_id": "gateway", "secret_env": "GW_SECRET", "audience": "api://notes"}
    config = parse_upstream({"name": "notes", "url": "http://x/mcp", "auth": {"exchange": exchange}})
    assert config.auth == TokenExchangeFromEnv(ClientCredentialsFromEnv("gateway", "GW_SECRET"), "api://notes")
    bare = parse_upstream({"name": "notes", "url": "http://x/mcp", "auth": {"exchange": {"client_id": "gateway"}}})
    assert bare.auth == TokenExchangeFromEnv(ClientCredentialsFromEnv("gateway"))


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"url": "http://x", "auth": {"exchange": {}}}, "auth.exchange must be a table with client_id"),
        ({"url": "http://x", "auth": {"exchange": "gateway"}}, "auth.exchange must be a table with client_id"),
        ({"url": "http://x", "auth": {"exchange": {"client_id": "g", "scope": "x"}}}, "unknown: scope"),
        ({"url": "http://x", "auth": {"exchange": {"client_id": ""}}}, "non-empty strings"),
        ({"url": "http://x", "auth": {"exchange": {"client_id": "g"}, "bearer_env": "X"}}, "auth has unknown keys"),
        ({"url": "http://x", "era": "legacy", "auth": {"exchange": {"client_id": "g"}}}, "2026-07-28 HTTP upstream"),
        ({"command": ["x"], "auth": {"exchange": {"client_id": "g"}}}, "2026-07-28 HTTP upstream"),
    ],
)
def test_exchange_mistakes_are_named(raw: dict[str, object], problem: str) -> None:
    with pytest.raises(GatewayConfigError, match=problem):
        parse_upstream({"name": "notes", **raw})
