from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("notes")
NOTES = {"todo": "buy milk", "ideas": "a fence for loops"}


@server.tool(annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False))
def read_note(topic: str) -> str:
    """Read the note on a topic."""
    return NOTES.get(topic, f"no note on {topic!r}")


if __name__ == "__main__":
    server.run()  # stdio
