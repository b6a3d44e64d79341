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

import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping

from controlplane.api.v1 import agent_pb2, common_pb2, operator_pb2
from controlplane.loop.fleet import FleetState
from controlplane.loop.ingest import EngineSupport
from controlplane.loop.objective import ObjectiveTracker
from controlplane.loop.outcomes import OutcomeSummary
from controlplane.loop.records import EngineRecord
from controlplane.loop.rollout import Ended, Rollout
from controlplane.protocol import (
    MAX_SUPPORT_DETAIL_CHARS,
    MAX_SUPPORT_MISSING,
    MAX_SUPPORT_NAME_CHARS,
    SUPPORT_LEVEL_FROM_NAME,
    SUPPORT_LEVEL_NAMES,
    pool_key_of_message,
    pool_of_key,
)
from controlplane.store.cooperative import map_yielding

_LIMITS = ("max_num_seqs", "max_num_batched_tokens", "kv_capacity_tokens", "block_size_tokens", "max_model_len_tokens")
_COUNTS = ("decision_version", "acked_version", "num_completions", "num_rejected_events", "num_sequence_gaps")


def registry_fields(info: operator_pb2.EngineInfo, *, now_s: float) -> dict[str, str]:
    """The registry entry of a connected engine (`info` from this replica), times in absolute seconds."""
    fields = {
        "pool": pool_key_of_message(info.pool),
        "controller_id": info.controller_id,
        "vllm_version": info.vllm_version,
        "agent_version": info.agent_version,
        "instance_id": info.instance_id,
        "last_telemetry_s": repr(now_s - info.telemetry_age_s) if info.telemetry_age_s >= 0 else "-1.0",
        "excluded_from_pool": "1" if info.excluded_from_pool else "0",
        "limits": ",".join(str(getattr(info.limits, name)) for name in _LIMITS),
    }
    fields.update({name: str(getattr(info, name)) for name in _COUNTS})
    if info.HasField("support") and info.support.level in SUPPORT_LEVEL_NAMES:
        fields["support"] = json.dumps({"level": SUPPORT_LEVEL_NAMES[info.support.level],
                                        "missing": list(info.support.missing), "detail": info.support.detail})
    return fields


def support_message(support: EngineSupport | None) -> agent_pb2.AgentSupport | None:
    """The wire form of a validated support verdict (None: not reported)."""
    if support is None:
        return None
    return agent_pb2.AgentSupport(level=SUPPORT_LEVEL_FROM_NAME[support.level], missing=support.missing,
                                  detail=support.detail)


def _registry_support(text: str | None) -> agent_pb2.AgentSupport | None:
    """The "support" field of a registry entry (JSON written by `registry_fields`); None when absent or not
    readable (a replica of another version), cut to the protocol's bounds."""
    if not text:
        return None
    try:
        data = json.loads(text)
        level = SUPPORT_LEVEL_FROM_NAME[data["level"]]
        missing, detail = data.get("missing", []), data.get("detail", "")
        if not isinstance(missing, list) or not isinstance(detail, str):
            return None
        missing = [str(name)[:MAX_SUPPORT_NAME_CHARS] for name in missing[:MAX_SUPPORT_MISSING]]
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return agent_pb2.AgentSupport(level=level, missing=missing, detail=detail[:MAX_SUPPORT_DETAIL_CHARS])


def _int(text: str | None) -> int:
    try:
        value = int(text or "0")
    except ValueError:
        return 0
    return value if 0 <= value < 1 << 64 else 0


