"""A batch or drill folder -> one self-contained HTML page, plus a page per episode next to its log.

A batch folder (`loopfence batch ... --out DIR`): job.json, results.jsonl (one row per finished
episode), summary.json, episodes/ID.jsonl. A drill folder (`loopfence drill --out DIR`):
results.json (format loopfence.drill: one scenario each, with its expected stop and pass/fail) and
NAME.jsonl logs. The page: episodes by stop reason (a chart), the SHIP rate, a sortable, filterable
table of episodes linking to each episode's page, and the decision table (expected against actual
stop, pass/fail) where expectations exist. Read here from the files' formats alone.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._json import JsonFileError, loads, read_bounded
from .._log import LogError
from ._html import bar_chart, esc, fmt_num, fmt_s, page
from ._run import write_run_report

__all__ = ["Row", "DirView", "DirError", "read_dir", "render_dir", "write_dir_report", "MAX_FILE_BYTES"]

MAX_FILE_BYTES = 256 << 20
_SHIP_COLOUR, _KILL_COLOUR, _ERR_COLOUR = "#1a7f37", "#c62828", "#6b7785"


class DirError(ValueError):
    """Not a batch or drill folder, or one of its files cannot be read (the message names it)."""


@dataclass
class Row:
    id: str
    stop: str | None
    verdict: str | None
    detail: str = ""
    requests: int = 0
    executions: int = 0
    reuses: int = 0
    refusals: int = 0
    rejections: int = 0
    tokens: int = 0
    seconds: float = 0.0
    attempts: int = 1
    log: Path | None = None
    expected: str | None = None
    passed: bool | None = None
    mismatches: list[str] = field(default_factory=list)
    error: str | None = None
    page: str | None = None  # the episode page, relative to the folder page
    page_error: str | None = None


@dataclass
class DirView:
    path: Path
    kind: str  # "batch" | "drill"
    rows: list[Row]
    summary: dict[str, Any]
    job: dict[str, Any]

    @property
    def finished(self) -> list[Row]:
        return [r for r in self.rows if r.stop is not None]

    @property
    def ship_rate(self) -> float | None:
        done = self.finished
        return sum(r.verdict == "SHIP" for r in done) / len(done) if done else None

    @property
    def has_expectations(self) -> bool:
        return any(r.expected is not None or r.passed is not None for r in self.rows)


def _json_file(path: Path) -> Any:
    try:
        return loads(read_bounded(str(path), MAX_FILE_BYTES, path.name))
    except (JsonFileError, ValueError) as exc:
        raise DirError(f"{path}: cannot read: {exc}") from None


def _int(v: Any) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _expected(meta: Any) -> str | None:
    if not isinstance(meta, dict):
        return None
    value = meta.get("expected_stop", meta.get("expect"))
    if isinstance(value, dict):
        value = value.get("stop")
    return value if isinstance(value, str) else None


def _batch_rows(folder: Path) -> list[Row]:
    path = folder / "results.jsonl"
    rows = []
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DirError(f"{path}: cannot read: {exc.strerror or exc}") from None
    for n, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            item = loads(raw)
        except ValueError:
            if n == data.count(b"\n") + 1:  # a torn last line (a batch killed mid-write)
                continue
            raise DirError(f"{path}:{n}: not JSON") from None
        if not isinstance(item, dict) or not isinstance(item.get("id"), str):
            raise DirError(f"{path}:{n}: not a results row (an object with an id)")
        stop = item.get("stop") if isinstance(item.get("stop"), str) else None
        expected = _expected(item.get("metadata"))
        log = item.get("log")
        rows.append(Row(
            id=item["id"], stop=stop, verdict=item.get("verdict") if isinstance(item.get("verdict"), str) else None,
            detail=str(item.get("detail") or ""), requests=_int(item.get("requests")),
            executions=_int(item.get("executions")), reuses=_int(item.get("reuses")),
            refusals=_int(item.get("refusals")), rejections=_int(item.get("rejections")),
            tokens=_int(item.get("tokens", _int(item.get("prompt_tokens")) + _int(item.get("completion_tokens")))),
            seconds=float(item.get("seconds") or 0.0), attempts=_int(item.get("attempts")) or 1,
            log=folder / log if isinstance(log, str) and log else None, expected=expected,
            passed=(stop == expected) if expected is not None and stop is not None else None,
            error=item.get("error") if isinstance(item.get("error"), str) else None))
    return rows


def _drill_rows(folder: Path, doc: dict[str, Any]) -> list[Row]:
    rows = []
    for item in doc.get("scenarios") or []:
        if not isinstance(item, dict):
            continue
        log = item.get("log")
        log_path = Path(log) if isinstance(log, str) and log else None
        if log_path is not None and not log_path.is_absolute() and not log_path.exists():
            log_path = folder / log_path.name
        rows.append(Row(
            id=str(item.get("name") or "?"), stop=item.get("stop"), verdict=item.get("verdict"),
            detail=str(item.get("detail") or ""), requests=_int(item.get("model_requests")),
            executions=_int(item.get("tool_executions")), reuses=_int(item.get("reused")),
            refusals=_int(item.get("refused")), rejections=_int(item.get("rejected")),
            tokens=_int(item.get("prompt_tokens")) + _int(item.get("completion_tokens")),
            seconds=float(item.get("elapsed_s") or 0.0), log=log_path, expected=item.get("expected_stop"),
            passed=item.get("pass") if isinstance(item.get("pass"), bool) else None,
            mismatches=[str(m) for m in item.get("mismatches") or []],
            error=item.get("error") if isinstance(item.get("error"), str) else None))
    return rows


def read_dir(folder: str | os.PathLike[str]) -> DirView:
    root = Path(folder)
    drill = root / "results.json"
    if (root / "results.jsonl").exists():
        summary = _json_file(root / "summary.json") if (root / "summary.json").exists() else {}
        job = _json_file(root / "job.json") if (root / "job.json").exists() else {}
        return DirView(root, "batch", _batch_rows(root), summary if isinstance(summary, dict) else {},
                       job if isinstance(job, dict) else {})
    if drill.exists():
        doc = _json_file(drill)
        if not isinstance(doc, dict) or doc.get("format") != "loopfence.drill":
            raise DirError(f"{drill}: not a loopfence drill results file")
        return DirView(root, "drill", _drill_rows(root, doc), {}, doc)
    raise DirError(f"{root}: neither a batch folder (results.jsonl) nor a drill folder (results.json)")


def _episode_pages(v: DirView, index: Path) -> None:
    """A page next to each episode's log (LOG.html), linked from the index and back."""
    here = index.parent.resolve()
    for r in v.rows:
        if r.log is None or not r.log.exists():
            continue
        target = r.log.with_suffix(".html")
        try:
            back = os.path.relpath(index.resolve(), target.parent.resolve())
            write_run_report(r.log, target, back=Path(back).as_posix())
        except (LogError, OSError, ValueError) as exc:
            r.page_error = str(exc)
            continue
        r.page = Path(os.path.relpath(target.resolve(), here)).as_posix()


