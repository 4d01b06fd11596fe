#!/usr/bin/env bash
# The one recipe for the talker runtime: llama-cpp-python (requirements.txt's version) compiled with a
# backend, as a wheel. Everything that builds llama.cpp calls it: scripts/build-wheelhouse.sh (cpu,
# portable, for the CPU image), scripts/build-vulkan.sh (vulkan, this machine's .venv-vulkan) and the
# image's cuda and vulkan build stages (deploy/Dockerfile).
#
#   scripts/build-llama.sh cpu|vulkan|cuda OUT_DIR      prints the wheel's path on stdout
#
# The build is skipped while OUT_DIR holds a wheel built with the same settings (its BUILD file
# records them: version, backend, CMake arguments, Python, machine); otherwise OUT_DIR is replaced.
# Environment:
#   LLAMA_NATIVE=1        compile for this CPU (-march=native): faster here, runs only on CPUs like
#                         this one. Default 0: portable (-DGGML_NATIVE=OFF: AVX2, FMA, F16C).
#   CUDA_ARCHITECTURES    cuda: the GPU generations (default "75;80;86;89;90;100;120": CUDA 13, Turing on)
#   PYTHON                the Python whose pip builds the wheel (default .venv/bin/python, else python3);
#                         the wheel is for that Python's version
#   QTTS_BUILD_CACHE      where fetched Vulkan headers are kept (default ~/.cache/qwen3-tts-x)
# Debian build packages the backend needs are installed with apt when missing (root only): cmake, g++, make;
# vulkan: libvulkan-dev, glslc, spirv-headers (the vendored llama.cpp's CMake asks for its config).
# Debian 12's Vulkan headers (1.3.239) lack vk::LayerSettingEXT, which ggml-vulkan.cpp uses: then the
# headers of Debian's next release (libvulkan-dev from trixie, the machine's own mirror) are unpacked
# into the build cache with an apt configuration of its own (the system's apt state is not touched)
# and passed as Vulkan_INCLUDE_DIR. pip's wheel cache does not key on CMAKE_ARGS, so pip runs with
# --no-cache-dir and --no-binary: a wheel of another backend is never picked up.
set -euo pipefail
cd "$(dirname "$0")/.."
backend="${1:-}" out="${2:-}"
case "$backend" in cpu|vulkan|cuda) ;; *) sed -n '2,26p' "$0" >&2; exit 2 ;; esac
[ -n "$out" ] || { echo "build-llama: no OUT_DIR" >&2; exit 2; }
say() { echo "build-llama: $*" >&2; }

version="$(sed -n 's/^llama-cpp-python==\([0-9.]*\).*/\1/p' requirements.txt)"
[ -n "$version" ] || { say "no llama-cpp-python==X pin in requirements.txt"; exit 1; }
py="${PYTHON:-}"
[ -n "$py" ] || { [ -x .venv/bin/python ] && py=.venv/bin/python || py=python3; }

# -- Debian build packages ---------------------------------------------------------------------------
need=()
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
command -v make >/dev/null || need+=(make)
if [ "$backend" = vulkan ]; then
  [ -f /usr/include/vulkan/vulkan_core.h ] || need+=(libvulkan-dev)
  command -v glslc >/dev/null || need+=(glslc)
  [ -d /usr/share/cmake/SPIRV-Headers ] || compgen -G "/usr/lib/*/cmake/SPIRV-Headers" >/dev/null || need+=(spirv-headers)
