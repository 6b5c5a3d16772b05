#!/usr/bin/env bash
# Students:
#   ./test.sh 16                   grade module 16 on YOUR code; the answer key stands in only for
#                                  the modules 16 needs that you have not edited (never your code)
#   ./test.sh 16 --solve 11        the same, with 11's answer key too although you edited 11
#   ./test.sh                      (once you edited exercise files) grade the modules you worked on
#   ./test.sh --progress           table of every module in graph order
#   ./test.sh --submit [--name N]  hand in: one zip of your edited exercise files and notebooks
#                                  (hand-in/g2c-NAME.zip; docs/teaching.md)
#   ./test.sh tests/test_nn.py     just `pytest tests/test_nn.py` on YOUR code (no solutions
#                                  applied unless you export G2C_APPLY_SOLUTIONS yourself)
# Authors and CI (the scaffolds are as generated, e.g. a clean clone):
#   ./test.sh                      the whole check: ruff, scaffold and notebook freshness, scaffold
#                                  contract, full suite with every solution applied, every module's
#                                  tests on a fake accelerator (--fake-device), notebooks
#                                  (solved twins)
#   ./test.sh --author             the whole check even with edited exercise files
set -euo pipefail
cd "$(dirname "$0")"

PY=.venv/bin/python
if [ ! -x "$PY" ]; then
    echo "test.sh: .venv is missing; run ./setup.sh first" >&2
    exit 1
fi

if [ -f artifacts/.require ]; then
    export G2C_REQUIRE_ARTIFACTS=1
fi

author=""
case "${1:-}" in
    --progress) exec env G2C_QUIET=1 "$PY" -m g2c.course progress ;;
    --submit) shift; exec env G2C_QUIET=1 "$PY" -m g2c.course submit "$@" ;;
    --author) author=1; shift ;;
esac

# `./test.sh ID [ID ...] [--solve ID]`: grade modules by id (the registry's ids: 03, 16, specdec, ...).
# A first argument that is neither an option nor a path is taken as an id (a typo then lists the valid ids).
if [ "$#" -gt 0 ] && [[ "$1" != -* && "$1" != */* && "$1" != *.py* && ! -e "$1" ]]; then
    exec env G2C_QUIET=1 "$PY" -m g2c.course grade "$@"
fi

if [ "$#" -gt 0 ]; then
    exec "$PY" -m pytest "$@"
fi

step() { printf '\n==> %s\n' "$*"; }

if [ -z "$author" ]; then
    worked="$(G2C_QUIET=1 "$PY" -m g2c.course worked)"
    if [ -n "$worked" ]; then
        echo "student mode: you edited exercise files of module(s) ${worked// /, }; skipping the author-only" \
             "checks (ruff, scaffold freshness, notebook freshness, scaffold contract, suite with solutions, notebooks; ./test.sh --author runs them)"
        step "your modules on your own code: python -m g2c.course grade ${worked}"
        # shellcheck disable=SC2086
        exec env G2C_QUIET=1 "$PY" -m g2c.course grade $worked
    fi
fi

step "ruff check ."
"$PY" -m ruff check .

step "scaffold freshness: python scripts/scaffolds.py --check"
"$PY" scripts/scaffolds.py --check

step "notebook freshness: python scripts/notebooks/build.py --check"
"$PY" scripts/notebooks/build.py --check

step "scaffold contract: python scripts/contract.py --check"
env -u G2C_APPLY_SOLUTIONS "$PY" scripts/contract.py --check

step "module graph: python scripts/contract.py --graph (each module's tests pass once it and its prerequisites are solved)"
env -u G2C_APPLY_SOLUTIONS "$PY" scripts/contract.py --graph

step "full suite with solutions: G2C_APPLY_SOLUTIONS=all pytest"
# The author run replaces any edited exercise file with the answer key on purpose.
G2C_APPLY_SOLUTIONS=all G2C_QUIET=1 G2C_REPLACE_EDITED=1 "$PY" -m pytest -q -p no:cacheprovider

step "every device, without one: G2C_APPLY_SOLUTIONS=all pytest --fake-device (every module's tests; own_device tests skipped)"
# Parameters on the fake accelerator of tests/device_mocks.py: device mixing, float64 and ops MPS
# lacks raise inside the course's code (the file list: FAKE_DEVICE_FILES in tests/conftest.py).
G2C_APPLY_SOLUTIONS=all G2C_QUIET=1 G2C_REPLACE_EDITED=1 "$PY" -m pytest -q -p no:cacheprovider --fake-device tests --ignore=tests/tooling

step "data for the notebooks: ./datasets.sh (idempotent)"
# The specdec notebook trains an MTP head on the training split. Without $G2C_TINYSTORIES this
# prepares the TinyStories sample shipped in artifacts/ (offline); prepared data is kept.
./datasets.sh

step "notebooks: python scripts/run_notebooks.py (solved twins, solutions applied, G2C_QUICK=1)"
"$PY" scripts/run_notebooks.py
