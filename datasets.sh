#!/usr/bin/env bash
# Prepare TinyStories under data/tinystories (see g2c/assets/data.py). Example:
#   ./datasets.sh --tiny --from ../shared/data/tinystories/tinystories-collected.txt.xz
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || { echo "datasets.sh: .venv is missing: run ./setup.sh first" >&2; exit 1; }
G2C_QUIET=1 exec .venv/bin/python -m g2c.assets.data "$@"
