#!/usr/bin/env bash
# CUDA check for a GPU machine lent for a few minutes (the `device` tool: no network there, its own
# Python 3.12 with numpy, onnxruntime, tokenizers, CMake, ninja and nvcc; what travels is capped at 64 MiB).
#
#   scripts/gpu-check.sh prepare   here, on the CPU: writes .gpu-check/ (about 56 MB, the tiny model's
#                                  tables most of it; with the repo it stays under the 64 MiB that travels):
#                                  - llama.cpp's source, trimmed to what libllama needs with CUDA (ggml with
#                                    its CPU and CUDA backends, src, include, common, vendor, the CMake files),
#                                    from the sdist of requirements.txt's llama-cpp-python, as a .tar.gz
#                                  - llama_cpp's Python files (the ctypes bindings of that same version)
#                                  - the gguf wheel (pure Python: the speed run writes a real-shape talker)
#                                  - a tiny f32 model folder and references computed here on the CPU:
#                                    teacher-forced talker logits and hidden states, greedy engine codes
#   scripts/gpu-check.sh run       there: builds libllama with CUDA for the GPU it finds, loads it through
#                                  LLAMA_CPP_LIB_PATH, compares logits/hidden and greedy codes with the
#                                  references, runs the ONNX graphs on CUDA when that onnxruntime offers the
#                                  CUDA provider (else says so), then times the talker in the 0.6B shape
#                                  (random weights: speed does not depend on them). Report: $OUT/gpu-check.txt
#
# The device call (one command, one 10-minute call; the build takes most of it):
#   run(command="bash scripts/gpu-check.sh run", carry=[".gpu-check"], timeout_s=600)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.gpu-check
mode="${1:-}"

prepare() {
  local py=.venv/bin/python version sdist src
  version="$(sed -n 's/^llama-cpp-python==\([0-9.]*\).*/\1/p' requirements.txt)"
  rm -rf "$DIR" && mkdir -p "$DIR/py" "$DIR/wheels" .cache/sdist
  sdist=".cache/sdist/llama_cpp_python-$version.tar.gz"
  [ -f "$sdist" ] || "$py" -m pip download -q --no-deps --no-binary :all: -d .cache/sdist "llama-cpp-python==$version"
  src="$(mktemp -d)"
  tar xzf "$sdist" -C "$src"
  local top="$src/llama_cpp_python-$version" l="$src/llama_cpp_python-$version/vendor/llama.cpp"
  # the Python bindings (pure Python; the library comes from the CUDA build there)
  mkdir -p "$DIR/py/llama_cpp" && cp "$top"/llama_cpp/*.py "$DIR/py/llama_cpp/"
  # ggml without the backends not built there
  for b in "$l"/ggml/src/ggml-*/; do
    case "$(basename "$b")" in ggml-cpu|ggml-cuda) ;; *) rm -rf "$b" ;; esac
  done
  tar czf "$DIR/llama.cpp.tar.gz" -C "$l" CMakeLists.txt cmake ggml src include common vendor LICENSE
  rm -rf "$src"
  # pure-Python wheels that machine lacks: gguf (the speed run writes a GGUF), diskcache (llama_cpp imports it)
  "$py" -m pip download -q --no-deps --only-binary=:all: -d "$DIR/wheels" \
    "gguf==$(sed -n 's/^gguf==\([0-9.]*\).*/\1/p' requirements.txt)" "diskcache==5.6.3"
  # model and references, on the CPU, in the deterministic profile
  "$py" - "$DIR" <<'EOF'
import shutil, sys
from pathlib import Path
import numpy as np
sys.path.insert(0, ".")
from tests.conftest import converted_model
from qwen3_tts_gguf.model.loaded import EngineSettings, LoadedModel
from qwen3_tts_gguf.model.prompt import VoiceSpec
from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.engine.scheduler import Engine
from qwen3_tts_gguf.model.talker import Talker, TalkerSettings

