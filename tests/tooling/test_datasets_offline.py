"""A fresh copy of the repository prepares TinyStories offline, from the sample it ships.

The copy has no ``data/``, no sibling ``shared/`` and no ``$G2C_TINYSTORIES``: ``./datasets.sh``
must fall back to the verified corpus artifact ``artifacts/corpora/TinyStories-sample``.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from repo_copy import REPO_ROOT, copy_repo, env_for

SHARED = "../" + "shared"  # spelled in two parts so this file does not match its own scan


@pytest.fixture(scope="module")
def fresh_copy(tmp_path_factory) -> Path:
    parent = tmp_path_factory.mktemp("clone")
    repo = copy_repo(parent)
    assert not (parent / "shared").exists() and not (repo / "data").exists()
    return repo


def datasets_sh(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["./datasets.sh", *args], cwd=repo, env=env_for(repo), capture_output=True, text=True,
                          timeout=600)


def test_datasets_sh_in_a_fresh_copy_uses_the_shipped_sample(fresh_copy):
    first = datasets_sh(fresh_copy)
    assert first.returncode == 0, first.stderr
    manifest = json.loads((fresh_copy / "data" / "tinystories" / "manifest.json").read_text())
    assert manifest["source"]["kind"] == "artifact" and manifest["source"]["name"] == "TinyStories-sample"
    # the 8,051 stories of the sample split by the story hash rule: 7,639 train / 412 validation
    assert (manifest["train_stories"], manifest["val_stories"]) == (7639, 412)
    assert "from the shipped TinyStories-sample artifact" in first.stdout
    assert "token streams ready" in first.stdout  # the StoryTokenizer ships too, so the cache is built
    for split in ("train", "val"):
        assert (fresh_copy / "data" / "tinystories" / f"{split}.bin").stat().st_size > 0
    for args in ((), ("--tiny",)):  # the seed's command, and again: nothing to do, rc 0
        again = datasets_sh(fresh_copy, *args)
        assert again.returncode == 0, again.stderr
        assert "nothing to do" in again.stdout


def test_datasets_sh_hub_is_explicit_and_fails_clearly_offline(fresh_copy):
    res = datasets_sh(fresh_copy, "--hub", "--tiny", "--force")
    if res.returncode == 0:
        pytest.skip("this machine reaches the Hugging Face hub")
    assert res.returncode == 1
    assert "--hub: the Hugging Face hub is unreachable" in res.stderr and "--from PATH" in res.stderr


def test_nothing_the_checks_run_reads_the_shared_folder():
    paths = [REPO_ROOT / p for p in ("setup.sh", "test.sh", ".ci/run", "datasets.sh", "checkpoints.sh",
                                     "notebook.sh")]
    for folder, pattern in (("g2c", "*.py"), ("scripts", "*.py"), ("tests", "*.py"), ("bench", "*.py"),
                            ("notebooks/clean", "*.ipynb"), ("solutions", "*.py")):
        paths += sorted((REPO_ROOT / folder).rglob(pattern))
    offenders = [p.relative_to(REPO_ROOT).as_posix() for p in paths
                 if p.is_file() and re.search(re.escape(SHARED) + "/", p.read_text(encoding="utf-8", errors="replace"))]
    assert not offenders, f"these read {SHARED}/ (a course-machine folder absent from a fresh clone): {offenders}"
