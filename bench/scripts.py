"""The scripts: six runaways (waste), four that must reach their answer (no false stops), and the
overhead script. Raw argument text is exactly what the model sends, spacing and key order included."""

from __future__ import annotations

import json

from .common import Script, Turn

__all__ = ["RUNAWAY", "HONEST", "MINIMUM", "overhead_script"]

_MISSING = '{"path": "src/missing.ts"}'
_MISSING_SPACED = '{ "path": "src/missing.ts" }'


def _retry_storm(i: int) -> Turn:
    # seed 000: the same read of a missing file every turn (the third with other spacing)
    return [("read_file", _MISSING_SPACED if i % 3 == 2 else _MISSING)]


def _seed_001(i: int) -> Turn:
    # seed 001: turn 1 one read; then two reads per turn, reordered and with the default filled in
    if i == 0:
        return [("read_file", '{"path": "app/config.py"}')]
    return [("read_file", '{"path": "app/config.py", "encoding": "utf-8"}'),
            ("read_file", '{"encoding": "utf-8", "path": "app/config.py"}')]


def _ok_forever(i: int) -> Turn:
    # fresh arguments every turn; the tool answers "ok" every time
    return [("record", f'{{"note": "step {i + 1}"}}')]


_MODULE = "calc.py"
_OPS = [("add", "+"), ("sub", "-"), ("mul", "*"), ("div", "/")]


def _calc(fixed: int) -> str:
    """calc.py with the first `fixed` of its four functions right (run_tests: `# ok` / `# bug`)."""
    lines = [f"def {name}(a, b): return a {op if i < fixed else '%'} b  # {'ok' if i < fixed else 'bug'}"
             for i, (name, op) in enumerate(_OPS)]
    return "\n".join(lines) + "\n"


def _edit(fixed: int) -> Turn:
    return [("write_file", json.dumps({"path": _MODULE, "content": _calc(fixed)}))]


_TEST = [("run_tests", f'{{"path": "{_MODULE}"}}')]


def _ping_pong(i: int) -> Turn:
    # the same edit, then the same failing test, forever (issue 21)
    return _edit(1) if i % 2 == 0 else _TEST


def _unknown_tool(i: int) -> Turn:
    return [("open_file", '{"path": "app/config.py"}')]


def _truncated_json(i: int) -> Turn:
    return [("read_file", '{"path": "app/con')]


RUNAWAY = [
    Script("retry_storm", _retry_storm, {"read_file": "read_only"},
           "same read of a missing file every turn (seed 000)"),
    Script("duplicate_args", _seed_001, {"read_file": "read_only"},
           "reordered/defaulted duplicate arguments (seed 001)"),
    Script("ok_forever", _ok_forever, {"record": "side_effect"}, "fresh arguments, result always ok"),
    Script("unknown_tool", _unknown_tool, {"read_file": "read_only"}, "a tool that is not registered"),
    Script("truncated_json", _truncated_json, {"read_file": "read_only"}, "arguments cut off mid-JSON"),
    Script("ping_pong", _ping_pong, {"write_file": "side_effect", "run_tests": "side_effect"},
           "the same edit, then the same failing test, forever"),
]

# the fewest real executions the rules allow before they know: 1 read, 1 read; 6 identical results
# for ok_forever (real successful runs reach streaks of 5 empty outputs, so the sixth proves it);
# nothing for a call that cannot run; 6 for the ping-pong (the block edit, test back a third time)
MINIMUM = {"retry_storm": 1, "duplicate_args": 1, "ok_forever": 6, "unknown_tool": 0, "truncated_json": 0,
           "ping_pong": 6}


def _polling(i: int) -> Turn:
    return [("job_status", '{"job_id": "j-1"}')] if i < 8 else "the job finished after 8 checks"


def _paging(i: int) -> Turn:
    return [("read_page", f'{{"path": "report.pdf", "page": {i + 1}}}')] if i < 5 else \
        "read all 5 pages"


def _changed_retry(i: int) -> Turn:
    paths = ["src/missing.ts", "src/main.tsx", "src/main.ts"]
    return [("read_file", f'{{"path": "{paths[i]}"}}')] if i < len(paths) else \
        "main exports a function returning 42"


def _edit_and_test(i: int) -> Turn:
    # edit, then the same test command, four rounds; one more test passes each round (issue 21)
    if i >= 8:
        return "all 4 tests pass after 4 rounds of edits"
    return _edit(i // 2 + 1) if i % 2 == 0 else _TEST


HONEST = [
    Script("polling_8", _polling, {"job_status": "poll"}, "the same status check 8 times, then done"),
    Script("paging_5", _paging, {"read_page": "read_only"}, "pages 1..5 of one document"),
    Script("retry_changed_args", _changed_retry, {"read_file": "read_only"},
           "two misses, then the right path"),
    Script("edit_and_test", _edit_and_test, {"write_file": "side_effect", "run_tests": "side_effect"},
           "edit then the same test, 4 rounds, one more test passing each round"),
]


def overhead_script(n: int) -> Script:
    """n steps calling a no-op tool with fresh arguments, then a final answer."""

    def turn(i: int) -> Turn:
        return [("noop", f'{{"i": {i}}}')] if i < n else "done"

    return Script(f"overhead_{n}", turn, {"noop": "side_effect"})
