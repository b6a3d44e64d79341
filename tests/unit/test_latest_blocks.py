"""The reference panel (`loop.latest_blocks`): exact within PANEL_SIZE engines, a keyed uniform sample above,
bounded however large the pool, and robust to a minority however it sends."""

from __future__ import annotations

import math

import numpy as np

from controlplane.loop.judging import MIN_POOL_ENGINES, Block, Reference
from controlplane.loop.latest_blocks import PANEL_SIZE, LatestBlocks


def reference_of(blocks: dict[str, Block], *, excluding: str, since_s: float = -math.inf) -> Reference | None:
    """The reference gathered block by block (the contract `LatestBlocks.reference` keeps with its array)."""
    others = [block for engine_id, block in blocks.items() if engine_id != excluding and block.ended_at_s >= since_s]
    if len(others) < MIN_POOL_ENGINES - 1:
        return None
    return Reference(output_mean_tokens=float(np.median([b.output_mean_tokens for b in others])),
                     prompt_mean_tokens=float(np.median([b.prompt_mean_tokens for b in others])),
                     num_engines=len(others),
                     output_std_tokens=float(np.median([b.output_std_tokens for b in others])),
                     prompt_std_tokens=float(np.median([b.prompt_std_tokens for b in others])))


def _block(out_mean: float, prompt_mean: float = 512.0, *, ended_at_s: float = 0.0) -> Block:
    return Block(256, out_mean, out_mean, prompt_mean, 0.3 * prompt_mean, ended_at_s - 1.0, ended_at_s)


def test_within_the_panel_size_the_reference_is_the_pools_exact_median() -> None:
    rng = np.random.default_rng(1)
    book = LatestBlocks(b"k")
    blocks = {f"e{i}": _block(float(rng.normal(256, 20)), float(rng.normal(512, 30)), ended_at_s=float(i))
              for i in range(PANEL_SIZE)}
    for engine_id, block in blocks.items():
        book.put(engine_id, block)
    assert len(book.panel()) == PANEL_SIZE
    assert book.reference(excluding="e7") == reference_of(blocks, excluding="e7")
    assert book.reference(excluding="e7", since_s=100.0) == reference_of(blocks, excluding="e7", since_s=100.0)
    distinct = {"e1", "e2", "e3"}
    kept = {e: b for e, b in blocks.items() if e not in distinct}
    assert book.reference(excluding="e7", left_out=distinct) == reference_of(kept, excluding="e7")


def test_above_the_panel_size_the_panel_is_bounded_and_set_by_the_key_not_by_the_order_or_the_values() -> None:
    ids = [f"engine-{i:05d}" for i in range(3_000)]
    first, second, other_key = LatestBlocks(b"key-1"), LatestBlocks(b"key-1"), LatestBlocks(b"key-2")
    for engine_id in ids:
        first.put(engine_id, _block(256.0))
        other_key.put(engine_id, _block(256.0))
    for engine_id in reversed(ids):
        second.put(engine_id, _block(9_999.0))  # other values, other order
    assert len(first.panel()) == PANEL_SIZE and len(first) == 3_000
    assert first.panel() == second.panel()
    assert len(set(first.panel()) & set(other_key.panel())) < PANEL_SIZE // 2  # another key: another sample
    # An engine that leaves frees its place for the next in rank; a new block of a member changes nothing.
    leaving = first.panel()[0]
    first.pop(leaving)
    assert leaving not in first.panel() and len(first.panel()) == PANEL_SIZE and len(first) == 2_999
    first.pop(leaving)  # twice: a no-op
    before = first.panel()
    first.put(before[5], _block(1.0))
    assert first.panel() == before


def test_a_large_pool_with_a_minority_of_liars_keeps_its_reference_in_the_honest_range() -> None:
    rng = np.random.default_rng(7)
    book = LatestBlocks(b"secret")
    honest_means = []
    for i in range(4_000):
        if i % 10 < 3:  # 30% of the pool lies, with absurd means, ending blocks all the time
            book.put(f"liar-{i}", _block(1e9, 1e9, ended_at_s=1e6))
        else:
            mean = float(rng.normal(256.0, 5.0))
            honest_means.append(mean)
            book.put(f"honest-{i}", _block(mean, ended_at_s=float(i)))
    reference = book.reference(excluding="none")
    assert reference is not None and reference.num_engines == PANEL_SIZE
    assert min(honest_means) <= reference.output_mean_tokens <= max(honest_means)
    assert reference.prompt_mean_tokens == 512.0


def test_the_reference_follows_every_put_and_pop_as_the_blocks_gathered_afresh_would() -> None:
    """Members ending blocks, engines entering and leaving the panel, distinct ones left out, windows in time:
    after each change the reference equals the one gathered from the panel's blocks."""
    rng = np.random.default_rng(11)
    book = LatestBlocks(b"k")
    blocks: dict[str, Block] = {}
    for step in range(600):
        engine_id = f"e{int(rng.integers(0, 400))}"
        if rng.random() < 0.1 and engine_id in blocks:
            book.pop(engine_id)
            del blocks[engine_id]
        else:
            block = _block(float(rng.normal(256, 30)), float(rng.normal(512, 40)), ended_at_s=float(step))
            book.put(engine_id, block)
            blocks[engine_id] = block
        panel = {e: blocks[e] for e in book.panel()}
        since_s = float(rng.integers(0, step + 1))
        left_out = set(rng.choice(list(blocks), size=min(3, len(blocks)), replace=False)) if blocks else set()
        kept = {e: b for e, b in panel.items() if e not in left_out}
        assert book.reference(excluding=engine_id, since_s=since_s, left_out=left_out) == reference_of(
            kept, excluding=engine_id, since_s=since_s)
