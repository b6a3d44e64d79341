"""The operator's fleet-wide view: engines held by other replicas, from the store's engine registry.

Each replica writes an entry per connected engine into the registry every `registry_ttl_s / 3`
(`registry_fields`), which expires after `registry_ttl_s` without renewal. ListEngines answers with this
replica's engines plus the registry's entries written by other replicas (`merge_engine_infos`); GetDecision
of an engine held elsewhere answers from the engine's stored decision. So every replica, and every worker of
`serve --workers N`, gives the same list, up to the registry's refresh period.

Entries are flat string maps (a Redis hash). A field that does not parse is left at its default: a
replica of another version may write fewer fields.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from controlplane.api.v1 import common_pb2, operator_pb2

_LIMITS = ("max_num_seqs", "max_num_batched_tokens", "kv_capacity_tokens", "block_size_tokens", "max_model_len_tokens")
_COUNTS = ("decision_version", "acked_version", "num_completions", "num_rejected_events", "num_sequence_gaps")


def registry_fields(info: operator_pb2.EngineInfo, *, now_s: float) -> dict[str, str]:
    """The registry entry of a connected engine (`info` from this replica), times in absolute seconds."""
    fields = {
        "pool": f"{info.pool.model}|{info.pool.accelerator}",
        "controller_id": info.controller_id,
        "vllm_version": info.vllm_version,
        "agent_version": info.agent_version,
        "instance_id": info.instance_id,
        "last_telemetry_s": repr(now_s - info.telemetry_age_s) if info.telemetry_age_s >= 0 else "-1.0",
        "excluded_from_pool": "1" if info.excluded_from_pool else "0",
        "limits": ",".join(str(getattr(info.limits, name)) for name in _LIMITS),
    }
    fields.update({name: str(getattr(info, name)) for name in _COUNTS})
    return fields


def _int(text: str | None) -> int:
    try:
        value = int(text or "0")
    except ValueError:
        return 0
    return value if 0 <= value < 1 << 64 else 0


def engine_info_from_registry(engine_id: str, fields: Mapping[str, str], *, now_s: float) -> operator_pb2.EngineInfo:
    """An EngineInfo for an engine another replica holds (connected, as of its last registry refresh)."""
    model, _, accelerator = fields.get("pool", "").partition("|")
    info = operator_pb2.EngineInfo(
        engine_id=engine_id, pool=common_pb2.Pool(model=model, accelerator=accelerator), connected=True,
        vllm_version=fields.get("vllm_version", ""), agent_version=fields.get("agent_version", ""),
        controller_id=fields.get("controller_id", ""), instance_id=fields.get("instance_id", ""),
        excluded_from_pool=fields.get("excluded_from_pool") == "1", telemetry_age_s=-1.0)
    for name in _COUNTS:
        setattr(info, name, _int(fields.get(name)))
    try:
        last_s = float(fields.get("last_telemetry_s", "-1"))
    except ValueError:
        last_s = -1.0
    if math.isfinite(last_s) and last_s >= 0:
        info.telemetry_age_s = max(0.0, now_s - last_s)
    limits = fields.get("limits", "").split(",")
    if len(limits) == len(_LIMITS):
        for name, value in zip(_LIMITS, limits, strict=True):
            setattr(info.limits, name, _int(value))
    return info


def merge_engine_infos(local: Iterable[operator_pb2.EngineInfo], registry: Mapping[str, Mapping[str, str]], *,
                       controller_id: str, now_s: float, pool_key: str | None = None) -> list[operator_pb2.EngineInfo]:
    """This replica's engines and the registry's engines of other replicas, sorted by engine id.

    An engine connected here is shown from here; one this replica only remembers (disconnected) is shown
    from another replica's entry when one exists (it moved there). `pool_key` filters the registry's
    entries (the local ones are filtered by the caller).
    """
    merged = {info.engine_id: info for info in local}
    for engine_id, fields in registry.items():
        if fields.get("controller_id", "") == controller_id:
            continue  # this replica's own entries: its memory is fresher
        if pool_key is not None and fields.get("pool") != pool_key:
            continue
        mine = merged.get(engine_id)
        if mine is None or not mine.connected:
            merged[engine_id] = engine_info_from_registry(engine_id, fields, now_s=now_s)
    return [merged[engine_id] for engine_id in sorted(merged)]


def stored_decision_view(engine_id: str, pool_key: str, decision: common_pb2.Decision) -> operator_pb2.DecisionView:
    """The view of an engine this replica does not hold, from its stored decision (no ACK or latest
    computation: those live in the replica that holds the stream)."""
    model, _, accelerator = pool_key.partition("|")
    return operator_pb2.DecisionView(engine_id=engine_id, pool=common_pb2.Pool(model=model, accelerator=accelerator),
                                     decision=decision)
