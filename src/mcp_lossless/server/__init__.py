"""The lossless MCP server: build with :func:`create_app`, declare tools with :class:`ToolRegistry`."""

from ..core.protocol import RESOURCE_META_KEY
from .app import LosslessApp, create_app
from .auth import TokenVerifier
from .config import ServerConfig
from .tools import Channel, MethodError, MethodHandler, ToolContext, ToolError, ToolRegistry

__all__ = [
    "RESOURCE_META_KEY",
    "Channel",
    "LosslessApp",
    "MethodError",
    "MethodHandler",
    "ServerConfig",
    "TokenVerifier",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "create_app",
]
