#!/usr/bin/env bash
# Run the test suite: the real tritonserver + vLLM + SmolLM2 are started once per session.
# Tools some tests need from Debian (a Compose implementation to validate compose.yaml, a
# real Prometheus to answer the dashboard's queries) are installed first when missing.
set -uo pipefail
cd "$(dirname "$0")/.."

need=()
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "==> apt-get install ${need[*]}"
    apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "note: install ${need[*]} (Debian packages) for the compose/dashboard tests" >&2
  fi
fi

echo "==> model_repository/ is what deployments/default.yaml renders"
.venv/bin/tritonforge generate deployments/default.yaml --output model_repository --check || exit 1

.venv/bin/python -m pytest "$@"
rc=$?
if [ $rc -eq 5 ]; then
  echo "pytest collected no tests: failing on purpose" >&2
  exit 1
fi
exit $rc
