"""The bench's MCP server (bench/sections/mcp.py): one trivial tool, `echo`, over stdio (the SDK's FastMCP,
`MCPServer` in mcp 2). Not in bench/sections: run as a script, its folder comes first on sys.path, and
bench/sections/mcp.py would shadow the SDK."""

from mcp.server.mcpserver import MCPServer

server = MCPServer("echo", log_level="WARNING")


@server.tool()
def echo(text: str) -> str:
    """Return the text."""
    return text


if __name__ == "__main__":
    server.run()
