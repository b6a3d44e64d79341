"""What a fleet event asks its caller to do (`loop.fleet.FleetState` returns these): decisions to trace and
persist, messages to push, buckets to publish, membership changes, engines and pools forgotten, rollouts
started and finished.

Pure data: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.api.v1 import common_pb2
from controlplane.loop.buckets import BucketStats
from controlplane.loop.engine import LoopOutcome
from controlplane.loop.judging import Verdict


@dataclass(frozen=True, slots=True)
class Decided:
    """A computation whose instruction changed (a new version): trace it, count it, persist it."""

    engine_id: str
    pool_key: str
    outcome: LoopOutcome
    traceparent: str  # the engine's latest batch's trace context, which the decision continues


@dataclass(frozen=True, slots=True)
class Push:
    """A message for an engine: to its stream (None: no stream here), and to the watchers when `watch` (each
    version is shown to watchers once; keep-alives and re-pushes go to the engine only)."""

    engine_id: str
    pool_key: str
    decision: common_pb2.Decision
    stream: object | None
    watch: bool


@dataclass(frozen=True, slots=True)
class MembershipChange:
    """An engine was kept out of (excluded) or readmitted to its pool's statistics; num_excluded: the pool's
    engines kept out now."""

    engine_id: str
    pool_key: str
    verdict: Verdict
    num_excluded: int


@dataclass(frozen=True, slots=True)
class Forgotten:
    """A disconnected engine forgotten: reason "ttl" (engine_ttl_s) or "capacity" (its identity's
    max_disconnected_engines); identity: whose; disconnected_for_s: how long it had been disconnected."""

    engine_id: str
    pool_key: str
    reason: str
    identity: str
    disconnected_for_s: float


@dataclass(frozen=True, slots=True)
class RolloutEvent:
    """A pool's guarded rollout started ("started") or ended ("promoted", "rolled_back", "aborted")."""

    pool_key: str
    event: str
    from_mode: str
    to_mode: str
    detail: str
    actor: str = ""  # an operator who ended it ("": the controller's own verdict)
    reason: str = ""


@dataclass
class Effects:
    """What one event asks the caller to do, in order: decisions (trace first: the trace id goes into the
    message), then pushes, then persist `decided`."""

    decided: list[Decided] = field(default_factory=list)
    pushes: list[Push] = field(default_factory=list)
    buckets: list[tuple[str, int, BucketStats]] = field(default_factory=list)  # (pool, bucket id, stats) to publish
    memberships: list[MembershipChange] = field(default_factory=list)
    forgotten: list[Forgotten] = field(default_factory=list)
    forgotten_pools: list[str] = field(default_factory=list)
    decide_latencies_s: list[float] = field(default_factory=list)
    rollouts: list[RolloutEvent] = field(default_factory=list)
    num_computed: int = 0  # decisions computed, changed or not
    sequence_gaps: int = 0
