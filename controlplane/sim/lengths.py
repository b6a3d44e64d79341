"""Request-length distributions of the twin and the synthetic fleet.

Pure and deterministic: every sampler draws from a numpy `Generator` the caller owns (so one seed gives
one sequence of lengths), and nothing here reads a clock, a file or the environment. Lengths are in
tokens, integers ≥ 1.

Distributions (compact spelling in brackets, as `parse_length_distribution` reads it):
  GeometricLengths      [geometric:256 | geometric:p0=0.004]  P(O=t) = p0·(1−p0)^(t−1), mean 1/p0;
                        the constant hazard h(t) = p0 of the EB paper's CFR case.
  UniformLengths        [uniform:512]  integers uniform on [round(0.5·mean), round(1.5·mean)].
  FixedLengths          [fixed:128]    always the same length.
  LinearHazardLengths   [hazard:p0=0.002,eta=1e-6]  discrete hazard h(t) = min(1, p0 + η·t)
                        (the EB paper's IFR case), sampled exactly by inversion of the cumulative hazard.

  ClippedLogNormalLengths [lognormal:mean=800,sigma=1.0,min=1,max=4096]  a log-normal clipped to
                        [min, max]; the shapes matching published dataset statistics are built from it
                        (see `DATASET_SHAPES`).

Malformed text raises ValueError naming the part that is wrong. (Moved here from controlplane/fleet/workload.py,
which re-exports these names; the fleet's closed-loop `WorkloadSpec` stays there.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, runtime_checkable

import numpy as np

# Cumulative hazard beyond which the survival exp(−Λ) < 1e-26 is treated as zero (table end).
_MAX_CUMULATIVE_HAZARD = 60.0
DEFAULT_MAX_HAZARD_TOKENS = 1 << 20


@runtime_checkable
class LengthDistribution(Protocol):
    """A distribution of token lengths (integers ≥ 1)."""

    @property
    def mean_tokens(self) -> float:
        """Exact mean of the distribution, tokens."""
        ...

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        """`size` independent lengths as an int64 array; deterministic given the generator state."""
        ...


def finite_number(text: str, *, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ValueError(f"{what}: {text!r} is not finite")
    return value


@dataclass(frozen=True)
class GeometricLengths:
    """Geometric lengths on {1, 2, ...}: constant hazard p0, mean 1/p0."""

    p0: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.p0) and 0.0 < self.p0 <= 1.0):
            raise ValueError(f"geometric: p0 must be in (0, 1], got {self.p0}")

    @classmethod
    def from_mean(cls, mean_tokens: float) -> GeometricLengths:
        """The geometric distribution with the given mean (≥ 1 token)."""
        if not (math.isfinite(mean_tokens) and mean_tokens >= 1.0):
            raise ValueError(f"geometric: mean must be ≥ 1 token, got {mean_tokens}")
        return cls(p0=1.0 / mean_tokens)

    @property
    def mean_tokens(self) -> float:
        return 1.0 / self.p0

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.geometric(self.p0, size=size).astype(np.int64)

    def __str__(self) -> str:
        return f"geometric:p0={self.p0!r}"


@dataclass(frozen=True)
class UniformLengths:
    """Integers uniform on [max(1, round(0.5·mean)), round(1.5·mean)] (inclusive)."""

    nominal_mean_tokens: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.nominal_mean_tokens) and self.nominal_mean_tokens >= 1.0):
            raise ValueError(f"uniform: mean must be ≥ 1 token, got {self.nominal_mean_tokens}")

    @property
    def low_tokens(self) -> int:
        return max(1, round(0.5 * self.nominal_mean_tokens))

    @property
    def high_tokens(self) -> int:
        return max(self.low_tokens, round(1.5 * self.nominal_mean_tokens))

    @property
    def mean_tokens(self) -> float:
        return 0.5 * (self.low_tokens + self.high_tokens)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.integers(self.low_tokens, self.high_tokens + 1, size=size, dtype=np.int64)

    def __str__(self) -> str:
        return f"uniform:{self.nominal_mean_tokens:.17g}"


@dataclass(frozen=True)
class FixedLengths:
    """Every request has the same length."""

    tokens: int

    def __post_init__(self) -> None:
        if isinstance(self.tokens, bool) or not isinstance(self.tokens, int) or self.tokens < 1:
            raise ValueError(f"fixed: length must be an integer ≥ 1, got {self.tokens!r}")

    @property
    def mean_tokens(self) -> float:
        return float(self.tokens)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return np.full(size, self.tokens, dtype=np.int64)

    def __str__(self) -> str:
        return f"fixed:{self.tokens}"


@dataclass(frozen=True)
class LinearHazardLengths:
    """Discrete hazard h(t) = min(1, p0 + η·t), t = 1, 2, ... (η = 0 is the geometric case).

    Sampling is exact inversion: with Λ(t) = Σ_{s≤t} −ln(1 − h(s)) and E ~ Exp(1), O = min{t : Λ(t) ≥ E}
    has P(O > t) = exp(−Λ(t)) = Π_{s≤t}(1 − h(s)). The table of Λ is built once per instance and ends
    where h reaches 1, where the survival falls below e^−60, or at `max_tokens` (samples beyond it are
    truncated to `max_tokens`; only a vanishing hazard needs the cap).
    """

    p0: float
    eta: float
    max_tokens: int = DEFAULT_MAX_HAZARD_TOKENS

    def __post_init__(self) -> None:
        if not (math.isfinite(self.p0) and 0.0 < self.p0 <= 1.0):
            raise ValueError(f"hazard: p0 must be in (0, 1], got {self.p0}")
        if not (math.isfinite(self.eta) and self.eta >= 0.0):
            raise ValueError(f"hazard: eta must be finite and ≥ 0, got {self.eta}")
        if self.max_tokens < 1:
            raise ValueError(f"hazard: max_tokens must be ≥ 1, got {self.max_tokens}")

    @cached_property
    def _cumulative_hazard(self) -> np.ndarray:
        """Λ(t) for t = 1..T as float64 (element i is t = i + 1); +inf once h(t) = 1."""
        if self.eta > 0.0:
            t_certain = (1.0 - self.p0) / self.eta
            t_tail = (-self.p0 + math.sqrt(self.p0 * self.p0 + 2.0 * self.eta * _MAX_CUMULATIVE_HAZARD)) / self.eta
            end = math.ceil(min(t_certain, t_tail)) + 1
        else:
            end = math.ceil(_MAX_CUMULATIVE_HAZARD / self.p0) + 1
        t = np.arange(1, min(end, self.max_tokens) + 1, dtype=np.float64)
        hazard = np.minimum(1.0, self.p0 + self.eta * t)
        with np.errstate(divide="ignore"):
            return np.cumsum(-np.log1p(-hazard))

    @property
    def mean_tokens(self) -> float:
        """E[O] = Σ_{t≥0} P(O > t), summed over the table (exact up to the e^−60 tail and the cap)."""
        return 1.0 + float(np.exp(-self._cumulative_hazard[:-1]).sum())

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        table = self._cumulative_hazard
        draws = rng.standard_exponential(size)
        index = np.searchsorted(table, draws, side="left")
        return np.minimum(index + 1, table.size).astype(np.int64)

    def __str__(self) -> str:
        return f"hazard:p0={self.p0!r},eta={self.eta!r}"


def _named_params(body: str, *, kind: str, allowed: tuple[str, ...]) -> dict[str, float]:
    params: dict[str, float] = {}
    for item in body.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or name not in allowed:
            raise ValueError(f"{kind}: expected parameters {'/'.join(allowed)} as name=value, got {item!r}")
        if name in params:
            raise ValueError(f"{kind}: parameter {name!r} given twice")
        params[name] = finite_number(value.strip(), what=f"{kind}.{name}")
    return params


def parse_length_distribution(text: str) -> LengthDistribution:
    """Parse one distribution: "geometric:256", "geometric:p0=0.004", "uniform:512", "fixed:128",
    "hazard:p0=0.002,eta=1e-6" ("linear_hazard:" is accepted too).

    Raises:
        ValueError naming the distribution and the offending part.
    """
    kind, sep, body = text.strip().partition(":")
    kind = kind.strip().lower()
    body = body.strip()
    if not sep or not body:
        raise ValueError(f"length distribution {text!r}: expected KIND:PARAMS, e.g. geometric:256")
    if kind == "geometric":
        if "=" in body:
            return GeometricLengths(p0=_named_params(body, kind=kind, allowed=("p0",))["p0"])
        return GeometricLengths.from_mean(finite_number(body, what="geometric mean"))
    if kind == "uniform":
        return UniformLengths(nominal_mean_tokens=finite_number(body, what="uniform mean"))
    if kind == "fixed":
        value = finite_number(body, what="fixed length")
        if value != int(value):
            raise ValueError(f"fixed length: {body!r} is not an integer")
        return FixedLengths(tokens=int(value))
    if kind in ("hazard", "linear_hazard"):
        params = _named_params(body, kind=kind, allowed=("p0", "eta"))
        if "p0" not in params:
            raise ValueError(f"{kind}: p0 is required, e.g. hazard:p0=0.002,eta=1e-6")
        return LinearHazardLengths(p0=params["p0"], eta=params.get("eta", 0.0))
    raise ValueError(
        f"length distribution {text!r}: unknown kind {kind!r} (geometric, uniform, fixed, hazard)"
    )




def _normal_cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


@dataclass(frozen=True)
class ClippedLogNormalLengths:
    """round(clip(X, min, max)) with X log-normal of mean `median_free_mean_tokens` and log-σ `sigma`.

    Used for the shapes that match published dataset statistics (heavy right tail, hard truncation as
    a server's max_tokens would apply). `mean_tokens` is the exact mean of the clipped continuous
    variable; rounding to integers moves the sample mean by well under one token.
    """

    median_free_mean_tokens: float
    sigma: float
    min_tokens: int = 1
    max_tokens: int = 1 << 20

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median_free_mean_tokens) and self.median_free_mean_tokens >= 1.0):
            raise ValueError(f"lognormal: mean must be ≥ 1 token, got {self.median_free_mean_tokens}")
        if not (math.isfinite(self.sigma) and self.sigma > 0.0):
            raise ValueError(f"lognormal: sigma must be finite and > 0, got {self.sigma}")
        if not 1 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"lognormal: need 1 ≤ min ≤ max, got min={self.min_tokens}, max={self.max_tokens}")

    @property
    def _mu(self) -> float:
        return math.log(self.median_free_mean_tokens) - 0.5 * self.sigma * self.sigma

    @property
    def mean_tokens(self) -> float:
        mu, sigma = self._mu, self.sigma
        lo, hi = math.log(self.min_tokens), math.log(self.max_tokens)
        p_lo = _normal_cdf((lo - mu) / sigma)
        p_hi = 1.0 - _normal_cdf((hi - mu) / sigma)
        scale = math.exp(mu + 0.5 * sigma * sigma)
        shift = sigma * sigma
        inside = scale * (_normal_cdf((hi - mu - shift) / sigma) - _normal_cdf((lo - mu - shift) / sigma))
        return self.min_tokens * p_lo + inside + self.max_tokens * p_hi

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        draws = rng.lognormal(self._mu, self.sigma, size=size)
        return np.clip(np.rint(draws), self.min_tokens, self.max_tokens).astype(np.int64)

    def __str__(self) -> str:
        return (f"lognormal:mean={self.median_free_mean_tokens!r},sigma={self.sigma!r},min={self.min_tokens},"
                f"max={self.max_tokens}")


@dataclass(frozen=True)
class UniformRangeLengths:
    """Integers uniform on [low_tokens, high_tokens] (inclusive), e.g. LongBench's 1,000–4,000 prompts."""

    low_tokens: int
    high_tokens: int

    def __post_init__(self) -> None:
        if not 1 <= self.low_tokens <= self.high_tokens:
            raise ValueError(f"range: need 1 ≤ low ≤ high, got {self.low_tokens}..{self.high_tokens}")

    @property
    def mean_tokens(self) -> float:
        return 0.5 * (self.low_tokens + self.high_tokens)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.integers(self.low_tokens, self.high_tokens + 1, size=size, dtype=np.int64)

    def __str__(self) -> str:
        return f"range:{self.low_tokens}-{self.high_tokens}"


@dataclass(frozen=True)
class LengthShape:
    """A named (prompt, output) pair of length distributions; `source` says what it matches and how."""

    name: str
    prompt: LengthDistribution
    output: LengthDistribution
    source: str

    @property
    def decode_ratio(self) -> float:
        """r = μ_O / (μ_L + μ_O) of the shape."""
        mu_l, mu_o = self.prompt.mean_tokens, self.output.mean_tokens
        return mu_o / (mu_l + mu_o)


def synthetic_shape(mean_prompt_tokens: int, mean_output_tokens: int) -> LengthShape:
    """The EB paper's synthetic workloads: both lengths uniform on 0.5–1.5× their means (§4.1)."""
    return LengthShape(
        name=f"uniform-{mean_prompt_tokens}-{mean_output_tokens}",
        prompt=UniformLengths(nominal_mean_tokens=mean_prompt_tokens),
        output=UniformLengths(nominal_mean_tokens=mean_output_tokens),
        source="EB paper §4.1: per-request lengths uniform between 0.5× and 1.5× the mean",
    )


def synthetic_geometric_shape(mean_prompt_tokens: int, mean_output_tokens: int) -> LengthShape:
    """The EB paper's model-validation workloads (§4.2): prompts uniform on 0.5–1.5× their mean, outputs
    geometric with the given mean (constant hazard, the case the threshold k̂* is derived for)."""
    return LengthShape(
        name=f"geometric-{mean_prompt_tokens}-{mean_output_tokens}",
        prompt=UniformLengths(nominal_mean_tokens=mean_prompt_tokens),
        output=GeometricLengths.from_mean(mean_output_tokens),
        source="EB paper §4.2: synthetic geometric output workloads (prompt uniform 0.5–1.5× the mean)",
    )


# Shapes matching the statistics the papers publish. The EB paper (§4.1) gives only coarse figures, so each
# shape is a log-normal or a range that reproduces them; they stand in for the datasets, they are not them.
DATASET_SHAPES: dict[str, LengthShape] = {
    "decode-heavy": synthetic_shape(128, 1024),
    "balanced": synthetic_shape(512, 512),
    "prefill-heavy": synthetic_shape(1024, 128),
    "geometric-decode-heavy": synthetic_geometric_shape(128, 1024),
    "geometric-balanced": synthetic_geometric_shape(512, 512),
    "geometric-prefill-heavy": synthetic_geometric_shape(1024, 128),
    "sharegpt": LengthShape(
        "sharegpt", ClippedLogNormalLengths(105.0, 1.0, 4, 2048), ClippedLogNormalLengths(260.0, 0.9, 1, 500),
        "EB paper §4.1: ShareGPT, 105 input / ≤500 output (truncated at 500); r ≈ 0.7"),
    "longbench": LengthShape(
        "longbench", UniformRangeLengths(1000, 4000), FixedLengths(20),
        "EB paper §4.1: LongBench, 1,000–4,000 input / 20 output; r ≈ 0.01"),
    "numinamath": LengthShape(
        "numinamath", ClippedLogNormalLengths(122.0, 0.6, 16, 1024), UniformRangeLengths(800, 4000),
        "EB paper §4.1: NuminaMath, 122 input / 800–4,000 output (chain of thought); r ≈ 0.95"),
    "wildchat": LengthShape(
        "wildchat", ClippedLogNormalLengths(500.0, 1.1, 8, 8192), ClippedLogNormalLengths(600.0, 0.9, 1, 2048),
        "EB paper §4.1/§4.3.2: WildChat, multi-turn (≥6 turns, history grows the prompt); r ≈ 0.55"),
    "ppas-long-context": LengthShape(
        "ppas-long-context", FixedLengths(25_000), FixedLengths(32),
        "P-PAS paper §4.1: 25k-token prompts, 32-token outputs (RAG / agentic)"),
}
