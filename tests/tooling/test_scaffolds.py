"""The scaffold generator and its freshness check (CONVENTIONS §2)."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from g2c.course import REPO_ROOT, prerequisites

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


def _message(rel: str) -> str:
    namespace: dict = {}
    exec(compile(scaffolds.scaffold_text("def f():\n    # BEGIN SOLUTION\n    return 1\n    # END SOLUTION\n", rel),
                 rel, "exec"), namespace)
    with pytest.raises(NotImplementedError) as exc:
        namespace["f"]()
    return str(exc.value)


def test_scaffold_text_message_names_module_and_qualname():
    namespace: dict = {}
    exec(compile(scaffolds.scaffold_text(SOLUTION, REL), REL, "exec"), namespace)
    with pytest.raises(NotImplementedError, match=r"^module 03: Thing\.forward in g2c/nn/layers\.py is not implemented "
                                                  r"yet\. Write it \(see docs/modules/03-nn\.md\)"):
        namespace["Thing"]().forward(1)
    with pytest.raises(NotImplementedError, match=r"^module 03: top in g2c/nn/layers\.py"):
        namespace["top"](1)
    assert namespace["helper"](1) == 2


@pytest.mark.parametrize("rel, module", [
    ("g2c/sampling/generate.py", "11"),
    ("g2c/transformer/model.py", "09"),
    ("g2c/pretraining/objective.py", "09b"),
    ("g2c/training/adamw.py", "03b"),
    ("g2c/specdec/verify.py", "specdec"),
    ("g2c/specdec/trees/attention.py", "specdec-trees"),
])
def test_scaffold_message_names_the_grading_command_and_no_selector(rel, module):
    msg = _message(rel)
    assert msg.startswith(f"module {module}: ")
    assert f"grade module {module} with ./test.sh {module}" in msg
    assert "G2C_APPLY_SOLUTIONS" not in msg and "--apply" not in msg   # a selector could name an edited module
    needs = prerequisites(module)
    if needs:
        assert f"the modules it needs ({', '.join(needs)}) except those you edited" in msg
    else:
        assert "builds on no other module" in msg


def test_scaffold_lines_fit_ruff_line_length():
    for sol in sorted((REPO_ROOT / "solutions" / "g2c").rglob("*.py")):
        rel = sol.relative_to(REPO_ROOT / "solutions").as_posix()
        for line in scaffolds.scaffold_text(sol.read_text(encoding="utf-8"), rel).splitlines():
            assert len(line) <= 120, (rel, line)


def test_scaffold_text_keeps_everything_outside_markers():
    out = scaffolds.scaffold_text(SOLUTION, REL)
    kept = [line for line in SOLUTION.splitlines()]
    start = kept.index("        # BEGIN SOLUTION")
    # the student's first line is the module docstring; the lint relaxation follows it
    assert out.splitlines()[0] == kept[0] == '"""A docstring that stays."""'
    assert out.splitlines()[1] == scaffolds.LINT.rstrip("\n")
    assert out.splitlines()[2:start + 1] == kept[1:start]
    assert out.endswith("    )\n")
    assert scaffolds.scaffold_text("x = 1\n", REL) == scaffolds.LINT + "x = 1\n"   # no docstring: first


def test_every_shipped_scaffold_opens_with_its_module_docstring():
    for path, text in scaffolds.expected().items():
        assert text.startswith('"""'), f"{path} does not open with its docstring"
        assert scaffolds.LINT in text


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


def test_scaffolds_regenerates_a_previous_generation_without_force(tmp_repo):
    assert _run(tmp_repo).returncode == 0
    sol = tmp_repo / "solutions" / REL
    sol.write_text(sol.read_text().replace("return x + 1", "return x + 2"))  # the answer key moves on
    proc = _run(tmp_repo)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_repo / REL).read_text() == scaffolds.scaffold_text(sol.read_text(), REL)
    assert not (tmp_repo / ".g2c-backup").exists()


def test_scaffolds_never_overwrites_an_edited_file_without_force(tmp_repo):
    assert _run(tmp_repo).returncode == 0
    mine = (tmp_repo / REL).read_text().replace("raise NotImplementedError(", "return x * 2  # mine\n        (", 1)
    (tmp_repo / REL).write_text(mine)
    proc = _run(tmp_repo)
    assert proc.returncode == 1
    assert "not overwritten" in proc.stderr and "g2c/nn/layers.py  (module 03)" in proc.stderr
    assert "--force" in proc.stderr
    assert (tmp_repo / REL).read_text() == mine
    check = _run(tmp_repo, "--check")
    assert check.returncode == 1 and "edited by hand" in check.stderr
    assert (tmp_repo / REL).read_text() == mine

    forced = _run(tmp_repo, "--force")
    assert forced.returncode == 0, forced.stderr
    backups = list((tmp_repo / ".g2c-backup").rglob("layers.py"))
    assert len(backups) == 1 and backups[0].read_text() == mine
    assert backups[0].relative_to(tmp_repo).as_posix() in forced.stdout  # says where
    assert (tmp_repo / REL).read_text() == scaffolds.scaffold_text(SOLUTION, REL)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_scaffolds_unrecorded_file_equal_to_git_head_is_a_previous_generation(tmp_repo):
    # a module merged from a branch that predates the record: its committed scaffold is replaceable
    assert _run(tmp_repo).returncode == 0
    (tmp_repo / "solutions" / "generated.json").write_text("{}\n")
    old = (tmp_repo / REL).read_text() + "# an older generation\n"
    (tmp_repo / REL).write_text(old)
    git = ["git", "-C", str(tmp_repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-q", "-m", "old"], check=True)
    proc = _run(tmp_repo)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_repo / REL).read_text() == scaffolds.scaffold_text(SOLUTION, REL)
    # ... while a recorded file edited after the commit stays protected
    (tmp_repo / REL).write_text("mine\n")
    assert _run(tmp_repo).returncode == 1 and (tmp_repo / REL).read_text() == "mine\n"


def test_scaffolds_record_of_the_generation_is_checked(tmp_repo):
    assert _run(tmp_repo).returncode == 0
    (tmp_repo / "solutions" / "generated.json").write_text("{}\n")
    proc = _run(tmp_repo, "--check")
    assert proc.returncode == 1 and "solutions/generated.json" in proc.stderr


def test_shipped_record_matches_the_scaffolds():
    from g2c.course.scaffolds import read_record, status

    assert read_record(), "solutions/generated.json is missing: run python scripts/scaffolds.py"
    assert {s.state for s in status()} <= {"fresh", "edited"}


def test_scaffolds_check_reports_missing_scaffold(tmp_repo):
    proc = _run(tmp_repo, "--check")
    assert proc.returncode == 1
    assert "g2c/nn/layers.py" in proc.stderr
