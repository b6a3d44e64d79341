"""The queueing estimate of TTFT and TPOT per mode (`core.latency_model`) against the twin it is meant to order:
for each case, the twin pool pinned to EB and to MB, what the model predicted beside what the pool measured.

    .venv/bin/python benchmarks/latency_model.py                 # 4 cases × 2 loads, 2 engines, 4 simulated min
    .venv/bin/python benchmarks/latency_model.py --minutes 6 --loads 0.25,0.5,1
    .venv/bin/python benchmarks/latency_model.py --smoke         # one case, one load, 1.5 min (figures mean nothing)

Each run is a pool of twin engines pinned to one mode under open-loop Poisson arrivals (`testbench.twin_pool`, the
cases and rates of `benchmarks/twin_objectives.py`, each at --loads fractions of its rate). At the end, the model's
prediction is what the objective loop would see (`loop.objective_view.predictions`): the pool's estimate (its
online cost fit, the calibration for the phases the steps did not cover), an engine's decision (N, k, budgets),
the arrival rate per engine, quantile 0.99. Printed per run: TTFT p99 measured and predicted (after the warm-up
minute) and their ratio, TPOT mean measured and predicted and their ratio; per case and load, whether the model
(as the loop sees it running each mode) orders EB and MB as the twin does for TTFT p99 and for TPOT (the direction
the loop takes from it), counting a difference under PREDICTION_MARGIN in either as "too close" rather than a
disagreement. Last: the orders agreed,
and the median and largest |log(predicted / measured)|.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

from controlplane.core.types import Mode
from controlplane.loop.objective import PREDICTION_MARGIN
from controlplane.loop.objective_view import predictions
from controlplane.sim.profiles import get_profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # testbench, from a checkout
from testbench.twin_pool import CASES, POOL_KEY, Config, run

WARMUP_S = 60.0


def _order(eb: float, mb: float) -> str:
    """Which mode is lower, or "tie" within PREDICTION_MARGIN."""
    if eb * PREDICTION_MARGIN < mb:
        return "EB"
    if mb * PREDICTION_MARGIN < eb:
        return "MB"
    return "tie"


def measure(profile_name: str, workload: str, rate_per_s: float, args
            ) -> dict[Mode, tuple[tuple[float, float], dict[Mode, tuple[float, float]]]]:
    """Per pinned mode: its (TTFT p99, TPOT mean) measured, and the model's (TTFT p99, TPOT) for both modes as the
    loop would see them running it, seconds."""
    runs = {}
    for mode, pin in ((Mode.EB, "eb"), (Mode.MB, "mb")):
        result = run(get_profile(profile_name), workload, Config(pin, pin=pin), rate_per_s=rate_per_s,
                     engines=args.engines, minutes=args.minutes, seed=args.seed, warmup_s=WARMUP_S, guard=True)
        fleet = result.fleet
        pool = fleet.pool(POOL_KEY)
        predicted = predictions(pool.stats.estimate if pool else None, fleet.engine("e0").loop.current, rate_per_s,
                                quantile=0.99)
        runs[mode] = ((result.ttft_p99_s, result.tpot_mean_s),
                      {m: (p.ttft_s, p.tpot_s) for m, p in predicted.items()})
    return runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=",".join(f"{p}:{w}" for p, w in CASES))
    parser.add_argument("--loads", default="0.5,1", help="fractions of each case's rate")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args()
    if args.smoke:
        args.cases, args.loads, args.minutes = "h200-qwen3-8b:sharegpt", "0.5", 1.5
    started = time.perf_counter()
    print(f"latency model against the twin: pools of {args.engines} engines pinned to each mode, open-loop Poisson "
          f"arrivals, {args.minutes:g} simulated minutes, measured after minute {WARMUP_S / 60:g}")
    print(f"{'case':<36}{'load/s':>7}{'mode':>5}{'TTFT p99 s':>11}{'predicted':>10}{'ratio':>7}"
          f"{'TPOT ms':>9}{'predicted':>10}{'ratio':>7}")
    errors: list[float] = []
    agreed = judged = 0
    for spec in args.cases.split(","):
        profile_name, workload = spec.split(":")
        for load in (float(x) for x in args.loads.split(",")):
            rate = load * CASES[(profile_name, workload)]
            runs = measure(profile_name, workload, rate, args)
            measured = {mode: runs[mode][0] for mode in runs}
            for mode, ((ttft, tpot), predicted) in runs.items():
                ttft_guess, tpot_guess = predicted.get(mode, (math.nan, math.nan))
                ttft_ratio, tpot_ratio = ttft_guess / ttft, tpot_guess / tpot
                errors += [abs(math.log(r)) for r in (ttft_ratio, tpot_ratio) if math.isfinite(r) and r > 0]
                print(f"{profile_name + ' ' + workload:<36}{rate:>7.1f}{mode.value:>5}{ttft:>11.3f}{ttft_guess:>10.3f}"
                      f"{ttft_ratio:>7.2f}{1e3 * tpot:>9.1f}{1e3 * tpot_guess:>10.1f}{tpot_ratio:>7.2f}", flush=True)
            for name, index in (("TTFT p99", 0), ("TPOT", 1)):
                twin = _order(measured[Mode.EB][index], measured[Mode.MB][index])
                for running, (_, predicted) in runs.items():
                    if len(predicted) < 2:
                        continue
                    model = _order(predicted[Mode.EB][index], predicted[Mode.MB][index])
                    verdict = "agree" if twin == model else "too close" if "tie" in (twin, model) else "DISAGREE"
                    judged += verdict != "too close"
                    agreed += verdict == "agree"
                    print(f"  order {name}: twin {twin} lower, model running {running.value}: {model} lower "
                          f"-> {verdict}")
    print(f"orders agreed: {agreed} of {judged} that both tell apart; |log(predicted / measured)| median "
          f"{np.median(errors) if errors else math.nan:.2f}, largest {max(errors, default=math.nan):.2f}")
    print(f"wall {time.perf_counter() - started:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
