"""Judging through the fleet state machine: an engine's volume is not its vote, heterogeneous pools are not
attacks, and a pool-wide shift excludes nobody (`loop.judging`, `loop.fleet`, `loop.buckets` fair share).

Honest engines send exactly the same data with and without attackers (`testbench.fleet_drive`), so every
difference in their decisions is the attackers' doing.
"""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.loop.judging import CONFIRM_BLOCKS, Block, Reference, judge_block
from controlplane.loop.latest_blocks import LatestBlocks
from testbench.fleet_drive import HONEST, LONG_CONTEXT, Workload, drive, worst_change

SHORT_RUN_S = 40


def _honest(count: int) -> dict[str, Workload]:
    return {f"h{i:02d}": HONEST for i in range(count)}


@pytest.fixture(scope="module")
def baseline20():
    return drive(_honest(20), seconds=SHORT_RUN_S)


@pytest.fixture(scope="module")
def baseline16():
    return drive(_honest(16), seconds=SHORT_RUN_S)


@pytest.mark.sim
@pytest.mark.parametrize("attacker", [
    Workload(prompt_mean_tokens=7000.0, output_mean_tokens=256.0, per_second=20_000),  # long prompts
    Workload(prompt_mean_tokens=7000.0, output_mean_tokens=480.0, per_second=50_000),  # and long outputs
    Workload(prompt_mean_tokens=512.0, output_mean_tokens=486.0, per_second=20_000),  # outputs 1.9x alone
    Workload(prompt_mean_tokens=512.0, output_mean_tokens=486.0, per_second=100),  # ... at an honest rate
], ids=["prompts", "prompts+outputs", "outputs-1.9x", "outputs-1.9x-honest-rate"])
def test_one_loud_engine_moves_no_honest_decision(baseline20, attacker: Workload) -> None:
    engines = _honest(19) | {"x0": attacker}
    outcome = drive(engines, seconds=SHORT_RUN_S)
    honest = [e for e in engines if e != "x0"]
    dn, dk = worst_change(outcome, baseline20, honest)
    assert dn <= 0.05 and dk <= 0.05, (dn, dk)
    assert not any(outcome.excluded[e] for e in honest)
    assert outcome.excluded["x0"]


@pytest.mark.sim
def test_four_of_twenty_poisoning_engines_move_honest_decisions_by_at_most_ten_percent(baseline16) -> None:
    engines = _honest(16) | {f"x{j}": Workload(prompt_mean_tokens=512.0, output_mean_tokens=486.0,
                                                per_second=20_000) for j in range(4)}
    outcome = drive(engines, seconds=SHORT_RUN_S)
    dn, dk = worst_change(outcome, baseline16, list(_honest(16)))
    assert dn <= 0.10 and dk <= 0.10, (dn, dk)
    assert not any(outcome.excluded[e] for e in _honest(16))
    assert all(outcome.excluded[f"x{j}"] for j in range(4))


def test_a_heterogeneous_pool_decides_each_engine_as_a_pool_of_its_own_workload() -> None:
    """5 of 20 engines serve long-context requests (prompts ~7,000, outputs ~480): each engine gets the mode,
    N and k a pool of its own workload alone gives it (within 10%); the long ones are kept out of the pool
    and decided from their own statistics, the short ones are not."""
    short = {f"s{i:02d}": HONEST for i in range(15)}
    long = {f"l{i}": LONG_CONTEXT for i in range(5)}
    mixed = drive(short | long, seconds=60)
    short_alone, long_alone = drive(short, seconds=60), drive(long, seconds=60)
    for group, reference in ((short, short_alone), (long, long_alone)):
        dn, dk = worst_change(mixed, reference, list(group))
        assert dn <= 0.10 and dk <= 0.10, (next(iter(group)), dn, dk)
        assert all(mixed.modes[e] == reference.modes[e] for e in group)
    assert all(mixed.excluded[e] for e in long) and not any(mixed.excluded[e] for e in short)


def test_a_pool_wide_shift_keeps_every_engine_in_its_pool() -> None:
    """Every engine's outputs double at once: the first engine to fill a block on the new law is one distinct
    block ahead of the others' (CONFIRM_BLOCKS blocks in a row are needed), so nobody is kept out."""
    engines = _honest(10)
    outcome = drive(engines, seconds=50,
                    shift=(20, {e: Workload(output_mean_tokens=512.0) for e in engines}))
    assert outcome.memberships == []
    assert CONFIRM_BLOCKS >= 2


