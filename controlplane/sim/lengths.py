"""Request-length distributions of the twin and the synthetic fleet.

Pure and deterministic: every sampler draws from a numpy `Generator` the caller owns (so one seed gives
one sequence of lengths), and nothing here reads a clock, a file or the environment. Lengths are in
tokens, integers ≥ 1.

Distributions (compact spelling in brackets, as `parse_length_distribution` reads it):
  GeometricLengths      [geometric:256 | geometric:p0=0.004]  P(O=t) = p0·(1−p0)^(t−1), mean 1/p0;
                        the constant hazard h(t) = p0 of the CFR case ([EB] §3.2.1).
  UniformLengths        [uniform:512]  integers uniform on [round(0.5·mean), round(1.5·mean)].
  FixedLengths          [fixed:128]    always the same length.
  LinearHazardLengths   [hazard:p0=0.002,eta=1e-6]  discrete hazard h(t) = min(1, p0 + η·t)
                        (the IFR case, [EB] §3.2.2), sampled exactly by inversion of the cumulative hazard.

  ClippedLogNormalLengths [lognormal:mean=800,sigma=1.0,min=1,max=4096]  a log-normal clipped to
                        [min, max]; the shapes matching published dataset statistics are built from it
                        (see `DATASET_SHAPES`).
  ConversationHistoryLengths  the context a turn of a multi-turn conversation shares with the previous turn
                        (the earlier user messages and replies), for a request drawn uniformly from all turns.

The real-world shapes (sharegpt, wildchat, longbench, numinamath) are read from the package's
data/workloads.json, which states what each distribution was fitted to. `upper_bound_tokens` gives the
longest length a distribution draws (for the max_model_len check when a scenario is built).

Malformed text raises ValueError naming the part that is wrong. (Moved here from controlplane/fleet/workload.py,
which re-exports these names; the fleet's closed-loop `WorkloadSpec` stays there.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Protocol, runtime_checkable

import numpy as np

from controlplane.sim.hardware import read_data_file

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


class _UniformIntegers:
    """Integers uniform on [low_tokens, high_tokens] (inclusive): the mean and the sampler of the uniform
    distributions below, which give the two bounds (as fields or derived from a mean)."""

    low_tokens: int
    high_tokens: int

    @property
    def mean_tokens(self) -> float:
        return 0.5 * (self.low_tokens + self.high_tokens)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        return rng.integers(self.low_tokens, self.high_tokens + 1, size=size, dtype=np.int64)


@dataclass(frozen=True)
class UniformLengths(_UniformIntegers):
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
    if kind == "lognormal":
        params = _named_params(body, kind=kind, allowed=("mean", "sigma", "min", "max"))
        if "mean" not in params or "sigma" not in params:
            raise ValueError("lognormal: mean and sigma are required, e.g. lognormal:mean=800,sigma=1.0,max=4096")
        return ClippedLogNormalLengths(params["mean"], params["sigma"], _whole(params.get("min", 1), "lognormal.min"),
                                       _whole(params.get("max", 1 << 20), "lognormal.max"))
    if kind == "range":
        low, sep, high = body.partition("-")
        if not sep:
            raise ValueError(f"range: expected LOW-HIGH, e.g. range:1000-4000, got {body!r}")
        return UniformRangeLengths(_whole(finite_number(low, what="range low"), "range low"),
                                   _whole(finite_number(high, what="range high"), "range high"))
    raise ValueError(
        f"length distribution {text!r}: unknown kind {kind!r} (geometric, uniform, fixed, hazard, lognormal, range)"
    )


def _whole(value: float, what: str) -> int:
    if value != int(value):
        raise ValueError(f"{what}: {value!r} is not an integer")
    return int(value)




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
class UniformRangeLengths(_UniformIntegers):
    """Integers uniform on [low_tokens, high_tokens] (inclusive), e.g. LongBench's 1,000–4,000 prompts."""

    low_tokens: int
    high_tokens: int

    def __post_init__(self) -> None:
        if not 1 <= self.low_tokens <= self.high_tokens:
            raise ValueError(f"range: need 1 ≤ low ≤ high, got {self.low_tokens}..{self.high_tokens}")

    def __str__(self) -> str:
        return f"range:{self.low_tokens}-{self.high_tokens}"


