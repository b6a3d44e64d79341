"""Pools keyed by KV-transfer role (disaggregated prefill/decode): the key and its wire forms, the Hello's role,
the fleet state machine keeping a model's prefill, decode and whole engines in pools of their own (statistics,
overrides, decisions), the agent's reading of vLLM's config, and how `ctl` shows a role."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2
from controlplane.cli.args import parse_pool
from controlplane.cli.explain import explain, explain_rows
from controlplane.cli.output import message_to_dict, scope_text
from controlplane.cli.rows import engine_row, list_cells
from controlplane.core.batch_size import occupancy_batch_size
from controlplane.core.types import PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.fleet import FleetState
from controlplane.loop.ingest import EngineHello, TelemetryError, validate_hello
from controlplane.loop.overrides import resolve_intent
from controlplane.protocol import (
    KvRole,
    Mode,
    make_pool_key,
    pool_key_of,
    pool_key_of_message,
    pool_of_key,
)
from controlplane.service.fleet_view import decision_view, engine_info, engine_info_from_registry, registry_fields
from controlplane.service.scopes import known_pools, unknown_scope
from controlplane.sim.profiles import H200_QWEN3_8B
from controlplane.store.keys import pool_key, scope_key
from testbench.fleet_drive import LIMITS, Workload, synthetic_batch

MODEL, ACCELERATOR = "Qwen/Qwen3-8B", "NVIDIA H200"
CONSUMER_POOL = common_pb2.Pool(model=MODEL, accelerator=ACCELERATOR, kv_role=common_pb2.KV_ROLE_CONSUMER)
START_S = 100_000.0


def test_an_engine_without_a_role_keeps_its_key_and_each_role_gets_its_own() -> None:
    assert pool_key_of(MODEL, ACCELERATOR) == make_pool_key(MODEL, ACCELERATOR) == "Qwen/Qwen3-8B|NVIDIA H200"
    assert make_pool_key(MODEL, ACCELERATOR, KvRole.CONSUMER) == "Qwen/Qwen3-8B|NVIDIA H200|consumer"
    for wire in (common_pb2.KV_ROLE_UNSPECIFIED, common_pb2.KV_ROLE_PRODUCER, common_pb2.KV_ROLE_CONSUMER,
                 common_pb2.KV_ROLE_BOTH):
        pool = common_pb2.Pool(model=MODEL, accelerator=ACCELERATOR, kv_role=wire)
        assert pool_of_key(pool_key_of_message(pool)) == pool
        assert pool_key(pool) == pool_key_of_message(pool)  # the store's key is the same key
    assert scope_key(operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=CONSUMER_POOL)) == (
        "pool:Qwen/Qwen3-8B|NVIDIA H200|consumer")
    with pytest.raises(ValueError, match="kv_role 'decode' is not one of"):
        make_pool_key(MODEL, ACCELERATOR, "decode")
    with pytest.raises(ValueError, match="kv_role must be"):
        pool_key(common_pb2.Pool(model=MODEL, accelerator=ACCELERATOR, kv_role=9))
    assert pool_key_of_message(common_pb2.Pool(model="m", accelerator="a", kv_role=9)) == "m|a|kv_role_9"  # no pool's


def _hello(kv_role: int = common_pb2.KV_ROLE_UNSPECIFIED) -> agent_pb2.Hello:
    return agent_pb2.Hello(engine_id="e-1", pool=common_pb2.Pool(model=MODEL, accelerator=ACCELERATOR, kv_role=kv_role),
                           limits=agent_pb2.EngineLimits(max_num_seqs=8, max_num_batched_tokens=512,
                                                         kv_capacity_tokens=4096, block_size_tokens=16,
                                                         max_model_len_tokens=1024))


def test_the_hello_carries_the_role_into_the_pool_key_and_the_limits_the_policy_reads() -> None:
    old = validate_hello(_hello())  # an agent that does not know the field
    assert (old.kv_role, old.pool_key, old.limits.kv_role) == (KvRole.NONE, "Qwen/Qwen3-8B|NVIDIA H200", KvRole.NONE)
    decode = validate_hello(_hello(common_pb2.KV_ROLE_CONSUMER))
    assert (decode.kv_role, decode.limits.kv_role) == (KvRole.CONSUMER, KvRole.CONSUMER)
    assert decode.pool_key == "Qwen/Qwen3-8B|NVIDIA H200|consumer" and decode.pool == CONSUMER_POOL
    with pytest.raises(TelemetryError, match=r"hello\.pool\.kv_role: must be unset, producer, consumer or") as info:
        validate_hello(_hello(7))
    assert info.value.cause == "bad_hello"


# ------------------------------------------------------------------------------------ the fleet state machine

# What each engine serves: the whole engine and the decode instance the same lengths; the prefill instance the
# same prompts, each ending at its first token.
WHOLE = Workload(prompt_mean_tokens=512.0, output_mean_tokens=256.0, per_second=100)
PREFILL = Workload(prompt_mean_tokens=512.0, output_mean_tokens=1.0, per_second=100, running=40)
ROLES = {"whole": KvRole.NONE, "prefill": KvRole.PRODUCER, "decode": KvRole.CONSUMER}


def _drive(engines: dict[str, KvRole], *, seconds: int = 20,
           overrides: list[operator_pb2.OverrideRecord] = ()) -> FleetState:
    """The engines (id → role) of one model and accelerator through a FleetState, second by second, as the
    controller feeds it (each engine's random stream depends on its id only); every pool calibrated."""
    loop = DecisionLoopConfig(recompute_completions=1_000_000, interval_s=2.0, ttl_s=60.0)
    fleet = FleetState(loop, PolicyConfig(min_samples=400, cooldown_s=0.0), replica_id="t")
    for role in KvRole:
        fleet.set_calibration(pool_key_of(MODEL, ACCELERATOR, role), H200_QWEN3_8B, START_S, refresh=False)
    fleet.set_overrides(list(overrides), START_S)
    streams = {e: object() for e in engines}
    for engine_id, role in engines.items():
        hello = EngineHello(engine_id=engine_id, model=MODEL, accelerator=ACCELERATOR, vllm_version="0.32.0",
                            agent_version="t", limits=LIMITS, block_size_tokens=16, kv_role=role)
        fleet.attach(hello, identity="t", epoch=1, stream=streams[engine_id], now_s=START_S)
        fleet.first_decision(engine_id, streams[engine_id], START_S)
    rngs = {e: np.random.default_rng(zlib.crc32(e.encode())) for e in engines}
    for t in range(1, seconds + 1):
        now_s = START_S + t
        for key in fleet.pool_keys():
            fleet.close_bucket(key, now_s)
            if fleet.refresh_due(key, now_s) is not None:
                fleet.refresh_pool(key, now_s)
        for engine_id, role in engines.items():
            workload = PREFILL if role is KvRole.PRODUCER else WHOLE
            fleet.batch(engine_id, streams[engine_id], synthetic_batch(workload, t, rngs[engine_id]), now_s)
        fleet.tick(now_s)
    return fleet


def test_a_models_prefill_decode_and_whole_engines_are_three_pools_each_decided_by_its_role() -> None:
    fleet = _drive(ROLES)
    assert sorted(fleet.pool_keys()) == ["Qwen/Qwen3-8B|NVIDIA H200", "Qwen/Qwen3-8B|NVIDIA H200|consumer",
                                         "Qwen/Qwen3-8B|NVIDIA H200|producer"]
    estimates = {e: fleet.pool(fleet.engine(e).loop.hello.pool_key).stats.estimate for e in ROLES}
    # The statistics never mix: the prefill instance's one-token outputs stay in its pool.
    assert estimates["prefill"].fit.stats.mu_o_tokens == 1.0
    assert estimates["decode"].fit.stats.mu_o_tokens == pytest.approx(256.0, rel=0.1)
    assert estimates["whole"].fit.stats.mu_o_tokens == pytest.approx(256.0, rel=0.1)
    decisions = {e: fleet.engine(e).loop.current for e in ROLES}
    assert (decisions["whole"].mode, decisions["whole"].reason) == (common_pb2.MODE_EB, "crossover_eb")
    decode, prefill = decisions["decode"], decisions["prefill"]
    assert (decode.mode, decode.reason, decode.k) == (common_pb2.MODE_MB, "kv_consumer", 1)
    stats = estimates["decode"].fit.stats
    assert decode.n == occupancy_batch_size(
        mu_l_tokens=stats.mu_l_tokens, mu_o_tokens=stats.mu_o_tokens, sigma_o_tokens=stats.sigma_o_tokens,
        kv_capacity_tokens=float(LIMITS.kv_capacity_tokens), oom_tolerance=0.01, max_num_seqs=LIMITS.max_num_seqs).n
    assert decode.n < LIMITS.max_num_seqs and decode.budget == decisions["whole"].budget
    assert (prefill.mode, prefill.reason, prefill.n, prefill.k) == (common_pb2.MODE_MB, "kv_producer",
                                                                     LIMITS.max_num_seqs, 1)
    assert prefill.budget.b_cap_tokens == prefill.budget.b_max_tokens
    assert "eb_moot" in decode.flags and "eb_moot" in prefill.flags and "eb_moot" not in decisions["whole"].flags


def test_an_engine_without_a_role_is_decided_exactly_as_without_the_role_engines_beside_it() -> None:
    alone = _drive({"whole": KvRole.NONE}).engine("whole").loop
    beside = _drive(ROLES).engine("whole").loop
    assert beside.current == alone.current and beside.latest == alone.latest


def test_a_pool_scope_names_its_role() -> None:
    def pin(pool: common_pb2.Pool) -> operator_pb2.OverrideRecord:
        return operator_pb2.OverrideRecord(scope=operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=pool),
                                           kind=operator_pb2.OVERRIDE_KIND_PIN, mode=operator_pb2.PINNED_MODE_EB)

    decode_pin = pin(CONSUMER_POOL)
    keys = {role: pool_key_of(MODEL, ACCELERATOR, role) for role in KvRole}
    assert {role: resolve_intent([decode_pin], engine_id="e", pool_key=key, now_s=0.0).pin.mode
            for role, key in keys.items()} == {KvRole.NONE: None, KvRole.PRODUCER: None,
                                                KvRole.CONSUMER: Mode.EB, KvRole.BOTH: None}
    fleet = _drive(ROLES, seconds=4, overrides=[decode_pin])
    decode = fleet.engine("decode").loop.current
    assert (decode.mode, decode.reason) == (common_pb2.MODE_EB, "operator_pin") and "eb_moot" in decode.flags
    assert fleet.engine("whole").loop.current.reason != "operator_pin"
    infos = [engine_info(fleet, e, fleet.engine(e), now_s=START_S) for e in ROLES]
    assert known_pools(infos) == sorted(keys[role] for role in ROLES.values())
    producer_scope = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=pool_of_key(keys[KvRole.BOTH]))
    assert "has no engine" in unknown_scope(producer_scope, infos)
    assert unknown_scope(decode_pin.scope, infos) is None


