"""Micro-benchmark of a pool's once-a-second work at 1,000 engines: what the event loop runs in one piece.

Run: `.venv/bin/python benchmarks/pool_second.py` (`make bench`; `--smoke`: 20 engines for 3 seconds, the same
code paths in a second). One pool receives, each simulated second,
one batch from each of 1,000 engines (64 geometric completions with their latency stamps and 1,000 steps, as
in `controller_load.py`); then its bucket closes and its estimate is refreshed (shift detection, window merge,
fits), each a single event-loop callback in the controller. Printed side by side, medians over the seconds:
- `add` summed over the second's 1,000 batches (spread over the second, not one stall), and the same without
  latency stamps (the difference is what the latency stamps add to the adds: the latency sketches fold their
  values into bucket counts as they arrive, a few thousand rows at a time);
- bucket close: `PoolStatistics.close_due`, against the baseline of keeping each batch's arrays and
  concatenating them at the close; and the same close without latency stamps (the difference is what the
  three latency sketches of the bucket cost, close and merge into the pool's outcome window). The pool with
  and the pool without latency stamps are fed the same batches in lockstep, each second one after the other,
  and the difference is the median of the seconds' differences (two pools run apart differ by more than the
  sketches cost on a busy machine);
- the latency sketches alone: a bucket holding only the 1,000 batches' latency stamps closed
  (`OpenBucket.close`) and merged into a full outcome window (`OutcomeWindow.put`, a bucket leaving it), its
  adds (`OpenBucket.add_latencies`) summed over the second, and the largest of them (a fold);
- refresh: `PoolStatistics.refresh`, against the baseline of the same refresh with the CUSUM run as its
  recursion, one sample at a time, in Python;
- the detector alone on one second's 1,024 fed samples, vectorised against the recursion.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: testbench's reference

import numpy as np

from controlplane.core.change_detection import ShiftDetector
from controlplane.core.cost_sums import CostSums, StepColumns
from controlplane.core.length_histogram import LengthHistogram
from controlplane.loop.buckets import MAX_STEPS_PER_BUCKET, BucketStats, OpenBucket
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.ingest import Latencies
from controlplane.loop.outcomes import OUTCOME_WINDOW_S, OutcomeWindow
from controlplane.loop.pool_stats import PoolStatistics
from controlplane.loop.shift_tracker import ShiftTracker
from controlplane.sim.profiles import RTX_PRO_6000_QWEN3_8B
from testbench.cusum_reference import RecursionDetector

ENGINES = 1000
SECONDS = 16
WARM_UP_S = 6
SMOKE = (20, 3, 1)  # (engines, seconds, warm-up seconds) of --smoke


def _concatenating_close(batches: list[tuple[np.ndarray, StepColumns]], reference) -> BucketStats:
    """The baseline bucket: every batch's arrays kept, concatenated and thinned at the close (the same
    histogram and cost sums, against the same reference cost model)."""
    outputs = np.concatenate([o for o, _ in batches])
    columns = [np.concatenate([getattr(s, name) for _, s in batches])
               for name in ("prefill_tokens", "decode_tokens", "decode_requests", "duration_s")]
    keep = np.linspace(0, columns[0].size - 1, MAX_STEPS_PER_BUCKET).astype(np.int64)
    costs = CostSums()
    costs.add_steps(StepColumns(*(c[keep] for c in columns)), reference=reference)
    return BucketStats(outputs=LengthHistogram.from_samples(outputs), prompt_count=0, prompt_sum_tokens=0.0,
                       costs=costs)


def _batches(rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray, StepColumns]]:
    batches = []
    for _ in range(50):
        n = 1000
        prefill = (rng.integers(0, 2, n) * rng.integers(64, 2048, n)).astype(np.float64)
        decode = rng.integers(100, 256, n).astype(np.float64)
        steps = StepColumns(prefill, decode, decode, rng.uniform(0.01, 0.03, n))
        latencies = Latencies(ttft_s=rng.lognormal(np.log(0.3), 0.8, 64), tpot_s=rng.lognormal(np.log(0.02), 0.3, 64),
                              queue_s=rng.exponential(0.1, 64), num_dropped=0)
        batches.append((rng.integers(256, 769, 64).astype(np.float64),
                        rng.geometric(1 / 256, 64).astype(np.float64), steps, latencies))
    return batches


def _pool_seconds(detector_type: type[ShiftDetector], *, engines: int = ENGINES, seconds: int = SECONDS,
                  warm_up_s: int = WARM_UP_S) -> dict[str, list[float]]:
    """Per measured second, ms: the pool's add (summed over the batches), close, baseline close and refresh, and
    the add and close of a twin pool fed the same batches without their latency stamps."""
    rng = np.random.default_rng(1)
    batches = _batches(rng)
    pools: dict[bool, PoolStatistics] = {}
    for with_latencies in (True, False):
        pool = PoolStatistics("m|a", DecisionLoopConfig(), replica_id="r0", settle_s=0.5)
        pool._shifts = ShiftTracker(detector_type())
        pools[with_latencies] = pool
    times: dict[str, list[float]] = {name: [] for name in ("add", "close", "baseline close", "refresh",
                                                           "plain add", "plain close")}
    for second in range(seconds):
        measured: dict[str, float] = {}
        for with_latencies, pool in pools.items():
            kept: list[tuple[np.ndarray, StepColumns]] = []
            added_s = 0.0
            for engine in range(engines):
                prompts, outputs, steps, latencies = batches[engine % len(batches)]
                start = time.perf_counter()
                pool.add(second + engine / (2 * engines), prompts=prompts, outputs=outputs, steps=steps,
                         engine_id=f"e{engine}", latencies=latencies if with_latencies else None)
                added_s += time.perf_counter() - start
                kept.append((outputs, steps))
            reference = pool.estimate.costs if pool.estimate is not None else None
            start = time.perf_counter()
            pool.close_due(second + 1.0)
            closed_s = time.perf_counter() - start
            start = time.perf_counter()
            pool.refresh(second + 1.0, calibration=RTX_PRO_6000_QWEN3_8B)
            refreshed_s = time.perf_counter() - start
            pool.prune(second + 1.0)
            if with_latencies:
                start = time.perf_counter()
                _concatenating_close(kept, reference)
                measured.update({"add": added_s, "close": closed_s, "baseline close": time.perf_counter() - start,
                                 "refresh": refreshed_s})
            else:
                measured.update({"plain add": added_s, "plain close": closed_s})
        if second >= warm_up_s:
            for name, value in measured.items():
                times[name].append(value * 1e3)
    return times


def _latency_sketches_ms(*, engines: int = ENGINES, seconds: int = SECONDS,
                         warm_up_s: int = WARM_UP_S) -> dict[str, float]:
    """Medians over the measured seconds, ms, of a bucket that holds only the engines' latency stamps: their
    adds summed and the largest one, and its close with the put of its sketches into a pool's full outcome
    window (the oldest bucket leaves it)."""
    batches = _batches(np.random.default_rng(1))
    config = DecisionLoopConfig()
    window_buckets = max(1, math.ceil(OUTCOME_WINDOW_S / config.bucket_s))
    window = OutcomeWindow(window_buckets, config.bucket_s)
    times: dict[str, list[float]] = {"adds": [], "largest add": [], "close": []}
    for second in range(seconds):
        bucket = OpenBucket(bucket_id=second)
        added_s = largest_s = 0.0
        for engine in range(engines):
            latencies = batches[engine % len(batches)][3]
            start = time.perf_counter()
            bucket.add_latencies(f"e{engine}", latencies.ttft_s, latencies.tpot_s, latencies.queue_s)
            took_s = time.perf_counter() - start
            added_s += took_s
            largest_s = max(largest_s, took_s)
        start = time.perf_counter()
        closed = bucket.close(None, None)
        assert closed.latencies is not None
        if second == 0:  # the window full from the start: every measured put also subtracts a leaving bucket
            for earlier in range(-window_buckets, 0):
                window.put(earlier, "r0", closed.latencies)
        window.put(second, "r0", closed.latencies)
        closed_s = time.perf_counter() - start
        if second >= warm_up_s:
            for name, value in (("adds", added_s), ("largest add", largest_s), ("close", closed_s)):
                times[name].append(value * 1e3)
    return {name: statistics.median(values) for name, values in times.items()}


def _detector_ms(detector_type: type[ShiftDetector]) -> float:
    rng = np.random.default_rng(2)
    detector = detector_type()
    detector.update(rng.geometric(1 / 256, 4096), jitter_index=0)
    samples = [rng.geometric(1 / 256, 1024) for _ in range(40)]
    times = []
    for i, batch in enumerate(samples):
        start = time.perf_counter()
        detector.update(batch, jitter_index=(i + 4) * 1024)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--smoke", action="store_true", help="20 engines for 3 seconds: the same code paths, fast")
    args = parser.parse_args()
    engines, seconds, warm_up_s = SMOKE if args.smoke else (ENGINES, SECONDS, WARM_UP_S)
    vectorised = _pool_seconds(ShiftDetector, engines=engines, seconds=seconds, warm_up_s=warm_up_s)
    recursion = _pool_seconds(RecursionDetector, engines=engines, seconds=seconds, warm_up_s=warm_up_s)
    alone = _latency_sketches_ms(engines=engines, seconds=seconds, warm_up_s=warm_up_s)
    median = {name: statistics.median(values) for name, values in vectorised.items()}
    refresh_baseline = statistics.median(recursion["refresh"])
    print(f"one pool, {engines:,} engines × (64 completions + 1,000 steps) per second; medians over "
          f"{seconds - warm_up_s} seconds, ms")
    print(f"{'what':<44}{'ms':>8}{'baseline ms':>13}{'ratio':>8}")
    print(f"{f'add, summed over the {engines:,} batches':<44}{median['add']:>8.2f}{'':>13}{'':>8}")
    print(f"{'bucket close (one callback)':<44}{median['close']:>8.2f}{median['baseline close']:>13.2f}"
          f"{median['close'] / median['baseline close']:>8.2f}")
    print(f"{'refresh: shifts, window, fits (one callback)':<44}{median['refresh']:>8.2f}{refresh_baseline:>13.2f}"
          f"{median['refresh'] / refresh_baseline:>8.2f}")
    print(f"{'bucket close without latency stamps':<44}{median['plain close']:>8.2f}{'':>13}{'':>8}")
    difference = statistics.median(np.subtract(vectorised["close"], vectorised["plain close"]))
    print(f"{'latency sketches in the close (difference)':<44}{difference:>8.2f}{'':>13}{'':>8}")
    print(f"{'add without latency stamps':<44}{median['plain add']:>8.2f}{'':>13}{'':>8}")
    add_difference = statistics.median(np.subtract(vectorised["add"], vectorised["plain add"]))
    print(f"{'latency stamps in the add (difference)':<44}{add_difference:>8.2f}{'':>13}{'':>8}")
    for name, value in (("close + window merge", alone["close"]), ("adds, summed", alone["adds"]),
                        ("largest single add", alone["largest add"])):
        print(f"{f'latency sketches alone: {name}':<44}{value:>8.2f}{'':>13}{'':>8}")
    fast, slow = _detector_ms(ShiftDetector), _detector_ms(RecursionDetector)
    print(f"{'detector update, 1,024 samples':<44}{fast:>8.2f}{slow:>13.2f}{fast / slow:>8.2f}")


if __name__ == "__main__":
    main()
