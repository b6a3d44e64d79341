"""Length distributions and the workload spec of the synthetic fleet: means, determinism, parsing."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.fleet.workload import (
    DEFAULT_CONCURRENCY,
    FixedLengths,
    GeometricLengths,
    LinearHazardLengths,
    UniformLengths,
    WorkloadSpec,
    parse_length_distribution,
    parse_workload,
)

NUM_SAMPLES = 200_000


def _rng(seed: int = 7) -> np.random.Generator:
    return np.random.default_rng(seed)


@pytest.mark.parametrize(
    "dist",
    [
        GeometricLengths.from_mean(256),
        GeometricLengths(p0=0.01),
        UniformLengths(nominal_mean_tokens=512),
        FixedLengths(tokens=128),
        LinearHazardLengths(p0=0.002, eta=1e-5),
        LinearHazardLengths(p0=0.004, eta=0.0),
    ],
    ids=str,
)
def test_sample_mean_matches_the_exact_mean_and_lengths_are_positive_integers(dist) -> None:
    samples = dist.sample(_rng(), NUM_SAMPLES)
    assert samples.dtype == np.int64
    assert samples.shape == (NUM_SAMPLES,)
    assert samples.min() >= 1
    # Standard error of the mean is at most σ/√n ≈ mean/450 here; 2% is > 9 standard errors.
    assert samples.mean() == pytest.approx(dist.mean_tokens, rel=0.02)


def test_geometric_mean_is_the_requested_mean() -> None:
    assert GeometricLengths.from_mean(256).mean_tokens == pytest.approx(256.0)
    assert GeometricLengths(p0=0.004).mean_tokens == pytest.approx(250.0)


def test_uniform_spans_half_to_one_and_a_half_times_the_mean() -> None:
    dist = UniformLengths(nominal_mean_tokens=512)
    samples = dist.sample(_rng(), NUM_SAMPLES)
    assert samples.min() == 256
    assert samples.max() == 768
    assert dist.mean_tokens == 512.0


def test_fixed_is_constant() -> None:
    assert set(FixedLengths(tokens=9).sample(_rng(), 1000).tolist()) == {9}


def test_linear_hazard_empirical_hazard_follows_p0_plus_eta_t() -> None:
    p0, eta = 0.005, 2e-5
    samples = LinearHazardLengths(p0=p0, eta=eta).sample(_rng(3), NUM_SAMPLES)
    counts = np.bincount(samples)
    at_risk = counts[::-1].cumsum()[::-1]
    for t in (1, 50, 100, 200):
        empirical = counts[t] / at_risk[t]
        assert empirical == pytest.approx(p0 + eta * t, rel=0.15), t


def test_linear_hazard_ends_where_the_hazard_reaches_one() -> None:
    dist = LinearHazardLengths(p0=0.5, eta=0.25)  # h(1) = 0.75, h(2) = 1
    samples = dist.sample(_rng(), 10_000)
    assert set(samples.tolist()) <= {1, 2}
    assert dist.mean_tokens == pytest.approx(1.25)


def test_linear_hazard_with_eta_zero_is_geometric() -> None:
    assert LinearHazardLengths(p0=0.01, eta=0.0).mean_tokens == pytest.approx(100.0, rel=1e-9)


@pytest.mark.parametrize("text", ["geometric:256/uniform:512", "hazard:p0=0.002,eta=1e-6/fixed:100/closed:8"])
def test_same_seed_same_lengths_other_seed_other_lengths(text: str) -> None:
    spec = WorkloadSpec.parse(text)
    first = spec.sample(_rng(11), 500)
    again = spec.sample(_rng(11), 500)
    other = spec.sample(_rng(12), 500)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not np.array_equal(first[1], other[1])


def test_parse_reads_output_then_prompt_then_concurrency() -> None:
    spec = parse_workload("geometric:256/uniform:512/closed:32")
    assert spec.output == GeometricLengths(p0=1 / 256)
    assert spec.prompt == UniformLengths(nominal_mean_tokens=512)
    assert spec.concurrency == 32
    assert WorkloadSpec.parse("fixed:4/fixed:8").concurrency == DEFAULT_CONCURRENCY


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("geometric:p0=0.25", GeometricLengths(p0=0.25)),
        ("linear_hazard:p0=0.1,eta=0.001", LinearHazardLengths(p0=0.1, eta=0.001)),
        ("hazard:p0=0.1", LinearHazardLengths(p0=0.1, eta=0.0)),
        ("fixed:64", FixedLengths(tokens=64)),
        (" Uniform : 100 ", UniformLengths(nominal_mean_tokens=100)),
    ],
)
def test_parse_length_distribution(text: str, expected) -> None:
    assert parse_length_distribution(text) == expected


@pytest.mark.parametrize(
    "text",
    ["geometric:256/uniform:512/closed:7", "geometric:p0=0.004/hazard:p0=0.001,eta=1e-07/closed:64",
     "uniform:300.5/fixed:3/closed:1"],
)
def test_str_round_trips(text: str) -> None:
    spec = WorkloadSpec.parse(text)
    assert WorkloadSpec.parse(str(spec)) == spec


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("geometric:256", "OUTPUT/PROMPT"),
        ("a/b/c/d", "OUTPUT/PROMPT"),
        ("geometric/uniform:5", "KIND:PARAMS"),
        ("poisson:5/uniform:5", "unknown kind 'poisson'"),
        ("geometric:0.5/uniform:5", "mean must be ≥ 1"),
        ("geometric:p0=1.5/uniform:5", "p0 must be in"),
        ("geometric:p0=0.1,q=2/uniform:5", "expected parameters p0"),
        ("uniform:abc/uniform:5", "not a number"),
        ("uniform:nan/uniform:5", "not finite"),
        ("fixed:1.5/uniform:5", "not an integer"),
        ("fixed:0/uniform:5", "integer ≥ 1"),
        ("hazard:eta=1e-6/uniform:5", "p0 is required"),
        ("hazard:p0=0.1,eta=-1/uniform:5", "eta must be finite and ≥ 0"),
        ("hazard:p0=0.1,p0=0.2/uniform:5", "given twice"),
        ("fixed:5/fixed:5/open:3", "closed:<concurrency>"),
        ("fixed:5/fixed:5/closed:0", "concurrency must be an integer ≥ 1"),
        ("fixed:5/fixed:5/closed:2.5", "concurrency must be an integer ≥ 1"),
    ],
)
def test_parse_errors_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        WorkloadSpec.parse(text)


def test_constructors_validate() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        WorkloadSpec(output=FixedLengths(tokens=1), prompt=FixedLengths(tokens=1), concurrency=0)
    with pytest.raises(ValueError, match="fixed"):
        FixedLengths(tokens=True)
    with pytest.raises(ValueError, match="max_tokens"):
        LinearHazardLengths(p0=0.1, eta=0.0, max_tokens=0)
