"""The synthetic fleet: N fake engines, each with its own AgentService stream, as asyncio tasks.

`SyntheticFleet` builds one `FakeEngine` + `FleetEngineClient` per engine (assigned round-robin to the
pools), runs them concurrently in the caller's event loop, and stops them gracefully. It is the demo
fleet and the controller's load generator. Seeds: engine i draws its lengths from a child of
SeedSequence(seed), so one seed gives one fleet, whatever the order the tasks run in.

Engine ids are "<engine_id_prefix>-<pool index>-<engine index, 4 digits>", e.g. "sim-0-0003".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
import numpy as np

from controlplane.core.types import CostModel
from controlplane.fleet.client import DEFAULT_ACCELERATOR, DEFAULT_MODEL, ClientCounters, FleetEngineClient
from controlplane.fleet.engine import FakeEngine
from controlplane.fleet.profiles import H200_QWEN3_8B, H200_QWEN3_8B_SHAPE, EngineShape
from controlplane.fleet.settings import EngineSettings
from controlplane.fleet.workload import WorkloadSpec

logger = logging.getLogger(__name__)

DEFAULT_DURATION_JITTER_REL = 0.02


@dataclass(frozen=True, slots=True)
class FleetPool:
    """Engines of one model on one accelerator type: their cost model, shape and (optionally) workload.

    workload None means the fleet's workload.
    """

    model: str = DEFAULT_MODEL
    accelerator: str = DEFAULT_ACCELERATOR
    cost_model: CostModel = H200_QWEN3_8B
    shape: EngineShape = H200_QWEN3_8B_SHAPE
    workload: WorkloadSpec | None = None


DEFAULT_POOLS: tuple[FleetPool, ...] = (FleetPool(),)


@dataclass(frozen=True, slots=True)
class EngineStats:
    """One engine at the time of `stats()`. decision_version is 0 when the engine runs stock."""

    engine_id: str
    model: str
    accelerator: str
    connected: bool
    counters: ClientCounters
    settings: EngineSettings
    decision_version: int
    num_steps: int
    num_completed: int
    num_preemptions: int
    sim_time_s: float


@dataclass(frozen=True, slots=True)
class FleetStats:
    """Fleet totals plus the per-engine rows."""

    num_engines: int
    num_connected: int
    num_batches_sent: int
    num_decisions_received: int
    num_decisions_applied: int
    num_decisions_rejected: int
    num_decisions_expired: int
    num_reconnects: int
    num_completed: int
    engines: tuple[EngineStats, ...]


class SyntheticFleet:
    """N fake engines streaming to one controller address. Use in a running event loop.

    Usage:
        fleet = SyntheticFleet("127.0.0.1:50051", num_engines=8, workload="geometric:256/uniform:512", speed=50)
        await fleet.start()
        ...
        await fleet.stop()
    or `async with SyntheticFleet(...) as fleet: ...`.
    """

    def __init__(
        self,
        address: str,
        *,
        num_engines: int,
        workload: WorkloadSpec | str,
        pools: Sequence[FleetPool] = DEFAULT_POOLS,
        seed: int = 0,
        speed: float | None = None,
        batch_interval_s: float = 1.0,
        max_batches: int | None = None,
        metadata: Sequence[tuple[str, str]] = (),
        channel_credentials: grpc.ChannelCredentials | None = None,
        engine_id_prefix: str = "sim",
        duration_jitter_rel: float = DEFAULT_DURATION_JITTER_REL,
        backoff_initial_s: float = 0.1,
        backoff_max_s: float = 5.0,
        tick_s: float = 0.05,
    ) -> None:
        """
        Args:
            address: controller target, e.g. "127.0.0.1:50051".
            num_engines: engines to run (≥ 1), spread round-robin over `pools`.
            workload: a WorkloadSpec or its compact text ("geometric:256/uniform:512/closed:64").
            pools: at least one pool; a pool's own workload overrides the fleet's.
            seed: fleet seed (engine lengths, duration jitter, backoff jitter).
            speed: simulated seconds per wall second; None = as fast as possible.
            batch_interval_s: simulated seconds per TelemetryBatch.
            max_batches: per engine; the fleet's clients finish after sending that many.
            metadata: call metadata for every stream, e.g. (("authorization", "Bearer <token>"),).
            channel_credentials: TLS credentials; None = plaintext.
            engine_id_prefix: prefix of the engine ids.
            duration_jitter_rel: σ of the log-normal noise on step durations.
            backoff_initial_s, backoff_max_s, tick_s: see FleetEngineClient.

        Raises:
            ValueError: num_engines < 1, no pools, or a malformed workload/argument.
        """
        if num_engines < 1:
            raise ValueError(f"num_engines must be ≥ 1, got {num_engines}")
        if not pools:
            raise ValueError("at least one pool is needed")
        spec = WorkloadSpec.parse(workload) if isinstance(workload, str) else workload
        children = np.random.SeedSequence(seed).spawn(num_engines)
        clients = []
        for index, child in enumerate(children):
            pool_index = index % len(pools)
            pool = pools[pool_index]
            engine_seed, client_seed = (int(x) for x in child.generate_state(2))
            engine = FakeEngine(
                workload=pool.workload or spec, shape=pool.shape, cost_model=pool.cost_model,
                seed=engine_seed, duration_jitter_rel=duration_jitter_rel,
            )
            clients.append(FleetEngineClient(
                address, engine=engine, engine_id=f"{engine_id_prefix}-{pool_index}-{index:04d}",
                model=pool.model, accelerator=pool.accelerator, batch_interval_s=batch_interval_s,
                speed=speed, max_batches=max_batches, metadata=metadata, channel_credentials=channel_credentials,
                backoff_initial_s=backoff_initial_s, backoff_max_s=backoff_max_s, tick_s=tick_s, seed=client_seed,
            ))
        self._address = address
        self._clients = tuple(clients)
        self._tasks: tuple[asyncio.Task[None], ...] = ()

    @property
    def clients(self) -> tuple[FleetEngineClient, ...]:
        return self._clients

    @property
    def running(self) -> bool:
        """Started and at least one client still running."""
        return any(not t.done() for t in self._tasks)

    async def start(self) -> None:
        """Start every client as a task of the running loop. Raises RuntimeError when already started."""
        if self._tasks:
            raise RuntimeError("the fleet was already started")
        self._tasks = tuple(
            asyncio.create_task(client.run(), name=f"fleet-engine-{client.engine_id}") for client in self._clients
        )
        logger.info("fleet: %s engines streaming to %s", len(self._clients), self._address)

    async def wait(self, *, timeout_s: float | None = None) -> bool:
        """Wait until every client finished (max_batches, or stopped). Returns False on timeout.

        A client that failed with an unexpected exception re-raises it here.
        """
        if not self._tasks:
            return True
        done, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]
        return not pending

    async def stop(self, *, timeout_s: float = 5.0) -> None:
        """Graceful stop: each client half-closes its stream and closes its channel; tasks still running
        after `timeout_s` are cancelled (which also closes their channels). Idempotent."""
        for client in self._clients:
            client.stop()
        if not self._tasks:
            return
        _, pending = await asyncio.wait(self._tasks, timeout=timeout_s)
        for task in pending:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    await task
                except Exception:
                    logger.exception("fleet: engine task %s failed", task.get_name())
        logger.info("fleet: stopped")

    def stats(self) -> FleetStats:
        """Totals and per-engine rows, read now (no locking needed: one event loop)."""
        rows = []
        for client in self._clients:
            engine = client.engine
            in_force = client.decision_in_force
            rows.append(EngineStats(
                engine_id=client.engine_id, model=client.model, accelerator=client.accelerator,
                connected=client.connected, counters=client.counters, settings=engine.settings,
                decision_version=in_force.version if in_force is not None else 0,
                num_steps=engine.num_steps, num_completed=engine.num_completed,
                num_preemptions=engine.num_preemptions, sim_time_s=engine.now_s,
            ))
        return FleetStats(
            num_engines=len(rows),
            num_connected=sum(r.connected for r in rows),
            num_batches_sent=sum(r.counters.num_batches_sent for r in rows),
            num_decisions_received=sum(r.counters.num_decisions_received for r in rows),
            num_decisions_applied=sum(r.counters.num_decisions_applied for r in rows),
            num_decisions_rejected=sum(r.counters.num_decisions_rejected for r in rows),
            num_decisions_expired=sum(r.counters.num_decisions_expired for r in rows),
            num_reconnects=sum(r.counters.num_reconnects for r in rows),
            num_completed=sum(r.num_completed for r in rows),
            engines=tuple(rows),
        )

    async def __aenter__(self) -> SyntheticFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
