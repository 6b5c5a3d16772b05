#!/usr/bin/env bash
# The whole check, as CI runs it:
#   ./test.sh                      ruff, scaffold freshness, scaffold contract,
#                                  full suite with every solution applied, clean notebooks
#   ./test.sh tests/test_nn.py     just `pytest tests/test_nn.py` on YOUR code
#                                  (student mode: no solutions applied unless you
#                                  export G2C_APPLY_SOLUTIONS yourself)
set -euo pipefail
cd "$(dirname "$0")"

PY=.venv/bin/python
if [ ! -x "$PY" ]; then
    echo "test.sh: .venv is missing; run ./setup.sh first" >&2
    exit 1
fi

if [ "$#" -gt 0 ]; then
    exec "$PY" -m pytest "$@"
fi

if [ -f artifacts/.require ]; then
    export G2C_REQUIRE_ARTIFACTS=1
fi

step() { printf '\n==> %s\n' "$*"; }

step "ruff check ."
"$PY" -m ruff check .

step "scaffold freshness: python scripts/scaffolds.py --check"
"$PY" scripts/scaffolds.py --check

step "scaffold contract: python scripts/contract.py --check"
env -u G2C_APPLY_SOLUTIONS "$PY" scripts/contract.py --check

step "full suite with solutions: G2C_APPLY_SOLUTIONS=all pytest"
G2C_APPLY_SOLUTIONS=all G2C_QUIET=1 "$PY" -m pytest -q -p no:cacheprovider

step "data for the notebooks: ./datasets.sh (idempotent)"
# The specdec notebook trains an MTP head on the training split. Without $G2C_TINYSTORIES this
# prepares the TinyStories sample shipped in artifacts/ (offline); prepared data is kept.
./datasets.sh

step "notebooks: python scripts/run_notebooks.py (solutions applied, G2C_QUICK=1)"
"$PY" scripts/run_notebooks.py
