"""Bad input to the hand-in and to class grading, and reports that stay readable (docs/teaching.md).

Each test names the trial that found the problem: a bound switched off by ``--timeout nan``, a file-size limit
that ended in a traceback after the work was done, a damaged or oversized notebook handed in without a word,
edits to provided files left out in silence, two rows with one name, a report folder graded as a student,
``--out`` under a file, a 300-character name, a clone's links and giant files, a 100,000-file archive that made
a 100,000-line summary, and a name that a spreadsheet runs as a formula.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from repo_copy import IGNORED, REPO_ROOT, env_for

from g2c.course import teaching
from g2c.course.files import write_problem
from g2c.course.teaching import Refused, collect_hand_in, grade_class, load_submission, submit

LAYERS, MODULE_PY = "g2c/nn/layers.py", "g2c/nn/module.py"


def archive(path: Path, files: dict[str, bytes], student: str = "x", extra: dict[str, bytes] | None = None) -> None:
    entries = [{"path": rel, "kind": "exercise", "module": "03", "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest()} for rel, data in files.items()]
    manifest = {"kind": "g2c-submission", "format": 1, "student": student, "course": {"commit": None},
                "worked": ["03"] if files else [], "files": entries, "warnings": []}
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest))
        for rel, data in {**files, **(extra or {})}.items():
            zf.writestr(rel, data)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory) -> Path:
    """A teacher's checkout (no git: its tests are checked against the working copy's record)."""
    root = tmp_path_factory.mktemp("inputs") / "teacher"
    shutil.copytree(REPO_ROOT, root, ignore=shutil.ignore_patterns(*IGNORED, "artifacts", "hand-in"), symlinks=True)
    (root / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    return root


def cli(cwd: Path, *args: str, preexec=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "g2c.course", *args], cwd=cwd, env=env_for(cwd),
                          capture_output=True, text=True, timeout=600, preexec_fn=preexec)


# -- grade-class ------------------------------------------------------------------------------------

def test_a_timeout_that_is_not_a_positive_number_is_refused(tmp_path):
    # a fresh trial: --timeout nan switched the per-submission bound off, and a hang hung the class
    for value in ("nan", "inf", "-1", "0"):
        res = cli(REPO_ROOT, "grade-class", str(tmp_path), "--timeout", value)
        assert res.returncode == 2 and f"--timeout {float(value):g}: give the seconds one module" in res.stderr, \
            (value, res.stderr)
        assert "Traceback" not in res.stderr and "grading" not in res.stdout
    with pytest.raises(Refused, match=r"--timeout nan: give the seconds"):
        grade_class(tmp_path, timeout=float("nan"))


def test_a_file_size_limit_while_writing_the_reports_is_one_line(teacher, tmp_path):
    # a fresh trial: under `ulimit -f` the class was graded, then grades.json ended in "OSError: File too large"
    klass = tmp_path / "class"
    klass.mkdir()
    (klass / "notzip.zip").write_bytes(b"not a zip\n")
    limit = 1024                                        # grades.json, the first report, is larger

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    res = cli(teacher, "grade-class", str(klass), "--modules", "03", "--out", str(tmp_path / "out"),
              preexec=small_files)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    line = [ln for ln in res.stderr.splitlines() if ln.startswith("grade-class:")]
    assert line == [f"grade-class: the file-size limit of this shell (ulimit -f) is too small to write "
                    f"{tmp_path / 'out' / 'grades.json'}: raise it (ulimit -f unlimited) or run it where files may "
                    "grow; the previous file, if any, is unchanged"], res.stderr
    assert [p.name for p in (tmp_path / "out").iterdir()] == []          # nothing half-written
    assert write_problem(OSError(27, "File too large"), "x").startswith("the file-size limit of this shell")


def test_two_submissions_with_one_name_get_two_rows_and_a_note(teacher, tmp_path):
    # a fresh trial: ada.zip and ada/ became two identical rows named ada
    klass = tmp_path / "class"
    klass.mkdir()
    archive(klass / "ada.zip", {}, "Ada")
    with zipfile.ZipFile(klass / "ada.zip") as zf:
        zf.extractall(klass / "ada")
    subs, said = teaching._load_class(klass, teacher, None)
    assert sorted(s.name for s in subs) == ["ada.zip", "ada/"]
    assert said == ["2 submissions are named 'ada': their rows are ada/, ada.zip"]
    assert all("2 submissions are named 'ada' (ada/, ada.zip): this row is" in s.notes[0] for s in subs)


def test_a_report_folder_inside_the_class_folder_is_skipped_and_said(teacher, tmp_path):
    # a fresh trial: the reports written into the class folder were graded as a student on the next run
    klass = tmp_path / "class"
    klass.mkdir()
    archive(klass / "ada.zip", {}, "Ada")
    old = klass / "week3-grades"
    old.mkdir()
    (old / "grades.json").write_text(json.dumps({"kind": "g2c-class-grades", "format": 1}))
    here = klass / "reports"
    subs, said = teaching._load_class(klass, teacher, here)
    assert [s.name for s in subs] == ["ada"]
    assert said == ["skipped week3-grades/: a report folder of grade-class, not a submission"]
    here.mkdir()
    (here / "summary.txt").write_text("")
    (here / "grades.csv").write_text("")
    subs, said = teaching._load_class(klass, teacher, here)
    assert [s.name for s in subs] == ["ada"] and "skipped reports/: a report folder" in said[0]


def test_reports_stay_readable_for_a_flood_of_problems_and_a_formula_name(teacher, tmp_path):
    # a fresh trial: a 100,000-file archive made a 100,000-line summary and a 17 MB CSV cell no reader took
    # back; a student name beginning with '=' went into grades.csv as a formula
    klass = tmp_path / "class"
    klass.mkdir()
    junk = {f"junk/{i:05d}.txt": b"x" for i in range(3000)}
    archive(klass / "flood.zip", {}, "Flood", extra=junk)
    archive(klass / "=HYPERLINK(x).zip", {}, "=cmd|' /C calc'!A0")
    archive(klass / "nl\nWARNING: forged.zip", {}, "Nl")        # a newline in a name forged a line
    out = tmp_path / "out"
    said: list[str] = []
    code = grade_class(klass, teacher_root=teacher, out=out, echo=said.append)
    assert code == 1                                          # the flood is tampered
    progress = [line for line in said if line.startswith("[")]
    assert len(progress) == 3 and all("\n" not in line for line in progress), progress
    assert not any(line.startswith("WARNING: forged") for line in "\n".join(said).splitlines()), said
    assert any(line.startswith("[") and "] nl WARNING: forged: " in line for line in progress), progress
    summary = (out / "summary.txt").read_text()
    flood = [line for line in summary.splitlines() if line.startswith("  flood: ")]
    assert len(flood) == teaching.MAX_DETAIL_LINES + 1 and flood[-1].startswith("  flood: ... and ")
    assert len(summary) < 20_000
    rows = list(csv.DictReader(io.StringIO((out / "grades.csv").read_text())))
    by = {r["student"]: r for r in rows}
    assert "'=HYPERLINK(x)" in by and by["'=HYPERLINK(x)"]["name_in_manifest"] == "'=cmd|' /C calc'!A0"
    assert len(by["flood"]["notes"]) <= teaching.MAX_CELL
    report = json.loads((out / "grades.json").read_text())
    kept = next(r for r in report["submissions"] if r["name"] == "flood")["problems"]
    assert len(kept) == teaching.MAX_LINES_JSON + 1 and kept[-1] == f"... and {3000 - teaching.MAX_LINES_JSON} more"
    assert teaching.csv_cell("-1+2") == "'-1+2" and teaching.csv_cell("@SUM(A1)") == "'@SUM(A1)"
    assert teaching.csv_cell("plain") == "plain" and teaching.csv_cell(None) == ""


def test_a_clone_with_a_link_or_a_giant_file_is_refused_file_by_file(teacher, tmp_path):
    # a fresh trial: a clone's exercise file linked into the teacher's answer key was followed without a note,
    # and a clone's 1 GB exercise file was read whole
    clone = tmp_path / "clone"
    (clone / "g2c" / "course").mkdir(parents=True)
    (clone / "g2c" / "course" / "registry.py").write_text("")
    (clone / "solutions").mkdir()
    (clone / "solutions" / "generated.json").write_text("{}")
    (clone / "g2c" / "nn").mkdir()
    (clone / LAYERS).symlink_to(teacher / "solutions" / LAYERS)
    with open(clone / "g2c" / "nn" / "device.py", "wb") as f:
        f.truncate(teaching.MAX_FILE_BYTES + 1)                # sparse: no disk used
    sub = load_submission(clone, teacher)
    assert sub.files == {}
    assert sorted(sub.problems) == ["g2c/nn/device.py is larger than 50 MiB (ignored)",
                                    f"tampered: {LAYERS} in the clone is a link (to {teacher / 'solutions' / LAYERS}): "
                                    "refused, as in a folder hand-in; the scaffold grades"]


def test_fifos_links_escapes_and_bogus_ids_are_reported_in_one_clean_line_each(teacher, tmp_path):
    # a red team's trial after containment: a FIFO and a symlinked tests/ in a clone said nothing, a linked file in
    # a folder hand-in read "missing from archive", a bogus worked id passed in silence, terminal escapes in a
    # name reached the reports, and a traceback went into an error row
    clone = tmp_path / "clone"
    (clone / "g2c" / "course").mkdir(parents=True)
    (clone / "g2c" / "course" / "registry.py").write_text("")
    (clone / "solutions").mkdir()
    (clone / "solutions" / "generated.json").write_text("{}")
    (clone / "g2c" / "nn").mkdir()
    os.mkfifo(clone / LAYERS)
    (clone / "tests").symlink_to(teacher / "tests", target_is_directory=True)
    sub = load_submission(clone, teacher)                      # returns: the FIFO was never opened
    assert sub.files == {}
    assert sub.problems == [f"tampered: {LAYERS} in the clone is a FIFO: refused (never read); the scaffold grades"]
    assert sub.notes == [f"the clone's tests are not plain files (tests is a link (to {teacher / 'tests'})): ignored, "
                         "never read; the course's tests grade"]

    folder = tmp_path / "folder"
    (folder / "g2c" / "nn").mkdir(parents=True)
    data = b"x = 1\n"
    (folder / LAYERS).symlink_to(teacher / "solutions" / LAYERS)
    (folder / "manifest.json").write_text(json.dumps({
        "kind": "g2c-submission", "format": 1, "student": "\x1b[2J\x1b[31mEve\x1b[0m", "course": {"commit": None},
        "worked": ["03", "99"], "warnings": [],
        "files": [{"path": LAYERS, "kind": "exercise", "module": "03", "bytes": len(data),
                   "sha256": hashlib.sha256(data).hexdigest()}]}))
    sub = load_submission(folder, teacher)
    assert sub.files == {}
    assert sorted(sub.problems) == [
        "tampered: its manifest.json names worked modules the course does not have ('99'): ignored; the modules of "
        "its files count",
        f"tampered: {LAYERS} in the hand-in folder is a link (to {teacher / 'solutions' / LAYERS}): refused (never "
        "read); the scaffold grades"][::-1]
    assert not any("missing from" in p for p in sub.problems)

    assert teaching.clean_text("\x1b[31mred\x1b[0m\x07 \u202eevil") == "red? ?evil"
    assert teaching.one_line("Traceback (most recent call last):\n  File x\nValueError: bad") == \
        "Traceback (most recent call last): File x ValueError: bad"
    assert teaching.last_error("Traceback (most recent call last):\n  File x\nE   ValueError: bad\n") == \
        "ValueError: bad"
    assert teaching.csv_cell("a\x1b[2Jb\nc") == "ab c"
    report = {"containment": {"lines": ["contained"]}, "modules": ["03"], "wall_s": 1.0, "submissions": [
        {"name": "\x1b[2Jeve", "status": "error", "worked": [], "modules": {}, "problems": [], "notes": [],
         "error": "the grader exited\nTraceback (most recent call last):\n  boom"}]}
    summary = teaching.summary_text(report)
    assert "\x1b" not in summary and "  eve: ERROR: the grader exited Traceback (most recent call last): boom" in \
        summary


# -- hand in ----------------------------------------------------------------------------------------

@pytest.fixture
def student(teacher, tmp_path) -> Path:
    """A student's checkout with git (so edits outside the exercise files are seen)."""
    root = tmp_path / "student"
    shutil.copytree(teacher, root, symlinks=True, ignore=shutil.ignore_patterns(".venv"))
    git = ["git", "-c", "user.name=S", "-c", "user.email=s@example.org", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "-A"], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "course"], cwd=root, check=True)
    return root


