"""The Enforcer driving a small vLLM-like scheduler for thousands of steps, with random arrivals, finishes,
decisions, controller silences and mode switches.

`FakeScheduler` applies each `StepPlan` the way the vLLM adapter does (docs/VLLM_INTERNALS.md): the token budget
and the admission gate `max_num_active_reqs`; DECODE_ONLY as vLLM's prefill throttle (skip prefill chunks and
admission, only when something can decode); PREFILL_ONLY by making running decodes ineligible for the step;
STOCK as vLLM v1's mixed scheduling. KV is held in blocks; a request that cannot get its blocks preempts the
latest-admitted running request not yet scheduled in the step (possibly itself; recompute, back to the front
of the waiting queue), and nothing is admitted in a step that preempted, as in vLLM.

Checked every step: EB steps never mix prefill and decode; budgets never exceed the start-up budget, and in MB
equal the P-PAS choice; admission never takes running above N nor beyond the plan's limit; no empty step
while work exists (except one in which vLLM itself preempted, or the one empty prefill step the phase
machine's guard absorbs when the KV headroom is underestimated); expired decisions give stock plans; stale
and invalid decisions are rejected with their reason. At the end every request has finished (liveness).
"""

from __future__ import annotations

import random
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.enforcement import Enforcer, Mode, StepKind, StepPlan, budget_floor_tokens
from controlplane.api.v1 import common_pb2

DECODE_ONLY = StepKind.DECODE_ONLY
PREFILL_ONLY = StepKind.PREFILL_ONLY
STOCK = StepKind.STOCK
STEP_S = 0.01


class Request:
    __slots__ = ("blocks", "computed", "generated", "output", "prompt", "scheduled_at")

    def __init__(self, prompt: int, output: int) -> None:
        self.prompt = prompt
        self.output = output
        self.computed = 0
        self.generated = 0
        self.blocks = 0
        self.scheduled_at = -1

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.generated

    @property
    def is_decode(self) -> bool:
        return self.generated > 0 and self.computed == self.num_tokens - 1


class StepResult:
    __slots__ = ("num_admitted", "num_decodes", "num_finished", "num_preempted", "num_prefill_tokens")

    def __init__(self) -> None:
        self.num_admitted = self.num_decodes = self.num_finished = self.num_preempted = 0
        self.num_prefill_tokens = 0

    @property
    def num_tokens(self) -> int:
        return self.num_prefill_tokens + self.num_decodes