def _summary_cards(v: DirView) -> str:
    done = v.finished
    rate = v.ship_rate
    ship = sum(r.verdict == "SHIP" for r in done)
    tokens = sorted(r.tokens for r in done)
    p50 = tokens[(len(tokens) - 1) // 2] if tokens else None
    pending = v.summary.get("pending") if isinstance(v.summary.get("pending"), int) else None
    cards = [(f"{rate:.1%}" if rate is not None else "–", f"SHIP rate ({ship:,} of {len(done):,})"),
             (fmt_num(len(v.rows)), "episodes with a row"), (fmt_num(len(done)), "finished"),
             (fmt_num(sum(r.error is not None for r in v.rows)), "could not run"),
             (fmt_num(sum(r.requests for r in done)), "model requests"),
             (fmt_num(sum(r.executions for r in done)), "tool executions"),
             (fmt_num(sum(r.tokens for r in done)), "tokens"), (fmt_num(p50), "tokens p50"),
             (fmt_s(sum(r.seconds for r in done)), "run time, summed")]
    if pending:
        cards.insert(2, (fmt_num(pending), "pending (no row yet)"))
    if v.has_expectations:
        judged = [r for r in v.rows if r.passed is not None]
        cards.insert(1, (f"{sum(bool(r.passed) for r in judged):,}/{len(judged):,}", "expectations passed"))
    return '<div class="cards" id="summary">' + "".join(
        f'<div class="card"><b>{a}</b><span>{esc(b)}</span></div>' for a, b in cards) + "</div>"


def _stop_chart(v: DirView) -> str:
    counts = Counter(r.stop or "error" for r in v.rows)
    verdicts = {r.stop: r.verdict for r in v.rows if r.stop}
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    bars = [(k, float(n), _SHIP_COLOUR if verdicts.get(k) == "SHIP" else _ERR_COLOUR if k == "error"
             else _KILL_COLOUR) for k, n in rows]
    return '<h2>Episodes by stop reason</h2>' + bar_chart("stop-chart", bars, title="episodes by stop reason")


def _cell(value: Any, numeric: bool = False, sort_value: Any = None) -> str:
    v = sort_value if sort_value is not None else value
    cls = ' class="n"' if numeric else ""
    return f'<td{cls} data-v="{esc(v)}">{esc(fmt_num(value) if numeric else value)}</td>'


def _pass_badge(r: Row) -> str:
    if r.error is not None and r.passed is None:
        return '<td data-v="0"><span class="badge fail">error</span></td>'
    if r.passed is None:
        return '<td data-v="">–</td>'
    return (f'<td data-v="{int(r.passed)}"><span class="badge {"pass" if r.passed else "fail"}">'
            f'{"pass" if r.passed else "FAIL"}</span></td>')


def _short(detail: str, limit: int = 120) -> str:
    """A stop's detail cut to one short line for the table (the whole of it is the cell's tooltip)."""
    line = " ".join(detail.split())
    return line if len(line) <= limit else line[:limit - 1] + "…"


def _table(v: DirView) -> str:
    expect = v.has_expectations
    heads = ["episode", "stop", "verdict", "why", "requests", "executed", "reused", "refused", "tokens", "seconds",
             "attempts"] + (["expected", "pass"] if expect else [])
    numeric = {"requests", "executed", "reused", "refused", "tokens", "seconds", "attempts"}
    th = "".join(f'<th class="sort{" n" if h in numeric else ""}">{h}</th>' for h in heads)
    body = []
    for r in v.rows:
        name = f'<a href="{esc(r.page)}">{esc(r.id)}</a>' if r.page else esc(r.id)
        if r.page_error:
            name += f' <span class="err" title="{esc(r.page_error)}">(no page)</span>'
        stop = esc(r.stop) if r.stop else f'<span class="err">{esc(r.error or "no stop")}</span>'
        cells = [f'<td class="id" data-v="{esc(r.id)}">{name}</td>',
                 f'<td data-v="{esc(r.stop or "~error")}" title="{esc(r.detail)}">{stop}</td>',
                 _cell(r.verdict or "–"),
                 f'<td class="why" data-v="{esc(r.detail)}" title="{esc(r.detail)}">{esc(_short(r.detail))}</td>',
                 _cell(r.requests, True), _cell(r.executions, True),
                 _cell(r.reuses, True), _cell(r.refusals, True), _cell(r.tokens, True),
                 f'<td class="n" data-v="{r.seconds}">{esc(fmt_s(r.seconds))}</td>', _cell(r.attempts, True)]
        if expect:
            cells += [_cell(r.expected or "–"), _pass_badge(r)]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return ('<h2>Episodes</h2><div class="toolbar"><input type="search" placeholder="filter episodes" '
            'data-filter="episodes" aria-label="filter episodes"><span class="mut">click a column to sort</span>'
            f'</div><div class="scroll"><table class="sortable" id="episodes"><thead><tr>{th}</tr></thead><tbody>'
            + "".join(body) + "</tbody></table></div>")


def _decision_table(v: DirView) -> str:
    judged = [r for r in v.rows if r.expected is not None or r.passed is not None]
    if not judged:
        return ""
    failed_rows = [r for r in judged if r.passed is False or (r.error is not None and r.passed is None)]
    shown = judged if v.kind == "drill" else failed_rows  # a batch's table has the pass column already
    rows = []
    for r in shown:
        problems = "".join(f"<div class=\"err\">{esc(m)}</div>" for m in r.mismatches)
        rows.append(f'<tr><td>{esc(r.id)}</td><td>{esc(r.expected or "–")}</td><td>{esc(r.stop or r.error or "–")}'
                    f'{problems}</td><td class="n">{fmt_num(r.requests)}</td><td class="n">{fmt_num(r.executions)}'
                    f'</td><td class="n">{fmt_num(r.reuses)}</td><td class="n">{fmt_num(r.tokens)}</td>'
                    f'{_pass_badge(r)}</tr>')
    failed = len(failed_rows)
    note = "" if v.kind == "drill" else " (the failures below; every episode is in the table further down)"
    table = "" if not rows else (
            '<table id="decisions"><thead><tr><th>scenario</th><th>expected stop</th><th>actual stop</th>'
            '<th class="n">requests</th><th class="n">executed</th><th class="n">reused</th><th class="n">tokens</th>'
            '<th>pass</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table>")
    return (f'<h2>Decision table</h2><p id="expectations">{len(judged) - failed:,}/{len(judged):,} with '
            f'expectations passed{f"; <span class=err>{failed:,} failed</span>" if failed else ""}{note}</p>'
            + table)


def render_dir(v: DirView) -> str:
    what = "batch" if v.kind == "batch" else "drill"
    when = v.job.get("created_at") or v.job.get("written_at") or ""
    head = (f"<h1>loopfence {what} · {esc(v.path.name)}</h1><p class=\"mut\"><span class=\"mono\">"
            f"{esc(v.path)}</span>{f' · {esc(when)}' if when else ''}</p>")
    body = head + _summary_cards(v) + _stop_chart(v) + _decision_table(v) + _table(v)
    return page(f"loopfence {what} · {v.path.name}", body)


def write_dir_report(folder: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                     episode_pages: bool = True) -> Path:
    """Write the folder's page (default: FOLDER/report.html) and, unless told not to, a page next to
    each episode's log; the folder page's path. DirError for a folder that is neither."""
    view = read_dir(folder)
    target = Path(out) if out is not None else Path(folder) / "report.html"
    target.parent.mkdir(parents=True, exist_ok=True)
    if episode_pages:
        _episode_pages(view, target)
    target.write_text(render_dir(view), encoding="utf-8", errors="backslashreplace")  # a lone surrogate: its \\uXXXX text
    return target
