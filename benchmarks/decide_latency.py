"""Micro-benchmark of the decision core: median time of decide() at W_O = 4096.

Run: `.venv/bin/python benchmarks/decide_latency.py`. Prints the median and p95 of decide() on a full
4096-sample window, beside its parts (the hazard fit alone and the closed-form evaluation alone), so
the ratios say where the time goes on whatever machine runs it. Goal: decide() median ≤ 1 ms.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

from controlplane.core.hazard import fit_hazard
from controlplane.core.policy import decide, evaluate
from controlplane.core.types import EngineLimits, Observations, PolicyState
from controlplane.sim.profiles import RTX_PRO_6000_QWEN3_8B

WINDOW = 4096
REPEATS = 400

RTX_PRO_6000 = RTX_PRO_6000_QWEN3_8B


def _times_us(fn: Callable[[], object]) -> list[float]:
    fn()  # warm-up
    samples = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def main() -> None:
    rng = np.random.default_rng(7)
    outputs = rng.geometric(1 / 256, WINDOW).astype(np.float64)
    prompts = rng.integers(64, 2048, WINDOW).astype(np.float64)
    limits = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=16384, kv_capacity_tokens=1_500_000,
                          max_model_len_tokens=32768)
    observations = Observations(outputs, prompts, RTX_PRO_6000, limits, n_obs=600.0)
    fit = fit_hazard(outputs, prompts)
    assert fit is not None
    state = PolicyState()
    clock = iter(range(10**9))
    rows = {
        "decide() (fit + evaluate + select)": _times_us(lambda: decide(observations, state, float(next(clock)))),
        "fit_hazard() alone": _times_us(lambda: fit_hazard(outputs, prompts)),
        "evaluate() alone": _times_us(lambda: evaluate(fit.stats, RTX_PRO_6000, limits, n_obs=600.0)),
    }
    total = statistics.median(rows["decide() (fit + evaluate + select)"])
    print(f"W_O = {WINDOW}, {REPEATS} runs each")
    print(f"{'what':<38} {'median µs':>10} {'p95 µs':>10} {'share of decide':>16}")
    for name, samples in rows.items():
        median = statistics.median(samples)
        p95 = float(np.percentile(samples, 95))
        print(f"{name:<38} {median:>10.1f} {p95:>10.1f} {median / total:>16.2f}")
    print(f"goal: decide() median ≤ 1000 µs -> {'met' if total <= 1000 else 'NOT met'} ({total:.0f} µs)")


if __name__ == "__main__":
    main()
