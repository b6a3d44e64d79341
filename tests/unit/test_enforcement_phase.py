"""agents.enforcement.phase: the EB phase machine, rule by rule, and plan invariants for any input sequence."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.enforcement.phase import Phase, PhaseMachine
from agents.enforcement.plan import StepKind, StepPlan

DECODE_ONLY = StepKind.DECODE_ONLY
PREFILL_ONLY = StepKind.PREFILL_ONLY
PREFILL_BUDGET = 1024
DECODE_BUDGET = 4096
PLENTY_KV = 10**9


def machine(*, k: int = 3, n: int = 8) -> PhaseMachine:
    return PhaseMachine(k=k, n=n, prefill_budget_tokens=PREFILL_BUDGET, decode_budget_tokens=DECODE_BUDGET)


def plan(m: PhaseMachine, running: int, prefills: int, decodes: int, waiting: int, *, free_kv: int = PLENTY_KV,
         headroom: int = 0) -> StepPlan:
    return m.plan_step(num_running=running, num_running_prefills=prefills, num_running_decodes=decodes,
                       num_waiting=waiting, free_kv_tokens=free_kv, kv_tokens_per_new_request=headroom)


def refilled(m: PhaseMachine, running: int, waiting: int = 10) -> None:
    """Drive `m` to the decode phase with `running` decoding requests after a refill that filled them."""
    plan(m, 0, 0, 0, waiting + running)
    plan(m, running, 0, running, waiting)
    assert m.phase is Phase.DECODE


def test_decode_only_until_k_slots_are_idle_then_prefill_admits_up_to_k() -> None:
    m = machine(k=3, n=8)
    refilled(m, 8)
    p = plan(m, 8, 0, 8, 10)
    assert (p.kind, p.token_budget_tokens, p.max_num_active_reqs, p.num_new_reqs_max) == (
        DECODE_ONLY, DECODE_BUDGET, 8, 0)
    assert plan(m, 7, 0, 7, 10).kind is DECODE_ONLY
    assert plan(m, 6, 0, 6, 10).kind is DECODE_ONLY  # two idle slots < k
    p = plan(m, 5, 0, 5, 10)  # three idle slots: switch
    assert (p.kind, p.token_budget_tokens, p.num_new_reqs_max, p.max_num_active_reqs, p.phase_switched) == (
        PREFILL_ONLY, PREFILL_BUDGET, 3, 8, True)
    assert p.num_seqs_cap == 8
    # Two admitted, the second only partly prefilled (chunked within the budget): the phase goes on.
    p = plan(m, 7, 1, 6, 8)
    assert (p.kind, p.num_new_reqs_max, p.max_num_active_reqs, p.phase_switched) == (PREFILL_ONLY, 1, 8, False)
    # Target reached but a partial prefill remains: it is continued, nothing more admitted.
    p = plan(m, 8, 1, 7, 7)
    assert (p.kind, p.num_new_reqs_max, p.max_num_active_reqs) == (PREFILL_ONLY, 0, 8)
    p = plan(m, 8, 0, 8, 7)
    assert (p.kind, p.phase_switched) == (DECODE_ONLY, True)
    assert m.phase is Phase.DECODE


def test_switch_threshold_counts_idle_slots_when_more_than_k_finish_in_one_step() -> None:
    m = machine(k=3, n=8)
    refilled(m, 8)
    p = plan(m, 3, 0, 3, 10)  # five finished in one step: still only k are loaded per refill...
    assert (p.kind, p.num_new_reqs_max) == (PREFILL_ONLY, 3)
    # ...but two slots stay idle < k after it, so the machine decodes next.
    assert plan(m, 6, 0, 6, 7).kind is DECODE_ONLY


def test_nothing_left_to_decode_switches_to_prefill_early() -> None:
    m = machine(k=5, n=8)
    refilled(m, 8)
    assert plan(m, 8, 0, 8, 10).kind is DECODE_ONLY
    # Only one slot idle (< k) but nothing can decode: the remaining running request is mid-prefill.
    p = plan(m, 7, 1, 0, 10)
    assert p.kind is PREFILL_ONLY
    # Nothing running at all: refill now.
    m = machine(k=5, n=8)
    refilled(m, 8)
    p = plan(m, 0, 0, 0, 10)
    assert (p.kind, p.num_new_reqs_max, p.max_num_active_reqs) == (PREFILL_ONLY, 5, 5)


def test_prefill_phase_with_nothing_to_prefill_decodes() -> None:
    m = machine(k=3, n=8)
    p = plan(m, 5, 0, 5, 3)
    assert p.kind is PREFILL_ONLY  # three idle slots, three waiting
    # The three waiting requests were cancelled before admission: no partial prefill, nothing waiting.
    p = plan(m, 5, 0, 5, 0)
    assert (p.kind, p.phase_switched) == (DECODE_ONLY, True)


def test_idle_engine_gets_an_inert_decode_plan() -> None:
    m = machine()
    p = plan(m, 0, 0, 0, 0)
    assert (p.kind, p.num_new_reqs_max, p.phase_switched) == (DECODE_ONLY, 0, False)


def test_kv_gate_defers_the_switch_and_admission_is_what_fits() -> None:
    m = machine(k=4, n=16)
    refilled(m, 16)
    # Eight idle slots (≥ k) and a queue, but free KV is below one new request's headroom: keep decoding.
    assert plan(m, 8, 0, 8, 10, free_kv=999, headroom=1000).kind is DECODE_ONLY
    # Room for two requests: switch and admit two of k, not all-or-nothing.
    p = plan(m, 8, 0, 8, 10, free_kv=2500, headroom=1000)
    assert (p.kind, p.num_new_reqs_max, p.max_num_active_reqs) == (PREFILL_ONLY, 2, 10)
    # Room for one more after they took their KV.
    p = plan(m, 10, 0, 10, 8, free_kv=1200, headroom=1000)
    assert (p.kind, p.num_new_reqs_max) == (PREFILL_ONLY, 1)
    # KV full: the refill ends, KV-limited.
    p = plan(m, 11, 0, 11, 7, free_kv=300, headroom=1000)
    assert p.kind is DECODE_ONLY
    assert m.phase is Phase.DECODE


def test_after_a_kv_limited_refill_the_machine_waits_for_k_freed_slots() -> None:
    m = machine(k=4, n=16)
    refilled(m, 16)
    plan(m, 8, 0, 8, 10, free_kv=1000, headroom=1000)  # admits one: KV-limited
    plan(m, 9, 0, 9, 9, free_kv=0, headroom=1000)  # refill ends with 9 running
    assert m.phase is Phase.DECODE
    # One request finishes and frees its KV: idle slots ≥ k and KV fits, but only one slot freed since the
    # refill. Switching now would be EB(k=1); wait for k.
    for running in (8, 7, 6):
        assert plan(m, running, 0, running, 9, free_kv=(9 - running) * 1000, headroom=1000).kind is DECODE_ONLY
    p = plan(m, 5, 0, 5, 9, free_kv=4000, headroom=1000)
    assert (p.kind, p.num_new_reqs_max) == (PREFILL_ONLY, 4)


def test_after_a_queue_limited_refill_new_arrivals_do_not_wait_for_k_finishes() -> None:
    m = machine(k=4, n=16)
    plan(m, 0, 0, 0, 2)
    assert plan(m, 2, 0, 2, 0).kind is DECODE_ONLY  # everything waiting was admitted
    p = plan(m, 2, 0, 2, 1)  # one arrival, 14 idle slots
    assert (p.kind, p.num_new_reqs_max) == (PREFILL_ONLY, 1)


def test_ramp_up_from_empty_refills_back_to_back_until_fewer_than_k_slots_are_idle() -> None:
    m = machine(k=3, n=8)
    kinds = []
    switches = []
    running = 0
    for _ in range(4):
        p = plan(m, running, 0, running, 20)
        kinds.append(p.kind)
        switches.append(p.phase_switched)
        running += p.num_new_reqs_max
    assert kinds == [PREFILL_ONLY, PREFILL_ONLY, DECODE_ONLY, DECODE_ONLY]
    assert switches == [True, False, True, False]  # the second refill is a roll-over, not a phase switch
    assert running == 6  # 8 − 6 = 2 idle slots < k


def test_partial_prefill_found_in_decode_phase_is_continued_at_once() -> None:
    """After a mode switch into EB, a request mid-prefill is continued, not stranded for a decode phase."""
    m = machine(k=4, n=8)
    p = plan(m, 8, 1, 7, 5)
    assert (p.kind, p.num_new_reqs_max, p.max_num_active_reqs) == (PREFILL_ONLY, 0, 8)
    assert plan(m, 8, 0, 8, 5).kind is DECODE_ONLY


def test_admission_never_exceeds_the_cap_n() -> None:
    m = machine(k=2, n=4)
    # More running than N (N was lowered): decode until enough finish; the gate stays at N.
    p = plan(m, 7, 0, 7, 10)
    assert (p.kind, p.max_num_active_reqs) == (DECODE_ONLY, 4)
    assert plan(m, 3, 0, 3, 10).kind is DECODE_ONLY  # one idle slot < k
    p = plan(m, 2, 0, 2, 10)
    assert (p.kind, p.max_num_active_reqs, p.num_new_reqs_max) == (PREFILL_ONLY, 4, 2)
    # Nothing decodes and every slot is taken by non-progressing requests: inert, gate at N.
    m = machine(k=2, n=4)
    p = plan(m, 6, 0, 0, 10)
    assert (p.kind, p.max_num_active_reqs, p.num_new_reqs_max) == (DECODE_ONLY, 4, 0)


def test_empty_prefill_step_returns_to_decode_until_kv_grows() -> None:
    m = machine(k=2, n=8)
    refilled(m, 8)
    p = plan(m, 5, 0, 5, 4, free_kv=2000, headroom=100)
    assert p.kind is PREFILL_ONLY
    m.observe_step(num_scheduled_tokens=0)  # the engine could not admit anything after all
    assert m.phase is Phase.DECODE and m.is_stalled
    assert plan(m, 5, 0, 5, 4, free_kv=1900, headroom=100).kind is DECODE_ONLY
    assert plan(m, 5, 0, 5, 4, free_kv=2000, headroom=100).kind is DECODE_ONLY
    p = plan(m, 4, 0, 4, 4, free_kv=2600, headroom=100)  # a finish freed KV
    assert p.kind is PREFILL_ONLY and not m.is_stalled
    m.observe_step(num_scheduled_tokens=300)
    assert not m.is_stalled


def test_a_prefill_that_preempts_itself_is_not_readmitted_until_decodes_free_more_kv() -> None:
    """The livelock guard: a chunked prefill that cannot grow preempts itself and frees its KV; readmitting it
    as soon as KV looks free again would repeat forever while the decodes holding the KV are frozen."""
    m = machine(k=3, n=12)
    p = plan(m, 2, 0, 2, 148, free_kv=80, headroom=48)
    assert (p.kind, p.num_new_reqs_max) == (PREFILL_ONLY, 1)  # admitted: first chunk takes 32 tokens
    assert plan(m, 3, 1, 2, 147, free_kv=48, headroom=48).kind is PREFILL_ONLY
    assert plan(m, 3, 1, 2, 147, free_kv=16, headroom=48).kind is PREFILL_ONLY
    m.observe_step(num_scheduled_tokens=0)  # it preempted itself: back in the waiting queue, KV back to 80
    assert plan(m, 2, 0, 2, 148, free_kv=80, headroom=48).kind is DECODE_ONLY
    assert plan(m, 2, 0, 2, 148, free_kv=64, headroom=48).kind is DECODE_ONLY  # decodes grow
    assert plan(m, 1, 0, 1, 148, free_kv=208, headroom=48).kind is PREFILL_ONLY  # a decode finished


def test_stall_never_blocks_an_engine_with_nothing_to_decode() -> None:
    m = machine(k=2, n=8)
    assert plan(m, 0, 0, 0, 3, free_kv=50, headroom=100).kind is PREFILL_ONLY  # KV gate bypassed: nothing runs
    m.observe_step(num_scheduled_tokens=0)
    p = plan(m, 0, 0, 0, 3, free_kv=50, headroom=100)
    assert (p.kind, p.num_new_reqs_max) == (PREFILL_ONLY, 1)


def test_configure_keeps_the_phase_and_lowers_the_refill_target() -> None:
    m = machine(k=4, n=8)
    refilled(m, 8)
    assert plan(m, 4, 0, 4, 10).kind is PREFILL_ONLY  # target 8
    m.configure(k=2, n=6, prefill_budget_tokens=512, decode_budget_tokens=DECODE_BUDGET)
    assert m.phase is Phase.PREFILL
    p = plan(m, 5, 0, 5, 9)
    assert (p.kind, p.token_budget_tokens, p.max_num_active_reqs, p.num_new_reqs_max) == (PREFILL_ONLY, 512, 6, 1)
    m.reset()
    assert m.phase is Phase.DECODE and not m.is_stalled


@pytest.mark.parametrize(("k", "n"), [(0, 4), (5, 4), (1, 0)])
def test_invalid_parameters_raise(k: int, n: int) -> None:
    with pytest.raises(ValueError, match="k"):
        machine(k=k, n=n)


def test_budgets_must_be_positive() -> None:
    with pytest.raises(ValueError, match="budgets"):
        PhaseMachine(k=1, n=1, prefill_budget_tokens=0, decode_budget_tokens=1)


# ------------------------------------------------------------------------------------------- properties


@st.composite
def step_inputs(draw, n_max: int = 40):
    running = draw(st.integers(0, n_max))
    prefills = draw(st.integers(0, running))
    decodes = draw(st.integers(0, running - prefills))
    waiting = draw(st.integers(0, 60))
    free_kv = draw(st.integers(-10, 5000))
    headroom = draw(st.sampled_from([0, 1, 100, 700, 6000]))
    observed = draw(st.integers(0, 2))  # tokens scheduled afterwards: 0 reports an empty step
    return running, prefills, decodes, waiting, free_kv, headroom, observed


@settings(max_examples=300, deadline=None)
@given(k_fraction=st.floats(0.0, 1.0), n=st.integers(1, 32), steps=st.lists(step_inputs(), min_size=1, max_size=60))
def test_every_plan_is_exclusive_bounded_and_never_empty_while_work_exists(k_fraction, n, steps) -> None:
    k = max(1, round(k_fraction * n))
    m = machine(k=k, n=n)
    for running, prefills, decodes, waiting, free_kv, headroom, observed in steps:
        p = plan(m, running, prefills, decodes, waiting, free_kv=free_kv, headroom=headroom)
        free_slots = max(0, n - running)
        kv_fit = (max(0, free_kv) // headroom) if headroom else free_slots
        assert p.kind in (DECODE_ONLY, PREFILL_ONLY)
        assert p.num_seqs_cap == n
        assert p.max_num_active_reqs <= n
        assert 0 <= p.num_new_reqs_max <= min(k, free_slots, waiting)
        if p.kind is DECODE_ONLY:
            assert p.token_budget_tokens == DECODE_BUDGET
            assert p.num_new_reqs_max == 0 and p.max_num_active_reqs == n
            # Decode-only only when something decodes, or when nothing at all can run or be admitted.
            assert decodes > 0 or (prefills == 0 and (waiting == 0 or free_slots == 0))
        else:
            assert p.token_budget_tokens == PREFILL_BUDGET
            assert p.max_num_active_reqs == min(n, running + p.num_new_reqs_max)
            # Prefill-only only when it has something to prefill.
            assert prefills > 0 or p.num_new_reqs_max > 0
            if decodes > 0 or prefills > 0:
                assert p.num_new_reqs_max <= kv_fit  # the KV gate holds while anything else can run
            else:
                assert p.num_new_reqs_max <= max(1, kv_fit)
        m.observe_step(num_scheduled_tokens=observed)
