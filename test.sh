#!/usr/bin/env bash
# Students:
#   ./test.sh 16                   grade module 16 on YOUR code; the answer key stands in only for
#                                  the modules 16 needs that you have not edited (never your code)
#   ./test.sh 16 --solve 11        the same, with 11's answer key too although you edited 11
#   ./test.sh 05 06                several modules (or 05,06); a mistyped id or option gets "did you mean"
#   ./test.sh                      (once you edited exercise files) grade the modules you worked on
#   ./test.sh --progress           table of every module in graph order (the last results when nothing
#                                  changed since; --progress --regrade runs the tests anyway)
#   ./test.sh --submit [--name N]  hand in: one zip of your edited exercise files and notebooks
#                                  (hand-in/g2c-NAME.zip; docs/teaching.md)
#   ./test.sh tests/test_nn.py     just `pytest tests/test_nn.py` on YOUR code (no solutions
#                                  applied unless you export G2C_APPLY_SOLUTIONS yourself)
# Authors and CI (the scaffolds are as generated, e.g. a clean clone):
#   ./test.sh                      the whole check (about 40 minutes on 2 quiet cores; it uses every
#                                  core): ruff, scaffold and notebook freshness, scaffold contract and
#                                  module graph, the rest of the suite with every solution applied,
#                                  every module's tests on a fake accelerator (--fake-device),
#                                  notebooks (solved twins)
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

# torch reads OMP_NUM_THREADS at start-up; a value that is not a whole number >= 1 is ignored by it with at
# most a libgomp warning (and a full check at torch's default runs 3-4x slower), so refuse it here.
if [ -n "${OMP_NUM_THREADS:-}" ] && ! [[ "$OMP_NUM_THREADS" =~ ^[1-9][0-9]*$ ]]; then
    echo "test.sh: OMP_NUM_THREADS must be a whole number >= 1 (torch threads per process), got '$OMP_NUM_THREADS'; unset it and ./test.sh chooses one share of the cores per process" >&2
    exit 2
fi

author=""
case "${1:-}" in
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { print substr($0, 3) }' "$0"; exit 0 ;;
    --progress|--regrade)     # --regrade goes with --progress, either order
        rest=()
        for arg in "$@"; do [ "$arg" = --progress ] || rest+=("$arg"); done
        exec env G2C_QUIET=1 G2C_FRONT=test.sh "$PY" -m g2c.course progress ${rest[@]+"${rest[@]}"} ;;   # bash 3.2 (macOS): set -u
    --submit) shift; exec env G2C_QUIET=1 G2C_FRONT=test.sh "$PY" -m g2c.course submit "$@" ;;
    --solve|--solve=*)       # ./test.sh --solve 11: the modules you edited, with 11's answer key too
        exec env G2C_QUIET=1 G2C_FRONT=test.sh "$PY" -m g2c.course grade "$@" ;;
    --author)
        author=1; shift
        if [ "$#" -gt 0 ]; then
            echo "test.sh: --author runs the whole check and takes nothing after it (not '$*'); pytest's options go after a test file: ./test.sh tests/test_nn.py -x" >&2
            exit 2
        fi ;;
esac

