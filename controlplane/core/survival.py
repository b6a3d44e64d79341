"""Output-length survival analysis over histograms: windows with censored and left-truncated requests.

Why: completions alone are a length-biased sample whenever the workload is not stationary. After a shift
towards longer outputs the short ones finish first, and a fit over completions alone sees a hazard far
too high. The requests still running are right-censored observations (a request that has produced c tokens
and is still running survived every t ≤ c), and the requests already running when a window opens are
left-truncated (their first tokens were produced before the window).

Exposure of a window over token ages (the Lexis count): a request is at risk at age t inside the window
when it produces its t-th token inside it, i.e. when c_open < t ≤ c_end, with c_open its length when the
window opened (0 when it started inside it) and c_end its final length (completed) or its length when the
window closed (still running). Summed over requests:

    n(t) = #{completed O ≥ t} + #{running at close c ≥ t} − #{running at open c ≥ t},   d(t) = #{O = t},

and ĥ(t) = d(t)/n(t) estimates the hazard of the requests served in the window, stationary or not (with no
running requests at either end it is the plain completion-window estimate). Requests that left without
completing (aborted) are in none of the three sets; they make n(t) slightly low, and n(t) is kept ≥ d(t).

Kaplan–Meier: Ŝ(t) = Π_{s≤t} (1 − d(s)/n(s)); the 95th percentile and the first two moments of the length
come from it (up to the last observed age, then a constant-hazard tail, see `length_moments`).

A window re-based at a detected shift (`controlplane.loop.pool_stats`) opens with the requests then in flight,
which follow the old law and finish inside it. While it holds fewer than TRANSIENT_FACTOR × (requests in flight
at its opening) completions they are a large share of it: the window is transient (`is_shift_transient`), and
the fit keeps only the young requests' hazard (`hazard.fit_hazard_histogram(shift_transient=True)`).

Pure: no I/O, no clock. Cost O(T) for T the largest age observed (dense life table, at most
MAX_TABLE_TOKENS; longer observations count as at risk up to it without an event).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controlplane.core.length_histogram import LengthHistogram

# Largest age a dense life table covers (longer observations are censored there).
MAX_TABLE_TOKENS = 1 << 20
# A re-based window is transient while it holds fewer completions than this many times the requests in flight
# at its opening: by then each of them has had about as many completions' time to finish as there were
# requests, and their share of the window is small.
TRANSIENT_FACTOR = 2
# `mean_lower_bound` reads the Kaplan–Meier curve only where at least this many requests are at risk.
MEAN_BOUND_MIN_AT_RISK = 30
# `oldest_band_hazard`: the band of the oldest ages holding this share of the events, and the standard errors
# by which its hazard must differ from the hazard of all ages to stand for the ages past the curve.
OLDEST_BAND_SHARE = 0.25
OLDEST_BAND_Z = 3.0


@dataclass(frozen=True, eq=False, slots=True)
class WindowObservations:
    """The length observations of one window.

    completed: final output lengths of the requests that completed inside the window.
    censored: lengths of the requests still running when the window closed (None: not known).
    truncated: lengths of the requests already running when the window opened (None: not known).
    """

    completed: LengthHistogram
    censored: LengthHistogram | None = None
    truncated: LengthHistogram | None = None


def is_shift_transient(*, rebased: bool, num_completed: int, truncated: LengthHistogram | None) -> bool:
    """Whether a window is transient (see the module docstring): re-based at a shift, its opening known, and
    fewer than TRANSIENT_FACTOR completions per request in flight at the opening."""
    return rebased and truncated is not None and num_completed < TRANSIENT_FACTOR * truncated.count


def dense_events_and_exposure(window: WindowObservations, *, t_max: int) -> tuple[np.ndarray, np.ndarray]:
    """(d(t), n(t)) for t = 1..t_max (see the module docstring), n(t) ≥ d(t).

    Integer arrays when the window has only completions (equal counts give bit-for-bit equal fits to the
    sample form); float arrays otherwise.
    """
    completed = window.completed.dense_counts(t_max)
    events = completed[1:]
    # #{O ≥ t} for t = 1..t_max: everything minus what completed before t.
    at_risk = window.completed.count - np.concatenate(([0], np.cumsum(events)[:-1]))
    if window.censored is None and window.truncated is None:
        return events, at_risk
    table = life_table(window)
    span = min(t_max, table.events.size)
    events = np.zeros(t_max, dtype=np.float64)
    at_risk = np.zeros(t_max, dtype=np.float64)
    events[:span] = table.events[:span]
    at_risk[:span] = table.at_risk[:span]
    return events, at_risk


@dataclass(frozen=True, eq=False, slots=True)
class LifeTable:
    """Events d(t) and exposure n(t) for t = 1..last_age (float arrays, index t − 1).

    last_age: the largest age observed (completed or censored). n(t) ≥ d(t).
    """

    events: np.ndarray
    at_risk: np.ndarray
    last_age: int

    @property
    def total_events(self) -> float:
        return float(self.events.sum())

    @property
    def total_exposure(self) -> float:
        return float(self.at_risk.sum())


def _at_least(histogram: LengthHistogram, span: int) -> np.ndarray:
    """#{x ≥ t} for t = 1..span as float64."""
    return histogram.count_at_least(np.arange(1, span + 1, dtype=np.int64)).astype(np.float64)


