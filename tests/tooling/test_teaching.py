"""The teacher's path (docs/teaching.md): ``submit`` -> ``grade-class`` round trip on generated submissions,
the tamper warning of ``./test.sh ID``, isolation between submissions, the timeout, the answers page.

Everything runs in copies of the repository (``.venv`` linked, ``artifacts/`` copied), never in this
checkout. Modules 03 and 04 keep it quick: their tests take seconds.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from repo_copy import IGNORED, REPO_ROOT, env_for, own_artifacts

LAYERS, DEVICE, BPE = "g2c/nn/layers.py", "g2c/nn/device.py", "g2c/tokenizer/bpe.py"
NOTEBOOK = "notebooks/work/03-nn.ipynb"
MODULES = "03,04"
TIMEOUT = 240        # per submission in the class run: far above the ~10-40 s a 03+04 grading takes on 2 cores
LOOP_TIMEOUT = 90    # the endless loop's own run and the next one's (one module, ~10 s; 45 s failed under load)


def _contain() -> list[str]:
    """grade-class's containment flag here: none where the sandbox works (tests/tooling/test_containment.py tests
    it), ``--uncontained`` where this machine has none (grading would refuse to start)."""
    from g2c.course import sandbox

    try:
        sandbox.choose_containment()
        return []
    except sandbox.Unavailable:
        return ["--uncontained"]


CONTAIN = _contain()


def sol(rel: str) -> str:
    return (REPO_ROOT / "solutions" / rel).read_text(encoding="utf-8")


def light_copy(parent: Path, name: str) -> Path:
    """A copy like ``repo_copy.copy_repo`` (``artifacts/`` its own: ``repo_copy.own_artifacts`` says why)."""
    repo = parent / name
    shutil.copytree(REPO_ROOT, repo, ignore=shutil.ignore_patterns(*IGNORED, "artifacts", "hand-in"), symlinks=True)
    (repo / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    own_artifacts(repo)
    return repo


def run(repo: Path, *args: str, cwd: Path | None = None, timeout: float = 900, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd or repo, env=env_for(repo, **env), capture_output=True,
                          text=True, timeout=timeout)


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=Dana Student", "-c", "user.email=dana@example.org", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout


def tree_digest(repo: Path) -> dict[str, str]:
    return {p.relative_to(repo).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(repo.rglob("*"))
            if p.is_file() and not {".git", "hand-in", "__pycache__"} & set(p.parts)}


def notebook_with_answer(text: str) -> str:
    nb = json.loads((REPO_ROOT / "notebooks/clean/03-nn.ipynb").read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown" and "".join(cell["source"]).startswith("**Answer:**"):
            cell["source"] = ["**Answer:**\n", "\n", text]
            break
    return json.dumps(nb, indent=1)


WRONG_LAYERNORM = sol(LAYERS).replace("var = (x - mean).pow(2).mean(dim=-1, keepdim=True)",
                                      "var = x.var(dim=-1, keepdim=True, unbiased=True)")
CASES: dict[str, dict[str, str]] = {
    # the answer key copied in as the student's own files, plus a notebook answer (with markup to escape)
    "correct": {LAYERS: sol(LAYERS), DEVICE: sol(DEVICE), BPE: sol(BPE),
                NOTEBOOK: notebook_with_answer("The row keeps only a sign. <script>alert(1)</script>")},
    "wrong": {LAYERS: WRONG_LAYERNORM, DEVICE: sol(DEVICE), BPE: sol(BPE)},   # unbiased variance: subtly wrong
    "unfinished": {LAYERS: sol(LAYERS)},                                      # device.py and 04 not written
    "empty": {},
    "crashing": {LAYERS: sol(LAYERS), DEVICE: sol(DEVICE),
                 BPE: sol(BPE) + '\nraise RuntimeError("student code crashed at import")\n'},
    "garbage": {LAYERS: sol(LAYERS) + "\nimport sys\nsys.stdout.write('\\x00\\xff\\u2603 garbage ' * 20000)\n",
                DEVICE: sol(DEVICE)},
    # a syntax error in module 03, which the tests' conftest imports: no test of any module can start
    "broken": {LAYERS: sol(LAYERS).replace("def forward", "def forward(", 1), BPE: sol(BPE)},
}
# graded again with `python -m g2c.course grade ID` in the student's own copy, on the module that tells
OWN_COPY = {"wrong": "03", "crashing": "04"}
assert WRONG_LAYERNORM != sol(LAYERS)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The teacher's checkout, a student's git checkout, and a class folder of generated submissions."""
    tmp = tmp_path_factory.mktemp("teaching")
    teacher = light_copy(tmp, "teacher")
    student = light_copy(tmp, "student")
    git(student, "init", "-q")
    git(student, "add", "-A")
    git(student, "commit", "-qm", "course")
    git(student, "config", "user.name", "Dana Student")
    klass = tmp / "class"
    klass.mkdir()
    own, outputs = {}, {}
    for name, files in CASES.items():
        for rel, text in files.items():
            (student / rel).parent.mkdir(parents=True, exist_ok=True)
            (student / rel).write_text(text, encoding="utf-8")
        before = tree_digest(student)
        res = run(student, "-m", "g2c.course", "submit", "--name", name, "--out", str(klass / f"{name}.zip"))
        assert res.returncode == 0, res.stdout + res.stderr
        assert tree_digest(student) == before, "submit changed a file"
        outputs[name] = res.stdout
        if name in OWN_COPY:
            out = tmp / f"own-{name}.json"
            run(student, "-m", "g2c.course", "grade", OWN_COPY[name], "--json", str(out))
            own[name] = json.loads(out.read_text())
        git(student, "checkout", "-q", "--", ".")
        (student / NOTEBOOK).unlink(missing_ok=True)
    # tampered: a file changed after hand-in (its manifest hash no longer matches)
    with zipfile.ZipFile(klass / "correct.zip") as src, zipfile.ZipFile(klass / "tampered.zip", "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info.filename, data.replace(b"return", b"return ") if info.filename == LAYERS else data)
    # smuggler: a hand-made archive carrying its own, gutted tests and a path that climbs out
    with zipfile.ZipFile(klass / "correct.zip") as src, zipfile.ZipFile(klass / "smuggler.zip", "w") as dst:
        manifest = json.loads(src.read("manifest.json"))
        extra = {"tests/test_nn.py": b"def test_nothing():\n    pass\n", "../../evil.py": b"print('out')\n"}
        for rel, data in extra.items():
            manifest["files"].append({"path": rel, "sha256": hashlib.sha256(data).hexdigest(), "kind": "exercise"})
            dst.writestr(rel, data)
        for info in src.infolist():
            if info.filename != "manifest.json":
                dst.writestr(info.filename, src.read(info))
        dst.writestr("manifest.json", json.dumps(manifest))
    (klass / "notzip.zip").write_bytes(b"this is not a zip archive\n")
    (klass / "README.txt").write_text("not a submission\n")
    unpacked = klass / "unpacked"
    with zipfile.ZipFile(klass / "unfinished.zip") as src:
        src.extractall(unpacked)
    # a whole clone as the submission, whose owner edited the tests (3 LayerNorm tests renamed away)
    clone = light_copy(tmp, "clone")
    for rel in (LAYERS, DEVICE):
        (clone / rel).write_text(sol(rel), encoding="utf-8")
    tests = clone / "tests" / "test_nn.py"
    text = tests.read_text(encoding="utf-8")
    for _ in range(3):
        text = text.replace("def test_layernorm", "def skipped_layernorm", 1)
    tests.write_text(text, encoding="utf-8")
    os.symlink(clone, klass / "clone", target_is_directory=True)
    t0 = time.monotonic()
    res = run(teacher, "-m", "g2c.course", "grade-class", str(klass), "--modules", MODULES, "--jobs", "2",
              "--timeout", str(TIMEOUT), "--out", str(tmp / "grades"), *CONTAIN, timeout=3600)
    wall = time.monotonic() - t0
    report = json.loads((tmp / "grades" / "grades.json").read_text())
    return {"tmp": tmp, "teacher": teacher, "student": student, "klass": klass, "clone": clone, "res": res,
            "report": report, "by_name": {r["name"]: r for r in report["submissions"]}, "own": own,
            "outputs": outputs, "wall": wall, "grades": tmp / "grades"}


def module(world, name: str, mid: str) -> dict:
    return world["by_name"][name]["modules"][mid]


def recorded(rel: str) -> int:
    rec = json.loads((REPO_ROOT / "tests" / "pristine.json").read_text())[rel]
    return rec["passed"] + rec["failed"]


def untouched(rel: str) -> int:
    return json.loads((REPO_ROOT / "tests" / "pristine.json").read_text())[rel]["passed"]


# -- hand in ----------------------------------------------------------------------------------------

def test_submit_archives_exactly_the_students_files(world):
    with zipfile.ZipFile(world["klass"] / "correct.zip") as zf:
        names = sorted(zf.namelist())
        manifest = json.loads(zf.read("manifest.json"))
        for e in manifest["files"]:
            assert hashlib.sha256(zf.read(e["path"])).hexdigest() == e["sha256"]
    assert names == sorted(["manifest.json", LAYERS, DEVICE, BPE, NOTEBOOK])
    assert manifest["kind"] == "g2c-submission" and manifest["format"] == 1 and manifest["student"] == "correct"
    assert manifest["worked"] == ["03", "04"]
    assert len(manifest["course"]["commit"]) == 40                      # the student's course commit
    with zipfile.ZipFile(world["klass"] / "empty.zip") as zf:
        assert zf.namelist() == ["manifest.json"]
    assert "archive holds only its manifest" in world["outputs"]["empty"]


def test_submit_warns_about_edits_outside_the_exercises_and_leaves_them_out(world):
    student = world["student"]
    (student / "tests" / "test_nn.py").write_text("def test_mine():\n    pass\n")
    (student / "g2c" / "nn" / "helper.py").write_text("X = 1\n")
    (student / LAYERS).write_text(sol(LAYERS))
    try:
        res = run(student, "-m", "g2c.course", "submit")              # default name and place
        assert res.returncode == 0, res.stderr
        out = res.stdout
        assert "tests/test_nn.py (changed): not handed in (your teacher grades with the course's own tests)" in out
        assert "g2c/nn/helper.py (new file): not handed in" in out
        assert "tests/test_nn.py differs from the course's recorded test file" in out
        archive = student / "hand-in" / "g2c-Dana-Student.zip"
        with zipfile.ZipFile(archive) as zf:
            assert sorted(zf.namelist()) == sorted(["manifest.json", LAYERS])
        assert "hand-in" not in git(student, "status", "--porcelain")   # git ignores the hand-in folder
    finally:
        git(student, "checkout", "-q", "--", ".")
        (student / "g2c" / "nn" / "helper.py").unlink()
        shutil.rmtree(student / "hand-in", ignore_errors=True)


def test_submit_refuses_a_folder_that_is_no_checkout_and_a_foreign_one(world, tmp_path):
    res = run(world["student"], "-m", "g2c.course", "submit", cwd=tmp_path)
    assert res.returncode == 2 and "is not inside a g2c checkout" in res.stderr, res.stderr
    # this Python runs the teacher's course (from a sub-folder `-m` does not import the student's own g2c),
    # the folder is the student's: refused, nothing written
    res = subprocess.run([sys.executable, "-m", "g2c.course", "submit"], cwd=world["student"] / "docs",
                         env=env_for(world["teacher"]), capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "hand in from" in res.stderr, res.stderr
    assert not (world["student"] / "hand-in").exists() and not (world["teacher"] / "hand-in").exists()
    # an archive path that cannot be written: one line, exit 2, nothing left behind
    for out in (tmp_path, tmp_path / "a-file" / "x.zip"):
        (tmp_path / "a-file").write_text("a file, not a folder")
        res = run(world["student"], "-m", "g2c.course", "submit", "--out", str(out), cwd=world["student"])
        assert res.returncode == 2 and "Traceback" not in res.stderr and res.stderr.count("\n") == 1, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]
    # from a fresh teacher trial: a mistyped folder was created in silence; an empty --name took git's name
    res = run(world["student"], "-m", "g2c.course", "submit", "--out", str(tmp_path / "no" / "dir" / "x.zip"),
              cwd=world["student"])
    assert res.returncode == 2 and f"the folder {tmp_path / 'no' / 'dir'} does not exist" in res.stderr, res.stderr
    res = run(world["student"], "-m", "g2c.course", "submit", "--name", " ", "--out", str(tmp_path / "x.zip"),
              cwd=world["student"])
    assert res.returncode == 2 and "--name is empty" in res.stderr, res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]


