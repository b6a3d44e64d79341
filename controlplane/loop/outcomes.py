"""What a pool's finished requests measured: latency sketches per bucket, and the window an operator reads.

A bucket's `LatencySet` holds three sketches (`core.latency_sketch`, relative error 1%): time to first token,
time per output token after the first, and queue wait. Replicas exchange it inside their buckets; a pool's
`OutcomeWindow` sums the sets of its last `window_buckets` closed buckets over every replica that sent one
(a running total: a bucket is added once when it arrives and subtracted once when it leaves the window), and
answers quantiles over it.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from controlplane.core.latency_sketch import LatencySketch, representative_s

if TYPE_CHECKING:
    from controlplane.api.v1 import operator_pb2

# Seconds of completions an outcome window covers (in buckets of the pool's bucket length).
OUTCOME_WINDOW_S = 60.0
KINDS = ("ttft", "tpot", "queue")
LATENCY_NAMES = ("ttft", "tpot")  # the latencies an objective can name
_MAGIC = b"CPL1"
_HEADER = struct.Struct("<4sIII")  # magic, then each sketch's byte length


@dataclass(slots=True)
class LatencySet:
    """The three latency sketches of one bucket (or of a window)."""

    ttft: LatencySketch
    tpot: LatencySketch
    queue: LatencySketch

    @classmethod
    def empty(cls) -> LatencySet:
        return cls(LatencySketch(), LatencySketch(), LatencySketch())

    @classmethod
    def from_values(cls, ttft_s: np.ndarray, tpot_s: np.ndarray, queue_s: np.ndarray) -> LatencySet:
        latencies = cls.empty()
        latencies.ttft.add_many(ttft_s)
        latencies.tpot.add_many(tpot_s)
        latencies.queue.add_many(queue_s)
        return latencies

    def sketches(self) -> tuple[LatencySketch, LatencySketch, LatencySketch]:
        return self.ttft, self.tpot, self.queue

    @property
    def count(self) -> int:
        """Requests with any latency (the largest of the three counts)."""
        return max(sketch.count for sketch in self.sketches())

    def merge(self, other: LatencySet) -> None:
        for mine, theirs in zip(self.sketches(), other.sketches(), strict=True):
            mine.merge(theirs)

    def thinned(self, count: int) -> LatencySet:
        """This set weighed as at most `count` requests: each sketch's bucket counts scaled by count / self.count
        (the shape kept, the total `count` for the largest sketch); itself when it holds no more."""
        total = self.count
        if total <= count:
            return self
        return LatencySet(*(_scaled(sketch, count / total) for sketch in self.sketches()))

    def subtract(self, other: LatencySet) -> None:
        """Remove a set merged earlier (ValueError when it was not, leaving this set as it was)."""
        done = []
        try:
            for mine, theirs in zip(self.sketches(), other.sketches(), strict=True):
                mine.subtract(theirs)
                done.append((mine, theirs))
        except ValueError:
            for mine, theirs in done:
                mine.merge(theirs)
            raise

    def to_bytes(self) -> bytes:
        parts = [sketch.to_bytes() for sketch in self.sketches()]
        return _HEADER.pack(_MAGIC, *(len(part) for part in parts)) + b"".join(parts)

    @classmethod
    def from_bytes(cls, payload: bytes) -> LatencySet:
        """Raises ValueError for anything that is not a set written by `to_bytes`."""
        if len(payload) < _HEADER.size or payload[:4] != _MAGIC:
            raise ValueError("not a latency set")
        _, *sizes = _HEADER.unpack_from(payload)
        if _HEADER.size + sum(sizes) != len(payload):
            raise ValueError("latency set: section lengths do not add up to the payload")
        sketches, offset = [], _HEADER.size
        for size in sizes:
            sketches.append(LatencySketch.from_bytes(payload[offset:offset + size]))
            offset += size
        return cls(*sketches)


@dataclass(frozen=True, slots=True)
class Quantiles:
    """One latency over a window, seconds (NaN when no request reported it)."""

    num_requests: int
    p50_s: float
    p90_s: float
    p99_s: float
    mean_s: float

    def at(self, quantile: float) -> float:
        """The named quantile (0.5, 0.9 or 0.99 exactly; others are not kept here)."""
        return {0.5: self.p50_s, 0.9: self.p90_s, 0.99: self.p99_s}[quantile]


@dataclass(frozen=True, slots=True)
class OutcomeSummary:
    window_s: float
    ttft: Quantiles
    tpot: Quantiles
    queue: Quantiles
    num_requests: int


def objective_targets(objective: operator_pb2.LatencyObjective, *, named_only: bool = True
                      ) -> list[tuple[str, float, float]]:
    """(name, quantile, target s) of each latency an objective can name (LATENCY_NAMES, the LatencySet attributes):
    those it names (quantile and target both set), or with named_only False all of them as set (0, 0: not named)."""
    found = [(name, getattr(objective, f"{name}_quantile"), getattr(objective, f"{name}_target_s"))
             for name in LATENCY_NAMES]
    return [t for t in found if t[1] and t[2]] if named_only else found


def _scaled(sketch: LatencySketch, factor: float) -> LatencySketch:
    """`sketch` with its bucket counts times `factor` (< 1), rounded along the cumulative counts: as if every
    1/factor-th value in rank order were kept, so each quantile stays where it was (to one kept value)."""
    indices, counts = sketch.buckets()
    cumulative = np.floor(np.cumsum(counts) * factor + 0.5).astype(np.int64)
    kept = np.diff(cumulative, prepend=0)
    nonzero = kept > 0
    return LatencySketch.from_values(representative_s(indices[nonzero]), kept[nonzero])


def quantiles_of(sketch: LatencySketch) -> Quantiles:
    p50, p90, p99 = sketch.quantiles([0.5, 0.9, 0.99])
    return Quantiles(sketch.count, float(p50), float(p90), float(p99), sketch.mean_s if sketch.count else math.nan)


class OutcomeWindow:
    """A pool's latency sets of its last `window_buckets` closed buckets, summed over replicas."""

    def __init__(self, window_buckets: int, bucket_s: float) -> None:
        if window_buckets < 1:
            raise ValueError(f"window_buckets must be ≥ 1, got {window_buckets}")
        self.window_buckets = window_buckets
        self.bucket_s = bucket_s
        self._sets: dict[int, dict[str, LatencySet]] = {}
        self._total = LatencySet.empty()
        self._newest = -(1 << 62)

    def put(self, bucket_id: int, replica_id: str, latencies: LatencySet) -> None:
        """A replica's set of one closed bucket (a second one of the same replica and bucket replaces the
        first); ignored when the bucket is already older than the window."""
        if bucket_id <= self._newest - self.window_buckets:
            return
        by_replica = self._sets.setdefault(bucket_id, {})
        previous = by_replica.get(replica_id)
        if previous is not None:
            self._total.subtract(previous)
        by_replica[replica_id] = latencies
        self._total.merge(latencies)
        if bucket_id > self._newest:
            self._newest = bucket_id
            self._expire()

    def add(self, bucket_id: int, latencies: LatencySet, *, replica_id: str = "") -> None:
        """Merge latencies into the set of (bucket_id, replica_id) (a window filled batch by batch, not bucket by
        bucket); ignored when the bucket is already older than the window."""
        if bucket_id <= self._newest - self.window_buckets:
            return
        by_replica = self._sets.setdefault(bucket_id, {})
        current = by_replica.get(replica_id)
        if current is None:
            current = by_replica[replica_id] = LatencySet.empty()
        current.merge(latencies)
        self._total.merge(latencies)
        if bucket_id > self._newest:
            self._newest = bucket_id
            self._expire()

    def _expire(self) -> None:
        oldest = self._newest - self.window_buckets + 1
        for bucket_id in [b for b in self._sets if b < oldest]:
            for latencies in self._sets.pop(bucket_id).values():
                self._total.subtract(latencies)

    def advance(self, end_bucket: int) -> None:
        """Let buckets older than the window ending at end_bucket leave it (a pool gone quiet)."""
        if end_bucket > self._newest:
            self._newest = end_bucket
            self._expire()

    @property
    def window_s(self) -> float:
        return self.window_buckets * self.bucket_s

    @property
    def total(self) -> LatencySet:
        """The window's sum (read-only by convention)."""
        return self._total

    def summary(self) -> OutcomeSummary | None:
        """Quantiles over the window; None when no request in it reported a latency."""
        total = self._total
        if total.count == 0:
            return None
        return OutcomeSummary(window_s=self.window_s, ttft=quantiles_of(total.ttft),
                              tpot=quantiles_of(total.tpot), queue=quantiles_of(total.queue),
                              num_requests=total.count)
