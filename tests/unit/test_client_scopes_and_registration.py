"""Scope selection and token endpoint authentication choices (pure: no HTTP)."""

from __future__ import annotations

import pytest

from mcp_lossless.client.registration import ClientRegistration, choose_auth_method
from mcp_lossless.client.scopes import ScopeSelection


def test_challenged_scopes_accumulate_over_the_configured_ones() -> None:
    scopes = ScopeSelection("mcp:read")
    scopes.advertised(["mcp:read", "mcp:admin"])
    scopes.challenged("mcp:basic")
    scopes.challenged("mcp:write mcp:basic")
    assert scopes.current() == "mcp:basic mcp:read mcp:write", "the union, never scopes_supported on top"


def test_scopes_supported_is_the_fallback_and_nothing_means_no_scope_parameter() -> None:
    scopes = ScopeSelection()
    assert scopes.current() is None
    scopes.advertised("mcp:read")  # not a list: ignored
    assert scopes.current() is None
    scopes.advertised(["mcp:read", 7, "", "mcp:basic"])
    assert scopes.current() == "mcp:basic mcp:read"
    scopes.challenged("mcp:write")
    assert scopes.current() == "mcp:write"


@pytest.mark.parametrize(
    ("supported", "has_secret", "expected"),
    [
        (None, True, "client_secret_basic"),  # RFC 8414's default when the field is absent
        (["client_secret_post", "client_secret_basic"], True, "client_secret_basic"),
        (["client_secret_post"], True, "client_secret_post"),
        (["none"], True, "none"),
        (["client_secret_basic"], False, "none"),
    ],
)
def test_token_endpoint_auth_method(supported: list[str] | None, has_secret: bool, expected: str) -> None:
    metadata = {} if supported is None else {"token_endpoint_auth_methods_supported": supported}
    assert choose_auth_method(metadata, has_secret) == expected


@pytest.mark.parametrize("url", ["http://example.com/client.json", "https://example.com", "https://example.com/"])
def test_client_metadata_document_urls_are_https_with_a_path(url: str) -> None:
    with pytest.raises(ValueError, match="https with a path"):
        ClientRegistration(metadata_url=url)
