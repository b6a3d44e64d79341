"""The controller application: owns the store, the gRPC server and the background tasks.

start(): Redis (embedded redis-server in data_dir, or the given URL), restore overrides, calibrations
and decisions, start the gRPC server (agent and operator services, health checking, reflection, auth
and TLS) and the supervised background tasks:
- scheduler: every 0.25 s, keep-alives, interval recomputes, bucket closes, evictions
  (`Controller.tick`: never waits on the store);
- pools: pool estimate refreshes with the replicas' shared buckets (`Controller.sync_pools`);
- writer: the coalescing, pipelined decision writer;
- store: ping, registry refresh, the embedded server's supervision (restarted from its append-only file
  when it died), readiness;
- overrides: the pub/sub subscription that reloads overrides changed by another replica.
A task that fails is logged, counted (`cp_background_loop_restarts_total{loop}`) and restarted; readiness
is NOT_SERVING while one has failed in the last `_FAILURE_MEMORY_S`, until the store has answered once, and
after `readiness_grace_s` of store outage.

stop(): NOT_SERVING, drain the streams within a grace period, write through pending decisions, close the
store, stop embedded Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.sdk.trace import TracerProvider

from controlplane.api.v1 import agent_pb2, agent_pb2_grpc, operator_pb2, operator_pb2_grpc
from controlplane.observability.metrics import ControllerMetrics
from controlplane.observability.tracing import DecisionTracer
from controlplane.service.agent_servicer import AgentServicer
from controlplane.service.auth import Authenticator, AuthInterceptor, server_credentials
from controlplane.service.config import ControllerConfig
from controlplane.service.controller import SCHEDULER_TICK_S, Controller
from controlplane.service.operator_servicer import OperatorServicer
from controlplane.service.rollout_sharing import peer_rollouts, peer_views, rollout_views
from controlplane.store import EmbeddedRedis, Store, StoreUnavailable, create_store

logger = logging.getLogger(__name__)
SERVICE_NAMES = (
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
    operator_pb2.DESCRIPTOR.services_by_name["OperatorService"].full_name,
)
# Pool buckets are published within this of closing (replicas read each other's 0.5 s after a close).
_POOL_TICK_S = 0.1
_FAILURE_MEMORY_S = 10.0
_RESTART_DELAY_S = 0.5
_MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Calls that reached the server before the event loop took them up. gRPC core's defaults (1,000, hard limit
# 3,000) cancelled 9% of the streams of 2,000 agents that connected at once, as a fleet does after a
# controller restart; a pending call costs a few hundred bytes.
_MAX_PENDING_CALLS = 16_384
# Registry entries written per store call: the event loop runs in between (all 1,000 engines' entries in one
# call held it for 40-74 ms).
_REGISTRY_CHUNK = 100


class ControllerApp:
    """One controller process. Use `async with ControllerApp(...)` or start()/stop()."""

    def __init__(self, config: ControllerConfig, *, tracer_provider: TracerProvider,
                 metrics: ControllerMetrics | None = None, clock: Callable[[], float] | None = None) -> None:
        self.config = config
        self.metrics = metrics or ControllerMetrics()
        self._tracer_provider = tracer_provider
        self._clock = clock
        self._embedded: EmbeddedRedis | None = None
        self._server: grpc.aio.Server | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._health = health.aio.HealthServicer()
        self._serving: bool | None = None
        self._last_failure_s = float("-inf")
        self.store: Store | None = None
        self.controller: Controller | None = None
        self.port = 0

    @property
    def redis_url(self) -> str:
        return self._embedded.url if self._embedded is not None else self.config.redis_url

    async def start(self) -> None:
        config = self.config
        if not config.redis_url:
            if config.data_dir is None:  # pragma: no cover - ControllerConfig guarantees one of the two
                raise ValueError("give a redis_url or a data_dir")
            self._embedded = EmbeddedRedis(config.data_dir)
            await asyncio.to_thread(self._embedded.start)
        self.store = create_store(self.redis_url, engine_retention_s=config.engine_retention_s)
        kwargs = {"clock": self._clock} if self._clock is not None else {}
        self.controller = Controller(config, store=self.store, tracer=DecisionTracer(self._tracer_provider),
                                     metrics=self.metrics, **kwargs)
        await self.controller.restore()
        authenticator = Authenticator(config.security)
        options: list[tuple[str, int]] = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
                                          ("grpc.server.max_pending_requests", _MAX_PENDING_CALLS),
                                          ("grpc.server.max_pending_requests_hard_limit", 2 * _MAX_PENDING_CALLS)]
        if config.max_connection_age_s > 0:
            options += [("grpc.max_connection_age_ms", int(config.max_connection_age_s * 1000)),
                        ("grpc.max_connection_age_grace_ms", 5000)]
        server = grpc.aio.server(interceptors=[AuthInterceptor(authenticator)], options=options)
        agent_pb2_grpc.add_AgentServiceServicer_to_server(
            AgentServicer(self.controller, self.metrics, authenticator), server)
        operator_pb2_grpc.add_OperatorServiceServicer_to_server(
            OperatorServicer(self.controller, authenticator, store=self.store), server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        address = f"{config.host}:{config.port}"
        credentials = server_credentials(config.security)
        self.port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
        await server.start()
        self._server = server
        await self._update_readiness()
        if config.metrics_port:
            self.metrics.serve(config.metrics_port, addr=config.metrics_host)
        self._tasks = [
            asyncio.create_task(self._supervised("scheduler", self._scheduler_loop), name="scheduler"),
            asyncio.create_task(self._supervised("pools", self._pool_loop), name="pools"),
            asyncio.create_task(self._supervised("writer", self.controller.writer.run), name="writer"),
            asyncio.create_task(self._supervised("audit", self.controller.audits.run), name="audit"),
            asyncio.create_task(self._supervised("store", self._store_loop), name="store-loop"),
            asyncio.create_task(self._supervised("overrides", self._override_loop), name="override-loop"),
        ]
        logger.info("controller %s listening on %s:%d (redis %s)", config.controller_id, config.host, self.port,
                    self.redis_url)

    async def _supervised(self, name: str, body: Callable[[], Awaitable[None]]) -> None:
        """Run a background loop forever: an error is logged and counted, and the loop restarts."""
        while True:
            try:
                await body()
                return
            except asyncio.CancelledError:
                raise
            except Exception:
                logger.exception("background loop %r failed; restarting it", name)
                self.metrics.loop_restarts.labels(loop=name).inc()
                self._last_failure_s = time.monotonic()
                await self._update_readiness()
                await asyncio.sleep(_RESTART_DELAY_S)

    async def _update_readiness(self) -> None:
        controller = self.controller
        serving = controller is not None and controller.store_answered
        if serving and controller.store_down_since_s is not None:
            serving = controller.now_s() - controller.store_down_since_s < self.config.readiness_grace_s
        if time.monotonic() - self._last_failure_s < _FAILURE_MEMORY_S:
            serving = False
        if serving == self._serving:
            return
        self._serving = serving
        self.metrics.ready.set(int(serving))
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for service in ("", *SERVICE_NAMES):
            await self._health.set(service, status)
        logger.info("readiness %s", "SERVING" if serving else "NOT_SERVING")

    async def _scheduler_loop(self) -> None:
        if self.controller is None:  # pragma: no cover - started after the controller
            return
        while True:
            self.controller.tick()
            await asyncio.sleep(SCHEDULER_TICK_S)

    async def _pool_loop(self) -> None:
        """Pool estimates: exchange buckets with the other replicas and refit (a slow store only delays this)."""
        if self.controller is None:  # pragma: no cover - started after the controller
            return
        while True:
            await self.controller.sync_pools()
            await asyncio.sleep(_POOL_TICK_S)

    async def _store_loop(self) -> None:
        """Supervise the store: ping, restart a dead embedded server, refresh the registry, readiness."""
        controller, store = self.controller, self.store
        if controller is None or store is None:  # pragma: no cover - started after both
            return
        last_registry_s = float("-inf")
        published: dict[str, bytes] | None = None  # the rollout views last written
        while True:
            if self._embedded is not None and not await asyncio.to_thread(self._embedded.alive):
                logger.warning("the embedded redis-server is gone; restarting it from its append-only file")
                try:
                    await asyncio.to_thread(self._embedded.restart)
                except Exception as exc:
                    logger.error("could not restart the embedded redis-server: %s", exc)
            ok = await store.ping()
            controller.note_store_ping(ok)
            if ok and time.monotonic() - last_registry_s >= self.config.registry_ttl_s / 3:
                try:
                    for chunk in controller.registry_chunks(_REGISTRY_CHUNK):
                        if chunk:
                            await store.heartbeats(chunk, ttl_s=self.config.registry_ttl_s)
                    last_registry_s = time.monotonic()
                    published = None  # renew the rollout views with the registry
                except StoreUnavailable as exc:
                    controller.note_store_failure("heartbeat", exc)
            views = rollout_views(controller.fleet, controller.now_s())
            if ok and views != published:
                try:
                    await store.put_rollouts(controller.controller_id, views, ttl_s=self.config.registry_ttl_s)
                    published = views
                except StoreUnavailable as exc:
                    controller.note_store_failure("put_rollouts", exc)
            if ok:  # the other replicas' rollouts: one owns a pool's, its verdict holds here too
                try:
                    stored = await store.list_rollouts()
                    controller.take_peer_rollouts(peer_rollouts(peer_views(stored, controller.controller_id)))
                except StoreUnavailable as exc:
                    controller.note_store_failure("list_rollouts", exc)
            await self._update_readiness()
            await asyncio.sleep(self.config.store_retry_s)

    async def _override_loop(self) -> None:
        """Re-read overrides when another replica changes one (pub/sub)."""
        controller, store = self.controller, self.store
        if controller is None or store is None:  # pragma: no cover - started after both
            return
        while True:
            try:
                async for _notice in store.watch_overrides():
                    await controller.reload_overrides()
            except StoreUnavailable as exc:
                logger.debug("override subscription lost: %s", exc)
            await asyncio.sleep(self.config.store_retry_s)

    async def stop(self, *, grace_s: float = 2.0) -> None:
        self._serving = None
        if self.controller is not None:
            self.controller.close_all_streams("the controller is shutting down")
        with contextlib.suppress(Exception):
            for service in ("", *SERVICE_NAMES):
                await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        if self._server is not None:
            await self._server.stop(grace_s)
        await _cancel_all(self._tasks, timeout_s=grace_s)
        if self.controller is not None and self.store is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.controller.flush_pending(), timeout=grace_s)
            await self.store.close()
        if self._embedded is not None:
            await asyncio.to_thread(self._embedded.stop)
        self._tracer_provider.force_flush()

    async def __aenter__(self) -> ControllerApp:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()


async def _cancel_all(tasks: list[asyncio.Task[None]], *, timeout_s: float) -> None:
    """Cancel tasks and wait for them, repeating the cancellation: redis-py's pub/sub read can swallow one."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    pending = {t for t in tasks if not t.done()}
    while pending and asyncio.get_running_loop().time() < deadline:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.1)
    for task in tasks:
        if task.done() and not task.cancelled():
            with contextlib.suppress(Exception):
                task.result()
    if pending:
        logger.warning("%d background task(s) did not stop within %.1f s", len(pending), timeout_s)
