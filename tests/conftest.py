"""Shared test configuration.

Tests that need the trained StoryLM ladder carry ``@pytest.mark.ladder``. When the
artifacts are missing they skip with a message naming the command that fetches them; with
``G2C_REQUIRE_ARTIFACTS=1`` (CI, once the artifacts ship) they fail instead.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from g2c.transformer.config import LADDER as LADDER_CONFIGS

REPO_ROOT = Path(__file__).resolve().parent.parent
LADDER = tuple(LADDER_CONFIGS)  # names, from the one definition in module 09
LADDER_MISSING = (
    "StoryLM ladder artifacts missing: run ./checkpoints.sh (or ./checkpoints.sh --train to retrain)"
)


def ladder_paths(root: Path = REPO_ROOT) -> list[Path]:
    """The weight files every ladder test needs."""
    return [root / "artifacts" / "models" / name / "model.safetensors" for name in LADDER]


def require_ladder(root: Path = REPO_ROOT) -> None:
    """Skip (or fail, under ``G2C_REQUIRE_ARTIFACTS=1``) unless the StoryLM ladder is present."""
    missing = [p for p in ladder_paths(root) if not p.is_file()]
    if not missing:
        return
    msg = f"{LADDER_MISSING} (not found: {', '.join(p.relative_to(root).as_posix() for p in missing)})"
    if os.environ.get("G2C_REQUIRE_ARTIFACTS", "") == "1":
        pytest.fail(msg, pytrace=False)
    pytest.skip(msg)


def pytest_runtest_setup(item: pytest.Item) -> None:
    # A hook rather than a fixture: it runs before any (module-scoped) fixture loads a model.
    if item.get_closest_marker("ladder") is not None:
        require_ladder()
