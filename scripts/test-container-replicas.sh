#!/usr/bin/env bash
# The replicated topology of tests/test_replicas.py with containers (issue 49): three containers of the
# image scripts/test-container.sh builds, behind Debian's HAProxy, one shared voices folder, the same
# load and faults (a replica added under load, a steady load accounted once, the client address
# forwarded, a voice across replicas, resume routed by replica id, SIGKILL mid-stream, a rolling restart
# with `podman kill -s TERM` / `podman start`).
#
#   scripts/test-container-replicas.sh [pytest arguments]
#
# Needs root (rootful podman: published ports, its bridge network) and the image (run
# scripts/test-container.sh first). Not part of scripts/test.sh or CI. The replicas' settings are the
# test's, given as environment variables (QTTS_*), as the Kubernetes manifests give them.
set -euo pipefail
cd "$(dirname "$0")/.."
IMAGE="${QTTS_REPLICA_IMAGE:-localhost/qwen3-tts-x:cpu-test}"
[ "$(id -u)" = 0 ] || { echo "run as root (rootful podman)" >&2; exit 1; }
command -v haproxy >/dev/null || { echo "apt-get install haproxy" >&2; exit 1; }
podman image exists "$IMAGE" || { echo "no $IMAGE: run scripts/test-container.sh first" >&2; exit 1; }

. scripts/lib/container-run.sh  # container_runtime
container_runtime "$IMAGE" --help
GLOBAL="${RT[*]}" RUN="${ULIMITS[*]}"
echo "container runtime: $RUNTIME"
echo "image $IMAGE; podman $GLOBAL; run $RUN; haproxy $(haproxy -v | head -1 | awk '{print $3}')"
t0=$(date +%s)
QTTS_REPLICA_IMAGE="$IMAGE" QTTS_REPLICA_PODMAN_ARGS="$GLOBAL" QTTS_REPLICA_RUN_ARGS="$RUN" \
  timeout 1200 .venv/bin/python -m pytest -q -s -p no:cacheprovider tests/test_replicas.py "$@"
rc=$?
echo "test-container-replicas: $([ $rc = 0 ] && echo PASSED || echo FAILED) in $(( $(date +%s) - t0 )) s"
exit $rc