def life_table(window: WindowObservations) -> LifeTable:
    """The window's dense life table (see the module docstring). O(T), T the largest age observed."""
    censored = window.censored
    last_age = max(window.completed.max_length(), censored.max_length() if censored is not None else 0)
    span = min(max(last_age, 1), MAX_TABLE_TOKENS)
    events = window.completed.dense_counts(span)[1:].astype(np.float64)
    at_risk = _at_least(window.completed, span)
    if censored is not None:
        at_risk += _at_least(censored, span)
    if window.truncated is not None:
        at_risk -= _at_least(window.truncated, span)
    at_risk = np.maximum(at_risk, events)
    return LifeTable(events=events, at_risk=at_risk, last_age=min(last_age, MAX_TABLE_TOKENS))


def km_survival(table: LifeTable) -> np.ndarray:
    """Ŝ(t) for t = 1..last_age (no one at risk at t: hazard 0 there)."""
    hazard = np.divide(table.events, table.at_risk, out=np.zeros_like(table.events), where=table.at_risk > 0.0)
    return np.cumprod(1.0 - hazard)


def km_percentile(survival: np.ndarray, percent: float) -> int | None:
    """Smallest t with 1 − Ŝ(t) ≥ percent/100, or None when the curve does not get there."""
    reached = np.nonzero(survival <= 1.0 - percent / 100.0)[0]
    return int(reached[0]) + 1 if reached.size else None


def restricted_sums(survival: np.ndarray) -> tuple[float, float, float]:
    """(Σ_{t=0}^{τ} Ŝ(t), Σ_{t=0}^{τ} (2t+1)·Ŝ(t), Ŝ(τ)) for Ŝ(t), t = 1..τ, and Ŝ(0) = 1: the parts of E[O] and
    E[O²] the curve itself holds; a tail past τ adds to both (`length_moments`)."""
    t = np.arange(0, survival.size + 1, dtype=np.float64)
    levels = np.concatenate(([1.0], survival))
    return float(levels.sum()), float(((2.0 * t + 1.0) * levels).sum()), float(levels[-1])


def length_moments(survival: np.ndarray, *, p0: float) -> tuple[float, float]:
    """(mean, standard deviation) of the output length, in tokens, from Ŝ(t), t = 1..τ.

    E[O] = Σ_{t≥0} S(t) and E[O²] = Σ_{t≥0} (2t+1)·S(t), with S(0) = 1, Ŝ up to the last observed age τ
    (a restricted mean) and, beyond τ, Ŝ(τ) times the survival of a constant hazard p0 (the caller's: the
    fitted intercept, or a measured rate no higher than the hazard past τ, see `hazard._tail_hazard`). With
    no censored request past the last completion Ŝ(τ) = 0 and these are the moments of the completions. The
    constant tail is the conservative choice for memory (N̂* reads 1/μ_O): a true IFR tail ends sooner, and
    extrapolating a fitted slope far past the data would trust exactly the slopes that mixtures of two
    workloads fake mid-shift. NaN when the tail is needed and p0 ≤ 0.
    """
    first, second, s_tau = restricted_sums(survival)
    if s_tau > 0.0:
        p = min(p0, 1.0)
        if not p > 0.0:
            return math.nan, math.nan
        tau = float(survival.size)
        ratio = (1.0 - p) / p  # Σ_{j≥1} (1 − p)^j
        first += s_tau * ratio
        second += s_tau * ((2.0 * tau + 1.0) * ratio + 2.0 * (1.0 - p) / (p * p))
    return first, math.sqrt(max(second - first * first, 0.0))


