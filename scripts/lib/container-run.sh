# Sourced by the container scripts (test-container.sh, test-kube-play.sh, test-container-replicas.sh):
# their progress lines and the container runtime this machine can run.

step() { echo; echo "== [$(date -u +%H:%M:%S)] $*"; }
info() { echo "   $*"; }
die() { echo "FAILED: $*" >&2; exit 1; }

# container_runtime IMAGE [ARGS...]: runs IMAGE once (ARGS: its command) under podman's default runtime; where
# that fails (here: crun under this sandbox's limits, docs/deploy.md "Container runtime"), under runc with
# explicit ulimits. Sets RT (podman's global arguments), ULIMITS (`podman run`'s) and RUNTIME (a line saying
# which); dies when neither runs.
container_runtime() {
  local image=$1 err
  shift
  RT=() ULIMITS=()
  if err="$(timeout 120 podman run --rm --network none "$image" "$@" 2>&1)"; then
    RUNTIME="podman's default ($(podman info --format '{{.Host.OCIRuntime.Name}}'))"
    return 0
  fi
  RT=(--runtime runc)
  ULIMITS=(--ulimit nofile=1024:1024 --ulimit nproc=1024:1024)
  timeout 120 podman "${RT[@]}" run --rm --network none "${ULIMITS[@]}" "$image" "$@" >/dev/null 2>&1 \
    || die "podman's default runtime fails ($(echo "$err" | tr '\n' ' ' | cut -c1-300)), runc with explicit ulimits too"
  RUNTIME="runc, ulimits nofile and nproc 1024 (podman's default fails here: $(echo "$err" | tr '\n' ' ' | cut -c1-200))"
}