def test_hand_in_names_keep_every_script_and_refuse_a_name_with_no_letter(tmp_path):
    # a teacher trial: "Zoë Ñúñez" handed in as g2c-Zo-ez.zip, and "..", "/" both became g2c-student.zip
    # (the second replacing the first); "--out ''" and "--out hand-in" were told to end the name in .zip
    from g2c.course.teaching import Refused, _slug, submit

    assert _slug("Zoë Ñúñez") == "Zoë-Ñúñez" and _slug("Ada Lovelace") == "Ada-Lovelace"
    assert _slug("Zoe\u0308") == "Zoë"                      # one spelling (NFC) whatever the keyboard sent
    assert _slug("李 小龍") == "李-小龍" and _slug("a/b") == "a-b" and _slug("../x") == "x"
    assert _slug("..") == "" and _slug("/") == ""
    for name in ("..", "/", "--"):
        with pytest.raises(Refused, match=r"has no letter or digit to name the archive with"):
            submit(REPO_ROOT, name=name)
    for out in (Path(""), tmp_path):
        with pytest.raises(Refused, match=r"is a folder: give the archive's file name, ending in \.zip"):
            submit(REPO_ROOT, name="Ada", out=out)
    archive = submit(REPO_ROOT, name="Ada", out=tmp_path / "ada.ZIP", echo=lambda line: None)   # any case
    assert archive.is_file() and zipfile.is_zipfile(archive)


