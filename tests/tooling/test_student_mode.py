"""The student's path: ``./test.sh`` grades a student's own modules and never touches their files;
``scripts/scaffolds.py`` refuses to overwrite them; the progress view; the prerequisites hints.

The end-to-end checks run in a copy of the repository (``repo_copy``), never in this checkout.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from repo_copy import REPO_ROOT, copy_repo, env_for

from g2c.course import MODULES, get_module, grading_selection, prerequisites, prerequisites_selector
from g2c.course.progress import ModuleResult, failure_lines, format_table, parse_junit, passing_lines
from g2c.course.scaffolds import expected, stack_hints, status

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
    assert "module 06:" in res.stdout and "tests fail in your code" in res.stdout
    # the command that shows them runs them as grading did: the answer key of 06's prerequisites (04), not 06
    assert "G2C_APPLY_SOLUTIONS=04 ./test.sh tests/test_lm.py -x" in res.stdout
    assert "module 06: answer key applied to 04" in res.stdout   # 06 needs the tokenizer of 04, nothing else
    assert digest(path) == before


def test_scaffolds_refuse_to_overwrite_the_student_file(student_repo):
    path = student_repo / LOSS
    before = digest(path)
    res = sh(student_repo, ".venv/bin/python", "scripts/scaffolds.py")
    assert res.returncode == 1
    assert "not overwritten" in res.stderr and f"{LOSS}  (module 06)" in res.stderr and "--force" in res.stderr
    assert digest(path) == before
    assert not (student_repo / ".g2c-backup").exists()


def test_test_sh_id_grades_one_module_with_exactly_its_unedited_prerequisites(student_repo):
    # 06 is the student's; grading 09b (which needs 06 and 09) applies the answer key to 03-05, 07-09 but
    # never to the student's 06, and the 09b tests then run on the student's 06 plus 09b's untouched stubs.
    res = sh(student_repo, "./test.sh", "09b")
    assert "module 09b: answer key applied to 03, 04, 05, 07, 08, 09" in res.stdout, res.stdout
    assert grading_selection("09b", ["06"]) == ["03", "04", "05", "07", "08", "09"]
    assert res.returncode == 1                                   # 09b itself is unwritten
    assert "tests fail in your code" in res.stdout


def test_grade_names_the_unwritten_prerequisite_the_student_edited(student_repo):
    # The student wrote module 09 and touched module 05 (a comment) without writing it: grading 09 must
    # blame 05 (named, with the command that grades 09 with 05 solved), not the student's 09.
    written = ["g2c/transformer/block.py", "g2c/transformer/model.py"]
    emb = student_repo / "g2c/embeddings/embeddings.py"
    saved = {rel: (student_repo / rel).read_text() for rel in [*written, "g2c/embeddings/embeddings.py"]}
    try:
        for rel in written:
            (student_repo / rel).write_text((student_repo / "solutions" / rel).read_text())
        emb.write_text(saved["g2c/embeddings/embeddings.py"] + "\n# started module 05\n")
        res = sh(student_repo, "./test.sh", "09")
        solved = sh(student_repo, "./test.sh", "09", "--solve", "05")
    finally:
        for rel, text in saved.items():
            (student_repo / rel).write_text(text)
    out = res.stdout
    assert res.returncode == 1
    assert re.search(r"module 09: \d+ tests fail because module 05 \(which 09 needs, and you edited\)", out), out
    assert "./test.sh 09 --solve 05" in out and "./test.sh 05" in out
    assert "tests fail in your code" not in out                   # the student's 09 is right
    assert solved.returncode == 0, solved.stdout + solved.stderr  # with 05's answer key: all pass
    assert "module 09: answer key applied to 03, 05, 07, 08" in solved.stdout
    # a fresh trial: --solve of a module the student never edited changed nothing and said nothing;
    # an argument after --progress was dropped in silence
    idle = sh(student_repo, "./test.sh", "05", "--solve", "03,11")
    # a later trial: 11 is not a module 05 builds on, yet the note said its answer key "stands in"
    assert idle.stdout.startswith("note: --solve 11 changes nothing: module 05 does not build on 11 (./test.sh "
                                  "--progress lists what each module needs)"), idle.stdout
    assert "note: --solve 03: you have not edited module(s) 03" in idle.stdout, idle.stdout
    extra = sh(student_repo, "./test.sh", "--progress", "extra")
    assert extra.returncode == 2 and "unrecognized arguments: extra" in extra.stderr, extra.stderr
    # a pytest option on the id route was refused as an error of "python -m g2c.course", a command the
    # student never typed: the refusal is test.sh's own and names where pytest's options go
    xdist = sh(student_repo, "./test.sh", "03", "-n", "2")
    assert xdist.returncode == 2 and "grading by module id takes ids and --solve ID, not '-n'" in xdist.stderr
    assert "g2c.course" not in xdist.stderr, xdist.stderr
    # ... and it named tests/test_attention.py whatever the module: it names the module's own test file
    assert "./test.sh tests/test_nn.py -n 2" in xdist.stderr, xdist.stderr


@pytest.mark.parametrize("args, expected", [
    (["--progres"], "'--progres' is not an option: did you mean ./test.sh --progress?"),
    (["-progress"], "'-progress' is not an option: did you mean ./test.sh --progress?"),   # pytest: -p rogress
    (["--sumbit"], "did you mean ./test.sh --submit?"),
    (["tests/test_nn.py", "--regrade"], "'--regrade' is an option of test.sh, not of pytest"),
    (["progress"], "'progress' is not a module id; did you mean ./test.sh --progress?"),
    (["03", "--progress"], "--progress is an option on its own, not one for grading by module id"),
    (["--progress", "-x"], "usage: ./test.sh --progress [-h] [--regrade]"),
    # a second trial: each of these ran pytest on every test file, graded, or named no way out
    (["-3"], "'-3' is not an option; module ids take no dash: ./test.sh 03"),
    (["-v"], "'-v' names no test file: pytest's options go after one (./test.sh tests/test_nn.py -v)"),
    (["--author", "-x"], "--author runs the whole check and takes nothing after it (not '-x')"),
    (["test_nn.py"], "no file 'test_nn.py' here; did you mean ./test.sh tests/test_nn.py?"),
    ([""], "'' names no module; give ids such as 03 or 16"),
    (["03", "--solve", ","], "--solve ',' names no module"),
    (["05", "--solve", "zz"], "--solve zz: unknown course module id 'zz'"),
    (["nn"], "module 03 is the one tested by tests/test_nn.py"),
    (["03", "--", "-x"], "grading by module id takes ids and --solve ID, not '-x'"),
    (["05", "-x"], "./test.sh tests/test_embeddings.py -x (plain pytest on your code, no answer key; "
                   "G2C_APPLY_SOLUTIONS=03 ./test.sh tests/test_embeddings.py -x applies it"),
])
def test_test_sh_names_the_option_a_student_mistyped(fresh_repo, args, expected):
    # A student trial: each of these reached pytest (its usage, or "plugin 'rogress' not found") or named
    # `python -m g2c.course`, a command the student never typed. All are refused before anything is graded.
    res = sh(fresh_repo, "./test.sh", *args)
    assert res.returncode == 2 and expected in res.stderr, (res.returncode, res.stderr)
    assert "python -m pytest" not in res.stderr and "g2c.course progress" not in res.stderr


def test_course_cli_without_a_command_lists_the_commands(capsys):
    # a trial: "the following arguments are required: cmd", an internal name
    from g2c.course.__main__ import main

    with pytest.raises(SystemExit) as exit_:
        main([])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "choose a command: progress, grade, graph, worked, prereqs, submit" in err, err
    assert "required: cmd" not in err


def test_module_ids_are_read_once_each_in_the_order_given(monkeypatch):
    # a trial: ./test.sh 03 03 graded module 03 twice, and --solve 11,11 noted "module(s) 11, 11"
    from g2c.course.__main__ import _split_ids

    monkeypatch.setenv("G2C_FRONT", "test.sh")
    assert _split_ids(["03", "3", "04,03", " 16 "]) == ["03", "04", "16"]
    assert _split_ids(["11,11", "10"], "--solve") == ["11", "10"]
    assert _split_ids([]) == []
    with pytest.raises(ValueError, match=r"'progress' is not a module id; did you mean ./test.sh --progress\?"):
        _split_ids(["progress"])


def test_grade_takes_comma_separated_ids_and_the_solve_route(fresh_repo):
    # ./test.sh 03,04 was "unknown course module id '03,04'"; --solve already took ID,ID. And ./test.sh --solve 03
    # (the modules you edited, with 03's key) went to pytest.
    res = sh(fresh_repo, "./test.sh", "03,04b", "-x")
    assert res.returncode == 2 and "unknown course module id '04b'" in res.stderr, res.stderr
    solve = sh(fresh_repo, "./test.sh", "--solve", "03")
    assert solve.returncode == 0 and "you have not edited any exercise file yet" in solve.stdout, solve


def test_plain_pytest_refuses_a_selector_that_names_an_edited_module(student_repo):
    env = env_for(student_repo, G2C_APPLY_SOLUTIONS="01-06")
    res = subprocess.run([".venv/bin/python", "-m", "pytest", "-q", "tests/test_lm.py"], cwd=student_repo, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 4, res.stdout + res.stderr
    out = res.stdout + res.stderr
    assert "selects module(s) 06 that you edited" in out and "./test.sh 06" in out and "G2C_REPLACE_EDITED=1" in out
    assert "using reference solutions" not in out      # a helper's trial: printed after the refusal, it read as
    assert "this replaces your own code" not in out    # if the tests had run on the answer key; none ran
    env["G2C_REPLACE_EDITED"] = "1"   # the explicit opt-in
    res = subprocess.run([".venv/bin/python", "-m", "pytest", "-q", "tests/test_lm.py"], cwd=student_repo, env=env,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr


def test_plain_pytest_lets_the_key_stand_in_for_edited_prerequisites(student_repo):
    # The seed's grading command (G2C_APPLY_SOLUTIONS=01-11 pytest tests/test_specdec.py, issue 30) for a
    # student who edited 03-11: only specdec's tests run, and specdec is not selected, so the answer key only
    # stands in for prerequisites. Here: 06 edited and selected, but the run grades 05 (tests/test_embeddings.py).
    env = env_for(student_repo, G2C_APPLY_SOLUTIONS="01-06")
    res = subprocess.run([".venv/bin/python", "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests/test_embeddings.py"], cwd=student_repo, env=env, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "that you edited" not in res.stdout + res.stderr


def test_refusal_names_only_edited_modules_whose_tests_run():
    from conftest import graded_modules, replaced_own_work_message

    numbered = ["03", "03b", "04", "05", "06", "07", "08", "09", "09b", "10", "11"]
    # the seed's command: specdec graded, 03-11 edited and replaced by the key -> allowed
    assert graded_modules(["tests/test_specdec.py"], cwd=REPO_ROOT) == ["specdec"]
    assert replaced_own_work_message(numbered, numbered, ["specdec"]) is None
    # a test file (or ::test id) of an edited, selected module -> refused, naming it and its grading command
    running = graded_modules(["tests/test_sampling.py::test_generate_greedy"], cwd=REPO_ROOT)
    assert running == ["11"]
    msg = replaced_own_work_message(numbered, numbered, running)
    assert msg is not None and "selects module(s) 11 that you edited" in msg and "./test.sh 11" in msg
    # a folder (a bare `pytest` runs testpaths = tests) selects every module's files
    assert graded_modules(["tests"], cwd=REPO_ROOT) == [m.id for m in MODULES]
    everything = graded_modules(["tests"], cwd=REPO_ROOT)
    assert "module(s) 06 that" in replaced_own_work_message(["06", "09"], ["06"], everything)
    # tooling files grade no module
    assert graded_modules(["tests/tooling/test_hook.py"], cwd=REPO_ROOT) == []


def test_freshness_check_names_the_edited_file(student_repo):
    # what ./test.sh --author would report at its freshness step
    res = sh(student_repo, ".venv/bin/python", "scripts/scaffolds.py", "--check")
    assert res.returncode == 1 and f"{LOSS}  <- solutions/{LOSS} (edited by hand" in res.stderr


# -- the progress view ---------------------------------------------------------------------------

def test_progress_cli_grades_worked_modules_and_shows_the_rest_untouched(monkeypatch, capsys):
    from g2c.course import __main__ as cli

    monkeypatch.setattr(cli, "worked_modules", lambda: ["06"])
    monkeypatch.setattr(cli, "grade_unless_unchanged", lambda ids, worked, regrade, on_grading: (
        on_grading(), [ModuleResult("06", "Next-token prediction", 9, 0, 0, 1)])[1:] + (None,))
    assert cli.main(["progress"]) == 0
    out = capsys.readouterr().out
    assert "06*" in out and "9/9" in out and "done" in out and "nothing changed" not in out
    assert out.startswith("grading the modules you edited")
    rows = [line.split()[0] for line in out.splitlines() if line[:1].isalnum()]
    order = [r.rstrip("*") for r in rows if r.rstrip("*") in {m.id for m in MODULES}]
    assert order == [m.id for m in MODULES]                # graph (= course) order, every module
    assert "not started" in out


def test_progress_reuses_the_last_grading_only_while_nothing_changed(tmp_path, monkeypatch, capsys):
    from g2c.course import __main__ as cli
    from g2c.course import progress

    for rel in ("g2c/nn/linear.py", "solutions/g2c/nn/linear.py", "tests/test_nn.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")
    runs = []

    def fake_grade(ids, *, worked, root, echo):
        runs.append(list(ids))
        return [ModuleResult(i, "T", 3, 1, 0, 1, (("03", 1),), ("03",), (("tests/test_nn.py::t", "03"),), 4)
                for i in ids]

    monkeypatch.setattr(progress, "grade", fake_grade)

    def again(**kw):
        return progress.grade_unless_unchanged(["04"], worked=kw.pop("worked", ["04"]), root=tmp_path, **kw)

    first, when = again()
    assert when is None and len(runs) == 1
    cached, when = again()                                   # nothing changed: the same results, not run again
    assert when is not None and len(runs) == 1 and cached == first
    (tmp_path / "g2c/nn/linear.py").write_text("x = 2\n")      # an edit anywhere under g2c/ runs the tests
    assert again()[1] is None and len(runs) == 2
    assert again()[1] is not None and len(runs) == 2
    assert again(regrade=True)[1] is None and len(runs) == 3   # --regrade always runs them
    assert again(worked=["04", "05"])[1] is None and len(runs) == 4   # another set of edited modules
    (tmp_path / "tests/test_nn.py").write_text("y = 1\n")      # a test file changed: run again
    assert again(worked=["04", "05"])[1] is None and len(runs) == 5
    (tmp_path / progress.PROGRESS_CACHE).write_text("{not json")   # a damaged cache is a regrade, not an error
    assert again()[1] is None and len(runs) == 6
    saved = json.loads((tmp_path / progress.PROGRESS_CACHE).read_text())
    saved["results"][0]["passed"] = "x"                              # a hand-edited one too
    (tmp_path / progress.PROGRESS_CACHE).write_text(json.dumps(saved))
    assert again()[1] is None and len(runs) == 7

    # the command says when it reuses, and how to run anyway
    monkeypatch.setattr(cli, "worked_modules", lambda: ["06"])
    def fake(ids, worked, regrade, on_grading):
        if regrade:
            on_grading()
        return [ModuleResult("06", "T", 9, 0, 0, 1)], None if regrade else "2026-12-04 22:31"

    monkeypatch.setattr(cli, "grade_unless_unchanged", fake)
    assert cli.main(["progress"]) == 0
    out = capsys.readouterr().out                  # one story: reused, never "grading ..." first
    assert out.startswith("nothing changed since the grading of 2026-12-04 22:31") and "grading the" not in out
    assert cli.main(["progress", "--regrade"]) == 0
    out = capsys.readouterr().out
    assert "nothing changed" not in out and out.startswith("grading the modules you edited")
    with pytest.raises(SystemExit) as ended:       # a stray argument: the subcommand's usage, exit 2
        cli.main(["progress", "bogus"])
    err = capsys.readouterr().err
    assert ended.value.code == 2 and "usage: python -m g2c.course progress [-h] [--regrade]" in err
    assert "unrecognized arguments: bogus" in err


def test_format_table_states():
    table = format_table([ModuleResult("03", "A", 5, 0, 0, 1), ModuleResult("04", "B", 3, 2, 0, 1),
                          ModuleResult("05", "C", 1, 4, 0, 1), ModuleResult("06", "D", 0, 0, 0, None)], ["04"])
    rows = {line.split()[0]: line for line in table.splitlines()[2:]}
    assert rows["03"].endswith("done") and rows["04*"].endswith("in progress")
    assert rows["05"].endswith("not started") and rows["06"].endswith("no tests")


def test_failure_lines_name_the_unwritten_exercise_even_behind_a_regex_mismatch():
    # module 03's resolve_device raises NotImplementedError, a RuntimeError: pytest.raises(RuntimeError, match=...)
    # catches it and fails with "Regex pattern did not match." on its first line; the sentence is further down
    unwritten = "module 03: resolve_device in g2c/nn/device.py is not implemented yet. Write it (see docs)"
    xml = f"""<testsuites><testsuite>
      <testcase classname="tests.test_nn" file="tests/test_nn.py" name="test_rejects"><failure
        message="AssertionError: Regex pattern did not match.&#10; Regex: 'CUDA'&#10; Input: '{unwritten}'">tb</failure>
      </testcase>
      <testcase classname="tests.test_nn" file="tests/test_nn.py" name="test_ok"/>
      <testcase classname="tests.test_nn" file="tests/test_nn.py" name="test_long"><failure
        message="AssertionError: {'x' * 400}&#10;second line">tb</failure></testcase>
      <testcase classname="tests.test_nn" file="tests/test_nn.py" name="test_fixture"><error message="">tb</error>
      </testcase>
    </testsuite></testsuites>"""
    lines = failure_lines(xml)
    assert lines[0] == ("FAILED tests/test_nn.py::test_rejects - module 03: resolve_device in g2c/nn/device.py "
                        "is not implemented yet")
    assert lines[1].startswith("FAILED tests/test_nn.py::test_long - AssertionError: xxx") and lines[1].endswith("...")
    assert len(lines[1]) == len("FAILED tests/test_nn.py::test_long - ") + 160 and "second" not in lines[1]
    assert lines[2] == "ERROR tests/test_nn.py::test_fixture" and len(lines) == 3


def test_passing_lines_list_what_passes_per_file_and_nothing_else():
    xml = """<testsuites><testsuite>
      <testcase classname="tests.test_nn" file="tests/test_nn.py" name="test_ok"/>
      <testcase classname="tests.test_nn.TestLinear" file="tests/test_nn.py" name="test_shape[2]"/>
      <testcase classname="tests.test_nn" file="tests/test_nn.py" name="test_bad"><failure message="x">tb</failure>
      </testcase>
      <testcase classname="tests.test_nn" file="tests/test_nn.py" name="test_gpu"><skipped message="no gpu"/>
      </testcase>
      <testcase classname="tests.test_loss" file="tests/test_loss.py" name="test_grad"/>
    </testsuite></testsuites>"""
    assert passing_lines(xml) == ["passed in tests/test_nn.py (2): test_ok, TestLinear::test_shape[2]",
                                  "passed in tests/test_loss.py (1): test_grad"]
    many = "".join(f'<testcase classname="tests.test_nn" file="tests/test_nn.py" name="test_{i:02d}"/>'
                   for i in range(30))
    lines = passing_lines(f"<testsuites><testsuite>{many}</testsuite></testsuites>", width=60)
    assert len(lines) == 1 and lines[0].startswith("passed in tests/test_nn.py (30): test_00, ")
    assert all(len(row) <= 60 for row in lines[0].splitlines()) and len(re.findall(r"\btest_\d\d\b", lines[0])) == 30


def test_failure_lines_keep_what_a_regex_mismatch_expected():
    # the student's own resolve_device raises the wrong message: pytest.raises(..., match=...) puts the
    # expected pattern and the actual message on the lines after "Regex pattern did not match."
    xml = """<testsuites><testsuite>
      <testcase classname="tests.test_nn" file="tests/test_nn.py" name="test_name"><failure
        message="AssertionError: Regex pattern did not match.&#10; Regex: &quot;unknown device 'gpu0'&quot;&#10;
 Input: 'no'">tb</failure></testcase></testsuite></testsuites>"""
    assert failure_lines(xml) == ["FAILED tests/test_nn.py::test_name - AssertionError: Regex pattern did not match. "
                                  "Regex: \"unknown device 'gpu0'\" Input: 'no'"]