def test_an_engine_whose_workload_returns_to_the_pools_is_readmitted() -> None:
    engines = _honest(8) | {"x0": Workload(prompt_mean_tokens=4000.0)}
    outcome = drive(engines, seconds=50, shift=(25, {"x0": HONEST}))
    changes = [(engine, excluded) for _, engine, excluded in outcome.memberships]
    assert changes == [("x0", True), ("x0", False)]
    assert not outcome.excluded["x0"]


# ---- the rule itself ----


def _block(out_mean: float, prompt_mean: float = 512.0, *, count: int = 256, std_fraction: float = 1.0) -> Block:
    return Block(count, out_mean, std_fraction * out_mean, prompt_mean, 0.3 * prompt_mean)


def reference_of(blocks: dict[str, Block], *, excluding: str) -> Reference | None:
    """The pool's reference (`LatestBlocks`, a pool within the panel size) for judging `excluding`."""
    book = LatestBlocks(b"k")
    for engine_id, block in blocks.items():
        book.put(engine_id, block)
    return book.reference(excluding=excluding)


def test_the_reference_is_the_median_of_the_other_engines() -> None:
    blocks = {"a": _block(250.0), "b": _block(260.0), "c": _block(5000.0, 9000.0), "me": _block(1.0)}
    ref = reference_of(blocks, excluding="me")
    assert ref == Reference(output_mean_tokens=260.0, prompt_mean_tokens=512.0, num_engines=3,
                            output_std_tokens=260.0, prompt_std_tokens=0.3 * 512.0)
    assert reference_of({"a": _block(1.0), "me": _block(1.0)}, excluding="me") is None  # one other: no majority


@pytest.mark.parametrize(("block", "excluded", "statistic"), [
    (_block(256.0), False, ""),
    (_block(300.0), False, ""),  # 17% away: within DISTINCT_GAP
    (_block(486.0), True, "outputs"),
    (_block(256.0, 7000.0), True, "prompts"),
    (_block(486.0, count=4), False, ""),  # far, but 4 completions prove nothing
    (_block(486.0, std_fraction=30.0), True, "outputs"),  # its own spread does not hide it: the pool's counts
])
def test_a_block_is_distinct_only_far_from_the_reference_in_standard_errors_and_in_ratio(
        block: Block, excluded: bool, statistic: str) -> None:
    reference = Reference(output_mean_tokens=256.0, prompt_mean_tokens=512.0, num_engines=19,
                          output_std_tokens=256.0, prompt_std_tokens=150.0)
    verdict = judge_block(block, reference)
    assert (verdict.excluded, verdict.statistic) == (excluded, statistic)


def test_the_median_cannot_be_moved_by_a_minority() -> None:
    rng = np.random.default_rng(3)
    honest = {f"h{i}": _block(float(rng.normal(256.0, 5.0))) for i in range(11)}
    liars = {f"x{i}": _block(1e9, 1e9) for i in range(10)}
    ref = reference_of(honest | liars, excluding="none")
    means = [b.output_mean_tokens for b in honest.values()]
    assert min(means) <= ref.output_mean_tokens <= max(means) and ref.prompt_mean_tokens == 512.0


def test_probation_holds_at_most_max_held_completions_whatever_a_batch_carries() -> None:
    from controlplane.loop.judging import MAX_HELD, EngineJudge, HeldBatch

    judge = EngineJudge()
    million = np.arange(1, 1_000_001, dtype=np.float64)
    judge.hold(HeldBatch(million, million, None, 0.0))  # admissions not reported
    judge.hold(HeldBatch(million, million, np.zeros(3), 1.0))  # ... or malformed: dropped, not an IndexError
    held = judge.probation
    assert sum(h.outputs.size for h in held) == MAX_HELD and len(held) == 1
    released = judge.end_probation(2.0, admit=True)
    assert released.outputs.size == MAX_HELD and released.admitted_age_s is None
    assert released.outputs[0] == 1.0 and released.outputs[-1] == 1_000_000.0  # evenly spaced, ends kept
