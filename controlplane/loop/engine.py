"""The per-engine decision loop: ingest → due? → decide → change test → version. Pure and clock-injected.

`EngineLoop` is what the controller keeps per connected engine and what the twin runs for its simulated
engine: the same object, so the two cannot drift. It holds the engine's own state (N_obs EMA, policy
state, preemption baseline, sequence numbers, versions, ACKs); the workload and cost terms come from the
pool's estimate (`pool_stats.PoolEstimate`), computed once per pool per recompute. A decision costs a few
tens of microseconds: the core's `decide` on a precomputed hazard fit plus one protobuf message.

Versions are `epoch · 10^9 + sequence` (`controlplane.protocol.compose_version`); the epoch is given by
the caller (reserved in the store when the engine's stream opened), so versions keep increasing when an
engine moves between replicas.

No I/O, no clock: every method takes `now_s`.
"""

from __future__ import annotations

import math
import zlib
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from controlplane.api.v1 import common_pb2
from controlplane.core.budget import SweepPoint
from controlplane.core.policy import decide
from controlplane.core.types import Decision, Observations, OperatorIntent, PolicyConfig, PolicyState
from controlplane.loop.codec import decision_to_proto
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.estimate import FIT_HELD_FLAG, WINDOW_COHORT_FLAG, WINDOW_REBASED_FLAG, PoolEstimate
from controlplane.loop.ingest import EngineHello, ValidatedBatch
from controlplane.protocol import VERSION_EPOCH_FACTOR, compose_version

_SENT_VERSIONS_KEPT = 64
# The waiting requests count towards the offered occupancy only while the KV cache is below this fraction
# of its capacity: past it the engine's running count is bound by memory, which an EB batch would meet too.
OFFERED_KV_ROOM_FRACTION = 0.9


def offered_occupancy(batch: ValidatedBatch, *, max_num_seqs: int) -> float | None:
    """Requests an engine holds by one batch's scheduler state: running plus, while its KV cache has room,
    waiting, capped at max_num_seqs (what an EB batch of max_num_seqs would admit). None without a running
    count (ingest sets it None above max_num_seqs); the running count alone when the KV cache is unknown
    (capacity 0) or nearly full."""
    if batch.num_running is None:
        return None
    room = batch.kv_total_tokens > 0 and batch.kv_used_tokens < OFFERED_KV_ROOM_FRACTION * batch.kv_total_tokens
    held = batch.num_running + (max(0, batch.num_waiting) if room else 0)
    return float(min(held, max_num_seqs))


def ema_update(previous: float, value: float, *, dt_s: float, time_constant_s: float) -> float:
    """Exponential moving average with a time constant: weight 1 − e^(−dt/τ) on the new value.

    A non-finite or negative value, or a non-positive dt, leaves the average unchanged; a non-finite
    previous average is replaced by the value.
    """
    if not (math.isfinite(value) and value >= 0.0):
        return previous
    if not math.isfinite(previous):
        return value
    if not (math.isfinite(dt_s) and dt_s > 0.0) or not time_constant_s > 0.0:
        return previous
    weight = -math.expm1(-dt_s / time_constant_s)
    return previous + weight * (value - previous)


@dataclass(frozen=True, slots=True)
class LoopOutcome:
    """The result of one computation.

    decision: the core's decision (reason, flags, diagnostics). latest: the new instruction's message when
    it changed, else None (`EngineLoop.latest` builds the message of an unchanged computation on demand).
    push: the message to send now (a new version, or a keep-alive of the current one), or None. changed:
    the instruction changed (a new version was issued).
    """

    decision: Decision
    latest: common_pb2.Decision | None
    push: common_pb2.Decision | None
    changed: bool


