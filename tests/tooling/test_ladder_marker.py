"""The `ladder` marker (CONVENTIONS §3): skip without artifacts, fail under G2C_REQUIRE_ARTIFACTS=1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LADDER_MISSING, ladder_artifacts

REPO_ROOT = Path(__file__).resolve().parent.parent.parent

LADDER_TEST = '''
import pytest

@pytest.fixture(scope="module")
def model():
    raise AssertionError("a module-scoped fixture ran before the ladder check")

@pytest.mark.ladder
def test_needs_ladder(model):
    pass

def test_plain():
    pass
'''


@pytest.fixture
def tmp_suite(tmp_path: Path) -> Path:
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_bytes((REPO_ROOT / "tests" / "conftest.py").read_bytes())
    (tmp_path / "tests" / "test_x.py").write_text(LADDER_TEST)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    ladder: needs the ladder\n")
    return tmp_path


def _pytest(root: Path, **env_extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "G2C_REQUIRE_ARTIFACTS"}
    env.update(env_extra)
    return subprocess.run([sys.executable, "-m", "pytest", "-rsfE", "-p", "no:cacheprovider", "tests"],
                          cwd=root, env=env, capture_output=True, text=True, timeout=120)


def test_ladder_marker_skips_with_fetch_command_when_missing(tmp_suite):
    proc = _pytest(tmp_suite)
    assert proc.returncode == 0, proc.stdout
    assert "1 passed, 1 skipped" in proc.stdout
    assert LADDER_MISSING in proc.stdout
    assert "./checkpoints.sh" in proc.stdout


def test_ladder_marker_fails_when_artifacts_required(tmp_suite):
    proc = _pytest(tmp_suite, G2C_REQUIRE_ARTIFACTS="1")
    assert proc.returncode == 1
    assert "skipped" not in proc.stdout.splitlines()[-1]
    assert "1 passed, 1 error" in proc.stdout
    assert LADDER_MISSING in proc.stdout


def test_ladder_marker_runs_when_artifacts_present(tmp_suite):
    for name in ladder_artifacts():
        path = tmp_suite / "artifacts" / "models" / name / "model.safetensors"
        path.parent.mkdir(parents=True)
        path.write_bytes(b"")
    proc = _pytest(tmp_suite, G2C_REQUIRE_ARTIFACTS="1")
    # The check passed, so the (deliberately failing) module fixture ran.
    assert "a module-scoped fixture ran before the ladder check" in proc.stdout
    assert LADDER_MISSING not in proc.stdout