def test_submit_warns_about_a_damaged_or_oversized_notebook_and_edited_provided_code(student):
    # a fresh trial: a damaged notebook working copy was handed in without a word; a 1 GB notebook was taken
    # (the teacher's grader then ignored it); an edit to provided code (g2c/nn/module.py) was left out silently
    work = student / "notebooks" / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "03-nn.ipynb").write_text('{"cells": [')
    with open(work / "04-tokenizer.ipynb", "wb") as f:
        f.truncate(teaching.MAX_FILE_BYTES + 1)
    (student / MODULE_PY).write_text((student / MODULE_PY).read_text() + "\n# my helper\n")
    hand_in = collect_hand_in(student)
    handed = [rel for rel, _, _ in hand_in.files]
    assert "notebooks/work/03-nn.ipynb" in handed and "notebooks/work/04-tokenizer.ipynb" not in handed
    said = "\n".join(hand_in.warnings)
    assert ("notebooks/work/03-nn.ipynb is not a readable notebook (JSONDecodeError at line 1): it is handed in, but "
            "your teacher will see none of its answers") in said
    assert "./notebook.sh 03 --fresh" in said
    assert "notebooks/work/04-tokenizer.ipynb is 50 MiB, over the 50 MiB your teacher's grader reads: it is left out" \
        in said
    assert (f"{MODULE_PY} (changed): not handed in (provided code of module 03, not an exercise file: your teacher "
            "grades with the course's own copy of it") in said


