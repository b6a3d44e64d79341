"""Online fit of the iteration-time cost model from step samples.

Three linear models, each over a sliding window of recent steps:
  prefill-only steps: duration = α_p + β_p·prefill tokens
  decode-only steps:  duration = α_d + β_d·decode requests
  mixed steps:        duration = α_MB + (c0 + c1·r + c2·r²)·tokens, r = decode tokens / tokens
                      (the additive model α_MB + β_p'·prefill + β_d'·decode tokens when the quadratic
                      fit is degenerate, see _fit_mixed)

Bounds: the prefill and decode lines are fitted by bounded least squares (`scipy.optimize.lsq_linear`)
with α ≥ MIN_ALPHA_S and β ≥ MIN_SLOPE, so a fixed cost lost in the noise (common on small models) comes
out at its 1 µs floor with the slope fitted for that floor, instead of a negative α clipped after the fact
with the slope of the unconstrained line. A slope at its floor means the steps did not tell it from zero:
`CostFit.to_cost_model` keeps the fallback's for that phase. The unconstrained solution is used as is when it
already satisfies the bounds (it is then the bounded optimum). The mixed fit is not bounded: the sign of its
unconstrained α_MB is what detects a design that cannot separate α_MB from the slopes (see `_fit_mixed`).

Outlier resistance: each fit is a least-squares fit, then the samples whose residual exceeds
OUTLIER_MAD_MULTIPLIER robust standard deviations (1.4826·MAD of the residuals) are dropped and the fit
is repeated once on the inliers. One absurd sample therefore lands in the rejected set instead of
tilting the line. R² is reported on the inliers. Adding samples is O(batch); fitting is O(window).

Invalid samples (non-finite, duration ≤ 0, negative counts, an empty step) are rejected and counted.
No I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from controlplane.core.types import CostModel

DEFAULT_STEP_WINDOW = 2048
MIN_FIT_SAMPLES = 8
OUTLIER_MAD_MULTIPLIER = 5.0
_MAD_TO_SIGMA = 1.4826
# Lower bound of a fitted fixed step cost (1 µs: below any real launch overhead).
MIN_ALPHA_S = 1e-6
# Lower bound of a fitted prefill or decode slope, s per token or per request (1 ps: far below any real cost);
# a slope at this bound is "not identified".
MIN_SLOPE = 1e-12
# The bounds of the prefill and decode lines (α, β).
LINE_LOWER_BOUNDS = (MIN_ALPHA_S, MIN_SLOPE)


@dataclass(frozen=True, slots=True)
class LinearFit:
    """Coefficients (intercept first) of a robust linear fit, with its quality.

    r2: coefficient of determination on the inliers (1.0 when the inliers have no variance).
    """

    coefficients: tuple[float, ...]
    r2: float
    num_samples: int
    num_outliers: int


def bounded_lstsq(design: np.ndarray, target: np.ndarray, lower: np.ndarray | None) -> np.ndarray:
    """argmin ‖design·b − target‖² subject to b ≥ lower (−inf: unbounded); `design` has full column rank.

    The unconstrained solution when it satisfies the bounds (then it is the bounded optimum too), else
    scipy's bounded-variable least squares on the column-scaled design (exact for these small problems).
    """
    coef = np.linalg.lstsq(design, target, rcond=None)[0]
    if lower is None or bool(np.all(coef >= lower)):
        return coef
    # Imported here: scipy.optimize takes about half a second to import and is needed only when a bound binds.
    from scipy.optimize import lsq_linear

    scale = np.linalg.norm(design, axis=0)
    result = lsq_linear(design / scale, target, bounds=(lower * scale, np.inf), method="bvls")
    return np.maximum(result.x / scale, lower)


def robust_linear_fit(features: np.ndarray, target: np.ndarray, *,
                      lower_bounds: Sequence[float] | None = None) -> LinearFit | None:
    """Least squares of target on [1, features...] with one round of MAD-based outlier rejection.

    Args:
        features: shape (n, m) regressors; target: shape (n,), e.g. step durations in seconds.
        lower_bounds: per coefficient (intercept first, m + 1 values; −inf for none), the bounds of a
            bounded least-squares fit; None: unbounded.
    Returns:
        The fit, or None when there are fewer than MIN_FIT_SAMPLES samples or the design is singular.
    Raises:
        ValueError when lower_bounds does not have one value per coefficient.
    """
    n = target.size
    if n < MIN_FIT_SAMPLES:
        return None
    design = np.column_stack((np.ones(n), features))
    lower = None if lower_bounds is None else np.asarray(lower_bounds, dtype=np.float64)
    if lower is not None and lower.shape != (design.shape[1],):
        raise ValueError(f"lower_bounds needs {design.shape[1]} values, got {lower.size}")
    if np.linalg.matrix_rank(design) < design.shape[1]:
        return None
    # The screening fit is unconstrained: its residuals are centred on zero, which the rejection rule assumes
    # (a bounded line pinned away from the data would mark every sample an outlier). The bounds apply to the
    # final fit on the inliers.
    screen = np.linalg.lstsq(design, target, rcond=None)[0]
    residuals = target - design @ screen
    mad = float(np.median(np.abs(residuals - np.median(residuals))))
    inliers = np.ones(n, dtype=bool)
    if mad > 0.0:
        inliers = np.abs(residuals) <= OUTLIER_MAD_MULTIPLIER * _MAD_TO_SIGMA * mad
        if np.count_nonzero(inliers) < max(MIN_FIT_SAMPLES, design.shape[1]) or (
            np.linalg.matrix_rank(design[inliers]) < design.shape[1]
        ):
            inliers = np.ones(n, dtype=bool)
    coef = bounded_lstsq(design[inliers], target[inliers], lower)
    fitted = design[inliers] @ coef
    observed = target[inliers]
    total = float(((observed - observed.mean()) ** 2).sum())
    r2 = 1.0 if total <= 0.0 else 1.0 - float(((observed - fitted) ** 2).sum()) / total
    return LinearFit(
        coefficients=tuple(float(c) for c in coef),
        r2=r2,
        num_samples=int(np.count_nonzero(inliers)),
        num_outliers=int(n - np.count_nonzero(inliers)),
    )


class _Columns:
    """Ring of fixed-width float64 rows; append O(batch)."""

    __slots__ = ("_buf", "_count", "_head")

    def __init__(self, capacity: int, width: int) -> None:
        self._buf = np.zeros((capacity, width), dtype=np.float64)
        self._head = 0
        self._count = 0

    def append(self, rows: np.ndarray) -> None:
        capacity = self._buf.shape[0]
        rows = rows[-capacity:]
        idx = (self._head + np.arange(rows.shape[0])) % capacity
        self._buf[idx] = rows
        self._head = (self._head + rows.shape[0]) % capacity
        self._count = min(capacity, self._count + rows.shape[0])

    def rows(self) -> np.ndarray:
        return self._buf[: self._count] if self._count < self._buf.shape[0] else self._buf


@dataclass(frozen=True, slots=True)
class CostFit:
    """The three fits; a phase is None until it has enough samples."""

    prefill: LinearFit | None
    decode: LinearFit | None
    mixed: LinearFit | None

    def is_complete(self) -> bool:
        """Every phase fitted with usable coefficients: `to_cost_model` would not consult a fallback."""
        return _line_is_usable(self.prefill) and _line_is_usable(self.decode) and (
            self.mixed is not None and self.mixed.coefficients[0] > 0.0)

    def to_cost_model(self, fallback: CostModel | None = None) -> CostModel | None:
        """Merge into a CostModel: fitted phases override the fallback's; None if a phase is unknown.

        A prefill or decode line is used when it is within its bounds with a slope above them (α ≥
        MIN_ALPHA_S, β > MIN_SLOPE: what the bounded fits give when the steps identify the slope); otherwise
        the fallback's values are kept (or None). A mixed fit is used when its α_MB is positive.
        """
        alpha_p = beta_p = alpha_d = beta_d = alpha_mb = None
        mb_coeffs = None
        if fallback is not None:
            alpha_p, beta_p = fallback.alpha_p_s, fallback.beta_p_s_per_token
            alpha_d, beta_d = fallback.alpha_d_s, fallback.beta_d_s_per_request
            alpha_mb, mb_coeffs = fallback.alpha_mb_s, fallback.mb_coeffs_s_per_token
        if self.prefill is not None and _line_is_usable(self.prefill):
            alpha_p, beta_p = self.prefill.coefficients[:2]
        if self.decode is not None and _line_is_usable(self.decode):
            alpha_d, beta_d = self.decode.coefficients[:2]
        if self.mixed is not None and self.mixed.coefficients[0] > 0.0:
            alpha_mb = self.mixed.coefficients[0]
            mb_coeffs = tuple(self.mixed.coefficients[1:])
        if None in (alpha_p, beta_p, alpha_d, beta_d):
            return None
        return CostModel(
            alpha_p_s=alpha_p,
            beta_p_s_per_token=beta_p,
            alpha_d_s=alpha_d,
            beta_d_s_per_request=beta_d,
            alpha_mb_s=alpha_mb if alpha_mb is not None else alpha_p,
            mb_coeffs_s_per_token=mb_coeffs or (0.0, 0.0, 0.0),
        )


def _line_is_usable(fit: LinearFit | None) -> bool:
    """A prefill or decode line within its bounds whose slope is above its floor (identified)."""
    return fit is not None and fit.coefficients[0] >= MIN_ALPHA_S and fit.coefficients[1] > MIN_SLOPE


class CostModelEstimator:
    """Sliding-window robust fits of prefill, decode and mixed step costs."""

    def __init__(self, *, window: int = DEFAULT_STEP_WINDOW) -> None:
        if window < MIN_FIT_SAMPLES:
            raise ValueError(f"step window must be ≥ {MIN_FIT_SAMPLES}, got {window}")
        self._prefill = _Columns(window, 2)  # tokens, duration
        self._decode = _Columns(window, 2)  # requests, duration
        self._mixed = _Columns(window, 3)  # tokens, decode ratio, duration
        self.num_rejected = 0

    def add_steps(
        self,
        *,
        prefill_tokens: np.ndarray,
        decode_tokens: np.ndarray,
        decode_requests: np.ndarray,
        duration_s: np.ndarray,
    ) -> int:
        """Add a batch of engine steps (columnar); returns how many were rejected. O(batch)."""
        cols = [np.asarray(c, dtype=np.float64).ravel() for c in (prefill_tokens, decode_tokens,
                                                                  decode_requests, duration_s)]
        if len({c.size for c in cols}) != 1:
            rejected = max(c.size for c in cols)
            self.num_rejected += rejected
            return rejected
        prefill, decode_tok, decode_req, duration = cols
        valid = np.isfinite(prefill) & np.isfinite(decode_tok) & np.isfinite(decode_req)
        valid &= np.isfinite(duration) & (duration > 0.0)
        valid &= (prefill >= 0.0) & (decode_tok >= 0.0) & (decode_req >= 0.0)
        valid &= (prefill + decode_tok) > 0.0
        is_prefill = valid & (decode_tok == 0.0)
        is_decode = valid & (prefill == 0.0)
        is_mixed = valid & (prefill > 0.0) & (decode_tok > 0.0)
        if is_prefill.any():
            self._prefill.append(np.column_stack((prefill[is_prefill], duration[is_prefill])))
        if is_decode.any():
            self._decode.append(np.column_stack((decode_req[is_decode], duration[is_decode])))
        if is_mixed.any():
            tokens = prefill[is_mixed] + decode_tok[is_mixed]
            ratio = decode_tok[is_mixed] / tokens
            self._mixed.append(np.column_stack((tokens, ratio, duration[is_mixed])))
        rejected = int(duration.size - np.count_nonzero(valid))
        self.num_rejected += rejected
        return rejected

    def fit(self) -> CostFit:
        """Fit all three models on the current windows. O(window)."""
        prefill = self._prefill.rows()
        decode = self._decode.rows()
        mixed = self._mixed.rows()
        return CostFit(
            prefill=robust_linear_fit(prefill[:, :1], prefill[:, 1], lower_bounds=LINE_LOWER_BOUNDS)
            if prefill.shape[0] else None,
            decode=robust_linear_fit(decode[:, :1], decode[:, 1], lower_bounds=LINE_LOWER_BOUNDS)
            if decode.shape[0] else None,
            mixed=_fit_mixed(mixed) if mixed.shape[0] else None,
        )


def _fit_mixed(rows: np.ndarray) -> LinearFit | None:
    """duration = α_MB + (c0 + c1·r + c2·r²)·T, with a fallback to the additive model.

    The three interference regressors T, T·r, T·r² are strongly collinear when the steps cover a narrow
    range of r; the quadratic fit can then trade a negative α_MB against inflated coefficients (seen on
    vLLM's CPU engine). When its α_MB is not positive, the additive model α_MB + β_p'·prefill tokens +
    β_d'·decode tokens is fitted instead and reported as c0 = β_p', c1 = β_d' − β_p', c2 = 0.
    """
    tokens, ratio, duration = rows[:, 0], rows[:, 1], rows[:, 2]
    quadratic = robust_linear_fit(np.column_stack((tokens, tokens * ratio, tokens * ratio * ratio)), duration)
    if quadratic is not None and quadratic.coefficients[0] > 0.0:
        return quadratic
    decode_tokens = tokens * ratio
    additive = robust_linear_fit(np.column_stack((tokens - decode_tokens, decode_tokens)), duration)
    if additive is None:
        return quadratic
    alpha, beta_prefill, beta_decode = additive.coefficients
    return LinearFit(coefficients=(alpha, beta_prefill, beta_decode - beta_prefill, 0.0), r2=additive.r2,
                     num_samples=additive.num_samples, num_outliers=additive.num_outliers)


def cost_model_is_usable(costs: CostModel) -> bool:
    """All α and β finite and positive (the MB coefficients only need to be finite)."""
    positive = (costs.alpha_p_s, costs.beta_p_s_per_token, costs.alpha_d_s, costs.beta_d_s_per_request,
                costs.alpha_mb_s)
    return all(math.isfinite(x) and x > 0.0 for x in positive) and all(
        math.isfinite(c) for c in costs.mb_coeffs_s_per_token
    )