def test_format_table_shows_failures_of_every_graded_module_and_explains_an_unedited_one():
    graded = ModuleResult("specdec-trees", "Trees", 10, 25, 0, 10)
    shown = ModuleResult("09", "Nine", 3, 4, 0, 3, graded=False)
    rows = {line.split()[0]: line.split() for line in format_table([graded, shown], []).splitlines()[2:]}
    assert rows["specdec-trees"][4:6] == ["10", "25"]          # untouched 10, yours failing 25 (not "-")
    assert rows["09"][4:6] == ["3", "-"]                      # not run: the recorded counts only
    from g2c.course.__main__ import report

    line, = report([graded], [])
    assert line.startswith("module specdec-trees: 25 of 35 tests fail in your code (you have not edited module "
                           "specdec-trees's exercise files yet, so these are its unwritten exercises). See them")
    assert "(you have not edited" not in report([graded], ["specdec-trees"])[0]


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


def test_parse_junit_names_the_module_whose_exercise_is_unwritten():
    xml = """<testsuites><testsuite>
      <testcase file="tests/test_kvcache.py" name="a"><failure message="NotImplementedError: module 11:
      generate in g2c/sampling/generate.py is not implemented yet. Write it"/></testcase>
      <testcase file="tests/test_kvcache.py" name="b"><failure message="AssertionError">x</failure></testcase>
    </testsuite></testsuites>"""
    counts = parse_junit(xml)["tests/test_kvcache.py"]
    assert counts["failed"] == 2 and counts["unwritten:11"] == 1
    r = ModuleResult("16", "KV", 0, 2, 0, 0, (("11", 1),))
    assert r.own_failures == 1


