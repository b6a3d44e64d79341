"""One pool bucket: the open bucket batches are appended to, and the closed, immutable `BucketStats` with its
wire format (what replicas publish and read, and what a warm start persists).

A closed bucket holds a sparse histogram of output lengths, the count and sum of prompt lengths, the
normal-equation sums of the step costs (`core.cost_sums.CostSums`), the histogram of the output lengths so
far of the requests running when it closed, and both by the bucket each request was first scheduled in when
the engines report it (`core.admitted_counts`), and the latency sketches of its finished requests when the
engines report their stamps (`loop.outcomes.LatencySet`), and the running requests of the engines that
entered or left the pool during it (`loop.turnover.Turnover`). Formats v1 (no running requests), v2 (no
admissions), v3 (no latencies) and v4 (no turnover) are still read; v5 is written for a bucket with turnover,
v4 otherwise (a replica of the previous release reads every bucket but those).

Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Collection
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from controlplane.core.admitted_counts import AdmittedCounts
from controlplane.core.cost_sums import CostSums, StepColumns
from controlplane.core.latency_accumulator import LatencyAccumulator
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.types import CostModel
from controlplane.loop.outcomes import KINDS, LatencySet
from controlplane.loop.turnover import Turnover

# Replica id of a persisted window seeded at start (warm start).
SNAPSHOT_REPLICA = "snapshot"
# Steps of one batch that enter the cost sums (evenly spaced when a batch carries more).
MAX_STEPS_PER_BATCH = 64
# Steps of one bucket that enter the cost sums (evenly spaced over the bucket's batches when it holds more):
# a window's cost fit needs a few thousand steps, and summing the 64,000 a second of 1,000 engines held the
# event loop for 15-25 ms at every bucket close (5 ms with this cap).
MAX_STEPS_PER_BUCKET = 4096
# An engine counts in a bucket for at most FAIR_SHARE_FACTOR times the lower median of the bucket's engines'
# completions (never below MIN_FAIR_SHARE), once MIN_ACTIVE_ENGINES engines send MIN_FAIR_SHARE: however much
# one engine sends, it weighs like at most two typical engines of its pool.
FAIR_SHARE_FACTOR = 2.0
MIN_FAIR_SHARE = 64
MIN_ACTIVE_ENGINES = 3
# How many buckets back a bucket keeps its requests' admission exact (older ones sit at that bound): a window
# is fitted on the requests admitted since its change point only while that point is at most this far back.
MAX_ADMISSION_LAG_BUCKETS = 600
# Bucket formats (see the module docstring): each magic with its header.
_MAGIC_V1 = b"CPB1"
_HEADER_V1 = struct.Struct("<4sqdI")  # magic, prompt count, prompt sum, histogram byte length
_MAGIC_V2 = b"CPB2"
# magic, prompt count, prompt sum, histogram byte length, running known (0/1), running histogram byte length
_HEADER_V2 = struct.Struct("<4sqdIBI")
_MAGIC_V3 = b"CPB3"
# v2's, then for the completions' and the running requests' admissions: known (0/1), byte length
_HEADER_V3 = struct.Struct("<4sqdIBIBIBI")
_MAGIC_V4 = b"CPB4"
# v3's, then for the latencies: known (0/1), byte length
_HEADER_V4 = struct.Struct("<4sqdIBIBIBIBI")
_MAGIC = b"CPB5"
# v4's, then for the turnover: known (0/1), byte length
_HEADER = struct.Struct("<4sqdIBIBIBIBIBI")


@dataclass(slots=True)
class BucketStats:
    """What one bucket holds for one pool (from one replica, or merged).

    running: output lengths so far of the requests running when the bucket closed (None: not known, as in
    a bucket of the v1 format or a persisted window).
    admitted_outputs: the completions by admission bucket (None: an engine did not report one of them).
    admitted_running: `running` by admission bucket (None: an engine did not report its running requests'
      admissions).
    latencies: the finished requests' latency sketches (None: no engine reported latency stamps).
    turnover: the running requests of the engines that entered or left the pool in the bucket (None: none
      did, or a bucket of a format before v5).
    """

    outputs: LengthHistogram
    prompt_count: int
    prompt_sum_tokens: float
    costs: CostSums
    running: LengthHistogram | None = None
    admitted_outputs: AdmittedCounts | None = None
    admitted_running: AdmittedCounts | None = None
    latencies: LatencySet | None = None
    turnover: Turnover | None = None

    @classmethod
    def empty(cls) -> BucketStats:
        return cls(outputs=LengthHistogram.empty(), prompt_count=0, prompt_sum_tokens=0.0,
                   costs=CostSums())

    def to_bytes(self) -> bytes:
        hist = self.outputs.to_bytes()
        running = self.running.to_bytes() if self.running is not None else b""
        admitted = self.admitted_outputs.to_bytes() if self.admitted_outputs is not None else b""
        admitted_running = self.admitted_running.to_bytes() if self.admitted_running is not None else b""
        latencies = self.latencies.to_bytes() if self.latencies is not None else b""
        costs = self.costs.to_array().astype("<f8").tobytes()
        fields = (self.prompt_count, self.prompt_sum_tokens, len(hist), int(self.running is not None), len(running),
                  int(self.admitted_outputs is not None), len(admitted), int(self.admitted_running is not None),
                  len(admitted_running), int(self.latencies is not None), len(latencies))
        body = hist + running + admitted + admitted_running + latencies
        if self.turnover is None:
            return _HEADER_V4.pack(_MAGIC_V4, *fields) + body + costs
        turnover = self.turnover.to_bytes()
        return _HEADER.pack(_MAGIC, *fields, 1, len(turnover)) + body + turnover + costs

    @classmethod
    def from_bytes(cls, payload: bytes) -> BucketStats:
        """Any format (v1: running None; v1 and v2: admissions None; v1 to v3: latencies None; v1 to v4:
        turnover None). Raises ValueError for a payload that is not a bucket."""
        known_admitted = known_admitted_running = admitted_len = admitted_running_len = 0
        known_latencies = latencies_len = known_turnover = turnover_len = 0
        if payload[:4] == _MAGIC_V1 and len(payload) >= _HEADER_V1.size:
            _, count, total, hist_len = _HEADER_V1.unpack_from(payload)
            known, running_len, offset = 0, 0, _HEADER_V1.size
        elif payload[:4] == _MAGIC_V2 and len(payload) >= _HEADER_V2.size:
            _, count, total, hist_len, known, running_len = _HEADER_V2.unpack_from(payload)
            offset = _HEADER_V2.size
        elif payload[:4] == _MAGIC_V3 and len(payload) >= _HEADER_V3.size:
            (_, count, total, hist_len, known, running_len, known_admitted, admitted_len, known_admitted_running,
             admitted_running_len) = _HEADER_V3.unpack_from(payload)
            offset = _HEADER_V3.size
        elif payload[:4] == _MAGIC_V4 and len(payload) >= _HEADER_V4.size:
            (_, count, total, hist_len, known, running_len, known_admitted, admitted_len, known_admitted_running,
             admitted_running_len, known_latencies, latencies_len) = _HEADER_V4.unpack_from(payload)
            offset = _HEADER_V4.size
        elif payload[:4] == _MAGIC and len(payload) >= _HEADER.size:
            (_, count, total, hist_len, known, running_len, known_admitted, admitted_len, known_admitted_running,
             admitted_running_len, known_latencies, latencies_len, known_turnover,
             turnover_len) = _HEADER.unpack_from(payload)
            offset = _HEADER.size
        else:
            raise ValueError("not a pool-statistics bucket")
        sections = (hist_len, running_len, admitted_len, admitted_running_len, latencies_len, turnover_len)
        if (count < 0 or not math.isfinite(total)
                or max(known, known_admitted, known_admitted_running, known_latencies, known_turnover) > 1
                or offset + sum(sections) > len(payload)):
            raise ValueError("not a pool-statistics bucket")
        parts = []
        for size in sections:
            parts.append(payload[offset:offset + size])
            offset += size
        costs = CostSums.from_array(np.frombuffer(payload[offset:], dtype="<f8"))
        return cls(outputs=LengthHistogram.from_bytes(parts[0]), prompt_count=int(count),
                   prompt_sum_tokens=float(total), costs=costs,
                   running=LengthHistogram.from_bytes(parts[1]) if known else None,
                   admitted_outputs=AdmittedCounts.from_bytes(parts[2]) if known_admitted else None,
                   admitted_running=AdmittedCounts.from_bytes(parts[3]) if known_admitted_running else None,
                   latencies=LatencySet.from_bytes(parts[4]) if known_latencies else None,
                   turnover=Turnover.from_bytes(parts[5]) if known_turnover else None)


def fair_share_rows(ranges: dict[str, list[tuple[int, int]]], size: int) -> tuple[np.ndarray | None,
                                                                                  dict[str, float]]:
    """The rows of `size` kept when each engine (its row ranges in `ranges`) counts for at most its fair share:
    FAIR_SHARE_FACTOR times the lower median of the engines' row counts (at least MIN_FAIR_SHARE); an engine
    above it keeps evenly spaced rows. Only once MIN_ACTIVE_ENGINES engines have at least MIN_FAIR_SHARE rows
    each (one busy engine among idle ones is not outvoting anyone). Returns (keep mask, or None when every
    row is kept; the fraction kept of each engine cut)."""
    counts = {engine: sum(end - start for start, end in parts) for engine, parts in ranges.items()}
    cap = fair_share_cap(counts.values())
    if cap is None:
        return None, {}
    keep = np.ones(size, dtype=bool)
    fractions = {}
    for engine, parts in ranges.items():
        if counts[engine] <= cap:
            continue
        keep[rows_beyond_share(parts, cap)] = False
        fractions[engine] = cap / counts[engine]
    return keep, fractions


def fair_share_cap(counts: Collection[int]) -> int | None:
    """The most rows an engine keeps, given every engine's row count (`fair_share_rows`); None when no engine
    has more, or fewer than MIN_ACTIVE_ENGINES engines have MIN_FAIR_SHARE rows. O(engines log engines)."""
    ordered = sorted(counts)
    if len(ordered) < MIN_ACTIVE_ENGINES or ordered[-MIN_ACTIVE_ENGINES] < MIN_FAIR_SHARE:
        return None  # fewer than MIN_ACTIVE_ENGINES engines busy: no typical engine to measure a share by
    cap = max(MIN_FAIR_SHARE, math.ceil(FAIR_SHARE_FACTOR * ordered[(len(ordered) - 1) // 2]))
    return cap if ordered[-1] > cap else None


def rows_beyond_share(parts: list[tuple[int, int]], cap: int) -> np.ndarray:
    """The rows an engine with row ranges `parts` (more than `cap` rows) does not keep: all but `cap` evenly
    spaced ones (int64, increasing)."""
    rows = np.concatenate([np.arange(start, end) for start, end in parts])
    beyond = np.ones(rows.size, dtype=bool)
    beyond[evenly_spaced(rows.size, cap)] = False
    return rows[beyond]


@lru_cache(maxsize=64)
def evenly_spaced(size: int, count: int) -> np.ndarray:
    """`count` evenly spaced indices into `size` items, first and last included (read-only; batches of one
    size recur, so they are computed once)."""
    keep = np.linspace(0, size - 1, count).astype(np.int64)
    keep.flags.writeable = False
    return keep


class Columns:
    """Rows appended to preallocated float64 columns that double when full (amortised O(1) per row): a
    bucket close reads one slice instead of concatenating a thousand batches' arrays."""

    __slots__ = ("_data", "size")

    def __init__(self, num_columns: int) -> None:
        self._data = np.empty((num_columns, 1024), dtype=np.float64)
        self.size = 0

    def append(self, *columns: np.ndarray) -> None:
        rows = columns[0].size
        end = self.size + rows
        if end > self._data.shape[1]:
            grown = np.empty((self._data.shape[0], max(end, 2 * self._data.shape[1])), dtype=np.float64)
            grown[:, : self.size] = self._data[:, : self.size]
            self._data = grown
        for row, column in zip(self._data, columns, strict=True):
            row[self.size : end] = column
        self.size = end

    def view(self) -> np.ndarray:
        """The rows so far, shape (columns, size); valid until the next append."""
        return self._data[:, : self.size]


