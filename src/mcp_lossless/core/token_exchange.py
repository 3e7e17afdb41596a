"""RFC 8693's names (and SEP-990's token types), one home for the client that asks for a token exchange and the dev
AS that answers it."""

from __future__ import annotations

TOKEN_EXCHANGE = "urn:ietf:params:oauth:grant-type:token-exchange"
"""The ``grant_type`` of a token exchange (RFC 8693 §2.1)."""
ACCESS_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:access_token"
"""The token type of an OAuth access token, as ``subject_token_type``, ``requested_token_type`` and
``issued_token_type`` (RFC 8693 §3)."""
ID_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:id_token"
"""An OpenID Connect ID token as a ``subject_token`` (RFC 8693 §3): the user's, in SEP-990's exchange."""
ID_JAG_TOKEN_TYPE = "urn:ietf:params:oauth:token-type:id-jag"
"""An identity assertion authorization grant (SEP-990): what the enterprise IdP issues for one authorization
server and resource, then presented there as a ``jwt-bearer`` assertion."""
