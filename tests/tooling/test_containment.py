"""Class grading contains the code it runs (docs/teaching.md, "What a grade proves"): one hostile submission per
family of attack, written here, graded beside an honest one; each test asserts that the teacher is told and that
nothing outside the submission's copy changed.

Families: writes into the teacher's ``.venv``, checkout, a neighbour's copy and ``$HOME``; patches pytest; writes
the results file itself and exits; leaves a ``setsid`` daemon; reads the class folder. The class is graded
contained as the user running the tests (root in CI), again as an unprivileged user (``setpriv`` to uid 65534,
where the machine lets root do that), and once ``--uncontained``, where the checks after each submission must
catch what the sandbox would have stopped. Module 03 only: its tests take seconds.

The payloads are harmless even if containment failed: they write marker files and ``.pth`` lines naming a folder
that does not exist, and every test removes its markers.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import pytest
from repo_copy import IGNORED, REPO_ROOT, env_for, own_artifacts

from g2c.course import forgery, integrity, sandbox

LAYERS, DEVICE = "g2c/nn/layers.py", "g2c/nn/device.py"
TIMEOUT = "240"                   # per module: far above the ~10 s module 03 takes on a loaded 2-core machine
TOKEN = secrets.token_hex(4)      # names every marker this run's payloads could leave
NOBODY = 65534
NAMESPACES, WHY_NOT = (sandbox._probe_namespaces()[:2] if sys.platform.startswith("linux")
                       else (False, "the namespace sandbox is Linux's"))
# CI's Linux machine has them (as root and as any user); a machine without says why it skips
linux_namespaces = pytest.mark.skipif(not NAMESPACES, reason=f"no namespace sandbox here: {WHY_NOT}")


def sol(rel: str) -> bytes:
    return (REPO_ROOT / "solutions" / rel).read_bytes()


def scaffold(rel: str) -> bytes:
    return (REPO_ROOT / rel).read_bytes()


def archive(path: Path, files: dict[str, bytes], student: str) -> None:
    """A hand-in as ``submit`` writes it (manifest with each file's sha256)."""
    entries = [{"path": rel, "kind": "exercise", "module": "03", "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest()} for rel, data in files.items()]
    manifest = {"kind": "g2c-submission", "format": 1, "student": student, "course": {"commit": None},
                "worked": ["03"], "files": entries, "warnings": []}
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("manifest.json", json.dumps(manifest))
        for rel, data in files.items():
            zf.writestr(rel, data)


def payload_writer(teacher: Path, home: Path) -> str:
    """Writes into the teacher's .venv (a .pth), checkout (a test and its recorded hash), a neighbour's copy and
    $HOME (the private one and the real one), every way it can find."""
    return f'''
import glob as _glob, os as _os, pwd as _pwd, sys as _sys
def _g2c_try(path, text):
    try:
        with open(path, "a") as f:
            f.write(text)
    except OSError:
        pass
for _site in [p for p in _sys.path if p.endswith("site-packages")]:
    _g2c_try(_os.path.join(_site, "g2c_attack_{TOKEN}.pth"), "/nonexistent-g2c-attack-{TOKEN}\\n")
_g2c_try({str(teacher / "tests" / "test_nn.py")!r}, "\\ndef test_attack_{TOKEN}():\\n    pass\\n")
_g2c_try({str(teacher / "tests" / "pristine.sha256")!r}, "")
_g2c_try({str(teacher / ".git" / "hooks" / "pre-commit")!r}, "#!/bin/sh\\necho g2c-attack-{TOKEN}\\n")
for _copy in _glob.glob("/tmp/g2c-class-*/sub-*/g2c/g2c/nn/layers.py") + _glob.glob(
        _os.environ.get("TMPDIR", "/tmp") + "/*/sub-*/g2c/g2c/nn/layers.py"):
    _g2c_try(_copy, "\\nraise RuntimeError('sabotaged by a neighbour {TOKEN}')\\n")
_g2c_try(_os.path.expanduser("~/.g2c-attack-{TOKEN}"), "x")
_g2c_try({str(home / f".g2c-attack-{TOKEN}")!r}, "x")
_g2c_try(_os.path.join(_pwd.getpwuid(_os.getuid()).pw_dir, ".g2c-attack-{TOKEN}"), "x")
'''


PAYLOAD_PATCH_PYTEST = '''
import _pytest.reports as _g2c_reports
_g2c_init = _g2c_reports.TestReport.__init__
def _g2c_pass(self, *args, **kwargs):       # every test passes, whatever happened
    _g2c_init(self, *args, **kwargs)
    self.outcome, self.longrepr = "passed", None
_g2c_reports.TestReport.__init__ = _g2c_pass
'''

PAYLOAD_RESULT_FILE = '''
import json as _json, os as _os, signal as _signal, stat as _stat
def _g2c_forge():
    module = {"id": "03", "title": "x", "passed": 37, "failed": 0, "skipped": 0, "total": 37, "recorded": 37,
              "untouched": 18, "own_failures": 0, "blocked": {}, "applied": [], "failures": [], "warnings": [],
              "valid": True}
    try:                                    # a results file named on the grader's command line, if there is one
        args = open(f"/proc/{_os.getppid()}/cmdline", "rb").read().split(b"\\0")
        with open(args[args.index(b"--json") + 1].decode(), "w") as f:
            _json.dump({"format": 1, "worked": ["03"], "requested": ["03"], "modules": [module]}, f)
    except (OSError, ValueError, IndexError):
        pass
    lines = "".join(_json.dumps(r) + "\\n" for r in [{"module": module}, {"end": True, "left": 0}, *(
        {"id": f"tests/test_nn.py::test_{i}", "when": "call", "outcome": "passed"} for i in range(37)),
        {"end": 0, "items": 37}]).encode()
    for fd in _os.listdir("/proc/self/fd"):  # then every pipe it holds: full marks, an end
        try:
            if _stat.S_ISFIFO(_os.fstat(int(fd)).st_mode):
                _os.write(int(fd), lines)
        except OSError:
            pass
    _os.kill(_os.getppid(), _signal.SIGKILL)
    _os._exit(0)
_g2c_forge()
'''


def payload_daemon(reports: Path, home: Path) -> str:
    """A setsid daemon that outlives its grading to rewrite the reports later (and leave a marker)."""
    targets = (str(reports / "grades.csv"), str(home / f".g2c-daemon-{TOKEN}"))
    script = "\n".join(["import time", "for _ in range(300):", "    time.sleep(0.1)", f"    for p in {targets!r}:",
                        "        try:", "            open(p, 'a').write('student,1.000' + chr(10))",
                        "        except OSError:", "            pass", ""])
    return f'''
import os as _os, sys as _sys
if _os.fork() == 0:
    _os.setsid()
    if _os.fork() == 0:
        _os.execv(_sys.executable, [_sys.executable, "-c", {script!r}, "g2c-daemon-{TOKEN}"])
    _os._exit(0)
'''


def payload_reader(klass: Path) -> str:
    """Reads the class folder (named here, and searched for in every process's command line) and runs the
    honest student's code as its own."""
    return f'''
import glob as _glob, os as _os, zipfile as _zipfile
_g2c_places = [{str(klass)!r}]
for _cmd in _glob.glob("/proc/*/cmdline"):
    try:
        _g2c_places += [a.decode() for a in open(_cmd, "rb").read().split(b"\\0") if a.endswith(b"class")]
    except OSError:
        pass
for _place in _g2c_places:
    try:
        with _zipfile.ZipFile(_os.path.join(_place, "a-honest.zip")) as _zf:
            exec(_zf.read("g2c/nn/layers.py"), globals())
        break
    except (OSError, KeyError):
        pass
'''


def world_folder(prefix: str) -> Path:
    """A folder every user can enter (tmp_path's base is root's own, mode 700)."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    base.chmod(0o755)
    return base


def teacher_copy(base: Path) -> Path:
    """The teacher's checkout: a git repository with the course committed, its .venv linked, its artifacts its own.

    The artifacts are copied (about 120 MB), not linked: grade-class watches them, and the other test files of a
    parallel run (the contract check's second pytest process) may touch this checkout's ``artifacts/`` while a
    class is graded, which the watch rightly reads as the teacher's environment changing and stops the class."""
    teacher = base / "teacher"
    shutil.copytree(REPO_ROOT, teacher, ignore=shutil.ignore_patterns(*IGNORED, "artifacts", "hand-in"),
                    symlinks=True)
    (teacher / ".venv").symlink_to(Path(sys.prefix), target_is_directory=True)
    own_artifacts(teacher)
    git = ["git", "-c", "user.name=Teacher", "-c", "user.email=t@example.org", "-c", "commit.gpgsign=false"]
    subprocess.run([*git, "init", "-q"], cwd=teacher, check=True)
    (teacher / ".git" / "info" / "exclude").write_text(".venv\nartifacts\n")
    subprocess.run([*git, "add", "-A"], cwd=teacher, check=True)
    subprocess.run([*git, "commit", "-qm", "course"], cwd=teacher, check=True)
    return teacher


def tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (links as their target's name) with its sha256."""
    out = {}
    for p in sorted(folder.rglob("*")):
        if p.is_symlink():
            out[p.relative_to(folder).as_posix()] = "-> " + os.readlink(p)
        elif p.is_file():
            out[p.relative_to(folder).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def markers() -> list[Path]:
    """Every marker a payload of this run could have left outside its copy: a .pth in the real site-packages, a
    file in the real home folders."""
    found = list((Path(os.path.realpath(sys.prefix)) / "lib").glob(f"python*/site-packages/g2c_attack_{TOKEN}.pth"))
    for home in {Path.home(), Path("/root"), Path("/tmp")}:
        for name in (f".g2c-attack-{TOKEN}", f".g2c-daemon-{TOKEN}"):
            if (home / name).exists():
                found.append(home / name)
    return found


def daemons() -> list[int]:
    """Processes whose command line carries this run's daemon token."""
    pids = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if f"g2c-daemon-{TOKEN}".encode() in cmdline.read_bytes():
                pids.append(int(cmdline.parent.name))
        except OSError:
            pass
    return pids


def build_class(base: Path, teacher: Path, home: Path, reports: Path) -> Path:
    klass = base / "class"
    klass.mkdir()
    honest = {LAYERS: sol(LAYERS), DEVICE: sol(DEVICE)}
    subs = {
        "a-honest": honest,
        "b-writer": {LAYERS: sol(LAYERS) + payload_writer(teacher, home).encode(), DEVICE: sol(DEVICE)},
        "c-patcher": {LAYERS: scaffold(LAYERS) + PAYLOAD_PATCH_PYTEST.encode()},
        "d-forger": {LAYERS: scaffold(LAYERS) + PAYLOAD_RESULT_FILE.encode()},
        "e-daemon": {LAYERS: sol(LAYERS) + payload_daemon(reports, home).encode(), DEVICE: sol(DEVICE)},
        "f-reader": {LAYERS: scaffold(LAYERS) + payload_reader(klass).encode()},
    }
    for name, files in subs.items():
        archive(klass / f"{name}.zip", files, name)
    return klass


def grade(teacher: Path, klass: Path, reports: Path, home: Path, *extra: str, nobody: bool = False,
          jobs: str = "2") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "g2c.course", "grade-class", str(klass), "--modules", "03", "--jobs", jobs,
           "--timeout", TIMEOUT, "--out", str(reports), *extra]
    env = env_for(teacher, HOME=str(home), OMP_NUM_THREADS="1")
    if nobody:
        cmd = as_nobody(cmd, klass.parent / "stage")
    return subprocess.run(cmd, cwd=teacher, env=env, capture_output=True, text=True, timeout=1800)


# the running Python, bound back into a sandbox's private /tmp when it lives there (a checkout cloned into
# ``mktemp -d``): what grade-class exposes for the teacher's .venv, for the tests that launch a sandbox directly
PYTHON_HOME = list(dict.fromkeys(Path(os.path.realpath(p)) for p in (sys.prefix, sys.base_prefix)))


def hidden_ancestors(path: Path) -> list[Path]:
    """Folders above ``path`` that another user cannot enter (root's 700 home holding a pyenv Python)."""
    out = []
    for parent in reversed(Path(path).parents):
        if parent != Path("/") and not parent.stat().st_mode & 0o001:
            out.append(parent)
    return out


def as_nobody(cmd: list[str], stage: Path) -> list[str]:
    """``cmd`` as uid 65534 (from root, through ``setpriv``). When what the grader reads lies under a folder that
    user cannot enter (a pyenv in root's home; a checkout cloned into ``mktemp -d``'s 700 folder, holding the
    ``.venv`` and the artifacts), a private mount namespace lays an empty, enterable tmpfs over each such folder with
    only those paths bound back (through ``stage``): the test machine stays as it was."""
    needed = list(dict.fromkeys(Path(os.path.realpath(p)) for p in
                                (sys.base_prefix, sys.prefix, REPO_ROOT / "artifacts")))
    blocked = sorted({a for p in needed for a in hidden_ancestors(p)}, key=lambda p: len(str(p)))
    tops = [b for b in blocked if not any(t in b.parents for t in blocked if t != b)]   # the outermost ones
    drop = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
    if not tops:
        return [*drop, *cmd]
    stage.mkdir(exist_ok=True)              # mount points for the private namespace (the world's folder: removed)
    lines, n = ["set -e"], 0
    for top in tops:
        keep = [p for p in needed if top in p.parents]
        for i, p in enumerate(keep, start=n):
            lines += [f"mkdir -p {stage}/{i}", f"mount --bind {p} {stage}/{i}"]
        lines.append(f"mount -t tmpfs -o mode=755 tmpfs {top}")
        for i, p in enumerate(keep, start=n):
            lines += [f"mkdir -p {p}", f"mount --move {stage}/{i} {p}"]
        n += len(keep)
    lines.append('exec "$@"')
    return ["unshare", "--mount", "sh", "-c", "\n".join(lines), "sh", *drop, *cmd]


def run_attack_class(prefix: str, *, nobody: bool = False) -> dict:
    base = world_folder(prefix)
    teacher = teacher_copy(base)
    home = base / "home"
    home.mkdir()
    (home / ".bashrc").write_text("# the teacher's\n")
    reports = base / "reports"
    klass = build_class(base, teacher, home, reports)
    if nobody:
        for p in [base, *base.rglob("*")]:
            os.lchown(p, NOBODY, NOBODY)
    before = {"teacher": tree(teacher), "home": tree(home), "class": tree(klass)}
    started = time.time()
    res = grade(teacher, klass, reports, home, nobody=nobody)
    grades = reports / "grades.csv"
    csv_then = grades.read_bytes() if grades.exists() else b""
    time.sleep(2.0)                   # the daemon would write every 0.1 s
    return {"base": base, "teacher": teacher, "home": home, "klass": klass, "reports": reports, "res": res,
            "before": before, "after": {"teacher": tree(teacher), "home": tree(home), "class": tree(klass)},
            "csv_then": csv_then, "csv_later": grades.read_bytes() if grades.exists() else b"",
            "report": json.loads((reports / "grades.json").read_text()) if (reports / "grades.json").exists()
            else None, "started": started, "daemons": daemons(), "markers": markers()}


def cleanup(world: dict) -> None:
    for pid in daemons():
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    for m in markers():
        m.unlink(missing_ok=True)
    shutil.rmtree(world["base"], ignore_errors=True)


AS_NOBODY = hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("setpriv") is not None


@pytest.fixture(scope="module", params=["as-this-user", "as-nobody"])
def graded(request):
    """The attack class graded contained: as the user running the tests (root in CI), and as uid 65534 (from root
    through setpriv: the unprivileged path; as a non-root user the first run is that path already)."""
    if not NAMESPACES:
        pytest.skip(f"no namespace sandbox here: {WHY_NOT}")
    if request.param == "as-nobody" and not AS_NOBODY:
        pytest.skip("running the grader as another user needs root and util-linux setpriv; this user is "
                    "unprivileged, so the as-this-user run is the unprivileged path")
    world = run_attack_class(f"g2c-attack-{request.param}-", nobody=request.param == "as-nobody")
    world["as"] = request.param
    yield world
    cleanup(world)


def rows(world: dict) -> dict[str, dict]:
    assert world["report"] is not None, world["res"].stdout + world["res"].stderr
    return {r["name"]: r for r in world["report"]["submissions"]}


def assert_nothing_outside_changed(world: dict) -> None:
    """The teacher's checkout (its .git, tests and records), the teacher's home, the class folder, the real
    site-packages and home folders are as they were, no daemon is left, the reports were not rewritten."""
    for what in ("teacher", "home", "class"):
        changed = {k for k in world["before"][what].keys() | world["after"][what].keys()
                   if world["before"][what].get(k) != world["after"][what].get(k)}
        assert not changed, (what, sorted(changed)[:10])
    assert world["markers"] == [] and world["daemons"] == []
    assert world["csv_later"] == world["csv_then"]


def test_the_class_run_says_what_was_contained_and_the_honest_student_is_untouched(graded):
    by = rows(graded)
    res = graded["res"]
    assert res.returncode == 1, res.stdout + res.stderr        # forged rows: not graded cleanly
    first = (graded["reports"] / "summary.txt").read_text().splitlines()[0]
    assert first.startswith("contained by Linux namespaces (unshare), as "), first
    assert first.split(", as ")[1].startswith("nobody:" if graded["as"] == "as-nobody" else
                                              f"{sandbox.current_user()}:"), first
    honest = by["a-honest"]["modules"]["03"]                    # graded beside the writer (--jobs 2)
    assert (by["a-honest"]["status"], honest["passed"], honest["state"]) == ("ok", 37, "done"), by["a-honest"]
    assert len(honest["checks"]) == 4 and sorted(set(honest["checks"].values())) == ["failed", "passed"]
    assert_nothing_outside_changed(graded)


def test_family_writes_into_the_venv_the_checkout_a_neighbours_copy_and_home(graded):
    # every write refused (a read-only file system, or the place is not there at all); graded on its honest code;
    # the teacher is told by the flag, and the honest neighbour graded beside it kept its 37/37
    writer = rows(graded)["b-writer"]
    assert writer["modules"]["03"]["passed"] == 37 and writer["status"] == "ok", writer
    assert any("mentions site-packages" in f for f in writer["flags"]), writer["flags"]
    assert rows(graded)["a-honest"]["modules"]["03"]["passed"] == 37
    assert_nothing_outside_changed(graded)


def test_family_patched_pytest_is_forged(graded):
    # every test "passed" in pytest's report, so the check tests that must fail did too
    patcher = rows(graded)["c-patcher"]
    assert patcher["status"] == "forged" and patcher["modules"]["03"]["state"] == "forged", patcher
    assert "must have failed" in patcher["error"]
    assert patcher["modules"]["03"]["reported"]["passed"] >= 37 and patcher["modules"]["03"]["passed"] == 0
    assert any("pytest internals" in f for f in patcher["flags"]), patcher["flags"]
    csv_rows = [line for line in graded["csv_then"].decode().splitlines() if line.startswith("c-patcher")]
    assert csv_rows and all(",forged," in line and ",1.000," not in line for line in csv_rows), csv_rows
    assert_nothing_outside_changed(graded)


def test_family_a_results_file_written_by_hand_is_forged(graded):
    # full marks written into every pipe it holds (there is no results file to write), then the grader killed and
    # an exit: the grade comes only from the grader's own pipe, which stops before its end: no score
    forger = rows(graded)["d-forger"]
    assert forger["status"] in ("error", "forged") and forger["modules"]["03"]["passed"] == 0, forger
    assert forger["modules"]["03"]["state"] in ("error", "forged"), forger
    assert any("mentions /proc" in f for f in forger["flags"]), forger["flags"]
    csv_rows = [line for line in graded["csv_then"].decode().splitlines() if line.startswith("d-forger")]
    assert csv_rows and all(",1.000," not in line for line in csv_rows), csv_rows
    assert_nothing_outside_changed(graded)


def test_family_a_setsid_daemon_is_counted_and_killed(graded):
    # killed with the namespace before the grade was written, counted on its row; it never rewrote the reports
    daemon = rows(graded)["e-daemon"]
    assert daemon["left"] and daemon["left"] >= 1, daemon
    assert any(f"left {daemon['left']} process" in n for n in daemon["notes"]), daemon["notes"]
    assert daemon["modules"]["03"]["passed"] == 37
    assert graded["daemons"] == [] and graded["csv_later"] == graded["csv_then"]
    assert_nothing_outside_changed(graded)


def test_family_reading_the_class_folder_finds_nothing(graded):
    # the class folder is not there inside, nor the grade-class command line in /proc: graded as the scaffold it
    # handed in (it would have run the honest student's code); the teacher is told by the flag
    reader = rows(graded)["f-reader"]
    assert reader["modules"]["03"]["passed"] == reader["modules"]["03"]["untouched"] < 37, reader
    assert any("mentions /proc" in f for f in reader["flags"]), reader["flags"]
    assert_nothing_outside_changed(graded)


def test_uncontained_grading_is_refused_without_the_flag_and_said_on_the_first_line(monkeypatch, tmp_path):
    from g2c.course.teaching import Refused, grade_class

    monkeypatch.setattr(sandbox.platform, "system", lambda: "Plan9")       # a system with no sandbox known
    (tmp_path / "class").mkdir()
    archive(tmp_path / "class" / "ada.zip", {LAYERS: sol(LAYERS)}, "ada")
    with pytest.raises(Refused, match=r"cannot contain the graded code here: no sandbox is known on Plan9.*"
                                      r"--container IMAGE.*--uncontained"):
        grade_class(tmp_path / "class", modules="03", out=tmp_path / "out")
    assert not (tmp_path / "out" / "grades.json").exists()
    c = sandbox.choose_containment(uncontained=True)
    assert c.lines()[0] == f"not contained: grading untrusted code as {sandbox.current_user()}"


def test_uncontained_writes_outside_the_copy_stop_the_class_and_say_how_to_restore():
    """No sandbox: the checks after each submission find what it wrote (a test and its recorded hash rewritten, a
    git hook), stop the class before the next submission and name the commands that restore the checkout."""
    base = world_folder("g2c-uncontained-")
    try:
        teacher = teacher_copy(base)
        home = base / "home"
        home.mkdir()
        klass = base / "class"
        klass.mkdir()
        rewrite = f'''
import hashlib as _h
_t = {str(teacher / "tests" / "test_nn.py")!r}
_r = {str(teacher / "tests" / "pristine.sha256")!r}
_text = open(_t).read() + "\\ndef test_attack_{TOKEN}():\\n    pass\\n"
open(_t, "w").write(_text)
_digest = _h.sha256(_text.encode()).hexdigest()
open(_r, "w").write("".join(l if not l.endswith("  tests/test_nn.py\\n") else _digest + "  tests/test_nn.py\\n"
                            for l in open(_r).readlines()))
open({str(teacher / ".git" / "hooks" / "pre-commit")!r}, "w").write("#!/bin/sh\\necho g2c-attack\\n")
'''
        archive(klass / "a-honest.zip", {LAYERS: sol(LAYERS), DEVICE: sol(DEVICE)}, "a")
        archive(klass / "b-writer.zip", {LAYERS: sol(LAYERS) + rewrite.encode(), DEVICE: sol(DEVICE)}, "b")
        archive(klass / "c-honest.zip", {LAYERS: sol(LAYERS), DEVICE: sol(DEVICE)}, "c")
        reports = base / "reports"
        res = grade(teacher, klass, reports, home, "--uncontained", jobs="1")
        assert res.returncode == 1, res.stdout + res.stderr
        summary = (reports / "summary.txt").read_text()
        assert summary.splitlines()[0] == f"not contained: grading untrusted code as {sandbox.current_user()}"
        by = {r["name"]: r for r in json.loads((reports / "grades.json").read_text())["submissions"]}
        assert by["a-honest"]["status"] == "ok" and by["a-honest"]["modules"]["03"]["passed"] == 37
        writer = by["b-writer"]
        assert writer["status"] == "tampered", writer
        told = writer["problems"][0]
        assert told.startswith("tampered: wrote outside its copy (") and "tests/test_nn.py" in told, told
        found = json.loads((reports / "grades.json").read_text())["environment_changed"]["found"]
        assert "the checkout's .git: .git/hooks/pre-commit (new or changed)" in found, found
        assert "the checkout: git status:  M tests/test_nn.py" in found, found
        assert by["c-honest"]["status"] == "not graded" and "b-writer's grading changed" in by["c-honest"]["error"]
        assert "THE TEACHER'S ENVIRONMENT CHANGED while b-writer was graded" in summary
        assert "tests/test_nn.py differs from the record as committed" in summary
        assert "git checkout -- tests/" in summary and ".git/hooks" in summary
        # the next class run refuses to start on these tests
        again = grade(teacher, klass, base / "again", home, "--uncontained", jobs="1")
        assert again.returncode == 2 and "is not the course as committed" in again.stderr, again.stderr
    finally:
        shutil.rmtree(base, ignore_errors=True)


# -- the pieces, one by one ----------------------------------------------------------------------

def test_watch_sees_a_new_pth_and_a_changed_package_file_in_a_venv(tmp_path):
    """The cheap fingerprint: a ctime pass since a stamp finds a new .pth, an edited module and a removed file in
    a .venv, and nothing when nothing changed."""
    root = tmp_path / "course"
    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    (site / "torch").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text("x = 1\n")
    (site / "old.py").write_text("")
    (root / "tests").mkdir(parents=True)
    (root / ".venv").symlink_to(tmp_path / "venv", target_is_directory=True)
    watch, refusals, warnings = integrity.begin(root, prune=[tmp_path / "stamps"])
    assert refusals == [] and any("not a git checkout" in w for w in warnings)
    since = integrity.stamp(tmp_path / "stamps")
    assert integrity.changes(watch, since, tmp_path / "stamps") == []
    (site / "evil.pth").write_text("import os\n")
    (site / "torch" / "__init__.py").write_text("x = 2\n")
    found = integrity.changes(watch, since, tmp_path / "stamps")
    shown = {d for w, d in found if w == ".venv"}
    assert shown == {f"{site / 'evil.pth'} (new or changed)", f"{site / 'torch' / '__init__.py'} (new or changed)"}
    assert "rm -rf .venv && ./setup.sh" in "\n".join(integrity.restore_lines(watch, found))
    since = integrity.stamp(tmp_path / "stamps")
    (site / "old.py").unlink()                                   # a removal: its folder changed
    assert integrity.changes(watch, since, tmp_path / "stamps") == [(".venv", f"{site} (new or changed)")]


def test_watch_compares_the_tests_with_the_record_as_committed(tmp_path):
    teacher = teacher_copy(tmp_path)
    watch, refusals, _ = integrity.begin(teacher)
    assert refusals == [] and watch.record_from.startswith("the record as committed")
    since = integrity.stamp(tmp_path / "stamps")
    test = teacher / "tests" / "test_nn.py"
    text = test.read_text() + "\n# edited\n"
    test.write_text(text)                              # the test and its working record, rewritten together
    record = teacher / "tests" / "pristine.sha256"
    digest = hashlib.sha256(text.encode()).hexdigest()
    record.write_text("".join(line if not line.endswith("  tests/test_nn.py\n") else f"{digest}  tests/test_nn.py\n"
                              for line in record.read_text().splitlines(keepends=True)))
    found = integrity.changes(watch, since, tmp_path / "stamps")
    assert ("tests", "tests/test_nn.py differs from the record as committed (git show HEAD:tests/pristine.sha256)") \
        in found, found
    assert ("tests", "tests/pristine.sha256 changed since the class run began") in found
    assert any(w == "the checkout" and "git status:  M tests/test_nn.py" in d for w, d in found), found
    _, refusals, _ = integrity.begin(teacher)
    assert refusals and "tests/test_nn.py differs from the record as committed" in refusals[0]


def test_artifacts_are_checked_against_their_pins(tmp_path):
    root = tmp_path / "course"
    folder = root / "artifacts" / "models" / "Tiny"
    folder.mkdir(parents=True)
    (folder / "model.bin").write_bytes(b"weights")
    watch, _, warnings = integrity.begin(root)
    watch.pins = {"Tiny": {"model.bin": {"sha256": hashlib.sha256(b"weights").hexdigest(), "size": 7}}}
    assert integrity.artifact_problems(watch) == []
    (folder / "model.bin").write_bytes(b"weightz")
    assert integrity.artifact_problems(watch) == [f"{folder / 'model.bin'} is not its pinned copy "
                                                  "(g2c/assets/pins.json)"]


def test_check_tests_catch_a_blanket_pass_a_missing_report_and_extra_passes():
    checks = forgery.make_checks(["tests/test_nn.py"])["tests/test_nn.py"]
    kinds = [forgery.must_pass(c) for c in checks]
    assert len(checks) == 4 and set(kinds) == {True, False}
    assert len({c[0] for c in checks}) == 4 and all(len(c[0]) == 12 and int(c[0], 16) >= 0 for c in checks)
    assert all((a * b == c) == must for (_, a, b, c), must in zip(checks, kinds))
    honest = {f"tests/test_nn.py::{c[0]}": "passed" if must else "failed" for c, must in zip(checks, kinds)}
    base = {"passed": 30, "failed": 7, "skipped": 0, "failures": []}
    spec = {"tests/test_nn.py": checks}
    assert forgery.verify({**base, "checks": honest}, spec, 37) == ([], [])
    blanket = {k: "passed" for k in honest}
    forged, _ = forgery.verify({**base, "checks": blanket}, spec, 37)
    wrong = kinds.count(False)
    first = next(c[0] for c, must in zip(checks, kinds) if not must)
    assert forged == [f"{wrong} check test{'s' if wrong > 1 else ''} came out wrong (tests/test_nn.py::"
                      f"{first} passed, where it must have failed"
                      + (f"; and {wrong - 1} more" if wrong > 1 else "") + ")"], forged
    forged, _ = forgery.verify({**base, "checks": {}}, spec, 37)
    assert forged == ["4 of its 4 check tests are missing from the report"]
    forged, _ = forgery.verify({**base, "passed": 38, "failed": 0, "checks": honest}, spec, 37)
    assert forged == ["38 tests passed where the course records 37"]
    _, invalid = forgery.verify({**base, "passed": 20, "checks": honest}, spec, 37)
    assert invalid == ["27 tests ran where the course records 37"]
    # a file that could not be imported runs no check test: that is a crash, not a forgery
    crashed = {**base, "checks": {}, "failures": [{"test": "tests/test_nn.py (collection error: X)"}]}
    assert forgery.verify(crashed, spec, 37) == ([], [])
    # a skipped check (a whole file skipped) earns nothing and is accepted
    assert forgery.verify({**base, "checks": {k: "skipped" for k in honest}}, spec, 37) == ([], [])


def test_check_tests_run_through_the_plugin_and_the_grade_comes_from_the_stream(tmp_path):
    """gradeplugin adds the check tests (read from a pipe, in no file and no environment variable) among the
    file's own tests and streams every outcome; the counts come from that stream, the checks apart; a junit
    report rewritten after pytest wrote it disagrees with the stream."""
    from g2c.course.progress import _pytest

    rel = "tests/test_x.py"
    (tmp_path / "tests").mkdir()
    (tmp_path / rel).write_text("import os\n\n\ndef test_course():\n    assert 'G2C_GRADE_FDS' not in os.environ\n\n\n"
                                "def test_fails():\n    assert False\n")
    checks = forgery.make_checks([rel])
    counts, failures, found, _, forged, incomplete = _pytest([rel], [], tmp_path, sys.executable, False, checks)
    assert (counts[rel]["passed"], counts[rel]["failed"]) == (1, 1), counts
    assert found == {f"{rel}::{c[0]}": "passed" if forgery.must_pass(c) else "failed" for c in checks[rel]}
    assert forged == [] and incomplete == []
    assert [t for t, _ in failures] == [f"{rel}::test_fails"]
    assert not any(c[0] in (tmp_path / rel).read_text() for c in checks[rel])
    # each check is named like one of the file's own tests, with its token as a parameter, in the file's code
    (tmp_path / "conftest.py").write_text(
        "import os\n"
        "def pytest_collection_finish(session):\n"
        "    with open(os.path.join(os.environ['SEEN'], 'seen.txt'), 'w') as f:\n"
        "        f.write('\\n'.join(f'{i.nodeid} {i.function.__code__.co_filename}' for i in session.items))\n")
    os.environ["SEEN"] = str(tmp_path)
    try:
        checks = forgery.make_checks([rel])
        _pytest([rel], [], tmp_path, sys.executable, False, checks)
    finally:
        del os.environ["SEEN"]
    seen = (tmp_path / "seen.txt").read_text().splitlines()
    assert len(seen) == 6 and all(line.endswith(f" {tmp_path / rel}") for line in seen), seen
    assert sorted(line.split(" ")[0] for line in seen if "[" in line) == sorted(
        f"{rel}::{name}[{c[0]}]" for c in checks[rel] for name in ("test_course", "test_fails")
        if f"{rel}::{name}[{c[0]}]" in "".join(seen))
    assert sum("[" in line for line in seen) == 4
    # the same run, its junit report rewritten at exit to "all passed"
    (tmp_path / "conftest.py").write_text(
        "import atexit, sys\n"
        "def _rewrite():\n"
        "    path = next(a.split('=', 1)[1] for a in sys.argv if a.startswith('--junitxml='))\n"
        "    text = open(path).read()\n"
        "    import re\n"
        "    open(path, 'w').write(re.sub(r'<failure.*?</failure>', '', text, flags=re.S))\n"
        "atexit.register(_rewrite)\n")
    counts, _, _, _, forged, _ = _pytest([rel], [], tmp_path, sys.executable, False, forgery.make_checks([rel]))
    assert counts[rel]["passed"] == 1
    assert any("disagrees with the outcomes streamed" in f for f in forged), forged


def test_the_stream_refuses_lines_twice_lines_after_the_end_and_a_missing_end():
    from g2c.course.progress import fold_stream

    checks = {"tests/t.py": [("c0ffee", 2, 3, 7)]}
    line = b'{"id": "tests/t.py::test_a", "when": "call", "outcome": "passed"}'
    end = b'{"end": 0, "items": 2}'
    counts, found, forged, incomplete = fold_stream(
        [line, b'{"id": "tests/t.py::test_a[c0ffee]", "when": "call", "outcome": "failed"}', end], checks, True)
    assert counts["tests/t.py"]["passed"] == 1 and found == {"tests/t.py::c0ffee": "failed"}
    assert forged == [] and incomplete == []
    assert fold_stream([line, line, end], checks, True)[2] == [
        "the outcome of tests/t.py::test_a (call) was reported twice"]
    assert fold_stream([end, line], checks, True)[2] == ["test outcomes arrived after the run's end"]
    assert fold_stream([b"passed", end], checks, True)[2] == [
        "a line of the test outcomes is not one the grader writes"]
    assert fold_stream([line], checks, True)[3] == [
        "the test outcomes stop before the run's end (the test process died or was killed)"]


def test_flags_name_what_makes_a_teacher_look(tmp_path):
    from g2c.course.scaffolds import expected

    fresh = {p.relative_to(REPO_ROOT).as_posix(): t for p, t in expected(REPO_ROOT).items()}
    files = {LAYERS: sol(LAYERS),
             DEVICE: sol(DEVICE) + b"\nimport subprocess\nopen('/proc/self/status')\nos._exit(0)\n"}
    found = forgery.flags(files, REPO_ROOT, fresh)
    assert f"{LAYERS} is byte-identical to the answer key" in found
    for what in ("subprocess", "/proc", "os._exit"):
        assert any(f.startswith(f"{DEVICE} mentions {what} (line ") for f in found), (what, found)
    assert forgery.flags({DEVICE: fresh[DEVICE].encode() + b"\n# mine\n"}, REPO_ROOT, fresh) == []
    records = [{"worked": ["03"], "modules": {"03": {"seconds": s, "state": "done"}}} for s in (10.0, 11.0, 12.0, 0.4)]
    forgery.slow_fast_flags(records)
    assert records[3]["flags"] == ["module 03 was graded in 0.4 s, the class median is 10.5 s"]
    assert all("flags" not in r for r in records[:3])


def test_flag_code_built_at_run_time_and_not_on_the_answer_key():
    """A forger hidden by base64 + exec (issue 53c, item 3) is a LOOK flag; no file of the answer key trips it
    (so it fires only where a student's file adds it), nor do a method named ``eval`` or ``model.eval()``."""
    from g2c.course.scaffolds import expected

    fresh = {p.relative_to(REPO_ROOT).as_posix(): t for p, t in expected(REPO_ROOT).items()}
    hidden = (b"\nimport base64 as _b\nexec(_b.b64decode('cGFzcw==').decode())\n",
              b"\nimport os as _o\n_f = getattr(_o, 'po' + 'pen')\n",
              b"\nimport importlib\n_m = importlib.import_module('sub' + 'process')\n",
              b"\n_m = __import__('marshal')\n")
    for extra in hidden:
        found = forgery.flags({DEVICE: sol(DEVICE) + extra}, REPO_ROOT, fresh)
        n = sol(DEVICE).count(b"\n")
        assert [f for f in found if "code built at run time" in f] in [[
            f"{DEVICE} mentions code built at run time (line {n + k}), which its scaffold and the answer key "
            "do not"] for k in (2, 3)], (extra, found)
    honest = b"\nclass M:\n    def eval(self):\n        return self\n\n\nM().eval()\nimport re\nre.compile('x')\n"
    assert forgery.flags({DEVICE: sol(DEVICE) + honest}, REPO_ROOT, fresh) == []
    keys = sorted((REPO_ROOT / "solutions" / "g2c").rglob("*.py"))
    assert len(keys) > 20
    tripped = [p for p in keys if "code built at run time" in forgery._mentions(p.read_text())]
    assert tripped == [], tripped


def test_seatbelt_profile_denies_writes_network_and_the_hidden_folders(tmp_path):
    """macOS cannot be tested here: the profile's text is. Balanced, every parameter it names is passed, writes
    and the network denied before the private folders are allowed back, one read rule per hidden folder."""
    jail = sandbox.Jail(copy=tmp_path / "copy", results=tmp_path / "results", private=tmp_path / "private",
                        hide=[tmp_path / "class", tmp_path / "reports"])
    text = sandbox.seatbelt_profile(len(jail.hide))
    depth = 0
    for ch in text.replace('#"^/dev/tty"', "").replace('#"^/dev/fd/"', ""):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        assert depth >= 0
    assert depth == 0 and text.startswith("(version 1)\n(allow default)\n")
    import re

    named = set(re.findall(r'\(param "([A-Z_0-9]+)"\)', text))
    passed = dict(sandbox.seatbelt_params(jail))
    assert named == set(passed) == {"COPY", "PRIVATE", "HIDDEN_0", "HIDDEN_1"}      # no results folder: a pipe
    assert passed["HIDDEN_1"] == os.path.realpath(tmp_path / "reports")
    order = [text.index(s) for s in ("(deny network*)", "(deny file-write*)", '(subpath (param "PRIVATE"))',
                                     '(deny file-read* (subpath (param "HIDDEN_0")))',
                                     '(allow file-read* (subpath (param "COPY"))')]
    assert order == sorted(order)


def test_container_command_mounts_read_only_and_cuts_the_network(tmp_path):
    jail = sandbox.Jail(copy=tmp_path / "copy", results=tmp_path / "results", private=tmp_path / "p")
    cmd = sandbox.container_command("/usr/bin/podman", "g2c-grader", jail,
                                    ["/x/python", "-m", "g2c.course", "grade", "03"], {"HOME": "/tmp/home"},
                                    "g2c-grade-1", [tmp_path / "artifacts"])
    line = " ".join(cmd)
    for part in ("--network none", "--read-only", "--cap-drop ALL", "no-new-privileges", "--rm",
                 f"{tmp_path / 'copy'}:{tmp_path / 'copy'}:ro", "--pids-limit 512", "/tmp:rw,size=256m",
                 f"{tmp_path / 'artifacts'}:{tmp_path / 'artifacts'}:ro", "g2c-grader python3 -m g2c.course grade 03"):
        assert part in line, part
    assert str(tmp_path / "results") not in line          # nothing on the host is writable


@linux_namespaces
def test_sandbox_pid1_drops_privileges_hides_and_kills_what_is_left(tmp_path):
    """One run, no grading: inside, the host is read-only, the hidden folder empty, nothing writable but the
    private /tmp (the results folder neither: what comes out comes over a descriptor passed in), no capability
    left, no network but loopback; a setsid child is counted and killed when the command ends."""
    # the teacher's folder is bound back into the private /tmp; the class folder inside it is hidden under an
    # empty tmpfs; a neighbour's copy elsewhere in /tmp is simply not there
    copy, results, teacher = tmp_path / "copy", tmp_path / "results", tmp_path / "teacher"
    secret, neighbour = teacher / "class", tmp_path / "neighbour"
    for d in (copy, results, secret, neighbour):
        d.mkdir(parents=True)
    (secret / "ada.zip").write_text("secret")
    (teacher / "notes.txt").write_text("visible")
    probe = f'''
import json, os, socket, subprocess, sys
out = {{}}
def can_write(p):
    try:
        open(p, "a").close(); return True
    except OSError:
        return False
out["copy"] = can_write({str(copy / "x")!r})
out["results"] = can_write({str(results / "x")!r})
out["tmp"] = can_write("/tmp/x")
out["host"] = can_write({str(PYTHON_HOME[0] / "zz-g2c-probe")!r})
out["class"] = sorted(os.listdir({str(secret)!r}))
out["teacher"] = sorted(os.listdir({str(teacher)!r}))
out["neighbour"] = os.path.exists({str(neighbour)!r})
out["caps"] = [l.split()[1] for l in open("/proc/self/status") if l.startswith("CapEff")][0]
try:
    socket.create_connection(("1.1.1.1", 53), timeout=2); out["net"] = True
except OSError:
    out["net"] = False
subprocess.Popen(["setsid", "sleep", "300"], pass_fds=())
os.write(int(sys.argv[1]), json.dumps(out).encode())
'''
    containment = sandbox.choose_containment()
    assert containment.kind == "namespaces"
    jail = sandbox.Jail(copy=copy, results=results, private=tmp_path / "private", hide=[secret],
                        expose=[teacher, *PYTHON_HOME])
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": "/tmp"}
    r, w = os.pipe()
    with open(tmp_path / "log", "wb") as log:
        run = sandbox.launch(containment, jail, [sys.executable, "-c", probe, str(w)], env, log, (w,))
        os.close(w)
        rc, left = run.finish()
    with os.fdopen(r, "rb") as f:
        out = json.loads(f.read().decode() or "null")
    assert rc == 0 and left == 1, (rc, left, (tmp_path / "log").read_text())
    assert out == {"copy": False, "results": False, "tmp": True, "host": False, "class": [],
                   "teacher": ["class", "notes.txt"], "neighbour": False, "caps": "0" * 16, "net": False}, out
    assert not (PYTHON_HOME[0] / "zz-g2c-probe").exists()     # the .venv: on the host (bound back if under /tmp)


def test_cost_measures_each_row_it_prints():
    lines = []
    out = sandbox.cost(1, echo=lines.append)
    assert set(out) >= {"plain start", "checks after a submission"} and all(v > 0 for v in out.values())
    assert lines[-1].startswith("containment adds ") if NAMESPACES else lines[0].startswith("no sandbox here")


def test_sandbox_hides_the_host_sockets_under_run(tmp_path):
    """A network namespace does not cover a socket bound to a path: the host's /run (docker.sock, the session
    bus, agents' sockets) is an empty tmpfs inside, so a listener there is out of reach (issue 53c, item 2)."""
    copy, results = tmp_path / "copy", tmp_path / "results"
    copy.mkdir()
    results.mkdir()
    place = Path("/run") / f"g2c-probe-{os.getpid()}"
    listener = None
    try:
        place.mkdir()
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(place / "s.sock"))
        listener.listen(1)
        os.chmod(place, 0o777)
        os.chmod(place / "s.sock", 0o777)
    except OSError:                                  # an unprivileged user: the mount is still checked below
        place = None
    assert "/run" in sandbox.runtime_dirs()
    probe = f'''
import json, os, socket, sys
out = {{"run": sorted(os.listdir("/run"))}}
try:
    socket.socket(socket.AF_UNIX, socket.SOCK_STREAM).connect({str(place / "s.sock") if place else ""!r})
    out["connected"] = True
except OSError:
    out["connected"] = False
os.write(int(sys.argv[1]), json.dumps(out).encode())
'''
    containment = sandbox.choose_containment()
    assert containment.kind == "namespaces"
    jail = sandbox.Jail(copy=copy, results=results, private=tmp_path / "private", expose=PYTHON_HOME)
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": "/tmp"}
    r, w = os.pipe()
    try:
        with open(tmp_path / "log", "wb") as log:
            run = sandbox.launch(containment, jail, [sys.executable, "-c", probe, str(w)], env, log, (w,))
            os.close(w)
            rc, _ = run.finish()
        with os.fdopen(r, "rb") as f:
            out = json.loads(f.read().decode() or "null")
    finally:
        if listener is not None:
            listener.close()
            shutil.rmtree(place, ignore_errors=True)
    assert rc == 0, (rc, (tmp_path / "log").read_text())
    assert out == {"run": [], "connected": False}, out


def test_a_checkout_git_refuses_for_its_owner_says_so_and_how_to_fix_it(tmp_path, monkeypatch):
    """A checkout owned by another user is refused by git ("dubious ownership"): the warning names that cause and
    the fix, not "not a git checkout" (issue 53c, item 4)."""
    if os.geteuid() != 0:
        pytest.skip("giving the repository to another user needs root")
    repo = tmp_path / "repo"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    for p in [repo, *repo.rglob("*")]:
        os.lchown(p, 65534, 65534)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))     # no safe.directory of this machine
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    why = integrity.git_refusal(repo)
    assert why == (f"git refuses {repo}: it is owned by another user than the one grading (git's \"dubious "
                   f"ownership\"). Trust it with: git config --global --add safe.directory {repo}"), why
    subprocess.run(["git", "config", "--global", "--add", "safe.directory", str(repo)], check=True)
    assert integrity.git_refusal(repo) is None
    assert integrity.git_refusal(tmp_path) is None                          # no repository at all: not this cause
