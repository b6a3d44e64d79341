# syntax=docker/dockerfile:1.7
# A vLLM engine with the control plane's agent: the official vLLM image plus the agent package, started
# with --scheduler-cls agents.vllm.ControlledScheduler. Build from the repository root:
#   docker build -f deploy/docker/agent.Dockerfile -t vllm-controlplane/vllm-openai:v0.32.0 .
# Run like the base image, model first:
#   docker run --gpus all -e CP_CONTROLLER_ADDRESS=controller:50151 -e CP_AGENT_TOKEN=... IMAGE Qwen/Qwen3-8B ...
# Pin the base by digest in your registry mirror (vllm/vllm-openai:v0.32.0@sha256:…); the agent targets
# vLLM 0.32 exactly.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}

# The agent needs only grpcio and protobuf at run time: the package goes in without its controller
# dependencies (numpy, scipy, redis, OpenTelemetry …), then the two it does need.
RUN --mount=type=bind,source=.,target=/src,rw \
    if command -v uv >/dev/null 2>&1; then \
      uv pip install --system --no-cache --no-deps /src && uv pip install --system --no-cache "grpcio>=1.85.1" "protobuf>=7.35.1"; \
    else \
      python3 -m pip install --no-cache-dir --no-deps /src && python3 -m pip install --no-cache-dir "grpcio>=1.85.1" "protobuf>=7.35.1"; \
    fi \
 && python3 -c "import agents.vllm, grpc, google.protobuf"
COPY --chmod=0755 deploy/docker/vllm-serve-with-agent.sh /usr/local/bin/vllm-serve-with-agent

# The base image runs as root; run as an unprivileged user with its own Hugging Face cache.
RUN useradd --uid 2000 --create-home --home-dir /home/vllm --shell /usr/sbin/nologin vllm
ENV HOME=/home/vllm HF_HOME=/home/vllm/.cache/huggingface
USER 2000
WORKDIR /home/vllm
ENTRYPOINT ["vllm-serve-with-agent"]
