"""The window after a shift: fitted on the requests admitted since the new law began."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from controlplane.core.admitted_counts import AdmittedCounts
from controlplane.core.types import EngineLimits, OperatorIntent, PolicyConfig
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.engine import EngineLoop
from controlplane.loop.estimate import WINDOW_COHORT_FLAG, PoolEstimate
from controlplane.loop.ingest import EngineHello
from controlplane.loop.pool_stats import PoolStatistics
from controlplane.sim.profiles import PROFILES

COSTS = PROFILES["h200-qwen3-8b"].costs
CONFIG = DecisionLoopConfig(output_window=2048, prompt_window=2048)
TOKENS_PER_S = 32  # per running request


@dataclass
class AdmittingEngine:
    """Every slot always busy: each second each request produces TOKENS_PER_S tokens; a finished one is
    replaced at once by a new one (geometric output length of the current mean), admitted that second."""

    rng: np.random.Generator
    mean_tokens: float
    lengths: np.ndarray
    generated: np.ndarray
    admitted_s: np.ndarray

    @classmethod
    def create(cls, seed: int, *, slots: int, mean_tokens: float, now_s: float) -> AdmittingEngine:
        rng = np.random.default_rng(seed)
        return cls(rng, mean_tokens, rng.geometric(1.0 / mean_tokens, slots), np.zeros(slots, dtype=np.int64),
                   np.full(slots, now_s))

    def second(self, now_s: float) -> dict[str, np.ndarray]:
        """One second ending at now_s: the completions and the running requests, with their admissions."""
        self.generated = np.minimum(self.generated + TOKENS_PER_S, self.lengths)
        done = self.generated >= self.lengths
        outputs, admitted = self.lengths[done].astype(np.float64), self.admitted_s[done].copy()
        self.lengths[done] = self.rng.geometric(1.0 / self.mean_tokens, int(done.sum()))
        self.generated[done] = 0
        self.admitted_s[done] = now_s
        running = self.generated > 0
        return {"prompts": np.full(outputs.size, 500.0), "outputs": outputs, "admitted": admitted,
                "running": self.generated[running], "running_admitted": self.admitted_s[running]}


def run(pool: PoolStatistics, *, before: float, after: float, shift_at_s: float, seconds: int,
        report_admissions: bool = True, slots: int = 1024) -> list[PoolEstimate]:
    """Feed one engine for `seconds` from t = 0 (its mean output changing at shift_at_s); the estimates."""
    engine = AdmittingEngine.create(3, slots=slots, mean_tokens=before, now_s=0.0)
    estimates = []
    for second in range(seconds):
        now_s = second + 0.5
        if second == shift_at_s:
            engine.mean_tokens = after
        data = engine.second(now_s)
        kwargs = {}
        if report_admissions:
            kwargs = {"admitted_age_s": now_s - data["admitted"],
                      "running_admitted_age_s": now_s - data["running_admitted"]}
        pool.add(now_s, prompts=data["prompts"], outputs=data["outputs"], steps=None, engine_id="e0",
                 running_lengths=data["running"], running_counts=np.ones(data["running"].size, dtype=np.int64),
                 **kwargs)
        estimates.append(pool.refresh(second + 1.6, calibration=COSTS))
    return estimates


def with_and_without_admissions(*, before: float, after: float, shift_at_s: int, seconds: int
                                ) -> tuple[list[PoolEstimate], list[PoolEstimate], list[int]]:
    """The estimates of one pool with admissions reported and of one without; the refreshes whose window was
    a cohort (some, none before the shift, and none without admissions)."""
    cohort = run(PoolStatistics("m|a", CONFIG, replica_id="a"), before=before, after=after, shift_at_s=shift_at_s,
                 seconds=seconds)
    mixed = run(PoolStatistics("m|a", CONFIG, replica_id="a"), before=before, after=after, shift_at_s=shift_at_s,
                seconds=seconds, report_admissions=False)
    assert not any(e.window_cohort for e in cohort[:shift_at_s]) and not any(e.window_cohort for e in mixed)
    used = [i for i, e in enumerate(cohort) if e.window_cohort]
    assert used
    return cohort, mixed, used


def mean_error(estimate: PoolEstimate, truth: float) -> float:
    return abs(estimate.fit.stats.mu_o_tokens / truth - 1.0)


def test_after_a_shift_to_shorter_outputs_the_window_holds_the_requests_admitted_since_its_change_point() -> None:
    cohort, mixed, used = with_and_without_admissions(before=1024.0, after=128.0, shift_at_s=150, seconds=200)
    assert cohort[used[0]].last_shift.direction == -1
    for i in used:
        estimate = cohort[i]
        assert not estimate.fit_held and not estimate.window_transient
        assert estimate.window_first_bucket >= estimate.last_shift.start_bucket
        if estimate.window_first_bucket == estimate.last_shift.start_bucket:
            assert estimate.num_truncated == 0  # nobody of the cohort was in flight at its opening
    # once the cohort alone fills the window, it is the newest output_window completions of the cohort
    later = [cohort[i] for i in used if cohort[i].window_first_bucket > cohort[i].last_shift.start_bucket]
    assert later and all(e.num_samples >= CONFIG.output_window for e in later)
    # The old law's requests in flight at the shift finish over a whole old lifetime (1,024 / 32 = 32 s): the
    # window that holds them is far off for that long; the cohort's is not.
    early = used[: len(used) // 2]
    cohort_error = float(np.median([mean_error(cohort[i], 128.0) for i in early]))
    mixed_error = float(np.median([mean_error(mixed[i], 128.0) for i in early if mixed[i].fit is not None]))
    print(f"median |μ̂_O/128 − 1| over {len(early)} refreshes: cohort {cohort_error:.3f}, mixed {mixed_error:.3f}")
    assert cohort_error < 0.1 < mixed_error


def test_after_a_shift_to_longer_outputs_the_window_holds_the_requests_admitted_since_the_new_law_began() -> None:
    """The change point in the completion stream lags the new law's first admissions (its requests finish only
    after their lifetimes); the cohort starts where the admissions changed, and stays there when later
    alarms of the same shift re-base the window again."""
    cohort, mixed, used = with_and_without_admissions(before=64.0, after=512.0, shift_at_s=100, seconds=150)
    assert used[0] <= 106
    assert len({cohort[i].last_shift.start_bucket for i in used}) > 1  # re-based again while in use
    for i in used:
        estimate = cohort[i]
        assert estimate.last_shift.direction == 1 and estimate.last_shift.episode_start_bucket <= 102
        if estimate.num_samples < CONFIG.output_window:
            # the shift's second holds both laws' admissions: the cohort starts with the next one
            assert estimate.window_first_bucket == 101 and estimate.num_truncated == 0
    early = [i for i in used if i < 116]
    cohort_error = float(np.median([mean_error(cohort[i], 512.0) for i in early]))
    mixed_error = float(np.median([mean_error(mixed[i], 512.0) for i in early]))
    print(f"median |μ̂_O/512 − 1| over {len(early)} refreshes: cohort {cohort_error:.3f}, mixed {mixed_error:.3f}")
    assert cohort_error < 0.1 < mixed_error


def test_an_engine_that_does_not_report_admissions_keeps_the_cohort_off() -> None:
    pool = PoolStatistics("m|a", CONFIG, replica_id="a")
    estimates = run(pool, before=1024.0, after=128.0, shift_at_s=150, seconds=170)
    assert any(e.window_cohort for e in estimates)
    pool.add(170.5, prompts=np.full(3, 500.0), outputs=np.array([5.0, 9.0, 20.0]), steps=None, engine_id="e1")
    later = pool.refresh(172.6, calibration=COSTS)  # the bucket of e1's completions does not know them all
    assert later.window_rebased and not later.window_cohort


def test_a_decision_from_a_cohort_window_says_so() -> None:
    estimates = run(PoolStatistics("m|a", CONFIG, replica_id="a"), before=1024.0, after=128.0, shift_at_s=150,
                    seconds=200)
    estimate = next(e for e in estimates if e.window_cohort)
    limits = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=1_500_000,
                          max_model_len_tokens=32768)
    hello = EngineHello(engine_id="e0", model="m", accelerator="a", vllm_version="", agent_version="", limits=limits,
                        block_size_tokens=16)
    loop = EngineLoop(hello=hello, config=CONFIG, policy=PolicyConfig(min_samples=400))
    loop.decide(estimate, intent=OperatorIntent(), now_s=300.0)
    assert WINDOW_COHORT_FLAG in loop.latest.flags
    loop.decide(estimates[100], intent=OperatorIntent(), now_s=301.0)
    assert WINDOW_COHORT_FLAG not in loop.latest.flags
    # a cohort is not a cold start, also once the window without it would be full (no longer re-based)
    full = next(e for e in estimates if e.window_cohort and not e.window_rebased)
    strict = EngineLoop(hello=hello, config=CONFIG, policy=PolicyConfig(min_samples=full.num_samples + 1))
    outcome = strict.decide(full, intent=OperatorIntent(), now_s=302.0)
    assert outcome.decision.reason != "insufficient_data" and WINDOW_COHORT_FLAG in strict.latest.flags


def test_admitted_counts_sum_pairs_select_by_admission_and_round_trip() -> None:
    counts = AdmittedCounts.from_columns(np.array([7, 5, 7, 9, 5]), np.array([3, 3, 3, 1, 0]),
                                         np.array([1, 2, 4, 1, 6]))  # length 0: no information, dropped
    assert list(zip(counts.admitted.tolist(), counts.lengths.tolist(), counts.counts.tolist(), strict=True)) == [
        (5, 3, 2), (7, 3, 5), (9, 1, 1)]
    assert counts.count == 8
    assert counts.since(6).lengths.tolist() == [1, 3] and counts.since(6).counts.tolist() == [1, 5]
    assert counts.since(10).count == 0
    capped = counts.cap_admission(8)  # admissions before bucket 8 sit at 7: since(8) stays exact
    assert capped.since(8).count == 1 and capped.since(7).count == 8
    merged = AdmittedCounts.merge([counts, AdmittedCounts.from_columns(np.array([9]), np.array([1]))])
    assert merged.since(9).counts.tolist() == [2]
    restored = AdmittedCounts.from_bytes(counts.to_bytes())
    assert restored.counts.tolist() == counts.counts.tolist() and restored.admitted.tolist() == [5, 7, 9]
    for garbage in (b"", counts.to_bytes()[:-1], b"\x01" + b"\x00" * 7 + b"\x00" * 24):
        with pytest.raises(ValueError):
            AdmittedCounts.from_bytes(garbage)