# -- the prerequisites hints ---------------------------------------------------------------------

def test_prereqs_cli_prints_the_selector_and_the_grading_command():
    res = subprocess.run([sys.executable, "-m", "g2c.course", "prereqs", "16"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120, env=env_for(REPO_ROOT))
    assert res.returncode == 0 and res.stdout.strip() == prerequisites_selector("16") == "03,04,05,07,08,09,11"
    assert "./test.sh 16" in res.stderr


def test_no_generated_hint_tells_a_student_to_apply_a_selector():
    # Every NotImplementedError message names the grading command, which never applies the answer key to
    # an edited module; a selector in a message could (it cannot know what the student edited).
    for path, text in expected().items():
        for msg in re.findall(r"raise NotImplementedError\(\n((?:\s+\".*\"\n)+)", text):
            joined = "".join(re.findall(r'"(.*)"', msg))
            assert "G2C_APPLY_SOLUTIONS" not in joined and "--apply" not in joined, (path, joined)
            module = re.match(r"module ([\w-]+):", joined).group(1)
            assert f"./test.sh {module}" in joined, (path, joined)


def test_specdec_cli_advice_never_applies_an_edited_module(monkeypatch):
    import g2c.course.scaffolds as scaffolds
    from g2c.specdec.__main__ import NEEDS_SOLUTIONS, unwritten_advice

    monkeypatch.setattr(scaffolds, "worked_modules", lambda root=None: ["specdec"])
    err = NotImplementedError("module 09: TransformerLM.forward in g2c/transformer/model.py is not implemented yet.")
    advice = unwritten_advice(err)
    text = NEEDS_SOLUTIONS.format(err=err, advice=advice)
    assert "./test.sh 09" in text
    selector = re.search(r"G2C_APPLY_SOLUTIONS=(\S+)", text).group(1)
    from g2c.course import parse_selection

    assert "specdec" not in parse_selection(selector) and "09" in parse_selection(selector)
    pasted = unwritten_advice(err, ["Once upon a time", "-k", "4"])        # the user's own arguments, quoted
    assert f"G2C_APPLY_SOLUTIONS={selector} .venv/bin/python -m g2c.specdec 'Once upon a time' -k 4 " in pasted
    assert "(or --no-cache" not in unwritten_advice(err, ["Hi", "--no-cache"])   # already in the user's command
    own = NotImplementedError("module specdec: greedy_verify in g2c/specdec/verify.py is not implemented yet.")
    assert "G2C_APPLY_SOLUTIONS" not in unwritten_advice(own)      # the student's own module: finish it


def test_stack_hints_name_an_edited_unfinished_prerequisite(tmp_path, monkeypatch):
    import g2c.course.scaffolds as scaffolds

    for m in MODULES:  # every module unfinished: a stub in one file each
        path = tmp_path / m.files[-1]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f'raise NotImplementedError(\n    "module {m.id}: f in x is not implemented yet."\n)\n')
    monkeypatch.setattr(scaffolds, "worked_modules", lambda root=None: ["09", "specdec"])
    selected = grading_selection("specdec", ["09", "specdec"])          # the default: 09 is the student's
    hints = stack_hints("specdec", selected, root=tmp_path)
    assert len(hints) == 1 and "09" in hints[0] and "./test.sh 09" in hints[0], hints
    assert stack_hints("specdec", prerequisites("specdec"), root=tmp_path)[-1].startswith("note: this selection "
                                                                                          "replaces your own code")
    replaced = stack_hints("specdec", prerequisites("specdec") + ["specdec"], root=tmp_path)
    assert "includes module specdec itself" in replaced[-1]


