"""The run report as ONE self-contained HTML file (issue 26): inline CSS, inline SVG charts and one small inline
script, no network at view time. A Content-Security-Policy in the document itself forbids every fetch
(``default-src 'none'``; the script is allowed by its hash), so even a name or error text that slipped past the
escaping could load nothing.

Sections, in order: the narration; the score with its 95 % interval and the counters; the outcome heatmap (one cell
per task, in index order, coloured by the post-aggregation outcome, §12); the per-group bars with their intervals;
latency and cost distributions; the top failure reasons; the Driver's decisions; the receipt. Elements carry ids
and ``data-*`` values (``#pass-rate[data-value]``, ``#count-passed[data-value]``...) so the numbers can be read
back exactly (the browser test compares them with the API's).
"""

from __future__ import annotations

import base64
import hashlib
import html
import json
import math
from collections.abc import Sequence
from typing import Any

from benchwright.report.facts import ReportFacts
from benchwright.schemas import GroupResult

__all__ = ["render_html"]

COLOURS = {"pass": "#2f9e5b", "fail": "#e3b21c", "err": "#d64545", "running": "#2aa3a3", "none": "#d9dde3"}
HEAT_COLUMNS = 50
HEAT_CELL = 12
BINS = 20


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f} %"


def _ci(ci: Sequence[float] | None) -> str:
    return "" if ci is None else f"{ci[0] * 100:.1f}–{ci[1] * 100:.1f} %"


def _usd(value: float) -> str:
    return f"${value:.6f}" if 0 < value < 0.01 else f"${value:.4f}"


CSS = """
:root{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2330;background:#f5f6f8}
body{margin:0;padding:24px;max-width:1100px;margin:auto}
h1{font-size:22px;margin:0 0 4px}h2{font-size:16px;margin:0 0 12px}
.sub{color:#5b6475;font-size:13px}
.card{background:#fff;border:1px solid #e1e4ea;border-radius:8px;padding:16px 20px;margin:16px 0}
.narration{font-size:15px;line-height:1.55}
.hero{display:flex;gap:32px;align-items:center;flex-wrap:wrap}
.big{font-size:40px;font-weight:600}
.counters{display:flex;gap:12px;flex-wrap:wrap}
.counter{border:1px solid #e1e4ea;border-radius:6px;padding:8px 12px;min-width:84px}
.counter b{display:block;font-size:20px}.counter span{font-size:12px;color:#5b6475}
table{border-collapse:collapse;width:100%;font-size:13px}
td,th{border-bottom:1px solid #eef0f3;padding:5px 8px;text-align:left;vertical-align:top}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.legend i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:4px;vertical-align:middle}
.phase{display:inline-block;background:#eef1f6;border-radius:4px;padding:0 6px;font-size:12px;margin-right:6px}
.kind{color:#5b6475;font-size:12px;margin-right:6px}
ol.decisions{padding-left:20px;font-size:13px;line-height:1.5}
ol.decisions li.more{display:none}ol.decisions.open li.more{display:list-item}
dl.receipt{display:grid;grid-template-columns:max-content 1fr;gap:4px 16px;font-size:13px;margin:0}
dl.receipt dt{color:#5b6475}dl.receipt dd{margin:0;font-family:ui-monospace,monospace;word-break:break-all}
#tip{position:fixed;pointer-events:none;background:#1d2330;color:#fff;font-size:12px;padding:4px 8px;
border-radius:4px;display:none}
button{font:inherit;font-size:13px;border:1px solid #c9ced8;background:#fff;border-radius:4px;padding:3px 10px;
cursor:pointer}
svg text{font-size:11px;fill:#3b4354}
"""

SCRIPT = """
(function(){
  var data=JSON.parse(document.getElementById('task-data').textContent);
  var svg=document.getElementById('heatmap'),tip=document.getElementById('tip');
  if(svg){
    svg.addEventListener('mousemove',function(ev){
      var box=svg.getBoundingClientRect(),cols=data.columns,cell=box.width/cols;
      var i=Math.floor((ev.clientY-box.top)/cell)*cols+Math.floor((ev.clientX-box.left)/cell);
      var t=data.tasks[i];
      if(!t){tip.style.display='none';return;}
      tip.textContent='task '+t[0]+': '+t[1]+(t[2]?' (no answer)':'')+(t[3]!==null?', '+t[3]+' ms':'')+
        ', $'+t[4].toFixed(6);
      tip.style.left=(ev.clientX+12)+'px';tip.style.top=(ev.clientY+12)+'px';tip.style.display='block';
    });
    svg.addEventListener('mouseleave',function(){tip.style.display='none';});
  }
  var more=document.getElementById('decisions-more');
  if(more){more.addEventListener('click',function(){
    var list=document.getElementById('decisions');list.classList.toggle('open');
    more.textContent=list.classList.contains('open')?'Show fewer':'Show all';
  });}
})();
"""
SCRIPT_HASH = base64.b64encode(hashlib.sha256(SCRIPT.encode()).digest()).decode()
CSP = (f"default-src 'none'; style-src 'unsafe-inline'; script-src 'sha256-{SCRIPT_HASH}'; img-src data:; "
       "base-uri 'none'; form-action 'none'")


