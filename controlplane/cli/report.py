"""`ctl report`: a self-contained HTML page of a controller's state — decision timelines per pool and engine
(inline SVG drawn from the decision history, with labelled axes for N and k), each pool's TTFT and TPOT
quantiles on the same time axis (`cli.report_latency`: sampled from the explain views while the report is
taken; the history carries no latencies), the engines, the overrides in force, the explain view per pool and
the recent audit.

Each pool gets one explain table: the terms every engine of the pool shares (the pool's fit: p0, η, μ_L, …),
followed by one table of the terms that differ between its engines (N_obs, the crossover's LHS, the mode, …),
one row per engine, so a pool of a hundred engines is not a hundred copies of one table.

The page references nothing outside itself (no scripts, fonts or styles from the network) and needs no
JavaScript. Element classes the tests and other tools may rely on: `section.pool[data-pool]`,
`svg.timeline[data-engine-id][data-pool]`, `rect.mode-band.mode-<mode>`, `circle.decision[data-version]
[data-mode][data-k][data-n][data-decided-at-s]`, `polyline.n-line` (on the left axis), `polyline.k-line` (on
the right axis), `g.axis.axis-n[data-max]` and `g.axis.axis-k[data-max]` with `text.tick[data-value]`,
`table.explain[data-pool]` (`tr[data-term]`), `table.explain-engines[data-pool]` (`th[data-term]`,
`tr[data-engine-id]`), `table.overrides`, `table.audit`, and those `cli.report_latency` lists. Pure: takes
plain data (the `ctl -o json` schema of `controlplane.cli.output`) and returns text; the caller writes the file.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from controlplane.cli.explain import explain_rows
from controlplane.cli.output import cell_text, iso_utc, pool_text
from controlplane.cli.report_latency import LEFT_PX, RIGHT_PX, WIDTH_PX, latency_section

MODE_COLOURS = {"mb": "#4e79a7", "eb": "#f28e2b", "passthrough": "#9d9d9d", "unspecified": "#d0d0d0"}
_WIDTH, _HEIGHT = WIDTH_PX, 150  # the time axis is the latency timelines' (`cli.report_latency`)
_LEFT, _RIGHT, _TOP, _BOTTOM = LEFT_PX, RIGHT_PX, 14, 26

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.2em; margin-top: 1.6em; } h3 { font-size: 1em; margin: 1em 0 .3em; }
table { border-collapse: collapse; margin: .4em 0 1em; font-size: .85em; }
th, td { border-bottom: 1px solid #ddd; padding: .2em .8em .2em 0; text-align: left; vertical-align: top; }
th { font-weight: 600; }
svg.timeline, svg.latency { display: block; background: #fafafa; border: 1px solid #e5e5e5; }
svg text { font-size: 10px; fill: #444; }
.legend span { display: inline-block; margin-right: 1.2em; font-size: .85em; }
.legend i { display: inline-block; width: 1em; height: .8em; margin-right: .3em; vertical-align: middle; }
.muted { color: #777; font-size: .85em; }
caption { text-align: left; }
"""


def _e(value: Any) -> str:
    return html.escape(cell_text(value), quote=True)


def _table(columns: Sequence[str], rows: Sequence[Sequence[Any]], *, css_class: str, attrs: str = "") -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    if not rows:
        body = f'<tr><td colspan="{len(columns)}" class="muted">none</td></tr>'
    return f'<table class="{css_class}"{attrs}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _ticks(maximum: int) -> list[int]:
    """0, the middle and the top of an axis of requests (distinct, ascending)."""
    return sorted({0, round(maximum / 2), maximum})


def _axis(kind: str, maximum: int, *, x: float, anchor: str, y: Any) -> str:
    """A vertical axis at `x` of 0..`maximum` requests: its line, a tick and label per value, its title."""
    dx = -4 if anchor == "end" else 4
    ticks = "".join(
        f'<line x1="{x:.2f}" y1="{y(v):.2f}" x2="{x - dx / 2:.2f}" y2="{y(v):.2f}" stroke="#999"/>'
        f'<text class="tick" data-value="{v}" x="{x + dx:.2f}" y="{y(v) + 3:.2f}" text-anchor="{anchor}">{v}</text>'
        for v in _ticks(maximum))
    # The title above the plot, running inwards from the axis.
    title = "N, solid (requests)" if kind == "n" else "k, dashed (requests)"
    inwards = "start" if anchor == "end" else "end"
    return (f'<g class="axis axis-{kind}" data-max="{maximum}">'
            f'<line x1="{x:.2f}" y1="{_TOP}" x2="{x:.2f}" y2="{_HEIGHT - _BOTTOM}" stroke="#999"/>{ticks}'
            f'<text class="axis-title" x="{x:.2f}" y="{_TOP - 4}" text-anchor="{inwards}">{title}</text></g>')


