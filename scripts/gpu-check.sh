#!/usr/bin/env bash
# The GPU check: talker, code predictor and codec on a GPU machine lent for a few minutes (the `device` tool:
# no network there, its own Python 3.12 with numpy, onnxruntime, tokenizers, CMake, ninja and nvcc; at most
# 64 MiB travels; 10 minutes a call, about 15 minutes of device time in all), the code predictor and the codec
# on both runtimes (the project's ggml graphs, ONNX Runtime), on CUDA and, where that machine can build it, Vulkan.
#
#   scripts/gpu-check.sh prepare   here: writes .gpu-check/ (about 17 MB; no model travels, every model is made
#                                  there with numpy's random weights, and its references on that machine's CPU):
#                                  - llama.cpp's source from the sdist of requirements.txt's llama-cpp-python,
#                                    trimmed to what libllama and its ggml need with the CPU, CUDA and Vulkan
#                                    backends (ggml, src, include, common, vendor, the CMake files),
#                                    checked here by configuring it once (CPU)
#                                  - llama_cpp's Python files (the ctypes bindings of that same version)
#                                  - wheels, for that machine's Python 3.12, of what the engine and the converter
#                                    import beyond it (installed there only when missing)
#   scripts/gpu-check.sh run       there: builds libllama and libggml with CUDA for the GPU it finds (and with
#                                  Vulkan when glslc, the Vulkan headers and loader and NVIDIA's Vulkan driver
#                                  are there; else the report names what is missing), loads them through
#                                  LLAMA_CPP_LIB_PATH, then per backend scripts/gpu_check.py:
#                                  parity (the narrow-codec model: talker logits, greedy codes and codec SNR of
#                                  each runtime against the machine's CPU) and speed (a random 1.7B model: first
#                                  audio, RTF at 1, 8, 32 and 64 streams, peak device memory against the seed's
#                                  1.8 GB). One call does what fits in GPU_CHECK_BUDGET_S (default 540 s) and
#                                  says what it left; builds and models stay in .cache/gpu-check/ (ignored, so
#                                  never carried and kept on the warm machine): the same command again goes on.
#                                  Report: $OUT/gpu-check.txt (appended).
#   scripts/gpu-check.sh dry-run   here, without a GPU: run's steps with .venv's llama.cpp in place of a build,
#                                  every stage on the CPU, the narrow model for the speed part too, 1 and 2
#                                  streams of 8 frames (tests/test_gpu_check.py runs it). Report:
#                                  ${OUT:-.cache/gpu-check/dry-run}/gpu-check.txt
#
# The device call (then, if the report says it left steps, the same call once more on the warm machine):
#   run(command="bash scripts/gpu-check.sh run", carry=[".gpu-check"], timeout_s=600)
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=.gpu-check
WORK=.cache/gpu-check
mode="${1:-}"
# module each carried wheel brings (a wheel is installed there only when its module is missing)
WHEELS=(gguf:gguf PyYAML:yaml onnx:onnx protobuf:google.protobuf ml_dtypes:ml_dtypes tqdm:tqdm
        typing_extensions:typing_extensions threadpoolctl:threadpoolctl diskcache:diskcache Jinja2:jinja2
        MarkupSafe:markupsafe)

cmake_flags() {  # the llama.cpp configuration of a backend (cpu, cuda, vulkan): libllama (and its ggml) only
  local flags=(-DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=ON -DLLAMA_BUILD_MTMD=OFF
               -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
               -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF)
  case "$1" in
    cuda) flags+=(-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES="$2" -DGGML_CUDA_NCCL=OFF) ;;
    vulkan) flags+=(-DGGML_VULKAN=on) ;;
  esac
  command -v ninja >/dev/null && flags+=(-G Ninja)
  printf '%s\n' "${flags[@]}"
}

