"""`LatestBlocks`: each engine's latest judged block in one pool, and the pool's *reference panel*, the engines
whose blocks make the robust reference that `loop.judging` judges every block against.

While a pool has at most `PANEL_SIZE` engines with a block, the panel is all of them (the reference is the
exact median of the pool). Above that it is the `PANEL_SIZE` engines with the smallest keyed hash of their id
(BLAKE2b under a key secret to the replica): a uniform random sample of the pool that no engine can choose to
enter, since an id's rank cannot be known without the key, and that does not depend on how much or how often an
engine sends. So a reference costs O(PANEL_SIZE) however large the pool (it is taken at every block an engine
ends; the exact median over n engines made a pool of n engines cost O(n²) a second), and its robustness
becomes probabilistic: with a fraction φ of the pool adversarial, the number of adversaries in the panel is
hypergeometric of mean φ·PANEL_SIZE, and they hold the panel's median only if they are a majority of it: with
probability below 10⁻²⁶ for φ ≤ 0.2, 10⁻¹¹ for φ = 0.3, 6·10⁻⁴ for φ = 0.4 and 5% for φ = 0.45 (binomial tails,
which bound the hypergeometric ones). The exact guarantee, f < n/2, holds for pools within the panel size.

The panel's blocks are also kept as one array (a column per member: output and prompt means and spreads, end
time), updated in place when a member ends a block and rebuilt only when the panel's membership changes, so a
reference is one mask and one median per row (about 5× cheaper than gathering the blocks each time; taken at
every block an engine ends, about 500 times a second at 2,000 engines).

Pure: no I/O; the key is the caller's (the controller draws one per process, the twin fixes one).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Collection

import numpy as np

from controlplane.loop.judging import MIN_POOL_ENGINES, Block, Reference

PANEL_SIZE = 255


class LatestBlocks:
    """Latest blocks by engine id and the reference panel (see the module docstring)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._blocks: dict[str, Block] = {}
        self._ranked: list[tuple[bytes, str]] = []  # (keyed hash, engine id) of every engine with a block, sorted
        self._columns: dict[str, int] | None = None  # panel member → its column of _matrix; None: to rebuild
        self._matrix = np.empty((5, 0))  # rows _ROWS (and the end time) of the panel's blocks

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, engine_id: str) -> Block | None:
        return self._blocks.get(engine_id)

    def put(self, engine_id: str, block: Block) -> None:
        """Record engine_id's latest block (an engine's first block enters it in the ranking)."""
        if engine_id not in self._blocks:
            entry = (self._rank(engine_id), engine_id)
            bisect.insort(self._ranked, entry)
            if bisect.bisect_left(self._ranked, entry) < PANEL_SIZE:
                self._columns = None  # it enters the panel
        self._blocks[engine_id] = block
        column = self._columns.get(engine_id) if self._columns is not None else None
        if column is not None:
            self._matrix[:, column] = _values(block)

    def pop(self, engine_id: str) -> None:
        """Forget engine_id's block (it left the pool); no-op when it has none."""
        if self._blocks.pop(engine_id, None) is None:
            return
        entry = (self._rank(engine_id), engine_id)
        index = bisect.bisect_left(self._ranked, entry)
        if index < len(self._ranked) and self._ranked[index] == entry:
            del self._ranked[index]
            if index < PANEL_SIZE:
                self._columns = None  # it leaves the panel

    def panel(self) -> list[str]:
        """The engine ids of the reference panel (at most PANEL_SIZE)."""
        return [engine_id for _, engine_id in self._ranked[:PANEL_SIZE]]

    def reference(self, *, excluding: str, since_s: float = -math.inf,
                  left_out: Collection[str] = ()) -> Reference | None:
        """The robust reference for judging `excluding`: the median of each of the panel's other engines' block
        means and spreads, less those in left_out (engines judged distinct), over their blocks that ended at or
        after since_s (the judged block's start: like is compared with like in time, so an engine that sees a
        pool-wide shift first is not judged against blocks of the old law only); None with fewer than
        MIN_POOL_ENGINES − 1 of them (a pool too small for a majority to speak)."""
        if self._columns is None:
            members = self.panel()
            self._columns = {engine_id: i for i, engine_id in enumerate(members)}
            self._matrix = np.array([_values(self._blocks[e]) for e in members]).T.reshape(5, len(members))
        keep = self._matrix[4] >= since_s
        for engine_id in (excluding, *left_out) if left_out else (excluding,):
            column = self._columns.get(engine_id)
            if column is not None:
                keep[column] = False
        count = int(np.count_nonzero(keep))
        if count < MIN_POOL_ENGINES - 1:
            return None
        output_mean, prompt_mean, output_std, prompt_std = np.median(self._matrix[:4, keep], axis=1).tolist()
        return Reference(output_mean_tokens=output_mean, prompt_mean_tokens=prompt_mean, num_engines=count,
                         output_std_tokens=output_std, prompt_std_tokens=prompt_std)

    def _rank(self, engine_id: str) -> bytes:
        return hashlib.blake2b(engine_id.encode(), key=self._key, digest_size=8).digest()


def _values(block: Block) -> tuple[float, float, float, float, float]:
    """A block's column of the panel's array: the four rows a reference is the median of, then its end time."""
    return (block.output_mean_tokens, block.prompt_mean_tokens, block.output_std_tokens, block.prompt_std_tokens,
            block.ended_at_s)
