"""Tools from Model Context Protocol servers, under the same fence (`loopfence[mcp]`).

    from loopfence.mcp import McpServer, mcp_tools
    with mcp_tools("python server.py", McpServer.http(url, headers={"Authorization": "Bearer ..."}),
                   trust_annotations=["notes"], kinds={"search": "read_only"}) as tools:
        result = run(task, model=model, tools=tools, header=tools.header())

Every rule applies: budgets, canonical keys bound to each tool's inputSchema (checked before
anything is sent, in full by jsonschema for any keyword beyond the subset tools/_jsonschema knows), the read-only cache, the untrusted-content gate
(an untrusted server's tools are privileged and their output untrusted), `tool_timeout_s` (the call
is cancelled and the server told), the log. Importing this package does not import the SDK.
"""

from ._content import McpText
from ._flags import McpUsageError, add_flags, open_from_args, tools_from_args, tools_from_flags
from ._host import McpServerError
from ._kinds import classify
from ._spec import McpServer
from ._tools import McpTools, McpUnavailable, mcp_tools

__all__ = ["McpServer", "McpServerError", "McpText", "McpTools", "McpUnavailable", "McpUsageError", "add_flags",
           "classify", "mcp_tools", "open_from_args", "tools_from_args", "tools_from_flags"]
