"""How fast the decisions follow a shift of the output-length distribution.

A pure harness: a saturated engine (256 requests in flight, one token per request per step, every finished
request replaced at once) whose new requests change their output-length law at one completion; the decision
loop the controller runs on it — every 10 completions: the completions into an `AdaptiveLengthWindow` bucket
with the running requests' lengths at its close, the `ShiftDetector` on the completions, a rebase at each
detected change point, the histogram fit of the window and `core.policy.evaluate` with the published H200
Qwen3-8B costs. It measures, over 20 seeds, how many post-shift completions it takes until k̂* and N̂* stay
within 10% and 5% of the values the same fit gives on the new workload in steady state.

k̂* is compared before its floor (θ̂*·N̂*): k̂* = ⌊θ̂*·N̂*⌋ = 7 for a steady mean of 1,024 tokens, where 10% is
less than one request.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from controlplane.core.adaptive_window import AdaptiveLengthWindow, fit_window
from controlplane.core.change_detection import ShiftDetector
from controlplane.core.hazard import fit_hazard_histogram
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.policy import evaluate
from controlplane.core.types import EngineLimits, Evaluation
from controlplane.sim.profiles import H200_QWEN3_8B

LIMITS = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=700_000)
SLOTS = 256
DECISION_EVERY = 10
PRE_SHIFT = 5000
POST_SHIFT = 2500
SEEDS = 20
WINDOW = 4096
MIN_WINDOW = 50


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
    k_real: np.ndarray  # θ̂*·N̂*
    n: np.ndarray  # N̂*
    num_events: int


def run(seed: int, kind: str, before: float, after: float, *, censoring: bool = True) -> Trace:
    rng = np.random.default_rng(seed)
    start = np.zeros(SLOTS)
    length = draw(rng, kind, before, SLOTS).astype(np.float64)
    finish = start + length
    detector, window = ShiftDetector(), AdaptiveLengthWindow(retain_samples=WINDOW)
    batch: list[int] = []
    post_shift, k_real, n_star = [], [], []
    n_prev, done, bucket, num_events = 0, 0, 0, 0
    decision: Evaluation | None = None
    while done < PRE_SHIFT + POST_SHIFT:
        i = int(np.argmin(finish))
        now = finish[i]
        batch.append(int(length[i]))
        done += 1
        length[i] = float(draw(rng, kind, after if done >= PRE_SHIFT else before, 1)[0])
        start[i], finish[i] = now, now + length[i]
        if len(batch) < DECISION_EVERY:
            continue
        completed = np.array(batch)
        batch.clear()
        prompt_lengths = prompts(rng, completed.size)
        window.add(bucket, LengthHistogram.from_samples(completed), prompt_count=completed.size,
                   prompt_sum_tokens=float(prompt_lengths.sum()))
        if censoring:
            running = (now - start).astype(np.int64)
            window.record_running(bucket, LengthHistogram.from_counts(running, np.ones_like(running)))
        event = detector.update(completed)
        if event is not None:
            num_events += done >= PRE_SHIFT
            window.rebase(window.bucket_of_sample(event.start_index))
        view = window.window(max_samples=WINDOW, min_samples=MIN_WINDOW)
        if view is not None:  # else: hold the previous decision while the re-based window refills
            fit = fit_window(view)
            assert fit is not None
            decision = evaluate(fit.stats, H200_QWEN3_8B, LIMITS, n_prev=n_prev)
            n_prev = decision.n_star
        bucket += 1
        if decision is not None and done >= PRE_SHIFT:
            post_shift.append(done - PRE_SHIFT)
            k_real.append(decision.theta_star * decision.n_star)
            n_star.append(decision.n_star)
    return Trace(np.array(post_shift), np.array(k_real), np.array(n_star), num_events)


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


def summarise(kind: str, before: float, after: float, *, censoring: bool = True, seeds: int = SEEDS) -> Summary:
    steady = steady_state(kind, after)
    traces = [run(seed, kind, before, after, censoring=censoring) for seed in range(seeds)]
    summary = Summary(
        settle_10=float(np.median([settling(t, steady, 0.10) for t in traces])),
        settle_5=float(np.median([settling(t, steady, 0.05) for t in traces])),
        error_300=float(np.median([error_at(t, steady, 300) for t in traces])),
        error_600=float(np.median([error_at(t, steady, 600) for t in traces])),
    )
    print(f"{kind} {before:.0f} → {after:.0f}{'' if censoring else ' (completions only)'}: steady k̂*="
          f"{steady.k_star} (θ̂*·N̂*={steady.theta_star * steady.n_star:.2f}) N̂*={steady.n_star}; median over "
          f"{seeds} seeds: within 10% after {summary.settle_10:.0f} completions, within 5% after "
          f"{summary.settle_5:.0f}; error at 300: {summary.error_300:.1%}, at 600: {summary.error_600:.1%}; "
          f"shifts detected per run: {np.mean([t.num_events for t in traces]):.1f}")
    return summary


# The measured figures (see docs/ARCHITECTURE.md) with some margin: these bounds catch regressions; the goal
# of 300 / 600 completions is not reached for geometric workloads (the requests in flight at the shift).
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


def test_censoring_speeds_up_the_reaction() -> None:
    with_running = summarise("geometric", 1024.0, 256.0, seeds=6)
    completions_only = summarise("geometric", 1024.0, 256.0, censoring=False, seeds=6)
    assert with_running.settle_10 < completions_only.settle_10
    assert with_running.error_600 < completions_only.error_600
