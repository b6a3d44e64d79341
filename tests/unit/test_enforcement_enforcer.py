"""agents.enforcement.enforcer: versions, TTL, step-boundary installation and the per-mode dispatch."""

from __future__ import annotations

import functools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.enforcement import Enforcer, Mode, Phase, StepKind, StepPlan
from controlplane.api.v1 import common_pb2
from tests.unit import agent_decisions

MAX_NUM_SEQS = 32
STARTUP_BUDGET = 2048
decision = functools.partial(agent_decisions.decision, b_max=1024, ttl_s=10.0)


def enforcer() -> Enforcer:
    return Enforcer(max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=STARTUP_BUDGET)


def step(e: Enforcer, running: int = 10, prefills: int = 0, decodes: int | None = None, waiting: int = 5, *,
         free_kv: int = 10**9, headroom: int = 0, largest: int = 0) -> StepPlan:
    return e.plan_step(num_running=running, num_running_prefills=prefills,
                       num_running_decodes=running - prefills if decodes is None else decodes, num_waiting=waiting,
                       free_kv_tokens=free_kv, kv_tokens_per_new_request=headroom,
                       largest_remaining_prefill_tokens=largest)


STOCK_PLAN = StepPlan(StepKind.STOCK, STARTUP_BUDGET, MAX_NUM_SEQS, MAX_NUM_SEQS, MAX_NUM_SEQS, False)


def test_starts_stock() -> None:
    e = enforcer()
    assert e.policy.mode is Mode.PASSTHROUGH and e.policy.version == 0
    assert math.isinf(e.expires_at_s)
    assert step(e) == STOCK_PLAN
    assert e.phase is None
    assert not e.expire(1e12)


def test_decision_takes_effect_at_the_next_step_boundary() -> None:
    e = enforcer()
    step(e)
    assert e.apply(decision(common_pb2.MODE_MB, n=12), now_s=0.0) == (True, "")
    assert e.policy.mode is Mode.MB
    assert e.active_policy.mode is Mode.PASSTHROUGH  # the step already planned ran under stock
    p = step(e, running=12, waiting=0)
    assert e.active_policy is e.policy
    assert (p.kind, p.max_num_active_reqs, p.num_seqs_cap, p.token_budget_tokens) == (StepKind.STOCK, 12, 12, 1024)


def test_same_version_only_extends_the_ttl() -> None:
    e = enforcer()
    assert e.apply(decision(version=3, k=4, ttl_s=10.0), now_s=100.0) == (True, "")
    held = e.policy
    assert e.expires_at_s == 110.0
    # A keep-alive re-send of version 3 (even with other content) extends the TTL and changes nothing else.
    assert e.apply(decision(version=3, k=1, n=2, ttl_s=10.0), now_s=105.0) == (True, "")
    assert e.policy is held and e.policy.k == 4
    assert e.expires_at_s == 115.0


def test_lower_versions_are_stale() -> None:
    e = enforcer()
    assert e.apply(decision(version=5), now_s=0.0) == (True, "")
    assert e.apply(decision(version=4), now_s=1.0) == (False, "stale_version")
    assert e.policy.version == 5
    assert e.apply(decision(version=6, k=2), now_s=2.0) == (True, "")
    assert e.policy.version == 6 and e.version_floor == 6


def test_invalid_decisions_change_nothing() -> None:
    e = enforcer()
    assert e.apply(decision(version=2, k=4), now_s=0.0) == (True, "")
    assert e.apply(decision(version=3, k=9, n=8), now_s=1.0) == (False, "k_greater_than_n")
    assert e.apply(decision(version=3, n=MAX_NUM_SEQS + 1), now_s=1.0) == (False, "n_greater_than_max_num_seqs")
    assert e.apply(decision(version=3, mode=common_pb2.MODE_UNSPECIFIED), now_s=1.0) == (False, "mode_unspecified")
    assert e.apply(decision(version=3, b_max=10, b_cap=20), now_s=1.0) == (False, "b_cap_greater_than_b_max")
    assert (e.policy.version, e.policy.k, e.expires_at_s, e.version_floor) == (2, 4, 10.0, 2)