def oldest_band_hazard(table: LifeTable, *, span: int) -> float | None:
    """The hazard at the oldest ages of the curve, when it is measurably not the hazard of all ages: events
    over exposure at the oldest ages ≤ span holding OLDEST_BAND_SHARE of the events up to span, when they
    differ from the events over exposure up to span by OLDEST_BAND_Z standard errors (a Poisson count of the
    band's events against those all ages' rate predicts, conditioned on the total); else None.

    Why: the moments continue the curve past its last age by a constant hazard (`length_moments`). The
    rate of all ages averages over the young ones, where a law with a minimum length (a uniform one) or an
    increasing hazard has few events; while a window's oldest requests are young (just after a shift to
    longer outputs), that rate put the tail mean at 2–3× the law's. The hazard past the last age is closer
    to the hazard just before it, whatever the law's shape: under an increasing hazard the band's rate is
    still no higher than the hazard past the curve (a mean no shorter than the truth); under a decreasing
    one it lies between that hazard and the average. For a constant hazard the test keeps the average of
    all ages (less noise; the band is used in about 3 windows in 1,000 then, the test's two-sided level).
    None when span < 1 or there is no event up to span.
    """
    span = min(span, table.events.size)
    if span < 1:
        return None
    events, at_risk = table.events[:span], table.at_risk[:span]
    total_events, total_exposure = float(events.sum()), float(at_risk.sum())
    if not (total_events > 0.0 and total_exposure > 0.0):
        return None
    from_oldest = np.cumsum(events[::-1])
    first = span - 1 - int(np.searchsorted(from_oldest, OLDEST_BAND_SHARE * total_events))
    band_events, band_exposure = float(events[first:].sum()), float(at_risk[first:].sum())
    share = band_exposure / total_exposure
    expected = total_events * share
    spread = math.sqrt(total_events * share * (1.0 - share))
    if not (band_exposure > 0.0 and spread > 0.0) or abs(band_events - expected) < OLDEST_BAND_Z * spread:
        return None
    return min(band_events / band_exposure, 1.0)


def geometric_mean_length(survival: np.ndarray) -> float | None:
    """The mean μ of the length whose curve is Ŝ up to τ and geometric with rate 1/μ beyond it, in tokens.

    μ = R + Ŝ(τ)·(μ − 1) with R = Σ_{t=0}^{τ} Ŝ(t), i.e. μ = (R − Ŝ(τ))/(1 − Ŝ(τ)); the sample mean when nothing
    is censored (Ŝ(τ) = 0). None when the curve never drops (no completion: no estimate).
    """
    s_tau = float(survival[-1]) if survival.size else 1.0
    if not s_tau < 1.0:
        return None
    restricted = 1.0 + float(survival.sum())
    return (restricted - s_tau) / (1.0 - s_tau)


def mean_lower_bound(table: LifeTable, *, z: float, survival: np.ndarray | None = None) -> float:
    """A one-sided lower confidence bound on the mean output length, in tokens (≥ 1): the Kaplan–Meier
    restricted mean R = Σ_{t=0}^{τ} Ŝ(t) = Ê[min(O, τ + 1)] minus z standard errors.

    R never exceeds the mean it estimates (the part of the law past the last observed age τ is left out), so
    the bound holds whatever happens beyond τ, with no assumption on the law's shape. Its variance is the
    Greenwood sum Σ_j A_j²·d_j / (n_j·(n_j − d_j)), A_j = Σ_{t≥j} Ŝ(t) the area a completion at age j moves.
    Early in a pool's life, while every request is young, τ is small and so is the bound: it grows with
    the requests' ages, never ahead of them. τ is the last age with at least MEAN_BOUND_MIN_AT_RISK requests
    at risk: Greenwood's variance is 0 over ages without a completion, which would let a single long-running
    request "prove" a mean as long as its age (with 30 at risk and none completing, a mean below τ would have
    had about 30 expected completions there). `survival`: the table's `km_survival`, when the caller has it.
    """
    reached = np.nonzero(table.at_risk >= MEAN_BOUND_MIN_AT_RISK)[0]
    if reached.size == 0:
        return 1.0
    span = int(reached[-1]) + 1
    survival = (km_survival(table) if survival is None else survival)[:span]
    restricted = 1.0 + float(survival.sum())
    area_from = np.cumsum(survival[::-1])[::-1]  # A_j for j = 1..τ
    events, at_risk = table.events[:span], table.at_risk[:span]
    survivors = at_risk - events
    weights = np.divide(events, at_risk * survivors, out=np.zeros_like(events), where=survivors > 0.0)
    variance = float((area_from * area_from * weights).sum())
    return max(1.0, restricted - z * math.sqrt(variance))


