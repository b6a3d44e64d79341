"""Mergeable least-squares statistics of step costs: the cost model fitted from normal-equation sums.

A fleet's pools are fitted from many engines' steps and, across controller replicas, from each other's
contributions. Keeping the sums Σxxᵀ, Σxy, Σy², n per phase (instead of sample windows) makes a sliding
window a sum of time buckets and a fit O(1) in the number of steps. The models are those of
`cost_model.CostModelEstimator`:

  prefill-only steps: duration = α_p + β_p·P                      features [1, P]
  decode-only steps:  duration = α_d + β_d·R                      features [1, R]
  mixed steps:        duration = α_MB + (c0 + c1·r + c2·r²)·T     features [1, P, D, D²/T]
      (T = P + D tokens, r = D/T; the quadratic model is linear in [1, P, D, D²/T] with coefficients
      b = (α_MB, c0, c0 + c1, c2); when its α_MB is not positive, the additive model over [1, P, D] —
      a sub-block of the same sums — is used, as the sample-window estimator does)

Bounds: the prefill and decode lines are bounded least squares (α ≥ MIN_ALPHA_S, β ≥ MIN_SLOPE), as in
`cost_model`: from the sums alone, since ‖Xb − y‖² = bᵀGb − 2bᵀΣxy + Σy² with G = Σxxᵀ; the bounded
quadratic is solved exactly over the faces of the box (`_bounded_from_gram`, the same optimum as the
sample-window estimator's `scipy.optimize.lsq_linear`). The mixed fit is unbounded (the sign of its α_MB
picks the additive model).

Outliers: sums cannot reject a sample after the fact, so `add_steps` takes a reference cost model and
drops steps whose duration is beyond OUTLIER_RATIO× (or below 1/OUTLIER_RATIO of) its prediction before
they enter the sums (a stalled step from time-slicing or a GC pause must not tilt the fit). Rejected
steps are counted.

No I/O, no clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from controlplane.core.cost_model import LINE_LOWER_BOUNDS, MIN_FIT_SAMPLES, CostFit, LinearFit
from controlplane.core.types import CostModel

OUTLIER_RATIO = 4.0
_WIDTHS = {"prefill": 2, "decode": 2, "mixed": 4}
_SERIAL_SIZE = sum(w * w + w + 2 for w in _WIDTHS.values())


class _PhaseSums:
    """Σxxᵀ, Σxy, Σy², n of one phase's regression."""

    __slots__ = ("gram", "n", "xy", "yy")

    def __init__(self, width: int) -> None:
        self.gram = np.zeros((width, width))
        self.xy = np.zeros(width)
        self.yy = 0.0
        self.n = 0.0

    def add(self, features: np.ndarray, target: np.ndarray) -> None:
        if target.size == 0:
            return
        self.gram += features.T @ features
        self.xy += features.T @ target
        self.yy += float(target @ target)
        self.n += float(target.size)

    def add_sums(self, other: _PhaseSums) -> None:
        self.gram += other.gram
        self.xy += other.xy
        self.yy += other.yy
        self.n += other.n

    def fit(self, columns: list[int] | None = None, *,
            lower_bounds: tuple[float, ...] | None = None) -> LinearFit | None:
        """Least squares over the given feature columns (all by default), bounded below by `lower_bounds`
        (one per column; None: unbounded); None when under-determined."""
        idx = list(range(self.xy.size)) if columns is None else columns
        if self.n < max(MIN_FIT_SAMPLES, len(idx)):
            return None
        gram = self.gram[np.ix_(idx, idx)]
        xy = self.xy[idx]
        scale = np.sqrt(np.diag(gram))
        if not np.all(scale > 0.0):
            return None
        scaled = gram / np.outer(scale, scale)
        # A nearly collinear design (e.g. all mixed steps at one decode ratio) is under-determined.
        if np.linalg.cond(scaled) > 1e12:
            return None
        coef = np.linalg.solve(scaled, xy / scale) / scale
        if lower_bounds is not None and not np.all(coef >= lower_bounds):
            coef = _bounded_from_gram(scaled, xy / scale, np.asarray(lower_bounds) * scale)
            if coef is None:
                return None
            coef = np.maximum(coef / scale, lower_bounds)
        sum_y = self.xy[0]  # the first feature is the constant 1
        total = self.yy - sum_y * sum_y / self.n
        residual = self.yy - 2.0 * float(coef @ xy) + float(coef @ gram @ coef)
        r2 = 1.0 if total <= 0.0 else 1.0 - max(residual, 0.0) / total
        if not all(math.isfinite(c) for c in coef):
            return None
        return LinearFit(coefficients=tuple(float(c) for c in coef), r2=float(r2), num_samples=int(self.n),
                         num_outliers=0)


