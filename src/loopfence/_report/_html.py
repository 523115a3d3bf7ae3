"""The pieces every report page shares: the page shell (inline CSS and script, a Content Security
Policy that allows no network at all), escaping, and inline SVG bar charts.

Everything that came from a model, a tool, a file or a log is escaped here (`esc`), never written
raw; long texts are cut (`clip`) so a page stays readable and small with 500 steps.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

__all__ = ["esc", "clip", "page", "bar_chart", "stacked_chart", "fmt_num", "fmt_s", "CLIP_CHARS"]

CLIP_CHARS = 4_000  # characters of one argument list or result shown in a page

# Nothing is fetched: no default source, inline style and script only, images only as data: URIs.
CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:; "
       "base-uri 'none'; form-action 'none'")

CSS = """
:root{--fg:#1d232a;--mut:#5b6673;--bg:#fff;--soft:#f4f6f8;--line:#dde2e7;--ship:#1a7f37;--kill:#c62828;
--prompt:#3d6fb6;--compl:#e3892b;--warn:#a15c00;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif}
*{box-sizing:border-box}body{margin:0;color:var(--fg);background:var(--bg)}
main{max-width:1180px;margin:0 auto;padding:16px 20px 60px}
h1{font-size:20px;margin:4px 0 12px}h2{font-size:16px;margin:26px 0 8px;border-bottom:1px solid var(--line);
padding-bottom:4px}code,pre,.mono{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:12.5px}
pre{white-space:pre-wrap;word-break:break-word;background:var(--soft);padding:8px;border-radius:4px;margin:4px 0;
max-height:420px;overflow:auto}
.stop{border-radius:6px;padding:12px 16px;margin:0 0 14px;border-left:6px solid}
.stop.SHIP{background:#eaf6ec;border-color:var(--ship)}.stop.KILL{background:#fdecea;border-color:var(--kill)}
.stop.NONE{background:#fff6e0;border-color:var(--warn)}
.verdict{font-weight:700;font-size:18px;margin-right:10px}.SHIP .verdict{color:var(--ship)}
.KILL .verdict{color:var(--kill)}.reason{font-size:18px;font-weight:600}
.detail{margin-top:4px;white-space:pre-wrap;word-break:break-word}
.why{margin-top:6px;font-size:15px;font-weight:600}.story{margin-top:6px}#answer{margin-top:8px}
#answer pre{max-height:240px;background:#fff}abbr[title]{text-decoration:underline dotted;cursor:help}
.grid{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px}.grid>div:nth-child(odd){color:var(--mut)}
.cards{display:flex;flex-wrap:wrap;gap:10px;margin:8px 0}.card{background:var(--soft);border-radius:6px;
padding:8px 12px;min-width:120px}.card b{display:block;font-size:18px}.card span{color:var(--mut);font-size:12px}
table{border-collapse:collapse;width:100%;margin:6px 0}th,td{text-align:left;padding:4px 8px;
border-bottom:1px solid var(--line);vertical-align:top}th{background:var(--soft);font-weight:600}
td.n,th.n{text-align:right;font-variant-numeric:tabular-nums}
th.sort{cursor:pointer;user-select:none;white-space:nowrap}th.sort:after{content:" \\2195";color:#9aa4ae}
th.sort.asc:after{content:" \\2191";color:var(--fg)}th.sort.desc:after{content:" \\2193";color:var(--fg)}
.badge{display:inline-block;border-radius:10px;padding:0 8px;font-size:12px;font-weight:600;color:#fff;
background:#6b7785}
.executed{background:#2f7d32}.reused{background:#3d6fb6}.refused{background:#c62828}.rejected{background:#8e24aa}
.allowed{background:#607d8b}.approved{background:#2f7d32}.tainted{background:#a15c00}
.pass{background:#2f7d32}.fail{background:#c62828}
details.step{border:1px solid var(--line);border-radius:6px;margin:6px 0;background:#fff}
details.step>summary{padding:6px 10px;cursor:pointer;list-style-position:inside}
details.step[open]>summary{background:var(--soft);border-bottom:1px solid var(--line)}
details.step>.body{padding:6px 12px 10px}details.inner>summary{cursor:pointer;color:var(--mut)}
.mut{color:var(--mut)}.warn{color:var(--warn)}.err{color:var(--kill)}
.bar{background:var(--soft);border-radius:3px;height:14px;position:relative;min-width:160px}
.bar>i{position:absolute;left:0;top:0;bottom:0;border-radius:3px;background:var(--prompt)}
.bar.over>i{background:var(--kill)}
svg text{font:11px system-ui,sans-serif;fill:#5b6673}.legend i{display:inline-block;width:10px;height:10px;
margin:0 4px 0 10px;border-radius:2px}
.toolbar{margin:6px 0;display:flex;gap:8px;align-items:center}button{font:inherit;padding:2px 10px;cursor:pointer}
.scroll{overflow-x:auto}td.id{white-space:nowrap}td.why{max-width:420px;color:var(--mut);font-size:12.5px}
input[type=search]{font:inherit;padding:2px 6px;min-width:240px}
"""

SCRIPT = """
(function(){
  function num(v){var x=parseFloat(v);return isNaN(x)?null:x;}
  document.querySelectorAll('table.sortable').forEach(function(table){
    var heads=table.tHead.rows[0].cells, body=table.tBodies[0];
    Array.prototype.forEach.call(heads,function(th,col){
      if(!th.classList.contains('sort'))return;
      th.addEventListener('click',function(){
        var asc=!th.classList.contains('asc');
        Array.prototype.forEach.call(heads,function(h){h.classList.remove('asc','desc');});
        th.classList.add(asc?'asc':'desc');
        var rows=Array.prototype.slice.call(body.rows);
        var keyed=rows.map(function(r,i){var c=r.cells[col];var k=c.getAttribute('data-v');
          if(k===null)k=c.textContent;return {r:r,k:k,n:num(k),i:i};});
        keyed.sort(function(a,b){var d;
          if(a.n!==null&&b.n!==null)d=a.n-b.n;else d=String(a.k).localeCompare(String(b.k));
          if(d===0)d=a.i-b.i;return asc?d:-d;});
        var frag=document.createDocumentFragment();keyed.forEach(function(x){frag.appendChild(x.r);});
        body.appendChild(frag);table.setAttribute('data-sorted',(asc?'+':'-')+col);
      });
    });
  });
  document.querySelectorAll('input[data-filter]').forEach(function(box){
    var table=document.getElementById(box.getAttribute('data-filter'));
    box.addEventListener('input',function(){var q=box.value.toLowerCase();
      Array.prototype.forEach.call(table.tBodies[0].rows,function(r){
        r.style.display=!q||r.textContent.toLowerCase().indexOf(q)>=0?'':'none';});});
  });
  document.querySelectorAll('button[data-open]').forEach(function(b){
    b.addEventListener('click',function(){var open=b.getAttribute('data-open')==='1';
      document.querySelectorAll('details.step').forEach(function(d){d.open=open;});});
  });
})();
"""


def esc(value: object) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def clip(text: str | None, limit: int = CLIP_CHARS) -> str:
    if text is None:
        return ""
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n… ({len(text) - limit:,} more characters in the log)"


def fmt_num(value: float | int | None) -> str:
    if value is None:
        return "–"
    if isinstance(value, float) and not value.is_integer():
        return f"{value:,.2f}"
    return f"{int(value):,}"


def fmt_s(value: float | None) -> str:
    return "–" if value is None else f"{value:.3f}s" if value < 10 else f"{value:,.1f}s"


def page(title: str, body: str) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta http-equiv=\"Content-Security-Policy\" content=\"{CSP}\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            "<meta name=\"referrer\" content=\"no-referrer\">"
            f"<title>{esc(title)}</title><style>{CSS}</style></head>"
            f"<body><main>{body}</main><script>{SCRIPT}</script></body></html>\n")


def _ticks(top: float) -> list[float]:
    if top <= 0:
        return [0.0]
    raw = top / 4
    mag = 10 ** (len(str(int(raw))) - 1) if raw >= 1 else 1
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    out, v = [0.0], 0.0
    while v < top - 1e-9:  # the last tick at or above the top
        v += step
        out.append(v)
    return out


def stacked_chart(chart_id: str, labels: Sequence[str], series: Sequence[tuple[str, str, Sequence[float]]],
                  *, height: int = 220, title: str = "") -> str:
    """Vertical stacked bars, one per label; series = (name, css colour, values). Inline SVG with a
    <title> on every bar (the numbers on hover) and a legend."""
    n = max(1, len(labels))
    width, left, bottom, top_pad = 960, 48, 22, 10
    plot_w, plot_h = width - left - 8, height - bottom - top_pad
    totals = [sum(s[2][i] for s in series) for i in range(len(labels))]
    top = max(totals, default=0) or 1
    ticks = _ticks(top)
    top = ticks[-1]
    slot = plot_w / n
    bar = max(1.0, slot * 0.8)
    parts = [f'<svg id="{esc(chart_id)}" class="chart" role="img" aria-label="{esc(title)}" '
             f'viewBox="0 0 {width} {height}" width="100%" preserveAspectRatio="xMinYMin meet" '
             f'xmlns="http://www.w3.org/2000/svg">']
    for t in ticks:
        y = top_pad + plot_h - t / top * plot_h
        parts.append(f'<line x1="{left}" x2="{width - 8}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e6e9ed"/>'
                     f'<text x="{left - 4}" y="{y + 4:.1f}" text-anchor="end">{fmt_num(t)}</text>')
    every = max(1, n // 20)
    for i, label in enumerate(labels):
        x = left + i * slot + (slot - bar) / 2
        y = top_pad + plot_h
        tip = esc(f"{label}: " + ", ".join(f"{name} {fmt_num(vals[i])}" for name, _, vals in series))
        parts.append(f'<g class="bar"><title>{tip}</title>')
        for _, colour, vals in series:
            h = vals[i] / top * plot_h
            y -= h
            parts.append(f'<rect x="{x:.2f}" y="{y:.2f}" width="{bar:.2f}" height="{max(h, 0):.2f}" fill="{colour}"/>')
        parts.append("</g>")
        if i % every == 0:
            parts.append(f'<text x="{x + bar / 2:.1f}" y="{height - 6}" text-anchor="middle">{esc(label)}</text>')
    parts.append("</svg>")
    legend = "".join(f'<i style="background:{c}"></i>{esc(name)}' for name, c, _ in series)
    return f'<div class="legend mut">{legend}</div>' + "".join(parts)


def bar_chart(chart_id: str, rows: Sequence[tuple[str, float, str]], *, title: str = "") -> str:
    """Horizontal bars: (label, value, css colour), one row each."""
    width, label_w, row_h = 960, 190, 22
    height = max(1, len(rows)) * row_h + 8
    top = max((v for _, v, _ in rows), default=0) or 1
    parts = [f'<svg id="{esc(chart_id)}" class="chart" role="img" aria-label="{esc(title)}" '
             f'viewBox="0 0 {width} {height}" width="100%" xmlns="http://www.w3.org/2000/svg">']
    for i, (label, value, colour) in enumerate(rows):
        y = 4 + i * row_h
        w = value / top * (width - label_w - 90)
        parts.append(f'<g class="bar"><title>{esc(label)}: {fmt_num(value)}</title>'
                     f'<text x="{label_w - 6}" y="{y + 15}" text-anchor="end">{esc(label)}</text>'
                     f'<rect x="{label_w}" y="{y + 3}" width="{max(w, 1):.1f}" height="{row_h - 6}" fill="{colour}"/>'
                     f'<text x="{label_w + w + 6:.1f}" y="{y + 15}">{fmt_num(value)}</text></g>')
    parts.append("</svg>")
    return "".join(parts)
