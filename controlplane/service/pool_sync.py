"""The pools' store exchange: publish this replica's closed buckets, read the other replicas', persist and load
a pool's window for warm starts, and record the pool's latency view every latency_history_interval_s. The
statistics themselves live in the fleet state machine (`loop.fleet.FleetState`); this module only moves bytes
between it and the store.

A slow or failed store never holds a pool's estimate back: every call has a deadline
(`EXCHANGE_TIMEOUT_S`), and a refresh then uses this replica's own buckets.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.loop.buckets import BucketStats
from controlplane.loop.estimate import PoolEstimate
from controlplane.loop.fleet import FleetState
from controlplane.observability.metrics import ControllerMetrics
from controlplane.service.fleet_view import outcomes_message
from controlplane.service.store_health import StoreHealth
from controlplane.store import Store, StoreUnavailable

logger = logging.getLogger(__name__)
EXCHANGE_TIMEOUT_S = 0.5
_RECENT_BUCKETS_REFETCHED = 3


@dataclass(eq=False)
class PoolLink:
    """One pool's exchange state on this replica."""

    unpublished: list[tuple[int, BucketStats]] = field(default_factory=list)
    fetched_through: int = -1
    first_sync: asyncio.Future | None = None
    last_snapshot_s: float = float("-inf")
    latency_slot: int = -1  # the latest latency-history slot this replica sampled the pool in
    # Other replicas' buckets this replica cannot read (bucket id, replica id): not parsed again at each
    # exchange, and the replicas already warned about (a replica of a newer format warns once per pool).
    unreadable: set[tuple[int, str]] = field(default_factory=set)
    unreadable_replicas: set[str] = field(default_factory=set)


