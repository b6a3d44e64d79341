"""Decisions per KV-transfer role (disaggregated prefill/decode): the core (`core.kv_role` through
`policy.decide`) and the twin (`sim.control.OnlineControl` driving `loop.FleetState` for a decode instance
whose prompts' KV arrives computed, and for a prefill instance whose requests end at their first token)."""

from __future__ import annotations

from dataclasses import replace
from functools import cache

import numpy as np
import pytest

from controlplane.core.batch_size import occupancy_batch_size
from controlplane.core.hazard import HazardFit
from controlplane.core.policy import decide
from controlplane.core.types import (
    EngineLimits,
    Flag,
    KvRole,
    Mode,
    ModePin,
    Observations,
    OperatorIntent,
    PolicyConfig,
    PolicyState,
    Reason,
)
from controlplane.sim.arrivals import closed_loop
from controlplane.sim.lengths import FixedLengths, LengthShape, UniformLengths
from controlplane.sim.profiles import RTX_PRO_6000_QWEN3_8B, get_profile
from controlplane.sim.runner import run_scenario
from controlplane.sim.schedulers import parse_scheduler
from tests.unit.sample_fit import fit_from_samples

# A KV cache that binds a decode instance's N (about 260 slots of 512-token prompts and 256-token outputs).
LIMITS = EngineLimits(max_num_seqs=1024, max_num_batched_tokens=8192, kv_capacity_tokens=200_000,
                      max_model_len_tokens=32768)
NO_COOLDOWN = PolicyConfig(cooldown_s=0.0)
H200 = get_profile("h200-qwen3-8b")


@cache
def fit(*, n: int = 2000, output_mean_tokens: float = 256.0) -> HazardFit | None:
    """A window of n geometric outputs behind 512-token prompts (outputs of 1 token: a prefill instance's)."""
    outputs = np.random.default_rng(0).geometric(1.0 / output_mean_tokens, n).astype(np.float64)
    return fit_from_samples(outputs, np.full(n, 512.0))


def observations(role: KvRole, *, n_obs: float = 512.0, costs=RTX_PRO_6000_QWEN3_8B) -> Observations:
    return Observations(costs=costs, limits=replace(LIMITS, kv_role=role), n_obs=n_obs)


def test_a_workload_eb_wins_on_a_whole_engine_is_mb_with_the_moment_bound_n_on_a_decode_instance() -> None:
    whole, _ = decide(observations(KvRole.NONE), PolicyState(), 100.0, config=NO_COOLDOWN, fit=fit())
    assert (whole.mode, whole.reason) == (Mode.EB, Reason.CROSSOVER_EB)
    both, _ = decide(observations(KvRole.BOTH), PolicyState(), 100.0, config=NO_COOLDOWN, fit=fit())
    assert both == whole  # kv_both runs whole requests: every rule applies
    consumer, state = decide(observations(KvRole.CONSUMER), PolicyState(), 100.0, config=NO_COOLDOWN, fit=fit())
    assert (consumer.mode, consumer.reason) == (Mode.MB, Reason.KV_CONSUMER)
    assert Flag.EB_MOOT in consumer.flags
    stats = fit().stats
    bound = occupancy_batch_size(mu_l_tokens=stats.mu_l_tokens, mu_o_tokens=stats.mu_o_tokens,
                                 sigma_o_tokens=stats.sigma_o_tokens, kv_capacity_tokens=200_000.0,
                                 oom_tolerance=PolicyConfig().oom_tolerance, max_num_seqs=1024)
    assert consumer.n == bound.n == consumer.diagnostics.n_star and 100 < consumer.n < 1024
    assert consumer.k == 1  # EB's threshold acts on nothing here
    assert consumer.budget == whole.budget  # P-PAS still caps the prefills recomputed locally
    diag = consumer.diagnostics
    assert (diag.theta0, diag.theta_star, diag.k_star, diag.lhs_s_per_token, diag.rhs_s_per_token) == (0, 0, 0, 0, 0)
    assert diag.mu_o_tokens == whole.diagnostics.mu_o_tokens and diag.num_samples == 2000
    assert state.mode == Mode.MB and state.n_eb_in_force == 0  # never EB online, no memory guard of EB's N