def _json_for_script(value: Any) -> str:
    """JSON that cannot close its <script> element (every '<', '>' and '&' escaped)."""
    return (json.dumps(value, separators=(",", ":"), ensure_ascii=False)
            .replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026"))


def _counter(key: str, label: str, value: int) -> str:
    return (f'<div class="counter" id="count-{key}" data-value="{value}"><b>{value}</b>'
            f'<span>{_e(label)}</span></div>')


def _hero(facts: ReportFacts) -> str:
    s = facts.view.tasks.summary
    rate = "" if s.pass_rate is None else repr(s.pass_rate)
    ci = s.pass_rate_ci
    bar = ""
    if s.pass_rate is not None:
        whisker = ""
        if ci is not None:
            whisker = (f'<line x1="{ci[0] * 300:.2f}" x2="{ci[1] * 300:.2f}" y1="9" y2="9" stroke="#1d2330" '
                       f'stroke-width="2"/><line x1="{ci[0] * 300:.2f}" x2="{ci[0] * 300:.2f}" y1="4" y2="14" '
                       f'stroke="#1d2330"/><line x1="{ci[1] * 300:.2f}" x2="{ci[1] * 300:.2f}" y1="4" y2="14" '
                       'stroke="#1d2330"/>')
        bar = (f'<svg width="300" height="18" role="img" aria-label="pass rate with its 95 % interval">'
               f'<rect width="300" height="18" fill="#eef0f3"/><rect width="{s.pass_rate * 300:.2f}" height="18" '
               f'fill="{COLOURS["pass"]}"/>{whisker}</svg>')
    counters = "".join([
        _counter("passed", "passed", s.passed), _counter("failed", "failed", s.failed),
        _counter("errored", "errored", s.errored), _counter("no_answer", "no answer (of failed)", s.no_answer),
        _counter("total", "tasks", s.total)])
    ci_attr = "" if ci is None else f' data-low="{ci[0]!r}" data-high="{ci[1]!r}"'
    return (f'<section class="card hero"><div><div class="sub">pass rate (passed / scored; errors excluded)</div>'
            f'<div class="big" id="pass-rate" data-value="{rate}"{ci_attr}>{_pct(s.pass_rate)}</div>'
            f'<div class="sub" id="pass-rate-ci">95 % CI {_ci(ci) or "n/a"}'
            f'{"" if s.pass_rate_se is None else f" · SE {s.pass_rate_se * 100:.1f} points"}</div>{bar}</div>'
            f'<div class="counters">{counters}</div></section>')


def _heatmap(facts: ReportFacts) -> str:
    total = max(facts.view.tasks.summary.total, max((t.index for t in facts.tasks), default=-1) + 1)
    if total == 0:
        return '<section class="card"><h2>Outcomes</h2><p class="sub">No tasks.</p></section>'
    outcome = ["none"] * total
    for t in facts.tasks:
        if 0 <= t.index < total:
            outcome[t.index] = t.outcome if t.outcome in COLOURS else "none"
    cols = min(HEAT_COLUMNS, total)
    rows = math.ceil(total / cols)
    rects: list[str] = []
    for r in range(rows):  # one rect per run of equal outcomes in a row: a 10,000-task run stays small
        c = 0
        while c < cols and r * cols + c < total:
            start, kind = c, outcome[r * cols + c]
            while c < cols and r * cols + c < total and outcome[r * cols + c] == kind:
                c += 1
            rects.append(f'<rect x="{start * HEAT_CELL}" y="{r * HEAT_CELL}" width="{(c - start) * HEAT_CELL - 1}" '
                         f'height="{HEAT_CELL - 1}" fill="{COLOURS[kind]}" class="o-{kind}"/>')
    legend = "".join(f'<span><i style="background:{COLOURS[k]}"></i>{label}</span>' for k, label in (
        ("pass", "Passed"), ("fail", "Failed"), ("err", "Errored"), ("none", "Not settled")))
    return (f'<section class="card"><h2>Outcomes by task</h2><div class="legend">{legend}</div>'
            f'<svg id="heatmap" data-tasks="{total}" width="{cols * HEAT_CELL}" height="{rows * HEAT_CELL}" '
            f'viewBox="0 0 {cols * HEAT_CELL} {rows * HEAT_CELL}" role="img" aria-label="outcome of each task">'
            f'{"".join(rects)}</svg></section>')


def _group_row(g: GroupResult, y: int) -> str:
    width, x0 = 360, 230
    label = g.group if len(g.group) <= 32 else g.group[:31] + "…"
    rate = "" if g.pass_rate is None else repr(g.pass_rate)
    parts = [f'<g class="group" data-group="{_e(g.group)}" data-pass-rate="{rate}" data-total="{g.total}">'
             f'<title>{_e(g.group)}</title>',
             f'<text x="0" y="{y + 12}">{_e(label)}</text>',
             f'<rect x="{x0}" y="{y}" width="{width}" height="16" fill="#eef0f3"/>']
    if g.pass_rate is not None:
        parts.append(f'<rect x="{x0}" y="{y}" width="{g.pass_rate * width:.2f}" height="16" fill="{COLOURS["pass"]}"/>')
    if g.pass_rate_ci is not None:
        lo, hi = (x0 + v * width for v in g.pass_rate_ci)
        parts.append(f'<line x1="{lo:.2f}" x2="{hi:.2f}" y1="{y + 8}" y2="{y + 8}" stroke="#1d2330" stroke-width="2"/>'
                     f'<line x1="{lo:.2f}" x2="{lo:.2f}" y1="{y + 3}" y2="{y + 13}" stroke="#1d2330"/>'
                     f'<line x1="{hi:.2f}" x2="{hi:.2f}" y1="{y + 3}" y2="{y + 13}" stroke="#1d2330"/>')
    text = f"{_pct(g.pass_rate)}" + (f" [{_ci(g.pass_rate_ci)}]" if g.pass_rate_ci else "") + f" n={g.total}"
    if g.errored:
        text += f", {g.errored} err"
    parts.append(f'<text x="{x0 + width + 8}" y="{y + 12}">{_e(text)}</text></g>')
    return "".join(parts)


def _groups(facts: ReportFacts) -> str:
    b = facts.breakdown
    if b is None or not b.groups:
        return ('<section class="card"><h2>Results by group</h2><p class="sub">The run\'s data has no grouping '
                'column (name one with the launch\'s <code>group_by</code>).</p></section>')
    rows = "".join(_group_row(g, i * 22) for i, g in enumerate(b.groups))
    folded = f'<p class="sub">{b.folded} smaller groups are folded into (other).</p>' if b.folded else ""
    return (f'<section class="card"><h2>Results by {_e(b.by)} (pass rate, 95 % interval)</h2>'
            f'<svg id="groups" data-by="{_e(b.by)}" width="860" height="{len(b.groups) * 22}" role="img" '
            f'aria-label="pass rate per group">{rows}</svg>{folded}</section>')


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def _histogram(svg_id: str, values: list[float], fmt: str) -> str:
    if not values:
        return '<p class="sub">Not recorded for this run.</p>'
    low, high = min(values), max(values)
    span = high - low
    counts = [0] * BINS
    for v in values:
        counts[min(BINS - 1, int((v - low) / span * BINS)) if span else 0] += 1
    peak = max(counts)
    width, height, bar = 600, 120, 600 / BINS
    rects = "".join(
        f'<rect x="{i * bar + 1:.1f}" y="{height - c / peak * height:.1f}" width="{bar - 2:.1f}" '
        f'height="{c / peak * height:.1f}" fill="#5b7bd5"><title>{c}</title></rect>'
        for i, c in enumerate(counts) if c)
    stats = (f"n={len(values)} · min {fmt.format(low)} · median {fmt.format(_quantile(values, 0.5))} · "
             f"p90 {fmt.format(_quantile(values, 0.9))} · max {fmt.format(high)}")
    return (f'<svg id="{svg_id}" width="{width}" height="{height + 16}" role="img" data-n="{len(values)}">{rects}'
            f'<text x="0" y="{height + 13}">{_e(fmt.format(low))}</text>'
            f'<text x="{width}" y="{height + 13}" text-anchor="end">{_e(fmt.format(high))}</text></svg>'
            f'<p class="sub">{_e(stats)}</p>')


def _distributions(facts: ReportFacts) -> str:
    latency = [float(t.latency_ms) for t in facts.tasks if t.latency_ms is not None]
    cost = [t.cost_usd for t in facts.tasks]
    c = facts.view.cost
    sources = "".join(
        f'<tr data-cost="{k}"><td>{label}</td><td class="num">{_usd(getattr(c, k))}</td></tr>' for k, label in (
            ("model", "Model (SUT)"), ("driver", "Driver"), ("sandbox", "Sandbox"), ("narration", "Narration"),
            ("incurred", "Incurred"), ("billed", "Billed (platform share, with markup)")))
    return (f'<section class="card"><h2>Latency per task (ms, slowest trial)</h2>'
            f'{_histogram("latency", latency, "{:.0f} ms")}</section>'
            f'<section class="card"><h2>Cost</h2><table id="cost"><tbody>{sources}</tbody></table>'
            f'<h2 style="margin-top:14px">Model cost per task</h2>{_histogram("cost-hist", cost, "${:.6f}")}</section>')


def _failures(facts: ReportFacts) -> str:
    if not facts.failures:
        return ('<section class="card"><h2>Top failure reasons</h2><p class="sub">No errors and no missing answers.'
                '</p></section>')
    rows = "".join(f'<tr><td>{_e(reason)}</td><td class="num">{n}</td></tr>' for reason, n in facts.failures)
    return (f'<section class="card"><h2>Top failure reasons</h2><table id="failures"><thead><tr><th>reason</th>'
            f'<th class="num">tasks</th></tr></thead><tbody>{rows}</tbody></table></section>')


def _decisions(facts: ReportFacts) -> str:
    if not facts.decisions:
        return '<section class="card"><h2>The Driver\'s decisions</h2><p class="sub">None recorded.</p></section>'
    shown = 40
    more = ' class="more"'
    items = "".join(
        f'<li{more if i >= shown else ""} data-seq="{d.seq}">'
        f'{f"<span class=phase>{_e(d.phase)}</span>" if d.phase else ""}<span class="kind">{_e(d.kind)}</span>'
        f'{_e(d.text)}</li>' for i, d in enumerate(facts.decisions))
    button = '<button id="decisions-more" type="button">Show all</button>' if len(facts.decisions) > shown else ""
    omitted = (f'<p class="sub">{facts.decisions_omitted} later entries are in the run\'s event log.</p>'
               if facts.decisions_omitted else "")
    return (f'<section class="card"><h2>The Driver\'s decisions</h2><ol class="decisions" id="decisions">{items}</ol>'
            f'{button}{omitted}</section>')


def _receipt(facts: ReportFacts) -> str:
    rows = []
    for key, value in facts.receipt.items():
        shown = json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else value
        rows.append(f'<dt>{_e(key)}</dt><dd data-key="{_e(key)}">{_e("—" if shown is None else shown)}</dd>')
    return f'<section class="card"><h2>Receipt</h2><dl class="receipt" id="receipt">{"".join(rows)}</dl></section>'


def render_html(facts: ReportFacts) -> bytes:
    """The report document (module docstring)."""
    view = facts.view
    model = str(view.model.get("identifier", ""))
    task_data = {"columns": min(HEAT_COLUMNS, max(view.tasks.summary.total, len(facts.tasks), 1)),
                 "tasks": _task_rows(facts)}
    body = "".join([
        f'<header><h1>Run report: {_e(model)}</h1><div class="sub">run <code>{_e(view.id)}</code> · '
        f'<span id="display-status">{_e(view.display_status)}</span> · {_e(view.created_at.isoformat())}</div>'
        '</header>',
        f'<section class="card"><h2>Summary</h2><p class="narration" id="narration" '
        f'data-narrator="{_e(facts.narrator)}">{_e(facts.narration)}</p></section>',
        _hero(facts), _heatmap(facts), _groups(facts), _distributions(facts), _failures(facts), _decisions(facts),
        _receipt(facts), '<div id="tip"></div>',
        f'<script type="application/json" id="task-data">{_json_for_script(task_data)}</script>',
        f"<script>{SCRIPT}</script>"])
    doc = (f'<!doctype html><html lang="en"><head><meta charset="utf-8">'
           f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
           f'<meta name="viewport" content="width=device-width,initial-scale=1"><link rel="icon" href="data:,">'
           f'<title>Benchwright report · {_e(model)} · {_e(view.id)}</title><style>{CSS}</style></head>'
           f'<body>{body}</body></html>')
    return doc.encode()


def _task_rows(facts: ReportFacts) -> list[list[Any] | None]:
    """Per task index: [index, outcome, no_answer, latency_ms, cost_usd] (None where unsettled)."""
    total = max(facts.view.tasks.summary.total, max((t.index for t in facts.tasks), default=-1) + 1)
    rows: list[list[Any] | None] = [None] * total
    for t in facts.tasks:
        if 0 <= t.index < total:
            rows[t.index] = [t.index, t.outcome, t.no_answer, t.latency_ms, round(t.cost_usd, 9)]
    return rows
