"""The controller application: owns the store, the gRPC server and the background loops.

start(): Redis (embedded redis-server in data_dir, or the given URL), restore overrides, calibrations
and decisions, start the gRPC server (agent and operator services, health checking, reflection, auth
and TLS), the store flush/readiness loop and the override subscription. stop(): NOT_SERVING, drain the
streams within a grace period, write through pending decisions, close the store, stop embedded Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

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
from controlplane.service.controller import Controller
from controlplane.service.operator_servicer import OperatorServicer
from controlplane.store import EmbeddedRedis, RedisStore, StoreUnavailable

logger = logging.getLogger(__name__)
SERVICE_NAMES = (
    agent_pb2.DESCRIPTOR.services_by_name["AgentService"].full_name,
    operator_pb2.DESCRIPTOR.services_by_name["OperatorService"].full_name,
)


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
        self.store: RedisStore | None = None
        self.controller: Controller | None = None
        self.port = 0

    @property
    def redis_url(self) -> str:
        return self._embedded.url if self._embedded is not None else self.config.redis_url

    async def start(self) -> None:
        config = self.config
        if not config.redis_url:
            assert config.data_dir is not None  # guaranteed by ControllerConfig
            self._embedded = EmbeddedRedis(config.data_dir)
            await asyncio.to_thread(self._embedded.start)
        self.store = RedisStore(self.redis_url)
        kwargs = {"clock": self._clock} if self._clock is not None else {}
        self.controller = Controller(config, store=self.store, tracer=DecisionTracer(self._tracer_provider),
                                     metrics=self.metrics, **kwargs)
        await self.controller.restore()
        authenticator = Authenticator(config.security)
        server = grpc.aio.server(interceptors=[AuthInterceptor(authenticator)])
        agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentServicer(self.controller, self.metrics), server)
        operator_pb2_grpc.add_OperatorServiceServicer_to_server(OperatorServicer(self.controller, authenticator),
                                                                 server)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, server)
        reflection.enable_server_reflection((*SERVICE_NAMES, health.SERVICE_NAME, reflection.SERVICE_NAME), server)
        address = f"{config.host}:{config.port}"
        credentials = server_credentials(config.security)
        self.port = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
        await server.start()
        self._server = server
        await self._set_serving(True)
        if config.metrics_port:
            self.metrics.serve(config.metrics_port, addr=config.host)
        self._tasks = [asyncio.create_task(self._store_loop(), name="store-loop"),
                       asyncio.create_task(self._override_loop(), name="override-loop")]
        logger.info("controller %s listening on %s:%d (redis %s)", config.controller_id, config.host, self.port,
                    self.redis_url)

    async def _set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ("", *SERVICE_NAMES):
            await self._health.set(name, status)

    async def _store_loop(self) -> None:
        """Write through pending decisions, refresh the registry, and turn readiness with the store's health."""
        assert self.controller is not None and self.store is not None
        serving = True
        while True:
            await asyncio.sleep(self.config.store_retry_s)
            if await self.store.ping():
                await self.controller.flush_pending()
            else:
                self.controller.note_store_failure("ping", StoreUnavailable("ping: no answer"))
            down_since = self.controller.store_down_since_s
            healthy = down_since is None or self.controller.now_s() - down_since < self.config.readiness_grace_s
            if healthy != serving:
                serving = healthy
                await self._set_serving(serving)
                logger.warning("readiness %s", "SERVING" if serving else "NOT_SERVING (store unavailable)")

    async def _override_loop(self) -> None:
        """Re-read overrides when another replica changes one (pub/sub)."""
        assert self.controller is not None and self.store is not None
        while True:
            try:
                async for _notice in self.store.watch_overrides():
                    await self.controller.reload_overrides()
            except StoreUnavailable as exc:
                logger.debug("override subscription lost: %s", exc)
            await asyncio.sleep(self.config.store_retry_s)

    async def stop(self, *, grace_s: float = 2.0) -> None:
        await self._set_serving(False)
        if self._server is not None:
            await self._server.stop(grace_s)
        await _cancel_all(self._tasks, timeout_s=grace_s)
        if self.controller is not None and self.store is not None:
            with contextlib.suppress(Exception):
                await self.controller.flush_pending()
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
