"""Per-pool mergeable statistics in time buckets, and the pool estimate fitted from them.

Every completion and step an engine of a pool reports goes into the pool's open bucket (bucket id =
⌊now_s / bucket_s⌋ on the controller's clock). A closed bucket is immutable: a sparse histogram of output
lengths, the count and sum of prompt lengths, and the normal-equation sums of the step costs
(`core.cost_sums.CostSums`). Replicas publish their closed buckets and add each other's, so every replica
holds the same buckets for one pool; a window is a sum of buckets, and a fit costs O(distinct lengths),
not O(samples).

The estimate used at time t is the one for the window ending at bucket `estimate_bucket(t)`
= ⌊(t − settle_s)/bucket_s⌋ − 1: replicas publish a bucket as soon as it closes and read each other's
`settle_s` later, so two replicas compute an estimate for the same end bucket from the same data.

Pure: no I/O, no clock (times are arguments). Serialisation of a bucket: `BucketStats.to_bytes`.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

import numpy as np

from controlplane.core.cost_model import CostFit
from controlplane.core.cost_sums import CostSums, StepColumns
from controlplane.core.hazard import HazardFit, fit_hazard_histogram
from controlplane.core.length_histogram import LengthHistogram, sum_of
from controlplane.core.types import CostModel
from controlplane.loop.config import DecisionLoopConfig

_MAGIC = b"CPB1"
# Replica id of a persisted window seeded at start (warm start).
SNAPSHOT_REPLICA = "snapshot"
# Steps of one batch that enter the cost sums (evenly spaced when a batch carries more).
MAX_STEPS_PER_BATCH = 64
_HEADER = struct.Struct("<4sqdI")  # magic, prompt count, prompt sum, histogram byte length


@dataclass(slots=True)
class BucketStats:
    """What one bucket holds for one pool (from one replica, or merged)."""

    outputs: LengthHistogram
    prompt_count: int
    prompt_sum_tokens: float
    costs: CostSums

    @classmethod
    def empty(cls) -> BucketStats:
        return cls(outputs=LengthHistogram.empty(), prompt_count=0, prompt_sum_tokens=0.0,
                   costs=CostSums())

    def to_bytes(self) -> bytes:
        hist = self.outputs.to_bytes()
        costs = self.costs.to_array().astype("<f8").tobytes()
        return _HEADER.pack(_MAGIC, self.prompt_count, self.prompt_sum_tokens, len(hist)) + hist + costs

    @classmethod
    def from_bytes(cls, payload: bytes) -> BucketStats:
        """Raises ValueError for a payload that is not a bucket of this format."""
        if len(payload) < _HEADER.size:
            raise ValueError("bucket payload too short")
        magic, count, total, hist_len = _HEADER.unpack_from(payload)
        if magic != _MAGIC or count < 0 or not math.isfinite(total) or _HEADER.size + hist_len > len(payload):
            raise ValueError("not a pool-statistics bucket")
        hist = LengthHistogram.from_bytes(payload[_HEADER.size:_HEADER.size + hist_len])
        costs = CostSums.from_array(np.frombuffer(payload[_HEADER.size + hist_len:], dtype="<f8"))
        return cls(outputs=hist, prompt_count=int(count), prompt_sum_tokens=float(total), costs=costs)


@dataclass(frozen=True, slots=True)
class PoolEstimate:
    """The pool terms every engine of the pool is decided from.

    end_bucket: the newest bucket in the window. fit: the hazard fit (None without completions).
    costs: the cost model in use (the pool's calibration when set, else the online fit; None when neither is
    usable). cost_source: "calibration" | "online" | "none". contributors: replica ids whose buckets were summed.
    """

    pool_key: str
    end_bucket: int
    fit: HazardFit | None
    num_samples: int
    cost_fit: CostFit
    costs: CostModel | None
    cost_source: str
    num_buckets: int
    contributors: tuple[str, ...]
    num_rejected_steps: int = 0


@dataclass(slots=True)
class _OpenBucket:
    """The bucket being filled: batches are only appended (O(1) per batch); the histogram and the cost
    sums are computed once, vectorised over the whole bucket, when it closes."""

    bucket_id: int
    outputs: list[np.ndarray] = field(default_factory=list)
    prompt_count: int = 0
    prompt_sum_tokens: float = 0.0
    steps: list[StepColumns] = field(default_factory=list)

    def close(self, reference_costs: CostModel | None) -> BucketStats:
        samples = np.concatenate(self.outputs) if self.outputs else np.zeros(0)
        costs = CostSums()
        if self.steps:
            costs.add_steps(StepColumns(*(np.concatenate([getattr(b, name) for b in self.steps]) for name in (
                "prefill_tokens", "decode_tokens", "decode_requests", "duration_s"))), reference=reference_costs)
        return BucketStats(outputs=LengthHistogram.from_samples(samples), prompt_count=self.prompt_count,
                           prompt_sum_tokens=self.prompt_sum_tokens, costs=costs)


class PoolStatistics:
    """The buckets of one pool on one replica: its own (open and closed) and other replicas' (closed)."""

    def __init__(self, pool_key: str, config: DecisionLoopConfig, *, replica_id: str, settle_s: float = 0.5) -> None:
        self.pool_key = pool_key
        self._config = config
        self.replica_id = replica_id
        self.settle_s = settle_s
        self._open: _OpenBucket | None = None
        self._buckets: dict[int, dict[str, BucketStats]] = {}
        self.estimate: PoolEstimate | None = None
        self.last_window: BucketStats | None = None

    # ---- time ----

    def bucket_of(self, now_s: float) -> int:
        return math.floor(now_s / self._config.bucket_s)

    def estimate_bucket(self, now_s: float) -> int:
        """The end bucket of the estimate in force at now_s (closed and settled on every replica)."""
        return math.floor((now_s - self.settle_s) / self._config.bucket_s) - 1

    def oldest_bucket(self, end_bucket: int) -> int:
        return end_bucket - max(0, math.ceil(self._config.max_window_s / self._config.bucket_s) - 1)

    # ---- ingest ----

    def add(self, now_s: float, *, prompts: np.ndarray, outputs: np.ndarray,
            steps: StepColumns | None) -> tuple[BucketStats, int] | None:
        """Add one engine's validated completions and steps at now_s (O(1): the arrays are kept).

        Returns the bucket this call closed (with its id) when now_s is past the open bucket, for publishing.
        Steps whose duration is far from the current estimate's cost model are kept out of the cost sums
        when the bucket closes (`core.cost_sums`).
        """
        closed = self.close_due(now_s)
        bucket = self._open
        if bucket is None:
            bucket = self._open = _OpenBucket(bucket_id=self.bucket_of(now_s))
        if outputs.size:
            bucket.outputs.append(outputs)
            bucket.prompt_count += int(prompts.size)
            bucket.prompt_sum_tokens += float(prompts.sum())
        if steps is not None and steps.duration_s.size:
            size = steps.duration_s.size
            if size > MAX_STEPS_PER_BATCH:
                # A systematic subsample: a pool's cost fit needs thousands of steps, not the millions per
                # second a large fleet reports (1,000 engines × 1,000 steps/s).
                keep = np.linspace(0, size - 1, MAX_STEPS_PER_BATCH).astype(np.int64)
                steps = StepColumns(steps.prefill_tokens[keep], steps.decode_tokens[keep],
                                    steps.decode_requests[keep], steps.duration_s[keep])
            bucket.steps.append(steps)
        return closed

    def close_due(self, now_s: float) -> tuple[BucketStats, int] | None:
        """Close the open bucket when now_s is past its end; returns (stats, bucket id) or None."""
        bucket = self._open
        if bucket is None or self.bucket_of(now_s) <= bucket.bucket_id:
            return None
        self._open = None
        stats = bucket.close(self.estimate.costs if self.estimate is not None else None)
        self._buckets.setdefault(bucket.bucket_id, {})[self.replica_id] = stats
        return stats, bucket.bucket_id

    def put_remote(self, bucket_id: int, replica_id: str, stats: BucketStats) -> None:
        """Another replica's closed bucket (its own replica id is ignored: local data wins)."""
        if replica_id != self.replica_id:
            self._buckets.setdefault(bucket_id, {})[replica_id] = stats

    def seed(self, stats: BucketStats, *, now_s: float) -> None:
        """Warm start: a persisted window of this pool (`last_window` of an earlier run) stands in as the
        oldest bucket in force, under replica id SNAPSHOT_REPLICA. Newer buckets take precedence as they
        fill the window, and it ages out after max_window_s like any bucket."""
        self._buckets.setdefault(self.estimate_bucket(now_s), {})[SNAPSHOT_REPLICA] = stats

    def has_bucket(self, bucket_id: int, replica_id: str) -> bool:
        return replica_id in self._buckets.get(bucket_id, {})

    def prune(self, now_s: float) -> None:
        """Forget buckets that can no longer enter a window."""
        oldest = self.oldest_bucket(self.estimate_bucket(now_s))
        for bucket_id in [b for b in self._buckets if b < oldest]:
            del self._buckets[bucket_id]

    # ---- estimate ----

    def window(self, end_bucket: int) -> tuple[BucketStats, int, tuple[str, ...]]:
        """Sum the newest buckets ≤ end_bucket until they hold the configured window (never beyond
        max_window_s); returns (summed stats, buckets used, contributing replicas)."""
        config = self._config
        hists: list[LengthHistogram] = []
        prompt_count, prompt_sum = 0, 0.0
        costs = CostSums()
        num_outputs = 0
        used = 0
        replicas: set[str] = set()
        outputs_full = prompts_full = costs_full = False
        for bucket_id in range(end_bucket, self.oldest_bucket(end_bucket) - 1, -1):
            by_replica = self._buckets.get(bucket_id)
            if not by_replica:
                continue
            used += 1
            for replica, stats in sorted(by_replica.items()):
                replicas.add(replica)
                if not outputs_full:
                    hists.append(stats.outputs)
                    num_outputs += stats.outputs.count
                if not prompts_full:
                    prompt_count += stats.prompt_count
                    prompt_sum += stats.prompt_sum_tokens
                if not costs_full:
                    costs.add_sums(stats.costs)
            outputs_full = num_outputs >= config.output_window
            prompts_full = prompt_count >= config.prompt_window
            costs_full = costs.num_steps >= 3 * config.step_window
            if outputs_full and prompts_full and costs_full:
                break
        merged = sum_of(hists) if hists else LengthHistogram.empty()
        return (BucketStats(outputs=merged, prompt_count=prompt_count, prompt_sum_tokens=prompt_sum, costs=costs),
                used, tuple(sorted(replicas)))

    def refresh(self, now_s: float, *, calibration: CostModel | None) -> PoolEstimate:
        """Fit the estimate for estimate_bucket(now_s) (kept as `self.estimate`)."""
        end_bucket = self.estimate_bucket(now_s)
        self.close_due(now_s)
        stats, used, replicas = self.window(end_bucket)
        self.last_window = stats
        fit = None
        if stats.outputs.count and stats.prompt_count:
            fit = fit_hazard_histogram(stats.outputs, prompt_count=stats.prompt_count,
                                       prompt_sum_tokens=stats.prompt_sum_tokens)
        cost_fit = stats.costs.fit()
        costs, source = calibration, "calibration"
        if costs is None:
            costs, source = cost_fit.to_cost_model(), "online"
            if costs is None:
                source = "none"
        self.estimate = PoolEstimate(
            pool_key=self.pool_key, end_bucket=end_bucket, fit=fit, num_samples=int(stats.outputs.count),
            cost_fit=cost_fit, costs=costs, cost_source=source, num_buckets=used, contributors=replicas,
            num_rejected_steps=stats.costs.num_rejected,
        )
        return self.estimate