fi
if [ ${#need[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null || { say "missing ${need[*]} (install them)"; exit 1; }
  say "installing ${need[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi

# -- CMake arguments -----------------------------------------------------------------------------------
cmake_args=""
[ "${LLAMA_NATIVE:-0}" = 1 ] || cmake_args="-DGGML_NATIVE=OFF"
case "$backend" in
  cuda)
    command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ] || { say "cuda: no nvcc (a CUDA toolkit is needed)"; exit 1; }
    cmake_args="$cmake_args -DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCHITECTURES:-75;80;86;89;90;100;120}"
    ;;
  vulkan)
    include_dir=/usr/include
    if ! grep -q "VkLayerSettingEXT" /usr/include/vulkan/vulkan_core.h; then
      cache_root="${QTTS_BUILD_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/qwen3-tts-x}"
      suite="${VULKAN_HEADERS_SUITE:-trixie}"
      hdr="$cache_root/vulkan-headers-$suite"
      if ! grep -qs "VkLayerSettingEXT" "$hdr/usr/include/vulkan/vulkan_core.h"; then
        say "the system's Vulkan headers are too old; fetching libvulkan-dev from Debian $suite"
        apt_dir="$(mktemp -d)"
        rm -rf "$hdr" "$hdr.partial" && mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$hdr.partial"
        # the machine's own Debian mirror (deb822 or one-line sources), with the next release's suite
        mirror="$( (grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}'
                    grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
                      | awk '{for (i = 2; i <= NF; i++) if ($i ~ /^https?:/) {print $i; break}}') \
                  | grep -m1 '/debian/\?$' || true)"
        [ -n "$mirror" ] || { say "no Debian mirror in the apt sources"; exit 1; }
        echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror $suite main" > "$apt_dir/sources.list"
        apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
                  -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache" -o APT::Sandbox::User=root)
        apt-get "${apt_opts[@]}" update -q >/dev/null
        (cd "$apt_dir" && apt-get "${apt_opts[@]}" download -q libvulkan-dev >/dev/null)
        dpkg -x "$apt_dir"/libvulkan-dev_*.deb "$hdr.partial"
        grep -q "VkLayerSettingEXT" "$hdr.partial/usr/include/vulkan/vulkan_core.h" \
          || { say "the fetched headers still lack VkLayerSettingEXT"; exit 1; }
        mv "$hdr.partial" "$hdr"
        rm -rf "$apt_dir"
      fi
      include_dir="$hdr/usr/include"
    fi
    core="$include_dir/vulkan/vulkan_core.h"
    headers="$(sed -n 's/^#define VK_HEADER_VERSION_COMPLETE VK_MAKE_API_VERSION(0, \([0-9]*\), \([0-9]*\), VK_HEADER_VERSION)/\1.\2/p' "$core").$(sed -n 's/^#define VK_HEADER_VERSION \([0-9]*\)$/\1/p' "$core")"
    cmake_args="$cmake_args -DGGML_VULKAN=on -DVulkan_INCLUDE_DIR=$include_dir"
    ;;
esac
cmake_args="${cmake_args# }"

# -- the wheel ----------------------------------------------------------------------------------------
pyver="$("$py" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')"
settings="llama-cpp-python==$version backend=$backend cmake=$cmake_args${headers:+ vulkan-headers=$headers} py$pyver $(uname -m)"
wheel="$(ls "$out"/llama_cpp_python-"$version"-*.whl 2>/dev/null | head -1 || true)"
if [ -n "$wheel" ] && [ "$(head -1 "$out/BUILD" 2>/dev/null)" = "$settings" ]; then
  say "reusing $wheel"
  echo "$wheel"
  exit 0
fi
say "building llama-cpp-python $version with $cmake_args (several minutes: ~7-14 on 2 cores)"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
rm -rf "$out.partial" && mkdir -p "$out.partial"
started=$(date +%s)
CMAKE_ARGS="$cmake_args" FORCE_CMAKE=1 "$py" -m pip wheel -q --no-cache-dir --no-deps \
  --no-binary llama-cpp-python -w "$out.partial" "llama-cpp-python==$version"
elapsed=$(( $(date +%s) - started ))
built="$(ls "$out.partial"/llama_cpp_python-*.whl | head -1)"
# the backend's library among the wheel's files (read in Python: `zipfile -l | grep -q` fails under
# pipefail whenever grep's early exit breaks the listing's pipe, a wheel with the library included)
if [ "$backend" != cpu ] && ! "$py" -c 'import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
sys.exit(not any(n.rsplit("/", 1)[-1].startswith(sys.argv[2]) for n in names))' "$built" "libggml-$backend.so"; then
  say "the built wheel has no $backend backend (libggml-$backend.so): see the CMake output above"; exit 1
fi
printf '%s\nbuilt in %s s on %s cores, %s\n' "$settings" "$elapsed" "$(nproc)" "$(date -u +%Y-%m-%d)" > "$out.partial/BUILD"
rm -rf "$out" && mv "$out.partial" "$out"
say "built in ${elapsed} s on $(nproc) cores"
ls "$out"/llama_cpp_python-"$version"-*.whl | head -1