def _bounded_from_gram(gram: np.ndarray, xy: np.ndarray, lower: np.ndarray) -> np.ndarray | None:
    """argmin bᵀ·gram·b − 2·bᵀ·xy subject to b ≥ lower (−inf: unbounded); None when gram is not positive
    definite.

    Exact, by faces of the box: the optimum of a strictly convex quadratic over the box is the stationary
    point of the quadratic on the face it lies on (the variables at their bounds fixed, the others free),
    so the feasible face stationary point with the least objective is the optimum. 2^n faces: n is 2 here
    (a line's α and β). numpy only: the controller does not load scipy.optimize for it (40 MiB of RSS).
    """
    try:
        np.linalg.cholesky(gram)
    except np.linalg.LinAlgError:
        return None
    n = xy.size
    best, best_value = None, math.inf
    for mask in range(1 << n):
        fixed = [i for i in range(n) if mask >> i & 1]
        if any(not math.isfinite(lower[i]) for i in fixed):
            continue
        free = [i for i in range(n) if not mask >> i & 1]
        b = np.where(np.isfinite(lower), lower, 0.0).astype(np.float64)
        if free:
            rhs = xy[free] - gram[np.ix_(free, fixed)] @ b[fixed]
            b[free] = np.linalg.solve(gram[np.ix_(free, free)], rhs)
            if np.any(b[free] < lower[free]):
                continue
        value = float(b @ gram @ b - 2.0 * b @ xy)
        if value < best_value:
            best, best_value = b, value
    return best


@dataclass(frozen=True, slots=True)
class StepColumns:
    """A batch of engine steps, columnar float64 arrays of one length (tokens, requests, seconds)."""

    prefill_tokens: np.ndarray
    decode_tokens: np.ndarray
    decode_requests: np.ndarray
    duration_s: np.ndarray


