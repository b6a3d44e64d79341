"""What only a Redis Cluster or a Sentinel deployment can show: keys spread over slots and nodes, SCAN over
every node, notices broadcast cluster-wide, and a Sentinel failover survived. Real servers, no mocks."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
import redis.asyncio as redis
from redis.crc import key_slot

from controlplane.api.v1 import operator_pb2
from controlplane.store import RESYNC, DecisionWrite, KeySpace, OverrideNotice, StoreUnavailable, create_store
from tests.integration.redis_topologies import Topology, sentinel_master_port, start_sentinel
from tests.integration.store_helpers import (
    FLEET,
    POOL_KEY,
    WAIT_S,
    delta_override,
    make_decision,
    unique_prefix,
    watching,
)

FAILOVER_TIMEOUT_S = 30.0
T = TypeVar("T")


@pytest.fixture
def cluster(redis_cluster: Topology) -> Topology:
    return redis_cluster


@contextlib.asynccontextmanager
async def node_client(port: int) -> AsyncIterator[redis.Redis]:
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        yield client
    finally:
        await client.aclose()

async def until_available(operation: Callable[[], Awaitable[T]], topology: Topology, started_s: float,
                          what: str) -> T:
    """Run `operation` until it no longer raises StoreUnavailable, as a client riding out a failover
    does; fail with the last error and the sentinel's log once FAILOVER_TIMEOUT_S have passed since
    `started_s`."""
    while True:
        try:
            return await operation()
        except StoreUnavailable as err:
            if time.monotonic() - started_s > FAILOVER_TIMEOUT_S:
                raise AssertionError(f"{what} still fails after {FAILOVER_TIMEOUT_S} s: {err}\n"
                                     f"sentinel log:\n{topology.sentinels[0].log_tail()}") from err
        await asyncio.sleep(0.2)


async def keys_on_node(port: int, pattern: str) -> list[bytes]:
    async with node_client(port) as client:
        return [key async for key in client.scan_iter(match=pattern, count=1000)]


def test_each_engine_pool_and_the_operator_records_keep_to_one_slot() -> None:
    keys = KeySpace("cp")
    engine = [keys.decision("engine-7"), keys.epoch("engine-7"), keys.engine("engine-7")]
    assert len({key_slot(k.encode()) for k in engine}) == 1
    for pool in ("Qwen/Qwen3-8B|NVIDIA H200", "m{x}|a}b{", "名前|GPU"):
        pool_keys = [keys.history(pool), keys.pool_snapshot(pool),
                     *(keys.pool_contribution(pool, bucket) for bucket in (0, 60, 1_700_000_000))]
        assert len({key_slot(k.encode()) for k in pool_keys}) == 1, pool
    operator = [keys.override("delta", "fleet"), keys.override("pin", "pool:m{x}|a}"), keys.audit,
                keys.calibration("m{x}|a}"), keys.overrides_channel]
    assert len({key_slot(k.encode()) for k in operator}) == 1
    # engines and pools spread over the slots
    assert len({key_slot(keys.decision(f"engine-{i}").encode()) for i in range(100)}) > 90
    assert len({key_slot(keys.history(f"model-{i}|gpu").encode()) for i in range(100)}) > 90


async def test_a_batch_spreads_over_every_master_and_scan_finds_it_all(cluster: Topology) -> None:
    prefix = unique_prefix()
    writes = [DecisionWrite(f"engine-{i}", f"model-{i % 7}|gpu", make_decision(5)) for i in range(300)]
    async with create_store(cluster.url, prefix=prefix) as store:
        started_s = time.monotonic()
        assert await store.put_decisions(writes) == [True] * 300
        elapsed_s = time.monotonic() - started_s
        per_node = [len(await keys_on_node(s.port, f"{prefix}:decision:*")) for s in cluster.servers]
        assert sum(per_node) == 300 and min(per_node) > 50, per_node
        history_nodes = [len(await keys_on_node(s.port, f"{prefix}:history:*")) for s in cluster.servers]
        assert sum(history_nodes) == 7
        assert set(await store.load_decisions()) == {w.engine_id for w in writes}
        assert len(await store.read_history(1000)) == 300
        assert await store.put_decisions(writes) == [False] * 300
    # pipelined: 300 guarded writes and 300 history entries take a few round trips, not 600
    assert elapsed_s < 5.0


async def test_override_notices_reach_subscribers_on_every_node(cluster: Topology) -> None:
    prefix = unique_prefix()
    async with create_store(cluster.url, prefix=prefix) as writer, \
            create_store(cluster.url, prefix=prefix) as reader, watching(reader) as notices:
        channel = reader.keys.overrides_channel
        clients = [redis.Redis(host="127.0.0.1", port=s.port) for s in cluster.servers]
        pubsubs = [client.pubsub() for client in clients]
        try:
            for pubsub in pubsubs:
                await pubsub.subscribe(channel)
                assert (await pubsub.get_message(timeout=WAIT_S))["type"] == "subscribe"
            await writer.set_override(delta_override(FLEET, 0.001), actor="alice", now_s=1.0)
            assert await asyncio.wait_for(notices.get(), WAIT_S) == OverrideNotice(
                action="set", kind="delta", scope="fleet", actor="alice", at_s=1.0)
            for pubsub in pubsubs:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=WAIT_S)
                assert message is not None and b'"actor": "alice"' in message["data"]
        finally:
            for pubsub in pubsubs:
                await pubsub.aclose()
            for client in clients:
                await client.aclose()


async def test_sentinel_failover_moves_writes_and_notices_to_the_new_master(tmp_path: Path) -> None:
    topology = await asyncio.to_thread(start_sentinel, tmp_path, down_after_ms=1000)
    try:
        master, replica = topology.servers
        async with create_store(topology.url, socket_timeout_s=1.0) as store, \
                create_store(topology.url, socket_timeout_s=1.0) as writer, watching(store) as notices:
            assert await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(1))
            await writer.set_override(delta_override(FLEET, 0.001), actor="before", now_s=1.0)
            assert (await asyncio.wait_for(notices.get(), WAIT_S)).actor == "before"
            async with node_client(master.port) as client:
                assert await client.execute_command("WAIT", 1, 5000) == 1  # replicated before the crash

            await asyncio.to_thread(master.kill)
            started_s = time.monotonic()
            version = 2

            async def written() -> bool:
                nonlocal version
                version += 1
                return await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(version))

            assert await until_available(written, topology, started_s, "a decision write after the crash")
            assert await asyncio.to_thread(sentinel_master_port, topology) == replica.port
            async with node_client(replica.port) as client:
                assert (await client.info("replication"))["role"] == "master"
                assert int(await client.hget(store.keys.decision("engine-a"), "version")) == version
            assert (await store.get_decision("engine-a")).version == version
            [kept] = await store.list_overrides(2.0)
            assert kept.set_by == "before"

            # the watcher lost its connection with the old master and resubscribed on the new one
            assert await asyncio.wait_for(notices.get(), FAILOVER_TIMEOUT_S) == RESYNC

            # the second client's pooled connection still points at the dead master: its first command
            # asks the sentinel again, which may answer "no master" for a moment after the switch
            async def cleared() -> operator_pb2.OverrideRecord | None:
                return await writer.clear_override(FLEET, operator_pb2.OVERRIDE_KIND_DELTA, actor="after",
                                                   reason="x", now_s=3.0)

            await until_available(cleared, topology, time.monotonic(), "the second client's first write")
            notice = await asyncio.wait_for(notices.get(), WAIT_S)
            assert (notice.action, notice.actor) == ("clear", "after")
    finally:
        await asyncio.to_thread(topology.stop)