class FakeScheduler:
    """A tiny stand-in for vLLM v1's scheduler that obeys StepPlans (see the module docstring)."""

    def __init__(self, *, max_num_seqs: int, budget_tokens: int, kv_capacity_tokens: int, block_size: int) -> None:
        self.max_num_seqs = max_num_seqs
        self.budget_tokens = budget_tokens
        self.block_size = block_size
        self.total_blocks = kv_capacity_tokens // block_size
        self.free_blocks = self.total_blocks
        self.running: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.step_index = 0
        self.num_finished = 0

    def counts(self) -> dict[str, int]:
        prefills = decodes = largest = 0
        for req in self.running:
            if req.is_decode:
                decodes += 1
            else:
                prefills += 1
                largest = max(largest, req.num_tokens - req.computed)
        return {"num_running": len(self.running), "num_running_prefills": prefills, "num_running_decodes": decodes,
                "num_waiting": len(self.waiting), "free_kv_tokens": self.free_blocks * self.block_size,
                "largest_remaining_prefill_tokens": largest}

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def step(self, plan: StepPlan) -> StepResult:
        assert 1 <= plan.token_budget_tokens <= self.budget_tokens
        self.step_index += 1
        result = StepResult()
        scheduled: list[tuple[Request, int]] = []
        tokens_left = plan.token_budget_tokens
        decodable = any(req.is_decode for req in self.running)
        throttle = plan.kind is DECODE_ONLY and decodable  # vLLM's throttle acts only when something decodes
        skip_decodes = plan.kind is PREFILL_ONLY
        for req in list(self.running):
            if tokens_left <= 0:
                break
            if req not in self.running:  # preempted earlier in this step
                continue
            if req.is_decode:
                if skip_decodes:
                    continue
                count = 1
            else:
                if throttle:
                    continue
                count = min(req.num_tokens - req.computed, tokens_left)
            if not self._allocate(req, count, result):
                break
            req.scheduled_at = self.step_index
            scheduled.append((req, count))
            tokens_left -= count
        if not throttle and not result.num_preempted:
            cap = min(plan.max_num_active_reqs, self.max_num_seqs)
            while self.waiting and tokens_left > 0 and len(self.running) < cap:
                req = self.waiting[0]
                count = min(req.num_tokens, tokens_left)
                needed = -(-count // self.block_size)
                if needed > self.free_blocks:
                    break
                self.waiting.popleft()
                self.free_blocks -= needed
                req.blocks = needed
                req.scheduled_at = self.step_index
                self.running.append(req)
                scheduled.append((req, count))
                tokens_left -= count
                result.num_admitted += 1
        for req, count in scheduled:
            if req.is_decode and count == 1:
                result.num_decodes += 1
            else:
                result.num_prefill_tokens += count
        self._execute(scheduled, result)
        return result

    def _allocate(self, req: Request, count: int, result: StepResult) -> bool:
        needed = -(-(req.computed + count) // self.block_size) - req.blocks
        while needed > self.free_blocks:
            victim = next(r for r in reversed(self.running) if r.scheduled_at != self.step_index)
            self._preempt(victim)
            result.num_preempted += 1
            if victim is req:
                return False
        self.free_blocks -= needed
        req.blocks += needed
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.free_blocks += req.blocks
        req.blocks = 0
        req.computed = 0
        self.waiting.appendleft(req)

    def _execute(self, scheduled: list[tuple[Request, int]], result: StepResult) -> None:
        for req, count in scheduled:
            req.computed += count
            if req.computed == req.num_tokens:
                req.generated += 1
                if req.generated >= req.output:
                    self.running.remove(req)
                    self.free_blocks += req.blocks
                    req.blocks = 0
                    result.num_finished += 1
                    self.num_finished += 1
        assert 0 <= self.free_blocks <= self.total_blocks


def p_pas_budget(policy, counts: dict[str, int]) -> int:
    """The P-PAS(+) choice written out independently: N_p = running prefills + admissible waiting."""
    b = policy.budget
    admissible = max(0, min(counts["num_waiting"], policy.n - counts["num_running"]))
    n_p = counts["num_running_prefills"] + admissible
    n_d = counts["num_running_decodes"]
    pressure = (n_p >= b.n_th and n_d > 0) or (
        b.t_large_tokens > 0 and n_p == 1 and n_d >= b.n_d_large
        and counts["largest_remaining_prefill_tokens"] >= b.t_large_tokens)
    return b.b_cap_tokens if pressure else b.b_max_tokens


class Controller:
    """A scripted controller: new, stale and invalid decisions, keep-alives, and silences."""

    def __init__(self, rng: random.Random, *, max_num_seqs: int, budget_tokens: int, modes: list[int]) -> None:
        self.rng = rng
        self.max_num_seqs = max_num_seqs
        self.budget_tokens = budget_tokens
        self.modes = modes
        self.version = 0
        self.silent_until_s = 0.0
        self.ttl_s = 1.0

    def random_decision(self, version: int) -> common_pb2.Decision:
        rng = self.rng
        n = rng.randint(1, self.max_num_seqs)
        floor = budget_floor_tokens(max_num_batched_tokens=self.budget_tokens)
        b_max = rng.choice([0, rng.randint(floor, 2 * self.budget_tokens)])
        b_cap = rng.choice([0, rng.randint(floor, b_max or self.budget_tokens)])
        return common_pb2.Decision(
            version=version, mode=rng.choice(self.modes), k=rng.randint(1, n), n=n, ttl_s=self.ttl_s,
            advisory=rng.random() < 0.15,
            budget=common_pb2.BudgetPolicy(b_max_tokens=b_max, b_cap_tokens=b_cap, n_th=rng.randint(0, 4),
                                           t_large_tokens=rng.choice([0, 64, 256]), n_d_large=rng.randint(0, 3)),
        )

    def act(self, enforcer: Enforcer, now_s: float) -> None:
        rng = self.rng
        if now_s < self.silent_until_s:
            return
        roll = rng.random()
        if roll < 0.015:
            self.version += 1
            d = self.random_decision(self.version)
            assert enforcer.apply(d, now_s=now_s) == (True, "")
            assert enforcer.policy.version == self.version
        elif roll < 0.02 and self.version >= 2:
            d = self.random_decision(self.version - 1)
            assert enforcer.apply(d, now_s=now_s) == (False, "stale_version")
        elif roll < 0.025:
            held = enforcer.policy
            d = self.random_decision(self.version + 1)
            d.k = d.n + 1
            d.mode = rng.choice([common_pb2.MODE_EB, common_pb2.MODE_MB])  # PASSTHROUGH ignores k and n
            assert enforcer.apply(d, now_s=now_s) == (False, "k_greater_than_n")
            assert enforcer.policy is held
        elif roll < 0.028:
            held = enforcer.policy
            d = self.random_decision(self.version + 1)
            d.mode = rng.choice([common_pb2.MODE_EB, common_pb2.MODE_MB])
            floor = budget_floor_tokens(max_num_batched_tokens=self.budget_tokens)
            if floor > 1:  # a degenerate budget (below the floor) is refused
                d.budget.b_max_tokens = rng.randint(1, floor - 1)
                d.budget.b_cap_tokens = rng.randint(0, d.budget.b_max_tokens)
                assert enforcer.apply(d, now_s=now_s) == (False, "budget_below_floor")
                assert enforcer.policy is held
        elif roll < 0.03:
            self.silent_until_s = now_s + rng.uniform(0.0, 3.0)  # the controller goes away for a while
        elif roll < 0.2:
            enforcer.touch(now_s)
            if self.version:  # the keep-alive re-send of the current decision (same version)
                assert enforcer.apply(self.random_decision(self.version), now_s=now_s) == (True, "")


def run(*, seed: int, max_num_seqs: int, budget_tokens: int, kv_capacity_tokens: int, num_requests: int,
        max_prompt: int, max_output: int, modes: list[int], headroom_exact: bool = True,
        fixed: common_pb2.Decision | None = None) -> dict[str, int]:
    """Drive an Enforcer and a FakeScheduler until `num_requests` random requests have finished.

    The scripted controller changes decisions at random among `modes`; with `fixed`, it applies that one
    decision and keeps it alive instead. headroom_exact=False underestimates the KV a new request needs."""
    rng = random.Random(seed)
    block = 16
    sched = FakeScheduler(max_num_seqs=max_num_seqs, budget_tokens=budget_tokens,
                          kv_capacity_tokens=kv_capacity_tokens, block_size=block)
    enforcer = Enforcer(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget_tokens)
    controller = Controller(rng, max_num_seqs=max_num_seqs, budget_tokens=budget_tokens, modes=modes)
    # The KV one new request's first chunk can need (prompt, or prompt + generated after a preemption).
    headroom = (-(-min(budget_tokens, max_prompt + max_output) // block) + 1) * block if headroom_exact else 1
    stock_plan = StepPlan(STOCK, budget_tokens, max_num_seqs, max_num_seqs, max_num_seqs, False)
    now_s = 0.0
    num_arrived = 0
    stats = {"steps": 0, "eb_steps": 0, "mb_steps": 0, "stock_steps": 0, "phase_switches": 0, "expiries": 0,
             "preemptions": 0, "empty_without_preemption": 0}
    previous_empty = False
    arrival_probability = 0.3
    while num_arrived < num_requests or sched.has_work:
        stats["steps"] += 1
        assert stats["steps"] < 200_000, "the engine did not drain: a request was stranded"
        now_s += STEP_S
        if stats["steps"] % 400 == 1:  # the load changes: trickle, moderate, burst
            arrival_probability = rng.choice([0.03, 0.3, 0.9])
        if num_arrived < num_requests and rng.random() < arrival_probability:
            for _ in range(rng.choice([1, 1, 1, 2, 5])):
                if num_arrived < num_requests:
                    sched.waiting.append(Request(rng.randint(1, max_prompt), rng.randint(1, max_output)))
                    num_arrived += 1
        if fixed is None:
            controller.act(enforcer, now_s)
        elif stats["steps"] == 1:
            assert enforcer.apply(fixed, now_s=now_s) == (True, "")
        else:
            enforcer.touch(now_s)
        expired = enforcer.expire(now_s)
        stats["expiries"] += expired
        if not sched.has_work:
            continue
        counts = sched.counts()
        plan = enforcer.plan_step(kv_tokens_per_new_request=headroom, **counts)
        policy = enforcer.active_policy
        assert enforcer.would_plan is not None
        # Budgets and caps.
        assert 1 <= plan.token_budget_tokens <= budget_tokens
        assert plan.max_num_active_reqs <= plan.num_seqs_cap <= max_num_seqs
        if expired:
            assert plan == stock_plan
        if policy.is_stock:
            assert plan == stock_plan
            stats["stock_steps"] += 1
        elif policy.mode is Mode.MB:
            assert plan.kind is STOCK
            assert plan.token_budget_tokens == p_pas_budget(policy, counts)
            assert plan.token_budget_tokens <= policy.budget.b_max_tokens
            assert plan.num_seqs_cap == policy.n
            stats["mb_steps"] += 1
        else:
            assert plan.kind in (DECODE_ONLY, PREFILL_ONLY)
            assert plan.num_new_reqs_max <= policy.k
            if plan.kind is PREFILL_ONLY and plan.phase_switched:
                # A prefill phase opens only when k slots are idle, nothing decodes, or a prefill is partial.
                assert (policy.n - counts["num_running"] >= policy.k or counts["num_running_decodes"] == 0
                        or counts["num_running_prefills"] > 0), (plan, counts)
            stats["eb_steps"] += 1
            stats["phase_switches"] += plan.phase_switched
        running_before = counts["num_running"]
        result = sched.step(plan)
        enforcer.observe_step(num_scheduled_tokens=result.num_tokens)
        stats["preemptions"] += result.num_preempted
        # Exclusive steps never mix.
        if plan.kind is PREFILL_ONLY:
            assert result.num_decodes == 0
            assert result.num_admitted <= plan.num_new_reqs_max
        if plan.kind is DECODE_ONLY and counts["num_running_decodes"] > 0:
            assert result.num_prefill_tokens == 0
            assert result.num_admitted == 0
        # Admission never takes running above N.
        if result.num_admitted:
            assert running_before + result.num_admitted <= plan.num_seqs_cap
        # No empty step while work exists, except when vLLM preempted or the one the stall guard absorbs.
        if result.num_tokens == 0:
            assert plan.kind is not STOCK or result.num_preempted, (plan, counts)
            if not result.num_preempted:
                assert plan.kind is PREFILL_ONLY and not headroom_exact, (plan, counts)
                assert not previous_empty, "two empty steps in a row"
                stats["empty_without_preemption"] += 1
        previous_empty = result.num_tokens == 0 and not result.num_preempted
    assert sched.num_finished == num_requests
    assert sched.free_blocks == sched.total_blocks
    return stats


ALL_MODES = [common_pb2.MODE_EB, common_pb2.MODE_MB, common_pb2.MODE_PASSTHROUGH]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("name", "shape"),
    [
        ("roomy", {"max_num_seqs": 16, "budget_tokens": 256, "kv_capacity_tokens": 1 << 16, "max_prompt": 200,
                   "max_output": 60}),
        ("tight_kv", {"max_num_seqs": 24, "budget_tokens": 128, "kv_capacity_tokens": 1536, "max_prompt": 120,
                      "max_output": 80}),
    ],
)
def test_random_decisions_keep_every_invariant_and_every_request_finishes(seed: int, name: str, shape) -> None:
    stats = run(seed=seed, num_requests=1500, modes=ALL_MODES, **shape)
    assert stats["eb_steps"] > 0 and stats["mb_steps"] > 0 and stats["stock_steps"] > 0
    assert stats["expiries"] > 0
    if name == "tight_kv":
        assert stats["preemptions"] > 0


@pytest.mark.parametrize("seed", range(3))
def test_eb_only_alternates_phases_and_drains(seed: int) -> None:
    stats = run(seed=seed, num_requests=300, modes=[common_pb2.MODE_EB], max_num_seqs=32, budget_tokens=512,
                kv_capacity_tokens=1 << 16, max_prompt=100, max_output=100)
    assert stats["eb_steps"] > stats["stock_steps"]
    assert stats["phase_switches"] > 10


@pytest.mark.parametrize("seed", range(3))
def test_underestimated_kv_headroom_costs_at_most_isolated_empty_steps(seed: int) -> None:
    stats = run(seed=seed, num_requests=200, modes=[common_pb2.MODE_EB], max_num_seqs=24, budget_tokens=128,
                kv_capacity_tokens=1536, max_prompt=120, max_output=80, headroom_exact=False)
    assert stats["empty_without_preemption"] < stats["steps"] // 10


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("k", "n"), [(1, 4), (3, 12), (6, 12)])
@pytest.mark.parametrize("headroom_exact", [True, False])
def test_chunked_prefills_under_tight_kv_do_not_livelock(seed: int, k: int, n: int, headroom_exact: bool) -> None:
    """Prefills chunked by a small budget need more KV than the frozen decodes leave: a prefill that cannot grow
    preempts itself; the phase machine must go back to decoding until more KV is free (not readmit it)."""
    fixed = common_pb2.Decision(version=1, mode=common_pb2.MODE_EB, k=k, n=n, ttl_s=1.0,
                                budget=common_pb2.BudgetPolicy(b_max_tokens=32))
    stats = run(seed=seed, num_requests=150, modes=[], max_num_seqs=12, budget_tokens=32,
                kv_capacity_tokens=20 * 16, max_prompt=150, max_output=60, headroom_exact=headroom_exact,
                fixed=fixed)
    assert stats["stock_steps"] == 0 and stats["preemptions"] > 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32 - 1),
    max_num_seqs=st.integers(1, 24),
    budget_tokens=st.integers(1, 300),
    kv_blocks=st.integers(24, 400),
    max_prompt=st.integers(1, 150),
    max_output=st.integers(1, 60),
    modes=st.sampled_from([ALL_MODES, [common_pb2.MODE_EB], [common_pb2.MODE_MB]]),
    headroom_exact=st.booleans(),
    fixed_eb_k_fraction=st.none() | st.floats(0.0, 1.0),
)
def test_invariants_and_liveness_for_any_engine_shape(seed, max_num_seqs, budget_tokens, kv_blocks, max_prompt,
                                                      max_output, modes, headroom_exact, fixed_eb_k_fraction) -> None:
    # KV holds at least one request of the largest size (vLLM refuses longer requests at admission).
    kv_blocks = max(kv_blocks, -(-(max_prompt + max_output) // 16) + 2)
    fixed = None
    if fixed_eb_k_fraction is not None:  # one EB decision held for the whole run, no stock steps to help
        k = max(1, round(fixed_eb_k_fraction * max_num_seqs))
        fixed = common_pb2.Decision(version=1, mode=common_pb2.MODE_EB, k=k, n=max_num_seqs, ttl_s=1.0)
    run(seed=seed, max_num_seqs=max_num_seqs, budget_tokens=budget_tokens, kv_capacity_tokens=kv_blocks * 16,
        num_requests=80, max_prompt=max_prompt, max_output=max_output, modes=modes, headroom_exact=headroom_exact,
        fixed=fixed)
