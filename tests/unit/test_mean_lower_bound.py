"""The lower confidence bound on the mean output length that a pool's first completions and running requests
prove (`survival.mean_lower_bound`, `HazardFit.mu_o_lower_tokens`), and before any completion the running
requests alone (`survival.running_mean_lower_bound`): both hold at cold start, whatever the law's shape, and
grow with the requests' ages."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controlplane.core.hazard import MEAN_LOWER_BOUND_Z, fit_hazard_histogram
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.survival import (
    MEAN_BOUND_MIN_AT_RISK,
    WindowObservations,
    life_table,
    mean_lower_bound,
    running_mean_lower_bound,
    sample_mean_lower_bound,
)

CHECK_STEPS = (10, 50, 100, 200, 400)


def _geometric_256(rng: np.random.Generator, size: int) -> np.ndarray:
    return rng.geometric(1 / 256, size)


def _two_point(rng: np.random.Generator, size: int) -> np.ndarray:
    return np.where(rng.random(size) < 0.5, 1, 1000)


def _lognormal(rng: np.random.Generator, size: int) -> np.ndarray:
    return np.maximum(1, np.round(rng.lognormal(math.log(150.0), 1.2, size))).astype(np.int64)


def _geometric_3(rng: np.random.Generator, size: int) -> np.ndarray:
    return rng.geometric(1 / 3, size)


# law, its mean (the log-normal's rounded to whole tokens, by 4,000,000 draws)
LAWS = {"geometric 256": (_geometric_256, 256.0), "1 or 1000": (_two_point, 500.5),
        "log-normal": (_lognormal, 307.5), "geometric 3": (_geometric_3, 3.0)}


def cold_start_bounds(draw, *, slots: int, seed: int) -> dict[int, float]:
    """An engine that starts with `slots` requests, each replaced when it finishes, one token per step: the
    fitted bound at each of CHECK_STEPS from the completions so far and the running requests (censored)."""
    rng = np.random.default_rng(seed)
    target = draw(rng, slots).astype(np.int64)
    age = np.zeros(slots, dtype=np.int64)
    done: list[np.ndarray] = []
    bounds: dict[int, float] = {}
    for step in range(1, max(CHECK_STEPS) + 1):
        age += 1
        finished = age >= target
        if finished.any():
            done.append(target[finished].copy())
            target[finished] = draw(rng, int(finished.sum()))
            age[finished] = 0
        if step in CHECK_STEPS and done:
            completed = LengthHistogram.from_samples(np.concatenate(done))
            fit = fit_hazard_histogram(completed, prompt_count=completed.count,
                                       prompt_sum_tokens=512.0 * completed.count,
                                       censored=LengthHistogram.from_samples(age[age > 0]))
            bounds[step] = fit.mu_o_lower_tokens
    return bounds


@pytest.mark.sim
def test_the_bound_holds_at_cold_start_for_any_shape_of_law() -> None:
    """z = 3: the true mean is above the bound but in about 0.13% of windows; 4 laws × 60 seeds × 5 ages."""
    violations = checked = 0
    for draw, mean in LAWS.values():
        for seed in range(60):
            for bound in cold_start_bounds(draw, slots=256, seed=seed).values():
                checked += 1
                violations += bound > mean
    assert checked >= 1000
    assert violations <= 5, f"{violations} of {checked}"


@pytest.mark.parametrize("name", ["geometric 256", "log-normal"])
def test_the_bound_grows_with_the_requests_ages(name: str) -> None:
    draw, mean = LAWS[name]
    medians = {step: float(np.median([cold_start_bounds(draw, slots=512, seed=seed)[step] for seed in range(15)]))
               for step in CHECK_STEPS}
    values = [medians[step] for step in CHECK_STEPS]
    assert values == sorted(values)
    assert values[0] <= 11.0  # after 10 steps no request is older than 10 tokens: the bound cannot say more
    assert values[-1] >= 0.5 * mean  # measured: 190 of 256, 179 of 307.5


def test_one_long_request_proves_nothing() -> None:
    """Ages where fewer than MEAN_BOUND_MIN_AT_RISK requests are at risk are not read."""
    few = WindowObservations(completed=LengthHistogram.from_samples(np.array([3, 4])),
                             censored=LengthHistogram.from_samples(np.array([5000] * (MEAN_BOUND_MIN_AT_RISK - 3))))
    assert mean_lower_bound(life_table(few), z=MEAN_LOWER_BOUND_Z) == 1.0
    many = WindowObservations(completed=LengthHistogram.from_samples(np.array([3, 4])),
                              censored=LengthHistogram.from_samples(np.array([5000] * 200)))
    # 200 requests past 5,000 tokens with 2 of 202 finished early: the mean is in the thousands.
    assert mean_lower_bound(life_table(many), z=MEAN_LOWER_BOUND_Z) > 3000.0


def test_without_censoring_the_bound_is_the_sample_mean_less_three_standard_errors() -> None:
    outputs = np.random.default_rng(5).geometric(1 / 100, 400).astype(np.float64)
    expected = outputs.mean() - 3.0 * outputs.std() / math.sqrt(outputs.size - 1)
    histogram = fit_hazard_histogram(LengthHistogram.from_samples(outputs.astype(np.int64)),
                                     prompt_count=outputs.size, prompt_sum_tokens=64.0 * outputs.size)
    assert histogram.mu_o_lower_tokens == pytest.approx(expected, rel=1e-9)
    # The Kaplan–Meier form of the same window leaves out the ages past the last 30 at risk: a little lower.
    km = mean_lower_bound(life_table(WindowObservations(completed=LengthHistogram.from_samples(
        outputs.astype(np.int64)))), z=3.0)
    assert 0.9 * expected < km < expected


def test_few_samples_or_nonsense_prove_nothing() -> None:
    assert sample_mean_lower_bound(mean=500.0, std=1.0, count=MEAN_BOUND_MIN_AT_RISK - 1, z=3.0) == 1.0
    assert sample_mean_lower_bound(mean=math.nan, std=1.0, count=1000, z=3.0) == 1.0
    assert sample_mean_lower_bound(mean=2.0, std=50.0, count=1000, z=3.0) == 1.0  # never below one token


def _uniform_200_300(rng: np.random.Generator, size: int) -> np.ndarray:
    return rng.integers(200, 301, size)


def _fixed_300(rng: np.random.Generator, size: int) -> np.ndarray:
    return np.full(size, 300)


# Laws whose first completion comes late (the running-only bound is read until then), with their means.
LATE_LAWS = {"uniform 200-300": (_uniform_200_300, 250.0), "always 300": (_fixed_300, 300.0),
             "log-normal": (_lognormal, 307.5), "geometric 256": (_geometric_256, 256.0)}


def running_only_bounds(draw, *, slots: int, admit_per_step: int, seed: int) -> list[tuple[int, float]]:
    """An engine that admits `admit_per_step` requests a step up to `slots` (a stock engine's ramp), one token
    per step: (step, bound from the running requests) at every step until its first completion."""
    rng = np.random.default_rng(seed)
    target = draw(rng, slots).astype(np.int64)
    age = np.zeros(slots, dtype=np.int64)
    admitted = 0
    bounds = []
    for step in range(1, 2000):
        admitted = min(slots, admitted + admit_per_step)
        age[:admitted] += 1
        if (age[:admitted] >= target[:admitted]).any():
            return bounds
        running = LengthHistogram.from_samples(age[:admitted])
        bounds.append((step, running_mean_lower_bound(running, z=MEAN_LOWER_BOUND_Z)))
    return bounds


@pytest.mark.parametrize("slots, admit_per_step", [(512, 4), (2048, 8), (64, 64)])
def test_the_running_only_bound_holds_before_the_first_completion(slots: int, admit_per_step: int) -> None:
    """Read at every step before the first completion, 4 laws × 20 seeds: never above the true mean (it can be
    at level z = 3 for each step read; measured: 0 violations), and it has grown past a third of the mean by
    the first completion of the laws whose first completion is late (200 and 300 tokens)."""
    checked = 0
    for name, (draw, mean) in LATE_LAWS.items():
        for seed in range(20):
            bounds = running_only_bounds(draw, slots=slots, admit_per_step=admit_per_step, seed=seed)
            checked += len(bounds)
            assert all(bound <= mean for _, bound in bounds), (name, seed, max(b for _, b in bounds))
            assert all(bound <= step + 1 for step, bound in bounds)  # never ahead of the oldest request
            if name in ("uniform 200-300", "always 300"):  # the others have short outputs: an early first
                assert bounds[-1][1] > mean / 3, (name, seed, bounds[-1])
    assert checked >= 10_000


def test_the_running_only_bound_reads_only_ages_with_enough_requests_at_risk() -> None:
    old = LengthHistogram.from_samples(np.array([5000] * (MEAN_BOUND_MIN_AT_RISK - 1)))
    assert running_mean_lower_bound(old, z=3.0) == 1.0
    # 29 requests past 5,000 tokens and 30 at 100: only the age read with 30 at risk counts.
    mixed = LengthHistogram.from_samples(np.array([5000] * (MEAN_BOUND_MIN_AT_RISK - 1) + [100]))
    log_alpha = math.log(0.5 * math.erfc(3.0 / math.sqrt(2.0)))
    assert running_mean_lower_bound(mixed, z=3.0) == pytest.approx(1.0 + 100 * (1.0 + log_alpha / 30))
    # More requests at risk, a tighter bound: 300 at age 100 prove about 98 tokens.
    many = LengthHistogram.from_samples(np.array([100] * 300))
    assert 97.0 < running_mean_lower_bound(many, z=3.0) < 100.0
    assert running_mean_lower_bound(many, z=math.nan) == running_mean_lower_bound(many, z=-1.0) == 1.0
    assert running_mean_lower_bound(LengthHistogram.empty(), z=3.0) == 1.0


def test_requests_first_seen_old_prove_nothing_about_the_ages_before() -> None:
    """A controller that starts beside an engine draining a batch of outputs of 1 or 1,000 tokens (mean
    500.5): the short half finished unseen, and the 500 long ones are at 500 tokens when first seen and at
    600 a hundred steps later, none completed. Read as if seen from their start they would "prove" a mean
    near 590; with their lengths when first seen as `entered` they prove nothing about the ages before, and
    a second batch started since (300 requests at 80 tokens) proves only its own 78."""
    first_seen = LengthHistogram.from_samples(np.full(500, 500))
    later = LengthHistogram.from_samples(np.full(500, 600))
    assert running_mean_lower_bound(later, z=3.0) > 500.5  # the biased reading
    assert running_mean_lower_bound(later, z=3.0, entered=first_seen) == 1.0
    both = LengthHistogram.from_samples(np.concatenate([np.full(500, 600), np.full(300, 80)]))
    assert 75.0 < running_mean_lower_bound(both, z=3.0, entered=first_seen) < 80.0