def test_submit_out_under_a_file_and_a_very_long_name_say_what_is_wrong(tmp_path, monkeypatch):
    # a fresh trial: --out under a file was told to create the folder; a 300-character --name ended in
    # "File name too long"
    (tmp_path / "a-file").write_text("a file")
    with pytest.raises(Refused, match=r"--out .*x\.zip: .*a-file is a file, not a folder: give a path in a folder"):
        submit(REPO_ROOT, name="Ada", out=tmp_path / "a-file" / "x.zip")
    with pytest.raises(Refused, match=r"--out: the file name a+\.\.\. is 304 bytes, longer than a file system "
                                      r"allows \(255\): give a shorter one"):
        submit(REPO_ROOT, name="Ada", out=tmp_path / ("a" * 300 + ".zip"))
    written, lines = [], []
    monkeypatch.setattr(teaching, "write_archive", lambda hand_in, out, student: (written.append((out, student))
                                                                                 or {"files": [], "worked": [],
                                                                                     "course": {"commit": None}}))
    submit(REPO_ROOT, name="Ada " + "L" * 300, echo=lines.append)
    (out, student), = written
    assert student == "Ada " + "L" * 300                       # the manifest keeps the name whole
    assert out.name == f"g2c-Ada-{'L' * 96}.zip" and len(out.name.encode()) < 255
    assert lines[0] == (f"note: your name is long: the archive is named after its first 100 characters "
                        f"(g2c-Ada-{'L' * 96}.zip); the manifest keeps it whole")
    assert os.path.basename(out) == out.name


def test_answers_md_shows_a_students_links_and_tags_as_text():
    """A student's answer and name go into answers.md as text: a ``[x](javascript:...)`` link, a tag or a fence
    of their own stays inert (issue 53c, item 6)."""
    answer = "See [x](javascript:alert(1)) and <img src=x onerror=alert(2)>\n```\n# not a heading\n"
    page = [{"module": "06", "title": "T", "error": None,
             "questions": [{"question": "Q?", "rubric": "R", "worked": "W"}],
             "students": [{"name": "[ada](javascript:alert(3))", "answers": [answer], "error": None}]}]
    md = teaching.answers_markdown(page)
    assert "**\\[ada\\]\\(javascript:alert\\(3\\)\\)**:" in md, md
    block = md.split("**:\n\n", 1)[1]
    assert block.startswith("````text\nSee [x](javascript:alert(1)) and <img src=x onerror=alert(2)>\n```\n"
                            "# not a heading\n````\n"), block