def running_mean_lower_bound(running: LengthHistogram, *, z: float,
                             entered: LengthHistogram | None = None) -> float:
    """A one-sided lower confidence bound on the mean output length, in tokens (≥ 1), from requests still
    running, while none has completed.

    A request seen running at c_0 tokens and later at c has outlived tokens c_0 + 1 … c: the requests at risk
    at age s number n(s) = #{c ≥ s} − #{c_0 ≥ s} (`entered`: the requests' lengths when first seen, None: all
    seen from their start), and none of them ended there. That has probability Π_s (1 − h(s))^n(s) ≤
    exp(−n_min(t)·Λ(t)), Λ(t) = Σ_{s≤t} h(s) and n_min(t) = min_{s≤t} n(s); so Λ(t) ≤ −ln α / n_min(t) at
    confidence 1 − α, α = Φ(−z), and P(O > t) ≥ 1 − Λ(t). The mean is 1 + Σ_{s≥1} P(O > s) ≥ 1 + t·P(O > t),
    as P(O > s) does not increase: the bound is the largest 1 + t·(1 + ln α / n_min(t)) over the ages t with
    n_min(t) ≥ MEAN_BOUND_MIN_AT_RISK (0.78·t with 30 at risk at z = 3, 0.98·t with 300). Requests seen only
    when already old prove nothing about the ages before (a controller that starts beside a busy fleet: its
    short requests had finished unseen). `mean_lower_bound` cannot be used here: with no completion its
    Greenwood variance is 0, and it would read P(O > t) = 1. Valid only while no request has completed since
    `entered` (aborted or preempted requests leave `running` and only make n smaller); 1 when nothing is
    proven.
    """
    if running.count < MEAN_BOUND_MIN_AT_RISK or not math.isfinite(z) or z <= 0.0:
        return 1.0
    span = min(running.max_length(), MAX_TABLE_TOKENS)
    at_risk = _at_least(running, span)
    if entered is not None and entered.count:
        at_risk = np.maximum(at_risk - _at_least(entered, span), 0.0)
    n_min = np.minimum.accumulate(at_risk)
    reached = np.nonzero(n_min >= MEAN_BOUND_MIN_AT_RISK)[0]
    if reached.size == 0:
        return 1.0
    log_alpha = math.log(0.5 * math.erfc(z / math.sqrt(2.0)))
    ages = reached.astype(np.float64) + 1.0
    survival = np.maximum(1.0 + log_alpha / n_min[reached], 0.0)
    return max(1.0, 1.0 + float(np.max(ages * survival)))


def sample_mean_lower_bound(*, mean: float, std: float, count: int, z: float) -> float:
    """`mean_lower_bound` of a window with nothing censored: the sample mean minus z standard errors (≥ 1;
    1 below MEAN_BOUND_MIN_AT_RISK samples)."""
    if count < MEAN_BOUND_MIN_AT_RISK or not (math.isfinite(mean) and math.isfinite(std)):
        return 1.0
    return max(1.0, mean - z * std / math.sqrt(count - 1))


@dataclass(frozen=True, slots=True)
class HazardComparison:
    """The two-sample log-rank comparison of two windows' hazards (`compare_hazards`).

    z: standardised difference, > 0 when `after` has the higher hazard (shorter outputs), 0 when nothing
      can be compared. events_after: completions of `after` at ages where both windows have requests at risk
      (the information the test rests on).
    """

    z: float
    events_after: float


def compare_hazards(before: WindowObservations, after: WindowObservations) -> HazardComparison:
    """Log-rank test of "same output-length hazard" between two windows, on their life tables.

    At each age t where both have requests at risk: the completions of `after` observed, d_a(t), against
    those expected when both share one hazard, e(t) = d(t)·n_a(t)/n(t) (d, n summed over both), with the
    hypergeometric variance v(t) = d·n_b·n_a·(n − d)/(n²·(n − 1)); z = Σ(d_a − e)/√Σv. Because each
    window's exposure counts its censored and left-truncated requests, z is N(0, 1) under one stationary
    law even while the completion stream is length-biased (after a shift to longer outputs the short ones
    finish first, for several mean lifetimes): the test tells a change of the law from a change of which requests
    happen to be finishing, which a test on the completed lengths alone cannot. Cost O(T), T the largest
    age observed in either window.
    """
    a, b = life_table(before), life_table(after)
    span = min(a.events.size, b.events.size)  # past the shorter table one side has nobody at risk
    d_b, n_b = a.events[:span], a.at_risk[:span]
    d_a, n_a = b.events[:span], b.at_risk[:span]
    n = n_a + n_b
    d = d_a + d_b
    both = (n_a > 0.0) & (n_b > 0.0) & (d > 0.0)
    if not both.any():
        return HazardComparison(z=0.0, events_after=0.0)
    n, d, n_a, n_b, d_a = n[both], d[both], n_a[both], n_b[both], d_a[both]
    expected = d * n_a / n
    variance = d * n_a * n_b * np.maximum(n - d, 0.0) / (n * n * np.maximum(n - 1.0, 1.0))
    total_variance = float(variance.sum())
    events_after = float(d_a.sum())
    if not total_variance > 0.0:
        return HazardComparison(z=0.0, events_after=events_after)
    return HazardComparison(z=float((d_a - expected).sum()) / math.sqrt(total_variance), events_after=events_after)
