"""Cold windows for the survival tests: moved to `testbench.cohorts`, which tests/ and benchmarks/ share;
its names are re-exported here so the tests' imports stay as they were."""

from testbench.cohorts import (  # noqa: F401
    Draw,
    cohort,
    geometric,
    hist,
    increasing_hazard,
    lognormal,
    mixture,
    uniform,
)