# -- grade a class ----------------------------------------------------------------------------------

def test_class_run_reports_every_submission_and_exits_1(world):
    res = world["res"]
    assert res.returncode == 1, res.stdout + res.stderr     # notzip, tampered, smuggler: not graded cleanly
    names = set(world["by_name"])
    assert names == {*CASES, "tampered", "smuggler", "notzip", "unpacked", "clone"}   # README.txt is skipped
    assert len(names) >= 10
    status = {n: r["status"] for n, r in world["by_name"].items()}
    assert status == {"correct": "ok", "wrong": "ok", "unfinished": "ok", "empty": "ok", "crashing": "ok",
                      "garbage": "ok", "unpacked": "ok", "clone": "ok", "broken": "ok", "tampered": "tampered",
                      "smuggler": "tampered", "notzip": "error"}
    assert "not a readable zip archive" in world["by_name"]["notzip"]["error"]
    header = next(line for line in res.stdout.splitlines() if line.startswith("student "))
    assert header.split()[:4] == ["student", "status", "03", "04"]
    assert "not graded cleanly: notzip, smuggler, tampered" in res.stdout


def test_correct_wrong_unfinished_empty_and_crashing_are_graded_right(world):
    nn, tok = "tests/test_nn.py", "tests/test_tokenizer.py"
    m = module(world, "correct", "03")
    assert (m["passed"], m["failed"], m["recorded"], m["state"]) == (recorded(nn), 0, recorded(nn), "done")
    assert module(world, "correct", "04")["passed"] == recorded(tok)
    wrong = module(world, "wrong", "03")
    assert 0 < wrong["failed"] and wrong["passed"] + wrong["failed"] == recorded(nn)
    assert any("layernorm" in f["test"].lower() for f in wrong["failures"]), wrong["failures"]
    assert module(world, "wrong", "04")["passed"] == recorded(tok)
    unfinished = module(world, "unfinished", "03")
    assert untouched(nn) < unfinished["passed"] < recorded(nn)
    assert all("resolve_device" in f["test"] for f in unfinished["failures"])     # only device.py is missing
    assert module(world, "unfinished", "04")["passed"] == untouched(tok)          # 04 untouched: pristine counts
    assert module(world, "unpacked", "03")["passed"] == unfinished["passed"]      # the same hand-in, unpacked
    crash = module(world, "crashing", "04")
    assert crash["passed"] == 0 and crash["failed"] == recorded(tok)      # every recorded test fails, not 1
    # the cause and where it happened, in the failure's id
    assert re.fullmatch(re.escape(f"{tok} (collection error: RuntimeError: student code crashed at import "
                                  f"(g2c/tokenizer/bpe.py:") + r"\d+\)\)", crash["failures"][0]["test"]), crash
    assert crash["valid"], crash["warnings"]                    # a crash is a result, not a tampered test file
    assert module(world, "crashing", "03")["passed"] == recorded(nn)
    assert module(world, "garbage", "03")["passed"] == recorded(nn)              # printing garbage changes nothing
    broken = world["by_name"]["broken"]
    for mid, rel in (("03", nn), ("04", tok)):
        m = broken["modules"][mid]
        assert (m["state"], m["passed"], m["recorded"]) == ("crashed", 0, recorded(rel)), m
        assert "SyntaxError" in m["failures"][0]["test"]
    assert any("breaks before any test starts" in n for n in broken["notes"])


