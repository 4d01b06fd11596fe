#!/usr/bin/env bash
# Run the OpenAI-compatible speech server (sets up .venv with the runtime dependencies first).
# Extra args go to `serve`, e.g. scripts/serve.sh --model model-base/NAME --port 8100 --api-key KEY
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh runtime
exec .venv/bin/python -m qwen3_tts_gguf serve "$@"
