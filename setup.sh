#!/usr/bin/env bash
# Install g2c and everything it needs into ./.venv. Safe to run again: a second run
# only checks that the requirements are already satisfied.
#
# Torch: on Linux this runs `pip install torch==2.13.0` from PyPI, which on this
# project's machines serves the CPU wheel. On a Linux box where PyPI would give the
# multi-GB CUDA build and you have no GPU, point G2C_TORCH_INDEX at the CPU index:
#     G2C_TORCH_INDEX=https://download.pytorch.org/whl/cpu ./setup.sh
# On macOS the normal wheel (CPU + MPS) installs.
set -euo pipefail
cd "$(dirname "$0")"

TORCH_VERSION="2.13.0"

# A read-only checkout made pip fail half-way (an OSError deep in an editable install): probe first, with a real
# file (root passes permission bits on a read-only mount), and say what to do.
writable() {
    local probe
    probe=$(mktemp "$1/.g2c-probe.XXXXXX" 2>/dev/null) || return 1
    rm -f "$probe"
}
for dir in . .venv; do
    if [ -d "$dir" ] && ! writable "$dir"; then
        echo "setup.sh: cannot write $(cd "$dir" && pwd): setup installs into .venv/ and g2c.egg-info/ inside the" \
             "checkout; make it writable (chmod -R u+w '$(pwd)') or copy the checkout somewhere writable and run" \
             "./setup.sh there" >&2
        exit 1
    fi
done

if [ ! -x .venv/bin/python ]; then
    PY="${PYTHON:-python3}"
    if ! "$PY" -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else 1)'; then
        echo "setup.sh: g2c needs Python >= 3.11; found $("$PY" --version 2>&1). Set PYTHON=/path/to/python3.11" >&2
        exit 1
    fi
    echo "==> creating .venv with $("$PY" --version 2>&1)"
    "$PY" -m venv .venv
fi

PIP=(.venv/bin/python -m pip --disable-pip-version-check)
echo "==> upgrading pip"
"${PIP[@]}" install -q --upgrade pip

if [ "$(uname -s)" = "Linux" ] && ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "==> installing torch==${TORCH_VERSION} (CPU)"
    if [ -n "${G2C_TORCH_INDEX:-}" ]; then
        "${PIP[@]}" install -q "torch==${TORCH_VERSION}" --index-url "$G2C_TORCH_INDEX"
    else
        "${PIP[@]}" install -q "torch==${TORCH_VERSION}"
    fi
fi

echo "==> installing g2c (editable) with dev extras"
"${PIP[@]}" install -q -e ".[dev]"

echo "setup done. Check your module: ./test.sh 03 (module 03, on your code; any module id works) or ./test.sh --progress (all modules); README: Check your module"