@dataclass(frozen=True)
class ConversationHistoryLengths:
    """The context turn t of a multi-turn conversation shares with turn t − 1: the earlier user messages and
    replies it carries, for a request drawn uniformly from all turns of all conversations.

    Conversations have T ≥ `min_turns` turns, T − min_turns geometric on {0, 1, …} with mean
    `mean_turns` − `min_turns`; a uniformly drawn request is turn t with P(t) ∝ P(T ≥ t). The prompt carries the
    last min(t − 1, `kept_turns`) turns (0: all of them), each a `user` and an `assistant` length (independent
    draws); the sum is cut at `max_tokens` (a client drops the oldest turns). Turn 1 has no history (0 tokens:
    this is the one distribution here that draws 0). `mean_tokens` is the mean before the cut, exact; the cut
    moves it by the clipped mass only.
    """

    min_turns: int
    mean_turns: float
    user: LengthDistribution
    assistant: LengthDistribution
    max_tokens: int
    kept_turns: int = 0

    MAX_TURNS = 256

    def __post_init__(self) -> None:
        if self.min_turns < 1 or not (math.isfinite(self.mean_turns) and self.mean_turns >= self.min_turns):
            raise ValueError(f"conversation: need min_turns ≥ 1 and mean_turns ≥ min_turns, got {self.min_turns}, "
                             f"{self.mean_turns}")
        if self.max_tokens < 1 or self.kept_turns < 0:
            raise ValueError(f"conversation: need max_tokens ≥ 1 and kept_turns ≥ 0, got {self.max_tokens}, "
                             f"{self.kept_turns}")

    def _carried(self, turns: np.ndarray) -> np.ndarray:
        """Earlier turns a prompt of turn t carries."""
        carried = turns - 1
        return np.minimum(carried, self.kept_turns) if self.kept_turns else carried

    @cached_property
    def _turn_probabilities(self) -> np.ndarray:
        """P(t) for t = 1 … MAX_TURNS (element t − 1)."""
        extra = self.mean_turns - self.min_turns
        stay = extra / (1.0 + extra)
        t = np.arange(1, self.MAX_TURNS + 1, dtype=np.float64)
        weight = np.where(t <= self.min_turns, 1.0, stay ** np.maximum(t - self.min_turns, 0.0))
        return weight / weight.sum()

    @property
    def mean_tokens(self) -> float:
        turns = np.arange(1, self.MAX_TURNS + 1, dtype=np.float64)
        earlier = float((self._carried(turns) * self._turn_probabilities).sum())
        return earlier * (self.user.mean_tokens + self.assistant.mean_tokens)

    def sample(self, rng: np.random.Generator, size: int) -> np.ndarray:
        carried = self._carried(rng.choice(np.arange(1, self.MAX_TURNS + 1), size=size, p=self._turn_probabilities))
        widest = int(carried.max()) if size else 0
        if widest <= 0:
            return np.zeros(size, dtype=np.int64)
        user = self.user.sample(rng, size * widest).reshape(size, widest)
        assistant = self.assistant.sample(rng, size * widest).reshape(size, widest)
        earlier = np.arange(widest)[None, :] < carried[:, None]
        return np.minimum(((user + assistant) * earlier).sum(axis=1), self.max_tokens).astype(np.int64)

    def __str__(self) -> str:
        return (f"conversation:turns>={self.min_turns},mean={self.mean_turns!r},kept={self.kept_turns},"
                f"user={self.user},assistant={self.assistant},max={self.max_tokens}")


def upper_bound_tokens(distribution: LengthDistribution, *, tail: float = 1e-9) -> int | None:
    """The longest length `distribution` draws: its maximum where it has one, else the length it exceeds with
    probability below `tail` (geometric, linear hazard). None for a distribution type this module does not
    know."""
    if isinstance(distribution, FixedLengths):
        return distribution.tokens
    if isinstance(distribution, _UniformIntegers):
        return distribution.high_tokens
    if isinstance(distribution, (ClippedLogNormalLengths, ConversationHistoryLengths)):
        return distribution.max_tokens
    if isinstance(distribution, GeometricLengths):
        if distribution.p0 >= 1.0:
            return 1
        return max(1, math.ceil(math.log(tail) / math.log1p(-distribution.p0)))
    if isinstance(distribution, LinearHazardLengths):
        table = distribution._cumulative_hazard
        index = int(np.searchsorted(table, -math.log(tail), side="left"))
        return min(index + 1, table.size)
    return None


@dataclass(frozen=True)
class LengthShape:
    """A named (prompt, output) pair of length distributions; `source` says what it matches and how.

    `shared_prefix` (optional): tokens of each prompt that repeat the previous turn's context (a multi-turn
    conversation's history). A request's prompt is the shared prefix followed by `prompt`'s draw; the engine
    serves the shared prefix from its prefix cache and computes only the rest."""

    name: str
    prompt: LengthDistribution
    output: LengthDistribution
    source: str
    shared_prefix: LengthDistribution | None = None

    @property
    def decode_ratio(self) -> float:
        """r = μ_O / (μ_L + μ_O) of the shape, μ_L counting the prompt tokens computed (not the shared prefix)."""
        mu_l, mu_o = self.prompt.mean_tokens, self.output.mean_tokens
        return mu_o / (mu_l + mu_o)

    @property
    def mean_prompt_tokens(self) -> float:
        """Mean prompt length including the shared prefix."""
        prefix = self.shared_prefix.mean_tokens if self.shared_prefix is not None else 0.0
        return self.prompt.mean_tokens + prefix


