"""Length histograms: invariants, merging, bytes, moments; what the hazard fit over a histogram needs and costs."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.hazard import fit_hazard_histogram
from controlplane.core.length_histogram import MAX_LENGTH_TOKENS, LengthHistogram, sum_of

# ------------------------------------------------------------------------------------ the histogram


def test_from_samples_counts_valid_lengths_and_drops_the_rest() -> None:
    hist = LengthHistogram.from_samples([3, 1, 3, math.nan, 0.0, -2.0, 2.5, math.inf, 7, 3, 2.0**60])
    assert hist.lengths.tolist() == [1, 3, 7]
    assert hist.counts.tolist() == [1, 3, 1]
    assert hist.count == 5 and len(hist) == 5 and hist.num_distinct == 3
    assert hist.lengths.dtype == np.int64 and hist.counts.dtype == np.int64
    with pytest.raises(ValueError, match="read-only"):
        hist.lengths[0] = 5


def test_from_counts_merges_repeats_and_drops_zero_lengths_and_counts() -> None:
    hist = LengthHistogram.from_counts([5, 0, 2, 5, 9], [1, 4, 2, 3, 0])
    assert hist.lengths.tolist() == [2, 5]
    assert hist.counts.tolist() == [2, 4]


@pytest.mark.parametrize(("lengths", "counts", "match"), [
    ([1, 2], [1], "2 lengths but 1 counts"),
    ([1.5], [1], "lengths must be integers"),
    ([-1], [1], "lengths must be integers"),
    ([1], [-1], "counts must be integers"),
    ([1], [math.nan], "counts must be integers"),
])
def test_from_counts_rejects_bad_pairs(lengths: list, counts: list, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LengthHistogram.from_counts(lengths, counts)


@pytest.mark.parametrize(("lengths", "counts", "match"), [
    (np.array([2, 1]), np.array([1, 1]), "strictly increasing"),
    (np.array([1, 1]), np.array([1, 1]), "strictly increasing"),
    (np.array([0, 1]), np.array([1, 1]), r"\[1, 2\*\*53\]"),
    (np.array([1]), np.array([0]), "counts must be ≥ 1"),
    (np.array([1.0]), np.array([1]), "int64"),
    (np.array([1, 2]), np.array([1]), "one size"),
])
def test_constructor_rejects_broken_invariants(lengths: np.ndarray, counts: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LengthHistogram(lengths, counts)


def test_merging_adds_counts() -> None:
    a = LengthHistogram.from_samples([1, 2, 2, 9])
    b = LengthHistogram.from_samples([2, 3, 9, 9])
    merged = a.merged(b)
    assert merged.lengths.tolist() == [1, 2, 3, 9]
    assert merged.counts.tolist() == [1, 3, 1, 3]
    assert sum_of([a, LengthHistogram.empty(), b]).counts.tolist() == merged.counts.tolist()
    assert sum_of([]).count == 0
    assert sum_of([a]) is a


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(1, 5000), max_size=60), max_size=6))
def test_merge_equals_histogram_of_concatenation(parts: list[list[int]]) -> None:
    merged = sum_of(LengthHistogram.from_samples(np.array(p, dtype=np.float64)) for p in parts)
    direct = LengthHistogram.from_samples(np.array([x for p in parts for x in p], dtype=np.float64))
    assert merged.lengths.tolist() == direct.lengths.tolist()
    assert merged.counts.tolist() == direct.counts.tolist()


def test_bytes_round_trip_and_size() -> None:
    hist = LengthHistogram.from_samples(np.random.default_rng(0).geometric(1 / 300, 5000))
    data = hist.to_bytes()
    assert len(data) == 16 + 16 * hist.num_distinct
    back = LengthHistogram.from_bytes(data)
    assert back.lengths.tolist() == hist.lengths.tolist()
    assert back.counts.tolist() == hist.counts.tolist()
    assert LengthHistogram.from_bytes(LengthHistogram.empty().to_bytes()).count == 0


@pytest.mark.parametrize(("mutate", "match"), [
    (lambda b: b[:10], "shorter than the 16-byte header"),
    (lambda b: b"XXXX" + b[4:], "bad magic"),
    (lambda b: b[:4] + bytes([2]) + b[5:], "unsupported version"),
    (lambda b: b[:-8], "the header announces"),
    (lambda b: b + b"\0" * 16, "the header announces"),
    # Swap the first two lengths: no longer increasing.
    (lambda b: b[:16] + b[24:32] + b[16:24] + b[32:], "strictly increasing"),
    # A count of zero.
    (lambda b: b[:-8] + (0).to_bytes(8, "little"), "counts must be ≥ 1"),
])
def test_from_bytes_rejects_malformed_data(mutate, match: str) -> None:
    data = LengthHistogram.from_samples([4, 8, 8, 15]).to_bytes()
    with pytest.raises(ValueError, match=match):
        LengthHistogram.from_bytes(mutate(data))


@pytest.mark.parametrize("seed", range(5))
def test_moments_and_percentiles_match_numpy(seed: int) -> None:
    rng = np.random.default_rng(seed)
    samples = rng.geometric(1 / 200, size=int(rng.integers(1, 3000))).astype(np.float64)
    hist = LengthHistogram.from_samples(samples)
    assert hist.mean() == float(samples.mean())  # exact sums: bit for bit
    assert hist.total_tokens() == float(samples.sum())
    assert hist.std() == pytest.approx(float(samples.std()), rel=1e-13)
    for q in (0.0, 1.0, 5.0, 50.0, 95.0, 99.0, 100.0, 33.3):
        assert hist.percentile(q) == float(np.percentile(samples, q, method="inverted_cdf"))
    assert hist.max_length() == int(samples.max())


def test_percentile_matches_numpy_on_every_small_size() -> None:
    # n·0.95 lands on and around integers for these sizes (20, 40, 60, …): the rounding must be numpy's.
    rng = np.random.default_rng(1)
    for n in range(1, 400):
        samples = rng.integers(1, 50, size=n).astype(np.float64)
        assert LengthHistogram.from_samples(samples).percentile(95.0) == float(
            np.percentile(samples, 95.0, method="inverted_cdf")), n


def test_empty_histogram_moments_and_percentile() -> None:
    empty = LengthHistogram.empty()
    assert math.isnan(empty.mean()) and math.isnan(empty.std()) and empty.max_length() == 0
    with pytest.raises(ValueError, match="empty"):
        empty.percentile(95.0)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        LengthHistogram.from_samples([1]).percentile(101.0)


def test_count_at_least_and_dense_counts() -> None:
    hist = LengthHistogram.from_samples([2, 2, 5, 9])
    assert hist.count_at_least(np.array([0, 1, 2, 3, 5, 6, 9, 10])).tolist() == [4, 4, 4, 2, 2, 1, 1, 0]
    assert hist.dense_counts(6).tolist() == [0, 0, 2, 0, 0, 1, 0]


def test_largest_length_is_two_to_the_53() -> None:
    hist = LengthHistogram.from_samples([float(MAX_LENGTH_TOKENS), float(MAX_LENGTH_TOKENS) * 2.0])
    assert hist.lengths.tolist() == [MAX_LENGTH_TOKENS]


# ---------------------------------------------------------------------------------- the fit over a histogram


def test_histogram_fit_needs_completions_and_prompts() -> None:
    hist = LengthHistogram.from_samples([10, 20])
    assert fit_hazard_histogram(LengthHistogram.empty(), prompt_count=3, prompt_sum_tokens=30.0) is None
    assert fit_hazard_histogram(hist, prompt_count=0, prompt_sum_tokens=0.0) is None
    for count, total in ((-1, 10.0), (3, math.nan), (3, 2.0), (3, math.inf)):
        with pytest.raises(ValueError, match="prompt statistics"):
            fit_hazard_histogram(hist, prompt_count=count, prompt_sum_tokens=total)


def test_histogram_fit_cost_follows_distinct_lengths() -> None:
    # Ten million completions over a handful of lengths: nothing of size O(samples) is built.
    hist = LengthHistogram(np.array([1, 2, 3, 50], dtype=np.int64),
                           np.array([4_000_000, 3_000_000, 2_000_000, 1_000_000], dtype=np.int64))
    fit = fit_hazard_histogram(hist, prompt_count=10_000_000, prompt_sum_tokens=5e9)
    assert fit is not None
    assert fit.stats.num_samples == 10_000_000
    assert fit.stats.mu_o_tokens == pytest.approx((4 + 6 + 6 + 50) / 10.0, rel=1e-15)
    assert fit.stats.t95_tokens == 50.0
