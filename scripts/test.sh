#!/usr/bin/env bash
# Run the test suite (sets up .venv with test dependencies first). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh test
exec .venv/bin/python -m pytest -q "$@"
