"""The CUSUM recursion reference: moved to `testbench.cusum_reference`, which tests/ and benchmarks/ share;
its names are re-exported here so the tests' imports stay as they were."""

from testbench.cusum_reference import (  # noqa: F401
    RecursionDetector,
)