prepare() {
  local py=.venv/bin/python version sdist src
  version="$(sed -n 's/^llama-cpp-python==\([0-9.]*\).*/\1/p' requirements.txt)"
  rm -rf "$DIR" && mkdir -p "$DIR/py" "$DIR/wheels" .cache/sdist
  sdist=".cache/sdist/llama_cpp_python-$version.tar.gz"
  [ -f "$sdist" ] || "$py" -m pip download -q --no-deps --no-binary :all: -d .cache/sdist "llama-cpp-python==$version"
  src="$(mktemp -d)"
  tar xzf "$sdist" -C "$src"
  local top="$src/llama_cpp_python-$version" l="$src/llama_cpp_python-$version/vendor/llama.cpp"
  mkdir -p "$DIR/py/llama_cpp" && cp "$top"/llama_cpp/*.py "$DIR/py/llama_cpp/"
  for b in "$l"/ggml/src/ggml-*/; do  # ggml without the backends not built there
    case "$(basename "$b")" in ggml-cpu|ggml-cuda|ggml-vulkan) ;; *) rm -rf "$b" ;; esac
  done
  tar czf "$DIR/llama.cpp.tar.gz" -C "$l" CMakeLists.txt cmake ggml src include common vendor LICENSE
  # the check: the trimmed tree configures (CPU; the CUDA and Vulkan backends configure there)
  mkdir -p "$src/check" && tar xzf "$DIR/llama.cpp.tar.gz" -C "$src/check"
  mapfile -t flags < <(cmake_flags cpu)
  cmake -S "$src/check" -B "$src/check/build" "${flags[@]}" >"$src/cmake.log" 2>&1 \
    || { tail -30 "$src/cmake.log"; echo "gpu-check: the trimmed llama.cpp does not configure" >&2; exit 1; }
  rm -rf "$src"
  # wheels for that machine's Python, at the versions .venv runs
  local pins=() name
  for w in "${WHEELS[@]}"; do
    name="${w%%:*}"
    pins+=("$name==$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")")
  done
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d "$DIR/wheels" "${pins[@]}"
  du -sh "$DIR"
  echo "gpu-check: ready; on the GPU machine: bash scripts/gpu-check.sh run (carry .gpu-check)" >&2
}

