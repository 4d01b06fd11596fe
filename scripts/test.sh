#!/usr/bin/env bash
# Run the linter, then the test suite (sets up .venv with test dependencies first). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup_env.sh test
# lint and import order first (pyproject.toml's [tool.ruff]; about a second): a finding fails the run before the tests
.venv/bin/python -m ruff check --quiet .
exec .venv/bin/python -m pytest -q "$@"