@dataclass
class EngineLoop:
    """Decision state of one engine (see the module docstring). Times are controller seconds."""

    hello: EngineHello
    config: DecisionLoopConfig
    policy: PolicyConfig
    epoch: int = 0
    budget_sweep: Sequence[SweepPoint] = ()
    sequence: int = 0
    policy_state: PolicyState = field(default_factory=PolicyState)
    current: common_pb2.Decision | None = None
    latest_at_s: float = 0.0  # when the instruction in force was issued
    # When the mode in force began: the time of the latest decision that changed it; −inf while the engine runs the
    # mode it was first decided with (its finished requests all ran it, but those of its first moments, before any
    # decision, which ran vLLM's own scheduling).
    mode_since_s: float = float("-inf")
    mode_before: int = 0  # the mode (proto) in force before that change (0: none yet), and since when it was
    mode_before_since_s: float = float("inf")
    n_obs: float = 0.0
    n_obs_at_s: float = 0.0
    n_offered: float = 0.0  # EMA of offered_occupancy, same time constant as N_obs
    acked_version: int = 0
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
    num_running: int = 0  # running requests, as last reported (0: not reported)
    num_waiting: int = 0  # waiting requests, as last reported with the running count
    traceparent: str = ""
    excluded_from_pool: bool = False
    sent_versions: deque[int] = field(default_factory=lambda: deque(maxlen=_SENT_VERSIONS_KEPT))
    _latest: tuple[Decision, float, str, PoolEstimate | None] | None = field(default=None, repr=False)
    _latest_message: common_pb2.Decision | None = field(default=None, repr=False)
    _current_instruction: tuple | None = field(default=None, repr=False)

    @property
    def version(self) -> int:
        """Version of the instruction in force (0 before the first)."""
        return self.current.version if self.current is not None else 0

    # ---- ingest ----

    def on_batch(self, batch: ValidatedBatch, *, now_s: float) -> bool:
        """Feed one validated batch; returns True when its sequence number shows a gap or a regression
        (counted once per event, whatever the numbers: a seq of 2^64−1 is one event, not 1.8e19)."""
        gap = self.last_seq != 0 and batch.seq != self.last_seq + 1
        self.num_sequence_gaps += int(gap)
        self.last_seq = batch.seq
        accepted = int(batch.output_tokens.size)
        self.num_completions += accepted
        self.completions_since_decision += accepted
        self.num_rejected_events += batch.num_dropped
        # The first batch sets the baseline (a restarted controller must not count an engine's whole past);
        # a counter below the last one means the engine restarted: all of it is new.
        if self.last_telemetry_s >= 0:
            new = batch.num_preemptions - self.num_preemptions
            self.preemptions_since_decision += new if new >= 0 else batch.num_preemptions
        self.num_preemptions = batch.num_preemptions
        if batch.num_running is not None:
            self.num_running, self.num_waiting = batch.num_running, max(0, batch.num_waiting)
            offered = offered_occupancy(batch, max_num_seqs=self.hello.limits.max_num_seqs) or 0.0
            if self.last_telemetry_s < 0:
                self.n_obs, self.n_offered, self.n_obs_at_s = float(batch.num_running), offered, now_s
            else:
                dt_s, tau_s = now_s - self.n_obs_at_s, self.config.n_obs_time_constant_s
                self.n_obs = ema_update(self.n_obs, float(batch.num_running), dt_s=dt_s, time_constant_s=tau_s)
                self.n_offered = ema_update(self.n_offered, offered, dt_s=dt_s, time_constant_s=tau_s)
                self.n_obs_at_s = now_s
        self.last_telemetry_s = now_s
        if batch.traceparent:
            self.traceparent = batch.traceparent
        return gap

    # ---- timing ----

    def is_due(self, now_s: float, *, urgent_since_s: float = float("-inf")) -> bool:
        """Due after recompute_completions completions or interval_s seconds, and at once when the engine was
        last decided before urgent_since_s (its pool's estimate moved on a shift since: `FleetState.refresh_pool`)."""
        return (self.completions_since_decision >= self.config.recompute_completions
                or now_s - self.last_decided_s >= self.config.interval_s or self.last_decided_s < urgent_since_s)

    def keepalive_due(self, now_s: float) -> bool:
        return self.current is not None and now_s - self.last_sent_s >= self.config.keepalive_s

    def _dephase(self, now_s: float) -> None:
        """Start the engine's recompute cycle at its own phase, so that engines that connect together and
        complete at the same rate (a fleet restarted behind one load balancer) do not all become due on the
        same batch: the first recompute after the first decision comes after a fraction f of
        `recompute_completions` and of `interval_s` fewer, f in [0, 1) fixed per engine id (a hash, the
        same in every replica and in the twin). Later cycles are full length and keep the phase."""
        fraction = zlib.crc32(self.hello.engine_id.encode()) / 2.0**32
        self.completions_since_decision = int(fraction * self.config.recompute_completions)
        self.last_decided_s = now_s - fraction * self.config.interval_s

    # ---- deciding ----

    def decide(self, estimate: PoolEstimate | None, *, intent: OperatorIntent, now_s: float,
               force_push: bool = False, trigger_traceparent: str = "") -> LoopOutcome:
        """Recompute the decision from the pool's estimate; issue a new version when the instruction changed.

        push is the new version, or — when nothing changed — the current one if a keep-alive is due or
        force_push is set; else None. The message of an unchanged computation is only built when asked
        for (`latest`), so the common case costs the core's decide() alone.
        """
        observations = Observations(
            costs=estimate.costs if estimate is not None else None, limits=self.hello.limits, n_obs=self.n_obs,
            num_rejected_samples=self.num_rejected_events, num_preemptions=self.preemptions_since_decision,
            n_offered=self.n_offered, mu_o_lower_tokens=estimate.mu_o_lower_tokens if estimate is not None else 1.0,
            num_running=self.num_running,
        )
        decision, self.policy_state = decide(
            observations, self.policy_state, now_s, intent=intent, config=self.policy,
            budget_sweep=self.budget_sweep, fit=estimate.fit if estimate is not None else None,
            established=estimate is not None and (estimate.window_rebased or estimate.window_cohort),
        )
        self.last_decided_s = now_s
        self.completions_since_decision = 0
        if self.current is None:
            self._dephase(now_s)
        self.preemptions_since_decision = 0
        self._latest = (decision, now_s, trigger_traceparent, estimate)
        self._latest_message = None
        current = self.current
        if current is not None and self._current_instruction == _instruction(decision):
            push = current if (force_push or self.keepalive_due(now_s)) else None
            return LoopOutcome(decision=decision, latest=None, push=push, changed=False)
        version = self._next_version()
        self.sequence = version % VERSION_EPOCH_FACTOR
        self.current = self._message(decision, version=version, now_s=now_s, trigger=trigger_traceparent,
                                     estimate=estimate)
        if current is not None and current.mode != self.current.mode:
            self.mode_before, self.mode_before_since_s, self.mode_since_s = current.mode, self.mode_since_s, now_s
        self._current_instruction = _instruction(decision)
        self._latest_message = self.current
        self.latest_at_s = now_s
        return LoopOutcome(decision=decision, latest=self.current, push=self.current, changed=True)

    @property
    def latest(self) -> common_pb2.Decision | None:
        """The latest computation as a message (carrying the version of the instruction in force)."""
        if self._latest_message is None and self._latest is not None:
            decision, now_s, trigger, estimate = self._latest
            message = self._message(decision, version=self.version, now_s=now_s, trigger=trigger, estimate=estimate)
            if self.current is not None:
                message.trace_id = self.current.trace_id
            self._latest_message = message
        return self._latest_message

    @property
    def latest_computed_at_s(self) -> float:
        return self._latest[1] if self._latest is not None else 0.0

    def _message(self, decision: Decision, *, version: int, now_s: float, trigger: str,
                 estimate: PoolEstimate | None) -> common_pb2.Decision:
        message = decision_to_proto(decision, version=version, ttl_s=self.config.ttl_s, decided_at_s=now_s,
                                    trace_id="")
        message.trigger_traceparent = trigger
        if estimate is not None:
            diag = message.diagnostics
            diag.pool_window_end_bucket = estimate.end_bucket
            diag.data_age_s = max(0.0, now_s - (estimate.end_bucket + 1) * self.config.bucket_s)
            diag.cost_source = estimate.cost_source
            diag.window_first_bucket = estimate.window_first_bucket or 0
            diag.window_rebased = estimate.window_rebased
            diag.window_transient = estimate.window_transient
            diag.num_censored = estimate.num_censored
            diag.num_truncated = estimate.num_truncated
            diag.num_shifts = estimate.num_shifts
            diag.num_unconfirmed_shifts = estimate.num_unconfirmed_shifts
            shift = estimate.last_shift
            if shift is not None:
                diag.last_shift.start_bucket = shift.start_bucket
                diag.last_shift.detected_bucket = shift.detected_bucket
                diag.last_shift.direction = shift.direction
                diag.last_shift.mean_ratio = shift.mean_ratio
            if estimate.window_rebased:
                message.flags.append(WINDOW_REBASED_FLAG)
            if estimate.window_cohort:
                message.flags.append(WINDOW_COHORT_FLAG)
            if estimate.fit_held:
                message.flags.append(FIT_HELD_FLAG)
        return message

    def _next_version(self) -> int:
        sequence = self.sequence + 1
        epoch = self.epoch
        if sequence >= VERSION_EPOCH_FACTOR:  # 10^9 decisions in one epoch: move to the next
            epoch, sequence = epoch + 1, 1
            self.epoch = epoch
        version = compose_version(epoch, sequence)
        return max(version, self.version + 1)

    def begin_epoch(self, epoch: int) -> None:
        """Continue under a newer epoch (the engine's stream reopened, possibly on another replica, which may
        have issued versions meanwhile): the next computation issues a new version even when the instruction
        is unchanged, so the agent never sees a version below one it holds."""
        if epoch > self.epoch:
            self.epoch, self.sequence = epoch, 0
            self._current_instruction = None

    def restore(self, decision: common_pb2.Decision) -> None:
        """Continue after a stored decision (a restart): versions stay above it."""
        epoch, sequence = divmod(decision.version, VERSION_EPOCH_FACTOR)
        if epoch > self.epoch or (epoch == self.epoch and sequence > self.sequence):
            self.epoch, self.sequence = epoch, sequence

    def mark_sent(self, decision: common_pb2.Decision, *, now_s: float) -> None:
        self.last_sent_s = now_s
        if not self.sent_versions or self.sent_versions[-1] != decision.version:
            self.sent_versions.append(decision.version)

    def ack(self, version: int, *, applied: bool) -> str:
        """Record an ACK; returns "applied", "rejected" or "unknown_version" (never sent: ignored)."""
        if version not in self.sent_versions:
            return "unknown_version"
        if applied:
            self.acked_version = max(self.acked_version, version)
            return "applied"
        return "rejected"


def _instruction(decision: Decision) -> tuple:
    """What the agent is told — mode, k, N, advisory, δ, budget — without diagnostics or reason: two decisions
    with equal instructions get one version."""
    return (decision.mode, decision.k, decision.n, decision.advisory, decision.delta_s_per_token, decision.budget)