class PoolSync:
    """Moves the fleet's pool statistics to and from the store (see the module docstring)."""

    def __init__(self, fleet: FleetState, store: Store, health: StoreHealth, metrics: ControllerMetrics, *,
                 clock: Callable[[], float]) -> None:
        self._fleet = fleet
        self._clock = clock
        self._store = store
        self._health = health
        self._metrics = metrics
        self._links: dict[str, PoolLink] = {}

    def _link(self, key: str) -> PoolLink:
        link = self._links.get(key)
        if link is None:
            link = self._links[key] = PoolLink()
        return link

    def queue(self, key: str, bucket_id: int, bucket: BucketStats) -> None:
        """A closed bucket to publish at the next sync (its latencies go to the pool's histograms now)."""
        self._link(key).unpublished.append((bucket_id, bucket))
        if bucket.latencies is not None:
            self._metrics.pool_latencies.observe(key, bucket.latencies)

    def forget(self, key: str) -> None:
        """The pool is no longer held here."""
        self._links.pop(key, None)
        self._metrics.forget_pool(key)

    async def warm(self, key: str, *, timeout_s: float) -> None:
        """A pool's first engines on this replica: take in its persisted window and the shared buckets before
        the first decision (one sync per pool, however many engines connect at once); waits at most
        timeout_s."""
        link = self._link(key)
        if link.first_sync is None:
            link.first_sync = asyncio.ensure_future(self._warm(key))
        with contextlib.suppress(TimeoutError, StoreUnavailable):
            await asyncio.wait_for(asyncio.shield(link.first_sync), timeout=timeout_s)

    async def _warm(self, key: str) -> None:
        now_s = self._clock()
        payload = None
        try:
            payload = await asyncio.wait_for(self._store.get_pool_snapshot(key), timeout=EXCHANGE_TIMEOUT_S)
        except (StoreUnavailable, TimeoutError) as exc:
            self._health.failed("pool_snapshot", exc)
        window = None
        if payload is not None:
            try:
                window = BucketStats.from_bytes(payload)
                logger.info("pool %s: warm start from its persisted statistics", key)
            except ValueError as exc:
                logger.warning("pool %s: ignoring its persisted statistics: %s", key, exc)
        self._fleet.seed_pool(key, window, now_s)
        await self.sync(self._clock(), only=key)

    async def sync(self, now_s: float, *, only: str | None = None) -> None:
        """Publish closed buckets, read the other replicas' and refresh each pool's estimate when its end
        bucket advanced (every pool, or `only` that one)."""
        fleet = self._fleet
        for key in fleet.pool_keys():
            if only is not None and key != only:
                continue
            closed = fleet.close_bucket(key, now_s)
            if closed is not None:
                self.queue(key, *closed)
            link = self._link(key)
            if link.unpublished:
                # Publish as soon as a bucket closes: other replicas read it settle_s later.
                await self._publish(key, link, now_s)
            end_bucket = fleet.refresh_due(key, now_s)
            if end_bucket is None:
                continue
            try:
                await asyncio.wait_for(self._exchange(key, link, end_bucket), timeout=EXCHANGE_TIMEOUT_S)
            except TimeoutError:
                self._health.failed("pool_statistics", TimeoutError(f"no answer within {EXCHANGE_TIMEOUT_S} s"))
            if fleet.pool(key) is None:  # forgotten while the exchange awaited the store
                continue
            started = time.perf_counter()
            estimate = fleet.refresh_pool(key, now_s)
            self._metrics.pool_fit_latency.observe(time.perf_counter() - started)
            self._set_gauges(key, estimate)
            stats = fleet.pool(key).stats
            if (now_s - link.last_snapshot_s >= fleet.loop_config.snapshot_interval_s
                    and estimate.num_samples >= fleet.policy.min_samples and stats.last_window is not None):
                await self._save_snapshot(key, link, stats.last_window, now_s)
            await self._record_latencies(key, link, now_s)

    async def _save_snapshot(self, key: str, link: PoolLink, window: BucketStats, now_s: float) -> None:
        try:
            await asyncio.wait_for(self._store.put_pool_snapshot(key, window.to_bytes(),
                                                                 ttl_s=self._fleet.loop_config.snapshot_ttl_s),
                                   timeout=EXCHANGE_TIMEOUT_S)
            link.last_snapshot_s = now_s
        except (StoreUnavailable, TimeoutError) as exc:
            self._health.failed("pool_snapshot", exc)

    async def _record_latencies(self, key: str, link: PoolLink, now_s: float) -> None:
        """Record the pool's latency view (as its explain view shows it) once per latency_history_interval_s
        slot, at the first refresh in the slot; replicas sampling the same slot write it once."""
        config = self._fleet.loop_config
        interval_s = config.latency_history_interval_s
        if not interval_s:
            return
        slot = math.floor(now_s / interval_s)
        pool = self._fleet.pool(key)
        if slot <= link.latency_slot or slot <= 0 or pool is None:  # slot 0: a clock before 1970 (a test's)
            return
        link.latency_slot = slot
        summary = pool.stats.outcomes.summary()
        if summary is None:
            return
        payload = outcomes_message(summary, self._fleet.objective_of(key)).SerializeToString()
        try:
            await asyncio.wait_for(self._store.put_latency_sample(
                key, slot_ms=round(slot * interval_s * 1000.0), payload=payload,
                max_samples=config.latency_history_max_samples, ttl_s=config.latency_history_s), EXCHANGE_TIMEOUT_S)
        except (StoreUnavailable, TimeoutError) as exc:
            self._health.failed("latency_history", exc)

    async def _publish(self, key: str, link: PoolLink, now_s: float) -> None:
        ttl_s = self._fleet.loop_config.max_window_s + 60.0
        try:
            for bucket_id, bucket in list(link.unpublished):
                await asyncio.wait_for(self._store.put_pool_contribution(
                    key, bucket_start_s=bucket_id, replica_id=self._fleet.replica_id, payload=bucket.to_bytes(),
                    ttl_s=ttl_s), timeout=EXCHANGE_TIMEOUT_S)
                link.unpublished.remove((bucket_id, bucket))
        except (StoreUnavailable, TimeoutError) as exc:
            self._health.failed("pool_statistics", exc)
        # Buckets that could not be published for longer than a window are of no use to anyone.
        pool = self._fleet.pool(key)
        if pool is not None:
            oldest = pool.stats.oldest_bucket(pool.stats.estimate_bucket(now_s))
            link.unpublished = [(b, stats) for b, stats in link.unpublished if b >= oldest]

    async def _exchange(self, key: str, link: PoolLink, end_bucket: int) -> None:
        pool = self._fleet.pool(key)
        if pool is None:
            return
        stats = pool.stats
        try:
            first = max(0, stats.oldest_bucket(end_bucket), link.fetched_through - _RECENT_BUCKETS_REFETCHED + 1)
            wanted = list(range(first, end_bucket + 1))
            remote = await self._store.get_pool_contributions(key, bucket_starts=wanted) if wanted else {}
            self._health.ok()
        except StoreUnavailable as exc:
            self._health.failed("pool_statistics", exc)
            return
        own = self._fleet.replica_id
        for bucket_id, by_replica in remote.items():
            for replica_id, payload in by_replica.items():
                if replica_id == own or (stats.has_bucket(bucket_id, replica_id)
                                         and bucket_id < end_bucket - _RECENT_BUCKETS_REFETCHED):
                    continue
                if (bucket_id, replica_id) in link.unreadable:
                    continue
                try:
                    self._fleet.take_peer_bucket(key, bucket_id, replica_id, BucketStats.from_bytes(payload))
                except ValueError as exc:
                    self._note_unreadable(key, link, bucket_id, replica_id, exc)
        link.fetched_through = max(link.fetched_through, end_bucket)
        if link.unreadable:
            oldest = stats.oldest_bucket(end_bucket)
            link.unreadable = {entry for entry in link.unreadable if entry[0] >= oldest}

    def _note_unreadable(self, key: str, link: PoolLink, bucket_id: int, replica_id: str, exc: ValueError) -> None:
        """A bucket another replica wrote that this one cannot read is left out of the pool's statistics,
        counted once, and warned about once per replica and pool (a replica of a newer bucket format writes
        one every second; the exchange re-reads the recent ones)."""
        link.unreadable.add((bucket_id, replica_id))
        self._metrics.pool_buckets_unreadable.labels(pool=key).inc()
        if replica_id in link.unreadable_replicas:
            logger.debug("pool %s: ignoring bucket %d of replica %s: %s", key, bucket_id, replica_id, exc)
            return
        link.unreadable_replicas.add(replica_id)
        logger.warning("pool %s: ignoring bucket %d of replica %s: %s; its further unreadable buckets are "
                       "counted in cp_pool_buckets_unreadable_total, not logged", key, bucket_id, replica_id, exc)

    def _set_gauges(self, key: str, estimate: PoolEstimate) -> None:
        m = self._metrics
        pool = self._fleet.pool(key)
        m.pool_engines.labels(pool=key).set(pool.num_connected if pool is not None else 0)
        m.pool_samples.labels(pool=key).set(estimate.num_samples)
        tracker = self._fleet.objective_of(key)
        if tracker is not None:
            m.pool_objective_state.labels(pool=key).set(int(tracker.state))
            m.pool_objective_delta.labels(pool=key).set(tracker.delta_s_per_token)
            m.pool_objective_budget_scale.labels(pool=key).set(tracker.budget_cap_scale)
        else:
            for gauge in (m.pool_objective_state, m.pool_objective_delta, m.pool_objective_budget_scale):
                with contextlib.suppress(KeyError):
                    gauge.remove(key)
        if estimate.fit is not None:
            s = estimate.fit.stats
            m.pool_p0.labels(pool=key).set(s.p0)
            m.pool_mu_o.labels(pool=key).set(s.mu_o_tokens)
            m.pool_mu_l.labels(pool=key).set(s.mu_l_tokens)