def test_isolation_one_submissions_code_never_reaches_another(world):
    # graded two at a time next to the correct one: the empty hand-in still runs the untouched scaffolds
    empty = world["by_name"]["empty"]
    assert empty["worked"] == [] and empty["files"] == {}
    for mid, rel in (("03", "tests/test_nn.py"), ("04", "tests/test_tokenizer.py")):
        m = empty["modules"][mid]
        assert (m["passed"], m["passed"] + m["failed"]) == (untouched(rel), recorded(rel)), m
        assert m["state"] == "not started"


def test_report_numbers_equal_grade_in_the_students_own_copy(world):
    for name in OWN_COPY:
        for mine in world["own"][name]["modules"]:
            theirs = module(world, name, mine["id"])
            keys = ("passed", "failed", "skipped", "total", "recorded", "blocked", "applied")
            assert {k: theirs[k] for k in keys} == {k: mine[k] for k in keys}, (name, mine["id"])
            assert theirs["failures"] == mine["failures"]


def test_tampered_archives_are_reported(world):
    tampered = world["by_name"]["tampered"]
    assert any(f"{LAYERS} does not match its sha256" in p for p in tampered["problems"]), tampered["problems"]
    smuggler = world["by_name"]["smuggler"]
    assert any("carries tests/test_nn.py" in p for p in smuggler["problems"]), smuggler["problems"]
    assert any("unsafe path '../../evil.py'" in p for p in smuggler["problems"]), smuggler["problems"]
    assert not (world["tmp"] / "evil.py").exists() and not (world["klass"].parent.parent / "evil.py").exists()
    # graded on the course's tests, not the smuggled ones
    assert module(world, "smuggler", "03")["total"] == recorded("tests/test_nn.py")


