"""agents.enforcement.policy: validation codes, budgets only lowered, advisory and stock policies."""

from __future__ import annotations

import ast
import math
import pathlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.enforcement.policy import (
    Mode,
    budget_floor_tokens,
    policy_from_decision,
    reject_reason,
    stock_policy,
)
from controlplane.api.v1 import common_pb2
from controlplane.protocol import min_budget_tokens
from tests.unit.agent_decisions import decision

MAX_NUM_SEQS = 64
STARTUP_BUDGET = 4096


def convert(d: common_pb2.Decision):
    return policy_from_decision(d, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=STARTUP_BUDGET)


@pytest.mark.parametrize(
    ("d", "reason"),
    [
        (decision(common_pb2.MODE_UNSPECIFIED), "mode_unspecified"),
        (decision(7), "mode_unknown"),
        (decision(ttl_s=0.0), "ttl_invalid"),
        (decision(ttl_s=-1.0), "ttl_invalid"),
        (decision(ttl_s=math.nan), "ttl_invalid"),
        (decision(ttl_s=math.inf), "ttl_invalid"),
        (decision(n=0, k=0), "n_zero"),
        (decision(n=MAX_NUM_SEQS + 1), "n_greater_than_max_num_seqs"),
        (decision(k=0), "k_zero"),
        (decision(k=17, n=16), "k_greater_than_n"),
        (decision(b_max=256, b_cap=257), "b_cap_greater_than_b_max"),
        (decision(common_pb2.MODE_MB, k=17, n=16), "k_greater_than_n"),
        (decision(advisory=True, k=17, n=16), "k_greater_than_n"),
        (decision(b_max=2048, b_cap=1), "budget_below_floor"),
        (decision(common_pb2.MODE_MB, b_max=255, b_cap=0), "budget_below_floor"),
        (decision(advisory=True, b_max=0, b_cap=100), "budget_below_floor"),
    ],
)
def test_invalid_decisions_are_rejected_with_their_reason(d: common_pb2.Decision, reason: str) -> None:
    assert convert(d) == (None, reason)
    assert reject_reason(d, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=STARTUP_BUDGET) == reason


def test_valid_eb_decision_converts_field_by_field() -> None:
    policy, reason = convert(decision(k=3, n=12, b_max=2048, b_cap=512, n_th=3, t_large=1000, n_d_large=4,
                                      version=9, ttl_s=12.5))
    assert reason == ""
    assert policy is not None
    assert (policy.mode, policy.k, policy.n, policy.version, policy.ttl_s, policy.advisory) == (
        Mode.EB, 3, 12, 9, 12.5, False)
    b = policy.budget
    assert (b.b_max_tokens, b.b_cap_tokens, b.n_th, b.t_large_tokens, b.n_d_large) == (2048, 512, 3, 1000, 4)
    assert not policy.is_stock


@pytest.mark.parametrize(
    ("b_max", "b_cap", "expected"),
    [
        (8192, 1024, (STARTUP_BUDGET, 1024)),  # b_max above the start-up budget: lowered, never raised
        (8192, 6000, (STARTUP_BUDGET, STARTUP_BUDGET)),  # both above: both clamped
        (0, 1024, (STARTUP_BUDGET, 1024)),  # b_max 0: the start-up budget
        (0, 9000, (STARTUP_BUDGET, STARTUP_BUDGET)),  # b_max 0 and b_cap above start-up: clamped to b_max
        (2048, 0, (2048, 2048)),  # b_cap 0: no cap
        (300, 300, (300, 300)),
        (256, 0, (256, 256)),
    ],
)
def test_budgets_are_only_lowered(b_max: int, b_cap: int, expected: tuple[int, int]) -> None:
    policy, _ = convert(decision(common_pb2.MODE_MB, b_max=b_max, b_cap=b_cap))
    assert policy is not None
    assert (policy.budget.b_max_tokens, policy.budget.b_cap_tokens) == expected


def test_budget_floor_is_the_protocols_min_of_startup_and_256() -> None:
    assert budget_floor_tokens(max_num_batched_tokens=4096) == 256 == min_budget_tokens(4096)
    assert budget_floor_tokens(max_num_batched_tokens=256) == 256
    assert budget_floor_tokens(max_num_batched_tokens=100) == 100


