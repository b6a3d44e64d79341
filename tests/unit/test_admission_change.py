"""Locating a shift in admission time: the log-rank scan over admission buckets."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.core.admission_change import admission_change_point
from controlplane.core.admitted_counts import AdmittedCounts

PER_BUCKET = 200
TOKENS_PER_BUCKET = 32  # every request generates this many tokens per bucket


def observe(means: list[float], now_bucket: int, seed: int = 0) -> tuple[AdmittedCounts, AdmittedCounts]:
    """PER_BUCKET requests admitted in each bucket i with geometric outputs of mean means[i], seen at the end of
    now_bucket: (completed, running at their lengths so far)."""
    rng = np.random.default_rng(seed)
    admitted = np.repeat(np.arange(len(means)), PER_BUCKET)
    lengths = np.concatenate([rng.geometric(1.0 / mean, PER_BUCKET) for mean in means])
    so_far = (now_bucket + 1 - admitted) * TOKENS_PER_BUCKET
    done = lengths <= so_far
    return (AdmittedCounts.from_columns(admitted[done], lengths[done]),
            AdmittedCounts.from_columns(admitted[~done], so_far[~done]))


@pytest.mark.parametrize("seed", range(5))
def test_a_shift_to_longer_outputs_is_found_at_the_new_laws_first_admission_bucket_plus_one(seed: int) -> None:
    means = [64.0] * 30 + [512.0] * 20  # the law changes with bucket 30
    completed, running = observe(means, now_bucket=49, seed=seed)
    found = admission_change_point([completed], [running], first_bucket=0, last_candidate=45, direction=1)
    assert found == 31  # bucket 30 is where the split falls; it is left out as if it held both laws


def test_a_shift_to_shorter_outputs_is_found_in_its_own_direction_only() -> None:
    completed, running = observe([512.0] * 30 + [64.0] * 20, now_bucket=49)
    assert admission_change_point([completed], [running], first_bucket=0, last_candidate=45, direction=-1) == 31
    assert admission_change_point([completed], [running], first_bucket=0, last_candidate=45, direction=1) is None


@pytest.mark.parametrize("seed", range(5))
def test_one_law_has_no_change_point(seed: int) -> None:
    completed, running = observe([256.0] * 50, now_bucket=49, seed=seed)
    for direction in (1, -1):
        assert admission_change_point([completed], [running], first_bucket=0, last_candidate=45,
                                      direction=direction) is None


def test_requests_admitted_before_the_first_bucket_are_left_out_and_later_ones_form_one_group() -> None:
    completed, running = observe([512.0] * 20 + [64.0] * 30 + [512.0] * 20, now_bucket=69)
    # from bucket 20 on, the only change is towards longer outputs at bucket 50
    assert admission_change_point([completed], [running], first_bucket=20, last_candidate=55, direction=1) == 51
    # candidates end before it: the split can still fall at the group of the later admissions
    assert admission_change_point([completed], [running], first_bucket=20, last_candidate=48, direction=1) == 50


def test_parts_sum_as_one() -> None:
    completed, running = observe([64.0] * 30 + [512.0] * 20, now_bucket=49)
    halves = [AdmittedCounts.from_columns(completed.admitted[keep], completed.lengths[keep], completed.counts[keep])
              for keep in (completed.lengths % 2 == 0, completed.lengths % 2 == 1)]
    assert admission_change_point(halves, [running, AdmittedCounts.empty()], first_bucket=0, last_candidate=45,
                                  direction=1) == 31


def test_bad_arguments_are_refused() -> None:
    empty = [AdmittedCounts.empty()]
    with pytest.raises(ValueError, match="before first"):
        admission_change_point(empty, empty, first_bucket=5, last_candidate=4, direction=1)
    with pytest.raises(ValueError, match="direction"):
        admission_change_point(empty, empty, first_bucket=0, last_candidate=4, direction=0)
    assert admission_change_point(empty, empty, first_bucket=0, last_candidate=4, direction=1) is None
