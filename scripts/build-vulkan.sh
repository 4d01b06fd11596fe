#!/usr/bin/env bash
# Build the Vulkan talker runtime: llama-cpp-python (requirements.txt's version) with GGML_VULKAN=on,
# into its own virtual environment .venv-vulkan/ (never into .venv: the CPU build stays as it is).
#
#   scripts/build-vulkan.sh            build once; later runs exit at once while the build matches
#   scripts/build-vulkan.sh --force    rebuild the wheel
#
# .venv-vulkan holds only llama-cpp-python; every other package comes from .venv through a .pth file
# (so .venv must exist: scripts/setup_env.sh; run here when it is missing). The wheel is
# scripts/build-llama.sh's (the one recipe, also used by the container image's vulkan stage), compiled
# for this CPU (LLAMA_NATIVE=1) and kept in ~/.cache/qwen3-tts-x/wheels-vulkan/host/ (or under
# $QTTS_BUILD_CACHE), so a fresh clone on the same machine (CI) installs it in seconds instead of
# building again. Debian packages beside the build's own: mesa-vulkan-drivers (lavapipe, the software
# device) and vulkan-tools (vulkaninfo); installed when missing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VULKAN_VENV:-.venv-vulkan}"
force=0
[ "${1:-}" = "--force" ] && force=1

# -- Debian packages the build script does not install: the software device and vulkaninfo -----------
need=()
compgen -G "/usr/share/vulkan/icd.d/lvp_icd.*.json" >/dev/null || need+=(mesa-vulkan-drivers)
command -v vulkaninfo >/dev/null || need+=(vulkan-tools)
if [ ${#need[@]} -gt 0 ]; then
  echo "build-vulkan: installing ${need[*]}" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi

# -- the wheel (scripts/build-llama.sh: built once per machine and settings, kept outside the work tree,
# so a fresh clone on the same machine (CI) installs it in seconds) -----------------------------------
cache_root="${QTTS_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qwen3-tts-x}"
wheels="$cache_root/wheels-vulkan/host"
[ $force = 1 ] && rm -rf "$wheels"
[ -x .venv/bin/python ] || scripts/setup_env.sh "${VULKAN_SETUP_PROFILE:-runtime}"
wheel="$(LLAMA_NATIVE=1 PYTHON=.venv/bin/python scripts/build-llama.sh vulkan "$wheels")"

# -- the venv ----------------------------------------------------------------------------------------
stamp="$VENV/.vulkan-build"
WEBGPU_EP=0.4.0
want="$(head -1 "$wheels/BUILD") onnxruntime-ep-webgpu==$WEBGPU_EP"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && "$VENV/bin/python" -c "import sys; from qwen3_tts_gguf.host.devices import llama_runtime
sys.exit('Vulkan' not in llama_runtime().gpu_backends)" 2>/dev/null; then
  echo "build-vulkan: $VENV is up to date ($want)" >&2
  exit 0
fi
rm -rf "$VENV"
.venv/bin/python -m venv "$VENV"
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
main_site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# everything but llama_cpp from .venv: this line appends .venv's site-packages (and runs its .pth
# files) after this venv's own, so this venv's llama_cpp wins
echo "import site; site.addsitedir('$main_site')" > "$site/zz-main-venv.pth"
# --ignore-installed: .venv's CPU llama_cpp is visible through the .pth line and would count as installed
"$VENV/bin/python" -m pip install -q --no-index --no-deps --no-cache-dir --ignore-installed "$wheel"
# ONNX Runtime's WebGPU plugin provider (Dawn on Vulkan; --device webgpu), tried by tests/test_vulkan.py
"$VENV/bin/python" -m pip install -q --no-deps "onnxruntime-ep-webgpu==$WEBGPU_EP"
# the Vulkan backend is in the build (llama_supports_gpu_offload is true only once a device is seen:
# here lavapipe is, with GGML_VK_VISIBLE_DEVICES naming it)
"$VENV/bin/python" -c "import sys; from qwen3_tts_gguf.host.devices import llama_runtime
sys.exit(0 if 'Vulkan' in llama_runtime().gpu_backends else 'build-vulkan: the built llama.cpp has no Vulkan backend')"
echo "$want" > "$stamp"
echo "build-vulkan: $VENV ready ($VENV/bin/python -m qwen3_tts_gguf doctor)" >&2
