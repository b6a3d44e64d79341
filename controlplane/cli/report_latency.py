"""`ctl report`'s latency timelines: each pool's TTFT and TPOT quantiles over the report's time range, drawn on
the decision timelines' time axis, with the newest quantiles as a table.

Where the figures come from: the controller keeps a pool's latencies as sketches over its last 60 seconds
(`loop.outcomes.OUTCOME_WINDOW_S`) and answers their quantiles (p50, p90, p99, mean; relative error ≤ 1%) in
each engine's explain view (`GetDecision`'s `outcomes`). It also records that view of each pool every
`latency_history_interval_s` (10 s by default) while the pool's engines report latencies, and keeps it
`latency_history_s` (`ListLatencyHistory`). A sample is the quantiles of the window ending at its time, from
one of two sources (`data-source` on its marker):
- "recorded": the controller's record, read back over the last `ctl report --latency-history-s S` seconds
  (3600 by default; 0 reads none), so the timeline covers the past as well;
- "read": the views read while the report is taken: `--latency-samples N --latency-every-s S` reads N
  samples S seconds apart, the last when the page is written (N = 1, the default: the quantiles now).

A pool's sample is read from the first of its engines (by id) decided from the pool's statistics: an engine
that serves a distinct workload is decided from its own, and its view shows those (its flags then hold
OWN_STATISTICS_FLAG).

Element classes: `section.latency[data-pool]`, `svg.latency[data-pool][data-kind=ttft|tpot][data-unit]`,
`g.axis.axis-latency[data-max-s]` with `text.tick[data-value-s]`, `polyline.p50-line` (solid) and
`polyline.p99-line` (dashed), `p.attainment[data-meeting][data-adjusting][data-infeasible][data-judged]`
(`attainment`: how often the samples found the pool's objective met), `circle.sample[data-source][data-at-s]
[data-window-s][data-num-requests][data-p50-s][data-p90-s][data-p99-s][data-mean-s]` (one per sample with data;
the circle stands at p99), `rect.window[data-from-s][data-to-s]` (the newest sample's window),
`line.objective[data-quantile][data-target-s]`, `table.latency[data-pool]` (`tr[data-kind]`).

Pure but for `sample_latencies`, which reads through the function it is given and sleeps between samples, and
`recorded_latencies`, which reads through the function it is given.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import math
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

import grpc

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.cli.args import positive_float
from controlplane.cli.explain import outcomes_dict
from controlplane.cli.output import iso_utc, message_to_dict

# The time axis, shared with the decision timelines (`cli.report` takes its width and margins from here).
WIDTH_PX, LEFT_PX, RIGHT_PX = 960, 56, 56
_HEIGHT, _TOP, _BOTTOM = 130, 14, 26
KINDS = {"ttft": "TTFT, time to first token", "tpot": "TPOT, time per output token after the first"}
OWN_STATISTICS_FLAG = "engine_decided_from_own_statistics"  # set by `service.fleet_view`
MAX_SAMPLE_INTERVAL_S = 3600.0
MAX_RECORDED_SAMPLES = 10_000  # per pool: the most ListLatencyHistory answers


def sample_interval_s(text: str) -> float:
    """`--latency-every-s` (argparse type): seconds in (0, MAX_SAMPLE_INTERVAL_S]."""
    value = positive_float(text)
    if value > MAX_SAMPLE_INTERVAL_S:
        raise argparse.ArgumentTypeError(f"must be ≤ {MAX_SAMPLE_INTERVAL_S:g} s, got {text[:64]}")
    return value


def pool_samples(explains: Sequence[dict[str, Any]], *, at_s: float) -> list[dict[str, Any]]:
    """One sample per pool from the explain views (`cli.explain.explain` dicts) read at `at_s` (Unix seconds):
    pool (the views' pool dict; pools are told apart by all of its fields), at_s, source ("read"), engine_id
    (whose view it is), window_s, ttft / tpot / queue (num_requests, p50_s, p90_s, p99_s, mean_s; None when no
    request of the window reported that latency) and objective (None: none in force)."""
    chosen: dict[str, dict[str, Any]] = {}  # the pool's fields → the view its sample is read from
    for data in sorted(explains, key=lambda d: (OWN_STATISTICS_FLAG in d["flags"], d["engine_id"])):
        chosen.setdefault(repr(sorted((data["pool"] or {}).items())), data)
    return [_sample(data["pool"], at_s, "read", data["engine_id"], data["outcomes"])
            for _, data in sorted(chosen.items())]


def _sample(pool: dict[str, Any], at_s: float, source: str, engine_id: str, outcomes: dict[str, Any]) -> dict[str, Any]:
    """One sample of a pool (the dict `pool_samples` documents) from its outcomes (`explain.outcomes_dict`)."""
    return {"pool": pool, "at_s": at_s, "source": source, "engine_id": engine_id, "window_s": outcomes["window_s"],
            **{kind: outcomes[kind] for kind in ("ttft", "tpot", "queue")}, "objective": outcomes["objective"]}


def recorded_samples(pool: dict[str, Any], samples: Sequence[operator_pb2.LatencySample]) -> list[dict[str, Any]]:
    """A pool's samples recorded by the controller (`ListLatencyHistory`) as `pool_samples` gives them, with
    source "recorded" and no engine_id (the controller recorded the pool's view). `pool`: the pool's dict."""
    return [_sample(pool, sample.at_s, "recorded", "", outcomes_dict(sample.outcomes)) for sample in samples]


async def recorded_latencies(
        read: Callable[[operator_pb2.ListLatencyHistoryRequest], Awaitable[operator_pb2.ListLatencyHistoryResponse]],
        pools: Iterable[common_pb2.Pool], *, since_s: float) -> list[dict[str, Any]]:
    """Every pool's recorded samples since `since_s` (Unix seconds), the newest MAX_RECORDED_SAMPLES of each, as
    `recorded_samples` gives them; `read` calls ListLatencyHistory. One pool at a time (the controller runs a
    caller's two such reads at once). A controller that does not record latencies (an older release:
    UNIMPLEMENTED) or cannot read its record now (UNAVAILABLE) ends the reading, with a line on stderr: the
    pools read before it keep their samples."""
    found: list[dict[str, Any]] = []
    unique = {pool.SerializeToString(deterministic=True): pool for pool in pools}
    for index, (_, pool) in enumerate(sorted(unique.items())):
        try:
            reply = await read(operator_pb2.ListLatencyHistoryRequest(pool=pool, since_s=max(since_s, 0.0),
                                                                      limit=MAX_RECORDED_SAMPLES))
        except grpc.aio.AioRpcError as exc:
            if exc.code() not in (grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.UNAVAILABLE):
                raise
            details = "".join(c for c in " ".join((exc.details() or "").split()) if c.isprintable())[:200]
            print(f"report: no recorded latencies for {len(unique) - index} pool(s) ({exc.code().name}: "
                  f"{details}); drawing those read now", file=sys.stderr, flush=True)
            return found
        found += recorded_samples(message_to_dict(pool), reply.samples)
    return found


async def sample_latencies(read_explains: Callable[[], Awaitable[Sequence[dict[str, Any]]]], *, num_samples: int,
                           every_s: float) -> list[dict[str, Any]]:
    """`num_samples` rounds of `pool_samples`, the first at once, each followed by `every_s` seconds of sleep
    (the caller takes the last sample after the last sleep); a line on stderr per round."""
    samples: list[dict[str, Any]] = []
    for i in range(num_samples):
        samples += pool_samples(await read_explains(), at_s=time.time())
        print(f"report: latency sample {i + 1} of {num_samples + 1} taken; the next in {every_s:g} s",
              file=sys.stderr, flush=True)
        await asyncio.sleep(every_s)
    return samples


def _nice_ceiling_s(value_s: float) -> float:
    """The smallest of 1, 2, 2.5, 5 × 10^k seconds ≥ value_s (1 ms for nothing to show)."""
    if not (math.isfinite(value_s) and value_s > 0.0):
        return 1e-3
    power = 10.0 ** math.floor(math.log10(value_s))
    return next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= value_s * (1 - 1e-12))


def _unit(max_s: float) -> tuple[str, float]:
    """The axis unit for a maximum: (name, factor from seconds)."""
    return ("ms", 1e3) if max_s < 1.0 else ("s", 1.0)


def latency_svg(pool_key: str, kind: str, samples: Sequence[dict[str, Any]], *, start_s: float,
                end_s: float) -> str:
    """One latency of a pool over [start_s, end_s] (Unix seconds, the decision timelines' range): p50 (solid)
    and p99 (dashed) lines through the samples, a marker per sample, the newest sample's window shaded, and
    the objective's target on this latency, if any. The vertical axis runs from 0 to a round value above the
    largest p99 and target, labelled in ms below 1 s, else in s. `samples`: the pool's, oldest first."""
    span_s = max(end_s - start_s, 1e-9)
    plot_w, plot_h = WIDTH_PX - LEFT_PX - RIGHT_PX, _HEIGHT - _TOP - _BOTTOM
    points = [(s, s[kind]) for s in samples if s[kind] is not None and s[kind]["num_requests"] > 0]
    objective = samples[-1]["objective"] if samples else None
    target_s = (objective or {}).get(f"{kind}_target_s") if (objective or {}).get(f"{kind}_quantile") else None
    max_s = _nice_ceiling_s(max([q["p99_s"] for _, q in points] + ([target_s] if target_s else []), default=0.0))
    unit, factor = _unit(max_s)

    def x(t: float) -> float:
        return LEFT_PX + (min(max(t, start_s), end_s) - start_s) / span_s * plot_w

    def y(value_s: float) -> float:
        return _TOP + plot_h - min(value_s, max_s) / max_s * plot_h

    ticks = "".join(
        f'<line x1="{LEFT_PX}" y1="{y(v):.2f}" x2="{LEFT_PX - 2}" y2="{y(v):.2f}" stroke="#999"/>'
        f'<text class="tick" data-value-s="{v!r}" x="{LEFT_PX - 4}" y="{y(v) + 3:.2f}" text-anchor="end">'
        f"{v * factor:.4g}</text>" for v in (0.0, max_s / 2, max_s))
    name = kind.upper()
    parts = [f'<g class="axis axis-latency" data-max-s="{max_s!r}">'
             f'<line x1="{LEFT_PX}" y1="{_TOP}" x2="{LEFT_PX}" y2="{_HEIGHT - _BOTTOM}" stroke="#999"/>{ticks}'
             f'<text class="axis-title" x="{LEFT_PX}" y="{_TOP - 4}">{name} ({unit}): p50 solid, p99 dashed, '
             f"each over the {samples[-1]['window_s'] if samples else 0:.0f} s before its sample</text></g>",
             f'<line x1="{LEFT_PX}" y1="{_TOP + plot_h}" x2="{LEFT_PX + plot_w}" y2="{_TOP + plot_h}" stroke="#999"/>',
             f'<text x="{LEFT_PX}" y="{_HEIGHT - 8}">{html.escape(iso_utc(start_s) or "")}</text>'
             f'<text x="{LEFT_PX + plot_w}" y="{_HEIGHT - 8}" text-anchor="end">'
             f'{html.escape(iso_utc(end_s) or "")}</text>']
    if points:
        newest, _ = points[-1]
        from_s = newest["at_s"] - newest["window_s"]
        parts.insert(0, f'<rect class="window" data-from-s="{from_s!r}" data-to-s="{newest["at_s"]!r}" '
                        f'x="{x(from_s):.2f}" y="{_TOP}" width="{max(x(newest["at_s"]) - x(from_s), 0.5):.2f}" '
                        f'height="{plot_h}" fill="#e8e0f5"><title>the newest quantiles cover these '
                        f'{newest["window_s"]:.0f} s</title></rect>')
    if target_s:
        quantile = objective[f"{kind}_quantile"]
        parts.append(f'<line class="objective" data-quantile="{quantile!r}" data-target-s="{target_s!r}" '
                     f'x1="{LEFT_PX}" y1="{y(target_s):.2f}" x2="{LEFT_PX + plot_w}" y2="{y(target_s):.2f}" '
                     f'stroke="#c0392b" stroke-dasharray="2 2"/>'
                     f'<text x="{LEFT_PX + plot_w - 2}" y="{y(target_s) - 3:.2f}" text-anchor="end" fill="#c0392b">'
                     f"objective p{100 * quantile:g} ≤ {target_s * factor:.4g} {unit}</text>")
    for quantile, dash in (("p50", ""), ("p99", ' stroke-dasharray="4 3"')):
        # Through the samples; one sample: its quantile as a level over the window it covers.
        line = [(s["at_s"], q[f"{quantile}_s"]) for s, q in points]
        if len(points) == 1:
            line.insert(0, (points[0][0]["at_s"] - points[0][0]["window_s"], line[0][1]))
        if line:
            coords = " ".join(f"{x(t):.2f},{y(v):.2f}" for t, v in line)
            parts.append(f'<polyline class="{quantile}-line" points="{coords}" fill="none" stroke="#5b3a8c" '
                         f'stroke-width="1.4"{dash}/>')
    for s, q in points:
        tip = (f"{name} over the {s['window_s']:.0f} s to {iso_utc(s['at_s'])}: p50 {q['p50_s'] * factor:.4g}, "
               f"p90 {q['p90_s'] * factor:.4g}, p99 {q['p99_s'] * factor:.4g}, mean {q['mean_s'] * factor:.4g} "
               f"{unit} ({q['num_requests']} requests)")
        parts.append(f'<circle class="sample" cx="{x(s["at_s"]):.2f}" cy="{y(q["p99_s"]):.2f}" r="3" '
                     f'fill="#5b3a8c" data-source="{s["source"]}" data-at-s="{s["at_s"]!r}" '
                     f'data-window-s="{s["window_s"]!r}" '
                     f'data-num-requests="{q["num_requests"]}" data-p50-s="{q["p50_s"]!r}" '
                     f'data-p90-s="{q["p90_s"]!r}" data-p99-s="{q["p99_s"]!r}" data-mean-s="{q["mean_s"]!r}">'
                     f"<title>{html.escape(tip)}</title></circle>")
    pool_attr = html.escape(pool_key, quote=True)
    return (f'<svg class="latency" data-pool="{pool_attr}" data-kind="{kind}" data-unit="{unit}" width="{WIDTH_PX}" '
            f'height="{_HEIGHT}" viewBox="0 0 {WIDTH_PX} {_HEIGHT}" role="img" '
            f'aria-label="{html.escape(KINDS[kind])} of pool {pool_attr}">{"".join(parts)}</svg>')


def _ms(value_s: float) -> str:
    return f"{value_s * 1e3:.4g}" if math.isfinite(value_s) else "-"


JUDGED_STATES = ("meeting", "adjusting", "infeasible")  # an objective's states with latency data behind them


def attainment(samples: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """How often the pool met its objective, as the controller judged it at each sample taken under one with
    latency data (state meeting, adjusting or infeasible): the count per state, the samples judged, and the first
    and last such sample's time; None when no sample was taken under an objective with data."""
    judged = [s for s in samples if (s["objective"] or {}).get("state") in JUDGED_STATES]
    if not judged:
        return None
    counts = {state: sum(1 for s in judged if s["objective"]["state"] == state) for state in JUDGED_STATES}
    return {**counts, "judged": len(judged), "from_s": min(s["at_s"] for s in judged),
            "to_s": max(s["at_s"] for s in judged)}


def _attainment_line(samples: Sequence[dict[str, Any]]) -> str:
    found = attainment(samples)
    if found is None:
        return ""
    share = found["meeting"] / found["judged"]
    return (f'<p class="attainment muted" data-meeting="{found["meeting"]}" data-adjusting="{found["adjusting"]}" '
            f'data-infeasible="{found["infeasible"]}" data-judged="{found["judged"]}">objective met in '
            f'{found["meeting"]} of {found["judged"]} samples ({share:.0%}) from {iso_utc(found["from_s"])} to '
            f'{iso_utc(found["to_s"])}; adjusting {found["adjusting"]}, infeasible {found["infeasible"]} (the '
            "controller's state at each sample)</p>")


def latency_section(pool_key: str, samples: Sequence[dict[str, Any]], *, start_s: float, end_s: float) -> str:
    """A pool's latency part of the report: its TTFT and TPOT timelines and a table of the newest sample's
    quantiles (ms); a line saying so when no sample of the pool holds any latency, or when it has none.
    `samples`: the pool's."""
    samples = sorted(samples, key=lambda s: s["at_s"])
    pool_attr = html.escape(pool_key, quote=True)
    head = (f'<h3>Latency <span class="muted">of the pool\'s finished requests, {len(samples)} sample'
            f'{"" if len(samples) == 1 else "s"}</span></h3>')
    if not samples:
        return f'<section class="latency" data-pool="{pool_attr}">{head}<p class="muted">not sampled</p></section>'
    if not any(s[kind] is not None for s in samples for kind in ("ttft", "tpot", "queue")):
        return (f'<section class="latency" data-pool="{pool_attr}">{head}<p class="muted">no latency data: the '
                f"pool's agents send no latency stamps, or none finished in the last minute</p></section>")
    newest = samples[-1]
    rows = "".join(
        f'<tr data-kind="{kind}"><td>{kind.upper()}</td><td>{q["num_requests"]}</td><td>{_ms(q["p50_s"])}</td>'
        f'<td>{_ms(q["p90_s"])}</td><td>{_ms(q["p99_s"])}</td><td>{_ms(q["mean_s"])}</td></tr>'
        for kind in ("ttft", "tpot", "queue") if (q := newest[kind]) is not None)
    objective = newest["objective"]
    seen = f"from the view of {newest['engine_id']}" if newest["engine_id"] else "as the controller recorded it"
    caption = (f"the {newest['window_s']:.0f} s to {iso_utc(newest['at_s'])}, {seen}"
               + (f"; objective {objective['state']}: {objective['detail']}" if objective else ""))
    return (f'<section class="latency" data-pool="{pool_attr}">{head}{_attainment_line(samples)}'
            + "".join(latency_svg(pool_key, kind, samples, start_s=start_s, end_s=end_s) for kind in KINDS)
            + f'<table class="latency" data-pool="{pool_attr}"><caption class="muted">{html.escape(caption)}'
              "</caption><thead><tr><th>latency</th><th>requests</th><th>p50 (ms)</th><th>p90 (ms)</th>"
              f"<th>p99 (ms)</th><th>mean (ms)</th></tr></thead><tbody>{rows}</tbody></table></section>")
