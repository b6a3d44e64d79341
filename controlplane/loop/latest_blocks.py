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

Pure: no I/O; the key is the caller's (the controller draws one per process, the twin fixes one).
"""

from __future__ import annotations

import bisect
import hashlib
import math
from collections.abc import Container

from controlplane.loop.judging import Block, Reference, reference_of

PANEL_SIZE = 255


class LatestBlocks:
    """Latest blocks by engine id and the reference panel (see the module docstring)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self._blocks: dict[str, Block] = {}
        self._ranked: list[tuple[bytes, str]] = []  # (keyed hash, engine id) of every engine with a block, sorted

    def __len__(self) -> int:
        return len(self._blocks)

    def get(self, engine_id: str) -> Block | None:
        return self._blocks.get(engine_id)

    def put(self, engine_id: str, block: Block) -> None:
        """Record engine_id's latest block (an engine's first block enters it in the ranking)."""
        if engine_id not in self._blocks:
            bisect.insort(self._ranked, (self._rank(engine_id), engine_id))
        self._blocks[engine_id] = block

    def pop(self, engine_id: str) -> None:
        """Forget engine_id's block (it left the pool); no-op when it has none."""
        if self._blocks.pop(engine_id, None) is None:
            return
        entry = (self._rank(engine_id), engine_id)
        index = bisect.bisect_left(self._ranked, entry)
        if index < len(self._ranked) and self._ranked[index] == entry:
            del self._ranked[index]

    def panel(self) -> list[str]:
        """The engine ids of the reference panel (at most PANEL_SIZE)."""
        return [engine_id for _, engine_id in self._ranked[:PANEL_SIZE]]

    def reference(self, *, excluding: str, since_s: float = -math.inf,
                  left_out: Container[str] = ()) -> Reference | None:
        """The robust reference for judging `excluding`: the panel's other engines, less those in left_out
        (engines judged distinct), over their blocks that ended at or after since_s (`judging.reference_of`)."""
        members = {engine_id: self._blocks[engine_id] for _, engine_id in self._ranked[:PANEL_SIZE]
                   if engine_id not in left_out}
        return reference_of(members, excluding=excluding, since_s=since_s)

    def _rank(self, engine_id: str) -> bytes:
        return hashlib.blake2b(engine_id.encode(), key=self._key, digest_size=8).digest()
