"""The agent of an engine whose vLLM failed the start-up probe: it reports, it never steers.

When `agents.vllm.probe` finds an internal missing or changed, the engine runs stock vLLM scheduling for its
whole life: no hook of the agent runs in the scheduler thread. `StockReporter` still opens the link to the
controller, so the fleet sees the engine and why it is stock: its Hello carries the verdict
(`SUPPORT_LEVEL_STOCK`, the internals missing, the problems in one line) and the engine's limits, then the link
sends empty telemetry batches (the idle heartbeat that keeps the stream open; no step, completion or gauge is
read, since reading them needs the internals that may be missing). A decision that arrives anyway (a
controller that does not read the verdict) is never applied: it is answered as not applied, "engine_stock".

The limits are read once, here, at engine start, each from the scheduler when it holds an int there, else from
vLLM's configuration objects; when one cannot be read the engine is not reported at all (a Hello without
limits would be refused by the controller, over and over). Nothing here raises into vLLM and, once built,
nothing holds a reference to the scheduler.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import Any

from agents import __version__
from agents.config import AgentConfig, engine_kv_role
from agents.link import ControllerLink
from agents.recorder import TelemetryRecorder
from agents.vllm.probe import ProbeVerdict, support_message
from controlplane.api.v1 import agent_pb2, common_pb2
from controlplane.protocol import KV_ROLE_TO_PROTO, KvRole

logger = logging.getLogger(__name__)
STOCK_REJECT_REASON = "engine_stock"


class StockReporter:
    """Link to the controller of a stock engine (Hello with the verdict, heartbeats); `close()` at shutdown."""

    def __init__(self, config: AgentConfig, hello: agent_pb2.Hello, verdict: ProbeVerdict) -> None:
        self.hello = hello
        self.verdict = verdict
        self.num_ignored = 0
        self.link = ControllerLink(config, hello=hello, recorder=TelemetryRecorder(capacity=1),
                                   on_decision=self._on_decision)

    @classmethod
    def create(cls, scheduler: Any, config: AgentConfig, verdict: ProbeVerdict) -> StockReporter | None:
        """The started reporter, or None when the engine's limits cannot be read (logged). Never raises."""
        try:
            limits = stock_limits(scheduler)
            if limits is None:
                logger.warning("control-plane agent of engine %s does not report to the controller: the engine's "
                               "limits cannot be read from this vLLM", config.engine_id)
                return None
            kv_role = engine_kv_role(getattr(getattr(scheduler, "vllm_config", None), "kv_transfer_config", None))
            hello = agent_hello(config, limits, verdict, instance_id=uuid.uuid4().hex, started_at_s=time.time(),
                                kv_role=kv_role)
            reporter = cls(config, hello, verdict)
            reporter.link.start()
        except Exception:
            logger.exception("control-plane agent of engine %s could not start its report to the controller",
                             config.engine_id)
            return None
        logger.info("control-plane agent of engine %s reports to %s as stock vLLM (no decision is applied)",
                    config.engine_id, config.controller_address)
        return reporter

    def _on_decision(self, decision: common_pb2.Decision, now_s: float) -> tuple[bool, str]:
        """Link thread: a stock engine applies no decision."""
        self.num_ignored += 1
        return False, STOCK_REJECT_REASON

    def close(self) -> None:
        self.link.stop(timeout_s=2.0)


def agent_hello(config: AgentConfig, limits: agent_pb2.EngineLimits, verdict: ProbeVerdict, *,
                instance_id: str = "", started_at_s: float = 0.0, kv_role: KvRole = KvRole.NONE) -> agent_pb2.Hello:
    """The Hello of this agent: identity, pool (with the engine's KV-transfer role, `agents.config.engine_kv_role`:
    unset without a KV connector, so such an engine's pool is what it always was), versions, limits and the
    probe's verdict."""
    return agent_pb2.Hello(
        engine_id=config.engine_id,
        pool=common_pb2.Pool(model=config.pool_model, accelerator=config.pool_accelerator,
                             kv_role=KV_ROLE_TO_PROTO[kv_role]),
        vllm_version=verdict.vllm_version, agent_version=__version__, limits=limits,
        instance_id=instance_id, instance_started_at_s=started_at_s, support=support_message(verdict))


def stock_limits(scheduler: Any) -> agent_pb2.EngineLimits | None:
    """The engine's limits as the Hello carries them, read without trusting any internal; None when one of
    them cannot be read anywhere."""
    config = getattr(scheduler, "vllm_config", None)
    scheduler_config = getattr(config, "scheduler_config", None)
    cache_config = getattr(config, "cache_config", None)
    model_config = getattr(config, "model_config", None)
    slots = _first_int((scheduler, "max_num_running_reqs"), (scheduler_config, "max_num_seqs"))
    active = _first_int((scheduler, "max_num_active_reqs"), (scheduler_config, "max_num_active_seqs"))
    budget = _first_int((scheduler, "max_num_scheduled_tokens"), (scheduler_config, "max_num_batched_tokens"))
    block_size = _first_int((scheduler, "block_size"), (cache_config, "block_size"))
    block_pool = getattr(getattr(scheduler, "kv_cache_manager", None), "block_pool", None)
    num_blocks = _first_int((block_pool, "num_gpu_blocks"), (cache_config, "num_gpu_blocks"))
    max_len = _first_int((model_config, "max_model_len"), (scheduler, "max_model_len"))
    if None in (slots, budget, block_size, num_blocks, max_len):
        return None
    assert slots is not None and block_size is not None and num_blocks is not None
    return agent_pb2.EngineLimits(
        max_num_seqs=max(1, min(active, slots)) if active is not None else slots, max_num_batched_tokens=budget,
        kv_capacity_tokens=max(1, num_blocks - 1) * block_size, block_size_tokens=block_size,
        max_model_len_tokens=max_len)


def _first_int(*places: tuple[Any, str]) -> int | None:
    """The first attribute of `places` that reads as a positive int (not a bool)."""
    for obj, name in places:
        if obj is None:
            continue
        try:
            value = getattr(obj, name)
        except Exception:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
