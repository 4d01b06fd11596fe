#!/usr/bin/env bash
# Prepare deploy/wheelhouse/: every wheel the CPU image needs, so that `docker build` / `podman build`
# installs offline (`pip install --no-index --find-links`), fast and the same every time.
#
#   scripts/build-wheelhouse.sh            # reuse the cached portable llama-cpp-python wheel
#   scripts/build-wheelhouse.sh --rebuild  # build that wheel again (~7-10 min on 2 cores)
#
# llama-cpp-python has no wheel on PyPI: scripts/build-llama.sh compiles it here once, PORTABLE
# (-DGGML_NATIVE=OFF: AVX2/FMA/F16C, no AVX-512/AMX), into .cache/llama-portable/, reused from there. A wheel from a plain `pip install` on this machine is built with -march=native and only runs
# on CPUs like this one: it is never used for the image (pip's own wheel cache is bypassed).
# The wheels are for this machine's Python (cp311 on the development machines), which is the Python
# of python:3.11-slim-bookworm and of Debian 12's python3. Pip's configuration (index, certificates)
# is the host's: nothing in the image build talks to a package index.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-.venv/bin/python}"
[ -x "$PY" ] || PY=python3
CACHE=.cache/llama-portable
WHEELHOUSE=deploy/wheelhouse
LLAMA_PIN="$(grep -E '^llama-cpp-python==' requirements.txt | cut -d' ' -f1 | head -1)"
LLAMA_VERSION="${LLAMA_PIN#llama-cpp-python==}"
[ -n "$LLAMA_VERSION" ] || { echo "error: no llama-cpp-python==VERSION pin in requirements.txt" >&2; exit 1; }
rebuild=0
[ "${1:-}" = "--rebuild" ] && rebuild=1

say() { echo "[wheelhouse] $*" >&2; }

pyver="$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
say "python $pyver ($PY); llama-cpp-python $LLAMA_VERSION"
[ "$pyver" = 3.11 ] || say "warning: the image's Python must be $pyver too (python:3.11-slim-bookworm and Debian 12 have 3.11)"

# 1. the portable llama-cpp-python wheel, built once (scripts/build-llama.sh: the one recipe)
[ "$rebuild" = 1 ] && rm -rf "$CACHE"
llama_wheel="$(PYTHON="$PY" scripts/build-llama.sh cpu "$CACHE")"

# portability check: no AVX-512 (zmm registers) in the CPU backend of the wheel
if command -v objdump >/dev/null; then
  tmp="$(mktemp -d)"
  "$PY" -m zipfile -e "$llama_wheel" "$tmp"
  zmm=0
  while IFS= read -r so; do
    n="$(objdump -d --no-show-raw-insn "$so" | grep -c '%zmm' || true)"
    zmm=$(( zmm + n ))
  done < <(find "$tmp" -name 'libggml*.so*' -type f)
  rm -rf "$tmp"
  if [ "$zmm" -ne 0 ]; then
    echo "error: $llama_wheel uses AVX-512 ($zmm zmm instructions): not portable; run with --rebuild" >&2
    exit 1
  fi
  say "portable: no AVX-512 instructions in libggml*"
fi

# 2. every other requirement as a wheel, next to it
rm -rf "$WHEELHOUSE"/*.whl
mkdir -p "$WHEELHOUSE"
cp "$llama_wheel" "$WHEELHOUSE/"
t0=$(date +%s)
"$PY" -m pip wheel -q -r requirements.txt -w "$WHEELHOUSE" --find-links "$WHEELHOUSE"
# pip must have kept the portable wheel (a wheel beats the sdist at the same version)
if ! cmp -s "$llama_wheel" "$WHEELHOUSE/$(basename "$llama_wheel")" \
   || [ "$(ls "$WHEELHOUSE"/llama_cpp_python-*.whl | wc -l)" -ne 1 ]; then
  echo "error: the wheelhouse's llama-cpp-python is not the portable wheel from $CACHE" >&2
  exit 1
fi
say "$(ls "$WHEELHOUSE"/*.whl | wc -l) wheels, $(du -sh "$WHEELHOUSE" | cut -f1), in $WHEELHOUSE ($(( $(date +%s) - t0 )) s)"
