"""Mergeable log-linear (DDSketch-style) sketches of request latencies in seconds.

A `LatencySketch` holds latencies (time to first token, time per output token, queue wait) of a pool's
finished requests as counts per logarithmic bucket. Bucket i holds the values x with γ^(i−1) < x ≤ γ^i,
γ = (1 + a)/(1 − a), a = RELATIVE_ACCURACY = 1%, so x goes to bucket ⌈ln x / ln γ⌉ and the bucket's
representative value 2γ^i/(γ + 1) is within a relative of every value in it.

Range: values in [MIN_S, MAX_S] (100 µs to 1 h) are kept as they are; finite values below MIN_S (zero
included) are counted at MIN_S and values above MAX_S at MAX_S (`num_clamped` counts both). Negative and
non-finite values are rejected. The representatives are clipped to [MIN_S, MAX_S], so the lowest bucket
reports exactly MIN_S and the highest exactly MAX_S (clipping moves a representative towards every
in-range value of its bucket, so the accuracy guarantee holds there too). That makes
MAX_ENTRIES = MAX_INDEX − MIN_INDEX + 1 = 871 buckets.

Quantile contract: `quantile(q)` is the representative of the bucket holding the sample of 0-based rank
⌊q·(count − 1)⌋ in ascending order. For samples all inside [MIN_S, MAX_S] it is within RELATIVE_ACCURACY
relative of that sample, |quantile(q) − x₍ᵣ₎| ≤ a·x₍ᵣ₎ (up to float64 rounding of ln, a few 1e−16 relative).
Clamped samples are reported as MIN_S or MAX_S.

Sum: `sum_s` is the exact sum of the kept (clamped) values, correctly rounded to float64. Every value in
[MIN_S, MAX_S] is an integer multiple of 2⁻⁶⁶ s (MIN_S ≥ 2⁻¹⁴), so the sketch keeps the sum as an integer
count of 2⁻⁶⁶ s units: merging is exactly commutative and associative and `subtract` undoes `merge` exactly,
so a sliding window's running total does not drift. The wire carries `sum_s` as float64; a sketch read back
holds that float's exact value (nudged into [count·MIN_S, count·MAX_S] where rounding took it just outside),
so it equals the sketch it was written from (equality compares `sum_s`).

Merging: `merge` and `subtract` update a sketch in place; `sum_of` merges many at once.

Accumulating many batches into sketches at once: `core.latency_accumulator`.

Storage: sparse, sorted bucket offsets (int16) and their counts (int64, each ≥ 1), replaced (never written in
place) by every update, so copies share them. Memory per sketch: about 350 + 10·k bytes for k non-empty
buckets (k ≤ 871; a one-second sketch of one pool holding tens to thousands of values has tens to a few
hundred: ~1.1 KiB for 100 values, ~2.6 KiB for 1,000), about 80 bytes when empty (the empty arrays are
shared).

Wire format (`to_bytes`, all little-endian, 22 + k·(2 + w) bytes):
  b"LS1" (magic and version) | flags u8 (bit 0: counts are u64, else u32; other bits zero) |
  k u16 | num_clamped u64 | sum_s f64 | k bucket indices i16 (strictly increasing, in
  [MIN_INDEX, MAX_INDEX]) | k counts u32 or u64 (each ≥ 1).
`from_bytes` validates every field and raises only ValueError, whatever the input.

Counts: the total count of a sketch is at most MAX_COUNT = 2⁵³ (float64 ranks and bincount stay exact).

Pure: numpy and the standard library only; no I/O, no clock.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence

import numpy as np

RELATIVE_ACCURACY = 0.01
GAMMA = (1.0 + RELATIVE_ACCURACY) / (1.0 - RELATIVE_ACCURACY)
MIN_S = 1e-4
MAX_S = 3600.0
_LOG_GAMMA = math.log(GAMMA)
MIN_INDEX = math.ceil(math.log(MIN_S) / _LOG_GAMMA)
MAX_INDEX = math.ceil(math.log(MAX_S) / _LOG_GAMMA)
MAX_ENTRIES = MAX_INDEX - MIN_INDEX + 1
MAX_COUNT = 1 << 53

_UNITS_PER_S = 1 << 66
_HIGH_UNITS_PER_S = 1 << 27
_LOW_BITS = 66 - 27
_MIN_UNITS = int(MIN_S * _UNITS_PER_S)
_MAX_UNITS = int(MAX_S * _UNITS_PER_S)

_MAGIC = b"LS1"
_FLAG_WIDE_COUNTS = 0x01
# magic (3 bytes), flags (u8), number of buckets (u16), num_clamped (u64), sum_s (f64), little-endian.
_HEADER = struct.Struct("<3sBHQd")
_U32_MAX = (1 << 32) - 1


def _read_only(array: np.ndarray) -> np.ndarray:
    """`array` itself, made read-only (callers pass arrays nothing else writes to)."""
    array.flags.writeable = False
    return array


_NO_OFFSETS = _read_only(np.zeros(0, dtype=np.int16))
_NO_COUNTS = _read_only(np.zeros(0, dtype=np.int64))
_REPRESENTATIVE_S = _read_only(np.clip(
    2.0 * GAMMA ** np.arange(MIN_INDEX, MAX_INDEX + 1, dtype=np.float64) / (GAMMA + 1.0), MIN_S, MAX_S))


def bucket_indices(values_s: np.ndarray) -> np.ndarray:
    """Bucket index (int64, in [MIN_INDEX, MAX_INDEX]) of each finite, non-negative value in seconds;
    values outside [MIN_S, MAX_S] go to the edge buckets."""
    return _offsets_of(np.clip(np.asarray(values_s, dtype=np.float64), MIN_S, MAX_S)) + MIN_INDEX


def _offsets_of(clipped_s: np.ndarray) -> np.ndarray:
    """Bucket index − MIN_INDEX (int64) of each value in [MIN_S, MAX_S]: ⌈ln x / ln γ⌉, kept inside the
    range against float rounding at the edges."""
    scaled = np.log(clipped_s)
    np.divide(scaled, _LOG_GAMMA, out=scaled)
    np.ceil(scaled, out=scaled)
    offsets = scaled.astype(np.int64)
    offsets -= MIN_INDEX
    return np.clip(offsets, 0, MAX_ENTRIES - 1, out=offsets)


def representative_s(indices: np.ndarray) -> np.ndarray:
    """Representative value in seconds of each bucket index (2γ^i/(γ + 1), clipped to [MIN_S, MAX_S])."""
    return _REPRESENTATIVE_S[np.asarray(indices, dtype=np.int64) - MIN_INDEX]


def _seconds(units: int) -> float:
    """A sum in 2⁻⁶⁶ s units as seconds, correctly rounded."""
    return units / _UNITS_PER_S


def _units_of(clipped_s: np.ndarray, weights: np.ndarray | None) -> int:
    """Exact Σ weight·value in 2⁻⁶⁶ s units, for values in [MIN_S, MAX_S].

    Each value splits exactly into a high part ⌊x·2²⁷⌋ and a low part (x − high·2⁻²⁷)·2⁶⁶, both integers
    below 2³⁹; their weighted sums run in int64 while Σ weight < 2²³ (no overflow), else over Python integers.
    """
    high = np.floor(clipped_s * float(_HIGH_UNITS_PER_S))
    low = (clipped_s - high / float(_HIGH_UNITS_PER_S)) * float(_UNITS_PER_S)
    high_int = high.astype(np.int64)
    low_int = low.astype(np.int64)
    total_weight = clipped_s.size if weights is None else int(weights.sum())
    if total_weight < 1 << 23:
        if weights is None:
            return (int(high_int.sum()) << _LOW_BITS) + int(low_int.sum())
        return (int(high_int @ weights) << _LOW_BITS) + int(low_int @ weights)
    big_weights = np.ones(clipped_s.size, dtype=object) if weights is None else weights.astype(object)
    return (int(high_int.astype(object) @ big_weights) << _LOW_BITS) + int(low_int.astype(object) @ big_weights)


def _checked_weights(counts: np.ndarray | None, size: int) -> np.ndarray | None:
    """`counts` as int64 (None stays None).

    Raises:
        ValueError: a size other than `size`, entries that are not integers in [0, MAX_COUNT], or a total
            beyond MAX_COUNT.
    """
    if counts is None:
        return None
    raw = np.asarray(counts).ravel()
    if raw.size != size:
        raise ValueError(f"latency sketch: {size} values but {raw.size} counts")
    if raw.dtype.kind == "b":
        return raw.astype(np.int64)
    if raw.dtype.kind not in "iuf":
        raise ValueError(f"latency sketch: counts must be integers, got dtype {raw.dtype}")
    as_float = raw.astype(np.float64)
    ok = np.isfinite(as_float) & (as_float >= 0.0) & (as_float <= float(MAX_COUNT))
    if raw.dtype.kind == "f":
        ok &= np.floor(as_float) == as_float
    if not bool(np.all(ok)):
        raise ValueError(f"latency sketch: counts must be integers in [0, 2**53], got {raw[~ok][0]!r}")
    # Partial sums of integers whose total is at most 2⁵³ are exact in float64: past this check int64 sums
    # cannot overflow.
    if float(as_float.sum()) > float(MAX_COUNT):
        raise ValueError("latency sketch: the counts add up to more than the 2**53 maximum count")
    return raw.astype(np.int64)


def _edge_count(offsets: np.ndarray, counts: np.ndarray) -> int:
    """Count held in the lowest and the highest bucket (where clamped values go)."""
    if not offsets.size:
        return 0
    edge = (offsets == 0) | (offsets == MAX_ENTRIES - 1)
    return int(counts[edge].sum())


class LatencySketch:
    """Counts of latencies per log-linear bucket, their exact sum, and how many were clamped.

    Mutable: `add`, `add_many`, `merge` and `subtract` update it in place (arrays are replaced, never
    written), `copy` is O(1). Unhashable; equal when buckets, counts, `num_clamped` and `sum_s` are equal.
    """

    __slots__ = ("_count", "_counts", "_num_clamped", "_offsets", "_units")

    def __init__(self) -> None:
        """An empty sketch."""
        self._offsets: np.ndarray = _NO_OFFSETS
        self._counts: np.ndarray = _NO_COUNTS
        self._count = 0
        self._units = 0
        self._num_clamped = 0

    @classmethod
    def from_values(cls, values_s: np.ndarray | Iterable[float],
                    counts: np.ndarray | None = None) -> LatencySketch:
        """Sketch of the valid entries of `values_s` (see `add_many`); rejected ones are dropped."""
        sketch = cls()
        sketch.add_many(np.asarray(values_s, dtype=np.float64), counts)
        return sketch

    def copy(self) -> LatencySketch:
        """An independent sketch with the same contents. O(1): the arrays are shared read-only."""
        twin = LatencySketch()
        twin._set(self._offsets, self._counts, self._count, self._units, self._num_clamped)
        return twin

    def _set(self, offsets: np.ndarray, counts: np.ndarray, count: int, units: int, num_clamped: int) -> None:
        if offsets.size:
            self._offsets, self._counts = _read_only(offsets), _read_only(counts)
        else:
            self._offsets, self._counts = _NO_OFFSETS, _NO_COUNTS
        self._count, self._units, self._num_clamped = count, units, num_clamped

    def _dense(self) -> np.ndarray:
        """Counts of all MAX_ENTRIES buckets, int64 (a fresh array)."""
        dense = np.zeros(MAX_ENTRIES, dtype=np.int64)
        dense[self._offsets.astype(np.intp)] = self._counts
        return dense

    def _set_dense(self, dense: np.ndarray, count: int, units: int, num_clamped: int) -> None:
        offsets = dense.nonzero()[0]
        self._set(offsets.astype(np.int16), dense[offsets], count, units, num_clamped)

    # ---------------------------------------------------------------------------------------- adding

    def add(self, value_s: float) -> None:
        """Add one latency in seconds.

        Raises:
            ValueError: a value that is negative or not finite (the sketch is unchanged).
        """
        if not (math.isfinite(value_s) and value_s >= 0.0):
            raise ValueError(f"latency sketch: a latency must be finite and ≥ 0 s, got {value_s!r}")
        self.add_many(np.array([value_s], dtype=np.float64))

    def add_many(self, values_s: np.ndarray, counts: np.ndarray | None = None) -> int:
        """Add each value of `values_s` (seconds) `counts` times (once each when None); vectorised.

        Negative and non-finite values are rejected; returns how many observations were rejected (Σ of their
        counts when `counts` is given). O(n + MAX_ENTRIES) for n values.

        Raises:
            ValueError: `counts` of another size or not integers in [0, 2⁵³], or a total count beyond
                MAX_COUNT (the sketch is unchanged).
        """
        values = np.asarray(values_s, dtype=np.float64).ravel()
        weights = _checked_weights(counts, values.size)
        valid = np.isfinite(values) & (values >= 0.0)
        if weights is None:
            rejected = int(values.size - np.count_nonzero(valid))
        else:
            rejected = int(weights[~valid].sum())
            valid &= weights > 0
            weights = weights[valid]
        kept = values[valid]
        if not kept.size:
            return rejected
        added = kept.size if weights is None else int(weights.sum())
        if self._count + added > MAX_COUNT:
            raise ValueError(f"latency sketch: adding {added} to {self._count} exceeds the 2**53 maximum count")
        clipped = np.clip(kept, MIN_S, MAX_S)
        outside = clipped != kept
        clamped = int(np.count_nonzero(outside)) if weights is None else int(weights[outside].sum())
        offsets = _offsets_of(clipped)
        if weights is None:
            dense = np.bincount(offsets, minlength=MAX_ENTRIES)
        else:
            dense = np.rint(np.bincount(offsets, weights=weights, minlength=MAX_ENTRIES)).astype(np.int64)
        dense[self._offsets.astype(np.intp)] += self._counts
        self._set_dense(dense, self._count + added, self._units + _units_of(clipped, weights),
                        self._num_clamped + clamped)
        return rejected

    # --------------------------------------------------------------------------------------- merging

    def merge(self, other: LatencySketch) -> None:
        """Add `other`'s counts, sum and clamped count: the sketch of both sets of values. O(MAX_ENTRIES).

        Raises:
            ValueError: a total count beyond MAX_COUNT (the sketch is unchanged).
        """
        if not other._count:
            return
        count = self._count + other._count
        if count > MAX_COUNT:
            raise ValueError(f"latency sketch: merging {other._count} into {self._count} exceeds the 2**53 "
                             f"maximum count")
        positions = self._positions_of(other._offsets)
        if positions is not None:
            counts = self._counts.copy()
            counts[positions] += other._counts
            self._set(self._offsets, counts, count, self._units + other._units,
                      self._num_clamped + other._num_clamped)
            return
        dense = self._dense()
        dense[other._offsets.astype(np.intp)] += other._counts
        self._set_dense(dense, count, self._units + other._units, self._num_clamped + other._num_clamped)

    def subtract(self, other: LatencySketch) -> None:
        """Remove `other`'s counts, sum and clamped count, e.g. a second's sketch leaving a sliding window.

        Meant for a sketch merged earlier: then the result is exactly the sketch of the remaining values.

        Raises:
            ValueError: `other` holds more in some bucket, more clamped values, or a sum the remaining counts
                cannot have (the sketch is unchanged).
        """
        if not other._count:
            return
        positions = self._positions_of(other._offsets)
        if positions is None:
            missing = other._offsets[~np.isin(other._offsets, self._offsets)][0]
            raise ValueError(f"latency sketch: cannot subtract values from bucket {int(missing) + MIN_INDEX}, "
                             f"which holds none")
        counts = self._counts.copy()
        counts[positions] -= other._counts
        if bool((counts < 0).any()):
            position = int(np.flatnonzero(counts < 0)[0])
            raise ValueError(f"latency sketch: cannot subtract {int(self._counts[position] - counts[position])} "
                             f"values from bucket {int(self._offsets[position]) + MIN_INDEX}, which holds "
                             f"{int(self._counts[position])}")
        count = self._count - other._count
        units = self._units - other._units
        num_clamped = self._num_clamped - other._num_clamped
        kept = counts > 0
        offsets, counts = self._offsets[kept], counts[kept]
        if not 0 <= num_clamped <= _edge_count(offsets, counts):
            raise ValueError(f"latency sketch: cannot subtract {other._num_clamped} clamped values from "
                             f"{self._num_clamped}")
        if not count * _MIN_UNITS <= units <= count * _MAX_UNITS:
            raise ValueError(f"latency sketch: cannot subtract a sum of {other.sum_s!r} s from {self.sum_s!r} s "
                             f"leaving {count} values")
        self._set(offsets, counts, count, units, num_clamped)

    def _positions_of(self, offsets: np.ndarray) -> np.ndarray | None:
        """Positions of the sorted `offsets` in this sketch's offsets; None when some bucket is not held."""
        positions = np.searchsorted(self._offsets, offsets)
        if positions.size and int(positions[-1]) >= self._offsets.size:
            return None
        return positions if bool(np.all(self._offsets[positions] == offsets)) else None

    # ------------------------------------------------------------------------------------- statistics

    @property
    def count(self) -> int:
        """Number of values held."""
        return self._count

    @property
    def sum_s(self) -> float:
        """Exact sum of the held values (clamped ones at MIN_S or MAX_S), correctly rounded; 0 when empty."""
        return _seconds(self._units)

    @property
    def mean_s(self) -> float:
        """Mean of the held values; NaN when empty."""
        return self._units / (self._count * _UNITS_PER_S) if self._count else math.nan

    @property
    def num_clamped(self) -> int:
        """How many held values were below MIN_S or above MAX_S when added."""
        return self._num_clamped

    @property
    def num_entries(self) -> int:
        """Number of non-empty buckets (what memory and the wire size grow with)."""
        return int(self._offsets.size)

    def buckets(self) -> tuple[np.ndarray, np.ndarray]:
        """(bucket indices, counts): strictly increasing int64 indices and int64 counts ≥ 1, copies."""
        return self._offsets.astype(np.int64) + MIN_INDEX, self._counts.copy()

    def quantile(self, q: float) -> float:
        """Representative value of the bucket holding the sample of rank ⌊q·(count − 1)⌋ (0-based,
        ascending); NaN when empty. Within RELATIVE_ACCURACY relative of that sample for in-range data.

        Raises:
            ValueError: q outside [0, 1] (NaN included).
        """
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"latency sketch: a quantile must be in [0, 1], got {q!r}")
        return float(self.quantiles(np.array([q], dtype=np.float64))[0])

    def quantiles(self, qs: Sequence[float] | np.ndarray) -> np.ndarray:
        """`quantile` of each entry of `qs` in one pass (one cumulative sum), float64 of the shape of `qs`.

        Raises:
            ValueError: an entry outside [0, 1] (NaN included).
        """
        levels = np.asarray(qs, dtype=np.float64)
        inside = (levels >= 0.0) & (levels <= 1.0)
        if not bool(np.all(inside)):
            raise ValueError(f"latency sketch: a quantile must be in [0, 1], got {levels[~inside][0]!r}")
        if not self._count:
            return np.full(levels.shape, math.nan)
        ranks = np.floor(levels * float(self._count - 1))
        positions = np.searchsorted(np.cumsum(self._counts), ranks, side="right")
        return _REPRESENTATIVE_S[self._offsets[positions]]

    # ---------------------------------------------------------------------------------- serialisation

    def to_bytes(self) -> bytes:
        """The wire format of the module docstring: 22 + k·6 bytes for k buckets (k·10 with u64 counts)."""
        wide = bool(self._counts.size) and int(self._counts.max()) > _U32_MAX
        header = _HEADER.pack(_MAGIC, _FLAG_WIDE_COUNTS if wide else 0, int(self._offsets.size),
                              self._num_clamped, self.sum_s)
        indices = (self._offsets.astype(np.int64) + MIN_INDEX).astype("<i2")
        return header + indices.tobytes() + self._counts.astype("<u8" if wide else "<u4").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> LatencySketch:
        """Inverse of `to_bytes`; validates everything (the bytes may come from anyone).

        Raises:
            ValueError: and only ValueError, naming what is wrong: not bytes, a short or long buffer, bad magic
                or flags, too many buckets, indices out of range or not increasing, counts of 0 or beyond
                MAX_COUNT, more clamped values than the edge buckets hold, or a sum that is not finite or
                outside [count·MIN_S, count·MAX_S].
        """
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ValueError(f"latency sketch bytes: expected bytes, got {type(data).__name__}")
        raw = bytes(data)
        if len(raw) < _HEADER.size:
            raise ValueError(f"latency sketch bytes: {len(raw)} bytes is shorter than the {_HEADER.size}-byte "
                             f"header")
        magic, flags, num_entries, num_clamped, sum_s = _HEADER.unpack_from(raw)
        if magic != _MAGIC:
            raise ValueError(f"latency sketch bytes: bad magic {magic!r}, expected {_MAGIC!r}")
        if flags & ~_FLAG_WIDE_COUNTS:
            raise ValueError(f"latency sketch bytes: unknown flags {flags:#04x}")
        if num_entries > MAX_ENTRIES:
            raise ValueError(f"latency sketch bytes: {num_entries} buckets, at most {MAX_ENTRIES} exist")
        width = 8 if flags & _FLAG_WIDE_COUNTS else 4
        expected = _HEADER.size + num_entries * (2 + width)
        if len(raw) != expected:
            raise ValueError(f"latency sketch bytes: {len(raw)} bytes, the header announces {num_entries} "
                             f"buckets ({expected} bytes)")
        indices = np.frombuffer(raw, dtype="<i2", count=num_entries, offset=_HEADER.size).astype(np.int64)
        counts = np.frombuffer(raw, dtype="<u8" if width == 8 else "<u4", count=num_entries,
                               offset=_HEADER.size + 2 * num_entries)
        if num_entries:
            if int(indices[0]) < MIN_INDEX or int(indices[-1]) > MAX_INDEX:
                raise ValueError(f"latency sketch bytes: bucket indices must lie in [{MIN_INDEX}, {MAX_INDEX}], "
                                 f"got {int(indices[0])}..{int(indices[-1])}")
            if not bool(np.all(np.diff(indices) > 0)):
                raise ValueError("latency sketch bytes: bucket indices must be strictly increasing")
            if int(counts.min()) < 1:
                raise ValueError("latency sketch bytes: bucket counts must be ≥ 1, got 0")
            if int(counts.max()) > MAX_COUNT:
                raise ValueError(f"latency sketch bytes: a bucket count of {int(counts.max())} exceeds 2**53")
        count = int(counts.astype(np.int64).sum())
        if count > MAX_COUNT:
            raise ValueError(f"latency sketch bytes: a total count of {count} exceeds 2**53")
        offsets = (indices - MIN_INDEX).astype(np.int16)
        counts_int = counts.astype(np.int64)
        if num_clamped > _edge_count(offsets, counts_int):
            raise ValueError(f"latency sketch bytes: {num_clamped} clamped values but the edge buckets hold "
                             f"{_edge_count(offsets, counts_int)}")
        if not math.isfinite(sum_s):
            raise ValueError(f"latency sketch bytes: the sum must be finite, got {sum_s!r}")
        low_s, high_s = _seconds(count * _MIN_UNITS), _seconds(count * _MAX_UNITS)
        if not low_s <= sum_s <= high_s:
            raise ValueError(f"latency sketch bytes: a sum of {sum_s!r} s is outside [{low_s!r}, {high_s!r}] "
                             f"for {count} values")
        units = min(max(int(sum_s * float(_UNITS_PER_S)), count * _MIN_UNITS), count * _MAX_UNITS)
        sketch = cls()
        sketch._set(offsets, counts_int, count, units, num_clamped)
        return sketch

    # ---------------------------------------------------------------------------------------- identity

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LatencySketch):
            return NotImplemented
        return (self._count == other._count and self._num_clamped == other._num_clamped
                and self.sum_s == other.sum_s and np.array_equal(self._offsets, other._offsets)
                and np.array_equal(self._counts, other._counts))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        if not self._count:
            return "LatencySketch(count=0)"
        p50_s, p99_s = self.quantiles((0.5, 0.99))
        return (f"LatencySketch(count={self._count}, mean_s={self.mean_s:.4g}, p50_s={p50_s:.4g}, "
                f"p99_s={p99_s:.4g}, buckets={self._offsets.size}, clamped={self._num_clamped})")


def sum_of(sketches: Iterable[LatencySketch]) -> LatencySketch:
    """One sketch of all values of the given sketches (what merging them one by one gives), with one dense
    accumulation. O(total buckets + MAX_ENTRIES).

    Raises:
        ValueError: a total count beyond MAX_COUNT.
    """
    dense = np.zeros(MAX_ENTRIES, dtype=np.int64)
    count = units = num_clamped = 0
    for sketch in sketches:
        count += sketch._count
        if count > MAX_COUNT:
            raise ValueError("latency sketch: the total count exceeds the 2**53 maximum")
        dense[sketch._offsets.astype(np.intp)] += sketch._counts
        units += sketch._units
        num_clamped += sketch._num_clamped
    total = LatencySketch()
    total._set_dense(dense, count, units, num_clamped)
    return total
