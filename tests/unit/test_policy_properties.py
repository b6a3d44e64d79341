"""Property tests of the policy: decide() and evaluate() keep their guarantees for any input whatsoever (decide()
on the hazard fit of arbitrary length arrays, fitted through the histogram path: `tests.unit.sample_fit`)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.core.budget import SweepPoint
from controlplane.core.policy import decide, evaluate
from controlplane.core.types import (
    DELTA_LIMIT_S_PER_TOKEN,
    CostModel,
    Decision,
    DeltaSource,
    EngineLimits,
    Evaluation,
    Flag,
    Mode,
    ModePin,
    Observations,
    OperatorIntent,
    PolicyConfig,
    PolicyState,
    Reason,
    WorkloadStats,
)
from controlplane.sim.profiles import H200_QWEN3_8B, RTX_PRO_6000_QWEN3_8B
from tests.unit.sample_fit import fit_from_samples

# numpy warns (and carries on) when absurd inputs such as 1e308-token outputs overflow a mean.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

H200, RTX_PRO_6000 = H200_QWEN3_8B, RTX_PRO_6000_QWEN3_8B  # the published profiles the twin ships

any_float = st.floats(allow_nan=True, allow_infinity=True)
nasty = st.sampled_from([0.0, -0.0, -1.0, 0.5, 1.0, 1e-300, 5e-324, 1e300, 1.7e308, 2.0**63, math.inf, -math.inf,
                         math.nan])
lengths = st.one_of(st.integers(min_value=1, max_value=5000).map(float), any_float, nasty)


@st.composite
def length_arrays(draw) -> np.ndarray:
    """Arbitrary arrays (NaN, inf, negatives, zeros, huge, empty) or real-looking windows with garbage mixed in."""
    if draw(st.booleans()):
        return np.array(draw(st.lists(lengths, max_size=60)), dtype=np.float64)
    rng = np.random.default_rng(draw(st.integers(min_value=0, max_value=2**32 - 1)))
    p = draw(st.floats(min_value=1e-4, max_value=1.0))
    window = rng.geometric(p, size=draw(st.integers(min_value=0, max_value=600))).astype(np.float64)
    garbage = np.array(draw(st.lists(nasty, max_size=5)), dtype=np.float64)
    return np.concatenate((window, garbage))


cost_models = st.one_of(
    st.none(),
    st.sampled_from([H200, RTX_PRO_6000]),
    st.builds(CostModel, any_float, any_float, any_float, any_float, any_float,
              st.tuples(any_float, any_float, any_float)),
    st.builds(CostModel, *(st.floats(min_value=1e-9, max_value=10.0) for _ in range(5)),
              st.tuples(*(st.floats(min_value=-1e-3, max_value=1e-3) for _ in range(3)))),
)
engine_limits = st.builds(
    EngineLimits,
    max_num_seqs=st.one_of(st.integers(min_value=1, max_value=4096), st.integers(min_value=1, max_value=2**40)),
    max_num_batched_tokens=st.integers(min_value=1, max_value=2**31),
    kv_capacity_tokens=st.integers(min_value=0, max_value=10**12),
    max_model_len_tokens=st.integers(min_value=0, max_value=10**7),
)
intents = st.builds(
    OperatorIntent,
    delta_s_per_token=st.one_of(st.none(), any_float, st.floats(min_value=-2e-2, max_value=2e-2)),
    delta_source=st.sampled_from(DeltaSource),
    pin=st.builds(
        ModePin,
        mode=st.one_of(st.none(), st.sampled_from(Mode)),
        k=st.one_of(st.none(), st.integers(), st.integers(min_value=-2, max_value=20)),
        n=st.one_of(st.none(), st.integers(), st.integers(min_value=-2, max_value=20)),
        advisory=st.booleans(),
    ),
)
states = st.builds(
    PolicyState,
    n_prev=st.one_of(st.integers(min_value=-(2**63), max_value=2**63), st.integers(min_value=0, max_value=5000)),
    mode=st.sampled_from(Mode),
    last_switch_s=any_float,
    n_guard=st.one_of(st.integers(min_value=-(2**63), max_value=2**63), st.integers(min_value=0, max_value=5000)),
    n_eb_in_force=st.one_of(st.integers(min_value=-(2**63), max_value=2**63),
                            st.integers(min_value=0, max_value=5000)),
)
configs = st.one_of(
    st.just(PolicyConfig()),
    st.builds(
        PolicyConfig,
        min_samples=st.integers(min_value=1, max_value=100),
        oom_tolerance=st.floats(min_value=1e-12, max_value=0.99),
        default_delta_s_per_token=st.floats(min_value=-DELTA_LIMIT_S_PER_TOKEN, max_value=DELTA_LIMIT_S_PER_TOKEN),
        hysteresis_rel=st.floats(min_value=0.0, max_value=10.0),
        cooldown_s=st.floats(min_value=0.0, max_value=1e6),
    ),
)
sweeps = st.lists(st.builds(SweepPoint, st.integers(min_value=-5, max_value=10**5), any_float, any_float),
                  max_size=6)


def assert_all_finite(record: object) -> None:
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        if isinstance(value, float | int) and not isinstance(value, bool):
            assert math.isfinite(value), f"{field.name} = {value}"


def assert_decision_contract(decision: Decision, limits: EngineLimits, intent: OperatorIntent) -> None:
    assert isinstance(decision, Decision)
    assert 1 <= decision.k <= decision.n <= limits.max_num_seqs
    assert 1 <= decision.budget.b_cap_tokens <= decision.budget.b_max_tokens <= limits.max_num_batched_tokens
    assert_all_finite(decision.diagnostics)
    assert math.isfinite(decision.delta_s_per_token)
    assert abs(decision.delta_s_per_token) <= DELTA_LIMIT_S_PER_TOKEN
    assert decision.advisory == intent.pin.advisory
    if intent.pin.mode is not None:
        assert (decision.mode, decision.reason) == (intent.pin.mode, Reason.OPERATOR_PIN)
    else:
        assert decision.mode in (Mode.MB, Mode.EB)
        assert decision.reason != Reason.OPERATOR_PIN
    if intent.pin.n is not None and 1 <= intent.pin.n <= limits.max_num_seqs:
        assert decision.n == intent.pin.n


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    outputs=length_arrays(),
    prompts=length_arrays(),
    costs=cost_models,
    limits=engine_limits,
    n_obs=st.one_of(any_float, st.floats(min_value=0.0, max_value=5000.0)),
    rejected=st.integers(min_value=-10, max_value=10**9),
    preemptions=st.integers(min_value=-10, max_value=10**9),
    state=states,
    now_s=any_float,
    intent=st.one_of(st.none(), intents),
    config=configs,
    sweep=sweeps,
)
def test_decide_never_raises_and_keeps_its_guarantees(
    outputs, prompts, costs, limits, n_obs, rejected, preemptions, state, now_s, intent, config, sweep
) -> None:
    observations = Observations(costs=costs, limits=limits, n_obs=n_obs, num_rejected_samples=rejected,
                                num_preemptions=preemptions)
    decision, new_state = decide(observations, state, now_s, intent=intent, config=config, budget_sweep=sweep,
                                 fit=fit_from_samples(outputs, prompts))
    assert_decision_contract(decision, limits, intent or OperatorIntent())
    assert isinstance(new_state, PolicyState)
    assert new_state.mode in (Mode.MB, Mode.EB)
    assert decision.diagnostics.num_rejected_samples == max(0, rejected)
    # The memory guard only ever lowers the computed N (never below 1, never above N̂*).
    if Flag.MEMORY_GUARD in decision.flags:
        assert decision.mode == Mode.EB
        computed = decision.diagnostics.n_star or limits.max_num_seqs  # no evaluation: N = max_num_seqs
        assert 1 <= decision.n < computed


@settings(max_examples=300, deadline=None)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    p0=st.floats(min_value=1e-3, max_value=0.5),
    n=st.integers(min_value=50, max_value=1500),
    costs=st.sampled_from([H200, RTX_PRO_6000]),
    limits=engine_limits,
    n_obs=st.floats(min_value=0.0, max_value=4096.0),
    state=states,
    now_s=st.floats(min_value=-1e9, max_value=1e9),
)
def test_decide_on_real_windows_follows_the_evaluation(seed, p0, n, costs, limits, n_obs, state, now_s) -> None:
    rng = np.random.default_rng(seed)
    fit = fit_from_samples(rng.geometric(p0, size=n).astype(np.float64),
                           rng.integers(1, 4096, size=n).astype(np.float64))
    observations = Observations(costs=costs, limits=limits, n_obs=n_obs)
    config = PolicyConfig(min_samples=50)
    decision, new_state = decide(observations, state, now_s, config=config, fit=fit)
    assert_decision_contract(decision, limits, OperatorIntent())
    diag = decision.diagnostics
    assert decision.reason in (Reason.CROSSOVER_EB, Reason.CROSSOVER_MB, Reason.HYSTERESIS_HOLD,
                               Reason.COOLDOWN_HOLD)
    assert diag.num_samples == n
    assert 0.0 < diag.p0 <= 1.0
    assert config.theta_min <= diag.theta_star <= config.theta_max
    assert 1 <= diag.k_star <= diag.n_star <= limits.max_num_seqs
    assert new_state.n_prev == diag.n_star
    assert new_state.mode == decision.mode
    if decision.mode == Mode.EB and Flag.MEMORY_GUARD in decision.flags:  # a cap carried in the state
        assert 0 < new_state.n_guard < diag.n_star
        assert decision.n == new_state.n_eb_in_force == new_state.n_guard
    elif decision.mode == Mode.EB:
        assert (decision.k, decision.n) == (diag.k_star, diag.n_star)
    else:
        assert decision.n == limits.max_num_seqs
    if decision.reason in (Reason.CROSSOVER_EB, Reason.CROSSOVER_MB):
        favours_mb = diag.lhs_s_per_token < diag.rhs_s_per_token + decision.delta_s_per_token
        assert (decision.mode == Mode.MB) == favours_mb


@settings(max_examples=300, deadline=None)
@given(
    workload=st.builds(WorkloadStats, any_float, any_float, any_float, any_float, any_float),  # σ_O too
    costs=st.one_of(st.sampled_from([H200, RTX_PRO_6000]),
                    st.builds(CostModel, any_float, any_float, any_float, any_float, any_float,
                              st.tuples(any_float, any_float, any_float))),
    limits=engine_limits,
    n_prev=st.integers(min_value=-(2**63), max_value=2**63),
    n_obs=any_float,
    delta=any_float,
)
def test_evaluate_is_finite_for_any_input(workload, costs, limits, n_prev, n_obs, delta) -> None:
    result = evaluate(workload, costs, limits, n_prev=n_prev, n_obs=n_obs, delta_s_per_token=delta)
    assert isinstance(result, Evaluation)
    assert_all_finite(result)
    assert 1 <= result.k_star <= result.n_star <= limits.max_num_seqs
    assert 0.0 <= result.theta0 < 1.0
    assert result.delta_theta >= 0.0
    assert abs(result.delta_s_per_token) <= DELTA_LIMIT_S_PER_TOKEN
    assert result.mode_instant in (Mode.MB, Mode.EB)


@settings(max_examples=100, deadline=None)
@given(
    workload=st.builds(
        WorkloadStats,
        p0=st.floats(min_value=1e-300, max_value=1.0),
        eta=st.floats(min_value=0.0, max_value=1e300),
        mu_l_tokens=st.floats(min_value=1e-300, max_value=1e300),
        mu_o_tokens=st.floats(min_value=1e-300, max_value=1e300),
        sigma_o_tokens=st.floats(min_value=0.0, max_value=1e300),
    ),
    limits=engine_limits,
)
def test_evaluate_with_extreme_but_valid_workloads(workload, limits) -> None:
    result = evaluate(workload, RTX_PRO_6000, limits, n_prev=100, n_obs=64.0)
    assert_all_finite(result)
    assert 1 <= result.k_star <= result.n_star <= limits.max_num_seqs


# ----------------------------------------------------------------------------------- EngineLimits


@settings(max_examples=100, deadline=None)
@given(
    max_num_seqs=st.integers(max_value=2**31),
    max_num_batched_tokens=st.integers(max_value=2**31),
    kv=st.integers(min_value=-(10**12), max_value=10**12),
    max_model_len=st.integers(min_value=-(10**7), max_value=10**7),
)
def test_engine_limits_constructor_validates(max_num_seqs, max_num_batched_tokens, kv, max_model_len) -> None:
    valid = max_num_seqs >= 1 and max_num_batched_tokens >= 1 and kv >= 0 and max_model_len >= 0
    if valid:
        limits = EngineLimits(max_num_seqs, max_num_batched_tokens, kv, max_model_len)
        assert (limits.max_num_seqs, limits.kv_capacity_tokens) == (max_num_seqs, kv)
    else:
        with pytest.raises(ValueError, match=r"must be|need"):
            EngineLimits(max_num_seqs, max_num_batched_tokens, kv, max_model_len)


@pytest.mark.parametrize("args", [(0, 1, 0), (1, 0, 0), (-5, 10, 10), (1, 1, -1), (1, 1, 0, -1)])
def test_engine_limits_rejects_named_cases(args: tuple[int, ...]) -> None:
    with pytest.raises(ValueError):
        EngineLimits(*args)
