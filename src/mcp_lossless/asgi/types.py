"""The ASGI shapes every module of this package and its users speak (type aliases only)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]
HeaderIndex = dict[bytes, bytes]
"""A request's headers by lowercase name (:func:`mcp_lossless.asgi.headers`)."""
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
