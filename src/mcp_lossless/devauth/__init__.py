"""The embedded development OAuth authorization server (RFC 8414, 8707, 9068, PKCE)."""

from .keys import SigningKeys
from .server import DevAuthServer

__all__ = ["DevAuthServer", "SigningKeys"]
