"""A copy of the repository in a temporary folder, as a fresh clone would have it (tests only).

No ``.git``, ``.venv``, ``data/``, working notebooks or backups; ``.venv`` is a link to the
interpreter running the tests, so ``./setup.sh``-made entry points (``./test.sh``,
``./datasets.sh``) work there. Nothing beside the copy: no sibling ``shared/``.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent.parent
IGNORED = (".git", ".venv", "data", "runs", ".g2c-cache", "__pycache__", ".pytest_cache", ".ruff_cache", ".hypothesis",
           "*.egg-info", ".ipynb_checkpoints", ".g2c-backup", "work")


def copy_repo(parent: Path) -> Path:
    repo = Path(parent) / "g2c"
    shutil.copytree(REPO_ROOT, repo, ignore=shutil.ignore_patterns(*IGNORED), symlinks=True)
    (repo / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return repo


def own_artifacts(repo: Path) -> None:
    """A copy of this checkout's ``artifacts/`` (about 120 MB) in ``repo``, for a copy a class is graded in.

    Real files, not a link: grade-class watches the teacher's artifacts, and the other test files of a parallel
    run (the contract check's second pytest process) may touch this checkout's ``artifacts/`` while a class is
    graded, which the watch rightly reads as the teacher's environment changing, and stops the class. Not hard
    links either: a link shares its change time (and an owner set for uid 65534) with the original."""
    src = REPO_ROOT / "artifacts"
    if src.is_dir():
        shutil.copytree(src, Path(repo) / "artifacts", symlinks=True)


def env_for(repo: Path, **extra: str) -> dict[str, str]:
    """The environment of a command in the copy: its own ``g2c``, no solutions, no local corpus, and
    none of the author run's overrides (``G2C_REPLACE_EDITED``): it runs as a student's shell would."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("G2C_TINYSTORIES", "G2C_APPLY_SOLUTIONS", "G2C_REQUIRE_ARTIFACTS", "G2C_REPLACE_EDITED")}
    env.update(PYTHONPATH=str(repo), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", **extra)
    return env
