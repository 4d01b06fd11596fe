#!/usr/bin/env bash
# Build the Vulkan talker runtime: llama-cpp-python (requirements.txt's version) with GGML_VULKAN=on,
# into its own virtual environment .venv-vulkan/ (never into .venv: the CPU build stays as it is).
#
#   scripts/build-vulkan.sh            build once; later runs exit at once while the build matches
#   scripts/build-vulkan.sh --force    rebuild the wheel
#
# .venv-vulkan holds only llama-cpp-python; every other package comes from .venv through a .pth file
# (so .venv must exist: scripts/setup_env.sh; run here when it is missing). Debian packages:
# mesa-vulkan-drivers (lavapipe, the software device), libvulkan-dev, glslc, spirv-headers (the
# vendored llama.cpp's CMake asks for its config), vulkan-tools (vulkaninfo); installed when missing.
# Debian 12's Vulkan headers (1.3.239) lack vk::LayerSettingEXT, which ggml-vulkan.cpp uses: then the
# headers of Debian's next release (libvulkan-dev from trixie, same mirror) are unpacked into the
# machine's build cache with an apt configuration of its own (the system's apt state is not touched)
# and passed as Vulkan_INCLUDE_DIR. Loader, glslc and Mesa stay Debian 12's.
# pip's wheel cache does not key on CMAKE_ARGS, so the build runs with --no-cache-dir (a CPU wheel is
# never picked up here, and this build never lands where .venv's pip would pick it up); the wheel goes
# to a wheelhouse of its own keyed by version, headers, CMake arguments and Python
# (~/.cache/qwen3-tts-x/wheels-vulkan/<key>/, or under $QTTS_BUILD_CACHE), so a fresh clone on the
# same machine (CI) installs it in seconds instead of building again.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VULKAN_VENV:-.venv-vulkan}"
force=0
[ "${1:-}" = "--force" ] && force=1

version="$(sed -n 's/^llama-cpp-python==\([0-9.]*\).*/\1/p' requirements.txt)"
[ -n "$version" ] || { echo "build-vulkan: no llama-cpp-python==X pin in requirements.txt" >&2; exit 1; }

# -- Debian packages ---------------------------------------------------------------------------------
need=()
compgen -G "/usr/share/vulkan/icd.d/lvp_icd.*.json" >/dev/null || need+=(mesa-vulkan-drivers)
[ -f /usr/include/vulkan/vulkan_core.h ] || need+=(libvulkan-dev)
command -v glslc >/dev/null || need+=(glslc)
[ -d /usr/share/cmake/SPIRV-Headers ] || compgen -G "/usr/lib/*/cmake/SPIRV-Headers" >/dev/null || need+=(spirv-headers)
command -v vulkaninfo >/dev/null || need+=(vulkan-tools)
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
if [ ${#need[@]} -gt 0 ]; then
  echo "build-vulkan: installing ${need[*]}" >&2
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null
fi

# -- Vulkan headers new enough for ggml-vulkan.cpp ---------------------------------------------------
# kept per machine, outside the work tree (a fresh clone finds them): $QTTS_BUILD_CACHE or ~/.cache/qwen3-tts-x
cache_root="${QTTS_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qwen3-tts-x}"
include_dir=/usr/include
if ! grep -q "VkLayerSettingEXT" /usr/include/vulkan/vulkan_core.h; then
  suite="${VULKAN_HEADERS_SUITE:-trixie}"
  hdr="$cache_root/vulkan-headers-$suite"
  if ! grep -qs "VkLayerSettingEXT" "$hdr/usr/include/vulkan/vulkan_core.h"; then
    echo "build-vulkan: the system's Vulkan headers are too old; fetching libvulkan-dev from Debian $suite" >&2
    apt_dir="$(mktemp -d)"
    rm -rf "$hdr" "$hdr.partial" && mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$hdr.partial"
    # the machine's own Debian mirror (deb822 or one-line sources), with the next release's suite
    mirror="$( (grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
                grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
                  | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; break}}') \
              | grep -m1 '/debian/\?$' || true)"
    [ -n "$mirror" ] || { echo "build-vulkan: no Debian mirror in the apt sources" >&2; exit 1; }
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" > "$apt_dir/sources.list"
    apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
              -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o APT::Sandbox::User=root)
    apt-get "${apt_opts[@]}" update -q >/dev/null
    (cd "$apt_dir" && apt-get "${apt_opts[@]}" download -q libvulkan-dev >/dev/null)
    dpkg -x "$apt_dir"/libvulkan-dev_*.deb "$hdr.partial"
    grep -q "VkLayerSettingEXT" "$hdr.partial/usr/include/vulkan/vulkan_core.h" \
      || { echo "build-vulkan: the fetched headers still lack VkLayerSettingEXT" >&2; exit 1; }
    mv "$hdr.partial" "$hdr"
    rm -rf "$apt_dir"
  fi
  include_dir="$hdr/usr/include"