vulkan_missing() {  # what building and running ggml-vulkan here lacks (nothing: empty)
  local miss=()
  command -v glslc >/dev/null || miss+=("glslc (the shader compiler)")
  printf '#include <vulkan/vulkan.hpp>\nvk::LayerSettingEXT setting;\n' | c++ -std=c++17 -fsyntax-only -x c++ - \
    2>/dev/null || miss+=("Vulkan C++ headers with vk::LayerSettingEXT (Debian 12's 1.3.239 lack it)")
  ldconfig -p 2>/dev/null | grep -qE 'libvulkan\.so \(' || miss+=("the Vulkan loader's libvulkan.so")
  compgen -G "/usr/share/vulkan/icd.d/nvidia_icd*.json" >/dev/null || compgen -G "/etc/vulkan/icd.d/nvidia_icd*.json" \
    >/dev/null || miss+=("NVIDIA's Vulkan driver (nvidia_icd.json)")
  local joined
  joined="$(printf '%s; ' "${miss[@]}")"
  [ ${#miss[@]} -eq 0 ] || echo "${joined%; }"
}

build() {  # BACKEND ARCH: libllama and libggml into $WORK/BACKEND/lib; goes on where a call left it
  local backend="$1" dir="$WORK/$1" t0=$SECONDS left
  [ -f "$dir/lib/.built" ] && { echo "  $backend: built in an earlier call"; return 0; }
  [ -d "$dir/src" ] || { mkdir -p "$dir/src" && tar xzf "$DIR/llama.cpp.tar.gz" -C "$dir/src"; }
  mapfile -t flags < <(cmake_flags "$backend" "${2:-}")
  cmake -S "$dir/src" -B "$dir/build" "${flags[@]}" >"$dir/cmake.log" 2>&1 \
    || { tail -30 "$dir/cmake.log"; echo "  $backend: cmake failed"; return 1; }
  left=$((deadline - SECONDS))
  [ "$left" -gt 10 ] || { echo "  $backend: not built in this call (out of time): run again, it goes on"; return 2; }
  if ! timeout "$left" cmake --build "$dir/build" --target llama -j "$(nproc)" >"$dir/build.log" 2>&1; then
    if [ $((deadline - SECONDS)) -le 1 ]; then
      echo "  $backend: not built in this call ($((SECONDS - t0)) s so far): run again, it goes on"; return 2
    fi
    tail -40 "$dir/build.log"; echo "  $backend: build failed"; return 1
  fi
  mkdir -p "$dir/lib" && find "$dir/build" -name 'lib*.so*' -exec cp -a {} "$dir/lib/" \;
  touch "$dir/lib/.built"
  echo "  $backend: built in $((SECONDS - t0)) s"
}

install_wheels() {  # the carried wheels whose module this Python lacks, unpacked into $WORK/site
  local site="$WORK/site" w
  mkdir -p "$site"
  for w in "${WHEELS[@]}"; do
    PYTHONPATH="$site" "$py" -c "import ${w#*:}" 2>/dev/null && continue
    "$py" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" \
      "$(ls "$DIR"/wheels/"${w%%:*}"-*.whl "$DIR"/wheels/"$(echo "${w%%:*}" | tr 'A-Z-' 'a-z_')"-*.whl 2>/dev/null | head -1)" "$site"
    echo "  installed ${w%%:*} (this Python has none)"
  done
}

check_backend() {  # LABEL LIBDIR: parity, then speed, with this llama.cpp
  local label="$1" lib="$2" rc=0 cpu_flag=() speed=()
  [ "${GPU_CHECK_CPU:-0}" = 1 ] && cpu_flag=(--cpu)
  speed=(--shape "${GPU_CHECK_SHAPE:-1.7b}" --streams "${GPU_CHECK_STREAMS:-1,8,32,64}" --frames "${GPU_CHECK_FRAMES:-48}")
  local env=(LLAMA_CPP_LIB_PATH="$lib" LD_LIBRARY_PATH="$lib:${LD_LIBRARY_PATH:-}"
             PYTHONPATH="$pythonpath" PYTHONUNBUFFERED=1)
  echo "== doctor ($label)"
  env "${env[@]}" "$py" -m qwen3_tts_gguf doctor --cp-runtime ggml --codec-runtime ggml \
    $([ "${GPU_CHECK_CPU:-0}" = 1 ] || echo --gpu-layers all) || true
  env "${env[@]}" "$py" scripts/gpu_check.py parity "$WORK" --label "$label" "${cpu_flag[@]}" \
    --budget-s $((deadline - SECONDS)) || rc=1
  env "${env[@]}" "$py" scripts/gpu_check.py speed "$WORK" --label "$label" "${cpu_flag[@]}" "${speed[@]}" \
    --budget-s $((deadline - SECONDS)) || rc=1
  return $rc
}

run() {  # the report on the terminal and in $OUT/gpu-check.txt
  local out="${OUT:-/tmp/gpu-check-out}"
  mkdir -p "$out" "$WORK"
  run_checks 2>&1 | tee -a "$out/gpu-check.txt"
}

run_checks() {
  local status=0 missing arch rc backend
  py="${GPU_CHECK_PYTHON:-python3}"
  deadline=$((SECONDS + ${GPU_CHECK_BUDGET_S:-540}))
  echo "== machine ($(date -u +%Y-%m-%dT%H:%M:%SZ))"
  nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv,noheader 2>/dev/null \
    || echo "no nvidia-smi: no NVIDIA GPU"
  { nvcc --version 2>/dev/null | tail -1; } || true
  "$py" -c "import sys, numpy, onnxruntime as o
print('python', sys.version.split()[0], '| numpy', numpy.__version__, '| onnxruntime', o.__version__, o.get_available_providers())"
  missing="$(vulkan_missing)"
  if [ -n "$missing" ]; then echo "Vulkan on this machine: not built, missing: $missing"
  else echo "Vulkan on this machine: buildable (glslc, headers, loader and NVIDIA's Vulkan driver found)"; fi
  pythonpath="$PWD"
  local backends=()
  if [ -n "${GPU_CHECK_LIB:-}" ]; then  # the dry run (or a llama.cpp built before): no build
    backends=("${GPU_CHECK_LABEL:-given}:$GPU_CHECK_LIB")
  else
    [ -f "$DIR/llama.cpp.tar.gz" ] || { echo "gpu-check: $DIR is missing: scripts/gpu-check.sh prepare (here)"; exit 1; }
    install_wheels
    pythonpath="$PWD/$DIR/py:$PWD/$WORK/site:$PWD"
    arch="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)"
    backends=(cuda $([ -n "$missing" ] || echo vulkan))
  fi
  for b in "${backends[@]}"; do  # each backend built (unless given), then checked, before the next is built
    backend="${b%%:*}"
    if [ -z "${GPU_CHECK_LIB:-}" ]; then
      echo "== build $backend$([ "$backend" = cuda ] && echo " for sm_$arch")"
      rc=0
      build "$backend" "$arch" || rc=$?
      case $rc in 0) b="$backend:$WORK/$backend/lib" ;; 2) status=2; continue ;; *) status=1; continue ;; esac
    fi
    check_backend "$backend" "${b#*:}" || status=1
  done
  case $status in
    0) echo "gpu-check: PASS ($SECONDS s; any step listed as not run: run again)" ;;
    2) echo "gpu-check: INCOMPLETE, a build did not finish in this call ($SECONDS s): run again, it goes on" ;;
    *) echo "gpu-check: FAIL ($SECONDS s)" ;;
  esac
  return $status
}

dry_run() {
  local lib
  lib="$(.venv/bin/python -c 'import os, llama_cpp; print(os.path.join(os.path.dirname(llama_cpp.__file__), "lib"))')"
  WORK=.cache/gpu-check/dry-run-work OUT="${OUT:-.cache/gpu-check/dry-run}" GPU_CHECK_PYTHON=.venv/bin/python \
    GPU_CHECK_LIB="$lib" GPU_CHECK_LABEL="cpu (dry run)" GPU_CHECK_CPU=1 GPU_CHECK_SHAPE=narrow \
    GPU_CHECK_STREAMS=1,2 GPU_CHECK_FRAMES=8 run
}

case "$mode" in
  prepare) prepare ;;
  run) run ;;
  dry-run) dry_run ;;
  *) echo "usage: scripts/gpu-check.sh prepare|run|dry-run" >&2; exit 2 ;;
esac
