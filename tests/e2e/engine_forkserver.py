"""Engine workloads started from a fork server that has imported torch and vLLM once, instead of a fresh Python
process each (the import is 10–17 s of every engine's start here).

`start_script` runs an e2e workload script (`engine_workload.py`, `chaos_workload.py`) as `__main__` in a process
forked from a server process of Python's multiprocessing (`forkserver` context, one per test process) whose
preload is `tests.e2e.engine_preload`. The script sees the arguments, environment and working directory it would
have had as `python script args…`, its output goes to a log file, and the interpreter's exit handlers run when it
ends. `ForkedProcess` gives the test the parts of `asyncio.subprocess.Process` the e2e tests use (`returncode`,
`wait()`, `kill()`).

What differs from a fresh interpreter: the modules the preload imported are already imported (so import-time
settings must be the same for every workload: the preload sets OMP_NUM_THREADS as `cpu_platform` does for the
single-process executor, the only setting the e2e engines use), and the script's directory is put first on
sys.path by hand. vLLM's EngineCore is then forked from the workload (`cpu_platform`), as vLLM does by default.
"""

from __future__ import annotations

import asyncio
import atexit
import multiprocessing
import os
import runpy
import sys
import traceback
from pathlib import Path

PRELOAD = "tests.e2e.engine_preload"
_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload([PRELOAD])


def _run_script(script: str, args: list[str], env: dict[str, str], log_path: str, cwd: str) -> None:
    """The forked child: `python script args…` with env, cwd and its output in log_path; never returns."""
    code = 1
    try:
        log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.environ.clear()
        os.environ.update(env)
        os.chdir(cwd)
        sys.argv = [script, *args]
        sys.path.insert(0, str(Path(script).parent))
        try:
            runpy.run_path(script, run_name="__main__")
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
        atexit._run_exitfuncs()  # what the interpreter runs at exit; multiprocessing's children skip it
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


class ForkedProcess:
    """A workload process started by `start_script`, seen as the e2e tests see an asyncio subprocess."""

    def __init__(self, process: multiprocessing.process.BaseProcess) -> None:
        self._process = process

    @property
    def returncode(self) -> int | None:
        """None while it runs; its exit status, or −signal when a signal ended it."""
        return self._process.exitcode

    async def wait(self) -> int:
        if self._process.exitcode is None:
            loop = asyncio.get_running_loop()
            ended = loop.create_future()
            sentinel = self._process.sentinel
            loop.add_reader(sentinel, lambda: ended.done() or ended.set_result(None))
            try:
                await ended
            finally:
                loop.remove_reader(sentinel)
        self._process.join()
        return self._process.exitcode

    def kill(self) -> None:
        self._process.kill()


def start_script(script: Path, args: list[str], *, env: dict[str, str], log_path: Path,
                 cwd: Path | None = None) -> ForkedProcess:
    """Start `script` with args (see the module docstring); the fork server starts with the first call."""
    process = _CONTEXT.Process(target=_run_script, args=(str(script), list(args), dict(env), str(log_path),
                                                         str(cwd or Path.cwd())), name=script.stem)
    process.start()
    return ForkedProcess(process)
