"""What the fleet-wide watch's look for history streams costs the store: the history index against a SCAN.

Run: `.venv/bin/python benchmarks/history_streams.py [--keys 200000] [--pools 20]` (`--smoke`: 2,000 keys, 3
pools, 3 calls each: the same code paths in a few seconds). An embedded redis-server
holds `--pools` pools' history streams (written through the store, so indexed) among `--keys` other keys
under the same prefix (statistics-bucket keys, the bulk of a large fleet's store). Printed side by
side, medians of 20 calls: `RedisStore.history_streams()` (the index: what the follower runs every 5 s)
against `history_streams(scan=True)` (the index and a SCAN: every 5 minutes, and what every 5 s cost before
the index), wall time and the redis-server's CPU time per call (`INFO cpu`), with their ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: testbench's messages

from controlplane.store import DecisionWrite, EmbeddedRedis, KeySpace, create_store
from testbench.messages import make_decision

CALLS = 20
SMOKE = (2_000, 3, 3)  # (keys, pools, calls) of --smoke


async def _server_cpu_s(raw: redis.asyncio.Redis) -> float:
    info = await raw.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


async def _measure(store, raw: redis.asyncio.Redis, *, scan: bool, calls: int) -> tuple[float, float, int]:
    walls, cpus, found = [], [], 0
    for _ in range(calls):
        cpu0, wall0 = await _server_cpu_s(raw), time.perf_counter()
        found = len(await store.history_streams(scan=scan))
        walls.append(time.perf_counter() - wall0)
        cpus.append(await _server_cpu_s(raw) - cpu0)
    return statistics.median(walls) * 1e3, statistics.median(cpus) * 1e3, found


async def main(keys: int, pools: int, calls: int = CALLS) -> None:
    prefix = "bench"
    with tempfile.TemporaryDirectory() as tmp, EmbeddedRedis(Path(tmp) / "redis") as server:
        # A client of our own beside the store's: the other keys are written raw, and INFO reads the server's CPU.
        async with create_store(server.url, prefix=prefix, engine_retention_s=7 * 24 * 3600.0) as store, \
                redis.asyncio.Redis.from_url(server.url) as raw:
            space = KeySpace(prefix)
            for start in range(0, keys, 10_000):
                async with raw.pipeline(transaction=False) as pipe:
                    for i in range(start, min(start + 10_000, keys)):
                        pipe.set(space.pool_contribution(f"pool-{i % pools}|gpu", i), b"x")
                    await pipe.execute()
            await store.put_decisions([DecisionWrite(f"engine-{p}", f"pool-{p}|gpu", make_decision(1))
                                       for p in range(pools)])
            index_ms, index_cpu_ms, index_found = await _measure(store, raw, scan=False, calls=calls)
            scan_ms, scan_cpu_ms, scan_found = await _measure(store, raw, scan=True, calls=calls)
    print(f"{keys:,} other keys, {pools} pools' history streams; medians of {calls} calls")
    print(f"{'what':40s} {'wall ms':>9s} {'server CPU ms':>14s} {'streams':>8s}")
    print(f"{'history index (every 5 s)':40s} {index_ms:9.2f} {index_cpu_ms:14.2f} {index_found:8d}")
    print(f"{'index + SCAN (every 5 min; before: 5 s)':40s} {scan_ms:9.2f} {scan_cpu_ms:14.2f} {scan_found:8d}")
    print(f"ratio index / SCAN: wall {index_ms / scan_ms:.4f}, server CPU "
          f"{index_cpu_ms / scan_cpu_ms if scan_cpu_ms > 0 else float('nan'):.4f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--pools", type=int, default=20)
    parser.add_argument("--smoke", action="store_true", help="2,000 keys, 3 pools, 3 calls: the same code paths")
    args = parser.parse_args()
    asyncio.run(main(*SMOKE) if args.smoke else main(args.keys, args.pools))
