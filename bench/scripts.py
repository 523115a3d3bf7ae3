"""The scripts: five runaways (waste), three that must reach their answer (no false stops), and the
overhead script. Raw argument text is exactly what the model sends, spacing and key order included."""

from __future__ import annotations

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
]

# the fewest real executions a fence can allow before it knows: 1 read, 1 read, 3 identical
# results (the third proves the streak), nothing for a call that cannot run
MINIMUM = {"retry_storm": 1, "duplicate_args": 1, "ok_forever": 3, "unknown_tool": 0, "truncated_json": 0}


def _polling(i: int) -> Turn:
    return [("job_status", '{"job_id": "j-1"}')] if i < 8 else "the job finished after 8 checks"


def _paging(i: int) -> Turn:
    return [("read_page", f'{{"path": "report.pdf", "page": {i + 1}}}')] if i < 5 else \
        "read all 5 pages"


def _changed_retry(i: int) -> Turn:
    paths = ["src/missing.ts", "src/main.tsx", "src/main.ts"]
    return [("read_file", f'{{"path": "{paths[i]}"}}')] if i < len(paths) else \
        "main exports a function returning 42"


HONEST = [
    Script("polling_8", _polling, {"job_status": "poll"}, "the same status check 8 times, then done"),
    Script("paging_5", _paging, {"read_page": "read_only"}, "pages 1..5 of one document"),
    Script("retry_changed_args", _changed_retry, {"read_file": "read_only"},
           "two misses, then the right path"),
]


def overhead_script(n: int) -> Script:
    """n steps calling a no-op tool with fresh arguments, then a final answer."""

    def turn(i: int) -> Turn:
        return [("noop", f'{{"i": {i}}}')] if i < n else "done"

    return Script(f"overhead_{n}", turn, {"noop": "side_effect"})
