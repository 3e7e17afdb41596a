"""The embedded development OAuth authorization server (RFC 8414, 8707, 8693, 9068, PKCE)."""

from .exchange import ExchangeRule
from .keys import SigningKeys
from .server import DevAuthServer

__all__ = ["DevAuthServer", "ExchangeRule", "SigningKeys"]
