"""What the fleet state machine (`loop.fleet.FleetState`) keeps per engine id and per pool.

Pure: plain records, no behaviour beyond their fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from controlplane.loop.engine import EngineLoop
from controlplane.loop.judging import EngineJudge
from controlplane.loop.latest_blocks import LatestBlocks
from controlplane.loop.objective_view import RecentRate
from controlplane.loop.pool_stats import PoolStatistics
from controlplane.loop.rollout import PoolRollouts


@dataclass(eq=False)
class EngineRecord:
    """What the machine keeps per engine id: its decision loop, judging state and the stream holding it."""

    loop: EngineLoop
    identity: str = ""  # the agent identity that holds the engine id until the record is forgotten
    stream: object | None = None
    disconnected_at_s: float = 0.0
    judge: EngineJudge = field(default_factory=EngineJudge)
    watched_version: int = -1  # the last version shown to watchers
    # While the engine serves a distinct workload (`loop.judging`): its own statistics, which it is decided
    # from once they hold min_samples completions (the pool's until then). None: it is part of its pool.
    own: PoolStatistics | None = None
    decided_from_own: bool = False  # its latest decision stood on its own statistics
    finished: RecentRate = field(default_factory=RecentRate)  # requests it finishes a second (objective views)

    @property
    def connected(self) -> bool:
        return self.stream is not None


@dataclass(eq=False)
class PoolRecord:
    """What the machine keeps per pool: its statistics, its engines' counts and judging, its rollouts."""

    stats: PoolStatistics
    refreshed_bucket: int | None = None
    num_connected: int = 0
    num_records: int = 0  # engine records of the pool here, connected or not: the pool is forgotten at 0
    num_excluded: int = 0
    blocks: LatestBlocks = field(default_factory=lambda: LatestBlocks(b""))  # each engine's latest judged block
    distinct: set[str] = field(default_factory=set)  # engines serving a distinct workload (not in the reference)
    rollouts: PoolRollouts = field(default_factory=PoolRollouts)  # established modes and guarded changes
    # Engines decided before this are due at once: the pool's estimate moved on a shift (`refresh_pool`).
    urgent_since_s: float = float("-inf")


@dataclass(eq=False)
class DisconnectedEngines:
    """Per agent identity, its disconnected engine ids in the order they disconnected (the oldest first)."""

    by_identity: dict[str, dict[str, None]] = field(default_factory=dict)

    def add(self, identity: str, engine_id: str, limit: int) -> list[str]:
        """Queue engine_id under identity; the identity's oldest ids beyond `limit` (0: none) to forget now, in
        order (the caller forgets them, which calls `leave`)."""
        queue = self.by_identity.setdefault(identity, {})
        queue[engine_id] = None
        return list(queue)[:len(queue) - limit] if limit and len(queue) > limit else []

    def leave(self, identity: str, engine_id: str) -> None:
        """engine_id is connected again or forgotten."""
        queue = self.by_identity.get(identity)
        if queue is None:
            return
        queue.pop(engine_id, None)
        if not queue:
            del self.by_identity[identity]
