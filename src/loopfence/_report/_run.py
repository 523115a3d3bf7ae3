"""One run log -> one self-contained HTML page.

At the top: the stop, its verdict and detail; then the task, model and limits; each budget's use
against its limit; the per-turn prompt/completion token chart; the timeline of steps (each a
collapsed <details>: the request's prompt estimate and reported tokens, retries, the reply, every
call with its decision and collapsed arguments and result); gate and compaction decisions; retries.
A log cut off before its stop (a killed process) reads tolerantly and says so. A log `resume`
continued past a stop (_log/_segments.py) shows every segment's stop, and its budgets are judged
against the limits the run went on with.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._log._large import call_text
from .._log._reader import RunLogFile, read_log
from .._log._schema import (CallLine, GateLine, HeaderLine, LogEvent, ReplyLine, RequestLine, ResultLine,
                              ResumeLine, RetryLine, StopLine)
from .._stops import left_by_client
from ._html import bar_chart, clip, esc, fmt_num, fmt_s, page, stacked_chart
from ._words import JARGON, TEXT_TOOLS, call_words, jargon, reason_words, story

__all__ = ["RunView", "Step", "Call", "read_run", "render_run", "write_run_report", "BUDGETS"]

SHOWN_CALLS = 8  # the calls a step's header names (its body lists them all)
# budget -> (ledger entry it limits, what it counts)
BUDGETS = (("max_steps", "model_requests", "model requests"),
           ("max_tool_calls", "tool_executions", "tool executions"),
           ("max_prompt_tokens", "prompt_tokens", "prompt tokens (cumulative)"),
           ("max_completion_tokens", "completion_tokens", "completion tokens (cumulative)"),
           ("max_wall_seconds", "elapsed_s", "seconds"))


@dataclass
class Call:
    call: CallLine
    result: ResultLine | None = None
    gates: list[GateLine] = field(default_factory=list)


@dataclass
class Step:
    request: RequestLine
    reply: ReplyLine | None = None
    retries: list[RetryLine] = field(default_factory=list)
    calls: list[Call] = field(default_factory=list)


@dataclass
class RunView:
    path: str
    header: HeaderLine
    steps: list[Step]
    stop: StopLine | None
    gates: list[GateLine]
    retries: list[RetryLine]
    resumes: list[tuple[int, ResumeLine]]  # (steps before it, the resume)
    torn_bytes: int
    last_t: float
    reopened: dict[int, StopLine] = field(default_factory=dict)  # line -> an earlier segment's stop


def _stop_lines(events: Any) -> dict[int, StopLine]:
    return {e.line: e for e in events if isinstance(e, StopLine)}


def read_run(path: str | os.PathLike[str], log: RunLogFile | None = None) -> RunView:
    """A log read tolerantly (a killed run's torn last line is set aside) into steps; `log`: the
    file at `path` read so already (`read_log(path, tolerant=True)`)."""
    log = read_log(path, tolerant=True) if log is None else log
    events: list[LogEvent] = list(log.all_events)
    header = log.header  # the header as the run went on (a resume's overrides applied)
    steps: list[Step] = []
    by_id: dict[str, Call] = {}
    pending_gates: dict[str, list[GateLine]] = {}
    view = RunView(str(path), header, steps, None, [], [], [], log.torn_bytes, events[-1].t,
                   _stop_lines(log.reopened))
    texts = call_text(e.record for e in events)  # large arguments, stored once in their reply
    for e in events[1:]:
        if isinstance(e, RequestLine):
            steps.append(Step(e))
            by_id = {}
        elif isinstance(e, RetryLine):
            view.retries.append(e)
            if steps:
                steps[-1].retries.append(e)
        elif isinstance(e, ReplyLine):
            if steps:
                steps[-1].reply = e
        elif isinstance(e, CallLine):
            if (text := texts.get(e.seq)) is not None:
                e = e.model_copy(update={"raw_arguments": text})
            call = Call(e, gates=pending_gates.pop(e.tool_call_id, []))
            by_id[e.tool_call_id] = call
            if steps:
                steps[-1].calls.append(call)
        elif isinstance(e, ResultLine):
            if e.tool_call_id in by_id:
                by_id[e.tool_call_id].result = e
        elif isinstance(e, GateLine):
            view.gates.append(e)
            if e.tool_call_id is not None and e.decision != "tainted":
                if e.tool_call_id in by_id and by_id[e.tool_call_id].result is None:
                    by_id[e.tool_call_id].gates.append(e)
                else:
                    pending_gates.setdefault(e.tool_call_id, []).append(e)
        elif isinstance(e, ResumeLine):
            view.resumes.append((len(steps), e))
        elif isinstance(e, StopLine):
            view.stop = e
    return view


def _ledger(v: RunView) -> dict[str, Any]:
    if v.stop is not None:
        return dict(v.stop.ledger)
    calls = [c for s in v.steps for c in s.calls]
    return {"model_requests": len(v.steps), "tool_calls": len(calls),
            "tool_executions": sum(c.call.decision == "executed" for c in calls),
            "prompt_tokens": sum(s.reply.usage.prompt_tokens for s in v.steps if s.reply),
            "completion_tokens": sum(s.reply.usage.completion_tokens for s in v.steps if s.reply),
            "elapsed_s": v.last_t}


def _per_step(v: RunView) -> list[tuple[int, int]]:
    if v.stop is not None and v.stop.per_step:
        return [(p, c) for p, c in v.stop.per_step]
    return [(s.reply.usage.prompt_tokens, s.reply.usage.completion_tokens) for s in v.steps if s.reply]


def _stop_block(v: RunView) -> str:
    st = v.stop
    if st is None:
        cut = f" ({v.torn_bytes:,} bytes of a torn last line set aside)" if v.torn_bytes else ""
        return (f'<section class="stop NONE" id="stop"><span class="verdict">NO STOP</span>'
                f'<span class="reason">the log ends without its stop line</span>'
                f'<div class="detail">the process ended mid-run{esc(cut)}; '
                f'<code>loopfence resume</code> continues it</div></section>')
    answer, label = _answer(v, st)
    shown = (f'<div id="answer"><div class="mut">{label} ({len(answer):,} characters)</div>'
             f'<pre>{esc(clip(answer))}</pre></div>') if answer else ""
    data = (f'<details class="inner"><summary>stop data</summary><pre>'
            f'{esc(clip(json.dumps(st.data, indent=2, ensure_ascii=False)))}</pre></details>') if st.data else ""
    return (f'<section class="stop {esc(st.verdict)}" id="stop"><span class="verdict">{esc(st.verdict)}</span>'
            f'<span class="reason" id="stop-reason">{esc(st.reason)}</span>'
            f'<div class="why" id="stop-why">{esc(reason_words(st.reason))}</div>'
            f'<div class="detail">{esc(st.detail)}</div><div class="story" id="story">{esc(_story(v))}</div>'
            f'{shown}{data}{_earlier_stops(v)}</section>')


def _answer(v: RunView, st: StopLine) -> tuple[str | None, str]:
    """The text the page shows open under the stop, and what it is: the final answer; a proxy run's
    last reply, which stands as the answer when its client sent nothing more; or a cut reply's text."""
    if st.final_answer is not None:
        return st.final_answer, "final answer"
    if left_by_client(st.reason, st.data) and v.steps and v.steps[-1].reply is not None:
        return _reply_text(v.steps[-1].reply) or None, "final answer (the last reply: its client sent nothing more)"
    return st.partial_text, "the cut reply's text (not shipped)"


def _left(v: RunView) -> set[str]:
    """The calls of a proxy run's last reply, which stands as its answer (its client sent nothing more)."""
    st = v.stop
    if st is None or not left_by_client(st.reason, st.data):
        return set()
    return {i for i in st.data["unanswered"] if isinstance(i, str)}


def _story(v: RunView) -> str:
    """What the run did, in one line: its calls in order (the tool and its telling argument, with the
    decision where it was not run), and how it ended. A proxy run's last reply that stands as the
    answer (its client sent nothing more) is the answer, not a call."""
    st, left = v.stop, _left(v)
    calls = [(call_words(c.call.name, c.call.arguments, c.call.raw_arguments), str(c.call.decision))
             for s in v.steps for c in s.calls if c.call.tool_call_id not in left]
    cut = st is not None and st.partial_text is not None
    return story(calls, st is not None and (st.final_answer is not None or bool(left)), cut)


def _earlier_stops(v: RunView) -> str:
    """The stops of the segments before the last (each one `resume` went on past)."""
    if not v.reopened:
        return ""
    items = "".join(f'<li><span class="reason">{esc(st.reason)}</span> ({esc(st.verdict)}, line {line}): '
                    f'{esc(st.detail)}; resumed past it</li>' for line, st in sorted(v.reopened.items()))
    return f'<div class="detail segments">earlier segments ended:<ul>{items}</ul></div>'


def _overview(v: RunView) -> str:
    h = v.header
    model = h.model or {}
    name = model.get("model") or model.get("kind") or "?"
    where = f" at {model['base_url']}" if model.get("base_url") else ""
    rows = [("task", f'<pre>{esc(clip(h.task))}</pre>'),
            ("model", f'{esc(model.get("kind", "?"))}: <b>{esc(name)}</b>{esc(where)}'),
            ("run", f'<span class="mono">{esc(h.run_id)}</span> · started {esc(h.started_at)}'),
            ("log", f'<span class="mono">{esc(v.path)}</span>')]
    if h.system:
        rows.insert(1, ("system", f'<details class="inner"><summary>{len(h.system):,} characters</summary>'
                                  f'<pre>{esc(clip(h.system))}</pre></details>'))
    if h.workspace:
        rows.append(("workspace", f'<span class="mono">{esc(h.workspace)}</span>'))
    proxy = (h.record or {}).get("proxy") if isinstance(h.record, dict) else None
    if isinstance(proxy, dict):
        rows.insert(next(i for i, r in enumerate(rows) if r[0] == "model") + 1, ("proxy", _proxy_row(proxy, v)))
    limits = ", ".join(f"{k}={'∞' if val is None else val}" for k, val in h.limits.items())
    rows.append(("limits", f'<span class="mono">{esc(limits)}</span>'))
    led = _ledger(v)
    cards = [(fmt_num(led.get("model_requests")), "requests"), (fmt_num(led.get("tool_calls")), "calls asked"),
             (fmt_num(led.get("tool_executions")), "executed"), (fmt_num(led.get("reused")), "reused"),
             (fmt_num(led.get("refused")), "refused"), (fmt_num(led.get("rejected")), "rejected"),
             (fmt_num(led.get("prompt_tokens")), "prompt tokens"),
             (fmt_num(led.get("completion_tokens")), "completion tokens"),
             (fmt_s(led.get("elapsed_s")), "elapsed")]
    grid = "".join(f"<div>{k}</div><div>{val}</div>" for k, val in rows)
    return (f'<section id="overview"><div class="grid">{grid}</div><div class="cards">'
            + "".join(f"<div class=\"card\"><b>{a}</b><span>{b}</span></div>" for a, b in cards)
            + "</div></section>")


def _proxy_row(proxy: dict[str, Any], v: RunView) -> str:
    """A proxy run: the wire its agent spoke, the agent (its user agent), where requests went, and
    how many actions it read from replies' text (the last reply, standing as the answer, is not one)."""
    left = _left(v)
    actions = sum(c.call.name in TEXT_TOOLS and c.call.tool_call_id not in left for s in v.steps for c in s.calls)
    bits = [f'wire <b id="proxy-wire">{esc(proxy.get("wire") or "chat")}</b>',
            f'agent <b id="proxy-agent">{esc(proxy.get("user_agent") or "unknown")}</b>',
            f'upstream <span class="mono">{esc(proxy.get("upstream") or "?")}</span>',
            f'<span id="proxy-actions">{actions} text action{"" if actions == 1 else "s"}</span>']
    if proxy.get("session"):
        bits.append(f'session <span class="mono">{esc(proxy["session"])}</span>')
    return " · ".join(bits)


def _budgets(v: RunView) -> str:
    led = _ledger(v)
    rows = []
    for limit, entry, what in BUDGETS:
        cap, used = v.header.limits.get(limit), led.get(entry)
        if used is None:
            continue
        if isinstance(cap, (int, float)) and not isinstance(cap, bool) and cap > 0:
            share = used / cap
            bar = (f'<div class="bar{" over" if share >= 1 else ""}"><i style="width:{min(share, 1) * 100:.1f}%">'
                   f'</i></div>')
            text = f"{fmt_num(used)} of {fmt_num(cap)} ({share:.0%})"
        else:
            bar, text = '<div class="bar"></div>', f"{fmt_num(used)} (unlimited)"
        rows.append(f"<tr><td><code>{limit}</code></td><td>{what}</td><td>{bar}</td><td class=\"n\">{text}</td></tr>")
    window = v.header.limits.get("context_window")
    if isinstance(window, int) and v.steps:
        peak = max(max(s.request.prompt_estimate, s.reply.usage.prompt_tokens if s.reply else 0) for s in v.steps)
        share = peak / window
        rows.append(f'<tr><td><code>context_window</code></td><td>largest prompt</td><td><div class="bar'
                    f'{" over" if share >= 1 else ""}"><i style="width:{min(share, 1) * 100:.1f}%"></i></div></td>'
                    f'<td class="n">{fmt_num(peak)} of {fmt_num(window)} ({share:.0%})</td></tr>')
    return ('<section id="budgets"><h2>Budgets</h2><table><thead><tr><th>limit</th><th>counts</th><th>use</th>'
            '<th class="n">used</th></tr></thead><tbody>' + "".join(rows) + "</tbody></table></section>")


def _tokens(v: RunView) -> str:
    per = _per_step(v)
    if not per:
        return '<section id="tokens"><h2>Tokens per turn</h2><p class="mut">no reply in this log</p></section>'
    estimates = [s.request.prompt_estimate for s in v.steps][:len(per)]
    chart = stacked_chart("token-chart", [str(i) for i in range(1, len(per) + 1)],
                          [("prompt", "var(--prompt)", [p for p, _ in per]),
                           ("completion", "var(--compl)", [c for _, c in per])],
                          title="prompt and completion tokens per turn")
    rows = "".join(f"<tr><td class=\"n\">{i}</td><td class=\"n\">{fmt_num(e)}</td><td class=\"n\">{fmt_num(p)}</td>"
                   f"<td class=\"n\">{fmt_num(c)}</td></tr>"
                   for i, (e, (p, c)) in enumerate(zip(estimates + [None] * len(per), per), 1))
    return (f'<section id="tokens"><h2>Tokens per turn</h2>{chart}<details class="inner"><summary>as a table'
            f'</summary><table><thead><tr><th class="n">turn</th><th class="n">prompt estimate</th>'
            f'<th class="n">prompt</th><th class="n">completion</th></tr></thead><tbody>{rows}</tbody></table>'
            f'</details></section>')


def _reply_text(reply: ReplyLine) -> str:
    raw = reply.raw if isinstance(reply.raw, dict) else {}
    try:
        content = raw["choices"][0]["message"].get("content")
    except (KeyError, IndexError, TypeError, AttributeError):
        content = None
    return content if isinstance(content, str) else ""


def _badge(decision: object) -> str:
    tip = JARGON.get(str(decision))
    title = f' title="{esc(tip)}"' if tip else ""
    return f'<span class="badge {esc(decision)}"{title}>{esc(decision)}</span>'


def _call_row(c: Call) -> str:
    e, r = c.call, c.result
    args = e.raw_arguments if e.raw_arguments is not None else json.dumps(e.arguments or {}, ensure_ascii=False)
    note = esc(e.reason) if e.reason else ""
    gates = "".join(f'<div class="mut">gate {_badge(g.decision)} {esc(g.reason)}</div>' for g in c.gates)
    if r is None:
        outcome = '<span class="warn">no result in the log</span>'
        result = ""
    else:
        status = "" if r.ok else f' <span class="err">{esc(r.error or "error")}</span>'
        outcome = f'{fmt_s(r.duration_s)}{status}{" · untrusted" if r.untrusted else ""}'
        result = (f'<details class="inner"><summary>result ({len(r.content):,} characters)</summary>'
                  f'<pre>{esc(clip(r.content))}</pre></details>')
    return (f'<tr class="call"><td><code>{esc(e.name)}</code><div class="mut mono">{esc(e.tool_call_id)}</div></td>'
            f'<td>{_badge(e.decision)}{gates}{f"<div>{note}</div>" if note else ""}</td>'
            f'<td><details class="inner"><summary>arguments</summary><pre>{esc(clip(args))}</pre></details>'
            f'{result}</td><td>{outcome}</td></tr>')


def _step(s: Step) -> str:
    req, rep = s.request, s.reply
    bits = [f"<b>step {req.step}</b>", f"t={req.t:.3f}s", f"prompt ~{fmt_num(req.prompt_estimate)} {jargon('est.')}"]
    if rep is not None:
        u = rep.usage
        reported = jargon("reported" if u.reported else "estimated")
        bits.append(f"{fmt_num(u.prompt_tokens)} prompt / {fmt_num(u.completion_tokens)} completion ({reported})")
        if rep.finish_reason:
            bits.append(f"finish {esc(rep.finish_reason)}")
        if not rep.complete:
            bits.append(f'<span class="err">incomplete: {esc(rep.problem)}</span>')
    else:
        bits.append('<span class="warn">no reply</span>')
    if s.retries:
        bits.append(f'<span class="warn">{len(s.retries)} retr{"y" if len(s.retries) == 1 else "ies"}</span>')
    if s.calls:
        more = f", {len(s.calls) - SHOWN_CALLS} more" if len(s.calls) > SHOWN_CALLS else ""
        bits.append(", ".join(f'<code class="called">{esc(call_words(c.call.name, c.call.arguments, c.call.raw_arguments))}'
                              f'</code> {_badge(c.call.decision)}' for c in s.calls[:SHOWN_CALLS]) + more)
    elif rep is not None and rep.complete and rep.finish_reason != "length" and _reply_text(rep):
        bits.append("answered")
    body = []
    for r in s.retries:
        body.append(f'<div class="warn">retry: attempt {r.attempt} failed ({esc(r.reason)}), '
                    f'next in {r.wait_s:g}s</div>')
    if rep is not None:
        text = _reply_text(rep)
        if text:
            body.append(f'<details class="inner"><summary>reply text ({len(text):,} characters)</summary>'
                        f'<pre>{esc(clip(text))}</pre></details>')
        if rep.duration_s is not None:
            body.append(f'<div class="mut">request took {fmt_s(rep.duration_s)}; {jargon("fingerprint")} '
                        f'<span class="mono">{esc(req.fingerprint)}</span>; {req.n_messages or "?"} messages</div>')
        if rep.usage.charged == "estimate":
            body.append(f'<div class="warn">completion charged as an estimate (reported '
                        f'{rep.usage.completion_reported})</div>')
    if s.calls:
        body.append('<table><thead><tr><th>call</th><th>decision</th><th>arguments / result</th><th>outcome</th>'
                    '</tr></thead><tbody>' + "".join(_call_row(c) for c in s.calls) + "</tbody></table>")
    return (f'<details class="step" id="step-{req.step}"><summary>{" · ".join(bits)}</summary>'
            f'<div class="body">{"".join(body) or "<span class=mut>nothing else</span>"}</div></details>')


def _timeline(v: RunView) -> str:
    items = []
    resumes = list(v.resumes)
    for i, s in enumerate([*v.steps, None]):
        while resumes and resumes[0][0] == i:
            r = resumes.pop(0)[1]
            line = (r.reopened or {}).get("line")
            st = v.reopened.get(line) if isinstance(line, int) else None
            if st is not None:
                items.append(f'<div class="err stop-line">stop <b>{esc(st.reason)}</b> ({esc(st.verdict)}, line '
                             f'{line}) at {st.t:.3f}s: {esc(st.detail)}</div>')
            went = f"; went on with {esc(json.dumps(r.overrides, ensure_ascii=False))}" if r.overrides else ""
            items.append(f'<div class="warn resume">resumed after line {r.after_line} at {r.elapsed_s:.3f}s'
                         f'{" (a torn last line set aside)" if r.torn_bytes else ""}{went}</div>')
        if s is not None:
            items.append(_step(s))
    return ('<section id="timeline"><h2>Timeline</h2><div class="toolbar"><button data-open="1">expand all'
            '</button><button data-open="0">collapse all</button></div>' + "".join(items) + "</section>")


def _decisions(v: RunView) -> str:
    out = ['<section id="decisions"><h2>Gate and compaction</h2>']
    if v.gates:
        out.append('<table><thead><tr><th class="n">step</th><th>tool</th><th>decision</th><th>reason</th>'
                   '</tr></thead><tbody>')
        out += [f'<tr><td class="n">{g.step}</td><td><code>{esc(g.name)}</code></td><td>{_badge(g.decision)}</td>'
                f'<td>{esc(g.reason)}</td></tr>' for g in v.gates]
        out.append("</tbody></table>")
    else:
        out.append('<p class="mut">no gate decision in this run</p>')
    gate = v.header.gate
    if gate:
        out.append(f'<div class="mut">gate settings: <span class="mono">{esc(json.dumps(gate))}</span></div>')
    comp = v.header.compaction
    out.append(f'<div class="mut">compaction: <span class="mono">{esc(json.dumps(comp)) if comp else "off"}</span>'
               ' (old tool results stubbed in the outgoing prompt; the log keeps the originals)</div>')
    out.append("</section>")
    return "".join(out)


def _retries(v: RunView) -> str:
    if not v.retries:
        return '<section id="retries"><h2>Retries</h2><p class="mut">no retried request</p></section>'
    rows = "".join(f'<tr><td class="n">{r.step}</td><td class="n">{r.attempt}</td><td class="n">'
                   f'{r.status if r.status is not None else "–"}</td><td class="n">{r.wait_s:g}s</td>'
                   f'<td>{esc(r.reason)}</td></tr>' for r in v.retries)
    return ('<section id="retries"><h2>Retries</h2><table><thead><tr><th class="n">step</th><th class="n">attempt'
            '</th><th class="n">status</th><th class="n">wait</th><th>reason</th></tr></thead><tbody>'
            f'{rows}</tbody></table></section>')


def _decision_chart(v: RunView) -> str:
    counts: dict[str, int] = {}
    for s in v.steps:
        for c in s.calls:
            counts[str(c.call.decision)] = counts.get(str(c.call.decision), 0) + 1
    if not counts:
        return ""
    colours = {"executed": "#2f7d32", "reused": "#3d6fb6", "refused": "#c62828", "rejected": "#8e24aa"}
    rows = [(k, float(counts[k]), colours[k]) for k in colours if k in counts]
    return '<h2>Calls by decision</h2>' + bar_chart("decision-chart", rows, title="calls by decision")


def render_run(v: RunView, *, back: str | None = None) -> str:
    reason = v.stop.reason if v.stop else "no stop"
    nav = f'<p><a href="{esc(back)}">← the batch</a></p>' if back else ""
    body = (nav + f"<h1>loopfence run · {esc(reason)}</h1>" + _stop_block(v) + _overview(v) + _budgets(v)
            + _tokens(v) + _decision_chart(v) + _timeline(v) + _decisions(v) + _retries(v))
    return page(f"loopfence run · {reason} · {v.header.task[:60]}", body)


def write_run_report(log: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
                     back: str | None = None, read: RunLogFile | None = None) -> Path:
    """Write the page for `log` (default: next to it, LOG.html); its path. LogError for a log that
    cannot be read. `read`: the log, read already (`read_log(log, tolerant=True)`)."""
    target = Path(out) if out is not None else Path(log).with_suffix(".html")
    text = render_run(read_run(log, read), back=back)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8", errors="backslashreplace")  # a lone surrogate: its \\uXXXX text
    return target
