#!/usr/bin/env bash
# End-to-end test of the CPU container image, built and run on this machine with no container registry.
#
#   scripts/test-container.sh [--rebuild-base] [--rebuild-wheel] [--remove-images]
#
#  1. tools: podman, buildah, mmdebstrap, runc, uidmap, slirp4netns, passt, fuse-overlayfs (apt, when missing)
#  2. the wheelhouse (scripts/build-wheelhouse.sh: the portable llama-cpp-python wheel is built once, cached)
#  3. a base image from Debian's packages: mmdebstrap with this machine's own apt sources as its mirror
#     argument (read now from /etc/apt), then `podman import` (kept for the next run; --rebuild-base)
#  4. the image: `podman build --format docker` (OCI drops HEALTHCHECK) with that base as BASE_IMAGE,
#     no network during the build (everything comes from the wheelhouse)
#  5. a random tiny Base model and a random tiny CustomVoice model, converted, mounted read-only; an
#     empty voices folder mounted read-write
#  6. the container, port published on 127.0.0.1 (host networking if that fails here: the error is
#     printed): /ready, the health check, an OpenAI SDK request in two formats, a voice cloned over the
#     API landing in the mounted folder and speaking, then `podman stop` with a stream in flight
#
# Prints the image size, the start-up time to /ready and the first request's time to first audio.
# Stops by itself (every step has a time limit), removes its containers and temporary files; keeps the
# images for the next run unless --remove-images. Needs root (apt, mmdebstrap, rootful podman).
# Slow (the first run compiles llama-cpp-python, ~10 min on 2 cores): never part of scripts/test.sh or CI.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"

REBUILD_BASE=0 REBUILD_WHEEL=0 REMOVE_IMAGES=0
for arg in "$@"; do
  case "$arg" in
    --rebuild-base) REBUILD_BASE=1 ;;
    --rebuild-wheel) REBUILD_WHEEL=1 ;;
    --remove-images) REMOVE_IMAGES=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "unknown argument: $arg" >&2; exit 2 ;;
  esac
done

SUITE="${QTTS_BASE_SUITE:-bookworm}"   # Debian 12: Python 3.11, the wheelhouse's Python
BASE_IMAGE="localhost/qtts-base:$SUITE"
IMAGE="localhost/qwen3-tts-x:cpu-test"
NAME="qtts-test-$$"
WORK="$(mktemp -d /var/tmp/qtts-container-test.XXXXXX)"
PY="$ROOT/.venv/bin/python"
UID_IN_IMAGE=10001
START_ALL=$(date +%s)

. "$ROOT/scripts/lib/container-run.sh"  # step, info, die, container_runtime

