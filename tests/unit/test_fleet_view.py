"""The fleet-wide operator view (`controlplane.service.fleet_view`): registry entries round-trip an
EngineInfo, the merge prefers what this replica holds, and a malformed entry never breaks the list."""

from __future__ import annotations

from controlplane.api.v1 import common_pb2, operator_pb2
from controlplane.service.fleet_view import (
    engine_info_from_registry,
    merge_engine_infos,
    registry_fields,
    stored_decision_view,
)

POOL = common_pb2.Pool(model="Qwen/Qwen3-8B", accelerator="NVIDIA H200")


def _info(engine_id: str, *, controller_id: str = "a", connected: bool = True) -> operator_pb2.EngineInfo:
    return operator_pb2.EngineInfo(
        engine_id=engine_id, pool=POOL, vllm_version="0.32.0", agent_version="1.0", connected=connected,
        telemetry_age_s=2.5, decision_version=7 * 10**9 + 3, acked_version=7 * 10**9 + 2, num_completions=1234,
        num_rejected_events=5, num_sequence_gaps=1, controller_id=controller_id, instance_id="i-1",
        excluded_from_pool=True,
        limits={"max_num_seqs": 256, "max_num_batched_tokens": 8192, "kv_capacity_tokens": 10**6,
                "block_size_tokens": 16, "max_model_len_tokens": 32768})


def test_a_registry_entry_carries_the_engine_info_across_replicas() -> None:
    info = _info("e1")
    fields = registry_fields(info, now_s=1000.0)
    assert all(isinstance(value, str) for value in fields.values())
    back = engine_info_from_registry("e1", fields, now_s=1004.0)
    expected = operator_pb2.EngineInfo()
    expected.CopyFrom(info)
    expected.telemetry_age_s = 6.5  # 2.5 s old when written, read 4 s later
    assert back == expected


def test_this_replica_wins_for_the_engines_it_holds_and_the_registry_shows_the_rest() -> None:
    registry = {
        "e1": registry_fields(_info("e1", controller_id="b"), now_s=0.0),  # stale: e1 is connected here now
        "e2": registry_fields(_info("e2", controller_id="b"), now_s=0.0),  # moved to b; a remembers it
        "e3": registry_fields(_info("e3", controller_id="b"), now_s=0.0),
        "e4": registry_fields(_info("e4", controller_id="a"), now_s=0.0),  # a's own entry: its memory wins
        "e5": {**registry_fields(_info("e5", controller_id="b"), now_s=0.0), "pool": "other|gpu"},
    }
    local = [_info("e1"), _info("e2", connected=False)]
    merged = merge_engine_infos(local, registry, controller_id="a", now_s=1.0)
    by_id = {info.engine_id: info for info in merged}
    assert [info.engine_id for info in merged] == ["e1", "e2", "e3", "e5"]
    assert by_id["e1"].controller_id == "a" and by_id["e2"].controller_id == "b" and by_id["e2"].connected
    assert by_id["e3"].controller_id == "b"
    filtered = merge_engine_infos(local, registry, controller_id="a", now_s=1.0, pool_key="other|gpu")
    assert [info.engine_id for info in filtered] == ["e1", "e2", "e5"]


def test_malformed_registry_fields_fall_back_to_defaults() -> None:
    fields = {"pool": "m|a", "controller_id": "b", "decision_version": "-4", "acked_version": str(1 << 70),
              "num_completions": "many", "last_telemetry_s": "nan", "limits": "1,2,3"}
    info = engine_info_from_registry("e9", fields, now_s=10.0)
    assert info.decision_version == 0 and info.acked_version == 0 and info.num_completions == 0
    assert info.telemetry_age_s == -1.0 and info.limits.max_num_seqs == 0
    assert info.pool == common_pb2.Pool(model="m", accelerator="a") and info.connected
    assert engine_info_from_registry("e0", {}, now_s=0.0).engine_id == "e0"


def test_a_stored_decision_is_viewed_with_its_pool() -> None:
    decision = common_pb2.Decision(version=5, k=3, n=64)
    view = stored_decision_view("e1", "Qwen/Qwen3-8B|NVIDIA H200", decision)
    assert view.pool == POOL and view.decision == decision and not view.HasField("latest")
