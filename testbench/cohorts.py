"""Cold windows for the survival tests and `benchmarks/lognormal_tail.py`: a cohort of requests admitted at
once, observed part-way.

`slots` requests start together, each slot refilled when its request finishes, observed `cut_tokens` tokens
later: the completions so far, and the running requests' lengths so far (right-censored). The classic
length-biased sample of an engine's first minute, or of the requests admitted since a shift.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from controlplane.core.length_histogram import LengthHistogram

Draw = Callable[[np.random.Generator], int]


def hist(values) -> LengthHistogram:
    array = np.asarray(values, dtype=np.int64)
    return LengthHistogram.from_counts(array, np.ones_like(array))


def cohort(seed: int, *, cut_tokens: int, draw: Draw, slots: int = 512) -> tuple[np.ndarray, np.ndarray]:
    """(completed lengths, running lengths so far) of the cohort described in the module docstring."""
    rng = np.random.default_rng(seed)
    done: list[int] = []
    running: list[int] = []
    for _ in range(slots):
        elapsed = 0
        while (length := draw(rng)) + elapsed <= cut_tokens:
            done.append(length)
            elapsed += length
        running.append(cut_tokens - elapsed)
    return np.array(done), np.array(running)


def geometric(mean_tokens: float) -> Draw:
    return lambda rng: int(rng.geometric(1.0 / mean_tokens))


def uniform(low_tokens: int, high_tokens: int) -> Draw:
    """Uniform on low..high inclusive."""
    return lambda rng: int(rng.integers(low_tokens, high_tokens + 1))


def lognormal(*, sigma: float, mean_tokens: float) -> Draw:
    """⌊X⌉ (at least 1) for X log-normal of shape σ and mean `mean_tokens`."""
    mu = math.log(mean_tokens) - sigma * sigma / 2.0
    return lambda rng: max(1, round(rng.lognormal(mu, sigma)))


def increasing_hazard(*, p0: float, eta: float) -> Draw:
    """Hazard h(t) = p0 + η·t: the inverse of H(t) = p0·t + η·t²/2 at an Exp(1) draw."""
    def draw(rng: np.random.Generator) -> int:
        exp_draw = rng.exponential()
        return max(1, math.ceil((-p0 + math.sqrt(p0 * p0 + 2.0 * eta * exp_draw)) / eta))
    return draw


def mixture(first: Draw, second: Draw, *, first_share: float) -> Draw:
    """A request of `first` with probability first_share, else of `second`."""
    return lambda rng: first(rng) if rng.random() < first_share else second(rng)