def test_ttl_expiry_falls_back_to_stock_and_touch_keeps_the_decision() -> None:
    e = enforcer()
    assert e.apply(decision(version=1, ttl_s=10.0), now_s=0.0) == (True, "")
    step(e)
    assert e.active_policy.mode is Mode.EB
    e.touch(8.0)  # heard from the controller
    assert not e.expire(17.9)
    assert e.expire(18.0)
    assert e.policy.mode is Mode.PASSTHROUGH and e.policy.version == 0
    assert not e.expire(19.0)  # nothing left to expire
    e.touch(19.0)  # touching stock does nothing
    assert math.isinf(e.expires_at_s)
    assert step(e) == STOCK_PLAN
    assert e.phase is None


def test_after_expiry_the_same_version_is_applied_again_but_older_ones_stay_stale() -> None:
    e = enforcer()
    e.apply(decision(version=7, ttl_s=5.0), now_s=0.0)
    assert e.expire(5.0)
    assert e.apply(decision(version=6), now_s=6.0) == (False, "stale_version")
    assert e.apply(decision(version=7, ttl_s=5.0), now_s=6.0) == (True, "")  # the controller is back
    assert e.policy.mode is Mode.EB and e.expires_at_s == 11.0


@pytest.mark.parametrize("mode", [common_pb2.MODE_MB, common_pb2.MODE_EB])
def test_advisory_runs_stock_and_reports_what_it_would_do(mode: int) -> None:
    e = enforcer()
    assert e.apply(decision(mode, advisory=True, k=2, n=8, b_max=1024, b_cap=384), now_s=0.0) == (True, "")
    assert e.policy.advisory
    p = step(e, running=4, prefills=1, waiting=10)
    assert p == STOCK_PLAN
    would = e.would_plan
    assert would is not None and would != p
    assert would.num_seqs_cap == 8
    if mode == common_pb2.MODE_MB:
        assert (would.kind, would.token_budget_tokens) == (StepKind.STOCK, 384)  # 1 + 4 admissible ≥ n_th
    else:
        assert would.kind is StepKind.PREFILL_ONLY  # a partial prefill to continue
        assert e.phase is Phase.PREFILL
    e.observe_step(num_scheduled_tokens=0)  # an advisory policy does not react to what stock scheduled


def test_would_plan_equals_the_applied_plan_when_not_advisory() -> None:
    e = enforcer()
    assert e.would_plan is None
    e.apply(decision(common_pb2.MODE_MB), now_s=0.0)
    p = step(e)
    assert e.would_plan is p and e.last_plan is p


def test_passthrough_decision_is_stock_with_its_version() -> None:
    e = enforcer()
    assert e.apply(decision(common_pb2.MODE_PASSTHROUGH, version=4, k=0, n=0), now_s=0.0) == (True, "")
    assert step(e) == STOCK_PLAN
    assert e.policy.version == 4 and e.expires_at_s == 10.0


@pytest.mark.parametrize(
    ("running", "prefills", "decodes", "waiting", "largest", "expected"),
    [
        (10, 0, 10, 0, 0, 1024),  # no prefill
        (10, 1, 9, 0, 0, 1024),  # one running prefill, nothing admissible
        (10, 1, 9, 3, 0, 256),  # one running prefill + admissible waiting ≥ n_th, decodes present
        (10, 0, 10, 2, 0, 256),  # two admissible waiting requests compete with decodes
        (16, 0, 16, 5, 0, 1024),  # cap reached: the waiting requests are not admissible this step
        (15, 1, 0, 5, 0, 1024),  # nothing decodes: no decode to protect
        (15, 1, 14, 0, 600, 256),  # P-PAS+: one large residual prefill with ≥ n_d_large decodes
        (15, 1, 14, 0, 599, 1024),
    ],
)
def test_mb_budget_follows_p_pas_on_local_state(running, prefills, decodes, waiting, largest, expected) -> None:
    e = enforcer()
    e.apply(decision(common_pb2.MODE_MB, n=16, b_max=1024, b_cap=256, n_th=2, t_large=600, n_d_large=2), now_s=0.0)
    p = step(e, running, prefills, decodes, waiting, largest=largest)
    assert (p.kind, p.token_budget_tokens, p.max_num_active_reqs, p.num_seqs_cap) == (StepKind.STOCK, expected, 16, 16)