def test_ctl_list_and_explain_show_the_role() -> None:
    fleet = _drive(ROLES, seconds=20)
    info = engine_info(fleet, "decode", fleet.engine("decode"), now_s=START_S + 20)
    assert info.pool == CONSUMER_POOL
    other_replica = engine_info_from_registry("decode", registry_fields(info, now_s=START_S), now_s=START_S)
    assert other_replica.pool == CONSUMER_POOL  # the registry entry keeps the role
    view = decision_view(fleet, "decode")
    row = engine_row(info, view)
    assert list_cells(row)[1] == "Qwen/Qwen3-8B|NVIDIA H200|consumer"
    data = explain(view)
    assert data["role"]["kv_role"] == "consumer" and "N still caps admission" in data["role"]["text"]
    assert data["rule"]["text"].startswith("moot on a consumer") and data["pool_key"].endswith("|consumer")
    assert ("role", data["role"]["text"]) in [(symbol, value) for symbol, value, _, _ in explain_rows(data)]
    whole = explain(decision_view(fleet, "whole"))
    assert whole["role"] is None and "role" not in [row[0] for row in explain_rows(whole)]
    prefill = explain(decision_view(fleet, "prefill"))
    assert "B_max in every step" in prefill["role"]["text"]


def test_the_cli_takes_a_pool_with_or_without_its_role() -> None:
    assert parse_pool("Qwen/Qwen3-8B|NVIDIA H200|consumer") == CONSUMER_POOL
    assert parse_pool("m|a") == common_pb2.Pool(model="m", accelerator="a")
    with pytest.raises(Exception, match="ROLE: producer, consumer or both"):
        parse_pool("m|a|decode")
    scope = operator_pb2.Scope(kind=operator_pb2.SCOPE_KIND_POOL, pool=CONSUMER_POOL)
    assert scope_text(scope) == "pool:Qwen/Qwen3-8B|NVIDIA H200|consumer"
    assert message_to_dict(CONSUMER_POOL)["kv_role"] == "consumer"


# --------------------------------------------------------------------------------------------------- the agent


def test_the_agent_reads_the_role_from_vllms_kv_transfer_config() -> None:
    from vllm.config import KVTransferConfig

    from agents.config import engine_kv_role

    assert engine_kv_role(None) == KvRole.NONE
    assert engine_kv_role(KVTransferConfig()) == KvRole.NONE  # no connector: no role
    for vllm_role, role in (("kv_producer", KvRole.PRODUCER), ("kv_consumer", KvRole.CONSUMER),
                            ("kv_both", KvRole.BOTH)):
        assert engine_kv_role(KVTransferConfig(kv_connector="ExampleConnector", kv_role=vllm_role)) == role
