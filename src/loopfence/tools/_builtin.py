"""Built-in workspace tools. Names and signatures are public: scenario files and users rely on them.

| tool | kind | |
|---|---|---|
| read_file(path, page=1, encoding="utf-8") | read_only | one honest page; HTML as text (untrusted) |
| list_dir(path=".") | read_only | sorted entries, folders end with / |
| write_file(path, content) | side_effect, privileged | creates parents; reports bytes written |
| apply_patch(patch) | side_effect, privileged | unified diff, all hunks or none |
| run_command(command, timeout_s=30) | side_effect, privileged | sandboxed shell, killed at its timeout |

Every path goes through the Jail (_pathguard.py) before any disk access. `privileged=True` marks the
tools a taint gate may refuse while untrusted content is in the conversation. Results name paths
relative to the workspace root, never the host's absolute path. What the workspace held when the
tools were made (the run's start) is reported in the first tool's `info` (tools/_manifest.py), so
the log header records it for `replay --execute-tools`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

from .._keywords import keywords_checked
from ._executor import DEFAULT_RESULT_CAP
from ._files import FileOptions, FileTools
from ._manifest import START_KEY, workspace_manifest
from ._pathguard import Jail
from ._provenance import Provenance
from ._registry import Tool, tool
from ._shell import CommandLimits, Shell

__all__ = ["workspace_tools", "PAGE_CHARS", "BUILTIN_NAMES", "CommandLimits"]

PAGE_CHARS = 4_000
BUILTIN_NAMES = ("read_file", "list_dir", "write_file", "apply_patch", "run_command")


@keywords_checked
def workspace_tools(root: str | Path, names: Iterable[str] | None = None, *, sandbox: bool = True,
                    untrusted_globs: Iterable[str] | None = None, trust_globs: Iterable[str] | None = None,
                    page_chars: int = PAGE_CHARS,
                    result_cap: int | None = DEFAULT_RESULT_CAP, command_limits: CommandLimits | None = None,
                    max_command_timeout_s: float = 300.0, hide_env: Iterable[str] = (),
                    allow_hardlinks: bool = False, manifest: bool = True,
                    snapshot: str | Path | None = None) -> list[Tool]:
    """The built-in tools bound to one workspace folder (all of them, or those in `names`).

    sandbox: run_command inside bubblewrap (default); False is the explicit, logged opt-out.
    untrusted_globs: workspace-relative posix globs (fnmatch; `**/` may match no folder) whose files
      read_file returns as untrusted content, and whose text taints a result of any tool.
    trust_globs: the mirror: HTML that was in the workspace at the start is untrusted unless one of
      these matches it (files the run makes itself carry the trust of what made them; see
      tools/_provenance).
    page_chars: read_file page size. result_cap: the executor's result cap; run_command gives each of
      stdout and stderr 3/8 of it so the whole result fits.
    allow_hardlinks: read_file/apply_patch read files with more than one hard link (by default they
      refuse: a hard link made before the run can name a file outside the workspace).
    hide_env: environment variables an unsandboxed run_command does not get, besides OPENAI_API_KEY
      and LOOPFENCE_API_KEY (the sandbox passes none); their values are also masked in its output.
    manifest: record what the workspace holds now (paths, sizes, sha256; bounded, see
      tools/_manifest.py) in the first tool's `info`, i.e. in the run log header as
      `tool_info.<tool>.workspace_at_start`: make the tools once per run, as the run starts.
    snapshot: also archive it there (a .tar.gz; its path and sha256 in the manifest), so `replay
      --execute-tools` can rebuild the starting workspace anywhere. Raises SnapshotError (an OSError)
      when it cannot be written.
    """
    wanted = list(BUILTIN_NAMES if names is None else names)
    unknown = sorted(set(wanted) - set(BUILTIN_NAMES))
    if unknown:
        raise ValueError(f"unknown built-in tool(s) {unknown}; the built-ins are {list(BUILTIN_NAMES)}")
    jail = Jail(root, allow_hardlinks=allow_hardlinks)
    start = workspace_manifest(jail.root, snapshot=snapshot) if manifest or snapshot is not None else None
    untrusted = tuple(untrusted_globs or ())
    provenance = Provenance(jail.root, untrusted, tuple(trust_globs or ()))
    files = FileTools(jail, FileOptions(page_chars=page_chars, untrusted_globs=untrusted), provenance)
    stream_chars = max((result_cap or 16_000) * 3 // 8, 200)
    shell = Shell(jail.root, sandbox=sandbox, limits=command_limits, output_chars=stream_chars,
                  max_timeout_s=max_command_timeout_s, hide_env=hide_env)

    def read_file(path: str, page: int = 1, encoding: str = "utf-8") -> Any:
        """Read one page of a text file in the workspace. The page ends with a line saying which page
        of how many it is, and whether to ask for the next page or the file has ended. HTML pages come
        back as readable text (title, text, links)."""
        return files.read_file(path, page, encoding)

    def list_dir(path: str = ".") -> Any:
        """List a folder in the workspace: sorted names, folders end with /."""
        return files.list_dir(path)

    def write_file(path: str, content: str) -> Any:
        """Write a text file in the workspace (replacing it if it exists; missing folders are created).
        Reports the bytes written."""
        return files.write_file(path, content)

    def apply_patch(patch: str) -> Any:
        """Apply a unified diff ('--- a/path', '+++ b/path', '@@ -l,n +l,n @@' hunks) to files in the
        workspace. All hunks apply or none do; a hunk that does not match is reported with where."""
        return files.apply_patch(patch)

    def run_command(command: str, timeout_s: float = 30) -> Any:
        return shell.run(command, timeout_s)

    where = ("in a sandbox with no network, where only the workspace is writable"
             if sandbox else "WITHOUT a sandbox (explicit opt-out)")
    run_doc = (f"Run a shell command (/bin/sh -c) in the workspace folder, {where}. Returns exit_code, "
               "stdout and stderr. At timeout_s seconds the command and everything it started are killed.")
    made = {
        "read_file": lambda: tool(read_file, kind="read_only"),
        "list_dir": lambda: tool(list_dir, kind="read_only"),
        "write_file": lambda: tool(write_file, kind="side_effect", privileged=True),
        "apply_patch": lambda: tool(apply_patch, kind="side_effect", privileged=True),
        "run_command": lambda: replace(tool(run_command, kind="side_effect", privileged=True,
                                            description=run_doc, self_timed=True), info=shell.bounds()),
    }
    tools = [replace(made[name](), provenance=provenance) for name in BUILTIN_NAMES if name in wanted]
    if start is not None and tools:
        tools[0] = replace(tools[0], info={**tools[0].info, START_KEY: start.to_json()})
    return tools
