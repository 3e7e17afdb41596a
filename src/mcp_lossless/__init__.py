"""mcp-lossless: an MCP Streamable HTTP server and client that never silently loses or leaks a tool result."""

__version__ = "0.1.0"
