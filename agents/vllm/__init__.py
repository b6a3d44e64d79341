"""The vLLM adapter: scheduler classes that carry the agent (import path for `--scheduler-cls`)."""

from agents.vllm.scheduler import ControlledAsyncScheduler, ControlledScheduler, ControlledSyncScheduler, with_agent

__all__ = ["ControlledAsyncScheduler", "ControlledScheduler", "ControlledSyncScheduler", "with_agent"]
