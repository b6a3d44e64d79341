"""Output lengths by admission bucket: which requests of a window were first scheduled after a given time.

`AdmittedCounts` holds (admission bucket, length, count) triples: count requests of that output length (final
for completions, so far for running requests) that the engine first scheduled in that bucket. A window re-based
at a shift keeps, with it, only the requests admitted since the new law began
(`since`): a cohort the old law's requests, still in flight for a whole old lifetime after the shift, are not
part of (`controlplane.loop.pool_stats`).

Bucket ids are the pool's (⌊t / bucket_s⌋ on the controller's clock). A holder caps how far back an admission
is kept exact (`cap_admission`): older ones sit at the cap, so `since(b)` is exact for b above the cap.

Pure: no I/O, no clock. Serialised little-endian: count, then the three int64 columns.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from controlplane.core.length_histogram import LengthHistogram

_COUNT = struct.Struct("<q")


@dataclass(frozen=True, eq=False, slots=True)
class AdmittedCounts:
    """count[i] requests of output length lengths[i] admitted in bucket admitted[i] (int64 columns of one
    size, pairs (admitted, length) unique and sorted, lengths ≥ 1, counts ≥ 1). Build with `from_columns`,
    `empty`, `merge` or `from_bytes`."""

    admitted: np.ndarray
    lengths: np.ndarray
    counts: np.ndarray

    @classmethod
    def empty(cls) -> AdmittedCounts:
        none = np.zeros(0, dtype=np.int64)
        return cls(none, none, none)

    @classmethod
    def from_columns(cls, admitted: np.ndarray, lengths: np.ndarray, counts: np.ndarray | None = None
                     ) -> AdmittedCounts:
        """Sum the counts of equal (admitted, length) pairs; pairs with length < 1 or count < 1 are dropped.

        Raises:
            ValueError: columns of different sizes, or a value that is not a finite integer.
        """
        admitted_f = np.asarray(admitted, dtype=np.float64).ravel()
        lengths_f = np.asarray(lengths, dtype=np.float64).ravel()
        counts_f = np.ones_like(lengths_f) if counts is None else np.asarray(counts, dtype=np.float64).ravel()
        if not admitted_f.size == lengths_f.size == counts_f.size:
            raise ValueError(f"admitted counts: columns of {admitted_f.size}, {lengths_f.size} and {counts_f.size}")
        columns = np.vstack((admitted_f, lengths_f, counts_f))
        if not (np.isfinite(columns).all() and (np.floor(columns) == columns).all()):
            raise ValueError("admitted counts: every value must be a finite integer")
        keep = (lengths_f >= 1) & (counts_f >= 1)
        if not keep.all():
            admitted_f, lengths_f, counts_f = admitted_f[keep], lengths_f[keep], counts_f[keep]
        if not admitted_f.size:
            return cls.empty()
        pairs, inverse = np.unique(np.vstack((admitted_f, lengths_f)).astype(np.int64), axis=1, return_inverse=True)
        summed = np.bincount(inverse.ravel(), weights=counts_f, minlength=pairs.shape[1]).astype(np.int64)
        return cls(pairs[0].copy(), pairs[1].copy(), summed)

    @classmethod
    def merge(cls, parts: Iterable[AdmittedCounts]) -> AdmittedCounts:
        parts = [p for p in parts if p.counts.size]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        return cls.from_columns(np.concatenate([p.admitted for p in parts]),
                                np.concatenate([p.lengths for p in parts]),
                                np.concatenate([p.counts for p in parts]))

    @property
    def count(self) -> int:
        return int(self.counts.sum())

    def since(self, first_bucket: int) -> LengthHistogram:
        """The lengths of the requests admitted in first_bucket or later."""
        keep = self.admitted >= first_bucket
        return LengthHistogram.from_counts(self.lengths[keep], self.counts[keep])

    def cap_admission(self, oldest_bucket: int) -> AdmittedCounts:
        """The same requests with every admission before oldest_bucket moved to oldest_bucket − 1."""
        if not self.admitted.size or self.admitted.min() >= oldest_bucket:
            return self
        return AdmittedCounts.from_columns(np.maximum(self.admitted, oldest_bucket - 1), self.lengths, self.counts)

    def to_bytes(self) -> bytes:
        return _COUNT.pack(self.counts.size) + np.vstack((self.admitted, self.lengths, self.counts)).astype(
            "<i8").tobytes()

    @classmethod
    def from_bytes(cls, payload: bytes) -> AdmittedCounts:
        """Raises ValueError for a payload that is not an `AdmittedCounts`."""
        if len(payload) < _COUNT.size:
            raise ValueError("not an admitted-counts payload")
        (size,) = _COUNT.unpack_from(payload)
        if size < 0 or len(payload) != _COUNT.size + 3 * 8 * size:
            raise ValueError("not an admitted-counts payload")
        columns = np.frombuffer(payload, dtype="<i8", offset=_COUNT.size).reshape(3, size).astype(np.int64)
        if size and (columns[1].min() < 1 or columns[2].min() < 1):
            raise ValueError("not an admitted-counts payload")
        return cls(columns[0].copy(), columns[1].copy(), columns[2].copy())
