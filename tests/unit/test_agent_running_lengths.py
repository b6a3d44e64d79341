"""agents.running_lengths: the running requests' output lengths as a bounded histogram."""

from __future__ import annotations

import bisect
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.running_lengths import MAX_ENTRIES, running_length_entries, running_length_histogram


def test_few_distinct_lengths_are_kept_exactly_and_sorted() -> None:
    assert running_length_histogram([]) == ([], [])
    assert running_length_histogram([5, 300, 5, 0, 70000, 300, 5]) == ([0, 5, 300, 70000], [1, 3, 2, 1])
    lengths = list(range(1000, 1000 + MAX_ENTRIES))  # exactly the limit: still exact
    assert running_length_histogram(lengths) == (lengths, [1] * MAX_ENTRIES)


def test_many_distinct_lengths_are_binned_to_lower_edges() -> None:
    lengths = list(range(0, 4096))
    tokens, counts = running_length_histogram(lengths)
    assert len(tokens) <= MAX_ENTRIES and sum(counts) == 4096
    assert tokens[:64] == list(range(64)) and counts[:64] == [1] * 64  # exact below 64 tokens
    # 1024..2047 in 32 bins of 32 tokens at the finest level that fits
    assert 1024 in tokens and 1056 in tokens and 1040 not in tokens


def test_max_entries_below_the_guarantee_is_refused() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        running_length_histogram([1, 2], max_entries=100)


@given(st.lists(st.integers(0, 2**32 - 1), max_size=3000), st.integers(128, 512))
def test_any_lengths_give_a_bounded_conservative_histogram(lengths: list[int], max_entries: int) -> None:
    tokens, counts = running_length_histogram(lengths, max_entries=max_entries)
    assert len(tokens) == len(counts) <= max_entries
    assert tokens == sorted(set(tokens)) and all(c > 0 for c in counts) and sum(counts) == len(lengths)
    # Every request is reported at a length ≤ its own, within a factor 2 (a power-of-two bin at worst):
    # walk the sorted lengths and the sorted bins together.
    expanded = [t for t, c in zip(tokens, counts, strict=True) for _ in range(c)]
    for reported, actual in zip(expanded, sorted(lengths), strict=True):
        assert reported <= actual < 2 * reported + 64
    if len(set(lengths)) <= max_entries:
        assert Counter(lengths) == Counter(expanded)


@given(st.lists(st.tuples(st.integers(0, 200_000), st.floats(1.6e9, 1.8e9)), max_size=3000))
def test_entries_bin_as_the_histogram_and_carry_their_earliest_admission(requests: list[tuple[int, float]]) -> None:
    lengths = [length for length, _ in requests]
    admitted = [when for _, when in requests]
    tokens, counts, earliest = running_length_entries(lengths, admitted)
    assert (tokens, counts) == running_length_histogram(lengths)
    assert len(earliest) == len(tokens)
    # a request's entry is the largest lower edge at or below its length (bins do not overlap)
    members: dict[int, list[float]] = {}
    for length, when in requests:
        members.setdefault(tokens[bisect.bisect_right(tokens, length) - 1], []).append(when)
    assert [min(members[token]) for token in tokens] == earliest
    assert [len(members[token]) for token in tokens] == counts


def test_entries_need_one_admission_per_length() -> None:
    with pytest.raises(ValueError, match="2 lengths but 1 admission"):
        running_length_entries([3, 4], [1.7e9])
