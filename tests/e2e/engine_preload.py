"""What the e2e engines' fork server (`engine_forkserver`) imports before it forks any workload: torch, vLLM's
offline entry point and the engine core, with OpenMP at the single-process executor's thread count
(`cpu_platform`), which OpenMP reads once, at torch's import. Nothing here starts a thread."""

from __future__ import annotations

import importlib
import os

from tests.e2e.cpu_platform import single_process_threads

os.environ["OMP_NUM_THREADS"] = str(single_process_threads())
for _module in ("torch", "vllm", "vllm.entrypoints.llm", "vllm.v1.engine.core"):
    importlib.import_module(_module)
