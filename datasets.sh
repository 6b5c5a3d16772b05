#!/usr/bin/env bash
# Prepare TinyStories under data/tinystories (see g2c/assets/data.py). Examples:
#   ./datasets.sh                     the TinyStories sample shipped in artifacts/ (offline)
#   ./datasets.sh --from FILE.txt.xz  a local copy (or set G2C_TINYSTORIES)
#   ./datasets.sh --hub --tiny        the first 10,000 stories from Hugging Face
set -euo pipefail
cd "$(dirname "$0")"
[ -x .venv/bin/python ] || { echo "datasets.sh: .venv is missing: run ./setup.sh first" >&2; exit 1; }
G2C_QUIET=1 exec .venv/bin/python -m g2c.assets.data "$@"
