"""``scripts/new_module.py``: a new module in one command, passing freshness and contract checks."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from g2c.course import REPO_ROOT

_spec = importlib.util.spec_from_file_location("g2c_new_module_script", REPO_ROOT / "scripts" / "new_module.py")
new_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(new_module)


@pytest.fixture
def tmp_repo(tmp_path: Path) -> Path:
    """The registry, hook, scripts and one module's files: enough for scaffolds and contract."""
    for rel in ["g2c/__init__.py", "scripts/scaffolds.py", "scripts/contract.py", "scripts/new_module.py",
                *(p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "g2c" / "course").glob("*.py"))]:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / rel, tmp_path / rel)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "pristine.json").write_text("{}\n")
    return tmp_path


def _run(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "G2C_APPLY_SOLUTIONS"}
    env["PYTHONPATH"] = str(root)
    return subprocess.run([sys.executable, "scripts/new_module.py", *args], cwd=root, env=env,
                          capture_output=True, text=True)


def test_new_module_creates_the_five_files_and_passes_freshness_and_contract(tmp_repo):
    proc = _run(tmp_repo, "42", "Widgets and gadgets", "--package", "widgets")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rel in ("g2c/widgets/__init__.py", "g2c/widgets/core.py", "solutions/g2c/widgets/core.py",
                "tests/test_widgets.py", "docs/modules/42-widgets-and-gadgets.md",
                "solutions/notebooks/42-widgets-and-gadgets.py"):
        assert (tmp_repo / rel).is_file(), rel
    scaffold = (tmp_repo / "g2c/widgets/core.py").read_text()
    assert "raise NotImplementedError" in scaffold and "return x * factor" not in scaffold
    env = {k: v for k, v in os.environ.items() if k != "G2C_APPLY_SOLUTIONS"}
    env["PYTHONPATH"] = str(tmp_repo)
    fresh = subprocess.run([sys.executable, "scripts/scaffolds.py", "--check"], cwd=tmp_repo, env=env,
                           capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stdout + fresh.stderr
    contract = subprocess.run([sys.executable, "scripts/contract.py", "--check", "tests/test_widgets.py"],
                              cwd=tmp_repo, env=env, capture_output=True, text=True)
    assert contract.returncode == 0, contract.stdout + contract.stderr
    assert '"tests/test_widgets.py"' in (tmp_repo / "tests/pristine.json").read_text()
    # 1 provided check passes, the exercise fails on the scaffold
    assert "1/1" in contract.stdout
    solved = subprocess.run([sys.executable, "-m", "pytest", "-q", "tests/test_widgets.py"], cwd=tmp_repo,
                            env={**env, "G2C_APPLY_SOLUTIONS": "42", "G2C_QUIET": "1"}, capture_output=True, text=True)
    assert solved.returncode == 0, solved.stdout


def test_new_module_refuses_existing_ids_and_files(tmp_repo):
    proc = _run(tmp_repo, "03", "Again", "--package", "nn2", "--no-record")
    assert proc.returncode == 1 and "already in g2c/course/registry.py" in proc.stderr
    (tmp_repo / "tests" / "test_widgets.py").write_text("# a teacher's file\n")
    proc = _run(tmp_repo, "42", "Widgets", "--package", "widgets", "--no-record")
    assert proc.returncode == 1 and "refusing to overwrite" in proc.stderr
    assert (tmp_repo / "tests" / "test_widgets.py").read_text() == "# a teacher's file\n"
    assert "'42'" not in (tmp_repo / "g2c/course/registry.py").read_text()


def test_slugify_drops_beyond_and_punctuation():
    assert new_module.slugify("Beyond: KV cache & decoding") == "kv-cache-decoding"


def test_new_beyond_module_gets_its_own_sub_package_and_requires(tmp_repo):
    proc = _run(tmp_repo, "specdec-widgets", "Beyond: widgets", "--requires", "03,specdec")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rel in ("g2c/specdec/widgets/__init__.py", "g2c/specdec/widgets/core.py",
                "solutions/g2c/specdec/widgets/core.py", "tests/test_specdec_widgets.py",
                "docs/beyond/specdec-widgets.md", "solutions/notebooks/specdec-widgets-widgets.py"):
        assert (tmp_repo / rel).is_file(), rel
    registry = (tmp_repo / "g2c/course/registry.py").read_text()
    assert "requires=('03', 'specdec'," in registry
    assert "./test.sh specdec-widgets" in (tmp_repo / "docs/beyond/specdec-widgets.md").read_text()
    assert "./notebook.sh specdec-widgets" in (tmp_repo / "solutions/notebooks/specdec-widgets-widgets.py").read_text()
    # the folder is the module's: a second Beyond module may not move in
    again = _run(tmp_repo, "specdec-gadgets", "Beyond: gadgets", "--package", "specdec/widgets", "--no-record")
    assert again.returncode == 1 and "owns its own folder" in again.stderr


def test_new_module_refuses_unknown_requires(tmp_repo):
    proc = _run(tmp_repo, "specdec-widgets", "Beyond: widgets", "--requires", "99", "--no-record")
    assert proc.returncode == 1 and "--requires 99: not a module" in proc.stderr
    assert "specdec-widgets" not in (tmp_repo / "g2c/course/registry.py").read_text()


def _compiles(path: Path) -> bool:
    try:
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
    except SyntaxError:
        return False
    return True


def test_title_with_triple_quotes_gives_files_that_compile(tmp_repo):
    """Issue 31: the title lands in docstrings; a ``\"\"\"`` in it must not end one early."""
    proc = _run(tmp_repo, "42", 'Widgets """ and \\ gadgets', "--package", "widgets", "--no-record")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for rel in ("g2c/widgets/__init__.py", "g2c/widgets/core.py", "solutions/g2c/widgets/core.py",
                "tests/test_widgets.py"):
        assert _compiles(tmp_repo / rel), rel
    assert 'Widgets """ and \\ gadgets' in (tmp_repo / "docs/modules/42-widgets-and-gadgets.md").read_text()


def test_new_module_in_a_checkout_with_an_edited_exercise_adds_the_whole_module(tmp_repo):
    """Issue 31: a student's edited scaffold elsewhere makes the generator exit 1 (it keeps the
    file); that must not stop new_module half way."""
    assert _run(tmp_repo, "42", "Widgets", "--package", "widgets", "--no-record").returncode == 0
    edited = tmp_repo / "g2c/widgets/core.py"
    edited.write_text(edited.read_text() + "\n# my own work\n")
    proc = _run(tmp_repo, "43", "Gadgets", "--package", "gadgets", "--requires", "42")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "module 43 added" in proc.stdout and "not overwritten" in proc.stderr
    assert (tmp_repo / "g2c/gadgets/core.py").is_file() and '"tests/test_gadgets.py"' in (
        tmp_repo / "tests/pristine.json").read_text()
    assert edited.read_text().endswith("# my own work\n")


def test_a_failing_step_adds_nothing(tmp_repo):
    """A whole module or nothing: when a step fails, every created file goes and the registry and
    records are put back."""
    before = {rel: (tmp_repo / rel).read_bytes() for rel in ("g2c/course/registry.py", "tests/pristine.json")}
    tree = sorted(p.relative_to(tmp_repo).as_posix() for p in tmp_repo.rglob("*") if "__pycache__" not in p.parts)
    (tmp_repo / "scripts" / "contract.py").write_text("import sys\nsys.exit('contract: boom')\n")
    proc = _run(tmp_repo, "42", "Widgets", "--package", "widgets")
    assert proc.returncode == 1
    assert "module 42 not added" in proc.stderr and "Traceback" not in proc.stderr
    assert {rel: (tmp_repo / rel).read_bytes() for rel in before} == before
    after = sorted(p.relative_to(tmp_repo).as_posix() for p in tmp_repo.rglob("*") if "__pycache__" not in p.parts)
    assert after == tree


def test_title_on_two_lines_is_refused_before_anything_is_written(tmp_repo):
    proc = _run(tmp_repo, "42", "Widgets\nand gadgets", "--package", "widgets")
    assert proc.returncode == 1 and "one line of text" in proc.stderr
    assert not (tmp_repo / "g2c" / "widgets").exists()
