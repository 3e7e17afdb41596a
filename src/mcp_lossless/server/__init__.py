"""The lossless MCP server: build with :func:`create_app`, declare tools with :class:`ToolRegistry`."""

from ..core.protocol import RESOURCE_META_KEY
from .app import LosslessApp, create_app
from .config import ServerConfig
from .tools import MethodError, MethodHandler, ToolContext, ToolError, ToolRegistry

__all__ = [
    "RESOURCE_META_KEY",
    "LosslessApp",
    "MethodError",
    "MethodHandler",
    "ServerConfig",
    "ToolContext",
    "ToolError",
    "ToolRegistry",
    "create_app",
]
