"""What the e2e engines' fork server (`engine_forkserver`) imports before it forks any workload: torch, vLLM's
offline entry point and the engine core, with OpenMP at the single-process executor's thread count
(`cpu_platform`), which OpenMP reads once, at torch's import. Nothing here starts a thread."""

from __future__ import annotations

import importlib
import os

os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 2) - 1))
for _module in ("torch", "vllm", "vllm.entrypoints.llm", "vllm.v1.engine.core"):
    importlib.import_module(_module)
