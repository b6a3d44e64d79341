"""Published cost profiles and engine shapes the fake engines default to.

The constants live in `controlplane.sim.profiles` (shared with the twin); re-exported here so existing
imports keep working. Constants only; nothing here is mutable.
"""

from __future__ import annotations

from controlplane.sim.profiles import (
    H200_QWEN3_8B,
    H200_QWEN3_8B_SHAPE,
    RTX_PRO_6000_QWEN3_8B,
    EngineShape,
)

RTX_PRO_6000_QWEN3_8B_SHAPE = EngineShape(kv_capacity_tokens=450_000)

__all__ = ["H200_QWEN3_8B", "H200_QWEN3_8B_SHAPE", "RTX_PRO_6000_QWEN3_8B", "RTX_PRO_6000_QWEN3_8B_SHAPE",
           "EngineShape"]
