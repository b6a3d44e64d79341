"""A tiny random-weight Qwen2 model: moved to `testbench.tiny_model`, which tests/ and benchmarks/ share;
its names are re-exported here so the tests' imports stay as they were."""

from testbench.tiny_model import (  # noqa: F401
    write_tiny_model,
    write_tiny_tokenizer,
)
