"""OperatorService (thin): validate, call the controller, encode; errors become gRPC status codes."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from controlplane.api.v1 import operator_pb2, operator_pb2_grpc
from controlplane.service.auth import OPERATOR_PREFIX, Authenticator
from controlplane.service.controller import Controller, OverrideError
from controlplane.store import StoreUnavailable, pool_key


class OperatorServicer(operator_pb2_grpc.OperatorServiceServicer):
    def __init__(self, controller: Controller, authenticator: Authenticator) -> None:
        self._controller = controller
        self._auth = authenticator

    def _actor(self, context: grpc.aio.ServicerContext) -> str:
        return self._auth.identity(context, OPERATOR_PREFIX)

    async def _change(self, context: grpc.aio.ServicerContext, action):
        try:
            return await action
        except (OverrideError, ValueError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except StoreUnavailable as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, f"override not applied, it could not be made durable: "
                                                             f"{exc}")

    async def SetDelta(self, request: operator_pb2.SetDeltaRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> operator_pb2.OverrideRecord:
        if request.expires_in_s < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "expires_in_s must be ≥ 0")
        record = operator_pb2.OverrideRecord(
            scope=request.scope, kind=operator_pb2.OVERRIDE_KIND_DELTA, delta_s_per_token=request.delta_s_per_token,
            expires_at_s=self._expiry(request.expires_in_s), reason=request.reason,
        )
        return await self._change(context, self._controller.set_override(record, actor=self._actor(context)))

    async def PinMode(self, request: operator_pb2.PinModeRequest,  # noqa: N802
                      context: grpc.aio.ServicerContext) -> operator_pb2.OverrideRecord:
        if request.expires_in_s < 0:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "expires_in_s must be ≥ 0")
        record = operator_pb2.OverrideRecord(
            scope=request.scope, kind=operator_pb2.OVERRIDE_KIND_PIN, mode=request.mode, k=request.k, n=request.n,
            expires_at_s=self._expiry(request.expires_in_s), reason=request.reason,
        )
        return await self._change(context, self._controller.set_override(record, actor=self._actor(context)))

    async def ClearOverride(self, request: operator_pb2.ClearOverrideRequest,  # noqa: N802
                            context: grpc.aio.ServicerContext) -> operator_pb2.OverrideRecord:
        return await self._change(context, self._controller.clear_override(
            request.scope, request.kind, actor=self._actor(context), reason=request.reason))

    async def GetDecision(self, request: operator_pb2.GetDecisionRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> operator_pb2.DecisionView:
        view = self._controller.decision_view(request.engine_id)
        if view is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no decision for engine {request.engine_id!r}")
        return view

    async def ListEngines(self, request: operator_pb2.ListEnginesRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> operator_pb2.ListEnginesResponse:
        pool = request.pool if request.HasField("pool") else None
        return operator_pb2.ListEnginesResponse(engines=self._controller.engine_infos(pool))

    async def WatchDecisions(self, request: operator_pb2.WatchDecisionsRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> AsyncIterator[operator_pb2.DecisionView]:
        wanted_pool = pool_key(request.pool) if request.pool.model or request.pool.accelerator else ""
        queue = self._controller.watch()
        try:
            while True:
                event = await queue.get()
                if wanted_pool and event.pool_key != wanted_pool:
                    continue
                if request.engine_id and event.engine_id != request.engine_id:
                    continue
                view = self._controller.decision_view(event.engine_id)
                if view is not None:
                    view.decision.CopyFrom(event.decision)
                    yield view
        finally:
            self._controller.unwatch(queue)

    async def PutCalibration(self, request: operator_pb2.PutCalibrationRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> operator_pb2.Calibration:
        return await self._change(context, self._controller.put_calibration(request.calibration))

    async def GetCalibration(self, request: operator_pb2.GetCalibrationRequest,  # noqa: N802
                             context: grpc.aio.ServicerContext) -> operator_pb2.Calibration:
        calibration = self._controller.calibration(request.pool)
        if calibration is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no calibration for pool {pool_key(request.pool)!r}")
        return calibration

    def _expiry(self, expires_in_s: float) -> float:
        return self._controller.now_s() + expires_in_s if expires_in_s > 0 else 0.0
