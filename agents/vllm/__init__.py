"""The vLLM adapter: scheduler classes that carry the agent (import path for `--scheduler-cls`)."""

from agents.vllm.scheduler import ControlledAsyncScheduler, ControlledScheduler, ControlledSyncScheduler

__all__ = ["ControlledAsyncScheduler", "ControlledScheduler", "ControlledSyncScheduler"]
