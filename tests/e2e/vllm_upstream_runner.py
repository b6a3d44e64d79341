"""Runs vLLM's scheduler tests once per configuration, each run in a process forked from this one after vLLM is
imported, so that torch and vLLM are imported once for all runs rather than once per run (10–17 s each here).

Started by `tests.e2e.vllm_upstream.run_upstream` as `python vllm_upstream_runner.py SPEC`, in the directory the
tests were extracted to, with the environment every run shares (PYTHONPATH, the offline Hugging Face cache).
SPEC is a JSON file: {"runs": [{"label", "env", "args", "log", "timeout_s"}], "result": path}. Each run's child
drops the CP_* variables it inherited, sets the run's `env`, sends its output to `log` and calls pytest with
`args`; the runs go one after another. The result file gets {label: {"exit": code, "timed_out": bool}}: a child
still running after its `timeout_s` is killed (its log's last lines name the test it was in).
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys
import time
from pathlib import Path

_POLL_S = 0.2


def _child(run: dict) -> None:
    """In the forked child: the run's environment and output, then pytest; never returns."""
    code = 1
    try:
        for name in [name for name in os.environ if name.startswith("CP_")]:
            del os.environ[name]
        os.environ.update(run["env"])
        log = os.open(run["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        import pytest

        code = int(pytest.main(run["args"]))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # not the parent's atexit handlers, nor its buffered output


def _wait(pid: int, timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return {"exit": os.waitstatus_to_exitcode(status), "timed_out": False}
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return {"exit": -signal.SIGKILL, "timed_out": True}
        time.sleep(_POLL_S)


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text())
    # What every run imports first and takes longest; pytest's own modules come with the child's pytest.main.
    for module in ("vllm.v1.core.sched.scheduler", "vllm.v1.core.sched.async_scheduler"):
        importlib.import_module(module)

    results = {}
    for run in spec["runs"]:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(run)
        results[run["label"]] = _wait(pid, run["timeout_s"])
    Path(spec["result"]).write_text(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
