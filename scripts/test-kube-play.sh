#!/usr/bin/env bash
# The Kubernetes manifests started as written (issue 49): the CPU overlay, rendered with kubectl, played
# by `podman kube play` on the image scripts/test-container.sh builds, on this machine, no registry.
#
#   scripts/test-kube-play.sh [--keep]
#
#  1. the image localhost/qwen3-tts-x:cpu-test (scripts/test-container.sh builds it; run that first),
#     tagged as the manifests name it (qwen3-tts-x:cpu: podman resolves that short name locally)
#  2. `kubectl kustomize deploy/kubernetes/overlays/cpu`; the kinds podman plays (Deployment,
#     PersistentVolumeClaim) go to `podman kube play` unchanged; the others are listed as not run
#  3. the pod starts: its init container must wait for the models (the volume is empty)
#  4. tiny random models converted into the models volume under the names QTTS_MODEL lists (what the
#     model-pull Job would write): the init container must end and the server start
#  5. the probes called as the kubelet would (HTTP on the pod's address and port: startup /health,
#     readiness /ready, liveness /health), podman's own health check, the pod spec as it ran (user,
#     capabilities, seccomp, no_new_privs, CPU and memory limits, environment from the downward API),
#     a request through it with the OpenAI SDK, a voice written to the voices volume
#  6. the stop as the kubelet makes it (the manifest's preStop command, run with `podman exec`: podman
#     runs no hooks; then SIGTERM with the rest of the grace period, `podman stop -t` of the server
#     container, and only then the pod and its network) with a player reading a stream at real time:
#     the drain, the stream whole, exit code 0
#
# Needs root (rootful podman, its bridge network). Not part of scripts/test.sh or CI (the image build
# is slow). Prints a summary; docs/deploy.md has the last one.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
KEEP=0
for arg in "$@"; do
  case "$arg" in
    --keep) KEEP=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

TEST_IMAGE="localhost/qwen3-tts-x:cpu-test"
IMAGE="localhost/qwen3-tts-x:cpu"
OVERLAY=deploy/kubernetes/overlays/cpu
WORK="$(mktemp -d /var/tmp/qtts-kube-play.XXXXXX)"
PY="$ROOT/.venv/bin/python"
START_ALL=$(date +%s)

. "$ROOT/scripts/lib/container-run.sh"  # step, info, die, container_runtime

