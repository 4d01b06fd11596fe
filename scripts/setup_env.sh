#!/usr/bin/env bash
# Create .venv and install what is missing. Usage: scripts/setup_env.sh [runtime|test]
# Re-running is cheap: pip is skipped while the requirement files are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-runtime}"
PY="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
stamp=".venv/.installed-$profile"
files=(requirements.txt)
[ "$profile" = test ] && files+=(requirements-test.txt)
digest="$(cat "${files[@]}" scripts/setup_env.sh | sha256sum | cut -d' ' -f1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
  exit 0
fi
# the test profile installs the runtime's requirements too: a current test setup serves as it is
test_digest="$(cat requirements.txt requirements-test.txt scripts/setup_env.sh | sha256sum | cut -d' ' -f1)"
if [ "$profile" = runtime ] && [ -f .venv/.installed-test ] && [ "$(cat .venv/.installed-test)" = "$test_digest" ]; then
  exit 0
fi
echo "setting up .venv ($profile): installing requirements (first run builds llama-cpp-python: ~7 min)" >&2
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
if [ "$profile" = test ]; then
  .venv/bin/python -m pip install -q -r requirements-test.txt
  # the official implementation; its sox/torchaudio/gradio imports are stubbed or unused in tests
  .venv/bin/python -m pip install -q --no-deps qwen-tts==0.1.1
fi
echo "$digest" > "$stamp"