fi
core="$include_dir/vulkan/vulkan_core.h"
headers="$(sed -n 's/^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, \([0-9]*\), \([0-9]*\), VK_HEADER_VERSION)/\1.\2/p' "$core").$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\)$/\1/p' "$core")"

# -- the venv ----------------------------------------------------------------------------------------
cmake_args="-DGGML_VULKAN=on -DVulkan_INCLUDE_DIR=$include_dir"
stamp="$VENV/.vulkan-build"
WEBGPU_EP=0.4.0
want="llama-cpp-python==$version vulkan-headers=$headers cmake=$cmake_args onnxruntime-ep-webgpu==$WEBGPU_EP"
if [ $force = 0 ] && [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] \
   && "$VENV/bin/python" -c "import sys; from qwen3_tts_gguf.devices import llama_runtime
sys.exit('Vulkan' not in llama_runtime().gpu_backends)" 2>/dev/null; then
  echo "build-vulkan: $VENV is up to date ($want)" >&2
  exit 0
fi
[ -x .venv/bin/python ] || scripts/setup_env.sh "${VULKAN_SETUP_PROFILE:-runtime}"
rm -rf "$VENV"
.venv/bin/python -m venv "$VENV"
site="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
main_site="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# everything but llama_cpp from .venv: this line appends .venv's site-packages (and runs its .pth
# files) after this venv's own, so this venv's llama_cpp wins
echo "import site; site.addsitedir('$main_site')" > "$site/zz-main-venv.pth"

# -- the wheel: built once per machine and build settings, in a wheelhouse of its own ----------------
pyver="$("$VENV/bin/python" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
key="$(echo "llama-cpp-python==$version vulkan-headers=$headers cmake=$cmake_args py$pyver $(uname -m)" | sha256sum | cut -c1-16)"
wheels="$cache_root/wheels-vulkan/$key"
if [ $force = 1 ] || ! ls "$wheels"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  echo "build-vulkan: building llama-cpp-python $version with $cmake_args (Vulkan headers $headers)" >&2
  export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
  rm -rf "$wheels.partial" && mkdir -p "$wheels.partial"
  started=$(date +%s)
  CMAKE_ARGS="$cmake_args" FORCE_CMAKE=1 "$VENV/bin/python" -m pip wheel -q --no-cache-dir --no-deps \
    --no-binary llama-cpp-python -w "$wheels.partial" "llama-cpp-python==$version"
  elapsed=$(( $(date +%s) - started ))
  echo "llama-cpp-python==$version $cmake_args: built in ${elapsed} s on $(nproc) cores, $(date -u +%Y-%m-%d)" > "$wheels.partial/BUILD"
  rm -rf "$wheels" && mv "$wheels.partial" "$wheels"
  echo "build-vulkan: built in ${elapsed} s on $(nproc) cores" >&2
else
  echo "build-vulkan: installing the wheel built earlier on this machine ($wheels)" >&2
fi
# --ignore-installed: .venv's CPU llama_cpp is visible through the .pth line and would count as installed
"$VENV/bin/python" -m pip install -q --no-index --no-deps --no-cache-dir --ignore-installed "$wheels"/llama_cpp_python-*.whl
# ONNX Runtime's WebGPU plugin provider (Dawn on Vulkan; --device webgpu), tried by tests/test_vulkan.py
"$VENV/bin/python" -m pip install -q --no-deps "onnxruntime-ep-webgpu==$WEBGPU_EP"
# the Vulkan backend is in the build (llama_supports_gpu_offload is true only once a device is seen:
# here lavapipe is, with GGML_VK_VISIBLE_DEVICES naming it)
"$VENV/bin/python" -c "import sys; from qwen3_tts_gguf.devices import llama_runtime
sys.exit(0 if 'Vulkan' in llama_runtime().gpu_backends else 'build-vulkan: the built llama.cpp has no Vulkan backend')"
echo "$want" > "$stamp"
echo "build-vulkan: $VENV ready ($VENV/bin/python -m qwen3_tts_gguf doctor)" >&2
