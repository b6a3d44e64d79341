# syntax=docker/dockerfile:1.7
# The controller image: `controlplane serve` as a non-root user, with cp-grpc-health for health checks. By
# default it serves on the container's loopback only (deploy/docker/controller.yaml); the Helm chart and the
# compose file pass their own flags.
# Build from the repository root:
#   docker build -f deploy/docker/controller.Dockerfile -t vllm-controlplane/controller:0.1.0 .
# Pin the base by digest in your registry mirror (python:3.11.13-slim-bookworm@sha256:…) for reproducible
# builds; the exact tag below is the default.
ARG PYTHON_IMAGE=python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY controlplane ./controlplane
COPY agents ./agents
# Every wheel the controller needs, built once; the runtime stage installs them offline.
RUN pip wheel --no-cache-dir --wheel-dir /wheels '.[controller]'

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 controlplane \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /var/lib/controlplane --shell /usr/sbin/nologin controlplane \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/controlplane
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels 'vllm-controlplane[controller]'
COPY --chmod=0755 deploy/docker/grpc_health_check.py /usr/local/bin/cp-grpc-health
# The default settings (CMD below): gRPC on loopback only; deploy/README.md says how to serve other hosts.
COPY --chmod=0644 deploy/docker/controller.yaml /etc/controlplane/controller.yaml
# CP_DATA_DIR: the embedded Redis' directory when no --redis-url / CP_REDIS_URL is given (single replica only).
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 CP_DATA_DIR=/var/lib/controlplane HOME=/var/lib/controlplane
USER 10001:10001
WORKDIR /var/lib/controlplane
EXPOSE 50151 9464
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
    CMD ["cp-grpc-health", "--address", "127.0.0.1:50151"]
ENTRYPOINT ["controlplane", "serve"]
# Environment variables (CP_HOST, CP_SERVER_TLS_CERT, CP_AGENT_TOKENS, …) win over the file; flags replace it.
CMD ["--config", "/etc/controlplane/controller.yaml"]
