"""The bucketed, re-basable completion window: merging, running snapshots at both ends, rebase, pruning."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controlplane.core.adaptive_window import TRANSIENT_FACTOR, AdaptiveLengthWindow, fit_window
from controlplane.core.hazard import fit_hazard_histogram
from controlplane.core.length_histogram import LengthHistogram


def hist(values) -> LengthHistogram:
    array = np.asarray(values, dtype=np.int64)
    return LengthHistogram.from_counts(array, np.ones_like(array))


def filled(num_buckets: int, *, per_bucket: int = 10, running: bool = True) -> AdaptiveLengthWindow:
    window = AdaptiveLengthWindow(retain_samples=10_000)
    for b in range(num_buckets):
        window.add(b, hist(np.arange(1, per_bucket + 1) + b), prompt_count=per_bucket,
                   prompt_sum_tokens=100.0 * per_bucket)
        if running:
            window.record_running(b, hist([b + 1, b + 2]))
    return window


def test_window_merges_the_newest_whole_buckets() -> None:
    window = filled(5)
    view = window.window(max_samples=25)
    assert view is not None
    assert (view.first_bucket_id, view.last_bucket_id) == (2, 4)  # 3 buckets of 10 reach 25
    assert view.num_samples == 30 and view.prompt_count == 30 and view.prompt_sum_tokens == 3000.0
    assert view.censored is not None and view.censored.lengths.tolist() == [5, 6]  # closing: bucket 4's
    assert view.truncated is not None and view.truncated.lengths.tolist() == [2, 3]  # opening: bucket 1's
    assert not view.rebased and not view.transient
    everything = window.window(max_samples=10_000)
    assert everything is not None and everything.num_samples == 50
    assert everything.truncated is not None and everything.truncated.count == 0  # nothing ran before bucket 0
    assert window.window(max_samples=100, min_samples=51) is None


def test_window_validates_its_arguments() -> None:
    window = filled(2)
    for kwargs in ({"max_samples": 0}, {"max_samples": 10_001}, {"max_samples": 10, "min_samples": 11}):
        with pytest.raises(ValueError, match="max_samples"):
            window.window(**kwargs)
    with pytest.raises(ValueError, match="prompt statistics"):
        window.add(3, hist([1]), prompt_count=2, prompt_sum_tokens=1.0)
    with pytest.raises(ValueError, match="retain_samples"):
        AdaptiveLengthWindow(retain_samples=0)


def test_without_snapshots_the_window_is_plain() -> None:
    view = filled(3, running=False).window(max_samples=15)
    assert view is not None and view.censored is None and view.truncated is None


def test_an_unknown_opening_drops_censoring() -> None:
    window = AdaptiveLengthWindow()
    for b in range(4):
        window.add(b, hist(np.arange(1, 11)))
        if b != 1:
            window.record_running(b, hist([b + 1]))
    view = window.window(max_samples=15)
    # The window opens after bucket 1, whose snapshot is unknown: neither end is used.
    assert view is not None and view.first_bucket_id == 2
    assert view.censored is None and view.truncated is None


def test_rebase_drops_older_buckets_and_opens_at_the_last_dropped_snapshot() -> None:
    window = filled(6)
    assert window.bucket_of_sample(0) == 0
    assert window.bucket_of_sample(35) == 3
    assert window.bucket_of_sample(60) is None
    window.rebase(window.bucket_of_sample(35))
    assert window.num_rebases == 1
    view = window.window(max_samples=10_000)
    assert view is not None
    assert (view.first_bucket_id, view.last_bucket_id, view.num_samples) == (3, 5, 30)
    assert view.truncated is not None and view.truncated.lengths.tolist() == [3, 4]  # bucket 2's snapshot
    assert view.rebased
    # Late telemetry for a dropped bucket is refused and counted.
    assert not window.add(1, hist([7, 7]))
    assert not window.record_running(2, hist([1]))
    assert window.num_dropped == 2
    assert window.bucket_of_sample(5) is None


def test_rebased_window_is_transient_until_it_outgrows_the_requests_in_flight() -> None:
    window = AdaptiveLengthWindow()
    window.add(0, hist(np.arange(1, 101)))
    window.record_running(0, hist(np.arange(1, 21)))  # 20 requests in flight at the rebase point
    window.rebase(1)
    num_added = 0
    while num_added < TRANSIENT_FACTOR * 20:
        view = window.window(max_samples=4096)
        assert view is None or view.transient
        window.add(1 + num_added, hist([50]), prompt_count=1, prompt_sum_tokens=300.0)
        window.record_running(1 + num_added, hist(np.arange(1, 21)))
        num_added += 1
    view = window.window(max_samples=4096)
    assert view is not None and view.rebased and not view.transient
    assert fit_window(view) is not None


def test_pruning_keeps_the_retained_samples_and_moves_the_opening() -> None:
    window = AdaptiveLengthWindow(retain_samples=30, max_buckets=100)
    for b in range(10):
        window.add(b, hist(np.full(10, b + 1)))
        window.record_running(b, hist([b + 100]))
    view = window.window(max_samples=30)
    assert view is not None and (view.first_bucket_id, view.last_bucket_id) == (7, 9)
    assert view.truncated is not None and view.truncated.lengths.tolist() == [106]
    assert not window.add(3, hist([1]))  # pruned
    capped = AdaptiveLengthWindow(retain_samples=10_000, max_buckets=4)
    for b in range(10):
        capped.add(b, hist([1]))
    view = capped.window(max_samples=10_000)
    assert view is not None and view.first_bucket_id == 6


def test_a_new_oldest_bucket_makes_the_opening_unknown() -> None:
    window = AdaptiveLengthWindow()
    window.add(5, hist([1, 2]))
    window.record_running(5, hist([3]))
    window.add(4, hist([9]))  # late telemetry for an older bucket
    window.record_running(4, hist([2]))
    view = window.window(max_samples=4096)
    assert view is not None and view.num_samples == 3
    assert view.censored is None and view.truncated is None


def test_add_samples_keeps_valid_pairs_only() -> None:
    window = AdaptiveLengthWindow()
    rejected = window.add_samples(0, np.array([100, math.nan, 50, 20]), np.array([10, 10, 0, 30]))
    assert rejected == 2
    assert window.add_samples(0, np.array([1, 2]), np.array([1])) == 2
    view = window.window(max_samples=10)
    assert view is not None and view.completed.lengths.tolist() == [10, 30]
    assert (view.prompt_count, view.prompt_sum_tokens) == (2, 120.0)
    window.rebase(1)
    assert window.add_samples(0, np.array([5]), np.array([5])) == 1  # below the floor


def test_fit_window_is_the_histogram_fit_of_the_view() -> None:
    window = filled(8)
    view = window.window(max_samples=40)
    assert view is not None
    fit = fit_window(view)
    expected = fit_hazard_histogram(view.completed, prompt_count=view.prompt_count,
                                    prompt_sum_tokens=view.prompt_sum_tokens, censored=view.censored,
                                    truncated=view.truncated)
    assert fit is not None and expected is not None
    assert fit.stats == expected.stats
