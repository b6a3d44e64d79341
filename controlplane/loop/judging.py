"""Probation and judging: which engines' completions enter their pool's statistics, and which engines are
decided from their own.

Every engine's completions are summed in blocks of `JUDGE_BLOCK`: the mean and spread of its output and prompt
lengths. A block is judged against the pool's *robust reference*: the medians, over the pool's other member
engines, of their latest block means and spreads (`Reference`), available once `MIN_POOL_ENGINES` − 1 of them
have a block; standard errors use the pool's spread, which the judged engine cannot inflate.
The median cannot be moved by a minority, however much it sends: with f of n engines adversarial, f < n/2,
the reference stays within the honest engines' range, so the rule cannot exclude the honest majority.

A block whose mean of outputs or of prompts is more than `DISTINCT_Z` standard errors and a fraction
`DISTINCT_GAP` away from the reference (over the blocks the others ended since it began; for a block of one
batch, since the engine's previous block ended) is distinct; `CONFIRM_BLOCKS` distinct blocks in a row and the
engine serves a *distinct* workload: it is kept out of the pool's statistics (its volume cannot move the
pool) and decided from its own (`FleetState` keeps a private `PoolStatistics` for it). A router that sends
long-context tenants to some engines makes them distinct, and so does a poisoning engine; an engine that
merely sees a pool-wide shift first is not (its next block meets the others' on the new law). Only engines
that are part of the pool speak in the reference. A conforming block readmits a distinct engine.

A new engine's completions wait on probation until its blocks are judged: released into the pool by a
conforming block, into its own statistics once it is distinct (or admitted at once while the pool has no
reference: a young pool has nothing to compare with), so a poisoning engine never reaches the pool's
statistics, even if it changes its id every block.

Pure: numbers in, verdicts out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

JUDGE_BLOCK = 256
CONFIRM_BLOCKS = 2
MAX_HELD = 4 * JUDGE_BLOCK
DISTINCT_Z = 8.0
DISTINCT_GAP = 0.2
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
class Block:
    """One engine's judged block: completions, the mean and standard deviation of their output and prompt
    lengths (tokens), and when its first and last batch arrived (seconds)."""

    count: int
    output_mean_tokens: float
    output_std_tokens: float
    prompt_mean_tokens: float
    prompt_std_tokens: float
    started_at_s: float = 0.0
    ended_at_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Reference:
    """The pool's robust reference: the medians of its other engines' latest block means and standard
    deviations, and how many engines they are."""

    output_mean_tokens: float
    prompt_mean_tokens: float
    num_engines: int
    output_std_tokens: float = 0.0
    prompt_std_tokens: float = 0.0


@dataclass(frozen=True, slots=True)
class Verdict:
    """A judged block: whether the engine serves a distinct workload (kept out, decided from its own
    statistics), which statistic said so ("outputs", "prompts" or ""), the block's mean and the reference's."""

    excluded: bool
    statistic: str
    block_mean_tokens: float
    pool_mean_tokens: float


def _moments(values: np.ndarray) -> tuple[float, float, float]:
    """(count, Σx, Σx²); Σx² as a dot product (one pass, no temporary: this runs for every batch)."""
    values = np.asarray(values, dtype=np.float64)
    return float(values.size), float(values.sum()), float(values @ values)


@dataclass(eq=False)
class EngineJudge:
    """One engine's judging state: the open block's sums, and its probation (None once ended)."""

    block_count: int = 0
    output_sums: tuple[float, float] = (0.0, 0.0)  # Σx, Σx² of the open block's outputs
    prompt_sums: tuple[float, float, float] = (0.0, 0.0, 0.0)  # count, Σx, Σx² of its prompts
    probation: list[HeldBatch] | None = field(default_factory=list)
    distinct_blocks: int = 0  # distinct blocks in a row
    block_started_at_s: float | None = None

    @property
    def on_probation(self) -> bool:
        return self.probation is not None

    def hold(self, batch: HeldBatch) -> None:
        """Hold a batch; at most MAX_HELD completions are held (a batch beyond is thinned, evenly spaced: an
        engine sending a million completions at once holds no more memory than one sending a block)."""
        assert self.probation is not None
        room = MAX_HELD - sum(h.outputs.size for h in self.probation)
        if batch.outputs.size > room:
            if room <= 0:
                return
            keep = np.linspace(0, batch.outputs.size - 1, room).astype(np.int64)
            ages = batch.admitted_age_s
            ages = ages[keep] if ages is not None and ages.size == batch.outputs.size else None
            batch = HeldBatch(batch.prompts[keep], batch.outputs[keep], ages, batch.held_at_s)
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

    def add_to_block(self, prompts: np.ndarray, outputs: np.ndarray, now_s: float) -> Block | None:
        """Count one batch's completions (arrived at now_s) into the open block; the block once it holds
        JUDGE_BLOCK (then reset)."""
        if self.block_started_at_s is None:
            self.block_started_at_s = now_s
        n, s, q = _moments(outputs)
        self.block_count += int(n)
        self.output_sums = (self.output_sums[0] + s, self.output_sums[1] + q)
        pn, ps, pq = _moments(prompts)
        self.prompt_sums = (self.prompt_sums[0] + pn, self.prompt_sums[1] + ps, self.prompt_sums[2] + pq)
        if self.block_count < JUDGE_BLOCK:
            return None
        count = self.block_count
        out_mean, out_std = _mean_std(count, *self.output_sums)
        prompt_mean, prompt_std = _mean_std(*self.prompt_sums)
        started_at_s, self.block_started_at_s = self.block_started_at_s, None
        self.block_count, self.output_sums, self.prompt_sums = 0, (0.0, 0.0), (0.0, 0.0, 0.0)
        return Block(count, out_mean, out_std, prompt_mean, prompt_std, started_at_s, now_s)


def _mean_std(count: float, total: float, squares: float) -> tuple[float, float]:
    if count <= 0:
        return 0.0, 0.0
    mean = total / count
    return mean, math.sqrt(max(0.0, squares / count - mean * mean))


def _far(mean: float, std: float, count: int, reference: float) -> bool:
    """mean is DISTINCT_Z standard errors (of `count` draws of spread `std`) and a fraction DISTINCT_GAP of
    the reference away from it."""
    if count <= 0 or not (math.isfinite(mean) and math.isfinite(reference)) or reference <= 0:
        return False
    gap = abs(mean - reference)
    return gap > DISTINCT_GAP * reference and gap > DISTINCT_Z * max(std / math.sqrt(count), 1e-9)


def judge_block(block: Block, reference: Reference) -> Verdict:
    """Judge one block against the pool's robust reference (see the module docstring); `excluded` says the
    block is distinct (`EngineJudge.distinct_blocks` counts them in a row)."""
    # The spread is the pool's (the median of the other engines'), which the judged engine cannot inflate.
    if _far(block.output_mean_tokens, reference.output_std_tokens, block.count, reference.output_mean_tokens):
        return Verdict(True, "outputs", block.output_mean_tokens, reference.output_mean_tokens)
    if _far(block.prompt_mean_tokens, reference.prompt_std_tokens, block.count, reference.prompt_mean_tokens):
        return Verdict(True, "prompts", block.prompt_mean_tokens, reference.prompt_mean_tokens)
    return Verdict(False, "", block.output_mean_tokens, reference.output_mean_tokens)