def test_a_decode_instance_admits_every_slot_until_its_pool_has_data_and_needs_no_cost_model() -> None:
    config = PolicyConfig(min_samples=400)
    cold, _ = decide(observations(KvRole.CONSUMER), PolicyState(), 0.0, config=config, fit=fit(n=100))
    assert (cold.mode, cold.reason, cold.n, cold.k) == (Mode.MB, Reason.INSUFFICIENT_DATA, 1024, 1)
    assert Flag.EB_MOOT in cold.flags
    assert cold.diagnostics.lhs_s_per_token == 0.0  # the cold-start verdict is moot too
    no_costs, _ = decide(observations(KvRole.CONSUMER, costs=None), PolicyState(), 0.0, config=config, fit=fit())
    assert (no_costs.mode, no_costs.reason) == (Mode.MB, Reason.KV_CONSUMER)
    assert no_costs.n < 1024  # N is a bound on lengths alone


def test_a_prefill_instance_runs_mb_with_b_max_in_every_step_and_every_slot() -> None:
    single = fit(output_mean_tokens=1.0)  # every request ends at its first token
    assert single is not None and single.stats.mu_o_tokens == 1.0
    whole, _ = decide(observations(KvRole.NONE), PolicyState(), 100.0, config=NO_COOLDOWN, fit=single)
    assert whole.budget.b_cap_tokens < whole.budget.b_max_tokens  # a whole engine's P-PAS cap
    for window in (single, None):  # with its pool's window, and before its first completion
        producer, state = decide(observations(KvRole.PRODUCER), PolicyState(), 100.0, config=NO_COOLDOWN,
                                 fit=window)
        assert (producer.mode, producer.reason) == (Mode.MB, Reason.KV_PRODUCER)
        assert Flag.EB_MOOT in producer.flags
        assert producer.budget == replace(whole.budget, b_cap_tokens=whole.budget.b_max_tokens)
        assert (producer.n, producer.k) == (LIMITS.max_num_seqs, 1)
        assert state.mode == Mode.MB


@pytest.mark.parametrize("role", [KvRole.CONSUMER, KvRole.PRODUCER])
def test_an_operator_pin_still_wins_on_a_role_and_the_decision_says_eb_is_moot(role: KvRole) -> None:
    pinned = OperatorIntent(pin=ModePin(mode=Mode.EB, k=8, n=64))
    decision, state = decide(observations(role), PolicyState(), 0.0, intent=pinned, config=NO_COOLDOWN, fit=fit())
    assert (decision.mode, decision.reason, decision.k, decision.n) == (Mode.EB, Reason.OPERATOR_PIN, 8, 64)
    assert Flag.EB_MOOT in decision.flags and state.mode == Mode.MB
    stock = OperatorIntent(pin=ModePin(mode=Mode.PASSTHROUGH))
    assert decide(observations(role), PolicyState(), 0.0, intent=stock, fit=fit())[0].mode == Mode.PASSTHROUGH
    # A rollout's hold is not an operator's pin: the role decides.
    held = OperatorIntent(pin=ModePin(mode=Mode.EB, reason=Reason.ROLLOUT_HOLD))
    assert decide(observations(role), PolicyState(), 0.0, intent=held, config=NO_COOLDOWN, fit=fit())[0].mode == Mode.MB


