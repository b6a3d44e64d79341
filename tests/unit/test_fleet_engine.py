"""The fake engine: conservation, KV and slot bounds, exclusive steps, P-PAS budget, determinism."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.api.v1 import common_pb2
from controlplane.core.types import Mode
from controlplane.fleet.engine import FakeEngine
from controlplane.fleet.profiles import H200_QWEN3_8B, EngineShape
from controlplane.fleet.settings import EngineSettings
from controlplane.fleet.workload import WorkloadSpec
from controlplane.protocol import MIN_BUDGET_TOKENS

# Small KV (4096 tokens) against long requests: forces preemptions.
TIGHT = EngineShape(max_num_seqs=32, max_num_batched_tokens=1024, kv_capacity_tokens=4096, block_size_tokens=16,
                    max_model_len_tokens=2048)
ROOMY = EngineShape(max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=1 << 20, block_size_tokens=16,
                    max_model_len_tokens=8192)


def decision(mode: int, *, k: int = 4, n: int = 16, b_max: int = 2048, b_cap: int = 256, n_th: int = 2,
             version: int = 1, **fields) -> common_pb2.Decision:
    return common_pb2.Decision(
        version=version, mode=mode, k=k, n=n,
        budget=common_pb2.BudgetPolicy(b_max_tokens=b_max, b_cap_tokens=b_cap, n_th=n_th), **fields,
    )


def drain_all(engine: FakeEngine) -> int:
    """Run until idle (bounded); returns the number of steps."""
    steps = 0
    while engine.step() is not None:
        steps += 1
        assert steps < 200_000, "engine did not drain"
    return steps


@pytest.mark.parametrize("mode", [None, common_pb2.MODE_MB, common_pb2.MODE_EB, common_pb2.MODE_PASSTHROUGH])
def test_every_request_completes_and_tokens_are_conserved(mode) -> None:
    engine = FakeEngine(workload=WorkloadSpec.parse("geometric:40/uniform:300/closed:24"), shape=ROOMY,
                        seed=3, num_requests=400)
    if mode is not None:
        assert engine.apply(decision(mode, k=4, n=16)) == (True, "")
    drain_all(engine)
    t = engine.drain()
    assert engine.is_idle
    assert engine.num_completed == len(t.completion_output_tokens) == 400
    assert engine.num_preemptions == 0
    assert engine.kv_used_tokens == 0
    # Every prompt token is prefilled once; every output token but the first (sampled by the prefill)
    # comes from one decode.
    assert sum(t.step_prefill_tokens) == sum(t.completion_prompt_tokens)
    assert sum(t.step_decode_tokens) == sum(t.completion_output_tokens) - len(t.completion_output_tokens)
    assert t.step_decode_tokens == t.step_decode_requests
    assert all(d > 0 for d in t.step_duration_s)
    assert t.completion_finish_s == sorted(t.completion_finish_s)
    assert t.step_end_s[-1] == pytest.approx(engine.now_s)
    assert sum(t.step_duration_s) == pytest.approx(engine.now_s)
    assert min(t.completion_output_tokens) >= 1


@pytest.mark.parametrize("mode", [common_pb2.MODE_MB, common_pb2.MODE_EB])
def test_kv_never_exceeds_capacity_and_preempted_requests_still_complete(mode) -> None:
    engine = FakeEngine(workload=WorkloadSpec.parse("uniform:700/uniform:500/closed:32"), shape=TIGHT, seed=5,
                        num_requests=120)
    engine.apply(decision(mode, k=4, n=32, b_max=1024, b_cap=512))
    steps = 0
    while (record := engine.step()) is not None:
        steps += 1
        assert steps < 100_000
        assert engine.kv_used_tokens <= engine.kv_total_tokens == 4096
        assert record.prefill_tokens + record.decode_tokens <= 1024
    t = engine.drain()
    assert engine.num_completed == 120
    assert engine.num_preemptions > 0
    assert t.num_preemptions == engine.num_preemptions
    # Recomputation prefills prompt and generated tokens again, so prefill work grows with preemption.
    assert sum(t.step_prefill_tokens) > sum(t.completion_prompt_tokens)
    assert all(p + o <= TIGHT.max_model_len_tokens for p, o in
               zip(t.completion_prompt_tokens, t.completion_output_tokens, strict=True))


def test_lengths_are_truncated_to_max_model_len() -> None:
    shape = EngineShape(max_num_seqs=4, max_num_batched_tokens=512, kv_capacity_tokens=4096,
                        block_size_tokens=16, max_model_len_tokens=300)
    engine = FakeEngine(workload=WorkloadSpec.parse("fixed:1000/fixed:250/closed:2"), shape=shape, num_requests=3)
    drain_all(engine)
    t = engine.drain()
    assert t.completion_prompt_tokens == [250, 250, 250]
    assert t.completion_output_tokens == [50, 50, 50]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mode=st.sampled_from([common_pb2.MODE_MB, common_pb2.MODE_EB]),
    n=st.integers(1, 32),
    k_fraction=st.floats(0.0, 1.0),
    b_max=st.integers(MIN_BUDGET_TOKENS, 1024),  # below the floor a decision is refused (budget_below_floor)
    b_cap_fraction=st.floats(0.0, 1.0),
    n_th=st.integers(0, 4),
    concurrency=st.integers(1, 48),
    seed=st.integers(0, 2**32 - 1),
)
def test_invariants_hold_for_any_valid_decision(mode, n, k_fraction, b_max, b_cap_fraction, n_th, concurrency,
                                               seed) -> None:
    k = max(1, round(k_fraction * n))
    b_cap = max(MIN_BUDGET_TOKENS, round(b_cap_fraction * b_max))
    engine = FakeEngine(workload=WorkloadSpec.parse(f"geometric:60/uniform:400/closed:{concurrency}"),
                        shape=TIGHT, seed=seed)
    assert engine.apply(decision(mode, k=k, n=n, b_max=b_max, b_cap=b_cap, n_th=n_th)) == (True, "")
    policy = engine.settings.budget
    free_before = n
    previous_was_decode = False
    for _ in range(400):
        state = engine.scheduler_state()
        num_running = engine.num_running
        record = engine.step()
        assert record is not None, "a closed-loop engine always has work"
        assert engine.num_running <= n
        assert engine.kv_used_tokens <= engine.kv_total_tokens
        assert record.duration_s > 0
        if mode == common_pb2.MODE_EB:
            assert record.prefill_tokens == 0 or record.decode_tokens == 0
            if record.prefill_tokens and previous_was_decode:
                # A prefill phase opens only when k slots are free or nothing decodes.
                assert free_before >= k or state.num_running_decodes == 0
        else:
            # P-PAS: B_cap when active prefills (running + admissible waiting) ≥ N_th and something decodes.
            active_prefills = state.num_running_prefills + min(state.num_waiting, max(0, n - num_running))
            pressure = active_prefills >= policy.n_th and state.num_running_decodes > 0
            budget = policy.b_cap_tokens if pressure else policy.b_max_tokens
            assert record.prefill_tokens + record.decode_tokens <= budget
        previous_was_decode = record.decode_tokens > 0
        free_before = n - engine.num_running


def test_mb_uses_b_cap_under_prefill_pressure_and_b_max_otherwise() -> None:
    engine = FakeEngine(workload=WorkloadSpec.parse("geometric:100/fixed:3000/closed:12"), shape=ROOMY, seed=1)
    assert engine.apply(decision(common_pb2.MODE_MB, k=1, n=8, b_max=2048, b_cap=300, n_th=2)) == (True, "")
    num_capped = num_large = 0
    for _ in range(2000):
        state = engine.scheduler_state()
        admissible = min(state.num_waiting, max(0, 8 - engine.num_running))
        record = engine.step()
        tokens = record.prefill_tokens + record.decode_tokens
        if state.num_running_prefills + admissible >= 2 and state.num_running_decodes > 0:
            assert tokens <= 300
            num_capped += 1
        num_large += tokens > 300
    assert num_capped > 0
    assert num_large > 0


def test_eb_decode_phase_waits_for_k_free_slots() -> None:
    # Outputs of exactly 20 tokens and n = 8 with k = 4: decodes run until 4 requests have finished.
    engine = FakeEngine(workload=WorkloadSpec.parse("uniform:20/fixed:64/closed:16"), shape=ROOMY, seed=2)
    engine.apply(decision(common_pb2.MODE_EB, k=4, n=8, b_max=2048, b_cap=2048))
    for _ in range(500):
        free_before = 8 - engine.num_running
        state = engine.scheduler_state()
        record = engine.step()
        if record.decode_tokens:
            assert free_before < 4
            assert record.prefill_tokens == 0
        elif state.num_running_prefills == 0 and state.num_running_decodes > 0:
            assert free_before >= 4


def test_same_seed_same_telemetry_other_seed_differs() -> None:
    def run(seed: int):
        engine = FakeEngine(workload=WorkloadSpec.parse("hazard:p0=0.01,eta=1e-4/uniform:256/closed:24"),
                            shape=TIGHT, seed=seed, duration_jitter_rel=0.05)
        engine.run_until(5.0)
        engine.apply(decision(common_pb2.MODE_EB, k=3, n=20, b_max=1024, b_cap=1024))
        engine.run_until(10.0)
        return dataclasses.asdict(engine.drain())

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_apply_rejects_invalid_decisions_and_keeps_the_settings() -> None:
    engine = FakeEngine(workload=WorkloadSpec.parse("fixed:8/fixed:8/closed:2"), shape=TIGHT)
    stock = engine.settings
    cases = {
        "k_greater_than_n": decision(common_pb2.MODE_EB, k=9, n=8),
        "n_greater_than_max_num_seqs": decision(common_pb2.MODE_EB, k=1, n=33),
        "n_zero": decision(common_pb2.MODE_MB, k=1, n=0),
        "k_zero": decision(common_pb2.MODE_EB, k=0, n=4),
        "mode_unspecified": decision(common_pb2.MODE_UNSPECIFIED),
        "b_cap_greater_than_b_max": decision(common_pb2.MODE_MB, b_max=100, b_cap=200),
    }
    for reason, bad in cases.items():
        assert engine.apply(bad) == (False, reason)
        assert engine.settings == stock
    # An advisory decision is held (the agent would report what it would do) and the engine runs stock.
    assert engine.apply(decision(common_pb2.MODE_EB, k=2, n=4, advisory=True, version=3)) == (True, "")
    assert engine.settings == dataclasses.replace(stock, version=3)


def test_apply_clamps_budgets_and_passthrough_restores_stock() -> None:
    engine = FakeEngine(workload=WorkloadSpec.parse("fixed:8/fixed:8/closed:2"), shape=TIGHT)
    assert engine.settings == EngineSettings.stock(TIGHT)
    assert engine.apply(decision(common_pb2.MODE_MB, k=2, n=10, b_max=99_999, b_cap=0, version=5)) == (True, "")
    assert engine.settings.mode is Mode.MB
    assert engine.settings.version == 5
    assert engine.settings.budget.b_max_tokens == engine.settings.budget.b_cap_tokens == 1024
    # PASSTHROUGH ignores k and n (even invalid ones) and restores the start-up behaviour.
    assert engine.apply(decision(common_pb2.MODE_PASSTHROUGH, k=0, n=0, version=6)) == (True, "")
    assert engine.settings == dataclasses.replace(EngineSettings.stock(TIGHT), version=6)
    engine.reset_to_stock()
    assert engine.settings == EngineSettings.stock(TIGHT)


def test_lowering_n_stops_admission_without_evicting() -> None:
    engine = FakeEngine(workload=WorkloadSpec.parse("fixed:500/fixed:16/closed:20"), shape=ROOMY)
    engine.run_until(1.0)
    assert engine.num_running == 20
    engine.apply(decision(common_pb2.MODE_MB, k=1, n=5))
    engine.step()
    assert engine.num_running == 20
    engine.run_until(60.0)
    assert engine.num_running <= 5


def test_step_costs_follow_the_cost_model() -> None:
    engine = FakeEngine(workload=WorkloadSpec.parse("fixed:3/fixed:100/closed:2"), shape=ROOMY)
    first = engine.step()  # both prompts in one prefill-only step
    assert (first.prefill_tokens, first.decode_tokens) == (200, 0)
    assert first.duration_s == pytest.approx(H200_QWEN3_8B.alpha_p_s + H200_QWEN3_8B.beta_p_s_per_token * 200)
    second = engine.step()  # two decodes
    assert (second.prefill_tokens, second.decode_requests) == (0, 2)
    assert second.duration_s == pytest.approx(H200_QWEN3_8B.alpha_d_s + H200_QWEN3_8B.beta_d_s_per_request * 2)
    engine.step()  # last decodes; both finish and two new requests arrive
    mixed_engine = FakeEngine(workload=WorkloadSpec.parse("geometric:50/uniform:100/closed:3"), shape=ROOMY, seed=4)
    for _ in range(200):
        record = mixed_engine.step()
        if record.prefill_tokens and record.decode_tokens:
            tokens = record.prefill_tokens + record.decode_tokens
            expected = H200_QWEN3_8B.alpha_mb_s + H200_QWEN3_8B.beta_mb_e(record.decode_tokens / tokens) * tokens
            assert record.duration_s == pytest.approx(expected)
            break
    else:
        pytest.fail("no mixed step in MB")


def test_buffer_overflow_drops_and_counts() -> None:
    engine = FakeEngine(workload=WorkloadSpec.parse("fixed:50/fixed:10/closed:4"), shape=ROOMY, max_buffered_events=10)
    for _ in range(30):
        engine.step()
    t = engine.drain()
    assert len(t.step_duration_s) == 10
    assert t.num_events_dropped == 20 + max(0, engine.num_completed - 10)
    engine.step()
    assert len(engine.drain().step_duration_s) == 1


def test_constructor_validates() -> None:
    workload = WorkloadSpec.parse("fixed:1/fixed:1")
    with pytest.raises(ValueError, match="jitter"):
        FakeEngine(workload=workload, duration_jitter_rel=-0.1)
    with pytest.raises(ValueError, match="hold one request"):
        EngineShape(kv_capacity_tokens=1000, max_model_len_tokens=2048)