def timeline_svg(engine_id: str, pool_key: str, entries: Sequence[dict[str, Any]], *, start_s: float,
                 end_s: float, max_n: int, max_k: int = 0) -> str:
    """One engine's decisions over [start_s, end_s] (Unix seconds) as an SVG: a band per decision coloured
    by its mode (each holds until the next), N (solid, left axis 0..max_n requests) and k (dashed, right axis
    0..max_k requests; 0: max_n) as step lines, and a marker per decision with its details as a tooltip.
    `entries` are sorted by decided_at_s."""
    span_s = max(end_s - start_s, 1e-9)
    plot_w, plot_h = _WIDTH - _LEFT - _RIGHT, _HEIGHT - _TOP - _BOTTOM
    scale_n = max(max_n, 1)
    scale_k = max(max_k, 1) if max_k else scale_n

    def x(t: float) -> float:
        return _LEFT + (min(max(t, start_s), end_s) - start_s) / span_s * plot_w

    def y(requests: float, scale: int = scale_n) -> float:
        return _TOP + plot_h - requests / scale * plot_h

    def y_k(requests: float) -> float:
        return y(requests, scale_k)

    bands, markers, n_points, k_points = [], [], [], []
    for i, entry in enumerate(entries):
        decision = entry["decision"]
        t = entry["decided_at_s"]
        t_next = entries[i + 1]["decided_at_s"] if i + 1 < len(entries) else end_s
        mode = decision["mode"]
        colour = MODE_COLOURS.get(mode, MODE_COLOURS["unspecified"])
        x0, x1 = x(t), x(t_next)
        tip = (f"v{decision['version']} {mode.upper()} k={decision['k']} N={decision['n']} "
               f"reason {decision['reason']} at {iso_utc(t)}")
        bands.append(f'<rect class="mode-band mode-{_e(mode)}" x="{x0:.2f}" y="{_TOP}" width="{max(x1 - x0, 0.5):.2f}" '
                     f'height="{plot_h}" fill="{colour}" fill-opacity="0.35"><title>{_e(tip)}</title></rect>')
        n_points += [f"{x0:.2f},{y(decision['n']):.2f}", f"{x1:.2f},{y(decision['n']):.2f}"]
        k_points += [f"{x0:.2f},{y_k(decision['k']):.2f}", f"{x1:.2f},{y_k(decision['k']):.2f}"]
        markers.append(
            f'<circle class="decision" cx="{x0:.2f}" cy="{y(decision["n"]):.2f}" r="3" fill="{colour}" '
            f'stroke="#333" stroke-width="0.6" data-version="{decision["version"]}" data-mode="{_e(mode)}" '
            f'data-k="{decision["k"]}" data-n="{decision["n"]}" data-decided-at-s="{t!r}">'
            f'<title>{_e(tip)}</title></circle>')
    axis = (f'<line x1="{_LEFT}" y1="{_TOP + plot_h}" x2="{_LEFT + plot_w}" y2="{_TOP + plot_h}" stroke="#999"/>'
            + _axis("n", scale_n, x=_LEFT, anchor="end", y=y)
            + _axis("k", scale_k, x=_LEFT + plot_w, anchor="start", y=y_k)
            + f'<text x="{_LEFT}" y="{_HEIGHT - 8}">{_e(iso_utc(start_s))}</text>'
            f'<text x="{_LEFT + plot_w}" y="{_HEIGHT - 8}" text-anchor="end">{_e(iso_utc(end_s))}</text>')
    lines = ""
    if n_points:
        lines = (f'<polyline class="n-line" points="{" ".join(n_points)}" fill="none" stroke="#222" '
                 f'stroke-width="1.4"/>'
                 f'<polyline class="k-line" points="{" ".join(k_points)}" fill="none" stroke="#222" '
                 f'stroke-width="1" stroke-dasharray="4 3"/>')
    return (f'<svg class="timeline" data-engine-id="{html.escape(engine_id, quote=True)}" '
            f'data-pool="{html.escape(pool_key, quote=True)}" width="{_WIDTH}" height="{_HEIGHT}" '
            f'viewBox="0 0 {_WIDTH} {_HEIGHT}" role="img" aria-label="decisions of {html.escape(engine_id)}">'
            f'{"".join(bands)}{axis}{lines}{"".join(markers)}</svg>')


