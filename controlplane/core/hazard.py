"""Output-length hazard estimation (EB paper §3.4, online estimation).

`LengthWindow` keeps the last W_O output lengths and W_L prompt lengths of finished, non-aborted
requests in preallocated ring buffers: adding a batch costs O(batch) and never grows memory.
`fit_hazard` estimates ĥ(t) = #{O = t} / #{O ≥ t} over the window and fits ĥ(t) = p0 + η·t by weighted
least squares over t ∈ [1, t95]; it is O(window + t95), vectorised with numpy.

Weights: the at-risk count n(t) = #{O ≥ t}. ĥ(t) is a binomial proportion with variance
h(1−h)/n(t); for the small hazards of LLM outputs (h ≪ 1) h(1−h) is nearly constant over t, so n(t) is
the inverse variance up to a constant. It also makes the fit consistent with the geometric maximum
likelihood estimate (Σd(t)/Σn(t)) when η = 0, and down-weights the noisy tail where few requests are
left at risk.

Slope significance: the slope is kept only when it is at least SLOPE_SIGNIFICANCE_Z standard errors
from zero; otherwise the window is treated as constant-hazard and p0 is the weighted mean Σd(t)/Σn(t)
(the geometric maximum-likelihood estimate over [1, t95]). A free slope inflates the intercept's
variance about threefold for geometric data (2,000 samples: 95th-percentile error 6.8% with the free
slope, about 4% with the test), and an insignificant slope would only feed noise into Δθ.

No I/O, no clock. Invalid samples (NaN, inf, ≤ 0, non-integral) are rejected and counted, never stored.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controlplane.core.types import WorkloadStats

DEFAULT_OUTPUT_WINDOW = 4096
DEFAULT_PROMPT_WINDOW = 4096
# Fewer than this many distinct t points with someone at risk cannot support a two-parameter fit.
MIN_FIT_POINTS = 2
# A slope within this many standard errors of 0 is not kept (see fit_hazard).
SLOPE_SIGNIFICANCE_Z = 2.0
# The fit allocates O(t95) memory; beyond this span (far longer than any real output) it is not attempted
# and the geometric MLE fallback is used instead.
MAX_FIT_SPAN_TOKENS = 1 << 20


@dataclass(frozen=True, slots=True)
class HazardFit:
    """Result of a hazard fit: the workload stats and whether the intercept/slope needed a fallback.

    intercept_fallback: the WLS intercept was ≤ 0 or not finite; p0 was replaced by the geometric MLE
    1/μ_O and η by 0. slope_clipped: the WLS slope was negative (a DFR window); η was clipped to 0.
    """

    stats: WorkloadStats
    intercept_fallback: bool
    slope_clipped: bool


def _valid_lengths(values: np.ndarray) -> np.ndarray:
    """Mask of finite, integral, positive lengths."""
    finite = np.isfinite(values)
    safe = np.where(finite, values, 0.0)
    return finite & (safe >= 1.0) & (np.floor(safe) == safe)


class _Ring:
    """Fixed-capacity ring of float64; `append` is O(batch), `view` copies at most the capacity."""

    __slots__ = ("_buf", "_count", "_head")

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"window capacity must be ≥ 1, got {capacity}")
        self._buf = np.zeros(capacity, dtype=np.float64)
        self._head = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, values: np.ndarray) -> None:
        capacity = self._buf.size
        if values.size >= capacity:
            self._buf[:] = values[-capacity:]
            self._head = 0
            self._count = capacity
            return
        end = self._head + values.size
        if end <= capacity:
            self._buf[self._head : end] = values
        else:
            first = capacity - self._head
            self._buf[self._head :] = values[:first]
            self._buf[: end - capacity] = values[first:]
        self._head = end % capacity
        self._count = min(capacity, self._count + values.size)

    def view(self) -> np.ndarray:
        """The stored values, oldest first (a copy)."""
        if self._count < self._buf.size:
            return self._buf[: self._count].copy()
        return np.concatenate((self._buf[self._head :], self._buf[: self._head]))


class LengthWindow:
    """Sliding windows of recent output (W_O) and prompt (W_L) lengths, in tokens."""

    def __init__(
        self,
        *,
        output_window: int = DEFAULT_OUTPUT_WINDOW,
        prompt_window: int = DEFAULT_PROMPT_WINDOW,
    ) -> None:
        self._outputs = _Ring(output_window)
        self._prompts = _Ring(prompt_window)
        self.num_rejected = 0
        self.num_accepted = 0

    def add_completions(self, prompt_tokens: np.ndarray, output_tokens: np.ndarray) -> int:
        """Add a batch of finished, non-aborted requests; returns how many were rejected.

        A pair is kept only when both lengths are valid (finite, integral, ≥ 1). Arrays of different
        lengths are rejected whole. O(batch).
        """
        prompts = np.asarray(prompt_tokens, dtype=np.float64).ravel()
        outputs = np.asarray(output_tokens, dtype=np.float64).ravel()
        if prompts.size != outputs.size:
            rejected = max(prompts.size, outputs.size)
            self.num_rejected += rejected
            return rejected
        keep = _valid_lengths(prompts) & _valid_lengths(outputs)
        num_kept = int(np.count_nonzero(keep))
        if num_kept:
            self._prompts.append(prompts[keep])
            self._outputs.append(outputs[keep])
        rejected = int(prompts.size - num_kept)
        self.num_rejected += rejected
        self.num_accepted += num_kept
        return rejected

    def output_lengths(self) -> np.ndarray:
        return self._outputs.view()

    def prompt_lengths(self) -> np.ndarray:
        return self._prompts.view()

    def __len__(self) -> int:
        return len(self._outputs)


def fit_hazard(output_lengths: np.ndarray, prompt_lengths: np.ndarray) -> HazardFit | None:
    """Estimate p0, η, μ_L, μ_O, σ_O and t95 from the windows.

    Args:
        output_lengths: output lengths in tokens (invalid entries are ignored).
        prompt_lengths: prompt lengths in tokens (invalid entries are ignored).
    Returns:
        The fit, or None when either window has no valid sample. Fallbacks (flagged on the result):
        an intercept ≤ 0 → p0 = 1/μ_O, η = 0; a negative slope → η = 0. Fewer than MIN_FIT_POINTS
        at-risk t values, or t95 > MAX_FIT_SPAN_TOKENS → the geometric MLE p0 = 1/μ_O, η = 0
        (intercept_fallback set).
    """
    outputs = np.asarray(output_lengths, dtype=np.float64)
    prompts = np.asarray(prompt_lengths, dtype=np.float64)
    outputs = outputs[_valid_lengths(outputs)]
    prompts = prompts[_valid_lengths(prompts)]
    if outputs.size == 0 or prompts.size == 0:
        return None
    mu_o = float(outputs.mean())
    sigma_o = float(outputs.std())
    mu_l = float(prompts.mean())
    t95 = float(np.percentile(outputs, 95.0, method="inverted_cdf"))
    fit = _wls_line(outputs, t_max=int(t95)) if t95 <= MAX_FIT_SPAN_TOKENS else None
    intercept_fallback = False
    slope_clipped = False
    if fit is None:
        p0, eta, intercept_fallback = 1.0 / mu_o, 0.0, True
    else:
        p0, eta = fit
        if not (math.isfinite(p0) and p0 > 0.0 and math.isfinite(eta)):
            p0, eta, intercept_fallback = 1.0 / mu_o, 0.0, True
        elif eta < 0.0:
            eta, slope_clipped = 0.0, True
    stats = WorkloadStats(
        p0=min(p0, 1.0),
        eta=eta,
        mu_l_tokens=mu_l,
        mu_o_tokens=mu_o,
        sigma_o_tokens=sigma_o,
        t95_tokens=t95,
        num_samples=int(outputs.size),
    )
    return HazardFit(stats=stats, intercept_fallback=intercept_fallback, slope_clipped=slope_clipped)


def _wls_line(outputs: np.ndarray, *, t_max: int) -> tuple[float, float] | None:
    """Fit ĥ(t) = p0 + η·t over t ∈ [1, t_max] with weights n(t); None when under-determined."""
    if t_max < 1:
        return None
    # Clip before the cast: lengths beyond int64 would wrap to negative values.
    lengths = np.minimum(outputs, t_max + 1).astype(np.int64)
    # Completions at t for t = 1..t_max (longer ones only count as at risk).
    completions = np.bincount(np.minimum(lengths, t_max + 1), minlength=t_max + 2)[1 : t_max + 1]
    at_risk = lengths.size - np.concatenate(([0], np.cumsum(completions)[:-1]))
    t = np.arange(1, t_max + 1, dtype=np.float64)
    used = at_risk > 0
    if np.count_nonzero(used) < MIN_FIT_POINTS:
        return None
    t = t[used]
    weights = at_risk[used].astype(np.float64)
    hazard = completions[used] / weights
    sum_w = weights.sum()
    t_mean = float((weights * t).sum() / sum_w)
    h_mean = float((weights * hazard).sum() / sum_w)
    dt = t - t_mean
    s_tt = float((weights * dt * dt).sum())
    if s_tt <= 0.0:
        return None
    eta = float((weights * dt * (hazard - h_mean)).sum() / s_tt)
    # Var(η̂) = Σ n(t)·(t − t̄)²·h(1−h) / s_tt² ≈ h̄(1−h̄)/s_tt under the binomial model.
    eta_std_error = math.sqrt(max(h_mean * (1.0 - h_mean), 0.0) / s_tt)
    if abs(eta) < SLOPE_SIGNIFICANCE_Z * eta_std_error:
        return h_mean, 0.0
    return h_mean - eta * t_mean, eta