def test_eb_dispatches_to_the_phase_machine_and_keeps_the_phase_across_an_eb_refresh() -> None:
    e = enforcer()
    e.apply(decision(version=1, k=4, n=16), now_s=0.0)
    p = step(e, running=12, waiting=10)
    assert (p.kind, p.num_new_reqs_max, p.token_budget_tokens) == (StepKind.PREFILL_ONLY, 4, 1024)
    assert e.phase is Phase.PREFILL
    e.apply(decision(version=2, k=2, n=14, b_max=512), now_s=1.0)
    p = step(e, running=13, prefills=1, waiting=9)
    assert e.phase is Phase.PREFILL
    assert (p.kind, p.num_new_reqs_max, p.max_num_active_reqs, p.token_budget_tokens) == (
        StepKind.PREFILL_ONLY, 1, 14, 512)
    # Decode-only steps get the start-up budget: a small B_max must not cut decodes.
    p = step(e, running=14, waiting=8)
    assert (p.kind, p.token_budget_tokens) == (StepKind.DECODE_ONLY, STARTUP_BUDGET)


def test_switching_mode_mid_flight_never_strands_a_partial_prefill() -> None:
    e = enforcer()
    e.apply(decision(common_pb2.MODE_MB, version=1), now_s=0.0)
    assert step(e, running=16, prefills=1, waiting=4).kind is StepKind.STOCK
    e.apply(decision(common_pb2.MODE_EB, version=2, k=8, n=16), now_s=1.0)
    # In EB now, with a partial prefill from the MB step: continued in a prefill-only step at once, although
    # fewer than k slots are idle.
    p = step(e, running=16, prefills=1, waiting=4)
    assert (p.kind, p.num_new_reqs_max) == (StepKind.PREFILL_ONLY, 0)
    # EB → MB in the middle of a prefill phase: stock scheduling continues everything.
    e.apply(decision(common_pb2.MODE_MB, version=3), now_s=2.0)
    assert step(e, running=16, prefills=1, waiting=4).kind is StepKind.STOCK
    # MB → EB again: a fresh phase machine.
    e.apply(decision(common_pb2.MODE_EB, version=4, k=8, n=16), now_s=3.0)
    assert step(e, running=16, waiting=4).kind is StepKind.DECODE_ONLY


def test_phase_is_reported_only_under_an_eb_policy() -> None:
    e = enforcer()
    e.apply(decision(common_pb2.MODE_EB, version=1, k=4, n=16), now_s=0.0)
    step(e, running=12, waiting=10)
    assert e.phase is Phase.PREFILL
    e.apply(decision(common_pb2.MODE_MB, version=2, advisory=True), now_s=1.0)
    step(e)
    assert e.phase is None
    # Expiry, then EB again: a fresh machine (decode phase, no refill history).
    e.apply(decision(common_pb2.MODE_EB, version=3, k=4, n=16, ttl_s=1.0), now_s=2.0)
    step(e, running=12, waiting=10)
    assert e.phase is Phase.PREFILL
    assert e.expire(3.0)
    step(e)
    assert e.phase is None
    e.apply(decision(common_pb2.MODE_EB, version=4, k=4, n=16), now_s=4.0)
    assert step(e, running=14, waiting=10).kind is StepKind.DECODE_ONLY
    assert e.phase is Phase.DECODE


def test_observe_step_reaches_the_phase_machine() -> None:
    e = enforcer()
    e.apply(decision(k=2, n=16), now_s=0.0)
    assert step(e, running=10, waiting=3, free_kv=5000, headroom=100).kind is StepKind.PREFILL_ONLY
    e.observe_step(num_scheduled_tokens=0)
    assert step(e, running=10, waiting=3, free_kv=5000, headroom=100).kind is StepKind.DECODE_ONLY


def test_invalid_limits_raise() -> None:
    with pytest.raises(ValueError):
        Enforcer(max_num_seqs=0, max_num_batched_tokens=10)


