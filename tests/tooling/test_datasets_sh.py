"""The shell entry points ``./datasets.sh`` and ``./checkpoints.sh`` start and explain themselves."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.parametrize("script, words", [
    ("datasets.sh", ("--tiny", "--from", "--hub", "--force", "G2C_TINYSTORIES", "TinyStories-sample")),
    ("checkpoints.sh", ("--train", "--from", "--force", "G2C_ARTIFACTS_URL")),
])
def test_script_help_exits_zero(script, words):
    res = subprocess.run([str(REPO_ROOT / script), "--help"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: ./{script}")
    for word in words:
        assert word in res.stdout
