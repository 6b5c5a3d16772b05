#!/usr/bin/env bash
# Verify, install or retrain the shipped artifacts (see g2c/assets/checkpoints.py). Examples:
#   ./checkpoints.sh                      verify the StoryTokenizer and the StoryLM ladder
#   ./checkpoints.sh --from DIR           install from a mirror laid out like artifacts/
#   ./checkpoints.sh --train StoryLM-1M   retrain one model
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || { echo "checkpoints.sh: .venv is missing: run ./setup.sh first" >&2; exit 1; }
G2C_QUIET=1 exec .venv/bin/python -m g2c.assets.checkpoints "$@"