cleanup() {
  local rc=$?
  [ -n "${WATCHDOG:-}" ] && kill "$WATCHDOG" 2>/dev/null && wait "$WATCHDOG" 2>/dev/null || true
  if [ "$KEEP" = 0 ] && [ -f "$WORK/kube.yaml" ]; then
    podman kube down "$WORK/kube.yaml" >/dev/null 2>&1 || true
    podman volume rm -f qwen3-tts-models qwen3-tts-voices >/dev/null 2>&1 || true
  fi
  [ "$KEEP" = 0 ] && rm -rf "$WORK"
  [ $rc -eq 0 ] || echo "test-kube-play: FAILED (exit $rc)" >&2
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# the whole run ends by itself (its output closed: an orphaned sleep must not hold a pipe open)
( trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM; sleep "${QTTS_TEST_KUBE_PLAY_MAX_S:-1200}" & sleeper=$!
  wait "$sleeper" && kill -TERM $$ ) >/dev/null 2>&1 &
WATCHDOG=$!

[ "$(id -u)" = 0 ] || die "run as root (rootful podman)"
command -v podman >/dev/null || die "no podman: scripts/test-container.sh installs it"
command -v kubectl >/dev/null || die "no kubectl (1.21 or newer renders the overlays)"

# ---------------------------------------------------------------------------------------------
step "1/6 the image"
podman image exists "$TEST_IMAGE" || die "no $TEST_IMAGE: run scripts/test-container.sh first"
podman tag "$TEST_IMAGE" "$IMAGE"
info "$IMAGE = $TEST_IMAGE ($(( $(podman image inspect "$IMAGE" --format '{{.Size}}') / 1000000 )) MB)"
# `kube play` takes no --ulimit: runc and its ulimits, where needed, through containers.conf
container_runtime "$IMAGE" --help
if [ ${#RT[@]} -gt 0 ]; then
  cat > "$WORK/containers.conf" <<'EOF'
[containers]
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
runtime = "runc"
EOF
  export CONTAINERS_CONF="$WORK/containers.conf"
fi
info "container runtime: $RUNTIME${CONTAINERS_CONF:+ (CONTAINERS_CONF)}"

# ---------------------------------------------------------------------------------------------
step "2/6 $OVERLAY rendered; what podman plays"
kubectl kustomize "$OVERLAY" > "$WORK/rendered.yaml"
"$PY" - "$WORK/rendered.yaml" "$WORK/kube.yaml" <<'PYEOF'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
played = [d for d in docs if d["kind"] in ("Deployment", "PersistentVolumeClaim")]
for d in docs:
    what = "played as written" if d in played else "not run (podman kube play has no such kind)"
    print(f"   {d['kind']}/{d['metadata']['name']}: {what}")
with open(sys.argv[2], "w") as f:
    yaml.safe_dump_all(played, f, sort_keys=False)
PYEOF

# ---------------------------------------------------------------------------------------------
step "3/6 podman kube play (the models volume is empty)"
podman kube down "$WORK/kube.yaml" >/dev/null 2>&1 || true
podman volume rm -f qwen3-tts-models qwen3-tts-voices >/dev/null 2>&1 || true
T_PLAY=$(date +%s.%N)
# podman runs init containers to completion inside `kube play`, which therefore returns only once the
# models are there: in the background, while this script fills the volume it made from the claim
timeout 600 podman kube play "$WORK/kube.yaml" > "$WORK/play.log" 2>&1 &
PLAY=$!
for _ in $(seq 600); do
  podman ps --format '{{.Names}}' | grep -q wait-for-models && break
  kill -0 "$PLAY" 2>/dev/null || { cat "$WORK/play.log"; die "podman kube play ended early"; }
  sleep 0.1
done
sleep 2
MODELS_DIR="$(podman volume inspect qwen3-tts-models --format '{{.Mountpoint}}')"
VOICES_DIR="$(podman volume inspect qwen3-tts-voices --format '{{.Mountpoint}}')"
info "volumes from the claims: qwen3-tts-models at $MODELS_DIR, qwen3-tts-voices at $VOICES_DIR (owner $(stat -c %u:%g "$VOICES_DIR"))"
podman ps -a --format '   {{.Names}}: {{.Status}}' | grep -v infra || true
INIT="$(podman ps -a --format '{{.Names}}' | grep wait-for-models | head -1)"
info "init container log: $(podman logs "$INIT" 2>&1 | tail -1 | cut -c1-200)"
podman logs "$INIT" 2>&1 | grep -q "waiting for the models" || die "the init container does not wait for the models"
SERVER="$(podman ps -a --format '{{.Names}}' | grep -- '-server$' | head -1)"
[ "$(podman inspect "$SERVER" --format '{{.State.Status}}')" != running ] || die "the server started without models"

# ---------------------------------------------------------------------------------------------
step "4/6 the models, as the model-pull Job would write them"
MODEL_LIST="$("$PY" -c "import sys, yaml
d = next(d for d in yaml.safe_load_all(open(sys.argv[1])) if d['kind'] == 'Deployment')
c = next(c for c in d['spec']['template']['spec']['containers'] if c['name'] == 'server')
print(next(e['value'] for e in c['env'] if e['name'] == 'QTTS_MODEL'))" "$WORK/kube.yaml")"
mkdir -p "$WORK/ckpt"
for folder in ${MODEL_LIST//,/ }; do
  name="$(basename "$folder")"
  case "$name" in *Base*) type=base ;; *) type=custom_voice ;; esac
  timeout 600 "$PY" -m qwen3_tts_gguf make-random "$WORK/ckpt/$type" --shape tiny --type "$type" >/dev/null 2>&1 \
    || die "make-random --type $type"
  timeout 600 "$PY" -m qwen3_tts_gguf convert "$WORK/ckpt/$type" -o "$WORK/$name" --quant q8_0 >/dev/null 2>&1 \
    || die "convert $type"
  cp -a "$WORK/$name" "$MODELS_DIR/$name.tmp" && mv "$MODELS_DIR/$name.tmp" "$MODELS_DIR/$name"
  info "$folder: a random tiny $type model, $(du -sh "$MODELS_DIR/$name" | cut -f1)"
done
chmod -R a+rX "$MODELS_DIR"
T_MODELS=$(date +%s.%N)
if ! wait "$PLAY"; then
  # podman 4.3.1 sometimes tries to remove the finished init container ("once") while its state still
  # says running, and gives up the pod start; the container has ended: start the pod again
  grep -q "failed to remove once init container" "$WORK/play.log" || { cat "$WORK/play.log"; die "podman kube play failed"; }
  init_id="$(grep -o 'failed to remove once init container [0-9a-f]*' "$WORK/play.log" | head -1 | awk '{print $NF}')"
  info "podman kube play: failed to remove the finished init container ${init_id:0:12}, its state still 'running' (podman 4.3.1): podman rm -f it, podman pod start"
  podman logs "$init_id" >/dev/null 2>&1 && info "init container state: $(podman inspect "$init_id" --format '{{.State.Status}}, exit code {{.State.ExitCode}}')"
  podman rm -f "$init_id" >/dev/null
  timeout 300 podman pod start "$(podman pod ps --format '{{.Name}}' | grep qwen3-tts | head -1)" >/dev/null
fi
info "podman kube play returned $(printf '%.1f' "$(echo "$(date +%s.%N) - $T_MODELS" | bc)") s after the models came: $(grep -v syslog "$WORK/play.log" | tr '\n' ' ' | cut -c1-160)"
info "init container: $(podman inspect "$INIT" --format '{{.State.Status}}, exit code {{.State.ExitCode}}' 2>&1)"

# ---------------------------------------------------------------------------------------------
step "5/6 the probes as the kubelet calls them, the pod as it runs, a request"
timeout 600 "$PY" - "$WORK" "$T_PLAY" "$T_MODELS" "$VOICES_DIR" <<'PYEOF'
import json, subprocess, sys, threading, time
import httpx, openai, yaml

work, t_play, t_models, voices_dir = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
kube = [d for d in yaml.safe_load_all(open(f"{work}/kube.yaml")) if d]
spec = next(d for d in kube if d["kind"] == "Deployment")["spec"]["template"]["spec"]
server = next(c for c in spec["containers"] if c["name"] == "server")
result = {}

def info(msg): print(f"   {msg}", flush=True)
def fail(msg):
    print(f"FAILED: {msg}", flush=True)
    sys.exit(1)
def sh(*args): return subprocess.run(args, capture_output=True, text=True)

names = sh("podman", "ps", "-a", "--format", "{{.Names}}").stdout.split()
srv = next((n for n in names if n.endswith("-server")), None)
init = next((n for n in names if "wait-for-models" in n), None)
if srv is None:
    fail(f"no server container among {names}")
pod = sh("podman", "inspect", srv, "--format", "{{.Pod}}").stdout.strip()
infra = sh("podman", "pod", "inspect", pod, "--format", "{{.InfraContainerID}}").stdout.strip()
ip = sh("podman", "inspect", infra, "--format", "{{.NetworkSettings.IPAddress}}").stdout.strip()
if not ip:
    nets = json.loads(sh("podman", "inspect", infra, "--format", "{{json .NetworkSettings.Networks}}").stdout or "{}")
    ip = next((n.get("IPAddress") for n in nets.values() if n.get("IPAddress")), "")
port = server["ports"][0]["containerPort"]
base = f"http://{ip}:{port}"
info(f"pod {pod[:12]}, server container {srv}, pod address {base} (the kubelet's probes go there)")

def probe(p):
    """One probe as the kubelet makes it: HTTP GET on the pod's address, its timeout; success is 200-399."""
    try:
        r = httpx.get(f"{base}{p['httpGet']['path']}", timeout=p.get("timeoutSeconds", 1))
        return 200 <= r.status_code < 400, r.status_code
    except httpx.HTTPError as e:
        return False, type(e).__name__

startup, readiness, liveness = server["startupProbe"], server["readinessProbe"], server["livenessProbe"]
# startup: every periodSeconds until it succeeds, at most failureThreshold failures
deadline = time.time() + startup["periodSeconds"] * startup["failureThreshold"]
tries = 0
while True:
    ok, said = probe(startup)
    tries += 1
    if ok:
        break
    if time.time() > deadline:
        fail(f"startupProbe failed {tries} times (last: {said})")
    time.sleep(1.0)  # the kubelet waits periodSeconds (5); polled faster here to time the start
result["startup_s"] = time.time() - t_models
started_at = sh("podman", "inspect", srv, "--format", "{{.State.StartedAt}}").stdout.strip()
info(f"server container started at {started_at} (the models came at "
     f"{time.strftime('%H:%M:%S', time.gmtime(t_models))} UTC)")
info(f"startupProbe GET {startup['httpGet']['path']}: {said} {result['startup_s']:.1f} s after the models came "
     f"({time.time() - t_play:.1f} s after kube play)")
if init:
    st = sh("podman", "inspect", init, "--format", "{{.State.Status}} exit {{.State.ExitCode}}").stdout.strip()
    info(f"init container {init}: {st}")
for name, p in (("readinessProbe", readiness), ("livenessProbe", liveness)):
    ok, said = probe(p)
    info(f"{name} GET {p['httpGet']['path']} (timeout {p.get('timeoutSeconds')} s): {said}")
    if not ok:
        fail(f"{name} fails")
hc = json.loads(sh("podman", "inspect", srv, "--format", "{{json .Config.Healthcheck}}").stdout or "null")
info(f"podman's health check of the server container (from the manifest's probes or the image): "
     f"{json.dumps(hc)[:200]}")
run = sh("podman", "healthcheck", "run", srv)
info(f"podman healthcheck run: {'healthy' if run.returncode == 0 else (run.stdout + run.stderr).strip()[:200]}")

# the pod as it runs
status = sh("podman", "exec", srv, "python", "-c",
            "import os; print(open('/proc/1/status').read()); print('ENV', dict(os.environ))").stdout
fields = {l.split(':')[0]: l.split(':', 1)[1].strip() for l in status.splitlines() if ':' in l and not l.startswith('ENV')}
env = eval(status.split("ENV ", 1)[1]) if "ENV " in status else {}
info(f"uid/gid {fields.get('Uid', '?').split()[0]}/{fields.get('Gid', '?').split()[0]} "
     f"(runAsUser {spec['securityContext']['runAsUser']}), CapEff {fields.get('CapEff')} (drop ALL), "
     f"NoNewPrivs {fields.get('NoNewPrivs')}, Seccomp {fields.get('Seccomp')} (2 = filter)")
cgroup = sh("podman", "exec", srv, "python", "-c", """
import os
def read(*paths):
    for p in paths:
        if os.path.exists(p):
            return open(p).read().strip()
    return '?'
print('cpu', read('/sys/fs/cgroup/cpu.max', '/sys/fs/cgroup/cpu/cpu.cfs_quota_us'),
      read('/sys/fs/cgroup/cpu/cpu.cfs_period_us') if not os.path.exists('/sys/fs/cgroup/cpu.max') else '',
      '| memory', read('/sys/fs/cgroup/memory.max', '/sys/fs/cgroup/memory/memory.limit_in_bytes'))
""")
info(f"cgroup limits seen inside: {cgroup.stdout.strip() or cgroup.stderr.strip()[-120:]} "
     f"(the manifest's limits {server['resources']['limits']})")
info("environment from the manifest: " + ", ".join(f"{k}={env.get(k)!r}" for k in (
    "QTTS_THREADS", "QTTS_REPLICA_ID", "QTTS_MAX_STREAMS", "QTTS_API_KEY", "QTTS_LOG_FORMAT")))

# a request through the pod's address
client = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0, timeout=120)
t0 = time.perf_counter()
first = None
audio = bytearray()
with client.audio.speech.with_streaming_response.create(model="tts-1", voice="alloy", input="Hello from the pod.",
                                                        response_format="pcm", extra_body={"max_frames": 25}) as r:
    for chunk in r.iter_bytes():
        first = first or time.perf_counter() - t0
        audio += chunk
info(f"OpenAI SDK through the pod: {len(audio)} bytes of pcm ({len(audio) / 48000:.2f} s), first audio after "
     f"{first * 1000:.0f} ms")
if not audio:
    fail("no audio")
# a voice written into the voices volume (fsGroup decides whether uid 10001 may write there)
import io, numpy as np, soundfile
t = np.arange(3 * 24000) / 24000
clip = io.BytesIO()
soundfile.write(clip, (0.2 * np.sin(2 * np.pi * 140 * t) * (1 + np.sin(2 * np.pi * 3 * t))).astype(np.float32),
                24000, format="WAV")
r = httpx.post(f"{base}/v1/audio/voices", timeout=120, data={"name": "pod-voice", "consent": "yes"},
               files={"audio_sample": ("clip.wav", clip.getvalue(), "audio/wav")})
info(f"POST /v1/audio/voices: {r.status_code} {'' if r.status_code == 200 else r.text[:200]}")
result["voice_status"] = r.status_code
result["metrics"] = "qtts_active_streams" in httpx.get(f"{base}/metrics", timeout=5).text
info(f"/metrics (the Prometheus annotations' port and path): {'served' if result['metrics'] else 'MISSING'}")

# the stop as the kubelet makes it: the preStop hook (podman runs none: run here with `podman exec`, the
# manifest's command), then SIGTERM with the rest of terminationGracePeriodSeconds (`podman pod stop -t`),
# while a stream is in flight
stream = {"bytes": 0, "error": None}
started = threading.Event()
def long_stream():
    try:
        with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=120, json={
                "model": "tts-1", "voice": "alloy", "response_format": "pcm", "max_frames": 400, "seed": 5,
                "input": "A long passage read slowly while the pod stops. " * 4}) as resp:
            for chunk in resp.iter_bytes():
                stream["bytes"] += len(chunk)
                started.set()
                time.sleep(len(chunk) / 48000)  # real time, as a player: still in flight after the preStop pause
    except Exception as e:
        stream["error"] = f"{type(e).__name__}: {e}"
    finally:
        started.set()