def test_a_clone_with_edited_tests_is_graded_on_the_courses_tests(world):
    clone = world["by_name"]["clone"]
    m = clone["modules"]["03"]
    assert m["passed"] == recorded("tests/test_nn.py") and m["valid"]
    assert any("test files differ from the course's (tests/test_nn.py)" in n for n in clone["notes"]), clone["notes"]


def test_tamper_warning_of_test_sh_in_the_clone(world):
    # The student's own ./test.sh 03 in that clone: 34 tests ran, all pass, but it is no valid grade.
    res = subprocess.run(["./test.sh", "03"], cwd=world["clone"], env=env_for(world["clone"]), capture_output=True,
                         text=True, timeout=900)
    out = res.stdout
    assert res.returncode == 1, out + res.stderr
    n = recorded("tests/test_nn.py")
    assert f"{n - 3}/{n - 3}" in out                                  # the student still sees their result
    assert "tests/test_nn.py differs from the course's recorded test file" in out
    assert f"tests/test_nn.py: {n - 3} tests ran where the course's contract (tests/pristine.json) records {n}" in out
    assert "NOT A VALID GRADE" in out and "all" not in out.splitlines()[-1]


def test_reports_csv_summary_and_answers_page(world):
    grades = world["grades"]
    rows = list(csv.DictReader(io.StringIO((grades / "grades.csv").read_text())))
    correct = {r["module"]: r for r in rows if r["student"] == "correct"}
    assert correct["03"]["score"] == "1.000" and correct["03"]["valid"] == "yes"
    assert [r["status"] for r in rows if r["student"] == "notzip"] == ["error"]
    wrong = next(r for r in rows if r["student"] == "wrong" and r["module"] == "03")
    assert "tests/test_nn.py::" in wrong["failing_tests"]
    summary = (grades / "summary.txt").read_text()
    assert summary.splitlines()[0].startswith("not contained: " if CONTAIN else "contained by ")   # said first
    header = next(line for line in summary.splitlines() if line.startswith("student "))
    assert header.split()[:4] == ["student", "status", "03", "04"]
    page = (grades / "answers.html").read_text()
    assert "The row keeps only a sign. &lt;script&gt;" in page and "<script>" not in page
    assert "Rubric" in page and "biased variance" in page                  # the answer key's rubric beside it
    assert page.count("no notebook handed in") >= 5                         # the others, named
    assert "The row keeps only a sign." in (grades / "answers.md").read_text()


