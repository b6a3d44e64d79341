"""How fast the decisions follow a shift of the output-length distribution, on the product's path.

A saturated engine (256 requests in flight, one token per request per step, every finished request replaced at
once) whose new requests change their output-length law at one completion, and the decision loop the
controller runs on it: the pool's `PoolStatistics` on a simulated clock of one bucket per 10 completions — the
completions and the running requests' lengths go in with `add` (as the controller passes
`ValidatedBatch.running_lengths / running_counts`), `refresh` closes the bucket, feeds the shift tracker, re-bases
the window at each detected change point and fits it with the running requests at both ends — and
`core.policy.decide` on the pool's fit with the published H200 Qwen3-8B costs, as `EngineLoop.decide` does
(`min_samples` included). It measures, over 20 seeds, how many post-shift completions it takes until k̂* and
N̂* stay within 10% and 5% of the values the same fit gives on the new workload in steady state. The same loop
also runs on an i.i.d. completion stream (`run_iid`: no requests in flight, so no length bias).

k̂* is compared before its floor (θ̂*·N̂*): k̂* = ⌊θ̂*·N̂*⌋ = 7 for a steady mean of 1,024 tokens, where 10% is
less than one request. `pytest -s` prints the table.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from controlplane.core.hazard import fit_hazard_histogram
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.policy import decide, evaluate
from controlplane.core.types import EngineLimits, Evaluation, Observations, PolicyState
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.estimate import PoolEstimate
from controlplane.loop.pool_stats import PoolStatistics
from controlplane.sim.profiles import H200_QWEN3_8B

LIMITS = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=700_000)
SLOTS = 256
DECISION_EVERY = 10
PRE_SHIFT = 5000
POST_SHIFT = 2500
SEEDS = 20
CONFIG = DecisionLoopConfig(output_window=4096, prompt_window=4096)


def draw(rng: np.random.Generator, kind: str, mean: float, n: int) -> np.ndarray:
    if kind == "geometric":
        return rng.geometric(1.0 / mean, n)
    return rng.integers(round(0.5 * mean), round(1.5 * mean) + 1, n)  # uniform on 0.5–1.5× the mean


def prompts(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.integers(256, 769, n)


def steady_state(kind: str, mean: float) -> Evaluation:
    """The decision the fit gives on a large stationary sample of the workload (N̂* at its fixed point)."""
    rng = np.random.default_rng(12345)
    outputs, prompt_lengths = draw(rng, kind, mean, 400_000), prompts(rng, 400_000)
    fit = fit_hazard_histogram(LengthHistogram.from_samples(outputs), prompt_count=prompt_lengths.size,
                               prompt_sum_tokens=float(prompt_lengths.sum()))
    assert fit is not None
    n_prev, result = 0, None
    for _ in range(20):
        result = evaluate(fit.stats, H200_QWEN3_8B, LIMITS, n_prev=n_prev)
        n_prev = result.n_star
    assert result is not None
    return result


@dataclass(frozen=True)
class Trace:
    post_shift: np.ndarray  # completions since the shift at each decision
    k_real: np.ndarray  # θ̂*·N̂* (0 when the decision was not computed: cold start)
    n: np.ndarray  # N̂*
    num_events: int  # shifts detected after the shift


class _Decisions:
    """Decides on each refreshed pool estimate as `EngineLoop.decide` does, and keeps the decisions taken from
    the shift on (and the shifts detected before it)."""

    def __init__(self, pre_shift: int) -> None:
        self._pre_shift = pre_shift
        self._state = PolicyState()
        self._post: list[int] = []
        self._k_real: list[float] = []
        self._n: list[int] = []
        self._events_before = 0

    def decide(self, estimate: PoolEstimate, *, now_s: float, done: int) -> None:
        observations = Observations(costs=H200_QWEN3_8B, limits=LIMITS, n_obs=float(SLOTS))
        decision, self._state = decide(observations, self._state, now_s, fit=estimate.fit,
                                       established=estimate.window_rebased)
        if done < self._pre_shift:
            self._events_before = estimate.num_shifts
        else:
            self._post.append(done - self._pre_shift)
            self._k_real.append(decision.diagnostics.theta_star * decision.diagnostics.n_star)
            self._n.append(decision.diagnostics.n_star)

    def trace(self, pool: PoolStatistics) -> Trace:
        assert pool.estimate is not None
        return Trace(np.array(self._post), np.array(self._k_real), np.array(self._n),
                     pool.estimate.num_shifts - self._events_before)


def run(seed: int, kind: str, before: float, after: float, *, censoring: bool = True,
        config: DecisionLoopConfig = CONFIG, pre_shift: int = PRE_SHIFT, post_shift: int = POST_SHIFT) -> Trace:
    rng = np.random.default_rng(seed)
    start = np.zeros(SLOTS)
    length = draw(rng, kind, before, SLOTS).astype(np.float64)
    finish = start + length
    pool = PoolStatistics("m|a", config, replica_id="r0", settle_s=0.0)
    decisions = _Decisions(pre_shift)
    batch: list[int] = []
    done, bucket = 0, 0
    while done < pre_shift + post_shift:
        i = int(np.argmin(finish))
        now = finish[i]
        batch.append(int(length[i]))
        done += 1
        length[i] = float(draw(rng, kind, after if done >= pre_shift else before, 1)[0])
        start[i], finish[i] = now, now + length[i]
        if len(batch) < DECISION_EVERY:
            continue
        completed = np.array(batch, dtype=np.float64)
        batch.clear()
        running = (now - start).astype(np.int64)
        # Bucket `bucket` spans [bucket, bucket + 1) s: the batch arrives inside it, the refresh at its end
        # (settle_s = 0) fits the window ending with it.
        pool.add(bucket + 0.5, prompts=prompts(rng, completed.size).astype(np.float64), outputs=completed,
                 steps=None, engine_id="engine", running_lengths=running if censoring else None,
                 running_counts=np.ones_like(running) if censoring else None)
        estimate = pool.refresh(bucket + 1.0, calibration=H200_QWEN3_8B)
        bucket += 1
        decisions.decide(estimate, now_s=float(bucket), done=done)
    return decisions.trace(pool)


def run_iid(seed: int, kind: str, before: float, after: float, *, pre_shift: int = PRE_SHIFT,
            post_shift: int = POST_SHIFT) -> Trace:
    """The same loop on an i.i.d. completion stream: every completion after the shift follows the new law (no
    requests in flight, so no length bias and no running requests to report)."""
    rng = np.random.default_rng(seed)
    pool = PoolStatistics("m|a", CONFIG, replica_id="r0", settle_s=0.0)
    decisions = _Decisions(pre_shift)
    for bucket in range((pre_shift + post_shift) // DECISION_EVERY):
        done = (bucket + 1) * DECISION_EVERY
        mean = after if done > pre_shift else before
        completed = draw(rng, kind, mean, DECISION_EVERY).astype(np.float64)
        pool.add(bucket + 0.5, prompts=prompts(rng, completed.size).astype(np.float64), outputs=completed,
                 steps=None, engine_id="engine")
        estimate = pool.refresh(bucket + 1.0, calibration=H200_QWEN3_8B)
        decisions.decide(estimate, now_s=float(bucket + 1), done=done)
    return decisions.trace(pool)


def relative_error(trace: Trace, steady: Evaluation) -> np.ndarray:
    """Per decision, the larger of the relative errors of θ̂*·N̂* and N̂*."""
    k_error = np.abs(trace.k_real / (steady.theta_star * steady.n_star) - 1.0)
    return np.maximum(k_error, np.abs(trace.n / steady.n_star - 1.0))


def settling(trace: Trace, steady: Evaluation, tolerance: float) -> int:
    """Post-shift completions after which every later decision stays within the tolerance."""
    outside = np.nonzero(relative_error(trace, steady) > tolerance)[0]
    return 0 if outside.size == 0 else int(trace.post_shift[outside[-1]]) + DECISION_EVERY


def error_at(trace: Trace, steady: Evaluation, post_shift: int) -> float:
    return float(relative_error(trace, steady)[np.searchsorted(trace.post_shift, post_shift)])


@dataclass(frozen=True)
class Summary:
    settle_10: float
    settle_5: float
    error_300: float
    error_600: float


def summarise(kind: str, before: float, after: float, *, censoring: bool = True, seeds: int = SEEDS,
              iid: bool = False) -> Summary:
    steady = steady_state(kind, after)
    traces = [run_iid(seed, kind, before, after) if iid else run(seed, kind, before, after, censoring=censoring)
              for seed in range(seeds)]
    summary = Summary(
        settle_10=float(np.median([settling(t, steady, 0.10) for t in traces])),
        settle_5=float(np.median([settling(t, steady, 0.05) for t in traces])),
        error_300=float(np.median([error_at(t, steady, 300) for t in traces])),
        error_600=float(np.median([error_at(t, steady, 600) for t in traces])),
    )
    setting = " (i.i.d. stream)" if iid else "" if censoring else " (completions only)"
    print(f"{kind} {before:.0f} → {after:.0f}{setting}: steady k̂*="
          f"{steady.k_star} (θ̂*·N̂*={steady.theta_star * steady.n_star:.2f}) N̂*={steady.n_star}; median over "
          f"{seeds} seeds: within 10% after {summary.settle_10:.0f} completions, within 5% after "
          f"{summary.settle_5:.0f}; error at 300: {summary.error_300:.1%}, at 600: {summary.error_600:.1%}; "
          f"shifts detected per run: {np.mean([t.num_events for t in traces]):.1f}")
    return summary


# The measured figures (see docs/BENCHMARKS.md) with some margin: these bounds catch regressions; the goal
# of 300 / 600 completions is not reached for geometric workloads (the requests in flight at the shift).
# Soak-length (about a minute per case): `make test-slow` runs them; `benchmarks/twin_shift_reaction.py` measures
# the same reaction over 20 seeds, and its smoke mode runs in the suite.
@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "before", "after", "settle_10", "settle_5", "error_600"),
    [
        ("geometric", 128.0, 1024.0, 1400, 2100, 0.10),
        ("geometric", 1024.0, 256.0, 900, 2400, 0.10),
        ("uniform", 512.0, 1024.0, 600, 700, 0.05),
    ],
)
def test_decisions_follow_a_shift(kind: str, before: float, after: float, settle_10: int, settle_5: int,
                                  error_600: float) -> None:
    summary = summarise(kind, before, after)
    assert summary.settle_10 <= settle_10
    assert summary.settle_5 <= settle_5
    assert summary.error_600 <= error_600


# The i.i.d. stream (measured: geometric 128 → 1,024 within 10% / 5% after 230 / 1,005 completions, error 3.7% at
# 300 and 2.6% at 600; 1,024 → 256: 195 / 310, 3.2%, 1.9%; uniform 512 → 1,024: 50 / 70, 1.3%, 0.6%). The error
# at 300 and at 600 completions is within the goal's 10% and 5%; what stays above the goal for geometric
# 128 → 1,024 when read as "stays within 5% from then on" is sampling (docs/BENCHMARKS.md).
@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "before", "after", "settle_10", "settle_5"),
    [
        ("geometric", 128.0, 1024.0, 300, 1200),
        ("geometric", 1024.0, 256.0, 300, 600),
        ("uniform", 512.0, 1024.0, 100, 150),
    ],
)
def test_decisions_follow_a_shift_in_an_iid_stream(kind: str, before: float, after: float, settle_10: int,
                                                   settle_5: int) -> None:
    summary = summarise(kind, before, after, iid=True)
    assert summary.error_300 <= 0.10
    assert summary.error_600 <= 0.05
    assert summary.settle_10 <= settle_10
    assert summary.settle_5 <= settle_5


@pytest.mark.sim
def test_censoring_speeds_up_the_reaction() -> None:
    # Medians over 3 seeds (measured: within 10% after 250 completions against 1,100, error at 600 6.4% against
    # 18.3%; over 6 seeds 400 against 1,120 and 5.2% against 19.6%): a margin of several times either way.
    with_running = summarise("geometric", 1024.0, 256.0, seeds=3)
    completions_only = summarise("geometric", 1024.0, 256.0, censoring=False, seeds=3)
    assert with_running.settle_10 < completions_only.settle_10
    assert with_running.error_600 < completions_only.error_600


@pytest.mark.sim
@pytest.mark.parametrize("kind", ["geometric", "uniform"])
def test_no_false_alarm_in_100k_completions_of_a_stationary_workload(kind: str) -> None:
    """The product path on a workload that never changes: the pool statistics detect no shift (buckets of 100
    completions, the running requests at each close). The engine first runs 5,000 completions: all its requests
    start together, and the first completions are the short ones (a real, if brief, shift)."""
    rng = np.random.default_rng(7)
    start = np.zeros(SLOTS)
    length = draw(rng, kind, 256.0, SLOTS).astype(np.float64)
    finish = start + length
    pool = PoolStatistics("m|a", CONFIG, replica_id="r0", settle_s=0.0)
    batch: list[int] = []
    bucket = 0
    for done in range(5_000 + 100_000):
        i = int(np.argmin(finish))
        now = finish[i]
        batch.append(int(length[i]))
        length[i] = float(draw(rng, kind, 256.0, 1)[0])
        start[i], finish[i] = now, now + length[i]
        if done < 5_000:
            batch.clear()
        if len(batch) < 100:
            continue
        running = (now - start).astype(np.int64)
        pool.add(bucket + 0.5, prompts=prompts(rng, len(batch)).astype(np.float64), outputs=np.array(batch, float),
                 steps=None, engine_id="engine", running_lengths=running, running_counts=np.ones_like(running))
        batch.clear()
        pool.refresh(bucket + 1.0, calibration=H200_QWEN3_8B)
        bucket += 1
    assert pool.estimate is not None
    print(f"{kind}: {pool.estimate.num_shifts} shift(s) detected in 100,000 stationary completions")
    assert pool.estimate.num_shifts <= 1
