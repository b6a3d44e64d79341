"""The running requests' output lengths as a compact histogram (right-censored observations for the hazard fit).

`running_length_histogram(lengths)` turns the current output token counts of the running requests into
(`output_tokens`, `num_requests`) sorted by length with at most `max_entries` entries: exact lengths while
there are few distinct ones, else lengths binned on a log scale (exact below 64 tokens, then 32, 16, … bins per
power of two, the coarsest that fits). A binned length is the bin's lower edge: a request that has generated
x tokens is reported at ≤ x, which keeps "its output is longer than the reported length" true.
`running_length_entries(lengths, admitted_s)` bins alike and gives each entry the earliest time one of its
requests was first scheduled (the controller counts an entry as admitted after a time only when all of it is).

Pure: no I/O, no clock. Called by the scheduler thread at most once per batch interval (O(running)).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence

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
    counts = Counter(lengths)
    bins_per_octave = _bins_per_octave(counts, max_entries)
    if bins_per_octave is not None:
        binned: Counter[int] = Counter()
        for length, count in counts.items():
            binned[_bin_floor(length, bins_per_octave)] += count
        counts = binned
    ordered = sorted(counts.items())
    return [length for length, _ in ordered], [count for _, count in ordered]


def running_length_entries(lengths: Sequence[int], admitted_s: Sequence[float], *, max_entries: int = MAX_ENTRIES
                           ) -> tuple[list[int], list[int], list[float]]:
    """(output_tokens, num_requests, admitted_time_s): `running_length_histogram(lengths)`'s entries and, per
    entry, the earliest of its requests' admitted_s (when each was first scheduled).

    Raises:
        ValueError: max_entries below 128, or lengths and admitted_s of different sizes.
    """
    if len(lengths) != len(admitted_s):
        raise ValueError(f"{len(lengths)} lengths but {len(admitted_s)} admission times")
    bins_per_octave = _bins_per_octave(Counter(lengths), max_entries)
    counts: Counter[int] = Counter()
    earliest: dict[int, float] = {}
    for length, admitted in zip(lengths, admitted_s, strict=True):
        key = length if bins_per_octave is None else _bin_floor(length, bins_per_octave)
        counts[key] += 1
        if key not in earliest or admitted < earliest[key]:
            earliest[key] = admitted
    ordered = sorted(counts)
    return ordered, [counts[key] for key in ordered], [earliest[key] for key in ordered]


def _bins_per_octave(counts: Counter[int], max_entries: int) -> int | None:
    """The finest log binning that leaves at most max_entries entries (None: exact lengths fit)."""
    if max_entries < _MIN_MAX_ENTRIES:
        raise ValueError(f"max_entries must be ≥ {_MIN_MAX_ENTRIES}, got {max_entries}")
    if len(counts) <= max_entries:
        return None
    bins_per_octave = 32
    while bins_per_octave > 1 and len({_bin_floor(length, bins_per_octave) for length in counts}) > max_entries:
        bins_per_octave //= 2
    return bins_per_octave


def _bin_floor(length: int, bins_per_octave: int) -> int:
    if length < EXACT_BELOW_TOKENS:
        return length
    width = (1 << (length.bit_length() - 1)) // bins_per_octave
    return length - length % width if width > 1 else length