# `./test.sh ID [ID ...] [--solve ID]`: grade modules by id (the registry's ids: 03, 16, specdec, ...).
# A first argument that is neither an option nor a path is taken as an id (a typo then lists the valid ids;
# `progress` suggests --progress). The id route takes ids and --solve only: another option is refused there
# with the graded module's own test file to pass it with (G2C_FRONT: messages name ./test.sh, not python -m).
if [ "$#" -gt 0 ] && [[ "$1" != -* && "$1" != */* && "$1" != *.py* && ! -e "$1" ]]; then
    exec env G2C_QUIET=1 G2C_FRONT=test.sh "$PY" -m g2c.course grade "$@"
fi

if [ "$#" -gt 0 ]; then
    # A mistyped test.sh option (--progres, -progress, --sumbit) or one of its options after a test file would
    # reach pytest, whose answer is its own usage (or, for -progress, "plugin 'rogress' not found"): catch
    # those first, and pytest's options with no test file (./test.sh -v: the whole suite on your code, no
    # answer key) and a test file named without its folder. Standard library only (-I -S: milliseconds);
    # pytest's own options are never this close to test.sh's.
    "$PY" -I -S - "$@" <<'PYEOF' || exit 2
import difflib
import os
import sys

OWN = {"progress": "--progress", "regrade": "--progress --regrade", "submit": "--submit", "solve": "ID --solve ID",
       "author": "--author"}
for arg in sys.argv[1:]:
    if arg == "--":
        break
    if not arg.startswith("-"):
        continue
    if arg[1:].isdigit():             # ./test.sh -3: pytest would read an option
        sys.exit(f"test.sh: '{arg}' is not an option; module ids take no dash: ./test.sh {arg[1:].zfill(2)}")
    name = arg.lstrip("-").split("=")[0].lower()
    # one dash and several letters is pytest's short options run together (-vx): only the exact name counts
    hit = difflib.get_close_matches(name, OWN, n=1, cutoff=0.75) if arg.startswith("--") else [name] * (name in OWN)
    if hit:
        what = "is not an option" if arg != "--" + hit[0] else "is an option of test.sh, not of pytest"
        sys.exit(f"test.sh: '{arg}' {what}: did you mean ./test.sh {OWN[hit[0]]}? (./test.sh --help lists them; "
                 "anything else after a test file goes to pytest)")
words = [a for a in sys.argv[1:] if not a.startswith("-")]
if not any(os.path.exists(w.split("::")[0]) for w in words):
    for w in words:                   # ./test.sh test_nn.py: the file is in tests/
        found = [f"{d}/{w}" for d in ("tests", "tests/tooling") if os.path.exists(f"{d}/{w.split('::')[0]}")]
        if found:
            sys.exit(f"test.sh: no file '{w}' here; did you mean ./test.sh {found[0]}?")
    if not any(w.endswith(".py") or "/" in w or "::" in w for w in words):
        opts = " ".join(sys.argv[1:])
        sys.exit(f"test.sh: '{opts}' names no test file: pytest's options go after one (./test.sh tests/test_nn.py "
                 f"{opts}), and ./test.sh ID grades a module (./test.sh --help); ./test.sh tests {opts} runs every "
                 "test file on your code, with no answer key")
PYEOF
    exec "$PY" -m pytest "$@"
fi

# Each step prints the wall time since the full run started (SECONDS), so a slow step shows in CI logs.
step() { printf '\n==> [%dm%02ds] %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

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

# Every core: pytest-xdist runs test files side by side (-n, one worker per core; --dist loadfile keeps
# a file on one worker, so module-scoped fixtures are built once), and the contract runs its pytest
# processes (one per module) that many at a time (--jobs). Every test is xdist-safe: temporary files
# under tmp_path, repo copies under tmp_path_factory, hypothesis derandomized (no example database),
# no shared output file.
# Cores: the affinity mask capped by a container's CPU quota (g2c.course.progress.usable_cores).
read -r JOBS THREADS < <(G2C_QUIET=1 "$PY" -c 'from g2c.course.progress import usable_cores
n = usable_cores(); jobs = min(n, 8); print(jobs, max(1, n // jobs))') || true
JOBS="${JOBS:-1}" THREADS="${THREADS:-1}"
# One core's worth of torch threads per parallel process: torch's default (every core, in each of JOBS
# processes) oversubscribes the CPU, and OpenMP threads that wait on each other then spin (measured on a
# 2-core machine: the fake-device step took 38 min at the default, 9-14 min at one thread per worker). A
# value you set yourself is kept (g2c.course.progress.share_cores does the same for the scripts).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-$THREADS}"
XDIST=(-n "$JOBS" --dist loadfile)
if ! "$PY" -c 'import xdist' 2>/dev/null; then
    echo "test.sh: pytest-xdist is missing from .venv (run ./setup.sh again); the suite runs on one core" >&2
    XDIST=()
fi

step "scaffold contract: python scripts/contract.py --check --jobs $JOBS"
# Every test file on the untouched scaffolds: each module's files with exactly its prerequisites solved,
# the files no module owns (tooling) with nothing solved; the counts of tests/pristine.json.
env -u G2C_APPLY_SOLUTIONS "$PY" scripts/contract.py --check --jobs "$JOBS"

step "module graph: python scripts/contract.py --graph --solved-only --jobs $JOBS (each module's tests pass once it and its prerequisites are solved)"
# --graph's first run per module (prerequisites solved -> pristine counts) is the run --check just made, so
# only its second run goes here (--solved-only): each module's files with the module and its prerequisites
# solved, every test must pass. That is also the module files' "suite with solutions": the code under
# test is the answer key, as under G2C_APPLY_SOLUTIONS=all (every module), and a test that needed a module outside its
# graph would fail here; so the suite step below does not run the module files again.
env -u G2C_APPLY_SOLUTIONS "$PY" scripts/contract.py --graph --solved-only --jobs "$JOBS"

# The test files no module owns (tooling, ...) whose pristine record has failures: they need the answer
# key to pass. An unowned file that passes in full on the untouched scaffolds (--check above, nothing
# solved) tests provided code only, by the contract's own rule, so the answer key cannot change it.
mapfile -t rest < <("$PY" - <<'PYEOF'
import json
from pathlib import Path

from g2c.course import MODULES

owned = {t for m in MODULES for t in m.tests}
pristine = json.loads(Path("tests/pristine.json").read_text(encoding="utf-8"))
for f in sorted(p.as_posix() for p in Path("tests").rglob("test_*.py")):
    if f not in owned and pristine.get(f, {}).get("failed", 1) > 0:
        print(f)
PYEOF
)
if [ "${#rest[@]}" -gt 0 ]; then
    step "the rest of the suite with solutions: G2C_APPLY_SOLUTIONS=all pytest ${rest[*]}"
    # The author run replaces any edited exercise file with the answer key on purpose.
    G2C_APPLY_SOLUTIONS=all G2C_QUIET=1 G2C_REPLACE_EDITED=1 "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" \
        "${rest[@]}"
fi

step "every device, without one: G2C_APPLY_SOLUTIONS=all pytest --fake-device (every module's tests; own_device tests skipped)"
# Parameters on the fake accelerator of tests/device_mocks.py: device mixing, float64 and ops MPS
# lacks raise inside the course's code (the file list: FAKE_DEVICE_FILES in tests/conftest.py).
G2C_APPLY_SOLUTIONS=all G2C_QUIET=1 G2C_REPLACE_EDITED=1 "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" \
    --fake-device tests --ignore=tests/tooling

step "data for the notebooks: ./datasets.sh (idempotent)"
# The specdec notebook trains an MTP head on the training split. Without $G2C_TINYSTORIES this
# prepares the TinyStories sample shipped in artifacts/ (offline); prepared data is kept.
./datasets.sh

step "notebooks: python scripts/run_notebooks.py --jobs $JOBS (solved twins, solutions applied, G2C_QUICK=1)"
"$PY" scripts/run_notebooks.py --jobs "$JOBS"

step "done: every check passed"
