#!/usr/bin/env bash
# Open a module's notebook in Jupyter, working on your own copy under notebooks/work/.
#   ./notebook.sh <id> [--fresh] [--apply SEL] [--solutions[=SEL]] [--no-launch] [--execute]
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
    echo "notebook.sh: .venv is missing; run ./setup.sh first" >&2
    exit 1
fi
exec .venv/bin/python -m g2c.course.notebooks "$@"
