#!/bin/sh
# `vllm serve` with the control plane's scheduler class. Arguments pass through (the model first); the
# scheduler flag comes last so that it wins over one given by mistake.
# Without CP_CONTROLLER_ADDRESS the engine runs stock vLLM scheduling (the agent stays idle).
set -eu
exec vllm serve "$@" --scheduler-cls agents.vllm.ControlledScheduler
