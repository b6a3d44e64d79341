"""Prometheus histograms of the latencies a pool's engines measured: `cp_pool_ttft_seconds`,
`cp_pool_tpot_seconds` and `cp_pool_queue_seconds`, labelled by pool only.

Each replica exports what its own engines reported (the buckets it closed), so a sum over replicas in PromQL
counts every request once. A closed bucket's sketch is added at once: its log-linear bins fall into the fixed
`le` bounds below by their representative values (the sketch's 1% relative error can move a request across a
bound by at most 1% of the bound). Cumulative from the replica's start, as Prometheus expects.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from controlplane.core.latency_sketch import LatencySketch, representative_s
from controlplane.loop.outcomes import LatencySet

BOUNDS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_BOUNDS = np.array(BOUNDS_S)
_FAMILIES = (("ttft", "cp_pool_ttft_seconds", "Time to first token of the pool's finished requests"),
             ("tpot", "cp_pool_tpot_seconds", "Time per output token after the first, per finished request"),
             ("queue", "cp_pool_queue_seconds", "Time from arrival to first scheduled, per finished request"))


class _Cumulative:
    __slots__ = ("counts", "sum_s")

    def __init__(self) -> None:
        self.counts = np.zeros(len(BOUNDS_S) + 1, dtype=np.int64)  # per bound, then +Inf (not cumulative)
        self.sum_s = 0.0

    def add(self, sketch: LatencySketch) -> None:
        indices, counts = sketch.buckets()
        if counts.size:
            np.add.at(self.counts, np.searchsorted(_BOUNDS, representative_s(indices), side="left"), counts)
            self.sum_s += sketch.sum_s


class PoolLatencyHistograms(Collector):
    """The three histograms per pool; `observe` from the event loop, `collect` from the scrape thread."""

    def __init__(self) -> None:
        self._pools: dict[str, dict[str, _Cumulative]] = {}
        self._lock = threading.Lock()

    def observe(self, pool: str, latencies: LatencySet) -> None:
        """Add one closed bucket's latencies of this replica's engines."""
        with self._lock:
            series = self._pools.setdefault(pool, {kind: _Cumulative() for kind, _, _ in _FAMILIES})
            for kind, _, _ in _FAMILIES:
                series[kind].add(getattr(latencies, kind))

    def forget(self, pool: str) -> None:
        with self._lock:
            self._pools.pop(pool, None)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        with self._lock:
            snapshot = {pool: {kind: (c.counts.copy(), c.sum_s) for kind, c in series.items()}
                        for pool, series in self._pools.items()}
        for kind, name, documentation in _FAMILIES:
            family = HistogramMetricFamily(name, documentation, labels=["pool"])
            for pool, series in sorted(snapshot.items()):
                counts, sum_s = series[kind]
                cumulative = np.cumsum(counts)
                buckets = [(repr(bound), int(cumulative[i])) for i, bound in enumerate(BOUNDS_S)]
                buckets.append(("+Inf", int(cumulative[-1])))
                family.add_metric([pool], buckets, sum_s)
            yield family