@settings(max_examples=200, deadline=None)
@given(
    versions=st.lists(st.integers(0, 12), min_size=1, max_size=30),
    gaps=st.lists(st.floats(0.0, 20.0), min_size=30, max_size=30),
    ttl_s=st.floats(0.5, 15.0),
)
def test_held_version_never_decreases_and_expiry_matches_the_ttl(versions, gaps, ttl_s) -> None:
    e = enforcer()
    now_s = 0.0
    floor = 0
    expiry = math.inf
    for version, gap in zip(versions, gaps, strict=False):
        now_s += gap
        dropped = e.expire(now_s)
        assert dropped == (now_s >= expiry)
        if dropped:
            expiry = math.inf
        applied, reason = e.apply(decision(version=version, ttl_s=ttl_s), now_s=now_s)
        if version < floor:
            assert (applied, reason) == (False, "stale_version")
        else:
            assert (applied, reason) == (True, "")
            floor = version
            expiry = now_s + ttl_s
        assert e.version_floor == floor
        assert e.expires_at_s == expiry
        step(e)
        assert e.active_policy is e.policy


def test_the_engines_own_admission_cap_bounds_stock_and_every_decision() -> None:
    """`--max-num-active-seqs 2` on an engine with 8 slots: stock admits 2, and no decision raises it."""
    e = Enforcer(max_num_seqs=8, max_num_batched_tokens=STARTUP_BUDGET, max_num_active_reqs=2)
    assert e.max_num_active_reqs == 2
    stock = step(e, running=0, waiting=10)
    assert (stock.kind, stock.max_num_active_reqs, stock.num_seqs_cap) == (StepKind.STOCK, 2, 2)
    assert e.apply(decision(common_pb2.MODE_MB, n=8, k=1), now_s=0.0) == (True, "")
    mb = step(e, running=0, waiting=10)
    assert (mb.max_num_active_reqs, mb.num_seqs_cap, e.policy.n) == (2, 2, 2)
    assert e.apply(decision(version=2, k=6, n=8), now_s=0.0) == (True, "")  # k lowered to the cap in force
    assert (e.policy.k, e.policy.n) == (2, 2)
    eb = step(e, running=0, waiting=10)
    assert eb.kind is StepKind.PREFILL_ONLY and eb.max_num_active_reqs <= 2
    assert e.apply(decision(version=3, n=9), now_s=0.0) == (False, "n_greater_than_max_num_seqs")
    assert e.apply(decision(common_pb2.MODE_PASSTHROUGH, version=4), now_s=0.0) == (True, "")
    assert step(e, running=1, waiting=10).max_num_active_reqs == 2
    assert e.expire(1e9)
    assert step(e, running=0, waiting=10) == stock


def test_degenerate_budgets_are_refused_below_the_floor() -> None:
    e = Enforcer(max_num_seqs=512, max_num_batched_tokens=8192)
    before = e.policy
    for b_max, b_cap in ((1, 1), (1024, 1), (255, 0), (0, 255)):
        assert e.apply(decision(common_pb2.MODE_MB, n=16, b_max=b_max, b_cap=b_cap), now_s=0.0) == (
            False, "budget_below_floor"), (b_max, b_cap)
        assert e.apply(decision(n=16, b_max=b_max, b_cap=b_cap), now_s=0.0) == (False, "budget_below_floor")
        assert e.policy is before
    assert e.apply(decision(common_pb2.MODE_MB, n=300, b_max=1024, b_cap=256), now_s=0.0) == (True, "")
    assert e.apply(decision(version=2, n=16, b_max=256, b_cap=0), now_s=0.0) == (True, "")  # EB: b_max 256
    assert e.apply(decision(common_pb2.MODE_PASSTHROUGH, version=3, b_max=1, b_cap=1), now_s=0.0) == (True, "")
    # An engine started with a budget below 256 accepts its own start-up budget.
    small = Enforcer(max_num_seqs=8, max_num_batched_tokens=64)
    assert small.apply(decision(common_pb2.MODE_MB, n=8, k=1, b_max=64, b_cap=64), now_s=0.0) == (True, "")
    assert small.apply(decision(common_pb2.MODE_MB, version=2, n=8, k=1, b_max=64, b_cap=63), now_s=0.0) == (
        False, "budget_below_floor")