def _explain_cells(data: dict[str, Any]) -> list[tuple[str, Any, str, str]]:
    """`explain_rows` with the mode row's k, N and reason in its value (they are the engine's)."""
    rows = []
    for symbol, value, unit, meaning in explain_rows(data):
        if symbol == "mode":
            value, meaning = f"{value} k={data['k']} N={data['n']}, reason {data['reason']}", "in force"
        rows.append((symbol, value, unit, meaning))
    return rows


def split_explains(explains: Sequence[dict[str, Any]]) -> tuple[list[tuple[str, Any, str, str]],
                                                                 list[tuple[str, str, str]],
                                                                 dict[str, list[Any]]]:
    """The explain views of one pool's engines, split: the rows every engine shares (same value), the terms
    whose value differs between them (symbol, unit, meaning) and each engine's values of those terms (None
    where an engine's view lacks the term). One engine: every row is shared."""
    cells = {data["engine_id"]: {row[0]: row for row in _explain_cells(data)} for data in explains}
    symbols: list[str] = []
    for rows in cells.values():
        symbols += [symbol for symbol in rows if symbol not in symbols]
    shared, differing = [], []
    for symbol in symbols:
        values = [rows.get(symbol) for rows in cells.values()]
        if all(v is not None for v in values) and len({(cell_text(v[1]), v[3]) for v in values}) == 1:
            shared.append(values[0])
        else:
            _, _, unit, meaning = next(v for v in values if v is not None)
            differing.append((symbol, unit, meaning))
    per_engine = {engine_id: [rows[symbol][1] if symbol in rows else None for symbol, _, _ in differing]
                  for engine_id, rows in cells.items()}
    return shared, differing, per_engine


def _pool_explain(pool_key: str, explains: Sequence[dict[str, Any]]) -> str:
    """The pool's explain table (the shared terms) and its per-engine table (the terms that differ)."""
    if not explains:
        return ""
    shared, differing, per_engine = split_explains(explains)
    pool_attr = html.escape(pool_key, quote=True)
    body = "".join(f'<tr data-term="{_e(symbol)}"><td>{_e(symbol)}</td><td>{_e(value)}</td><td>{_e(unit)}</td>'
                   f"<td>{_e(meaning)}</td></tr>" for symbol, value, unit, meaning in shared)
    parts = [f'<h3>Explain <span class="muted">the same for all {len(explains)} engines of the pool'
             f'{"; the terms that differ follow" if differing else ""}</span></h3>',
             f'<table class="explain" data-pool="{pool_attr}"><thead><tr><th>term</th><th>value</th><th>unit</th>'
             f"<th>meaning</th></tr></thead><tbody>{body}</tbody></table>"]
    if differing:
        head = "".join(f'<th data-term="{_e(symbol)}" title="{_e(meaning)}">{_e(symbol)}'
                       f'{f" ({_e(unit)})" if unit else ""}</th>' for symbol, unit, meaning in differing)
        rows = "".join(f'<tr data-engine-id="{html.escape(engine_id, quote=True)}"><td>{html.escape(engine_id)}</td>'
                       + "".join(f"<td>{_e(value)}</td>" for value in values) + "</tr>"
                       for engine_id, values in sorted(per_engine.items()))
        parts.append(f'<table class="explain-engines" data-pool="{pool_attr}"><thead><tr><th>engine</th>{head}'
                     f"</tr></thead><tbody>{rows}</tbody></table>")
    return "".join(parts)


