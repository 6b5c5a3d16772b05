"""The student's path: ``./test.sh`` grades a student's own modules and never touches their files;
``scripts/scaffolds.py`` refuses to overwrite them; the progress view; the prerequisites hints.

The end-to-end checks run in a copy of the repository (``repo_copy``), never in this checkout.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
from repo_copy import REPO_ROOT, copy_repo, env_for

from g2c.course import MODULES, get_module, prerequisites_selector
from g2c.course.progress import ModuleResult, format_table, parse_junit
from g2c.course.scaffolds import stack_hints, status, unfinished

LOSS = "g2c/lm/loss.py"  # module 06: two exercises, 9 tests in tests/test_lm.py, 1 passes untouched


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_digest(repo: Path) -> dict[str, str]:
    return {p.relative_to(repo).as_posix(): digest(p) for p in sorted((repo / "g2c").rglob("*.py"))}


@pytest.fixture(scope="module")
def fresh_repo(tmp_path_factory) -> Path:
    return copy_repo(tmp_path_factory.mktemp("student"))


@pytest.fixture
def student_repo(fresh_repo) -> Path:
    """The copy with module 06 written by the student (the answer key's code); restored afterwards."""
    path = fresh_repo / LOSS
    scaffold = path.read_text()
    path.write_text((fresh_repo / "solutions" / LOSS).read_text())
    yield fresh_repo
    path.write_text(scaffold)
    assert not (fresh_repo / ".g2c-backup").exists()


def sh(repo: Path, *cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=repo, env=env_for(repo), capture_output=True, text=True, timeout=600)


def test_untouched_copy_is_not_a_student(fresh_repo):
    assert sh(fresh_repo, ".venv/bin/python", "-m", "g2c.course", "worked").stdout.strip() == ""
    assert {s.state for s in status(fresh_repo)} == {"fresh"}


def test_test_sh_grades_a_finished_module_and_modifies_nothing(student_repo):
    before = tree_digest(student_repo)
    res = sh(student_repo, "./test.sh")
    out = res.stdout
    assert res.returncode == 0, out + res.stderr
    assert "student mode: you edited exercise files of module(s) 06; skipping the author-only checks" in out
    assert "scaffold freshness" in out and "./test.sh --author" in out
    assert "scripts/scaffolds.py --check" not in out and "contract" not in out.split("skipping")[0]
    assert "06*" in out and "9/9" in out and "all 9 tests of your module(s) pass" in out
    assert tree_digest(student_repo) == before
    assert not (student_repo / ".g2c-backup").exists()


def test_test_sh_fails_on_a_failing_student_module(student_repo):
    path = student_repo / LOSS
    path.write_text(path.read_text() + "\n\ndef cross_entropy(logits, targets):  # a wrong answer: always zero\n"
                                       "    return logits.sum() * 0.0\n")
    before = digest(path)
    res = sh(student_repo, "./test.sh")
    assert res.returncode == 1, res.stdout
    assert "module 06:" in res.stdout and "tests fail on your code" in res.stdout
    assert "./test.sh tests/test_lm.py" in res.stdout and "G2C_APPLY_SOLUTIONS=01-05" in res.stdout
    assert digest(path) == before


def test_scaffolds_refuse_to_overwrite_the_student_file(student_repo):
    path = student_repo / LOSS
    before = digest(path)
    res = sh(student_repo, ".venv/bin/python", "scripts/scaffolds.py")
    assert res.returncode == 1
    assert "not overwritten" in res.stderr and f"{LOSS}  (module 06)" in res.stderr and "--force" in res.stderr
    assert digest(path) == before
    assert not (student_repo / ".g2c-backup").exists()


def test_grade_keeps_exported_prerequisites_but_never_the_graded_module(student_repo):
    env = env_for(student_repo, G2C_APPLY_SOLUTIONS="01-06")
    res = subprocess.run([".venv/bin/python", "-m", "g2c.course", "grade"], cwd=student_repo, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "applied to the other modules from your G2C_APPLY_SOLUTIONS: 03, 03b, 04, 05" in res.stdout
    assert "9/9" in res.stdout  # the student's own module 06, not the answer key


def test_freshness_check_names_the_edited_file(student_repo):
    # what ./test.sh --author would report at its freshness step
    res = sh(student_repo, ".venv/bin/python", "scripts/scaffolds.py", "--check")
    assert res.returncode == 1 and f"{LOSS}  <- solutions/{LOSS} (edited by hand" in res.stderr


# -- the progress view ---------------------------------------------------------------------------

def test_progress_cli_prints_a_module_table(student_repo, monkeypatch, capsys):
    from g2c.course import __main__ as cli

    monkeypatch.setattr(cli, "modules_with_tests", lambda: ["06", "07"])
    monkeypatch.setattr(cli, "worked_modules", lambda: ["06"])
    monkeypatch.setattr(cli, "run_tests", lambda ids: ([
        ModuleResult("06", "Next-token prediction", 9, 0, 0, 1),
        ModuleResult("07", "Causal self-attention", 2, 10, 0, 2)], []))
    assert cli.main(["progress"]) == 0
    out = capsys.readouterr().out
    assert "06*" in out and "9/9" in out and "done" in out
    assert "2/12" in out and "not started" in out


def test_format_table_states():
    table = format_table([ModuleResult("03", "A", 5, 0, 0, 1), ModuleResult("04", "B", 3, 2, 0, 1),
                          ModuleResult("05", "C", 1, 4, 0, 1), ModuleResult("06", "D", 0, 0, 0, None)], ["04"])
    rows = {line.split()[0]: line for line in table.splitlines()[2:]}
    assert rows["03"].endswith("done") and rows["04*"].endswith("in progress")
    assert rows["05"].endswith("not started") and rows["06"].endswith("no tests")


def test_parse_junit_counts_per_file():
    xml = """<testsuites><testsuite>
      <testcase file="tests/test_lm.py" name="a"/>
      <testcase file="tests/test_lm.py" name="b"><failure message="x"/></testcase>
      <testcase file="tests/test_lm.py" name="c"><skipped message="y"/></testcase>
      <testcase file="tests/test_nn.py" name="d"><error message="z"/></testcase>
    </testsuite></testsuites>"""
    counts = parse_junit(xml)
    assert dict(counts["tests/test_lm.py"]) == {"passed": 1, "failed": 1, "skipped": 1}
    assert dict(counts["tests/test_nn.py"]) == {"failed": 1}


# -- the prerequisites hints ---------------------------------------------------------------------

def test_prereqs_cli_prints_the_selector():
    res = subprocess.run([sys.executable, "-m", "g2c.course", "prereqs", "specdec"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120, env=env_for(REPO_ROOT))
    assert res.returncode == 0 and res.stdout.strip() == "01-16"
    assert "keeps your own code" in res.stderr


def test_specdec_cli_hint_names_the_prerequisites_selector():
    from g2c.specdec.__main__ import NEEDS_SOLUTIONS, PREREQUISITES

    assert PREREQUISITES == prerequisites_selector("specdec") == "01-16"
    text = NEEDS_SOLUTIONS.format(err="module 09: TransformerLM.forward ...")
    assert "G2C_APPLY_SOLUTIONS=01-16" in text and "keeps your own g2c/specdec" in text
    assert "=all" not in text
    assert not re.search(r"[=,]specdec(?![-\w])", text), "the hint must never select specdec itself"
    assert "specdec-sampling," in text          # sampling runs need that module, which is named, not specdec


def test_stack_hints_name_the_selector_while_prerequisites_are_unfinished(tmp_path):
    for m in MODULES:  # every module unfinished: a stub in one file each
        path = tmp_path / m.files[-1]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'raise NotImplementedError(\n    "module {m.id}: f in x is not implemented yet."\n)\n')
    hints = stack_hints("specdec", [], root=tmp_path)
    assert len(hints) == 1 and "--apply 01-16" in hints[0] and "keeps your own code for specdec" in hints[0]
    assert stack_hints("specdec", prerequisites_list("specdec"), root=tmp_path) == []
    replaced = stack_hints("specdec", prerequisites_list("specdec") + ["specdec"], root=tmp_path)
    assert len(replaced) == 1 and "replaces your own code" in replaced[0] and "--apply 01-16" in replaced[0]
    for m in MODULES[:-1]:  # a finished stack: no hint
        (tmp_path / m.files[-1]).write_text("x = 1\n")
    assert not unfinished("09", root=tmp_path)
    assert stack_hints("specdec", [], root=tmp_path) == []


def prerequisites_list(module_id: str) -> list[str]:
    from g2c.course import prerequisites

    return prerequisites(module_id)


def test_notebook_sh_specdec_prints_the_selector_when_the_stack_is_unfinished():
    res = subprocess.run([sys.executable, "-m", "g2c.course.notebooks", "specdec", "--no-launch"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120, env=env_for(REPO_ROOT))
    assert res.returncode == 0, res.stderr
    if unfinished("09"):  # an author checkout: every exercise is still a stub
        assert "--apply 01-16" in res.stdout and "keeps your own code for specdec" in res.stdout


def test_registry_tests_field_covers_every_course_test_file():
    claimed = [t for m in MODULES for t in m.tests]
    assert len(claimed) == len(set(claimed)), "a test file is claimed by two modules"
    for t in claimed:
        assert (REPO_ROOT / t).is_file(), t
    assert all(m.tests for m in MODULES), "every module names its test files"
    course_tests = {p.relative_to(REPO_ROOT).as_posix() for p in (REPO_ROOT / "tests").glob("test_*.py")}
    not_a_module = {"tests/test_hf_export.py"}  # tests provided tooling (g2c.assets.export), not an exercise
    assert course_tests - set(claimed) <= not_a_module, "a tests/test_*.py belongs to no module's `tests`"
    assert get_module("specdec").tests[:2] == ("tests/test_specdec.py", "tests/test_specdec_properties.py")


@pytest.mark.parametrize("module_id, selector", [("03", ""), ("03b", "03"), ("04", "01-03"), ("09", "01-08"),
                                                 ("09b", "01-08,09"), ("10", "01-09"), ("11", "01-10"),
                                                 ("specdec", "01-16"), ("16", "01-11")])
def test_prerequisites_selector(module_id, selector):
    assert prerequisites_selector(module_id) == selector


def test_import_g2c_warns_when_the_selector_replaces_the_students_own_code(student_repo):
    code = "import g2c"
    for selector, warned in (("01-06", True), ("01-05", False)):
        env = env_for(student_repo, G2C_APPLY_SOLUTIONS=selector)
        env.pop("G2C_QUIET", None)
        res = subprocess.run([".venv/bin/python", "-c", code], cwd=student_repo, env=env, capture_output=True,
                             text=True, timeout=120)
        assert res.returncode == 0, res.stderr
        assert ("replaces your own code for module(s) 06" in res.stderr) is warned, res.stderr
        if warned:
            assert "python -m g2c.course prereqs 06" in res.stderr
