"""`controlplane serve` as a real subprocess: moved to `testbench.serve_process`, which tests/ and benchmarks/ share;
its names are re-exported here so the tests' imports stay as they were."""

from testbench.serve_process import (  # noqa: F401
    CONTROLPLANE,
    ServeProcess,
    child_pids,
    pid_running,
)