def render_report(*, generated_at_s: float, address: str, engines: Sequence[dict[str, Any]],
                  history: Sequence[dict[str, Any]], overrides: Sequence[dict[str, Any]],
                  explains: Sequence[dict[str, Any]], audit: Sequence[dict[str, Any]],
                  latency_samples: Sequence[dict[str, Any]] = ()) -> str:
    """The report page.

    Args:
        generated_at_s: Unix seconds of the report (the timelines end there).
        address: the controller's address, for the heading.
        engines: `ctl list -o json` rows.
        history: HistoryEntry dicts (engine_id, pool, decided_at_s, decision), any order.
        overrides: OverrideRecord dicts in force.
        explains: `explain()` dicts, one per engine with a decision.
        audit: AuditEntry dicts, newest first.
        latency_samples: `report_latency.pool_samples` dicts, any order; a pool's timelines span its samples
            too (a pool with samples and no decision gets its latency section alone).
    """
    by_pool: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for entry in history:
        if entry.get("decision") is not None:
            by_pool[pool_text(entry.get("pool"))][entry["engine_id"]].append(entry)
    for engine in engines:  # engines without history still get a (empty) timeline
        by_pool[pool_text(engine.get("pool"))].setdefault(engine["engine_id"], [])
    samples_by_pool: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sample in latency_samples:
        samples_by_pool[pool_text(sample["pool"])].append(sample)
    explain_by_engine = {x["engine_id"]: x for x in explains}
    sections = []
    for pool_key in sorted(set(by_pool) | set(samples_by_pool)):  # a pool known by its samples alone too
        pool_engines = by_pool[pool_key]
        times = [e["decided_at_s"] for entries in pool_engines.values() for e in entries]
        times += [sample["at_s"] for sample in samples_by_pool[pool_key]]
        start_s = min(times) if times else generated_at_s
        end_s = max([generated_at_s, *times])
        max_n = max([e["decision"]["n"] for entries in pool_engines.values() for e in entries] or [1])
        max_k = max([e["decision"]["k"] for entries in pool_engines.values() for e in entries] or [1])
        parts = [f'<section class="pool" data-pool="{html.escape(pool_key, quote=True)}">'
                 f"<h2>Pool {html.escape(pool_key)}</h2>"]
        for engine_id in sorted(pool_engines):
            entries = sorted(pool_engines[engine_id], key=lambda e: (e["decided_at_s"], e["decision"]["version"]))
            parts.append(f"<h3>{html.escape(engine_id)} <span class=\"muted\">{len(entries)} decisions</span></h3>")
            parts.append(timeline_svg(engine_id, pool_key, entries, start_s=start_s, end_s=end_s, max_n=max_n,
                                      max_k=max_k))
        parts.append(latency_section(pool_key, samples_by_pool[pool_key], start_s=start_s, end_s=end_s))
        parts.append(_pool_explain(pool_key, [explain_by_engine[e] for e in sorted(pool_engines)
                                              if e in explain_by_engine]))
        parts.append("</section>")
        sections.append("".join(parts))
    legend = "".join(f'<span><i style="background:{colour}"></i>{mode.upper()}</span>'
                     for mode, colour in MODE_COLOURS.items())
    engine_rows = [(e["engine_id"], pool_text(e.get("pool")), e.get("connected"), e.get("mode"), e.get("k"),
                    e.get("n"), e.get("decision_version"), e.get("acked_version"), e.get("telemetry_age_s"))
                   for e in engines]
    override_rows = [(o["scope"], o["kind"], _override_value(o), o.get("expires_at") or "never", o.get("set_by"),
                      o.get("set_at"), o.get("reason")) for o in overrides]
    audit_rows = [(a.get("at"), a.get("actor"), a.get("action"), a.get("kind"), a.get("target"), a.get("reason"))
                  for a in audit]
    return (
        '<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
        f"<title>controlplane report {html.escape(address)}</title><style>{_STYLE}</style></head><body>"
        f"<h1>Controller {html.escape(address)}</h1>"
        f'<p class="muted">generated {_e(iso_utc(generated_at_s))}; {len(history)} decisions from the history '
        f"stream; bands: the mode of each decision until the next; solid line N (left axis), dashed line k "
        f"(right axis), both in requests. Latency: each pool's TTFT and TPOT quantiles over the minute before each "
        f"sample, on the same time axis ({len(latency_samples)} pool samples).</p>"
        f'<div class="legend">{legend}</div>'
        "<h2>Engines</h2>"
        + _table(("engine", "pool", "connected", "mode", "k", "N", "version", "acked", "telemetry age (s)"),
                 engine_rows, css_class="engines")
        + "<h2>Overrides in force</h2>"
        + _table(("scope", "kind", "value", "expires", "set by", "set at", "reason"), override_rows,
                 css_class="overrides")
        + "".join(sections)
        + "<h2>Audit (newest first)</h2>"
        + _table(("at", "actor", "action", "kind", "target", "reason"), audit_rows, css_class="audit")
        + "</body></html>\n"
    )


def _override_value(record: dict[str, Any]) -> str:
    if record["kind"] == "delta":
        return f"δ = {record['delta_s_per_token']:.6g} s/token"
    if record["kind"] == "objective":
        o = record.get("objective") or {}
        return ", ".join(f"{name.upper()} p{100 * o[f'{name}_quantile']:g} ≤ {o[f'{name}_target_s']:g} s"
                         for name in ("ttft", "tpot") if o.get(f"{name}_quantile"))
    parts = [record["mode"]]
    if record.get("k"):
        parts.append(f"k={record['k']}")
    if record.get("n"):
        parts.append(f"N={record['n']}")
    return " ".join(parts)