def test_an_endless_loop_times_out_and_the_class_goes_on(world, tmp_path):
    """A hang costs its own module only: the deadline is per module, and after a kill a fresh process grades
    the modules after the hung one (a fresh trial: one endless loop lost every module of a hand-in)."""
    # an interrupted grade-class (Ctrl-C, SIGTERM) kills the grading groups it started in sessions of their own:
    # an endless loop never outlives it (found when a killed run left a student's loop spinning a core)
    import threading

    from g2c.course import sandbox, teaching

    spin = [sys.executable, "-c", "while True:\n    pass"]
    caught = []
    try:
        containment = sandbox.choose_containment()
    except sandbox.Unavailable:
        containment = sandbox.choose_containment(uncontained=True)
    (tmp_path / "copy").mkdir()
    (tmp_path / "results").mkdir()
    jail = sandbox.Jail(copy=tmp_path / "copy", results=tmp_path / "results", private=tmp_path / "private")

    def grading():
        with open(tmp_path / "r.log", "wb") as log:
            r, w = os.pipe()
            os.close(w)
            try:
                teaching._run_with_module_deadline(
                    lambda: sandbox.launch(containment, jail, spin, {"PATH": os.defpath}, log),
                    teaching.ResultsPipe(r), 600.0)
            except RuntimeError as exc:
                caught.append(str(exc))

    worker = threading.Thread(target=grading)
    worker.start()
    try:
        for _ in range(100):
            if sandbox._LIVE:
                break
            time.sleep(0.05)
        (live,) = sandbox._LIVE
        teaching.stop_grading()
        worker.join(10)
        assert not worker.is_alive() and caught == ["grade-class was interrupted while this submission was graded"]
        with pytest.raises(ProcessLookupError):
            os.killpg(live.pid, 0)                              # the group is gone
        assert not sandbox._LIVE
    finally:
        teaching._STOPPING.clear()
    klass = tmp_path / "loop-class"
    klass.mkdir()
    shutil.copy(world["klass"] / "notzip.zip", klass / "a-notzip.zip")
    student = world["student"]
    hangs = {"b-loop": {BPE: sol(BPE) + "\nwhile True:  # a student's endless loop\n    pass\n"},     # 04, at import
             "d-hang03": {LAYERS: sol(LAYERS).replace(                                             # 03, in a test
                 "var = (x - mean).pow(2).mean(dim=-1, keepdim=True)", "while True:\n            pass")}}
    for name, files in hangs.items():
        for rel, text in files.items():
            (student / rel).write_text(text)
        try:
            res = run(student, "-m", "g2c.course", "submit", "--out", str(klass / f"{name}.zip"))
            assert res.returncode == 0, res.stderr
        finally:
            git(student, "checkout", "-q", "--", ".")
    shutil.copy(world["klass"] / "empty.zip", klass / "c-empty.zip")
    t0 = time.monotonic()
    res = run(world["teacher"], "-m", "g2c.course", "grade-class", str(klass), "--modules", "03,04", "--timeout",
              str(LOOP_TIMEOUT), *CONTAIN, timeout=1200)
    wall = time.monotonic() - t0
    assert res.returncode == 1, res.stdout + res.stderr
    report = json.loads((tmp_path / "loop-class-grades" / "grades.json").read_text())   # the default --out
    by = {r["name"]: r for r in report["submissions"]}
    loop, hang = by["b-loop"], by["d-hang03"]
    assert loop["status"] == "timeout" and loop["modules"]["04"]["state"] == "timeout"
    assert loop["modules"]["03"]["passed"] == untouched("tests/test_nn.py")                # graded before the hang
    assert hang["status"] == "timeout" and hang["modules"]["03"]["state"] == "timeout"
    assert hang["modules"]["04"]["passed"] == untouched("tests/test_tokenizer.py")          # graded after the kill
    assert hang["modules"]["04"]["state"] != "timeout", hang["modules"]["04"]
    for r in (loop, hang):
        assert LOOP_TIMEOUT <= r["wall_s"] < 2 * LOOP_TIMEOUT + 60, r["wall_s"]   # one deadline, not two
    assert by["c-empty"]["status"] == "ok"                   # graded after the loops were killed
    assert wall < 5 * LOOP_TIMEOUT + 180
    assert f"b-loop: TIMEOUT: killed after {LOOP_TIMEOUT} s in module 04" in res.stdout
    assert f"d-hang03: TIMEOUT: killed after {LOOP_TIMEOUT} s in module 03" in res.stdout
    assert "its other modules are graded (04)" in res.stdout, res.stdout


