"""Fixtures of the e2e suite: a tiny random-weight model on disk, and a runner for engine processes."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from testbench.tiny_model import write_tiny_model
from tests.e2e.engine_forkserver import ForkedProcess, start_script

ENGINE_SCRIPT = Path(__file__).with_name("engine_workload.py")
CLOSED_LOOP_SCRIPT = Path(__file__).with_name("chaos_workload.py")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny-qwen2"))


@dataclass
class EngineRun:
    """A running engine process; `ready` and `go` files synchronise it with the test."""

    process: ForkedProcess
    workdir: Path

    @property
    def result_path(self) -> Path:
        return self.workdir / "result.json"

    @property
    def report_path(self) -> Path:
        return self.workdir / "agent_report.json"

    async def wait_ready(self, timeout_s: float = 180) -> None:
        deadline = asyncio.get_running_loop().time() + timeout_s
        while not (self.workdir / "ready").exists():
            if self.process.returncode is not None:
                raise RuntimeError(f"engine exited early with {self.process.returncode}: {self.log_tail()}")
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError("engine did not start in time")
            await asyncio.sleep(0.2)

    def go(self) -> None:
        (self.workdir / "go").write_text("go")

    def stop(self) -> None:
        """A closed-loop engine (`start_closed_loop_engine`) submits no more requests and finishes those in flight."""
        (self.workdir / "stop").write_text("stop")

    async def finish(self, timeout_s: float = 300) -> dict:
        code = await asyncio.wait_for(self.process.wait(), timeout_s)
        assert code == 0, self.log_tail()
        return json.loads(self.result_path.read_text())

    def report(self) -> dict:
        return json.loads(self.report_path.read_text())

    def log_tail(self) -> str:
        log = self.workdir / "engine.log"
        return log.read_text()[-4000:] if log.exists() else ""


async def _spawn(script: Path, model_dir: Path, workdir: Path, *args: str,
                 env: dict[str, str] | None = None) -> EngineRun:
    """`script` (an engine workload) in a process of its own, forked from the engines' fork server
    (`engine_forkserver`), writing its result, report and log under workdir and signalling through its ready and
    go files."""
    workdir.mkdir(parents=True, exist_ok=True)
    process = start_script(
        script, ["--model-dir", str(model_dir), "--result", str(workdir / "result.json"), "--report",
                 str(workdir / "agent_report.json"), "--ready-file", str(workdir / "ready"), "--go-file",
                 str(workdir / "go"), *args],
        env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", **(env or {})},
        log_path=workdir / "engine.log")
    return EngineRun(process=process, workdir=workdir)


async def start_engine(model_dir: Path, workdir: Path, *args: str) -> EngineRun:
    return await _spawn(ENGINE_SCRIPT, model_dir, workdir, "--step-trace", "--single-process-executor", *args)


async def start_closed_loop_engine(model_dir: Path, workdir: Path, address: str, engine_id: str, *args: str,
                                   env: dict[str, str] | None = None) -> EngineRun:
    """An engine with the agent under a saturating closed-loop load (tests/e2e/chaos_workload.py) that runs from
    `go()` until `stop()`, so a test's workload lasts exactly as long as the test needs it."""
    return await _spawn(CLOSED_LOOP_SCRIPT, model_dir, workdir, "--stop-file", str(workdir / "stop"), "--address",
                        address, "--engine-id", engine_id, "--max-requests", "1000000", *args, env=env)


def once_per_run(tmp_path_factory: pytest.TempPathFactory, name: str, compute: Callable[[], dict]) -> dict:
    """compute()'s JSON-able result, computed once per test run however many xdist workers ask for it.

    A module-scoped fixture runs once per worker that runs any of the module's tests, and xdist's work stealing
    can spread a module over both workers: a fixture that starts engines for minutes would then run twice. Under
    xdist the first worker to ask computes it under a lock in the run's shared temporary directory; the others
    wait for the lock and read the result (or fail with the first one's error, instead of running it again)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # not distributed (xdist names its workers there)
        return compute()
    shared = tmp_path_factory.getbasetemp().parent  # this run's, shared by its workers
    result, error = shared / f"{name}.json", shared / f"{name}.error"
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if error.exists():
            pytest.fail(f"{name}: failed in another worker: {error.read_text()}")
        if not result.exists():
            try:
                value = compute()
            except BaseException as exc:
                error.write_text(f"{type(exc).__name__}: {exc}"[:4000])
                raise
            result.write_text(json.dumps(value))
        return json.loads(result.read_text())