@dataclass(slots=True)
class OpenBucket:
    """The bucket being filled: batches are only appended (amortised O(batch)); the histogram and the cost
    sums are computed once, vectorised over the whole bucket, when it closes (the latency sketches fold their
    rows a few thousand at a time as they arrive: `core.latency_accumulator.LatencyAccumulator`)."""

    bucket_id: int
    outputs: Columns = field(default_factory=lambda: Columns(1))
    admitted: Columns = field(default_factory=lambda: Columns(1))  # admission bucket per output
    admission_known: bool = True  # every output's admission was reported
    prompt_count: int = 0
    prompt_sum_tokens: float = 0.0
    steps: Columns = field(default_factory=lambda: Columns(4))  # prefill, decode, requests, duration
    # Per engine: its completions' row ranges in `outputs` and its prompts' count and sum (the fair share).
    shares: dict[str, list[tuple[int, int, int, float]]] = field(default_factory=dict)
    # The ttft, tpot and queue rows, folded into the three sketches' counts as they arrive (`core.latency_sketch`).
    latencies: LatencyAccumulator = field(default_factory=lambda: LatencyAccumulator(len(KINDS)))
    latency_shares: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # per engine: its row ranges
    latency_rows: dict[str, int] = field(default_factory=dict)  # per engine: its rows (the fair share)

    def add_latencies(self, engine_id: str, ttft_s: np.ndarray, tpot_s: np.ndarray, queue_s: np.ndarray) -> None:
        """Append one engine's finished requests' latencies (`ingest.Latencies`): O(its values), plus now and
        then one fold of about FOLD_ROWS rows (`LatencyAccumulator.append`)."""
        start, end = self.latencies.append(ttft_s, tpot_s, queue_s)
        parts = self.latency_shares.setdefault(engine_id, [])  # an engine sending stamps marks the bucket
        if end > start:
            parts.append((start, end))
        self.latency_rows[engine_id] = self.latency_rows.get(engine_id, 0) + end - start

    def _latency_set(self) -> LatencySet | None:
        """The bucket's latencies, each engine counted at most its fair share; None when no engine reported.
        O(engines log engines + MAX_ENTRIES) plus at most one fold and the rows cut."""
        if not self.latency_rows:
            return None
        cap = fair_share_cap(self.latency_rows.values())
        cut = None
        if cap is not None:
            cut = np.concatenate([rows_beyond_share(self.latency_shares[engine], cap)
                                  for engine, rows in self.latency_rows.items() if rows > cap])
        return LatencySet(*self.latencies.sketches(cut))

    def add_completions(self, engine_id: str, prompts: np.ndarray, outputs: np.ndarray,
                        admitted: np.ndarray) -> None:
        """Append one engine's completions (`admitted`: their admission buckets, NaN where unknown)."""
        start = self.outputs.size
        self.outputs.append(outputs)
        self.admitted.append(admitted)
        count, total = int(prompts.size), float(prompts.sum())
        self.prompt_count += count
        self.prompt_sum_tokens += total
        self.shares.setdefault(engine_id, []).append((start, self.outputs.size, count, total))

    def _fair_share(self) -> np.ndarray | None:
        """The completion rows kept when each engine counts for at most its fair share (`fair_share_rows`), an
        engine's prompts scaled alike; None: every row kept."""
        ranges = {engine: [(start, end) for start, end, _, _ in parts] for engine, parts in self.shares.items()}
        keep, fractions = fair_share_rows(ranges, self.outputs.size)
        for engine, fraction in fractions.items():
            parts = self.shares[engine]
            prompt_count = sum(c for _, _, c, _ in parts)
            self.prompt_count -= prompt_count - round(prompt_count * fraction)
            self.prompt_sum_tokens -= sum(t for _, _, _, t in parts) * (1.0 - fraction)
        return keep

    def close(self, reference_costs: CostModel | None, running: LengthHistogram | None,
              admitted_running: AdmittedCounts | None = None, turnover: Turnover | None = None) -> BucketStats:
        """The closed bucket, each engine's completions counted at most its fair share (`_fair_share`)."""
        costs = CostSums()
        if self.steps.size:
            columns = self.steps.view()
            if self.steps.size > MAX_STEPS_PER_BUCKET:
                columns = columns[:, np.linspace(0, self.steps.size - 1, MAX_STEPS_PER_BUCKET).astype(np.int64)]
            costs.add_steps(StepColumns(*columns), reference=reference_costs)
        outputs, admission = self.outputs.view()[0], self.admitted.view()[0]
        keep = self._fair_share()
        if keep is not None:
            outputs, admission = outputs[keep], admission[keep]
        admitted = None
        if self.admission_known:
            admitted = AdmittedCounts.from_columns(admission, outputs).cap_admission(
                self.bucket_id - MAX_ADMISSION_LAG_BUCKETS)
        return BucketStats(outputs=LengthHistogram.from_samples(outputs), prompt_count=self.prompt_count,
                           prompt_sum_tokens=self.prompt_sum_tokens, costs=costs, running=running,
                           admitted_outputs=admitted, admitted_running=admitted_running,
                           latencies=self._latency_set(), turnover=turnover)
