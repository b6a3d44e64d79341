"""Tables of twin runs: fixed-width text for the terminal, CSV for files. Pure string building."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence

from controlplane.sim.runner import RunResult

COLUMNS = (
    ("scenario", "{:<30}", lambda r: r.scenario[:60]),
    ("scheduler", "{:<18}", lambda r: r.scheduler[:18]),
    ("seed", "{:>4}", lambda r: r.seed),
    ("done", "{:>6}", lambda r: r.metrics.num_completed),
    ("tok/s", "{:>9.0f}", lambda r: r.metrics.throughput_tokens_per_s),
    ("req/s", "{:>7.2f}", lambda r: r.metrics.requests_per_s),
    ("ttft_s", "{:>8.3f}", lambda r: r.metrics.ttft_mean_s),
    ("ttft_p95", "{:>8.3f}", lambda r: r.metrics.ttft_p95_s),
    ("tpot_ms", "{:>8.1f}", lambda r: r.metrics.tpot_mean_s * 1e3),
    ("tpot_p95", "{:>8.1f}", lambda r: r.metrics.tpot_p95_s * 1e3),
    ("e2e_s", "{:>8.2f}", lambda r: r.metrics.e2e_mean_s),
    ("e2e_p95", "{:>8.2f}", lambda r: r.metrics.e2e_p95_s),
    ("makespan", "{:>9.1f}", lambda r: r.metrics.makespan_s),
    ("preempt", "{:>7}", lambda r: r.metrics.num_preemptions),
    ("wall_s", "{:>6.2f}", lambda r: r.wall_s),
)


def _cell(fmt: str, value: object) -> str:
    if isinstance(value, float) and not math.isfinite(value):
        width = "".join(c for c in fmt if c.isdigit() or c == ".").split(".")[0]
        return "n/a".rjust(int(width or 3))
    return fmt.format(value)


def text_table(results: Sequence[RunResult]) -> str:
    """One line per run, with a header."""
    if not results:
        return "(no runs)"
    widths = [max(len(name), *(len(_cell(fmt, getter(r))) for r in results)) for name, fmt, getter in COLUMNS]
    lines = [" ".join(name.ljust(w) if "<" in fmt else name.rjust(w)
                      for (name, fmt, _), w in zip(COLUMNS, widths, strict=True))]
    for result in results:
        lines.append(" ".join(_cell(fmt, getter(result)).rjust(w) if "<" not in fmt else
                              _cell(fmt, getter(result)).ljust(w)
                              for (_, fmt, getter), w in zip(COLUMNS, widths, strict=True)))
    return "\n".join(lines)


def csv_table(results: Sequence[RunResult]) -> str:
    """Every metric of every run, one row per run."""
    out = io.StringIO()
    writer = csv.writer(out)
    if not results:
        return ""
    metric_names = list(results[0].metrics.as_dict())
    writer.writerow(["scenario", "scheduler", "profile", "seed", "wall_s", *metric_names])
    for r in results:
        writer.writerow([r.scenario, r.scheduler, r.profile, r.seed, f"{r.wall_s:.3f}",
                         *r.metrics.as_dict().values()])
    return out.getvalue()
