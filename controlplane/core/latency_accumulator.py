"""`LatencyAccumulator`: the values of several latency sketches appended batch by batch as they arrive, folded
into bucket counts and exact sums FOLD_ROWS rows at a time, so that the sketches of a second of a large pool
(192,000 values at 1,000 engines) cost O(MAX_ENTRIES) when asked for, not O(values); equal to
`LatencySketch.from_values` of the same values, optionally without some rows (`core.latency_sketch` holds the
sketch, its buckets and its exact-sum units).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math

import numpy as np

from controlplane.core.latency_sketch import (  # the sketch's own bucket and unit layout
    _HIGH_UNITS_PER_S,
    _LOW_BITS,
    _UNITS_PER_S,
    MAX_ENTRIES,
    MAX_S,
    MIN_S,
    LatencySketch,
    _offsets_of,
)

# Rows an accumulator lets wait before folding them into its counts: one fold's work stays a fraction of a
# millisecond, and its per-call overhead is shared by a few dozen batches of a few hundred values.
FOLD_ROWS = 4096
# Rows whose float64 running sums of the high and low parts (each an integer below 2³⁹) stay exact (n·2³⁹ ≤
# 2⁵³); in int64 they do below 2²⁴ rows.
_EXACT_FLOAT_ROWS = 1 << 14
_EXACT_INT_ROWS = 1 << 24


def _segment_of(sizes: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The index of the segment (of consecutive rows, `sizes` each) each of `rows` lies in."""
    return np.searchsorted(np.cumsum(sizes), rows, side="right")


def _units_by_sketch(clipped_s: np.ndarray, sizes: np.ndarray, num_sketches: int) -> list[int]:
    """Exact Σ value in 2⁻⁶⁶ s units of each sketch's rows, segment i of `sizes` going to sketch i mod
    num_sketches (values in [MIN_S, MAX_S], split as `_units_of` does, summed per segment)."""
    size = clipped_s.size
    parts = np.empty((2, size), dtype=np.float64)
    high, low = parts
    np.multiply(clipped_s, float(_HIGH_UNITS_PER_S), out=high)
    np.floor(high, out=high)
    np.divide(high, float(_HIGH_UNITS_PER_S), out=low)
    np.subtract(clipped_s, low, out=low)
    np.multiply(low, float(_UNITS_PER_S), out=low)
    if size > _EXACT_FLOAT_ROWS:
        parts = parts.astype(np.int64)
        if size >= _EXACT_INT_ROWS:
            parts = parts.astype(object)  # Python integers
    nonempty = np.flatnonzero(sizes)
    by_segment = np.zeros((2, sizes.size), dtype=parts.dtype)
    if nonempty.size:
        by_segment[:, nonempty] = np.add.reduceat(parts, (np.cumsum(sizes) - sizes)[nonempty], axis=1)
    high_sums, low_sums = by_segment.reshape(2, -1, num_sketches).sum(axis=1).tolist()
    return [(int(h) << _LOW_BITS) + int(lo) for h, lo in zip(high_sums, low_sums, strict=True)]


def _tally(values_s: np.ndarray, sizes: np.ndarray, num_sketches: int
           ) -> tuple[np.ndarray, list[int], list[int], int]:
    """What `values_s` add to `num_sketches` sketches, in segments of consecutive rows (`sizes`, int64, a
    multiple of num_sketches of them), segment i going to sketch i mod num_sketches: (dense counts, int64,
    sketch k's bucket offsets at [k·MAX_ENTRIES, (k + 1)·MAX_ENTRIES); exact sums in 2⁻⁶⁶ s units; clamped
    counts; rejected count). Rejects, clamps, buckets and sums as `LatencySketch.add_many` does, so the
    sketches built from it equal `from_values` of each sketch's values. O(rows + segments + MAX_ENTRIES)."""
    nothing = [0] * num_sketches
    if not values_s.size:
        return np.zeros(num_sketches * MAX_ENTRIES, dtype=np.int64), nothing, list(nothing), 0
    low, high = values_s.min(), values_s.max()
    rejected = 0
    if not (low >= 0.0 and high < math.inf):  # a negative, NaN or infinite value (NaN fails both comparisons)
        valid = np.isfinite(values_s) & (values_s >= 0.0)
        bad = np.flatnonzero(~valid)
        rejected = int(bad.size)
        sizes = sizes - np.bincount(_segment_of(sizes, bad), minlength=sizes.size)
        values_s = values_s[valid]
    clamped = nothing
    if values_s.size and not (low >= MIN_S and high <= MAX_S):
        clipped = np.clip(values_s, MIN_S, MAX_S)
        moved = np.flatnonzero(clipped != values_s)
        clamped = np.bincount(_segment_of(sizes, moved) % num_sketches, minlength=num_sketches).tolist()
        values_s = clipped
    offsets = _offsets_of(values_s)
    offsets += np.repeat(np.arange(sizes.size, dtype=np.int64) % num_sketches * MAX_ENTRIES, sizes)
    dense = np.bincount(offsets, minlength=num_sketches * MAX_ENTRIES)
    return dense, _units_by_sketch(values_s, sizes, num_sketches), clamped, rejected


