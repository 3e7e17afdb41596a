"""RFC 8693's names, one home for the client that asks for a token exchange and the dev AS that answers it."""

from __future__ import annotations

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
"""The ``grant_type`` of a token exchange (RFC 8693 §2.1)."""
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
"""The token type of an OAuth access token, as ``subject_token_type``, ``requested_token_type`` and
``issued_token_type`` (RFC 8693 §3)."""
