"""Request-length distributions and the workload spec of the synthetic fleet.

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

A `WorkloadSpec` is an output distribution, a prompt distribution and a closed-loop concurrency, written
"<output>/<prompt>[/closed:<concurrency>]", e.g. "geometric:256/uniform:512/closed:64".
Malformed text raises ValueError naming the part that is wrong.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol, runtime_checkable

import numpy as np

DEFAULT_CONCURRENCY = 64
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


def _finite_number(text: str, *, what: str) -> float:
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
        params[name] = _finite_number(value.strip(), what=f"{kind}.{name}")
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
        return GeometricLengths.from_mean(_finite_number(body, what="geometric mean"))
    if kind == "uniform":
        return UniformLengths(nominal_mean_tokens=_finite_number(body, what="uniform mean"))
    if kind == "fixed":
        value = _finite_number(body, what="fixed length")
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


@dataclass(frozen=True)
class WorkloadSpec:
    """What the fake engines serve: output and prompt lengths, and the closed-loop concurrency.

    Arrival process: closed loop. Each engine keeps `concurrency` requests in the system (running plus
    waiting); a new request arrives the moment one finishes.
    """

    output: LengthDistribution
    prompt: LengthDistribution
    concurrency: int = DEFAULT_CONCURRENCY

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise ValueError(f"workload: concurrency must be an integer ≥ 1, got {self.concurrency!r}")

    @classmethod
    def parse(cls, text: str) -> WorkloadSpec:
        """Parse "<output>/<prompt>[/closed:<concurrency>]", e.g. "geometric:256/uniform:512/closed:64".

        Raises:
            ValueError naming the part that is wrong.
        """
        parts = [p.strip() for p in text.strip().split("/")]
        if len(parts) not in (2, 3):
            raise ValueError(
                f"workload {text!r}: expected OUTPUT/PROMPT[/closed:C], e.g. geometric:256/uniform:512/closed:64"
            )
        output = parse_length_distribution(parts[0])
        prompt = parse_length_distribution(parts[1])
        concurrency = DEFAULT_CONCURRENCY
        if len(parts) == 3:
            kind, sep, body = parts[2].partition(":")
            if kind.strip().lower() != "closed" or not sep:
                raise ValueError(f"workload {text!r}: arrival must be closed:<concurrency>, got {parts[2]!r}")
            value = _finite_number(body.strip(), what="closed-loop concurrency")
            if value != int(value) or value < 1:
                raise ValueError(f"closed-loop concurrency must be an integer ≥ 1, got {body.strip()!r}")
            concurrency = int(value)
        return cls(output=output, prompt=prompt, concurrency=concurrency)

    def sample(self, rng: np.random.Generator, size: int) -> tuple[np.ndarray, np.ndarray]:
        """`size` requests as (prompt lengths, output lengths), int64 tokens; prompts are drawn first."""
        return self.prompt.sample(rng, size), self.output.sample(rng, size)

    def __str__(self) -> str:
        return f"{self.output}/{self.prompt}/closed:{self.concurrency}"


def parse_workload(text: str) -> WorkloadSpec:
    """Same as `WorkloadSpec.parse`."""
    return WorkloadSpec.parse(text)