def test_grade_class_usage_errors_exit_2(world, tmp_path):
    res = run(world["teacher"], "-m", "g2c.course", "grade-class", str(tmp_path / "missing"))
    assert res.returncode == 2 and "is not a folder" in res.stderr
    res = run(world["teacher"], "-m", "g2c.course", "grade-class", str(tmp_path), "--modules", "99")
    assert res.returncode == 2 and "valid ids" in res.stderr.lower()
    res = run(world["teacher"], "-m", "g2c.course", "grade-class", str(world["teacher"]))
    assert res.returncode == 2 and "is a g2c checkout itself" in res.stderr
    res = run(world["teacher"], "-m", "g2c.course", "grade-class", str(tmp_path))    # a wrong, empty folder
    assert res.returncode == 2 and "holds no submission" in res.stderr, res.stderr
    # a fresh trial: the g2c/ package folder inside an unpacked hand-in was graded as two failed students,
    # its reports written into the student's folder
    wrong = tmp_path / "unpacked" / "g2c"
    for sub in ("specdec", "recurrent"):
        (wrong / sub).mkdir(parents=True)
        (wrong / sub / "x.py").write_text("pass\n")
    res = run(world["teacher"], "-m", "g2c.course", "grade-class", str(wrong))
    assert res.returncode == 2 and "holds no submission" in res.stderr, res.stderr
    assert not (tmp_path / "unpacked" / "g2c-grades").exists()


def test_grade_class_refuses_an_unwritable_report_folder_before_grading(world, tmp_path):
    # from the fresh-student trial: a bad --out used to grade the whole class, then end in a traceback
    klass = tmp_path / "klass"
    klass.mkdir()
    shutil.copy(next(world["klass"].glob("*.zip")), klass / "one.zip")
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    res = run(world["teacher"], "-m", "g2c.course", "grade-class", str(klass), "--modules", "03",
              "--out", str(a_file))
    assert res.returncode == 2 and "is a file: give a folder" in res.stderr, res.stderr
    assert "grading" not in res.stdout and "Traceback" not in res.stderr                # refused before any run
    res = run(world["teacher"], "-m", "g2c.course", "grade-class", str(klass), "--modules", "03",
              "--out", str(a_file / "under-a-file"))
    assert res.returncode == 2 and res.stderr.startswith("grade-class: --out:") and "Traceback" not in res.stderr
    # a fresh teacher's trial: --modules 0 (the grammar's "none") graded nothing, said "all graded" and replaced
    # the class's earlier reports with rows that had no module columns
    reports = tmp_path / "reports"
    reports.mkdir()
    (reports / "grades.csv").write_text("an earlier run\n")
    res = run(world["teacher"], "-m", "g2c.course", "grade-class", str(klass), "--modules", "0", "--out", str(reports))
    assert res.returncode == 2 and "--modules 0 selects no module: give the ids of modules to grade" in res.stderr, \
        res.stderr
    assert (reports / "grades.csv").read_text() == "an earlier run\n" and "grading" not in res.stdout