def test_notebook_sh_applies_the_unedited_prerequisites_by_default():
    res = subprocess.run([sys.executable, "-m", "g2c.course.notebooks", "16", "--no-launch"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120, env=env_for(REPO_ROOT))
    assert res.returncode == 0, res.stderr
    assert "solutions applied: 03, 04, 05, 07, 08, 09, 11 (by default" in res.stdout, res.stdout
    assert "G2C_APPLY_SOLUTIONS=03,04,05,07,08,09,11 " in res.stdout


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


@pytest.mark.parametrize("module_id, selector", [("03", ""), ("03b", ""), ("05", "03"), ("09", "03,05,07,08"),
                                                 ("10", "03-09"), ("16", "03,04,05,07,08,09,11"),
                                                 ("specdec", "03-05,07,08,09,11")])
def test_prerequisites_selector(module_id, selector):
    assert prerequisites_selector(module_id) == selector


def test_seed_selector_still_covers_specdec():
    # The seed's instruction G2C_APPLY_SOLUTIONS=01-11 for specdec: a superset of what it needs, not specdec itself.
    from g2c.course import parse_selection

    assert set(prerequisites("specdec")) <= set(parse_selection("01-11")) and "specdec" not in parse_selection("01-11")


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
            assert "./test.sh 06" in res.stderr
