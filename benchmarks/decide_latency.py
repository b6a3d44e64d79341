"""Micro-benchmark of deciding: per-engine work with the pool estimate vs refitting per engine.

Run: `.venv/bin/python benchmarks/decide_latency.py` (`make bench`; `--smoke`: 20 runs each, the same code
paths in a second). Side by side, at W_O = 4096:
- the baseline: the hazard fit of an engine's own 4,096-sample window and the core's decide() on it (fit +
  evaluate + select), which is what every engine cost before pools were estimated once;
- the pool's refresh (`PoolStatistics.refresh`: histogram merge + hazard fit + cost fit) alone;
- one engine's decision from the pool estimate (`EngineLoop.decide`: evaluate + select + the protobuf
  message), without an override and with δ set by a latency objective's loop (source `objective`);
- the amortised per-engine cost, (pool refresh / engines per pool) + engine decision, for 10, 100, 1,000
  engines per pool, and its ratio to the baseline; the same with an objective. Goal: ≤ 50 µs amortised per
  engine at 1,000 engines, with or without an objective.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

from controlplane.core.hazard import fit_hazard_histogram
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.policy import decide
from controlplane.core.types import (
    DeltaSource,
    EngineLimits,
    Observations,
    OperatorIntent,
    PolicyConfig,
    PolicyState,
)
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.engine import EngineLoop
from controlplane.loop.ingest import EngineHello
from controlplane.loop.pool_stats import PoolStatistics
from controlplane.sim.profiles import RTX_PRO_6000_QWEN3_8B

WINDOW = 4096
REPEATS = 400
SMOKE_REPEATS = 20
COSTS = RTX_PRO_6000_QWEN3_8B


def _times_us(fn: Callable[[], object], repeats: int) -> list[float]:
    fn()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e6)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help=f"{SMOKE_REPEATS} runs each: the same code paths, fast")
    repeats = SMOKE_REPEATS if parser.parse_args().smoke else REPEATS
    rng = np.random.default_rng(7)
    outputs = rng.geometric(1 / 256, WINDOW).astype(np.float64)
    prompts = rng.integers(64, 2048, WINDOW).astype(np.float64)
    limits = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=16384, kv_capacity_tokens=1_500_000,
                          max_model_len_tokens=32768)
    observations = Observations(COSTS, limits, n_obs=600.0)

    def own_window_decision() -> object:  # the engine's own window: fit, then evaluate and select
        fit = fit_hazard_histogram(LengthHistogram.from_samples(outputs), prompt_count=WINDOW,
                                   prompt_sum_tokens=float(prompts.sum()))
        return decide(observations, PolicyState(), float(next(clock)), fit=fit)

    clock = iter(range(10**9))
    config = DecisionLoopConfig()
    pool = PoolStatistics("m|a", config, replica_id="bench")
    for second in range(8):  # the window spread over 8 one-second buckets, as a busy pool's would be
        part = slice(second * WINDOW // 8, (second + 1) * WINDOW // 8)
        pool.add(100.0 + second, prompts=prompts[part], outputs=outputs[part], steps=None)
    pool.refresh(110.0, calibration=COSTS)
    hello = EngineHello(engine_id="e", model="m", accelerator="a", vllm_version="", agent_version="", limits=limits,
                        block_size_tokens=16)
    loop = EngineLoop(hello=hello, config=config, policy=PolicyConfig(), epoch=1)
    loop.n_obs = 600.0
    intent = OperatorIntent()
    objective_loop = EngineLoop(hello=hello, config=config, policy=PolicyConfig(), epoch=1)
    objective_loop.n_obs = 600.0
    # δ as a pool's latency-objective loop sets it (`loop.objective`): one step above the default.
    objective = OperatorIntent(delta_s_per_token=1e-6, delta_source=DeltaSource.OBJECTIVE)
    rows = {
        "baseline: decide() on its own window": _times_us(own_window_decision, repeats),
        "pool refresh (merge + fits)": _times_us(lambda: pool.refresh(110.0, calibration=COSTS), repeats),
        "engine decision from the pool estimate": _times_us(
            lambda: loop.decide(pool.estimate, intent=intent, now_s=float(next(clock))), repeats),
        "engine decision, δ from an objective": _times_us(
            lambda: objective_loop.decide(pool.estimate, intent=objective, now_s=float(next(clock))), repeats),
    }
    print(f"W_O = {WINDOW}, {repeats} runs each")
    print(f"{'what':<40} {'median µs':>10} {'p95 µs':>10}")
    medians = {}
    for name, samples in rows.items():
        medians[name] = statistics.median(samples)
        print(f"{name:<40} {medians[name]:>10.1f} {float(np.percentile(samples, 95)):>10.1f}")
    baseline = medians["baseline: decide() on its own window"]
    refresh = medians["pool refresh (merge + fits)"]
    engine = medians["engine decision from the pool estimate"]
    with_objective = medians["engine decision, δ from an objective"]
    print(f"\n{'engines per pool':>16} {'amortised µs/engine':>20} {'vs baseline':>12} {'with an objective':>18}")
    for engines in (10, 100, 1000):
        amortised = refresh / engines + engine
        print(f"{engines:>16} {amortised:>20.1f} {amortised / baseline:>11.2f}x "
              f"{refresh / engines + with_objective:>18.1f}")
    worst = refresh / 1000 + max(engine, with_objective)
    print(f"goal: ≤ 50 µs amortised per engine at 1,000 engines, with or without an objective -> "
          f"{'met' if worst <= 50 else 'NOT met'} ({refresh / 1000 + engine:.1f} µs; with an objective "
          f"{refresh / 1000 + with_objective:.1f} µs)")


if __name__ == "__main__":
    main()