out = Path(sys.argv[1])
model_dir = out / "model"
shutil.copytree(converted_model("tiny_cv", "f32"), model_dir)
talker = Talker(model_dir / "talker.gguf", TalkerSettings(n_ctx=256, max_streams=2, deterministic=True, threads=2))
rows = np.random.default_rng(0).standard_normal((14, talker.hidden_size)).astype(np.float32)
logits, hidden = talker.decode_steps(0, rows, 9)
talker.close()
np.save(out / "rows.npy", rows); np.save(out / "logits.npy", logits); np.save(out / "hidden.npy", hidden)
greedy = SamplingParams(greedy=True)
engine = Engine(LoadedModel(model_dir, EngineSettings(deterministic=True, max_streams=2, threads=2, n_ctx=2048))).start()
stream = engine.submit(SynthesisRequest("Hello world, this is a parity test.", VoiceSpec(speaker="ryan", language="english"),
                                        talker=TalkerSampling(greedy), code_predictor=greedy, seed=0, max_frames=30,
                                        ignore_eos=True))
for _ in stream:
    pass
engine.stop(); engine.model.close()
np.save(out / "codes.npy", stream.result.codes)
print(f"references: logits {logits.shape}, codes {stream.result.codes.shape}")
EOF
  tar czf "$DIR/model.tar.gz" -C "$DIR" model && rm -rf "$DIR/model"  # ~52 MB: the repo + this stay under 64 MiB
  du -sh "$DIR"
  echo "gpu-check: ready; on the GPU machine: bash scripts/gpu-check.sh run (carry .gpu-check)" >&2
}

