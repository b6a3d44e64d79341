"""Sparse, mergeable histograms of exact token lengths.

A `LengthHistogram` holds the distinct lengths of a set of observations (sorted, int64, each ≥ 1) and how
many observations had each one (int64, each ≥ 1). It is what the decision loop keeps per pool and per time
bucket instead of sample windows: buckets merge by adding counts (`merged`, `sum_of`), serialise to a few
bytes per distinct length (`to_bytes` / `from_bytes`), and everything the hazard fit needs (count, sum,
moments, inverted-CDF percentiles, at-risk counts) costs O(distinct lengths), not O(samples).

Validity: a sample is kept when it is finite, integral and ≥ 1, and at
most MAX_LENGTH_TOKENS (2⁵³, beyond which float64 no longer holds every integer); other samples are
dropped by `from_samples` (the caller counts them as size − count).

Pure: no I/O, no clock. Instances are immutable (the arrays are read-only views).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

# Largest length a histogram holds: every integer up to 2⁵³ is exact in float64, so sums and means computed
# in float64 over histograms equal those over sample arrays (both exact while the total stays below 2⁵³).
MAX_LENGTH_TOKENS = 1 << 53

_MAGIC = b"CPLH"
_VERSION = 1
# magic (4 bytes), version (u8), 3 reserved zero bytes, number of distinct lengths (u64), all little-endian.
_HEADER = struct.Struct("<4sB3xQ")


def valid_length_mask(values: np.ndarray) -> np.ndarray:
    """Mask of the entries that are finite, integral and in [1, MAX_LENGTH_TOKENS]."""
    finite = np.isfinite(values)
    safe = np.where(finite, values, 0.0)
    return finite & (safe >= 1.0) & (safe <= float(MAX_LENGTH_TOKENS)) & (np.floor(safe) == safe)


def _read_only(array: np.ndarray) -> np.ndarray:
    view = array.view()
    view.flags.writeable = False
    return view


@dataclass(frozen=True, eq=False, slots=True)
class LengthHistogram:
    """Counts of exact token lengths.

    lengths: strictly increasing int64, each in [1, MAX_LENGTH_TOKENS]. counts: int64, each ≥ 1, same size.
    Construct through `from_samples`, `from_counts`, `empty`, `from_bytes` or merging; the constructor
    validates and raises ValueError on arrays that break the invariants.
    """

    lengths: np.ndarray
    counts: np.ndarray

    def __post_init__(self) -> None:
        lengths = np.asarray(self.lengths)
        counts = np.asarray(self.counts)
        if lengths.ndim != 1 or counts.ndim != 1 or lengths.size != counts.size:
            raise ValueError(f"length histogram: lengths and counts must be 1-D arrays of one size, got shapes "
                             f"{lengths.shape} and {counts.shape}")
        if lengths.dtype != np.int64 or counts.dtype != np.int64:
            raise ValueError(f"length histogram: lengths and counts must be int64, got {lengths.dtype} and "
                             f"{counts.dtype}")
        if lengths.size:
            if lengths[0] < 1 or lengths[-1] > MAX_LENGTH_TOKENS:
                raise ValueError(f"length histogram: lengths must lie in [1, 2**53], got {lengths[0]}..{lengths[-1]}")
            if lengths.size > 1 and not bool(np.all(np.diff(lengths) > 0)):
                raise ValueError("length histogram: lengths must be strictly increasing")
            if int(counts.min()) < 1:
                raise ValueError(f"length histogram: counts must be ≥ 1, got {int(counts.min())}")
        object.__setattr__(self, "lengths", _read_only(lengths))
        object.__setattr__(self, "counts", _read_only(counts))

    # ----------------------------------------------------------------------------------- construction

    @classmethod
    def empty(cls) -> LengthHistogram:
        return cls(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64))

    @classmethod
    def from_samples(cls, values: np.ndarray | Iterable[float]) -> LengthHistogram:
        """Histogram of the valid entries of `values` (see `valid_length_mask`); invalid ones are dropped.

        O(n log n) for n samples (one sort).
        """
        samples = np.asarray(values, dtype=np.float64).ravel()
        kept = samples[valid_length_mask(samples)].astype(np.int64)
        lengths, counts = np.unique(kept, return_counts=True)
        return cls(lengths.astype(np.int64), counts.astype(np.int64))

    @classmethod
    def from_counts(cls, lengths: np.ndarray | Iterable[int], counts: np.ndarray | Iterable[int]) -> LengthHistogram:
        """Histogram from (length, count) pairs in any order, e.g. a running-lengths message.

        Repeated lengths are summed; pairs with count 0 or length 0 are dropped (a running request that has
        not produced a token yet carries no information about its length).

        Raises:
            ValueError: arrays of different sizes, a length that is not an integer in [0, 2⁵³], or a
                count that is not an integer ≥ 0.
        """
        raw_lengths = np.asarray(lengths, dtype=np.float64).ravel()
        raw_counts = np.asarray(counts, dtype=np.float64).ravel()
        if raw_lengths.size != raw_counts.size:
            raise ValueError(f"length histogram: {raw_lengths.size} lengths but {raw_counts.size} counts")
        length_ok = (raw_lengths == 0.0) | valid_length_mask(raw_lengths)
        if not bool(np.all(length_ok)):
            bad = raw_lengths[~length_ok][0]
            raise ValueError(f"length histogram: lengths must be integers in [0, 2**53], got {bad!r}")
        count_ok = np.isfinite(raw_counts) & (raw_counts >= 0.0) & (np.floor(raw_counts) == raw_counts)
        count_ok &= raw_counts < float(1 << 62)
        if not bool(np.all(count_ok)):
            bad = raw_counts[~count_ok][0]
            raise ValueError(f"length histogram: counts must be integers ≥ 0, got {bad!r}")
        keep = (raw_lengths >= 1.0) & (raw_counts > 0.0)
        kept_lengths = raw_lengths[keep].astype(np.int64)
        kept_counts = raw_counts[keep].astype(np.int64)
        distinct, inverse = np.unique(kept_lengths, return_inverse=True)
        return cls(distinct.astype(np.int64), _summed_counts(inverse, kept_counts, distinct.size))

    # ------------------------------------------------------------------------------------------ merging

    def merged(self, other: LengthHistogram) -> LengthHistogram:
        """The histogram of both sets of observations. O(distinct lengths of both)."""
        return sum_of((self, other))

    # ------------------------------------------------------------------------------------------ moments

    @property
    def count(self) -> int:
        """Number of observations."""
        return int(self.counts.sum())

    @property
    def num_distinct(self) -> int:
        return int(self.lengths.size)

    def __len__(self) -> int:
        return self.count

    def total_tokens(self) -> float:
        """Σ length·count, in float64 (exact while the total stays below 2⁵³)."""
        return float((self.lengths.astype(np.float64) * self.counts.astype(np.float64)).sum())

    def mean(self) -> float:
        """Mean length in tokens; NaN when empty."""
        n = self.count
        return self.total_tokens() / n if n else math.nan

    def std(self) -> float:
        """Population standard deviation (ddof 0, like numpy's std) in tokens; NaN when empty."""
        n = self.count
        if not n:
            return math.nan
        mean = self.total_tokens() / n
        deviation = self.lengths.astype(np.float64) - mean
        return math.sqrt(float((self.counts.astype(np.float64) * deviation * deviation).sum()) / n)

    def max_length(self) -> int:
        """Largest length (0 when empty)."""
        return int(self.lengths[-1]) if self.lengths.size else 0

    def percentile(self, percent: float) -> float:
        """The inverted-CDF percentile, equal to numpy's `percentile(samples, percent, method="inverted_cdf")`.

        The index into the sorted samples is computed exactly as numpy does (n·q − 1, rounded up unless it is
        integral), so the two agree bit for bit.

        Raises:
            ValueError: an empty histogram or a percent outside [0, 100].
        """
        if not 0.0 <= percent <= 100.0:
            raise ValueError(f"percentile must be in [0, 100], got {percent!r}")
        n = self.count
        if not n:
            raise ValueError("percentile of an empty length histogram")
        virtual = n * (percent / 100.0) - 1.0
        previous = math.floor(virtual)
        index = previous if virtual == previous else previous + 1
        index = min(max(index, 0), n - 1)
        # The index-th smallest sample (0-based) is the first length whose cumulative count exceeds it.
        position = int(np.searchsorted(np.cumsum(self.counts), index, side="right"))
        return float(self.lengths[position])

    def count_at_least(self, t: np.ndarray) -> np.ndarray:
        """#{observations ≥ t} for each entry of an integer array t, int64. O((distinct + |t|)·log)."""
        cumulative = np.concatenate(([0], np.cumsum(self.counts)))
        below = np.searchsorted(self.lengths, np.asarray(t, dtype=np.int64), side="left")
        return cumulative[-1] - cumulative[below]

    def dense_counts(self, t_max: int) -> np.ndarray:
        """Counts at t = 0..t_max as a dense int64 array (index = length; index 0 is always 0)."""
        dense = np.zeros(t_max + 1, dtype=np.int64)
        inside = self.lengths <= t_max
        dense[self.lengths[inside]] = self.counts[inside]
        return dense

    # ---------------------------------------------------------------------------------- serialisation

    def to_bytes(self) -> bytes:
        """Header (magic "CPLH", version 1, number of distinct lengths) + lengths + counts, int64 little-endian."""
        header = _HEADER.pack(_MAGIC, _VERSION, int(self.lengths.size))
        return header + self.lengths.astype("<i8").tobytes() + self.counts.astype("<i8").tobytes()

    @classmethod
    def from_bytes(cls, data: bytes) -> LengthHistogram:
        """Inverse of `to_bytes`.

        Raises:
            ValueError: wrong magic or version, a size that does not match the header, or arrays that break
                the histogram's invariants.
        """
        raw = bytes(data)
        if len(raw) < _HEADER.size:
            raise ValueError(f"length histogram bytes: {len(raw)} bytes is shorter than the {_HEADER.size}-byte "
                             f"header")
        magic, version, num_distinct = _HEADER.unpack_from(raw)
        if magic != _MAGIC:
            raise ValueError(f"length histogram bytes: bad magic {magic!r}, expected {_MAGIC!r}")
        if version != _VERSION:
            raise ValueError(f"length histogram bytes: unsupported version {version}, expected {_VERSION}")
        expected = _HEADER.size + 16 * num_distinct
        if len(raw) != expected:
            raise ValueError(f"length histogram bytes: {len(raw)} bytes, the header announces {num_distinct} "
                             f"lengths ({expected} bytes)")
        body = np.frombuffer(raw, dtype="<i8", offset=_HEADER.size)
        lengths = body[:num_distinct].astype(np.int64)
        counts = body[num_distinct:].astype(np.int64)
        return cls(lengths, counts)


def sum_of(histograms: Iterable[LengthHistogram]) -> LengthHistogram:
    """The histogram of all observations of the given histograms. O(total distinct lengths · log)."""
    parts = [h for h in histograms if h.lengths.size]
    if not parts:
        return LengthHistogram.empty()
    if len(parts) == 1:
        return parts[0]
    lengths = np.concatenate([h.lengths for h in parts])
    counts = np.concatenate([h.counts for h in parts])
    distinct, inverse = np.unique(lengths, return_inverse=True)
    return LengthHistogram(distinct.astype(np.int64), _summed_counts(inverse, counts, distinct.size))


def _summed_counts(inverse: np.ndarray, counts: np.ndarray, size: int) -> np.ndarray:
    """Σ counts per group index, int64 (bincount sums in float64: exact while a sum stays below 2⁵³)."""
    summed = np.bincount(inverse.ravel(), weights=counts.astype(np.float64), minlength=size)
    return np.rint(summed).astype(np.int64)