cleanup() {
  local rc=$?
  [ -n "${WATCHDOG:-}" ] && kill "$WATCHDOG" 2>/dev/null || true
  if podman container exists "$NAME" 2>/dev/null; then
    echo "cleanup: removing container $NAME"
    podman rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
  if [ "$REMOVE_IMAGES" = 1 ]; then
    podman rmi -f "$IMAGE" "$BASE_IMAGE" >/dev/null 2>&1 || true
  fi
  [ $rc -eq 0 ] || echo "test-container: FAILED (exit $rc)" >&2
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# the whole run ends by itself after an hour, whatever hangs
( sleep "${QTTS_TEST_CONTAINER_MAX_S:-3600}"; echo "test-container: time limit reached" >&2; kill -TERM $$ ) 2>/dev/null &
WATCHDOG=$!

[ "$(id -u)" = 0 ] || die "run as root (apt-get, mmdebstrap and rootful podman)"

# ---------------------------------------------------------------------------------------------
step "1/7 tools from Debian's packages"
need=()
for pkg in podman buildah mmdebstrap runc uidmap slirp4netns passt fuse-overlayfs; do
  dpkg -s "$pkg" >/dev/null 2>&1 || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
  info "apt-get install ${need[*]}"
  timeout 600 apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q "${need[@]}" >/dev/null
fi
info "$(podman --version); $(buildah --version | cut -d' ' -f1-3); mmdebstrap $(mmdebstrap --version | awk '{print $2}'); runc $(runc --version | head -1 | awk '{print $3}')"
if [ ! -x "$PY" ]; then
  info "no .venv yet: scripts/setup_env.sh runtime (builds llama-cpp-python for this machine, ~7 min)"
  timeout 1800 scripts/setup_env.sh runtime
fi
"$PY" -c "import openai, soundfile, httpx" 2>/dev/null || timeout 600 "$PY" -m pip install -q openai soundfile httpx

# ---------------------------------------------------------------------------------------------
step "2/7 wheelhouse (portable llama-cpp-python, built once into .cache/llama-portable/)"
t0=$(date +%s)
wheel_args=(); [ "$REBUILD_WHEEL" = 1 ] && wheel_args=(--rebuild)
PYTHON="$PY" timeout 2400 scripts/build-wheelhouse.sh "${wheel_args[@]}"
WHEELHOUSE_S=$(( $(date +%s) - t0 ))

# ---------------------------------------------------------------------------------------------
step "3/7 base image $BASE_IMAGE from Debian's packages"
BASE_S=0
if [ "$REBUILD_BASE" = 1 ] || ! podman image exists "$BASE_IMAGE"; then
  # the mirror argument: this machine's own Debian sources, as they are now (never a fixed host)
  sources=()
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
    [ -s "$f" ] || continue
    grep -qE '^[[:space:]]*(deb[[:space:]]|URIs:)' "$f" || continue       # no active entry
    grep -qiE 'debian' "$f" || continue                                   # Debian's archive only
    sources+=("$f")
  done
  [ ${#sources[@]} -gt 0 ] || die "no Debian apt sources under /etc/apt to use as the mirror"
  info "mirror argument: ${sources[*]}"
  t0=$(date +%s)
  timeout 900 mmdebstrap --variant=minbase --include=ca-certificates,python3,python3-venv,libgomp1 \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "$SUITE" "$WORK/base.tar" "${sources[@]}" 2>&1 | tail -3 | sed 's/^/   mmdebstrap: /'
  [ -s "$WORK/base.tar" ] || die "mmdebstrap made no tarball"
  info "tarball $(du -h "$WORK/base.tar" | cut -f1)"
  podman rmi -f "$BASE_IMAGE" >/dev/null 2>&1 || true
  timeout 600 podman import --change 'CMD ["/bin/bash"]' "$WORK/base.tar" "$BASE_IMAGE" >/dev/null
  rm -f "$WORK/base.tar"
  BASE_S=$(( $(date +%s) - t0 ))
  info "imported in ${BASE_S} s"
else
  info "reusing $BASE_IMAGE (--rebuild-base to make it again)"
fi

container_runtime "$BASE_IMAGE" true
info "container runtime: $RUNTIME"

# ---------------------------------------------------------------------------------------------
step "4/7 image $IMAGE (podman build --format docker --target cpu, no network)"
t0=$(date +%s)
timeout 1800 podman "${RT[@]}" build "${ULIMITS[@]}" --format docker --network none --pull=never \
  --build-arg BASE_IMAGE="$BASE_IMAGE" --target cpu -f deploy/Dockerfile -t "$IMAGE" . 2>&1 \
  | grep -E '^\[|STEP|COMMIT|installing|Successfully|rror' | sed 's/^/   build: /' | cut -c1-200
podman image exists "$IMAGE" || die "the build made no image"
BUILD_S=$(( $(date +%s) - t0 ))
IMAGE_BYTES="$(podman image inspect "$IMAGE" --format '{{.Size}}')"
IMAGE_MB=$(( IMAGE_BYTES / 1000000 ))
BASE_MB=$(( $(podman image inspect "$BASE_IMAGE" --format '{{.Size}}') / 1000000 ))
info "built in ${BUILD_S} s; image ${IMAGE_MB} MB (base ${BASE_MB} MB)"
hc="$(podman image inspect "$IMAGE" --format '{{json .Config.Healthcheck}}')"
info "HEALTHCHECK kept: $hc" | cut -c1-200
[ "$hc" != null ] && [ -n "$hc" ] || die "the image has no HEALTHCHECK"
info "user $(podman image inspect "$IMAGE" --format '{{.Config.User}}'), volumes $(podman image inspect "$IMAGE" --format '{{json .Config.Volumes}}')"
info "llama.cpp in the image: $(timeout 120 podman "${RT[@]}" run --rm --network none "${ULIMITS[@]}" --entrypoint python "$IMAGE" \
  -c 'import llama_cpp; print(llama_cpp.llama_print_system_info().decode().strip())' 2>&1 | tail -1 | cut -c1-220)"

# ---------------------------------------------------------------------------------------------
step "5/7 random tiny models (Base and CustomVoice) and an empty voices folder"
mkdir -p "$WORK/model-base" "$WORK/voices" "$WORK/ckpt"
for type in base custom_voice; do
  err="$(timeout 600 "$PY" -m qwen3_tts_gguf make-random "$WORK/ckpt/$type" --shape tiny --type "$type" 2>&1)" \
    || die "make-random --type $type: $(echo "$err" | tail -1)"
  err="$(timeout 600 "$PY" -m qwen3_tts_gguf convert "$WORK/ckpt/$type" -o "$WORK/model-base/tiny-$type" \
    --quant f32 2>&1)" || die "convert of make-random --type $type: $(echo "$err" | tail -1)"
  info "model-base/tiny-$type: $(du -sh "$WORK/model-base/tiny-$type" | cut -f1)"
done
chmod -R a+rX "$WORK"
chown "$UID_IN_IMAGE:$UID_IN_IMAGE" "$WORK/voices"   # the server (uid 10001) writes profiles there

# ---------------------------------------------------------------------------------------------
step "6/7 container $NAME"
PORT="$("$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
MOUNTS=(-v "$WORK/model-base:/data/model-base:ro" -v "$WORK/voices:/data/voices")
NETWORK="published 127.0.0.1:$PORT -> 8100"
T_START=$(date +%s.%N)
if ! run_err="$(timeout 120 podman "${RT[@]}" run -d --name "$NAME" "${ULIMITS[@]}" "${MOUNTS[@]}" \
      -p "127.0.0.1:$PORT:8100" "$IMAGE" 2>&1)"; then
  info "publishing a port fails here: $(echo "$run_err" | tr '\n' ' ' | cut -c1-300)"
  podman rm -f -t 0 "$NAME" >/dev/null 2>&1 || true
  NETWORK="host networking, 127.0.0.1:$PORT"
  T_START=$(date +%s.%N)
  timeout 120 podman "${RT[@]}" run -d --name "$NAME" "${ULIMITS[@]}" "${MOUNTS[@]}" --network host \
    -e QTTS_PORT="$PORT" "$IMAGE" serve --host 127.0.0.1 --port "$PORT" >/dev/null
fi
info "network: $NETWORK"
said="$(echo "${run_err:-}" | grep -vE '^[0-9a-f]{64}$' || true)"
[ -z "$said" ] || info "podman run said: $(echo "$said" | tr '\n' ' ' | cut -c1-300)"

cat > "$WORK/check.py" <<'PYEOF'
"""The checks against the running container (host side: the OpenAI SDK, httpx, soundfile, av)."""
import io, json, os, shutil, subprocess, sys, threading, time
import av, httpx, numpy as np, openai, soundfile

base, t_start, name, voices = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4]
podman = sys.argv[5:]
result = {}

def info(msg): print(f"   {msg}", flush=True)

def fail(msg):
    print(f"FAILED: {msg}", flush=True)
    subprocess.run(["podman", "logs", "--tail", "30", name])
    sys.exit(1)

# /ready: start-up time from `podman run`
deadline = time.time() + 180
while True:
    try:
        r = httpx.get(f"{base}/ready", timeout=2)
        if r.status_code == 200:
            break
    except httpx.HTTPError:
        pass
    if time.time() > deadline:
        fail("/ready never answered 200 within 180 s")
    state = subprocess.run(["podman", "inspect", name, "--format", "{{.State.Status}}"], capture_output=True, text=True)
    if state.stdout.strip() not in ("running", "created", "configured", ""):
        fail(f"the container is {state.stdout.strip()}")
    time.sleep(0.05)
result["startup_s"] = time.time() - t_start
ready = r.json()
info(f"/ready 200 after {result['startup_s']:.2f} s from `podman run`: {json.dumps(ready)[:160]}")

hc = subprocess.run(["podman", "healthcheck", "run", name], capture_output=True, text=True)
result["healthcheck"] = "healthy" if hc.returncode == 0 else f"rc {hc.returncode}: {(hc.stdout + hc.stderr).strip()}"
info(f"HEALTHCHECK run by podman: {result['healthcheck']}")
if hc.returncode != 0:
    fail("the image's health check fails")
uid = subprocess.run(["podman", "exec", name, "id", "-u"], capture_output=True, text=True).stdout.strip()
info(f"server runs as uid {uid}")
if uid != "10001":
    fail("the server does not run as the image's non-root user")

models = httpx.get(f"{base}/v1/models", timeout=10).json()["data"]
cards = {m["id"]: m for m in models if m.get("root", m["id"]) == m["id"]}
cv = next(m for m in cards.values() if m.get("model_type") == "custom_voice")
bm = next(m for m in cards.values() if m.get("model_type") == "base")
speaker = cv["speakers"][0]
info(f"models: {sorted(cards)}; speaker {speaker}")

client = openai.OpenAI(base_url=f"{base}/v1", api_key="not-needed", max_retries=0, timeout=120)

def speak(fmt, frames, voice=speaker, model=cv["id"], text="Hello from inside the container."):
    t0 = time.perf_counter(); first = None; buf = bytearray()
    with client.audio.speech.with_streaming_response.create(
            model=model, voice=voice, input=text, response_format=fmt,
            extra_body={"max_frames": frames, "seed": 1}) as resp:
        for chunk in resp.iter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - t0
            buf += chunk
    return bytes(buf), first, time.perf_counter() - t0

mp3, ttfa, total = speak("mp3", 25)
with av.open(io.BytesIO(mp3)) as f:
    samples = sum(fr.samples for fr in f.decode(audio=0))
result["first_ttfa_s"] = ttfa
info(f"OpenAI SDK, mp3 (first request): {len(mp3)} bytes, {samples / 24000:.2f} s of audio, "
     f"first audio after {ttfa * 1000:.0f} ms, done in {total:.2f} s")
if samples == 0:
    fail("the mp3 holds no audio")
wav, ttfa2, total = speak("wav", 25)
data, rate = soundfile.read(io.BytesIO(wav))
info(f"OpenAI SDK, wav: {len(data) / rate:.2f} s at {rate} Hz, first audio after {ttfa2 * 1000:.0f} ms")
if rate != 24000 or len(data) == 0:
    fail("the wav is empty or not 24 kHz")
result["second_ttfa_s"] = ttfa2

# a voice cloned over the API, from a short clip: espeak-ng's speech when installed, else a synthetic voiced signal
clip_text = "This is the voice of the container test."
clip = os.path.join(os.path.dirname(__file__), "clip.wav")
if shutil.which("espeak-ng"):
    subprocess.run(["espeak-ng", "-w", clip, clip_text], check=True)
    source = "espeak-ng"
else:
    t = np.arange(int(3 * 24000)) / 24000
    f0 = 140 + 20 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(f0) / 24000
    sig = sum(np.sin(k * phase) / k for k in range(1, 12)) * 0.5 * (1 + np.sin(2 * np.pi * 3.1 * t)) ** 2
    soundfile.write(clip, (0.2 * sig).astype(np.float32), 24000)
    source = "synthetic"
with open(clip, "rb") as fh:
    r = httpx.post(f"{base}/v1/audio/voices", timeout=120,
                   data={"name": "container-voice", "consent": "yes", "text": clip_text, "model": bm["id"]},
                   files={"audio_sample": ("clip.wav", fh, "audio/wav")})
if r.status_code != 200:
    fail(f"POST /v1/audio/voices: {r.status_code} {r.text[:300]}")
profile = os.path.join(voices, "container-voice.json")
st = os.stat(profile) if os.path.exists(profile) else None
info(f"voice cloned from a {source} clip ({r.json().get('mode')}): {profile} "
     f"{'exists, owner uid %d, %d bytes' % (st.st_uid, st.st_size) if st else 'MISSING'}")
if st is None:
    fail("the cloned voice is not in the mounted voices folder")
pcm, ttfa3, _ = speak("pcm", 6, voice="container-voice", model=bm["id"])
info(f"the cloned voice speaks: {len(pcm)} bytes of pcm, first audio after {ttfa3 * 1000:.0f} ms")
if not pcm:
    fail("the cloned voice gave no audio")

# graceful stop: a long stream in flight (read at about 8x real time) while `podman stop` runs
stream = {"bytes": 0, "error": None}
first_bytes = threading.Event()
def long_stream():
    try:
        with httpx.stream("POST", f"{base}/v1/audio/speech", timeout=120, json={
                "model": cv["id"], "voice": speaker, "response_format": "pcm", "max_frames": 400, "seed": 2,
                "input": "A long passage, read slowly by the client, to be in flight while the container stops. " * 4,
        }) as resp:
            stream["status"] = resp.status_code
            for chunk in resp.iter_bytes():
                stream["bytes"] += len(chunk)
                first_bytes.set()
                time.sleep(len(chunk) / 2 / 24000 / 8)
    except Exception as e:  # cut off
        stream["error"] = f"{type(e).__name__}: {e}"
    finally:
        first_bytes.set()
reader = threading.Thread(target=long_stream, daemon=True)
reader.start()
first_bytes.wait(60)
during = {}
def probe_during_stop():
    time.sleep(0.5)
    try:
        during["ready"] = httpx.get(f"{base}/ready", timeout=3).status_code
    except httpx.HTTPError as e:
        during["ready"] = type(e).__name__
    try:
        during["speech"] = httpx.post(f"{base}/v1/audio/speech", timeout=10, json={
            "model": cv["id"], "voice": speaker, "input": "late", "response_format": "pcm", "max_frames": 2}).status_code
    except httpx.HTTPError as e:
        during["speech"] = type(e).__name__
prober = threading.Thread(target=probe_during_stop, daemon=True)
prober.start()
t0 = time.perf_counter()
stop = subprocess.run(["podman", *podman, "stop", "-t", "90", name], capture_output=True, text=True)
result["stop_s"] = time.perf_counter() - t0
reader.join(60)
prober.join(15)
code = subprocess.run(["podman", "inspect", name, "--format", "{{.State.ExitCode}}"],
                      capture_output=True, text=True).stdout.strip()
result["exit_code"] = code
complete = stream["error"] is None and stream["bytes"] > 0 and stream["bytes"] % 3840 == 0
info(f"podman stop took {result['stop_s']:.1f} s, exit code {code}{' (' + stop.stderr.strip()[:300] + ')' if stop.stderr.strip() else ''}")
info(f"during the stop: /ready -> {during.get('ready')}, a new speech request -> {during.get('speech')}")
info(f"stream in flight: {stream['bytes']} bytes ({stream['bytes'] / 2 / 24000:.2f} s of audio), "
     f"{'ended cleanly' if complete else 'CUT: ' + str(stream['error'])}")
result.update(stream_complete=complete, during_stop=during)
with open(os.path.join(os.path.dirname(__file__), "result.json"), "w") as fh:
    json.dump(result, fh)
PYEOF

timeout 900 "$PY" "$WORK/check.py" "http://127.0.0.1:$PORT" "$T_START" "$NAME" "$WORK/voices" "${RT[@]}"
RESULT="$(cat "$WORK/result.json")"
field() { "$PY" -c "import json,sys; v = json.loads(sys.argv[1])[sys.argv[2]]; print(v if not isinstance(v, float) else f'{v:.2f}')" "$RESULT" "$1"; }
EXIT_CODE="$(field exit_code)"
info "server log, last lines:"
podman logs --tail 6 "$NAME" 2>&1 | cut -c1-200 | sed 's/^/     | /'

# ---------------------------------------------------------------------------------------------
step "7/7 summary"
COMMIT="$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- deploy scripts qwen3_tts_gguf api webui requirements.txt .dockerignore 2>/dev/null || echo '+local changes')"
echo "commit:             $COMMIT"
echo "image:              $IMAGE, $IMAGE_MB MB (base from Debian $SUITE: $BASE_MB MB)"
echo "build times:        wheelhouse ${WHEELHOUSE_S} s, base image ${BASE_S} s (0 = reused), image ${BUILD_S} s"
echo "network:            $NETWORK"
echo "start-up to /ready: $(field startup_s) s"
echo "first request TTFA: $(field first_ttfa_s) s (mp3, OpenAI SDK; second request, wav: $(field second_ttfa_s) s)"
echo "graceful stop:      exit code $EXIT_CODE after $(field stop_s) s; stream in flight complete: $(field stream_complete)"
echo "total:              $(( $(date +%s) - START_ALL )) s"
if [ "$EXIT_CODE" != 0 ]; then
  echo "NOTE: the server did not exit 0 on SIGTERM (graceful drain not in this server yet?)"
  [ "${QTTS_TEST_REQUIRE_EXIT0:-1}" = 1 ] && die "podman stop: exit code $EXIT_CODE, expected 0"
fi
[ "$(field stream_complete)" = True ] || die "the stream in flight was cut by the stop (the drain must let it finish)"
echo "test-container: PASSED"