# -- small pieces -----------------------------------------------------------------------------------

def test_recorded_hashes_are_sha256sum_format_and_cover_the_helpers():
    lines = (REPO_ROOT / "tests" / "pristine.sha256").read_text().splitlines()
    paths = [line.split("  ", 1)[1] for line in lines]
    assert paths == sorted(paths) and "tests/conftest.py" in paths and "tests/test_nn.py" in paths
    assert all(len(line.split("  ", 1)[0]) == 64 for line in lines)


def test_an_empty_or_broken_archive_is_named_for_what_it_is(tmp_path):
    # a helper's trial: a 0-byte hand-in (an upload that never finished) read "not a readable zip archive
    # (BadZipFile: File is not a zip file)"; it now says it is empty and what to ask for
    from g2c.course.teaching import load_submission

    (tmp_path / "bob.zip").write_bytes(b"")
    (tmp_path / "eve.zip").write_bytes(b"this is not a zip archive\n")
    empty, broken = (load_submission(tmp_path / n, REPO_ROOT) for n in ("bob.zip", "eve.zip"))
    assert empty.error.startswith("an empty file (0 bytes), not a zip archive") and "./test.sh --submit" in empty.error
    assert broken.error == ("not a readable zip archive, damaged or cut short in the copy (BadZipFile: File is not "
                            "a zip file): ask for it again (./test.sh --submit)")


def test_a_folder_with_no_submission_names_what_it_holds(tmp_path):
    # a teacher trial: a folder with only notes.txt said "holds no submission", not what it did hold
    from g2c.course.teaching import Refused, grade_class

    (tmp_path / "notes.txt").write_text("marks to enter\n")
    with pytest.raises(Refused, match=r"holds no submission .*; it holds only notes\.txt: check the folder"):
        grade_class(tmp_path, teacher_root=REPO_ROOT)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(Refused, match=r"holds no submission .*; it is empty: check the folder"):
        grade_class(empty, teacher_root=REPO_ROOT)


def test_progress_table_keeps_whole_module_names():
    from g2c.course.progress import ModuleResult, format_table

    title = "Beyond: the speculative-decoding calculator, Be the Verifier, and the serving lab"
    lines = format_table([ModuleResult("specdec-lab", title, 1, 2, 0, 1)]).splitlines()
    start, end = lines[0].index("module"), lines[0].index("needs")
    assert " ".join(line[start:end].strip() for line in lines[2:]) == title       # whole, wrapped, not cut
    assert "…" not in "".join(lines)


def test_a_closed_pipe_ends_quietly():
    # `./test.sh --progress | head -6`: the reader goes away; no BrokenPipeError traceback
    proc = subprocess.Popen([sys.executable, "-m", "g2c.course", "progress"], cwd=REPO_ROOT, env=env_for(REPO_ROOT),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) in (0, 141)
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


def test_contract_check_flags_a_test_file_that_changed_since_its_record(tmp_path):
    import importlib.util

    spec = importlib.util.spec_from_file_location("g2c_contract_for_test", REPO_ROOT / "scripts" / "contract.py")
    contract = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(contract)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_a():\n    pass\n")
    (tmp_path / "tests" / "conftest.py").write_text("")
    hashes = tmp_path / "tests" / "pristine.sha256"
    contract.write_hashes(["tests/test_a.py"], root=tmp_path, path=hashes)
    assert contract.hash_problems(["tests/test_a.py"], root=tmp_path, path=hashes) == []
    assert set(contract.read_hashes(hashes)) == {"tests/test_a.py", "tests/conftest.py"}
    (tmp_path / "tests" / "test_a.py").write_text("def test_a():\n    assert True\n")
    (tmp_path / "tests" / "conftest.py").write_text("import os\n")
    problems = contract.hash_problems(["tests/test_a.py"], root=tmp_path, path=hashes)
    assert len(problems) == 2 and all("changed since its contract was recorded" in p for p in problems)
    assert "python scripts/contract.py --record tests/test_a.py" in problems[0]
