"""Per-engine and per-pool estimator state held by one controller replica (in memory)."""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.api.v1 import common_pb2
from controlplane.core.cost_model import CostModelEstimator
from controlplane.core.hazard import LengthWindow
from controlplane.core.policy import ema_update
from controlplane.core.types import PolicyState
from controlplane.service.config import DecisionLoopConfig
from controlplane.service.ingest import EngineHello, ValidatedBatch


@dataclass
class PoolState:
    """Estimators fed by every engine of one pool (same model and accelerator)."""

    window: LengthWindow
    costs: CostModelEstimator


@dataclass
class EngineState:
    """What the controller knows of one engine. Times are controller wall-clock seconds."""

    hello: EngineHello
    window: LengthWindow
    costs: CostModelEstimator
    policy_state: PolicyState = field(default_factory=PolicyState)
    n_obs: float = 0.0
    n_obs_at_s: float = 0.0
    current: common_pb2.Decision | None = None
    version: int = 0
    acked_version: int = 0
    connected: bool = False
    last_telemetry_s: float = -1.0
    last_decided_s: float = float("-inf")
    last_sent_s: float = float("-inf")
    last_seq: int = 0
    completions_since_decision: int = 0
    num_completions: int = 0
    num_rejected_events: int = 0
    num_sequence_gaps: int = 0
    num_preemptions: int = 0  # the engine's cumulative counter, as last reported
    preemptions_since_decision: int = 0
    traceparent: str = ""

    @classmethod
    def create(cls, hello: EngineHello, loop: DecisionLoopConfig) -> EngineState:
        return cls(
            hello=hello,
            window=LengthWindow(output_window=loop.output_window, prompt_window=loop.prompt_window),
            costs=CostModelEstimator(window=loop.step_window),
        )

    def ingest(self, batch: ValidatedBatch, *, now_s: float, loop: DecisionLoopConfig) -> int:
        """Feed one validated batch; returns the number of sequence numbers skipped (0 if none)."""
        gap = 0
        if self.last_seq and batch.seq > self.last_seq + 1:
            gap = batch.seq - self.last_seq - 1
        self.num_sequence_gaps += gap
        self.last_seq = max(self.last_seq, batch.seq) if batch.seq > self.last_seq else batch.seq
        rejected = self.window.add_completions(batch.prompt_tokens, batch.output_tokens)
        self.costs.add_steps(prefill_tokens=batch.prefill_tokens, decode_tokens=batch.decode_tokens,
                             decode_requests=batch.decode_requests, duration_s=batch.duration_s)
        accepted = batch.output_tokens.size - rejected
        self.num_completions += accepted
        self.completions_since_decision += accepted
        self.num_rejected_events += batch.num_dropped + rejected
        # The first batch sets the baseline (a restarted controller must not count an engine's whole past);
        # a counter below the last one means the engine restarted: all of it is new.
        if self.last_telemetry_s >= 0:
            new_preemptions = batch.num_preemptions - self.num_preemptions
            self.preemptions_since_decision += new_preemptions if new_preemptions >= 0 else batch.num_preemptions
        self.num_preemptions = batch.num_preemptions
        if self.last_telemetry_s < 0:
            self.n_obs, self.n_obs_at_s = float(batch.num_running), now_s
        else:
            self.n_obs = ema_update(self.n_obs, float(batch.num_running), dt_s=now_s - self.n_obs_at_s,
                                    time_constant_s=loop.n_obs_time_constant_s)
            self.n_obs_at_s = now_s
        self.last_telemetry_s = now_s
        if batch.traceparent:
            self.traceparent = batch.traceparent
        return gap