def test_n_above_the_engines_admission_cap_is_lowered_not_raised() -> None:
    d = decision(common_pb2.MODE_EB, k=12, n=40)
    policy, reason = policy_from_decision(d, max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=STARTUP_BUDGET,
                                          max_num_active_reqs=10)
    assert reason == "" and policy is not None and (policy.n, policy.k) == (10, 10)
    stock, _ = policy_from_decision(decision(common_pb2.MODE_PASSTHROUGH), max_num_seqs=MAX_NUM_SEQS,
                                    max_num_batched_tokens=STARTUP_BUDGET, max_num_active_reqs=10)
    assert stock is not None and stock.n == 10


def test_passthrough_ignores_k_n_and_budget_and_is_stock() -> None:
    policy, reason = convert(decision(common_pb2.MODE_PASSTHROUGH, k=0, n=0, b_max=1, b_cap=99, version=4))
    assert reason == ""
    assert policy is not None
    assert policy.mode is Mode.PASSTHROUGH
    assert (policy.n, policy.budget.b_max_tokens, policy.budget.b_cap_tokens) == (
        MAX_NUM_SEQS, STARTUP_BUDGET, STARTUP_BUDGET)
    assert policy.version == 4 and policy.ttl_s == 30.0
    assert policy.is_stock


@pytest.mark.parametrize("mode", [common_pb2.MODE_MB, common_pb2.MODE_EB, common_pb2.MODE_PASSTHROUGH])
def test_advisory_decisions_yield_a_policy_flagged_advisory(mode: int) -> None:
    policy, reason = convert(decision(mode, advisory=True))
    assert reason == ""
    assert policy is not None
    assert policy.advisory and policy.is_stock


def test_stock_policy() -> None:
    policy = stock_policy(max_num_seqs=8, max_num_batched_tokens=512)
    assert (policy.mode, policy.n, policy.version, policy.advisory) == (Mode.PASSTHROUGH, 8, 0, False)
    assert policy.budget.b_max_tokens == policy.budget.b_cap_tokens == 512
    assert math.isinf(policy.ttl_s)
    with pytest.raises(ValueError, match="max_num_seqs"):
        stock_policy(max_num_seqs=0, max_num_batched_tokens=512)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        policy_from_decision(decision(), max_num_seqs=8, max_num_batched_tokens=0)


@given(
    mode=st.integers(0, 4), k=st.integers(0, 100), n=st.integers(0, 100), b_max=st.integers(0, 1 << 15),
    b_cap=st.integers(0, 1 << 15), ttl_s=st.floats(allow_nan=True, allow_infinity=True), advisory=st.booleans(),
    max_num_seqs=st.integers(1, 80), startup=st.integers(1, 1 << 14),
)
def test_any_decision_is_either_rejected_or_within_the_engine_limits(mode, k, n, b_max, b_cap, ttl_s, advisory,
                                                                     max_num_seqs, startup) -> None:
    d = decision(mode, k=k, n=n, b_max=b_max, b_cap=b_cap, ttl_s=ttl_s, advisory=advisory)
    policy, reason = policy_from_decision(d, max_num_seqs=max_num_seqs, max_num_batched_tokens=startup)
    assert (policy is None) == bool(reason)
    if policy is None:
        return
    assert 1 <= policy.k <= policy.n <= max_num_seqs
    assert 1 <= policy.budget.b_cap_tokens <= policy.budget.b_max_tokens <= startup
    floor = budget_floor_tokens(max_num_batched_tokens=startup)
    assert policy.mode is Mode.PASSTHROUGH or policy.budget.b_cap_tokens >= floor
    assert math.isfinite(policy.ttl_s) and policy.ttl_s > 0
    assert policy.advisory == advisory


FORBIDDEN_IMPORTS = {"grpc", "vllm", "asyncio", "threading", "time", "os", "io", "socket", "random", "logging",
                     "multiprocessing", "subprocess", "numpy"}


def test_the_package_imports_nothing_impure() -> None:
    """No I/O, no clock, no threads, no engine: only the stdlib basics, itself and controlplane.api."""
    package = pathlib.Path(__file__).resolve().parents[2] / "agents" / "enforcement"
    files = sorted(package.glob("*.py"))
    assert files
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                root = name.split(".")[0]
                assert root not in FORBIDDEN_IMPORTS, f"{path.name} imports {name}"
                if root == "controlplane":  # the generated code and the wire constants (which import only it)
                    assert name.startswith(("controlplane.api", "controlplane.protocol")), f"{path.name} imports {name}"
