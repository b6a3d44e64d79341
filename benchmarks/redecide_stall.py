"""What an operator's fleet-wide change costs the controller's event loop: re-deciding every engine in one pass
against in parts (`Controller._redecide_all`, REDECIDE_PART engines at a time).

A `Controller` in this process (the product's defaults, a real embedded redis-server, its decision writer
running) holds `--engines` engines of one pool, each with one telemetry batch taken in. Then, for each way,
`--changes` fleet δ overrides alternate between two values (each re-decides every engine). Printed side by
side: the `set_override` round trip (the operator's call: stored, then every engine re-decided) and the event
loop's lag as a task that sleeps 1 ms sees it (its longest and p99 over the changes): the longest time the
loop could not answer a health check or take a batch. The baseline is the same code with the part as large as
the fleet (one pass, as before the parts). Every engine's decision in force is checked to carry the new δ when
the call returns. The cyclic garbage collector's full collections meanwhile are counted, with the longest: at
thousands of engines one holds the process for about a hundred milliseconds, whatever the way.

Run: `.venv/bin/python benchmarks/redecide_stall.py [--engines 5000] [--changes 5]`; `--smoke`: 200 engines, 2
changes (the code paths; the figures mean nothing).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: testbench

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.loop.ingest import validate_batch
from controlplane.observability.metrics import ControllerMetrics
from controlplane.observability.tracing import DecisionTracer, TracingSettings, create_tracer_provider
from controlplane.service import controller as controller_module
from controlplane.service.config import ControllerConfig
from controlplane.service.controller import Controller
from controlplane.store import EmbeddedRedis, create_store
from testbench.messages import geometric_batch, validated_hello

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")
LAG_PERIOD_S = 0.001


class _FullCollections:
    """The cyclic garbage collector's full (generation 2) collections: how long each held the process."""

    def __init__(self) -> None:
        self.durations_s: list[float] = []
        self._started = 0.0

    def __call__(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        elif info["generation"] == 2:
            self.durations_s.append(time.perf_counter() - self._started)


async def _lag_monitor(stop: asyncio.Event, lags: list[float]) -> None:
    """How late a 1 ms sleep wakes up, again and again: the loop's lag."""
    while not stop.is_set():
        started = time.perf_counter()
        await asyncio.sleep(LAG_PERIOD_S)
        lags.append(time.perf_counter() - started - LAG_PERIOD_S)


async def _drain(sessions: list, stop: asyncio.Event) -> None:
    """Take what is pushed, as the agents' streams would (a mailbox keeps the latest decision only), 64 streams a
    turn of the loop: each stream is a task of its own in the controller, and one pass over thousands of mailboxes
    would itself hold the loop."""
    while not stop.is_set():
        for start in range(0, len(sessions), 64):
            for session in sessions[start:start + 64]:
                while session.mailbox.pending():
                    await session.mailbox.get()
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)


def _delta(value: float) -> operator_pb2.OverrideRecord:
    return operator_pb2.OverrideRecord(scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET),
                                       kind=operator_pb2.OVERRIDE_KIND_DELTA, delta_s_per_token=value,
                                       reason="redecide-stall benchmark")


async def _changes(controller: Controller, engine_ids: list[str], changes: int, part: int,
                   first: int) -> tuple[list[float], list[float], list[float]]:
    """`changes` fleet δ overrides with REDECIDE_PART = part: each call's round trip, the loop's lags and the
    full garbage collections' durations meanwhile."""
    controller_module.REDECIDE_PART = part
    calls, lags, stop = [], [], asyncio.Event()
    collections = _FullCollections()
    gc.callbacks.append(collections)
    monitor = asyncio.create_task(_lag_monitor(stop, lags))
    for index in range(first, first + changes):
        value = 1e-5 * (index % 2)
        await asyncio.sleep(0.5)  # quiet between changes: what the lag shows is the change's
        started = time.perf_counter()
        await controller.set_override(_delta(value), actor="bench")
        calls.append(time.perf_counter() - started)
        stale = [e for e in engine_ids if controller.fleet.engine(e).loop.current.delta_s_per_token != value]
        if stale:
            raise SystemExit(f"{len(stale)} engines do not carry δ {value} after the call returned")
    await asyncio.sleep(0.5)
    stop.set()
    await monitor
    gc.callbacks.remove(collections)
    return calls, lags, collections.durations_s


async def main(num_engines: int, changes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as server:
        store = create_store(server.url, prefix="bench")
        controller = Controller(ControllerConfig(port=0, redis_url=server.url), store=store,
                                tracer=DecisionTracer(create_tracer_provider(TracingSettings())),
                                metrics=ControllerMetrics())
        writer = asyncio.create_task(controller.writer.run())
        rng = np.random.default_rng(3)
        sessions, engine_ids = [], []
        for i in range(num_engines):
            hello = validated_hello(f"e-{i:05d}", POOL)
            session = await controller.open_stream(hello, identity="anonymous")
            controller.ingest(session, validate_batch(geometric_batch(1, rng, num=20), hello.limits))
            sessions.append(session)
            engine_ids.append(hello.engine_id)
        stop_drain = asyncio.Event()
        drain = asyncio.create_task(_drain(sessions, stop_drain))
        await controller.flush_pending()
        rows = []
        for label, part in (("one pass", num_engines), (f"in parts of {controller_module.REDECIDE_PART}",
                                                                  controller_module.REDECIDE_PART)):
            rows.append((label, *await _changes(controller, engine_ids, changes, part, first=len(rows) * changes)))
            await controller.flush_pending()
        stop_drain.set()
        await drain
        writer.cancel()
        await store.close()
    print(f"{num_engines:,} engines in one pool, {changes} fleet δ changes each way (each re-decides every engine); "
          f"the loop's lag from a task sleeping {LAG_PERIOD_S * 1e3:g} ms")
    print(f"{'way':<22} {'set_override p50 ms':>19} {'max ms':>7} {'loop lag max ms':>16} {'p99 ms':>7} "
          f"{'full GCs':>8} {'longest ms':>10}")
    for label, calls, lags, collections in rows:
        print(f"{label:<22} {np.median(calls) * 1e3:19.1f} {max(calls) * 1e3:7.1f} {max(lags) * 1e3:16.1f} "
              f"{np.percentile(lags, 99) * 1e3:7.1f} {len(collections):8d} {max(collections, default=0) * 1e3:10.1f}")
    (_, calls0, lags0, _), (_, calls1, lags1, _) = rows
    print(f"ratio in parts / one pass: longest loop lag {max(lags1) / max(lags0):.3f}, "
          f"set_override p50 {np.median(calls1) / np.median(calls0):.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engines", type=int, default=5_000)
    parser.add_argument("--changes", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="200 engines, 2 changes: the same code paths")
    args = parser.parse_args()
    asyncio.run(main(200, 2) if args.smoke else main(args.engines, args.changes))
