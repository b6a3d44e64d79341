"""What the log-normal tail does to μ̂_O on cold windows, and what it costs: side by side with the constant tail.

Run: `.venv/bin/python benchmarks/lognormal_tail.py [--seeds 20]` (~1 minute on 2 cores); `--smoke`: every law
and cut on 2 seeds (tests/benchmarks/test_smoke.py).

Each window is a cohort of 512 requests admitted at once, each slot refilled as its request finishes, observed
`cut` tokens later (`testbench/cohorts.py`): the completions and the running requests, as in an engine's
first minute or the requests admitted since a shift. `fit_hazard_histogram` is run on each window twice:
as shipped, and with the log-normal tail switched off (`hazard.LOGNORMAL_MAX_SURVIVAL` below 0: the curve is
continued by the constant hazard alone, as before the tail). Printed per law and cut, over the seeds: Ŝ(τ),
the level of the curve at its end; the median and lowest μ̂_O / truth of both (below 1: the memory N̂*
reads is under-estimated); how many windows used the log-normal tail; the median time of one fit, both ways.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: testbench's cohorts

import numpy as np

from controlplane.core import hazard
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.survival import WindowObservations, km_survival, life_table
from testbench.cohorts import (
    Draw,
    cohort,
    geometric,
    hist,
    increasing_hazard,
    lognormal,
    mixture,
    uniform,
)

# (name, draw, true mean in tokens, cuts in tokens)
LAWS: tuple[tuple[str, Draw, float, tuple[int, ...]], ...] = (
    ("geometric 1,024", geometric(1024.0), 1024.0, (400, 1000)),
    ("log-normal σ 0.5", lognormal(sigma=0.5, mean_tokens=434.0), 434.0, (300, 500)),
    ("log-normal σ 0.8", lognormal(sigma=0.8, mean_tokens=434.0), 434.0, (300, 500, 900)),
    ("log-normal σ 1.0", lognormal(sigma=1.0, mean_tokens=434.0), 434.0, (300, 500, 900)),
    ("log-normal σ 1.3", lognormal(sigma=1.3, mean_tokens=434.0), 434.0, (300, 500, 900)),
    ("geometric 128 | 1,024", mixture(geometric(128.0), geometric(1024.0), first_share=0.5), 576.0,
     (300, 600, 1200)),
    ("uniform 512-1,536", uniform(512, 1536), 1024.0, (700, 900, 1100)),
    ("IFR 2e-5 + 1e-5·t", increasing_hazard(p0=2e-5, eta=1e-5), 395.1, (200, 300, 500)),
)


@contextmanager
def constant_tail_only() -> Iterator[None]:
    saved = hazard.LOGNORMAL_MAX_SURVIVAL
    hazard.LOGNORMAL_MAX_SURVIVAL = -1.0
    try:
        yield
    finally:
        hazard.LOGNORMAL_MAX_SURVIVAL = saved


def _fit(done: np.ndarray, running: np.ndarray) -> tuple[hazard.HazardFit, float]:
    completed, censored = LengthHistogram.from_samples(done), hist(running)
    start = time.perf_counter()
    fit = hazard.fit_hazard_histogram(completed, prompt_count=1, prompt_sum_tokens=512.0, censored=censored)
    elapsed_ms = (time.perf_counter() - start) * 1e3
    assert fit is not None
    return fit, elapsed_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="2 seeds: the same code paths in a second")
    args = parser.parse_args()
    if args.smoke:
        args.seeds = 2
    print(f"cold windows of 512 slots, {args.seeds} seeds; μ̂_O / truth as median / lowest; fit time medians")
    print(f"{'law':22s} {'cut':>5s} {'Ŝ(τ)':>5s}   {'constant tail':>13s}   {'log-normal tail':>15s} {'used':>5s}"
          f"   {'ms':>5s} {'base ms':>7s}")
    for name, draw, true_mean, cuts in LAWS:
        for cut in cuts:
            shipped, base, levels, used, ms, base_ms = [], [], [], 0, [], []
            for seed in range(args.seeds):
                done, running = cohort(seed, cut_tokens=cut, draw=draw)
                fit, elapsed = _fit(done, running)
                shipped.append(fit.stats.mu_o_tokens / true_mean)
                used += fit.lognormal_tail
                ms.append(elapsed)
                with constant_tail_only():
                    fit, elapsed = _fit(done, running)
                base.append(fit.stats.mu_o_tokens / true_mean)
                base_ms.append(elapsed)
                table = life_table(WindowObservations(completed=LengthHistogram.from_samples(done),
                                                      censored=hist(running)))
                levels.append(float(km_survival(table)[-1]))
            print(f"{name:22s} {cut:5d} {np.median(levels):5.2f}   {np.median(base):6.3f} {min(base):6.3f}"
                  f"   {np.median(shipped):8.3f} {min(shipped):6.3f} {used:5d}   {np.median(ms):5.1f}"
                  f" {np.median(base_ms):7.1f}", flush=True)


if __name__ == "__main__":
    main()
