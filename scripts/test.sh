#!/usr/bin/env bash
# Set up (as scripts/setup.sh --test) and run the default test suite (slow tests excluded).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --test
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec .venv/bin/python -m pytest -q -m "not slow" "$@"