@pytest.mark.parametrize("role", list(KvRole))
@pytest.mark.parametrize("capacity", [1, 5_000, 200_000, 10**9])
@pytest.mark.parametrize("output_mean", [1.0, 16.0, 4096.0])
def test_role_decisions_keep_the_cores_guarantees(role: KvRole, capacity: int, output_mean: float) -> None:
    limits = replace(LIMITS, kv_capacity_tokens=capacity, kv_role=role)
    decision, _ = decide(Observations(costs=RTX_PRO_6000_QWEN3_8B, limits=limits, n_obs=64.0), PolicyState(), 0.0,
                         fit=fit(output_mean_tokens=output_mean))
    assert 1 <= decision.k <= decision.n <= limits.max_num_seqs
    assert decision.budget.b_cap_tokens <= decision.budget.b_max_tokens <= limits.max_num_batched_tokens
    assert (Flag.EB_MOOT in decision.flags) == (role in (KvRole.CONSUMER, KvRole.PRODUCER))


# ---------------------------------------------------------------------------------------------------- twin

# A decode instance: each prompt's KV arrives computed (the twin's engine serves it as cached blocks) but for
# its last token, which is recomputed here; outputs of 256 on average.
DECODE_SIDE = LengthShape(name="decode-instance", prompt=FixedLengths(1),
                          output=UniformLengths(nominal_mean_tokens=256),
                          shared_prefix=UniformLengths(nominal_mean_tokens=2048), source="a kv_consumer's requests")
# A prefill instance: whole prompts, one output token each (a proxy asks it for one).
PREFILL_SIDE = LengthShape(name="prefill-instance", prompt=UniformLengths(nominal_mean_tokens=2048),
                           output=FixedLengths(1), source="a kv_producer's requests")


def test_the_twin_runs_a_decode_instance_in_mb_under_its_moment_bound_where_a_whole_engine_goes_eb() -> None:
    workload = closed_loop(DECODE_SIDE, concurrency=768, num_requests=3000)
    whole = run_scenario(workload, parse_scheduler("eb+"), H200, seed=0)
    assert "eb" in {d.mode for d in whole.timeline}  # the same lengths on a whole engine: EB by the rule
    result = run_scenario(workload, parse_scheduler("eb+@role=consumer"), H200, seed=0)
    timeline = result.timeline
    assert {d.mode for d in timeline} == {"mb"} and all("eb_moot" in d.flags for d in timeline)
    assert timeline[0].reason == "insufficient_data" and timeline[0].n == H200.shape.max_num_seqs
    sized = [d for d in timeline if d.reason == "kv_consumer"]
    assert sized and all(d.n == d.n_star and 200 < d.n < H200.shape.max_num_seqs for d in sized)
    assert max(result.steps["num_running"]) > sized[0].n  # before its pool had data, every slot was open
    assert result.metrics.num_completed == 3000
    # With its pool's window from the start (a warm start), N holds from the first step: no request loses the
    # KV it received, where stock scheduling preempts (and recomputes whole prompts locally).
    warm = run_scenario(workload, replace(parse_scheduler("eb+@role=consumer"), warm_start=result.pool_window), H200,
                        seed=1)
    assert warm.timeline[0].reason == "kv_consumer" and warm.metrics.num_preemptions == 0
    assert run_scenario(workload, parse_scheduler("v1"), H200, seed=1).metrics.num_preemptions > 0


def test_the_twin_runs_a_prefill_instance_in_mb_with_b_max_in_every_step() -> None:
    result = run_scenario(closed_loop(PREFILL_SIDE, concurrency=256, num_requests=2000),
                          parse_scheduler("eb+@role=producer"), H200, seed=0)
    assert result.timeline and all(
        (d.mode, d.reason, d.n, d.k) == ("mb", "kv_producer", H200.shape.max_num_seqs, 1)
        and d.b_cap_tokens == d.b_max_tokens and "eb_moot" in d.flags for d in result.timeline)
    assert result.metrics.num_completed == 2000


def test_a_role_is_an_option_of_the_online_schedulers_only() -> None:
    assert parse_scheduler("eb+@role=both").kv_role == KvRole.BOTH
    with pytest.raises(ValueError, match="@role takes producer, consumer or both"):
        parse_scheduler("eb+@role=decode")
    with pytest.raises(ValueError, match="apply to eb-kstar and eb\\+ only"):
        parse_scheduler("v1@role=consumer")