run() {
  [ -f "$DIR/model.tar.gz" ] || { echo "gpu-check: $DIR is missing: scripts/gpu-check.sh prepare (here)" >&2; exit 1; }
  local out="${OUT:-/tmp/gpu-check-out}" py=python3 build=/tmp/llama-cuda
  mkdir -p "$out"
  exec > >(tee "$out/gpu-check.txt") 2>&1
  echo "== machine"; nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || true
  nvcc --version | tail -1 || true
  "$py" --version
  local lib
  if [ -n "${GPU_CHECK_LIB:-}" ]; then  # a dry run elsewhere: a llama.cpp library built already (e.g. Vulkan)
    lib="$GPU_CHECK_LIB"
  else
  arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)"
  echo "== build libllama with CUDA (sm_${arch:-native})"
  rm -rf /tmp/llama-src && mkdir -p /tmp/llama-src && tar xzf "$DIR/llama.cpp.tar.gz" -C /tmp/llama-src
  local t0=$SECONDS gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  cmake -S /tmp/llama-src -B "$build" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON \
    -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES="${arch:-native}" -DGGML_CUDA_FA=OFF -DGGML_CUDA_NCCL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF >/dev/null
  cmake --build "$build" --target llama -j "$(nproc)" >/tmp/llama-build.log 2>&1 \
    || { tail -40 /tmp/llama-build.log; exit 1; }
  echo "built in $((SECONDS - t0)) s"
  lib="$(dirname "$(find "$build" -name 'libllama.so' | head -1)")"
  find "$build" -name 'libggml*.so*' ! -path "$lib/*" -exec cp -an {} "$lib/" \;
  fi
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$DIR"/wheels/*.whl
  export LLAMA_CPP_LIB_PATH="$lib" LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}" PYTHONPATH="$PWD/$DIR/py:/tmp/site:$PWD"
  rm -rf /tmp/gpu-check && mkdir -p /tmp/gpu-check && tar xzf "$DIR/model.tar.gz" -C /tmp/gpu-check
  cp "$DIR"/*.npy /tmp/gpu-check/
  echo "== doctor"; "$py" -m qwen3_tts_gguf doctor --gpu-layers all --device auto || true
  echo "== parity and speed"
  PYTHONUNBUFFERED=1 "$py" - /tmp/gpu-check <<'EOF'
import os, sys, time
from pathlib import Path
import numpy as np
import onnxruntime as ort
from qwen3_tts_gguf.model.loaded import EngineSettings, LoadedModel
from qwen3_tts_gguf.model.prompt import VoiceSpec
from qwen3_tts_gguf.engine.request import SynthesisRequest, TalkerSampling
from qwen3_tts_gguf.model.sampler import SamplingParams
from qwen3_tts_gguf.engine.scheduler import Engine
from qwen3_tts_gguf.model.talker import DecodeItem, Talker, TalkerSettings

d = Path(sys.argv[1])
ok = True
t = Talker(d / "model" / "talker.gguf", TalkerSettings(n_ctx=256, max_streams=2, deterministic=True, gpu_layers=-1))
rows = np.load(d / "rows.npy")
logits, hidden = t.decode_steps(0, rows, 9)
t.close()
dl = float(np.abs(logits - np.load(d / "logits.npy")).max()); dh = float(np.abs(hidden - np.load(d / "hidden.npy")).max())
print(f"talker f32, all layers offloaded vs CPU: logits max|d| {dl:.2e}, hidden max|d| {dh:.2e}")
ok &= dl < 3e-2 and dh < 5e-3  # the lavapipe bars (tests/test_vulkan.py); CUDA f32 should be far inside

def greedy_codes(device):
    g = SamplingParams(greedy=True)
    m = LoadedModel(d / "model", EngineSettings(deterministic=True, max_streams=2, n_ctx=2048, gpu_layers=-1, device=device))
    e = Engine(m).start()
    s = e.submit(SynthesisRequest("Hello world, this is a parity test.", VoiceSpec(speaker="ryan", language="english"),
                                  talker=TalkerSampling(g), code_predictor=g, seed=0, max_frames=30, ignore_eos=True))
    for _ in s:
        pass
    e.stop(); m.close()
    return s.result.codes

ref = np.load(d / "codes.npy")
codes = greedy_codes("cpu")
same = (codes == ref).all(axis=1)
print(f"greedy codes (talker offloaded, graphs on CPU) vs CPU: {int(same.sum())}/{len(same)} frames equal"
      + ("" if same.all() else f", first difference at frame {int(np.argmin(same))}"))
ok &= bool(same.all())
if "CUDAExecutionProvider" in ort.get_available_providers():
    codes = greedy_codes("cuda")
    same = (codes == ref).all(axis=1)
    print(f"greedy codes (talker and graphs on CUDA) vs CPU: {int(same.sum())}/{len(same)} frames equal")
else:
    print(f"ONNX graphs on CUDA: untested, this onnxruntime {ort.__version__} offers {ort.get_available_providers()}")

if os.environ.get("GPU_CHECK_SPEED", "1") == "0":
    print("gpu-check:", "PASS" if ok else "FAIL", "(no speed run)")
    sys.exit(0 if ok else 1)
# speed: the talker in the 0.6B shape (random weights), f16 and q8_0-free (no llama-quantize there)
from qwen3_tts_gguf.convert.checkpoint import Checkpoint
from qwen3_tts_gguf.convert.talker_gguf import write_talker_gguf
from qwen3_tts_gguf.convert.random_checkpoint import make_random_checkpoint
t0 = time.monotonic()
ck = make_random_checkpoint("/tmp/r06", "0.6b")
write_talker_gguf(Checkpoint.open(ck), Path("/tmp/r06-talker-f16.gguf"), "f16")
print(f"0.6B-shape random talker written in {time.monotonic() - t0:.0f} s")
for streams in (1, 8):
    t = Talker("/tmp/r06-talker-f16.gguf", TalkerSettings(n_ctx=4096, max_streams=8, gpu_layers=-1))
    H = t.hidden_size
    rng = np.random.default_rng(0)
    t.decode([DecodeItem(s, 0, rng.standard_normal((60, H)).astype(np.float32)) for s in range(streams)])
    t0 = time.perf_counter(); n = 100
    for k in range(n):
        t.decode([DecodeItem(s, 60 + k, rng.standard_normal((1, H)).astype(np.float32)) for s in range(streams)])
    ms = (time.perf_counter() - t0) / n * 1000
    print(f"0.6B talker f16 on CUDA, {streams} stream(s): {ms:.2f} ms per step (frame = 80 ms of audio)")
    t.close()
print("gpu-check:", "PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
}

case "$mode" in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: scripts/gpu-check.sh prepare|run" >&2; exit 2 ;;
esac
