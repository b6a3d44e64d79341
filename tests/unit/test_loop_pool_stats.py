"""Per-pool mergeable statistics: decisions from histograms equal decisions from sample windows, buckets
survive serialisation, two replicas that exchange buckets compute the same estimate, cost sums recover a
known cost model and keep outliers out."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.core.cost_sums import CostSums, StepColumns, predict_duration_s
from controlplane.core.hazard import MEAN_LOWER_BOUND_Z
from controlplane.core.length_histogram import LengthHistogram
from controlplane.core.policy import decide
from controlplane.core.survival import running_mean_lower_bound
from controlplane.core.types import EngineLimits, Observations, OperatorIntent, PolicyConfig, PolicyState
from controlplane.loop.buckets import FAIR_SHARE_FACTOR, MAX_STEPS_PER_BUCKET, MIN_FAIR_SHARE, BucketStats
from controlplane.loop.config import DecisionLoopConfig
from controlplane.loop.pool_stats import PoolStatistics
from controlplane.sim.profiles import PROFILES
from tests.unit.sample_fit import fit_from_samples

COSTS = PROFILES["h200-qwen3-8b"].costs
LIMITS = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=1_500_000,
                      max_model_len_tokens=32768)
CONFIG = DecisionLoopConfig(output_window=4096, prompt_window=4096)


def _window(rng: np.random.Generator, shape: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    if shape == "geometric":
        outputs = rng.geometric(1 / 300, size)
    elif shape == "uniform":
        outputs = rng.integers(1, 800, size)
    else:
        outputs = np.minimum(np.ceil(rng.lognormal(5.0, 1.0, size)), 30000)
    return rng.integers(16, 2048, size).astype(np.float64), outputs.astype(np.float64)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("shape", ["geometric", "uniform", "lognormal"])
def test_histogram_decisions_equal_sample_window_decisions(seed: int, shape: str) -> None:
    rng = np.random.default_rng(seed)
    prompts, outputs = _window(rng, shape, int(rng.integers(400, 4096)))
    pool = PoolStatistics("m|a", CONFIG, replica_id="r0")
    pool.add(100.2, prompts=prompts, outputs=outputs, steps=None)
    estimate = pool.refresh(102.0, calibration=COSTS)
    assert estimate.num_samples == outputs.size
    policy = PolicyConfig()
    n_obs = float(rng.integers(10, 1000))
    raw = Observations(costs=COSTS, limits=LIMITS, n_obs=n_obs)
    via_window, _ = decide(raw, PolicyState(), 0.0, intent=OperatorIntent(), config=policy,
                           fit=fit_from_samples(outputs, prompts))
    pooled = Observations(costs=estimate.costs, limits=LIMITS, n_obs=n_obs)
    via_pool, _ = decide(pooled, PolicyState(), 0.0, intent=OperatorIntent(), config=policy, fit=estimate.fit)
    assert (via_pool.mode, via_pool.k, via_pool.n) == (via_window.mode, via_window.k, via_window.n)
    assert via_pool.diagnostics.theta_star == pytest.approx(via_window.diagnostics.theta_star, abs=1e-6)
    assert via_pool.diagnostics.n_star == via_window.diagnostics.n_star


def test_a_bucket_survives_serialisation_and_garbage_is_refused() -> None:
    rng = np.random.default_rng(1)
    prompts, outputs = _window(rng, "geometric", 500)
    pool = PoolStatistics("m|a", CONFIG, replica_id="r0")
    steps = StepColumns(np.array([512.0, 0.0]), np.array([0.0, 40.0]), np.array([0.0, 40.0]), np.array([0.02, 0.01]))
    pool.add(10.5, prompts=prompts, outputs=outputs, steps=steps)
    closed = pool.close_due(11.0)
    assert closed is not None and closed[1] == 10
    stats = BucketStats.from_bytes(closed[0].to_bytes())
    assert stats.outputs.count == 500 and stats.prompt_count == 500
    assert stats.prompt_sum_tokens == pytest.approx(prompts.sum())
    assert np.array_equal(stats.costs.to_array(), closed[0].costs.to_array())
    for garbage in (b"", b"nope", closed[0].to_bytes()[:-3], b"XXXX" + closed[0].to_bytes()[4:]):
        with pytest.raises(ValueError):
            BucketStats.from_bytes(garbage)


def test_two_replicas_that_exchange_buckets_compute_the_same_estimate() -> None:
    rng = np.random.default_rng(2)
    a = PoolStatistics("m|a", CONFIG, replica_id="a")
    b = PoolStatistics("m|a", CONFIG, replica_id="b")
    for second in range(20):
        for replica in (a, b):
            prompts, outputs = _window(rng, "geometric", 50)
            replica.add(second + 0.3, prompts=prompts, outputs=outputs, steps=None)
        for source, target in ((a, b), (b, a)):
            closed = source.close_due(second + 1.0)
            if closed is not None:
                target.put_remote(closed[1], source.replica_id, closed[0])
    est_a = a.refresh(21.0, calibration=COSTS)
    est_b = b.refresh(21.0, calibration=COSTS)
    assert est_a.end_bucket == est_b.end_bucket
    assert est_a.contributors == est_b.contributors == ("a", "b")
    assert est_a.num_samples == est_b.num_samples
    assert est_a.fit.stats == est_b.fit.stats


def test_cost_sums_recover_a_known_model_and_keep_stalls_out() -> None:
    rng = np.random.default_rng(3)
    n = 3000
    kind = rng.integers(0, 3, n)
    prefill = np.where(kind != 1, rng.integers(64, 4096, n), 0).astype(np.float64)
    decode = np.where(kind != 0, rng.integers(1, 256, n), 0).astype(np.float64)
    duration = predict_duration_s(COSTS, prefill, decode, decode) * rng.normal(1.0, 0.01, n)
    stalls = rng.random(n) < 0.02
    stalled = np.where(stalls, duration * 50.0, duration)
    sums = CostSums()
    sums.add_steps(StepColumns(prefill, decode, decode, stalled), reference=COSTS)
    assert sums.num_rejected == int(stalls.sum())
    fitted = sums.fit().to_cost_model()
    assert fitted.alpha_p_s == pytest.approx(COSTS.alpha_p_s, rel=0.05)
    assert fitted.beta_p_s_per_token == pytest.approx(COSTS.beta_p_s_per_token, rel=0.02)
    assert fitted.alpha_d_s == pytest.approx(COSTS.alpha_d_s, rel=0.02)
    assert fitted.beta_d_s_per_request == pytest.approx(COSTS.beta_d_s_per_request, rel=0.05)
    restored = CostSums.from_array(sums.to_array())
    assert restored.fit() == sums.fit()
    with pytest.raises(ValueError):
        CostSums.from_array(np.array([np.nan] * sums.to_array().size))


def test_a_seeded_window_warm_starts_a_pool_and_newer_buckets_take_over() -> None:
    rng = np.random.default_rng(5)
    earlier = PoolStatistics("m|a", CONFIG, replica_id="r0")
    prompts, outputs = _window(rng, "geometric", 4096)
    earlier.add(10.2, prompts=prompts, outputs=outputs, steps=None)
    earlier.refresh(13.0, calibration=COSTS)
    snapshot = BucketStats.from_bytes(earlier.last_window.to_bytes())
    fresh = PoolStatistics("m|a", CONFIG, replica_id="r1")
    fresh.seed(snapshot, now_s=5000.0)
    warm = fresh.refresh(5000.0, calibration=COSTS)
    assert warm.num_samples == 4096 and warm.fit.stats == earlier.estimate.fit.stats
    # New data in newer buckets replaces the snapshot once it fills the window.
    for second in range(4):
        p, o = _window(rng, "uniform", 1100)
        fresh.add(5000.2 + second, prompts=p, outputs=o, steps=None)
    later = fresh.refresh(5006.0, calibration=COSTS)
    assert later.num_samples == 4400  # the four new buckets alone: the snapshot no longer counts


def test_an_engine_counts_in_a_bucket_for_at_most_its_fair_share() -> None:
    """20 engines send 100 completions each in one second and one engine 100,000 (long prompts, long outputs):
    the bucket keeps the 20 engines' completions whole and FAIR_SHARE_FACTOR × 100 evenly spaced ones of the
    loud engine, with its prompts scaled alike; its volume is not its vote."""
    rng = np.random.default_rng(8)
    pool = PoolStatistics("m|a", CONFIG, replica_id="r0")
    honest_outputs, honest_prompts = [], []
    for engine in range(20):
        outputs = rng.geometric(1 / 256, 100).astype(np.float64)
        prompts = rng.integers(256, 768, 100).astype(np.float64)
        pool.add(0.1 + engine / 100, prompts=prompts, outputs=outputs, steps=None, engine_id=f"honest-{engine}")
        honest_outputs.append(outputs)
        honest_prompts.append(prompts)
    loud_outputs = np.full(100_000, 480.0)
    pool.add(0.5, prompts=np.full(100_000, 7000.0), outputs=loud_outputs, steps=None, engine_id="loud")
    stats, _ = pool.close_due(1.0)
    share = int(FAIR_SHARE_FACTOR * 100)
    assert stats.outputs.count == 20 * 100 + share
    kept = np.repeat(stats.outputs.lengths, stats.outputs.counts)
    assert int((kept == 480).sum()) == share + int((np.concatenate(honest_outputs) == 480).sum())
    assert stats.prompt_count == 20 * 100 + share
    assert stats.prompt_sum_tokens == pytest.approx(float(np.concatenate(honest_prompts).sum()) + share * 7000.0)
    # Without the loud engine's excess, the bucket's mean prompt is within 3× of the honest one (not 13×).
    assert stats.prompt_sum_tokens / stats.prompt_count < 3 * float(np.concatenate(honest_prompts).mean())


def test_a_bucket_closes_over_every_batch_added_to_it() -> None:
    """A thousand engines' batches of one second, each within its fair share: the closed bucket holds every
    completion and prompt, and the cost sums the bucket's steps evenly thinned to MAX_STEPS_PER_BUCKET, first
    and last included."""
    rng = np.random.default_rng(4)
    pool = PoolStatistics("m|a", CONFIG, replica_id="r0")
    outputs, prompts, steps = [], [], []
    for engine in range(1000):
        size = int(rng.integers(0, MIN_FAIR_SHARE + 1))
        batch_outputs = rng.geometric(1 / 300, size).astype(np.float64)
        batch_prompts = rng.integers(16, 2048, size).astype(np.float64)
        num_steps = int(rng.integers(1, 64))
        prefill = rng.integers(0, 2, num_steps) * rng.integers(64, 4096, num_steps).astype(np.float64)
        decode = rng.integers(1, 256, num_steps).astype(np.float64)
        batch_steps = StepColumns(prefill, decode, decode, predict_duration_s(COSTS, prefill, decode, decode))
        pool.add(0.5 + engine / 4000, prompts=batch_prompts, outputs=batch_outputs, steps=batch_steps,
                 engine_id=f"e{engine}")
        outputs.append(batch_outputs)
        prompts.append(batch_prompts)
        steps.append(batch_steps)
    closed = pool.close_due(1.0)
    assert closed is not None and closed[1] == 0
    stats = closed[0]
    all_outputs = np.concatenate(outputs)
    assert stats.outputs.count == all_outputs.size
    np.testing.assert_array_equal(np.repeat(stats.outputs.lengths, stats.outputs.counts), np.sort(all_outputs))
    assert stats.prompt_count == sum(p.size for p in prompts)
    assert stats.prompt_sum_tokens == pytest.approx(float(np.concatenate(prompts).sum()))
    columns = [np.concatenate([getattr(s, name) for s in steps])
               for name in ("prefill_tokens", "decode_tokens", "decode_requests", "duration_s")]
    assert columns[0].size > MAX_STEPS_PER_BUCKET
    keep = np.linspace(0, columns[0].size - 1, MAX_STEPS_PER_BUCKET).astype(np.int64)
    expected = CostSums()
    expected.add_steps(StepColumns(*(column[keep] for column in columns)))
    np.testing.assert_allclose(stats.costs.to_array(), expected.to_array(), rtol=1e-12)
    assert pool.close_due(1.5) is None  # nothing open any more


def test_before_its_first_completion_a_pool_floors_the_mean_output_by_its_running_requests() -> None:
    """No completion yet: no fit, but the running requests prove a floor on μ_O
    (`survival.running_mean_lower_bound`), counting those already running at the first bucket only past
    their lengths then; a replica that receives the buckets proves the same. Once a completion is held, the
    floor is the fit's; it stays so after the completion's bucket ages out."""
    empty = np.zeros(0)
    pool = PoolStatistics("m|a", CONFIG, replica_id="r0")

    def report(now_s: float, lengths: list[int], counts: list[int], outputs: np.ndarray = empty):
        return pool.add(now_s, prompts=np.full(outputs.size, 64.0), outputs=outputs, steps=None, engine_id="e0",
                 running_lengths=np.array(lengths, dtype=np.int64), running_counts=np.array(counts, dtype=np.int64))

    report(0.2, [5], [100])  # the first requests, 5 tokens in when the first bucket closes
    closed = [report(1.2, [100, 105], [300, 100]), pool.close_due(2.0)]  # 300 more since; the first at 105
    assert pool.refresh(2.0, calibration=COSTS).mu_o_lower_tokens == 1.0  # the first bucket alone: nothing
    first = pool.refresh(3.0, calibration=COSTS)
    entered = LengthHistogram.from_counts(np.array([5]), np.array([100]))
    running = LengthHistogram.from_counts(np.array([100, 105]), np.array([300, 100]))
    expected = running_mean_lower_bound(running, z=MEAN_LOWER_BOUND_Z, entered=entered)
    assert first.fit is None and first.mu_o_lower_tokens == expected and 95.0 < expected < 105.0
    other = PoolStatistics("m|a", CONFIG, replica_id="r1")
    for stats, bucket_id in closed:
        other.put_remote(bucket_id, "r0", stats)
    assert other.refresh(3.0, calibration=COSTS).mu_o_lower_tokens == expected
    report(3.2, [100, 105], [300, 100], outputs=np.random.default_rng(8).geometric(1 / 300, 50).astype(float))
    fitted = pool.refresh(5.0, calibration=COSTS)
    assert fitted.fit is not None and fitted.mu_o_lower_tokens == fitted.fit.mu_o_lower_tokens
    report(CONFIG.max_window_s + 10.2, [100, 105], [300, 100])
    aged = pool.refresh(CONFIG.max_window_s + 12.0, calibration=COSTS)
    assert aged.fit is None and aged.mu_o_lower_tokens == 1.0


def test_an_engine_that_joins_with_old_requests_does_not_inflate_the_running_only_floor() -> None:
    """A second engine joins a pool with no completion yet carrying 500 requests 500 tokens in (a draining
    batch whose short requests finished before it connected; they reach 600 a second later): its requests
    count at risk only past 500, so the floor is what the first engine's young requests prove, even after the
    second one leaves. As if seen from their start they would have "proved" about 590."""
    empty = np.zeros(0)
    pool = PoolStatistics("m|a", CONFIG, replica_id="r0")

    def report(now_s: float, engine_id: str, lengths: list[int], counts: list[int]) -> None:
        pool.add(now_s, prompts=empty, outputs=empty, steps=None, engine_id=engine_id,
                 running_lengths=np.array(lengths, dtype=np.int64), running_counts=np.array(counts, dtype=np.int64))

    report(0.2, "fresh", [5], [100])
    report(1.2, "fresh", [100, 105], [300, 100])
    report(1.3, "late", [500], [500])
    report(2.2, "fresh", [200, 205], [300, 100])
    report(2.3, "late", [600], [500])
    pool.close_due(3.0)
    floor = pool.refresh(3.6, calibration=COSTS).mu_o_lower_tokens
    assert 150.0 < floor < 206.0
    pool.forget_engine("late")  # it left: its requests are still in the closed buckets
    assert pool.refresh(3.6, calibration=COSTS).mu_o_lower_tokens == floor