def engine_info_from_registry(engine_id: str, fields: Mapping[str, str], *, now_s: float) -> operator_pb2.EngineInfo:
    """An EngineInfo for an engine another replica holds (connected, as of its last registry refresh)."""
    info = operator_pb2.EngineInfo(
        engine_id=engine_id, pool=pool_of_key(fields.get("pool", "")), connected=True,
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
    support = _registry_support(fields.get("support"))
    if support is not None:
        info.support.CopyFrom(support)
    return info


def merge_engine_infos(local: Iterable[operator_pb2.EngineInfo], registry: Mapping[str, Mapping[str, str]], *,
                       controller_id: str, now_s: float, pool_key: str | None = None) -> list[operator_pb2.EngineInfo]:
    """This replica's engines and the registry's engines of other replicas, sorted by engine id.

    An engine connected here is shown from here; one this replica only remembers (disconnected) is shown
    from another replica's entry when one exists (it moved there). `pool_key` filters the registry's
    entries (the local ones are filtered by the caller).
    """
    merged = {info.engine_id: info for info in local}
    for engine_id, fields in _from_registry(merged, registry, controller_id=controller_id, pool_key=pool_key):
        merged[engine_id] = engine_info_from_registry(engine_id, fields, now_s=now_s)
    return [merged[engine_id] for engine_id in sorted(merged)]


async def merge_engine_infos_yielding(local: Iterable[operator_pb2.EngineInfo],
                                      registry: Mapping[str, Mapping[str, str]], *, controller_id: str,
                                      now_s: float, pool_key: str | None = None) -> list[operator_pb2.EngineInfo]:
    """`merge_engine_infos`, letting the event loop run every few hundred entries (a fleet of thousands)."""
    merged = {info.engine_id: info for info in local}
    wanted = _from_registry(merged, registry, controller_id=controller_id, pool_key=pool_key)
    infos = await map_yielding(lambda item: engine_info_from_registry(item[0], item[1], now_s=now_s), wanted)
    merged.update((info.engine_id, info) for info in infos)
    return [merged[engine_id] for engine_id in sorted(merged)]


def _from_registry(merged: Mapping[str, operator_pb2.EngineInfo], registry: Mapping[str, Mapping[str, str]], *,
                   controller_id: str, pool_key: str | None) -> list[tuple[str, Mapping[str, str]]]:
    """The registry entries to show: other replicas' (this one's memory is fresher), of pool_key when given,
    for engines not connected here."""
    wanted = []
    for engine_id, fields in registry.items():
        if fields.get("controller_id", "") == controller_id:
            continue
        if pool_key is not None and fields.get("pool") != pool_key:
            continue
        mine = merged.get(engine_id)
        if mine is None or not mine.connected:
            wanted.append((engine_id, fields))
    return wanted


def stored_decision_view(engine_id: str, pool_key: str, decision: common_pb2.Decision) -> operator_pb2.DecisionView:
    """The view of an engine this replica does not hold, from its stored decision (no ACK or latest
    computation: those live in the replica that holds the stream)."""
    return operator_pb2.DecisionView(engine_id=engine_id, pool=pool_of_key(pool_key), decision=decision)


def decision_view(fleet: FleetState, engine_id: str) -> operator_pb2.DecisionView | None:
    """The decision view of an engine held here (or restored from the store at start-up); None if unknown."""
    record = fleet.engine(engine_id)
    if record is not None and record.loop.current is not None:
        loop = record.loop
        view = operator_pb2.DecisionView(
            engine_id=engine_id, pool=loop.hello.pool,
            decision=loop.current, acked_version=loop.acked_version, computed_at_s=loop.latest_computed_at_s)
        if loop.latest is not None:
            view.latest.CopyFrom(loop.latest)
            if loop.excluded_from_pool:
                view.latest.flags.append("engine_excluded_from_pool")
            if record.decided_from_own:
                view.latest.flags.append("engine_decided_from_own_statistics")
        summary, tracker = fleet.outcomes_of(engine_id), fleet.objective_for_engine(engine_id)
        pool = fleet.pool(loop.hello.pool_key)
        active = pool.rollouts.active if pool is not None else None
        rollout = active.describe(pool.num_connected) if active is not None else ""
        if summary is not None or tracker is not None or rollout:
            view.outcomes.CopyFrom(outcomes_message(summary, tracker))
            view.outcomes.rollout = rollout
        return view
    restored = fleet.restored.get(engine_id)
    if restored is not None:
        return operator_pb2.DecisionView(engine_id=engine_id, pool=pool_of_key(restored[0]), decision=restored[1])
    return None


def rollout_view(key: str, rollout: Rollout, fleet: FleetState, *, ended: Ended | None = None
                 ) -> operator_pb2.RolloutView:
    """The wire form of a pool's rollout (in progress when `ended` is None)."""
    pool = fleet.pool(key)
    num_engines = pool.num_connected if pool is not None else 0
    return operator_pb2.RolloutView(
        pool=pool_of_key(key), from_mode=rollout.from_mode.value,
        to_mode=rollout.to_mode.value, started_at_s=rollout.started_at_s,
        ended_at_s=ended.ended_at_s if ended is not None else 0.0,
        state=ended.verdict.value if ended is not None else "running", canary_engine_ids=sorted(rollout.canary_ids),
        num_engines=num_engines, detail=ended.detail if ended is not None else rollout.describe(num_engines),
        controller_id=fleet.replica_id, switchback=rollout.switchback, challenge=rollout.challenge)


def rollouts_response(fleet: FleetState) -> operator_pb2.ListRolloutsResponse:
    """This replica's rollouts in progress (by pool) and its pools' recent verdicts (newest first)."""
    response = operator_pb2.ListRolloutsResponse()
    recent = []
    for key in sorted(fleet.pool_keys()):
        rollouts = fleet.pool(key).rollouts
        if rollouts.active is not None:
            response.rollouts.append(rollout_view(key, rollouts.active, fleet))
        recent += [(ended.ended_at_s, key, ended) for ended in rollouts.history]
    for _, key, ended in sorted(recent, key=lambda item: -item[0])[:64]:
        response.recent.append(rollout_view(key, ended.rollout, fleet, ended=ended))
    return response


def outcomes_message(summary: OutcomeSummary | None, tracker: ObjectiveTracker | None) -> operator_pb2.PoolOutcomes:
    """The wire form of a pool's measured latencies (None: none reported) and of its objective's loop."""
    message = operator_pb2.PoolOutcomes()
    if tracker is not None:
        message.objective.CopyFrom(tracker.objective)
        message.objective_state = tracker.state
        message.objective_detail = tracker.detail
    if summary is None:
        return message
    message.window_s = summary.window_s
    for name in ("ttft", "tpot", "queue"):
        quantiles = getattr(summary, name)
        if quantiles.num_requests:
            getattr(message, name).CopyFrom(operator_pb2.LatencyQuantiles(
                num_requests=quantiles.num_requests, p50_s=quantiles.p50_s, p90_s=quantiles.p90_s,
                p99_s=quantiles.p99_s, mean_s=quantiles.mean_s))
    return message


def engine_info(fleet: FleetState, engine_id: str, record: EngineRecord, *, now_s: float) -> operator_pb2.EngineInfo:
    loop = record.loop
    hello = loop.hello
    limits = hello.limits
    return operator_pb2.EngineInfo(
        engine_id=engine_id,
        pool=hello.pool,
        vllm_version=hello.vllm_version, agent_version=hello.agent_version,
        limits={"max_num_seqs": limits.max_num_seqs, "max_num_batched_tokens": limits.max_num_batched_tokens,
                "kv_capacity_tokens": limits.kv_capacity_tokens, "block_size_tokens": hello.block_size_tokens,
                "max_model_len_tokens": limits.max_model_len_tokens},
        connected=record.connected,
        telemetry_age_s=now_s - loop.last_telemetry_s if loop.last_telemetry_s >= 0 else -1.0,
        decision_version=loop.version, acked_version=loop.acked_version,
        num_completions=loop.num_completions, num_rejected_events=loop.num_rejected_events,
        num_sequence_gaps=loop.num_sequence_gaps, controller_id=fleet.replica_id,
        instance_id=hello.instance_id, excluded_from_pool=loop.excluded_from_pool,
        support=support_message(hello.support),
    )


def engine_infos(fleet: FleetState, *, now_s: float, pool_key: str | None = None) -> list[operator_pb2.EngineInfo]:
    """The engines held here (connected or remembered), by id; only `pool_key`'s when given."""
    return [engine_info(fleet, engine_id, record, now_s=now_s) for engine_id, record in _held(fleet, pool_key)]


async def engine_infos_yielding(fleet: FleetState, *, now_s: float,
                                pool_key: str | None = None) -> list[operator_pb2.EngineInfo]:
    """`engine_infos`, letting the event loop run every few hundred engines."""
    return await map_yielding(lambda item: engine_info(fleet, item[0], item[1], now_s=now_s), _held(fleet, pool_key))


def _held(fleet: FleetState, pool_key: str | None) -> list[tuple[str, EngineRecord]]:
    return [(engine_id, record) for engine_id, record in sorted(fleet.engines(), key=lambda item: item[0])
            if pool_key is None or record.loop.hello.pool_key == pool_key]


def registry_chunks(fleet: FleetState, size: int, *, clock: Callable[[], float]) -> Iterator[dict[str, dict[str, str]]]:
    """Registry entries (`registry_fields`) of the engines connected now, `size` at a time, each chunk built
    when asked for: the app's store loop writes one and lets the event loop run before the next (1,000 entries
    at once hold it for about 10 ms). An engine gone meanwhile is skipped."""
    engine_ids = [engine_id for engine_id, record in fleet.engines() if record.connected]
    for start in range(0, len(engine_ids), size):
        now_s = clock()
        chunk = {}
        for engine_id in engine_ids[start:start + size]:
            record = fleet.engine(engine_id)
            if record is not None and record.connected:
                chunk[engine_id] = registry_fields(engine_info(fleet, engine_id, record, now_s=now_s), now_s=now_s)
        yield chunk
