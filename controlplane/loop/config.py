"""Configuration of the decision loop (shared by the controller and the twin); validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DecisionLoopConfig:
    """When decisions are recomputed, how long they live, and the statistics windows.

    recompute_completions: an engine's new completions that make its decision due.
    interval_s: an engine's decision is recomputed at least this often while it is connected.
    ttl_s: decision lifetime at the agent; the current decision is re-sent every ttl_s / 3 (keep-alive).
    n_obs_time_constant_s: time constant of the N_obs EMA of running requests.
    output_window / prompt_window: completions the pool's length window holds at least (the newest
      closed time buckets are summed until they hold this many; a bucket is never split).
    step_window: steps per cost phase the pool's cost window holds at least (same rule).
    bucket_s: length of one statistics bucket, seconds (pool statistics are recomputed when one closes).
    max_window_s: no bucket older than this enters a window, seconds.
    engine_ttl_s: a disconnected engine is forgotten (memory, registry, metrics) after this long.
    max_disconnected_engines: disconnected engines one agent identity may leave remembered at once; past it,
      its longest-disconnected engine is forgotten before engine_ttl_s. Bounds the memory one identity can
      make a controller hold beyond its connected engines (a client cycling through engine ids), whatever
      the rate; another identity's engines are never forgotten for it. 0: no limit (engine_ttl_s alone).
    snapshot_interval_s / snapshot_ttl_s: how often a pool's window is persisted for a warm start, and how
      long it is kept; a pool without buckets in force starts from it instead of a cold start.
    latency_history_interval_s / latency_history_s: how often a pool's latency quantiles (its explain view's)
      are recorded in the store while its engines report latencies, and how long they are kept (the record
      is capped at latency_history_s / latency_history_interval_s samples); an interval of 0 records none.
    shift_detection: detect shifts of a pool's output-length distribution and re-base its window at each
      change point (`loop.shift_tracker`); off, the window always holds the newest output_window completions.
    shift_min_samples: completions a re-based window needs before it is fitted; until then the pool keeps the
      fit it had (a re-based window is not a cold start: the policy's min_samples counts the completions the
      window would hold without the re-base).
    """

    recompute_completions: int = 256
    interval_s: float = 5.0
    ttl_s: float = 60.0
    n_obs_time_constant_s: float = 10.0
    output_window: int = 4096
    prompt_window: int = 4096
    step_window: int = 2048
    bucket_s: float = 1.0
    max_window_s: float = 1800.0
    engine_ttl_s: float = 300.0
    max_disconnected_engines: int = 1000
    snapshot_interval_s: float = 60.0
    snapshot_ttl_s: float = 7 * 24 * 3600.0
    latency_history_interval_s: float = 10.0
    latency_history_s: float = 6 * 3600.0
    shift_detection: bool = True
    shift_min_samples: int = 50

    def __post_init__(self) -> None:
        if self.recompute_completions < 1:
            raise ValueError(f"recompute_completions must be ≥ 1, got {self.recompute_completions}")
        for name in ("interval_s", "ttl_s", "n_obs_time_constant_s", "bucket_s", "max_window_s", "engine_ttl_s",
                     "snapshot_interval_s", "snapshot_ttl_s", "latency_history_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if not (math.isfinite(self.latency_history_interval_s) and self.latency_history_interval_s >= 0):
            raise ValueError(f"latency_history_interval_s must be ≥ 0, got {self.latency_history_interval_s}")
        if not math.isfinite(self.latency_history_s):
            raise ValueError(f"latency_history_s must be finite, got {self.latency_history_s}")
        if self.max_disconnected_engines < 0:
            raise ValueError(f"max_disconnected_engines must be ≥ 0, got {self.max_disconnected_engines}")
        for name in ("output_window", "prompt_window", "step_window"):
            if getattr(self, name) < 8:
                raise ValueError(f"{name} must be ≥ 8, got {getattr(self, name)}")
        if not 1 <= self.shift_min_samples <= self.output_window:
            raise ValueError(f"shift_min_samples must be in [1, output_window ({self.output_window})], got "
                             f"{self.shift_min_samples}")
        if self.max_window_s < self.bucket_s:
            raise ValueError(f"max_window_s ({self.max_window_s}) must be ≥ bucket_s ({self.bucket_s})")

    @property
    def keepalive_s(self) -> float:
        return self.ttl_s / 3.0

    @property
    def latency_history_max_samples(self) -> int:
        """The cap of a pool's latency record, samples (0 when none are recorded)."""
        if not self.latency_history_interval_s:
            return 0
        return max(1, math.ceil(self.latency_history_s / self.latency_history_interval_s))