class LatencyAccumulator:
    """The values of `num_sketches` latency sketches appended batch by batch, made into sketches at the end, with
    or without some of the rows (one engine's excess, say).

    Each `append` of one value column per sketch is kept as rows (the first column's values first); once
    FOLD_ROWS rows wait, they are folded into dense bucket counts, exact sums and clamped counts in one
    vectorised pass. So an `append` costs O(its values) plus, every FOLD_ROWS rows, one fold of about FOLD_ROWS
    rows; `sketches` costs at most one fold, O(num_sketches·MAX_ENTRIES), and O(d log d + batches) for d rows
    left out, however many rows were appended.

    Contract: `sketches(drop_rows)` equals, sketch for sketch, `LatencySketch.from_values` of that sketch's
    appended values without the rows in `drop_rows` (the same buckets, counts, exact sum and clamped count).
    Negative and non-finite values are rejected as there (`num_rejected` counts them). The rows' values are
    kept (8 bytes a row, plus a few per batch) for the rows `sketches` may be asked to leave out, so the total
    count stays far below MAX_COUNT.
    """

    __slots__ = ("_clamped", "_dense", "_folded_rows", "_folded_segments", "_num_rejected", "_num_sketches",
                 "_segments", "_size", "_units", "_values")

    def __init__(self, num_sketches: int) -> None:
        """An accumulator of `num_sketches` (≥ 1) empty sketches."""
        if num_sketches < 1:
            raise ValueError(f"latency accumulator: at least one sketch, got {num_sketches}")
        self._num_sketches = num_sketches
        self._values = np.empty(1024, dtype=np.float64)
        self._size = 0
        self._segments: list[int] = []  # per batch, its columns' sizes in order (num_sketches entries)
        self._folded_rows = 0
        self._folded_segments = 0
        self._dense = np.zeros(num_sketches * MAX_ENTRIES, dtype=np.int64)
        self._units = [0] * num_sketches
        self._clamped = [0] * num_sketches
        self._num_rejected = 0

    @property
    def size(self) -> int:
        """Rows appended so far."""
        return self._size

    @property
    def num_rejected(self) -> int:
        """Negative or non-finite values among the rows folded so far (all of them after `sketches`)."""
        return self._num_rejected

    def append(self, *columns_s: np.ndarray) -> tuple[int, int]:
        """Append one 1-D column of latencies in seconds per sketch; returns the (start, end) rows they took.

        Raises:
            ValueError: not one column per sketch (nothing is appended).
        """
        if len(columns_s) != self._num_sketches:
            raise ValueError(f"latency accumulator: {self._num_sketches} columns expected, got {len(columns_s)}")
        values = np.concatenate(columns_s, axis=None, dtype=np.float64)
        start = self._size
        end = start + values.size
        if end > self._values.size:
            grown = np.empty(max(end, 2 * self._values.size), dtype=np.float64)
            grown[:start] = self._values[:start]
            self._values = grown
        self._values[start:end] = values
        self._size = end
        self._segments.extend(column.size for column in columns_s)
        if end - self._folded_rows >= FOLD_ROWS:
            self._fold()
        return start, end

    def _fold(self) -> None:
        """Fold the waiting rows (whole batches) into the counts, sums and clamped counts."""
        start, end = self._folded_rows, self._size
        if start == end:
            return
        sizes = np.array(self._segments[self._folded_segments:], dtype=np.int64)
        dense, units, clamped, rejected = _tally(self._values[start:end], sizes, self._num_sketches)
        self._dense += dense
        for k in range(self._num_sketches):
            self._units[k] += units[k]
            self._clamped[k] += clamped[k]
        self._num_rejected += rejected
        self._folded_rows, self._folded_segments = end, len(self._segments)

    def sketches(self, drop_rows: np.ndarray | None = None) -> tuple[LatencySketch, ...]:
        """One sketch per column, of every row appended except those in `drop_rows` (row numbers as `append`
        returns them; repeats count once). The accumulator keeps every row: it can be asked again.

        Raises:
            ValueError: a row in `drop_rows` that was never appended.
        """
        self._fold()
        dense, units, clamped = self._dense, list(self._units), list(self._clamped)
        if drop_rows is not None and np.size(drop_rows):
            rows = np.unique(np.asarray(drop_rows, dtype=np.int64))
            if int(rows[0]) < 0 or int(rows[-1]) >= self._size:
                raise ValueError(f"latency accumulator: rows to leave out must lie in [0, {self._size}), got "
                                 f"{int(rows[0])}..{int(rows[-1])}")
            sketch_of = _segment_of(np.array(self._segments, dtype=np.int64), rows) % self._num_sketches
            by_sketch = rows[np.argsort(sketch_of, kind="stable")]
            dropped, dropped_units, dropped_clamped, _ = _tally(
                self._values[by_sketch], np.bincount(sketch_of, minlength=self._num_sketches), self._num_sketches)
            dense = dense - dropped
            for k in range(self._num_sketches):
                units[k] -= dropped_units[k]
                clamped[k] -= dropped_clamped[k]
        built = []
        for k in range(self._num_sketches):
            sketch = LatencySketch()
            part = dense[k * MAX_ENTRIES:(k + 1) * MAX_ENTRIES]
            sketch._set_dense(part, int(part.sum()), units[k], clamped[k])
            built.append(sketch)
        return tuple(built)