reader = threading.Thread(target=long_stream, daemon=True)
reader.start()
started.wait(60)
grace = spec["terminationGracePeriodSeconds"]
t0 = time.perf_counter()
pre = sh("podman", "exec", srv, *server["lifecycle"]["preStop"]["exec"]["command"])
pre_s = time.perf_counter() - t0
ready_after_prestop = probe(readiness)[1]
at_sigterm = stream["bytes"]
# the kubelet stops the app containers and only then the pod's sandbox (its network); `podman pod stop`
# stops the infra container alongside and takes the network away from a server still draining
stop = sh("podman", "stop", "-t", str(max(1, int(grace - pre_s))), srv)
sh("podman", "pod", "stop", "-t", "5", pod)
result["stop_s"] = time.perf_counter() - t0
reader.join(60)
if reader.is_alive():  # neither the rest of the stream nor the end of the connection came
    stream["error"] = "still waiting 60 s after the stop: the rest of the stream and its end never came"
code = sh("podman", "inspect", srv, "--format", "{{.State.ExitCode}}").stdout.strip()
result["exit_code"] = code
info(f"preStop ({' '.join(server['lifecycle']['preStop']['exec']['command'])}) by podman exec: {pre_s:.1f} s, "
     f"rc {pre.returncode}; /ready after it: {ready_after_prestop}; podman stop -t {int(grace - pre_s)} (server): "
     f"{result['stop_s'] - pre_s:.1f} s more, server exit code {code}")