class CostSums:
    """Normal-equation sums of the three step-cost regressions; mergeable and serialisable."""

    __slots__ = ("_phases", "num_rejected")

    def __init__(self) -> None:
        self._phases = {name: _PhaseSums(width) for name, width in _WIDTHS.items()}
        self.num_rejected = 0

    @property
    def num_steps(self) -> int:
        return int(sum(p.n for p in self._phases.values()))

    def add_steps(self, steps: StepColumns, *, reference: CostModel | None = None) -> int:
        """Add valid steps (see the module docstring); returns how many were rejected. O(batch)."""
        prefill, decode, requests, duration = (np.asarray(c, dtype=np.float64) for c in (
            steps.prefill_tokens, steps.decode_tokens, steps.decode_requests, steps.duration_s))
        valid = np.isfinite(prefill) & np.isfinite(decode) & np.isfinite(requests) & np.isfinite(duration)
        valid &= (duration > 0.0) & (prefill >= 0.0) & (decode >= 0.0) & (requests >= 0.0)
        valid &= (prefill + decode) > 0.0
        if reference is not None:
            predicted = predict_duration_s(reference, prefill, decode, requests)
            with np.errstate(invalid="ignore", divide="ignore"):
                ratio = duration / predicted
            valid &= ~(np.isfinite(predicted) & (predicted > 0.0)) | (
                (ratio <= OUTLIER_RATIO) & (ratio >= 1.0 / OUTLIER_RATIO))
        ones = np.ones_like(duration)
        pre = valid & (decode == 0.0)
        dec = valid & (prefill == 0.0)
        mix = valid & (prefill > 0.0) & (decode > 0.0)
        if pre.any():
            self._phases["prefill"].add(np.column_stack((ones[pre], prefill[pre])), duration[pre])
        if dec.any():
            self._phases["decode"].add(np.column_stack((ones[dec], requests[dec])), duration[dec])
        if mix.any():
            p, d = prefill[mix], decode[mix]
            self._phases["mixed"].add(np.column_stack((ones[mix], p, d, d * d / (p + d))), duration[mix])
        rejected = int(duration.size - np.count_nonzero(valid))
        self.num_rejected += rejected
        return rejected

    def add_sums(self, other: CostSums) -> None:
        for name, phase in self._phases.items():
            phase.add_sums(other._phases[name])
        self.num_rejected += other.num_rejected

    def fit(self) -> CostFit:
        """The three fits (None for a phase without enough steps); O(1) in the number of steps."""
        mixed = self._phases["mixed"]
        quadratic = mixed.fit()
        mixed_fit: LinearFit | None = None
        if quadratic is not None and quadratic.coefficients[0] > 0.0:
            b0, b1, b2, b3 = quadratic.coefficients
            mixed_fit = LinearFit(coefficients=(b0, b1, b2 - b1, b3), r2=quadratic.r2,
                                  num_samples=quadratic.num_samples, num_outliers=0)
        else:
            additive = mixed.fit([0, 1, 2])
            if additive is not None:
                alpha, beta_p, beta_d = additive.coefficients
                mixed_fit = LinearFit(coefficients=(alpha, beta_p, beta_d - beta_p, 0.0), r2=additive.r2,
                                      num_samples=additive.num_samples, num_outliers=0)
            elif quadratic is not None:
                b0, b1, b2, b3 = quadratic.coefficients
                mixed_fit = LinearFit(coefficients=(b0, b1, b2 - b1, b3), r2=quadratic.r2,
                                      num_samples=quadratic.num_samples, num_outliers=0)
        return CostFit(prefill=self._phases["prefill"].fit(lower_bounds=LINE_LOWER_BOUNDS),
                       decode=self._phases["decode"].fit(lower_bounds=LINE_LOWER_BOUNDS), mixed=mixed_fit)

    def to_array(self) -> np.ndarray:
        """A flat float64 array (for serialisation); `from_array` inverts it."""
        parts: list[np.ndarray] = []
        for phase in self._phases.values():
            parts += [phase.gram.ravel(), phase.xy, np.array([phase.yy, phase.n])]
        return np.concatenate(parts)

    @classmethod
    def from_array(cls, values: np.ndarray) -> CostSums:
        """Raises ValueError for an array of the wrong size or with non-finite entries."""
        values = np.asarray(values, dtype=np.float64)
        if values.size != _SERIAL_SIZE or not np.all(np.isfinite(values)):
            raise ValueError(f"cost sums need {_SERIAL_SIZE} finite values, got {values.size}")
        sums = cls()
        offset = 0
        for phase in sums._phases.values():
            width = phase.xy.size
            phase.gram = values[offset:offset + width * width].reshape(width, width).copy()
            offset += width * width
            phase.xy = values[offset:offset + width].copy()
            offset += width
            phase.yy, phase.n = float(values[offset]), float(values[offset + 1])
            offset += 2
        return sums


def predict_duration_s(costs: CostModel, prefill: np.ndarray, decode: np.ndarray,
                       requests: np.ndarray) -> np.ndarray:
    """The cost model's step durations for columnar steps, seconds (phase by composition)."""
    tokens = prefill + decode
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(tokens > 0.0, decode / tokens, 0.0)
    c0, c1, c2 = costs.mb_coeffs_s_per_token
    mixed = costs.alpha_mb_s + (c0 + c1 * ratio + c2 * ratio * ratio) * tokens
    prefill_only = costs.alpha_p_s + costs.beta_p_s_per_token * prefill
    decode_only = costs.alpha_d_s + costs.beta_d_s_per_request * requests
    return np.where(decode == 0.0, prefill_only, np.where(prefill == 0.0, decode_only, mixed))
