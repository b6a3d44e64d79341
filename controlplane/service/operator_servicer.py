"""OperatorService (thin): validate, call the controller or read the store, encode; errors become status codes.

Validation here is about the request's shape (an explicit scope, bounds of k and n, a complete pool); the
controller validates values (δ range, pin mode). Error messages echo at most a bounded prefix of the input
(`protocol.bounded`). Status codes: INVALID_ARGUMENT for a bad request, NOT_FOUND for a missing decision,
calibration or override, UNAVAILABLE when the store cannot take or give what was asked.
A change on a pool or engine scope that covers no engine of the fleet is made, and answered with a warning
naming the known pools (`scopes.unknown_scope_warning`).
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator, Callable
from typing import NoReturn

import grpc
from google.protobuf.message import DecodeError

from controlplane.api.v1 import common_pb2, operator_pb2, operator_pb2_grpc
from controlplane.loop.overrides import SCOPE_RANK, OverrideError, check_kind, check_reason, expiry_at
from controlplane.loop.rollout import Verdict as RolloutVerdict
from controlplane.protocol import (
    bounded,
    is_valid_engine_id,
    kv_role_name,
    make_pool_key,
    pool_key_of_message,
    pool_of_key,
)
from controlplane.service.auth import OPERATOR_PREFIX, Authenticator
from controlplane.service.controller import Controller
from controlplane.service.fleet_view import (
    engine_infos_yielding,
    merge_engine_infos_yielding,
    rollout_view,
    rollouts_response,
    stored_decision_view,
)
from controlplane.service.fleet_watch import SharedFollower
from controlplane.service.read_gate import ReadGate
from controlplane.service.rollout_sharing import add_peer_views, peer_views
from controlplane.service.scopes import scope_is_known, unknown_scope_warning
from controlplane.service.shared_reads import SharedReads
from controlplane.store import Store, StoreUnavailable, pool_key, scope_key
from controlplane.store.cooperative import map_yielding
from controlplane.store.keys import override_kind_name

logger = logging.getLogger(__name__)

DEFAULT_LIST_LIMIT = 100
# How long ListEngines / GetDecision wait for the store's fleet-wide view before answering with this
# replica's own engines (a hanging store must not hang the operator).
FLEET_READ_TIMEOUT_S = 2.0
MAX_LIST_LIMIT = 10_000
# At most this many per-engine warnings are listed on an override; the rest are counted.
MAX_WARNINGS = 20
_MAX_MESSAGE_CHARS = 400

_EXPLICIT_SCOPE = ("give an explicit scope: SCOPE_KIND_FLEET, SCOPE_KIND_POOL with a pool, or SCOPE_KIND_ENGINE "
                   "with an engine_id (an unspecified scope is not taken to mean the fleet)")


class OperatorServicer(operator_pb2_grpc.OperatorServiceServicer):
    """The operator API over one controller replica and the shared store."""

    def __init__(self, controller: Controller, authenticator: Authenticator, *, store: Store) -> None:
        """
        Args:
            controller: overrides, calibrations, decisions and engines of this replica.
            authenticator: resolves the caller's identity (recorded as set_by and in the audit).
            store: the shared store, read for the overrides in force, the audit, the decision history and
                stored calibrations (which every replica writes).
        """
        self._controller = controller
        self._auth = authenticator
        self._store = store
        self._follower = SharedFollower(controller, store)  # other replicas' decisions for the watchers
        self._reads = ReadGate()  # reads that scale with the fleet or the history: bounded per caller
        self._shared = SharedReads()  # ... and shared by the callers asking at once

    def _actor(self, context: grpc.aio.ServicerContext) -> str:
        return self._auth.identity(context, OPERATOR_PREFIX)

    async def _change(self, context: grpc.aio.ServicerContext, action):
        try:
            return await action
        except (OverrideError, ValueError) as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except StoreUnavailable as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE,
                         f"not applied, it could not be made durable: {exc}")

    async def _set(self, context: grpc.aio.ServicerContext, request, kind: int, *,
                   warnings: Callable[[], list[str]] | None = None, **fields) -> operator_pb2.OverrideRecord:
        """Store the override of `kind` a Set/Pin request describes (its scope, expiry and reason, and `fields`),
        answered with the scope's warnings and, once stored, those `warnings()` gives."""
        await _check_scope(context, request.scope)
        record = operator_pb2.OverrideRecord(
            scope=request.scope, kind=kind, expires_at_s=await self._expiry(context, request.expires_in_s),
            reason=request.reason, **fields)
        stored = await self._change(context, self._controller.set_override(record, actor=self._actor(context)))
        return with_warnings(stored, [*await self._scope_warnings(request.scope), *(warnings() if warnings else ())])

    async def SetDelta(self, request: operator_pb2.SetDeltaRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> operator_pb2.OverrideRecord:
        return await self._set(context, request, operator_pb2.OVERRIDE_KIND_DELTA,
                               delta_s_per_token=request.delta_s_per_token)

    async def PinMode(self, request: operator_pb2.PinModeRequest,  # noqa: N802
                      context: grpc.aio.ServicerContext) -> operator_pb2.OverrideRecord:
        return await self._set(context, request, operator_pb2.OVERRIDE_KIND_PIN, mode=request.mode, k=request.k,
                               n=request.n, warnings=lambda: pin_warnings(request, self._controller.engine_infos()))

    async def SetObjective(self, request: operator_pb2.SetObjectiveRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> operator_pb2.OverrideRecord:
        return await self._set(context, request, operator_pb2.OVERRIDE_KIND_OBJECTIVE, objective=request.objective)

    async def ClearOverride(self, request: operator_pb2.ClearOverrideRequest,  # noqa: N802
                            context: grpc.aio.ServicerContext) -> operator_pb2.OverrideRecord:
        await _check_scope(context, request.scope)
        try:
            check_kind(request.kind)
            check_reason(request.reason)
        except OverrideError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        key = scope_key(request.scope)
        in_force = await self._in_force(context)
        if not any(r.kind == request.kind and scope_key(r.scope) == key for r in in_force):
            kind = override_kind_name(request.kind)
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"no {kind} override in force at scope {bounded(key)}")
        cleared = await self._change(context, self._controller.clear_override(
            request.scope, request.kind, actor=self._actor(context), reason=request.reason))
        return with_warnings(cleared, await self._scope_warnings(request.scope))

    async def ListRollouts(self, request: operator_pb2.ListRolloutsRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> operator_pb2.ListRolloutsResponse:
        """This replica's rollouts and recent verdicts, with the other replicas' rollouts in progress and verdicts
        (from the store, as of their latest write; this replica's alone when the store does not answer in time)."""
        response = rollouts_response(self._controller.fleet)
        try:
            stored = await asyncio.wait_for(self._store.list_rollouts(), timeout=FLEET_READ_TIMEOUT_S)
        except (StoreUnavailable, TimeoutError) as exc:
            logger.warning("ListRollouts answers with this replica's rollouts only: %s", exc)
            return response
        add_peer_views(response, peer_views(stored, self._controller.controller_id))
        return response

    async def SteerRollout(self, request: operator_pb2.SteerRolloutRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> operator_pb2.RolloutView:
        key = await _pool_key(context, request.pool)
        verdict = _STEER.get(request.action)
        if verdict is None:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         "action must be ROLLOUT_ACTION_PROMOTE or ROLLOUT_ACTION_ABORT")
        try:
            ended = self._controller.steer_rollout(key, verdict, actor=self._actor(context), reason=request.reason)
        except OverrideError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if ended is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"no rollout in progress for pool {bounded(key)} on "
                         f"this replica")
        return rollout_view(key, ended.rollout, self._controller.fleet, ended=ended)

    async def ListOverrides(self, request: operator_pb2.ListOverridesRequest,  # noqa: N802
                            context: grpc.aio.ServicerContext) -> operator_pb2.ListOverridesResponse:
        overrides = await self._in_force(context)
        overrides.sort(key=lambda r: (r.kind, SCOPE_RANK.get(r.scope.kind, 0), scope_key(r.scope)))
        return operator_pb2.ListOverridesResponse(overrides=overrides)

    async def ListAudit(self, request: operator_pb2.ListAuditRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> operator_pb2.ListAuditResponse:
        limit = await _limit(context, request.limit)
        try:
            rows = await self._store.read_audit(limit)
        except StoreUnavailable as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"audit not readable: {exc}")
        return operator_pb2.ListAuditResponse(entries=[audit_entry(row) for row in rows])

    async def ListHistory(self, request: operator_pb2.ListHistoryRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> operator_pb2.ListHistoryResponse:
        limit = await _limit(context, request.limit)
        wanted_pool = ""
        if request.pool.model or request.pool.accelerator:
            wanted_pool = await _pool_key(context, request.pool)
        filtered = bool(wanted_pool or request.engine_id)
        async with self._reads.slot(context, self._actor(context), "ListHistory"):
            try:
                # A filter is applied to the newest MAX_LIST_LIMIT entries: the stream has no index by engine.
                count = MAX_LIST_LIMIT if filtered else limit
                rows = await self._shared.read(("history", count, None),
                                               lambda: self._store.read_history(count))
            except StoreUnavailable as exc:
                await _abort(context, grpc.StatusCode.UNAVAILABLE, f"history not readable: {exc}")
            kept = [row for row in rows if row.get("decision") is not None
                    and not (wanted_pool and row.get("pool") != wanted_pool)
                    and not (request.engine_id and row.get("engine_id") != request.engine_id)][:limit]
            return operator_pb2.ListHistoryResponse(entries=await map_yielding(history_entry, kept))

    async def ListLatencyHistory(self, request: operator_pb2.ListLatencyHistoryRequest,  # noqa: N802
                                 context: grpc.aio.ServicerContext) -> operator_pb2.ListLatencyHistoryResponse:
        limit = await _limit(context, request.limit)
        if not (request.pool.model or request.pool.accelerator):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "pool: required (the latencies are kept per pool)")
        key = await _pool_key(context, request.pool)
        since_s, until_s = request.since_s, request.until_s or self._controller.now_s()
        for name, value in (("since_s", since_s), ("until_s", until_s)):
            if not (math.isfinite(value) and value >= 0.0):
                await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{name} must be finite and ≥ 0, got {value}")
        if since_s > until_s:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"since_s ({since_s}) is after until_s ({until_s})")
        async with self._reads.slot(context, self._actor(context), "ListLatencyHistory"):
            try:
                rows = await asyncio.wait_for(self._store.read_latency_history(
                    key, since_s=since_s, until_s=until_s, count=limit), timeout=FLEET_READ_TIMEOUT_S)
            except StoreUnavailable as exc:
                await _abort(context, grpc.StatusCode.UNAVAILABLE, f"latency history not readable: {exc}")
            except TimeoutError:
                await _abort(context, grpc.StatusCode.UNAVAILABLE,
                             f"latency history not readable: the store did not answer within {FLEET_READ_TIMEOUT_S} s")
            samples = await map_yielding(latency_sample, rows)  # thousands parse in tens of ms: not in one go
            return operator_pb2.ListLatencyHistoryResponse(samples=[s for s in samples if s is not None])

    async def GetDecision(self, request: operator_pb2.GetDecisionRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> operator_pb2.DecisionView:
        view = self._controller.decision_view(request.engine_id)
        if view is None and request.engine_id:
            # Held by another replica (or gone): its stored decision.
            try:
                entry = await asyncio.wait_for(self._store.get_decision_entry(request.engine_id),
                                               timeout=FLEET_READ_TIMEOUT_S)
            except (StoreUnavailable, TimeoutError):
                entry = None
            if entry is not None:
                view = stored_decision_view(request.engine_id, *entry)
        if view is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"no decision for engine {bounded(request.engine_id)}")
        return view

    async def ListEngines(self, request: operator_pb2.ListEnginesRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> operator_pb2.ListEnginesResponse:
        key = None
        if request.HasField("pool") and (request.pool.model or request.pool.accelerator):
            key = await _pool_key(context, request.pool)
        async with self._reads.slot(context, self._actor(context), "ListEngines"):
            now_s = self._controller.now_s()
            local = await engine_infos_yielding(self._controller.fleet, now_s=now_s, pool_key=key)
            try:  # the engines other replicas hold
                registry = await asyncio.wait_for(self._shared.read("registry", self._store.list_registry),
                                                  timeout=FLEET_READ_TIMEOUT_S)
            except (StoreUnavailable, TimeoutError) as exc:
                logger.warning("ListEngines answers with this replica's engines only: %s", exc)
                registry = {}
            return operator_pb2.ListEnginesResponse(engines=await merge_engine_infos_yielding(
                local, registry, controller_id=self._controller.controller_id, now_s=now_s, pool_key=key))

    async def WatchDecisions(self, request: operator_pb2.WatchDecisionsRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> AsyncIterator[operator_pb2.DecisionView]:
        wanted_pool = ""
        if request.pool.model or request.pool.accelerator:
            wanted_pool = await _pool_key(context, request.pool)
        if not (math.isfinite(request.since_s) and request.since_s >= 0):
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                         f"since_s must be a finite time ≥ 0 (0: from now), got {request.since_s}")
        queue = self._controller.watch()  # first: nothing pushed while the history is read is missed
        try:
            await self._follower.join(wait_s=FLEET_READ_TIMEOUT_S)
            replayed: dict[str, int] = {}  # engine id → the newest version replayed
            if request.since_s > 0:
                for view in await self._since(context, request, wanted_pool):
                    replayed[view.engine_id] = max(replayed.get(view.engine_id, 0), view.decision.version)
                    yield view
            while True:
                event = await queue.get()
                if wanted_pool and event.pool_key != wanted_pool:
                    continue
                if request.engine_id and event.engine_id != request.engine_id:
                    continue
                if event.decision.version <= replayed.get(event.engine_id, 0):
                    continue
                view = self._controller.decision_view(event.engine_id)
                if view is None:  # an engine held elsewhere (or gone): the view its stored decision gives
                    view = stored_decision_view(event.engine_id, event.pool_key, event.decision)
                view.decision.CopyFrom(event.decision)
                yield view
        finally:
            self._follower.leave()
            self._controller.unwatch(queue)

    async def _since(self, context: grpc.aio.ServicerContext, request: operator_pb2.WatchDecisionsRequest,
                     wanted_pool: str) -> list[operator_pb2.DecisionView]:
        """The decisions decided after request.since_s, oldest first, from the history (OUT_OF_RANGE when
        the newest MAX_LIST_LIMIT entries read do not reach back that far)."""
        async with self._reads.slot(context, self._actor(context), "WatchDecisions since_s"):
            try:
                rows = await self._shared.read(("history", MAX_LIST_LIMIT, wanted_pool or None),
                                               lambda: self._store.read_history(MAX_LIST_LIMIT,
                                                                                pool_key=wanted_pool or None))
            except StoreUnavailable as exc:
                await _abort(context, grpc.StatusCode.UNAVAILABLE, f"history not readable: {exc}")
        entries = await map_yielding(history_entry, [row for row in rows if row.get("decision") is not None])
        if len(entries) >= MAX_LIST_LIMIT and min(e.decided_at_s for e in entries) > request.since_s:
            await _abort(context, grpc.StatusCode.OUT_OF_RANGE,
                         f"cannot resume from since_s={request.since_s:.3f}: the history read reaches back only "
                         f"{MAX_LIST_LIMIT} decisions; list the current decisions and watch from now")
        wanted = [e for e in entries if e.decided_at_s > request.since_s
                  and not (request.engine_id and e.engine_id != request.engine_id)]
        views = await map_yielding(lambda e: stored_decision_view(
            e.engine_id, pool_key_of_message(e.pool), e.decision), wanted)
        views.sort(key=lambda view: (view.decision.decided_at_s, view.decision.version))
        return views

    async def PutCalibration(self, request: operator_pb2.PutCalibrationRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> operator_pb2.Calibration:
        await _pool_key(context, request.calibration.pool)
        calibration = operator_pb2.Calibration()
        calibration.CopyFrom(request.calibration)
        calibration.set_by = self._actor(context)
        calibration.set_at_s = self._controller.now_s()
        return await self._change(context, self._controller.put_calibration(calibration, actor=calibration.set_by))

    async def GetCalibration(self, request: operator_pb2.GetCalibrationRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> operator_pb2.Calibration:
        key = await _pool_key(context, request.pool)
        try:
            calibration = await self._store.get_calibration(request.pool)  # carries source, set_by, set_at_s
        except StoreUnavailable:
            calibration = self._controller.calibration(request.pool)  # this replica's copy, costs only
        if calibration is None:
            await _abort(context, grpc.StatusCode.NOT_FOUND, f"no calibration for pool {bounded(key)}")
        return calibration

    async def _in_force(self, context: grpc.aio.ServicerContext) -> list[operator_pb2.OverrideRecord]:
        try:
            return await self._store.list_overrides(self._controller.now_s())
        except StoreUnavailable as exc:
            await _abort(context, grpc.StatusCode.UNAVAILABLE, f"overrides not readable: {exc}")

    async def _scope_warnings(self, scope: operator_pb2.Scope) -> list[str]:
        """The unknown-scope warning (`scopes.unknown_scope_warning`, as a list of one) when a pool or engine
        scope covers no engine of the fleet: this replica's engines, then the registry's (other replicas');
        when the store does not answer within FLEET_READ_TIMEOUT_S, this replica's alone, and the warning
        says so. An empty list for a known scope or the fleet."""
        local = self._controller.engine_infos()
        if scope_is_known(scope, local):
            return []
        note = ""
        try:
            registry = await asyncio.wait_for(self._shared.read("registry", self._store.list_registry),
                                              timeout=FLEET_READ_TIMEOUT_S)
        except (StoreUnavailable, TimeoutError):
            registry, note = {}, " (this replica's engines only: other replicas' could not be read)"
        engines = await merge_engine_infos_yielding(local, registry, controller_id=self._controller.controller_id,
                                                    now_s=self._controller.now_s())
        warning = unknown_scope_warning(scope, engines)
        return [] if warning is None else [warning + note]

    async def _expiry(self, context: grpc.aio.ServicerContext, expires_in_s: float) -> float:
        try:
            return expiry_at(expires_in_s, self._controller.now_s())
        except OverrideError as exc:
            await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc))


def with_warnings(record: operator_pb2.OverrideRecord, warnings: list[str]) -> operator_pb2.OverrideRecord:
    """A copy of `record` (as stored: without warnings) that carries `warnings` to the caller."""
    answer = operator_pb2.OverrideRecord()
    answer.CopyFrom(record)
    answer.warnings.extend(warnings)
    return answer


def pin_warnings(request: operator_pb2.PinModeRequest, engines: list[operator_pb2.EngineInfo]) -> list[str]:
    """What a pin will not do as asked on the engines (of this replica) in its scope.

    A pinned n above an engine's max_num_seqs is ignored there (the decision is flagged pin_invalid) and a
    pinned k is clamped to the N the engine runs with (at most its max_num_seqs). An engine or pool scope
    that matches no engine known to this replica is reported too: its limits could not be checked.
    """
    scope = request.scope
    if scope.kind == operator_pb2.SCOPE_KIND_ENGINE:
        in_scope = [e for e in engines if e.engine_id == scope.engine_id]
    elif scope.kind == operator_pb2.SCOPE_KIND_POOL:
        in_scope = [e for e in engines if pool_key_of_message(e.pool) == pool_key_of_message(scope.pool)]
    else:
        in_scope = list(engines)
    warnings = []
    for engine in in_scope:
        max_num_seqs = engine.limits.max_num_seqs
        engine_id = bounded(engine.engine_id)
        if request.n > max_num_seqs:
            warnings.append(f"n={request.n} exceeds max_num_seqs={max_num_seqs} of engine {engine_id}: the pin's n "
                            f"is ignored there (flag pin_invalid)")
        if request.k > max_num_seqs:
            warnings.append(f"k={request.k} exceeds max_num_seqs={max_num_seqs} of engine {engine_id}: k is "
                            f"clamped to the engine's N there (at most {max_num_seqs})")
    if len(warnings) > MAX_WARNINGS:
        warnings = [*warnings[:MAX_WARNINGS], f"… and {len(warnings) - MAX_WARNINGS} more"]
    if not in_scope and (request.k or request.n) and scope.kind != operator_pb2.SCOPE_KIND_FLEET:
        warnings.append(f"no engine in scope {bounded(scope_key(scope))} is connected to this controller: k and n "
                        f"were not checked against engine limits")
    return warnings


_STEER = {operator_pb2.ROLLOUT_ACTION_PROMOTE: RolloutVerdict.PROMOTED,
          operator_pb2.ROLLOUT_ACTION_ABORT: RolloutVerdict.ABORTED}


def audit_entry(row: dict[str, str]) -> operator_pb2.AuditEntry:
    """An audit stream entry (`RedisStore.read_audit`) as an AuditEntry."""
    return operator_pb2.AuditEntry(
        id=row.get("id", ""), at_s=_float(row.get("at_s", "")), actor=row.get("actor", ""),
        action=row.get("action", ""), target=row.get("scope", ""), kind=row.get("kind", ""),
        reason=row.get("reason", ""), old_json=row.get("old", ""), new_json=row.get("new", ""),
    )


def history_entry(row: dict) -> operator_pb2.HistoryEntry:
    """A history stream entry (`RedisStore.read_history`, with a parsed decision) as a HistoryEntry."""
    decision: common_pb2.Decision = row["decision"]
    return operator_pb2.HistoryEntry(
        id=row.get("id", ""), engine_id=row.get("engine_id", ""), pool=pool_of_key(str(row.get("pool", ""))),
        decided_at_s=decision.decided_at_s or _float(row.get("decided_at_s", "")), decision=decision,
    )


def latency_sample(row: tuple[float, bytes]) -> operator_pb2.LatencySample | None:
    """A stored latency sample (`RedisStore.read_latency_history`) as a LatencySample; None (logged) when its
    payload does not parse (written by another version, or damaged)."""
    at_s, payload = row
    try:
        return operator_pb2.LatencySample(at_s=at_s, outcomes=operator_pb2.PoolOutcomes.FromString(payload))
    except DecodeError as exc:
        logger.warning("a latency sample at %.3f s does not parse, left out: %s", at_s, exc)
        return None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0


async def _abort(context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    if len(message) > _MAX_MESSAGE_CHARS:
        message = message[:_MAX_MESSAGE_CHARS] + "…"
    await context.abort(code, message)
    raise AssertionError("unreachable: abort raises")  # pragma: no cover


async def _check_scope(context: grpc.aio.ServicerContext, scope: operator_pb2.Scope) -> None:
    if scope.kind == operator_pb2.SCOPE_KIND_UNSPECIFIED:
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"scope: {_EXPLICIT_SCOPE}")
    if scope.kind == operator_pb2.SCOPE_KIND_POOL:
        await _pool_key(context, scope.pool, field="scope.pool")
    elif scope.kind == operator_pb2.SCOPE_KIND_ENGINE and not is_valid_engine_id(scope.engine_id):
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                     f"scope.engine_id {bounded(scope.engine_id)} is not an engine id ([A-Za-z0-9._:-]{{1,128}})")
    elif scope.kind not in SCOPE_RANK:
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                     f"scope.kind {scope.kind} is unknown: {_EXPLICIT_SCOPE}")


async def _pool_key(context: grpc.aio.ServicerContext, pool: common_pb2.Pool, *, field: str = "pool") -> str:
    try:
        make_pool_key(pool.model, pool.accelerator, kv_role_name(pool.kv_role))
        return pool_key(pool)
    except ValueError as exc:
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {exc}")


async def _limit(context: grpc.aio.ServicerContext, limit: int) -> int:
    if limit > MAX_LIST_LIMIT:
        await _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"limit must be ≤ {MAX_LIST_LIMIT}, got {limit}")
    return limit or DEFAULT_LIST_LIMIT
