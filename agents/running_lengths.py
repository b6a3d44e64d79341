"""The running requests' output lengths as a compact histogram (right-censored observations for the hazard fit).

`running_length_histogram(lengths)` turns the current output token counts of the running requests into
(`output_tokens`, `num_requests`) sorted by length with at most `max_entries` entries: exact lengths while
there are few distinct ones, else lengths binned on a log scale (exact below 64 tokens, then 32, 16, … bins per
power of two, the coarsest that fits). A binned length is the bin's lower edge: a request that has generated
x tokens is reported at ≤ x, which keeps "its output is longer than the reported length" true.

Pure: no I/O, no clock. Called by the scheduler thread at most once per batch interval (O(running)).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

MAX_ENTRIES = 256
EXACT_BELOW_TOKENS = 64
_MIN_MAX_ENTRIES = 128  # 64 exact values + one bin per power of two up to 2**32 always fit


def running_length_histogram(lengths: Iterable[int], *, max_entries: int = MAX_ENTRIES
                             ) -> tuple[list[int], list[int]]:
    """(output_tokens, num_requests) of `lengths`, sorted by length, at most `max_entries` entries.

    Args:
        lengths: output tokens generated so far by each running request (≥ 0).
        max_entries: the most histogram entries (≥ 128).

    Returns:
        Two lists of equal length; the counts sum to the number of lengths. Empty lists for no lengths.

    Raises:
        ValueError: max_entries below 128.
    """
    if max_entries < _MIN_MAX_ENTRIES:
        raise ValueError(f"max_entries must be ≥ {_MIN_MAX_ENTRIES}, got {max_entries}")
    counts = Counter(lengths)
    bins_per_octave = 32
    while len(counts) > max_entries:
        binned: Counter[int] = Counter()
        for length, count in counts.items():
            binned[_bin_floor(length, bins_per_octave)] += count
        if len(binned) <= max_entries or bins_per_octave == 1:
            counts = binned
            break
        bins_per_octave //= 2
    ordered = sorted(counts.items())
    return [length for length, _ in ordered], [count for _, count in ordered]


def _bin_floor(length: int, bins_per_octave: int) -> int:
    if length < EXACT_BELOW_TOKENS:
        return length
    width = (1 << (length.bit_length() - 1)) // bins_per_octave
    return length - length % width if width > 1 else length
