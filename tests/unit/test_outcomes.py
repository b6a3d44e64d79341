"""Outcome latencies in buckets and windows: the v4 bucket carries them and older formats still read; one
engine's flood of latencies counts at most its fair share; a window sums replicas once each and lets old
buckets go."""

from __future__ import annotations

import math

import numpy as np
import pytest

from controlplane.core.latency_accumulator import FOLD_ROWS
from controlplane.core.latency_sketch import LatencySketch
from controlplane.loop import buckets
from controlplane.loop.buckets import BucketStats, OpenBucket
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.ingest import Latencies
from controlplane.loop.outcomes import LatencySet, OutcomeWindow
from controlplane.loop.pool_stats import PoolStatistics


def _set(rng: np.random.Generator, num: int, *, median_s: float = 0.2) -> LatencySet:
    return LatencySet.from_values(rng.lognormal(np.log(median_s), 0.5, num), rng.lognormal(np.log(0.02), 0.3, num),
                                  rng.exponential(0.05, num))


def test_a_bucket_carries_its_latencies_and_older_formats_still_read() -> None:
    rng = np.random.default_rng(0)
    stats = BucketStats.empty()
    stats.latencies = _set(rng, 500)
    payload = stats.to_bytes()
    assert payload[:4] == b"CPB4"
    assert BucketStats.from_bytes(payload).latencies == stats.latencies
    without = BucketStats.empty().to_bytes()
    assert BucketStats.from_bytes(without).latencies is None
    v3 = b"CPB3" + without[4:buckets._HEADER_V3.size] + without[buckets._HEADER_V4.size:]
    assert BucketStats.from_bytes(v3).latencies is None and BucketStats.from_bytes(v3).outputs.count == 0
    start = buckets._HEADER_V4.size + sum(len(part) for part in (stats.outputs.to_bytes(),))
    corrupt = bytearray(payload)
    corrupt[start + 1] ^= 0xFF  # inside the latency set's magic
    with pytest.raises(ValueError):
        BucketStats.from_bytes(bytes(corrupt))


def test_one_engine_flooding_latencies_counts_at_most_its_fair_share() -> None:
    rng = np.random.default_rng(1)
    bucket = OpenBucket(bucket_id=7)
    honest = []
    for engine in ("a", "b", "c"):
        ttft = rng.lognormal(np.log(0.2), 0.3, 200)
        honest.append(ttft)
        bucket.add_latencies(engine, ttft, np.zeros(0), np.zeros(0))
    bucket.add_latencies("flood", np.full(50_000, 30.0), np.zeros(0), np.zeros(0))
    latencies = bucket.close(None, None).latencies
    assert latencies is not None
    assert latencies.ttft.count <= 600 + 2 * 200  # the flood weighs like at most two typical engines
    # Without the cap the median would be the flood's 30 s; with it, it stays among the honest engines' values.
    assert latencies.ttft.quantile(0.5) <= np.quantile(np.concatenate(honest), 0.9)


def test_a_closed_bucket_holds_the_sketches_of_the_rows_each_engine_keeps() -> None:
    """Engines cut to their fair share keep evenly spaced rows over all their batches (ttft, tpot, queue rows
    of each batch in turn), as for completions, exactly as sketched from the kept values; enough rows that
    the bucket folds many times before it closes."""
    rng = np.random.default_rng(4)
    bucket = OpenBucket(bucket_id=3)
    rows: dict[str, list[tuple[int, float]]] = {}
    for _ in range(6):
        for engine in [f"e{i}" for i in range(40)] + ["flood", "busy"]:
            size = {"flood": 2000, "busy": 400}.get(engine, int(rng.integers(0, 120)))
            columns = (rng.lognormal(np.log(0.3), 0.8, size), rng.lognormal(np.log(0.02), 0.3, size // 2),
                       rng.exponential(0.1, size // 3))
            bucket.add_latencies(engine, *columns)
            rows.setdefault(engine, []).extend((kind, value) for kind, column in enumerate(columns)
                                               for value in column.tolist())
    assert sum(map(len, rows.values())) > 10 * FOLD_ROWS
    ordered = sorted(len(engine_rows) for engine_rows in rows.values())
    cap = max(buckets.MIN_FAIR_SHARE, math.ceil(buckets.FAIR_SHARE_FACTOR * ordered[(len(ordered) - 1) // 2]))
    kept = []
    for engine_rows in rows.values():
        if len(engine_rows) > cap:
            engine_rows = [engine_rows[i] for i in np.linspace(0, len(engine_rows) - 1, cap).astype(int).tolist()]
        kept += engine_rows
    assert len(kept) < sum(map(len, rows.values()))  # flood and busy were cut
    want = LatencySet.from_values(*(np.array([value for kind, value in kept if kind == k]) for k in range(3)))
    got = bucket.close(None, None).latencies
    assert got is not None and got == want
    for mine, theirs in zip(got.sketches(), want.sketches(), strict=True):
        mine.subtract(theirs)  # exact sums: nothing is left
        assert mine == LatencySketch()


def test_an_engine_that_sends_stamps_but_no_latency_still_marks_the_bucket() -> None:
    bucket = OpenBucket(bucket_id=1)
    assert bucket.close(None, None).latencies is None
    bucket = OpenBucket(bucket_id=1)
    bucket.add_latencies("a", np.zeros(0), np.zeros(0), np.zeros(0))
    closed = bucket.close(None, None).latencies
    assert closed is not None and closed.count == 0


def test_the_window_sums_each_replica_once_and_lets_old_buckets_go() -> None:
    rng = np.random.default_rng(2)
    window = OutcomeWindow(window_buckets=3, bucket_s=1.0)
    first, again, other = _set(rng, 100), _set(rng, 40), _set(rng, 60)
    window.put(10, "r0", first)
    window.put(10, "r0", again)  # a replica's bucket replaced: counted once
    window.put(10, "r1", other)
    assert window.total.ttft.count == 100
    window.put(12, "r0", _set(rng, 10))
    assert window.total.ttft.count == 110
    window.put(13, "r0", _set(rng, 5))  # bucket 10 leaves the window (11..13)
    assert window.total.ttft.count == 15
    window.put(9, "r1", _set(rng, 1000))  # older than the window: ignored
    assert window.total.ttft.count == 15
    window.advance(20)
    assert window.total.ttft.count == 0 and window.summary() is None


def test_a_pool_reports_its_latencies_over_the_last_minute() -> None:
    rng = np.random.default_rng(3)
    pool = PoolStatistics("m|a", DecisionLoopConfig(), replica_id="r0")
    sent = []
    for second in range(5):
        ttft = rng.lognormal(np.log(0.5), 0.4, 50)
        sent.append(ttft)
        pool.add(100.0 + second + 0.5, prompts=np.zeros(0), outputs=np.zeros(0), steps=None, engine_id="e",
                 latencies=Latencies(ttft_s=ttft, tpot_s=np.zeros(0), queue_s=np.zeros(0), num_dropped=0))
    pool.close_due(106.0)
    summary = pool.outcomes.summary()
    assert summary is not None and summary.ttft.num_requests == 250
    values = np.sort(np.concatenate(sent))
    assert summary.ttft.p99_s == pytest.approx(values[int(0.99 * 249)], rel=0.0101)
    pool.refresh(300.0, calibration=None)  # quiet for minutes: the window empties
    assert pool.outcomes.summary() is None
