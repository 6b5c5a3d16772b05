"""The scaffold generator and its freshness check (CONVENTIONS §2)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from g2c.course import REPO_ROOT

_spec = importlib.util.spec_from_file_location("g2c_scaffolds_script", REPO_ROOT / "scripts" / "scaffolds.py")
scaffolds = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(scaffolds)

REL = "g2c/nn/layers.py"  # owned by module 03

SOLUTION = textwrap.dedent('''\
    """A docstring that stays."""

    import math


    def helper(x):
        return x + 1


    class Thing:
        """Provided class."""

        def forward(self, x):
            """Exercise text."""
            # BEGIN SOLUTION
            y = helper(x)
            return math.sqrt(y)
            # END SOLUTION


    def top(x):
        # BEGIN SOLUTION
        return x * 2
        # END SOLUTION
    ''')


def test_scaffold_text_replaces_marked_blocks_keeping_indent():
    out = scaffolds.scaffold_text(SOLUTION, REL)
    lines = out.splitlines()
    i = lines.index("        # TODO: implement this (module 03, see docs/modules/03-nn.md).")
    assert lines[i + 1] == "        raise NotImplementedError("
    j = lines.index("    # TODO: implement this (module 03, see docs/modules/03-nn.md).")
    assert lines[j + 1] == "    raise NotImplementedError("
    assert "BEGIN SOLUTION" not in out and "END SOLUTION" not in out
    assert "math.sqrt" not in out and "x * 2" not in out


def test_scaffold_text_message_names_module_and_qualname():
    out = scaffolds.scaffold_text(SOLUTION, REL)
    assert "module 03: Thing.forward in g2c/nn/layers.py is not implemented yet." in out
    assert "module 03: top in g2c/nn/layers.py" in out
    assert "G2C_APPLY_SOLUTIONS=03" in out


def test_scaffold_text_raises_not_implemented_when_run():
    namespace: dict = {}
    exec(compile(scaffolds.scaffold_text(SOLUTION, REL), REL, "exec"), namespace)
    with pytest.raises(NotImplementedError, match=r"module 03: Thing\.forward .*G2C_APPLY_SOLUTIONS=03"):
        namespace["Thing"]().forward(1)
    assert namespace["helper"](1) == 2


def test_scaffold_text_keeps_everything_outside_markers():
    out = scaffolds.scaffold_text(SOLUTION, REL)
    kept = [line for line in SOLUTION.splitlines()]
    start = kept.index("        # BEGIN SOLUTION")
    assert out.splitlines()[0] == scaffolds.HEADER.rstrip("\n")   # the generated-file lint header
    assert out.splitlines()[1:start + 1] == kept[:start]
    assert out.endswith("    )\n")
    assert scaffolds.scaffold_text("x = 1\n", REL) == scaffolds.HEADER + "x = 1\n"


@pytest.mark.parametrize("bad", [
    "def f():\n    # BEGIN SOLUTION\n    return 1\n",
    "def f():\n    return 1\n    # END SOLUTION\n",
    "def f():\n    # BEGIN SOLUTION\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n",
])
def test_scaffold_text_unbalanced_markers_exit(bad):
    with pytest.raises(SystemExit, match=r"solutions/g2c/nn/layers\.py:\d+"):
        scaffolds.scaffold_text(bad, REL)


def test_scaffold_text_unowned_file_exits():
    with pytest.raises(SystemExit, match=r"no course module owns"):
        scaffolds.scaffold_text("x = 1\n", "g2c/not_registered.py")


@pytest.fixture
def tmp_repo(tmp_path: Path) -> Path:
    """A minimal copy of the repo: the registry, the generator and one solution file."""
    course = [f"g2c/course/{p.name}" for p in (REPO_ROOT / "g2c/course").glob("*.py")]
    for rel in ("g2c/__init__.py", *course, "scripts/scaffolds.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / rel, tmp_path / rel)
    sol = tmp_path / "solutions" / REL
    sol.parent.mkdir(parents=True)
    sol.write_text(SOLUTION)
    return tmp_path


def _run(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "scripts/scaffolds.py", *args], cwd=root,
                          capture_output=True, text=True, timeout=60)


def test_scaffolds_generate_then_check_passes(tmp_repo):
    assert _run(tmp_repo).returncode == 0
    assert (tmp_repo / REL).read_text() == scaffolds.scaffold_text(SOLUTION, REL)
    proc = _run(tmp_repo, "--check")
    assert proc.returncode == 0, proc.stderr
    assert "up to date" in proc.stdout


def test_scaffolds_check_names_stale_file_and_regenerate_command(tmp_repo):
    assert _run(tmp_repo).returncode == 0
    sol = tmp_repo / "solutions" / REL
    sol.write_text(sol.read_text().replace("return x + 1", "return x + 2"))  # edit, don't regenerate
    proc = _run(tmp_repo, "--check")
    assert proc.returncode == 1
    assert "g2c/nn/layers.py" in proc.stderr
    assert "python scripts/scaffolds.py" in proc.stderr
    # --check writes nothing: the scaffold still matches the old solution
    assert (tmp_repo / REL).read_text() != scaffolds.scaffold_text(sol.read_text(), REL)


def test_scaffolds_check_reports_missing_scaffold(tmp_repo):
    proc = _run(tmp_repo, "--check")
    assert proc.returncode == 1
    assert "g2c/nn/layers.py" in proc.stderr