info(f"the stream in flight: {at_sigterm / 48000:.2f} s of audio read at SIGTERM, {stream['bytes']} bytes "
     f"({stream['bytes'] / 48000:.2f} s) in all, "
     f"{'ended cleanly' if stream['error'] is None else 'CUT: ' + stream['error'][:120]}")
logs = sh("podman", "logs", srv)
for line in (logs.stdout + logs.stderr).strip().splitlines():
    if any(word in line for word in ("drain", "bytes not yet", "Finished server")):
        info(f"  | {line[:160]}")
result["stream_complete"] = stream["error"] is None and stream["bytes"] > at_sigterm > 0 and \
    stream["bytes"] % 3840 == 0
if code != "0" or not result["stream_complete"]:
    json.dump(result, open(f"{work}/result.json", "w"))
    fail("the stop did not drain: the stream in flight was cut or the exit code is not 0")
json.dump(result, open(f"{work}/result.json", "w"))
PYEOF

# `podman kube down` (what the script cleans up with) on a second run of the pod, with a stream in flight:
# podman removes the pod with its own stop timeout, not the manifest's grace period and preStop
step "6/6 summary"
RESULT="$(cat "$WORK/result.json")"
echo "commit:             $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- deploy scripts api qwen3_tts_gguf 2>/dev/null || echo '+local changes')"
echo "played:             $OVERLAY (Deployment and PersistentVolumeClaims, unchanged) on $IMAGE"
echo "result:             $RESULT"
echo "total:              $(( $(date +%s) - START_ALL )) s"
echo "test-kube-play: PASSED"
