"""Probation and outlier judging: which engines' completions enter their pool's statistics.

A new engine's completions wait on probation until its first block of `OUTLIER_BLOCK` completions is
judged against the pool's estimate (or are admitted at once while the pool cannot judge: a young pool has
nothing to compare with), so a poisoning engine never reaches the pool statistics, even if it changes its
id every block. After that, each block re-judges whether the engine is kept out of the pool. An outlier's
block mean is more than `OUTLIER_Z` standard errors and a factor `OUTLIER_RATIO` away from the pool's mean;
a pool judges only with an estimate from `min_samples` completions and `MIN_POOL_ENGINES` connected engines.

Pure: numbers in, verdicts out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from controlplane.loop.estimate import PoolEstimate

OUTLIER_BLOCK = 256
OUTLIER_Z = 8.0
OUTLIER_RATIO = 2.0
MIN_POOL_ENGINES = 3


@dataclass(frozen=True, slots=True)
class HeldBatch:
    """Completions held on probation: prompts and outputs (tokens), their admission ages as of held_at_s
    (seconds; None when the batch did not report them) and the time they arrived at."""

    prompts: np.ndarray
    outputs: np.ndarray
    admitted_age_s: np.ndarray | None
    held_at_s: float


@dataclass(frozen=True, slots=True)
class Released:
    """Completions released from probation into the pool: prompts, outputs and their admission ages as of the
    release (None when any held batch did not report them)."""

    prompts: np.ndarray
    outputs: np.ndarray
    admitted_age_s: np.ndarray | None


@dataclass(frozen=True, slots=True)
class Verdict:
    """A judged block: whether the engine is kept out, the block's mean and the pool's (tokens)."""

    excluded: bool
    block_mean_tokens: float
    pool_mean_tokens: float


@dataclass(eq=False)
class EngineJudge:
    """One engine's judging state: the open block, and its probation (None once ended)."""

    block_count: int = 0
    block_sum_tokens: float = 0.0
    probation: list[HeldBatch] | None = field(default_factory=list)

    @property
    def on_probation(self) -> bool:
        return self.probation is not None

    def hold(self, batch: HeldBatch) -> None:
        assert self.probation is not None
        self.probation.append(batch)

    def end_probation(self, now_s: float, *, admit: bool) -> Released | None:
        """End probation; the held completions to add to the pool (None: nothing held, or dropped). Released
        admission ages are carried forward to now_s, so the bucket they enter keeps its admissions (one held
        batch that reported none makes them all unknown, as it would have made its own bucket's)."""
        held, self.probation = self.probation or [], None
        if not (admit and held):
            return None
        known = all(h.admitted_age_s is not None and h.admitted_age_s.size == h.outputs.size for h in held)
        ages = np.concatenate([h.admitted_age_s + (now_s - h.held_at_s) for h in held]) if known else None
        return Released(np.concatenate([h.prompts for h in held]), np.concatenate([h.outputs for h in held]), ages)

    def add_to_block(self, outputs: np.ndarray) -> tuple[float, int] | None:
        """Count outputs into the open block; (mean tokens, count) when the block is complete (then reset)."""
        self.block_count += int(outputs.size)
        self.block_sum_tokens += float(outputs.sum())
        if self.block_count < OUTLIER_BLOCK:
            return None
        block = (self.block_sum_tokens / self.block_count, self.block_count)
        self.block_count, self.block_sum_tokens = 0, 0.0
        return block


def pool_can_judge(estimate: PoolEstimate | None, *, num_connected: int, min_samples: int) -> bool:
    """The pool has an estimate to judge against (from min_samples completions, a positive mean) and enough
    connected engines that one cannot be its own majority."""
    return (estimate is not None and estimate.fit is not None and estimate.fit.stats.mu_o_tokens > 0
            and estimate.num_samples >= min_samples and num_connected >= MIN_POOL_ENGINES)


def judge_block(mean_tokens: float, count: int, estimate: PoolEstimate) -> Verdict:
    """Judge a block of `count` completions of mean `mean_tokens` against a pool that can judge."""
    stats = estimate.fit.stats
    z = abs(mean_tokens - stats.mu_o_tokens) / max(stats.sigma_o_tokens / math.sqrt(count), 1e-9)
    ratio = mean_tokens / stats.mu_o_tokens
    excluded = z > OUTLIER_Z and not (1.0 / OUTLIER_RATIO <= ratio <= OUTLIER_RATIO)
    return Verdict(excluded=excluded, block_mean_tokens=mean_tokens, pool_mean_tokens=stats.mu_o_tokens)
