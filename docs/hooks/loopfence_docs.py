"""MkDocs hook (mkdocs.yml `hooks:`): the parts of the site that come from the code, made at build time.

Markers in a page, each on a line of its own, replaced by a code block:

  <!-- loopfence-help: COMMAND -->   `loopfence COMMAND --help` (no COMMAND: `loopfence --help`)
  <!-- loopfence-schema: events -->  `loopfence schema events` (the JSON Schema of a log line)
  <!-- loopfence-example-log -->     the log of a small scripted run, made now

And coverage checks, so a page cannot fall behind the code (the build fails, also under `mkdocs
build --strict` in the test suite): cli.md has a help marker for every command, fake-server.md a
table row for every fault, log-format.md a section for every event kind naming each of its fields.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

# a marker is a line of its own (one mentioned inside a sentence or a code span is left alone)
HELP = re.compile(r"^[ \t]*<!--\s*loopfence-help(?::\s*([a-z-]+))?\s*-->[ \t]*$", re.MULTILINE)
SCHEMA = re.compile(r"^[ \t]*<!--\s*loopfence-schema:\s*([a-z]+)\s*-->[ \t]*$", re.MULTILINE)
EXAMPLE_LOG = re.compile(r"^[ \t]*<!--\s*loopfence-example-log\s*-->[ \t]*$", re.MULTILINE)
WIDTH = "100"  # argparse wraps --help to $COLUMNS: the same text on every machine


def commands() -> list[str]:
    from loopfence._commands import COMMANDS

    return [name.replace("_", "-") for name in COMMANDS]


def help_text(command: str | None) -> str:
    from loopfence.cli import cli

    argv = [command, "--help"] if command else ["--help"]
    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            code = cli(argv)
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    if code != 0 or not out.getvalue().strip():
        raise PluginError(f"`loopfence {' '.join(argv)}` exited {code} with no help text")
    return out.getvalue().rstrip()


def schema_text(what: str) -> str:
    from loopfence._commands.schema import SCHEMAS
    from loopfence._json import dumps

    if what not in SCHEMAS:
        raise PluginError(f"loopfence-schema: unknown schema {what!r} (known: {', '.join(SCHEMAS)})")
    return dumps(SCHEMAS[what](), indent=2)


def example_log() -> str:
    """The log of the run that docs/log-format.md describes, written by the current code."""
    from loopfence import ScriptedModel, run, tool
    from loopfence.testing import calls_reply, text_reply, tool_call

    @tool(kind="read_only")
    def weather(city: str) -> str:
        """Today's weather in a city."""
        return f"{city}: 18 C, light rain"

    model = ScriptedModel([calls_reply(tool_call("weather", city="Oslo"), usage=(120, 12)),
                           text_reply("Rain in Oslo: take an umbrella.", usage=(160, 9))])
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run.jsonl"
        result = run("Do I need an umbrella in Oslo?", model=model, tools=[weather], log=path)
        if str(result.verdict) != "SHIP":
            raise PluginError(f"the example run for the log page ended {result.stop}")
        return path.read_text(encoding="utf-8").rstrip()


def fence(lang: str, text: str) -> str:
    ticks = "````" if "```" in text else "```"
    return f"{ticks}{lang}\n{text}\n{ticks}"


# -- coverage: every name the code has, on the page that documents it -------------------------------
def _faults() -> list[str]:
    from loopfence.testing import FAULTS

    return list(FAULTS)


def _missing_events(markdown: str) -> list[str]:
    """Every event kind has a `### `kind`` section, and it names each field of that kind's model."""
    import typing

    from loopfence._log._schema import EVENT_KINDS, LogEvent

    sections = dict(re.findall(r"^###\s+`([a-z_]+)`\s*\n(.*?)(?=^#{1,3}\s|\Z)", markdown, re.MULTILINE | re.DOTALL))
    missing = [kind for kind in EVENT_KINDS if kind not in sections]
    for model in LogEvent.__subclasses__():
        (kind,) = typing.get_args(model.model_fields["event"].annotation)
        common = set(LogEvent.model_fields)
        missing += [f"{kind}.{name}" for name in model.model_fields
                    if name not in common and kind in sections and f"`{name}`" not in sections[kind]]
    return missing


def _missing_help(markdown: str) -> list[str]:
    have = {m.group(1) for m in HELP.finditer(markdown)}
    return [c for c in commands() if c not in have]


def _missing(pattern: str, names: list[str], markdown: str) -> list[str]:
    return [n for n in names if not re.search(pattern.format(re.escape(n)), markdown, re.MULTILINE)]


COVERAGE: dict[str, tuple[str, Any]] = {
    "cli.md": ("a `<!-- loopfence-help: NAME -->` for command", _missing_help),
    "fake-server.md": ("a table row `| `NAME` |` for fault",
                       lambda md: _missing(r"^\|\s*`{}`\s*\|", _faults(), md)),
    "log-format.md": ("a `### `KIND`` section naming every field, for", _missing_events),
}


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    src = page.file.src_uri
    if src in COVERAGE:
        what, check = COVERAGE[src]
        missing = check(markdown)
        if missing:
            raise PluginError(f"docs/{src} lacks {what}: {', '.join(missing)}")
    markdown = HELP.sub(lambda m: fence("text", help_text(m.group(1))), markdown)
    markdown = SCHEMA.sub(lambda m: fence("json", schema_text(m.group(1))), markdown)
    return EXAMPLE_LOG.sub(lambda m: fence("json", example_log()), markdown)