def synthetic_shape(mean_prompt_tokens: int, mean_output_tokens: int) -> LengthShape:
    """The EB paper's synthetic workloads: both lengths uniform on 0.5–1.5× their means ([EB] §4.1)."""
    return LengthShape(
        name=f"uniform-{mean_prompt_tokens}-{mean_output_tokens}",
        prompt=UniformLengths(nominal_mean_tokens=mean_prompt_tokens),
        output=UniformLengths(nominal_mean_tokens=mean_output_tokens),
        source="[EB] §4.1: per-request lengths uniform between 0.5× and 1.5× the mean",
    )


def synthetic_geometric_shape(mean_prompt_tokens: int, mean_output_tokens: int) -> LengthShape:
    """The EB paper's model-validation workloads ([EB] §4.2: "synthetic geometric output workloads"): outputs
    geometric with the given mean (constant hazard, the case the threshold k̂* is derived for), prompts uniform on
    0.5–1.5× their mean (the rule of the synthetic workloads, [EB] §4.1; [EB] §4.2 does not restate it)."""
    return LengthShape(
        name=f"geometric-{mean_prompt_tokens}-{mean_output_tokens}",
        prompt=UniformLengths(nominal_mean_tokens=mean_prompt_tokens),
        output=GeometricLengths.from_mean(mean_output_tokens),
        source="[EB] §4.2: synthetic geometric output workloads (prompt uniform 0.5–1.5× the mean as in [EB] §4.1)",
    )


WORKLOADS_FILE = "workloads.json"


def distribution_from_spec(spec: dict[str, Any], *, where: str) -> LengthDistribution:
    """A distribution from a data/workloads.json entry. Raises ValueError naming `where` and the problem."""
    try:
        kind = spec["kind"]
        if kind == "lognormal":
            return ClippedLogNormalLengths(float(spec["mean"]), float(spec["sigma"]), int(spec.get("min", 1)),
                                           int(spec.get("max", 1 << 20)))
        if kind == "range":
            return UniformRangeLengths(int(spec["low"]), int(spec["high"]))
        if kind == "fixed":
            return FixedLengths(int(spec["tokens"]))
        if kind == "conversation_history":
            return ConversationHistoryLengths(
                int(spec["min_turns"]), float(spec["mean_turns"]),
                distribution_from_spec(spec["user"], where=f"{where}.user"),
                distribution_from_spec(spec["assistant"], where=f"{where}.assistant"), int(spec["max"]),
                int(spec.get("kept_turns", 0)))
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{WORKLOADS_FILE}: {where}: {exc}") from None
    raise ValueError(f"{WORKLOADS_FILE}: {where}: unknown kind {kind!r} (lognormal, range, fixed, "
                     "conversation_history)")


def load_dataset_shapes() -> dict[str, LengthShape]:
    """The real-world shapes of the package's data/workloads.json."""
    return dataset_shapes_from_json(read_data_file(WORKLOADS_FILE))


def dataset_shapes_from_json(data: dict[str, Any]) -> dict[str, LengthShape]:
    """Parse a workloads.json document. Raises ValueError naming a malformed entry, one without a source, or a
    distribution that does not say what it was fitted to."""
    datasets = data.get("datasets")
    if not isinstance(datasets, dict) or not datasets:
        raise ValueError(f"{WORKLOADS_FILE}: expected a non-empty object 'datasets'")
    shapes: dict[str, LengthShape] = {}
    for name, entry in datasets.items():
        if not isinstance(entry, dict) or not str(entry.get("source", "")).strip():
            raise ValueError(f"{WORKLOADS_FILE}: datasets.{name} must be an object with a non-empty 'source'")
        for part in ("prompt", "output", "shared_prefix"):
            if part in entry and not str(entry[part].get("fit", "")).strip():
                raise ValueError(f"{WORKLOADS_FILE}: datasets.{name}.{part} must say what it was fitted to ('fit')")
        prefix = entry.get("shared_prefix")
        shapes[name] = LengthShape(
            name, distribution_from_spec(entry["prompt"], where=f"datasets.{name}.prompt"),
            distribution_from_spec(entry["output"], where=f"datasets.{name}.output"), entry["source"],
            distribution_from_spec(prefix, where=f"datasets.{name}.shared_prefix") if prefix else None)
    return shapes


DATASET_SHAPES: dict[str, LengthShape] = {
    "decode-heavy": synthetic_shape(128, 1024),
    "balanced": synthetic_shape(512, 512),
    "prefill-heavy": synthetic_shape(1024, 128),
    "geometric-decode-heavy": synthetic_geometric_shape(128, 1024),
    "geometric-balanced": synthetic_geometric_shape(512, 512),
    "geometric-prefill-heavy": synthetic_geometric_shape(1024, 128),
    **load_dataset_shapes(),
    "ppas-long-context": LengthShape(
        "ppas-long-context", FixedLengths(25_000), FixedLengths(32),
        "[PPAS] §4.1: 25k-token prompts, 32-token outputs (RAG / agentic)"),
}
