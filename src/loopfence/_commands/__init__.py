"""CLI subcommands: one module each, with `add_parser(subparsers)` and `main(args) -> int`."""

__all__ = ["COMMANDS"]

COMMANDS = ["run", "batch", "drill", "fake_server", "proxy", "replay", "reconcile", "resume", "export", "report",
            "schema"]  # module names under loopfence._commands, in help order
