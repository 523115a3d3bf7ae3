"""One module per benchmark section, each with TITLE and run(frameworks, quick) -> Section."""

SECTIONS = ["waste", "false_stops", "overhead", "stream", "concurrency", "report_pages", "integrations", "batch", "mcp", "proxy",
            "replicas"]
