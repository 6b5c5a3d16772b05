"""The cheats a red team built after class grading was contained (issue 53, item 4: "the grade must not rest on
a channel the graded code can write undetected"), each written here as a submission whose code lies only in an
exercise file, graded beside an honest one; each test asserts how it ends and that nothing outside its copy
changed (docs/teaching.md, "What a grade proves").

- ``forger_hook``: reads the names of the grader's check tests from its environment and marks every other test
  passed (a patched ``TestReport``).
- ``forger_junit``: an ``atexit`` handler rewrites pytest's junit report after pytest wrote it.
- ``fast_forger``: ``Function.runtest`` replaced by a no-op (except for the check tests it could name).
- ``race``: a daemon stops the grader, rewrites its results file after the grader wrote it, and lets it go on.
- ``answer_key``: executes the answer key of its own module, from its copy or the teacher's checkout found
  through the ``.venv``'s real path.
- ``disk_fill``, ``fork_bomb``, ``daemon_pipes``: the limits. These three encode their outcome in their score
  (they carry the honest solution, and break it when the limit did not hold): 300 MiB written into a private
  folder or the results folder; 1000 processes started; a daemon that keeps the pytest run's output pipes open.

Module 03 only. The payloads are harmless if containment failed: what they write they remove, the processes
they start end within minutes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys

import pytest
from test_containment import (
    AS_NOBODY,
    DEVICE,
    LAYERS,
    NAMESPACES,
    NOBODY,
    WHY_NOT,
    archive,
    assert_nothing_outside_changed,
    cleanup,
    daemons,
    grade,
    markers,
    scaffold,
    sol,
    teacher_copy,
    tree,
    world_folder,
)

FORGER_HOOK = '''
import json as _g2c_json, os as _g2c_os
import _pytest.reports as _g2c_reports
_g2c_names = {n for v in _g2c_json.loads(_g2c_os.environ.get("G2C_GRADE_CHECKS") or "{}").values() for n in v}
_g2c_init = _g2c_reports.TestReport.__init__
def _g2c_hook(self, *args, **kwargs):          # the check tests as they come out, everything else passed
    _g2c_init(self, *args, **kwargs)
    if self.nodeid.rsplit("::", 1)[-1] not in _g2c_names:
        self.outcome, self.longrepr = "passed", None
_g2c_reports.TestReport.__init__ = _g2c_hook
'''

FORGER_JUNIT = '''
import atexit as _g2c_atexit, json as _g2c_json, os as _g2c_os, sys as _g2c_sys
def _g2c_rewrite():                            # after pytest wrote its report: every course test passed
    import xml.etree.ElementTree as ET
    names = {n for v in _g2c_json.loads(_g2c_os.environ.get("G2C_GRADE_CHECKS") or "{}").values() for n in v}
    path = next((a.split("=", 1)[1] for a in _g2c_sys.argv if a.startswith("--junitxml=")), None)
    if path and _g2c_os.path.exists(path):
        tree = ET.parse(path)
        for case in tree.iter("testcase"):
            if case.get("name") not in names:
                for child in list(case):
                    if child.tag in ("failure", "error", "skipped"):
                        case.remove(child)
        tree.write(path)
_g2c_atexit.register(_g2c_rewrite)
'''

FAST_FORGER = '''
import json as _g2c_json, os as _g2c_os
import _pytest.python as _g2c_python
_g2c_names = {n for v in _g2c_json.loads(_g2c_os.environ.get("G2C_GRADE_CHECKS") or "{}").values() for n in v}
_g2c_runtest = _g2c_python.Function.runtest
def _g2c_fast(self):                           # nothing runs but the check tests it can name
    if self.name in _g2c_names:
        return _g2c_runtest(self)
_g2c_python.Function.runtest = _g2c_fast
'''

RACE = '''
import json as _g2c_json, os as _g2c_os, signal as _g2c_signal, time as _g2c_time
def _g2c_race():
    grader = _g2c_os.getppid()
    try:
        args = open(f"/proc/{grader}/cmdline", "rb").read().split(b"\\0")
        path = args[args.index(b"--json") + 1].decode()
    except (OSError, ValueError, IndexError):
        return
    if _g2c_os.fork():
        return
    _g2c_os.setsid()
    if _g2c_os.fork():
        _g2c_os._exit(0)
    end = _g2c_time.monotonic() + 600
    while _g2c_time.monotonic() < end:           # the grader's last write, then full marks before anyone reads
        try:
            data = _g2c_json.loads(open(path).read())
            mods = [m for m in data["modules"] if m.get("id") == "03" and m.get("failed")]
        except (OSError, ValueError, KeyError):
            mods = []
        if mods:
            _g2c_os.kill(grader, _g2c_signal.SIGSTOP)
            for m in mods:
                m["passed"], m["failed"], m["failures"] = m["passed"] + m["failed"], 0, []
            with open(path + ".tmp", "w") as f:
                _g2c_json.dump(data, f)
            _g2c_os.replace(path + ".tmp", path)
            _g2c_os.kill(grader, _g2c_signal.SIGCONT)
        _g2c_time.sleep(0.001)
    _g2c_os._exit(0)
_g2c_race()
'''

ANSWER_KEY = '''
import os as _g2c_os, sys as _g2c_sys
def _g2c_places():
    here = _g2c_os.path.dirname(_g2c_os.path.abspath(__file__))
    copy = _g2c_os.path.dirname(_g2c_os.path.dirname(here))
    roots = [copy, _g2c_os.path.dirname(_g2c_os.path.realpath(_g2c_os.path.join(copy, ".venv"))),
             _g2c_os.path.dirname(_g2c_os.path.realpath(_g2c_sys.prefix))]
    try:
        roots.append(_g2c_os.path.dirname(_g2c_os.readlink(_g2c_os.path.join(copy, ".venv"))))
    except OSError:
        pass
    return [_g2c_os.path.join(r, "solutions", "g2c", "nn", "layers.py") for r in roots]
for _g2c_key in _g2c_places():
    try:
        with open(_g2c_key) as _g2c_f:
            exec(_g2c_f.read(), globals())
        break
    except OSError:
        pass
'''

GIT_KEY = '''
import os as _g2c_os, subprocess as _g2c_sp, sys as _g2c_sys, zlib as _g2c_zlib
def _g2c_git_dirs(root):
    dot = _g2c_os.path.join(root, ".git")
    dirs = [dot]
    try:
        with open(dot) as _g2c_f:
            gd = _g2c_f.read().split("gitdir:", 1)[1].strip()
        dirs.append(gd)
        with open(_g2c_os.path.join(gd, "commondir")) as _g2c_f:
            dirs.append(_g2c_os.path.join(gd, _g2c_f.read().strip()))
    except (OSError, IndexError):
        pass
    return dirs
def _g2c_key():
    here = _g2c_os.path.dirname(_g2c_os.path.abspath(__file__))
    copy = _g2c_os.path.dirname(_g2c_os.path.dirname(here))
    roots = [copy, _g2c_os.path.dirname(_g2c_os.path.realpath(_g2c_os.path.join(copy, ".venv"))),
             _g2c_os.path.dirname(_g2c_os.path.realpath(_g2c_sys.prefix))]
    for root in roots:              # git itself, any owner accepted
        try:
            out = _g2c_sp.run(["git", "-c", "safe.directory=*", "-C", root, "show",
                               "HEAD:solutions/g2c/nn/layers.py"], capture_output=True, timeout=30).stdout
        except (OSError, _g2c_sp.SubprocessError):
            out = b""
        if b"def " in out:
            return out
    for root in roots:              # the object store read directly
        for d in _g2c_git_dirs(root):
            try:
                with open(_g2c_os.path.join(d, "objects", "%(h)s"[:2], "%(h)s"[2:]), "rb") as _g2c_f:
                    return _g2c_zlib.decompress(_g2c_f.read()).split(b"\\0", 1)[1]
            except (OSError, IndexError, _g2c_zlib.error):
                pass
    return b""
_g2c_src = _g2c_key()
if _g2c_src:
    exec(compile(_g2c_src, __file__, "exec"), globals())
'''

DISK_FILL = '''
import os as _g2c_os
def _g2c_fill():                               # the places it could fill that took more than 256 MiB
    places = ["/tmp", "/var/tmp", "/dev/shm", _g2c_os.path.expanduser("~")]
    try:
        args = open(f"/proc/{_g2c_os.getppid()}/cmdline", "rb").read().split(b"\\0")
        places.append(_g2c_os.path.dirname(args[args.index(b"--json") + 1].decode()))
    except (OSError, ValueError, IndexError):
        pass
    over, chunk = [], b"\\1" * (1 << 20)
    for place in places:
        path, n = _g2c_os.path.join(place, f"g2c-fill-{_g2c_os.getpid()}"), 0
        try:
            with open(path, "wb") as f:
                for _ in range(300):
                    f.write(chunk)
                    f.flush()
                    n += 1
        except OSError:
            pass
        finally:
            try:
                _g2c_os.unlink(path)
            except OSError:
                pass
        if n >= 300:
            over.append(place)
    return over
_g2c_over = _g2c_fill()
if _g2c_over:
    raise RuntimeError(f"wrote 300 MiB into {_g2c_over}")
'''

FORK_BOMB = '''
import os as _g2c_os, signal as _g2c_signal
def _g2c_bomb():                               # 1000 processes at once (each a sleep that ends by itself)
    pids = []
    try:
        for _ in range(1000):
            pids.append(_g2c_os.posix_spawn("/bin/sleep", ["sleep", "120"], {}))
    except OSError:
        pass
    for pid in pids:
        try:
            _g2c_os.kill(pid, _g2c_signal.SIGKILL)
            _g2c_os.waitpid(pid, 0)
        except OSError:
            pass
    return len(pids)
if _g2c_bomb() >= 1000:
    raise RuntimeError("started 1000 processes")
'''

DAEMON_PIPES = '''
import os as _g2c_os, time as _g2c_time
if _g2c_os.fork() == 0:                        # a daemon holding every descriptor of the pytest run
    _g2c_os.setsid()
    if _g2c_os.fork() == 0:
        _g2c_time.sleep(150)
    _g2c_os._exit(0)
'''

SUBMISSIONS = {
    "a-honest": {LAYERS: sol(LAYERS), DEVICE: sol(DEVICE)},
    "b-forger-hook": {LAYERS: scaffold(LAYERS) + FORGER_HOOK.encode()},
    "c-forger-junit": {LAYERS: scaffold(LAYERS) + FORGER_JUNIT.encode()},
    "d-fast-forger": {LAYERS: scaffold(LAYERS) + FAST_FORGER.encode()},
    "e-race": {LAYERS: scaffold(LAYERS) + RACE.encode()},
    "f-answer-key": {LAYERS: scaffold(LAYERS) + ANSWER_KEY.encode()},
    "j-git-key": {LAYERS: scaffold(LAYERS) + (GIT_KEY % {"h": hashlib.sha1(b"blob %d\0" % len(sol(LAYERS))
                                                                             + sol(LAYERS)).hexdigest()}).encode()},
    "g-disk-fill": {LAYERS: sol(LAYERS) + DISK_FILL.encode(), DEVICE: sol(DEVICE)},
    "h-fork-bomb": {LAYERS: sol(LAYERS) + FORK_BOMB.encode(), DEVICE: sol(DEVICE)},
    "i-daemon-pipes": {LAYERS: sol(LAYERS) + DAEMON_PIPES.encode(), DEVICE: sol(DEVICE)},
}


def run_class(prefix: str, *, nobody: bool) -> dict:
    base = world_folder(prefix)
    teacher = teacher_copy(base)
    home = base / "home"
    home.mkdir()
    (home / ".bashrc").write_text("# the teacher's\n")
    reports, klass = base / "reports", base / "class"
    klass.mkdir()
    for name, files in SUBMISSIONS.items():
        archive(klass / f"{name}.zip", files, name)
    if nobody:
        for p in [base, *base.rglob("*")]:
            os.lchown(p, NOBODY, NOBODY)
    before = {"teacher": tree(teacher), "home": tree(home), "class": tree(klass)}
    res = grade(teacher, klass, reports, home, nobody=nobody)
    grades = reports / "grades.csv"
    csv_then = grades.read_bytes() if grades.exists() else b""
    return {"base": base, "teacher": teacher, "home": home, "klass": klass, "reports": reports, "res": res,
            "before": before, "after": {"teacher": tree(teacher), "home": tree(home), "class": tree(klass)},
            "csv_then": csv_then, "csv_later": grades.read_bytes() if grades.exists() else b"",
            "report": json.loads((reports / "grades.json").read_text()) if (reports / "grades.json").exists()
            else None, "daemons": daemons(), "markers": markers()}


@pytest.fixture(scope="module", params=["as-this-user", "as-nobody"])
def world(request):
    """The payload class graded contained, as the user running the tests and as uid 65534 (through setpriv)."""
    if not NAMESPACES:
        pytest.skip(f"no namespace sandbox here: {WHY_NOT}")
    if request.param == "as-nobody" and not AS_NOBODY:
        pytest.skip("running the grader as another user needs root and util-linux setpriv; this user is "
                    "unprivileged, so the as-this-user run is the unprivileged path")
    w = run_class(f"g2c-payloads-{request.param}-", nobody=request.param == "as-nobody")
    w["as"] = request.param
    yield w
    cleanup(w)


def row(w: dict, name: str) -> dict:
    assert w["report"] is not None, w["res"].stdout[-3000:] + w["res"].stderr[-3000:]
    return next(r for r in w["report"]["submissions"] if r["name"] == name)


def csv_rows(w: dict, name: str) -> list[str]:
    return [line for line in w["csv_then"].decode().splitlines() if line.startswith(name)]


def assert_forged(w: dict, name: str) -> dict:
    r = row(w, name)
    m = r["modules"]["03"]
    assert r["status"] == "forged" and m["state"] == "forged" and m["passed"] == 0, r
    lines = csv_rows(w, name)
    assert lines and all(",forged," in line and ",1.000," not in line for line in lines), lines
    return r


def test_honest_student_beside_the_payloads_is_graded_as_ever(world):
    r = row(world, "a-honest")
    assert (r["status"], r["modules"]["03"]["passed"], r["modules"]["03"]["state"]) == ("ok", 37, "done"), r
    assert_nothing_outside_changed(world)


def test_forger_hook_without_the_check_names_is_forged(world):
    # no check test's name reaches the graded code: a blanket "passed" passes the ones that must fail
    r = assert_forged(world, "b-forger-hook")
    assert "must have failed" in r["error"], r["error"]
    assert_nothing_outside_changed(world)


def test_forger_junit_rewriting_the_report_after_pytest_is_forged(world):
    # the outcomes were streamed to the grader as each test ran: a report file rewritten afterwards disagrees
    r = assert_forged(world, "c-forger-junit")
    assert_nothing_outside_changed(world)
    assert r["modules"]["03"]["reported"]["passed"] < 37


def test_fast_forger_with_a_no_op_runtest_is_forged(world):
    r = assert_forged(world, "d-fast-forger")
    assert "must have failed" in r["error"], r["error"]
    # its tests' own time is far under the class median on a quiet machine, and then flagged too; under the parallel
    # load of the contract check the median moves, so only the flag's form is pinned here, not that it fires
    assert all(f.startswith("module 03 was graded in ") for f in r["flags"] if "graded in" in f), r["flags"]
    assert_nothing_outside_changed(world)


def test_race_on_the_results_file_changes_nothing(world):
    # no results file is read back: the grade comes over a pipe only the grader holds, after the namespace ended
    r = row(world, "e-race")
    m = r["modules"]["03"]
    assert m["passed"] == m["untouched"] < 37 and m["failed"] > 0, r
    assert not any(",1.000," in line for line in csv_rows(world, "e-race"))
    assert any("mentions /proc" in f for f in r["flags"]), r["flags"]
    assert_nothing_outside_changed(world)


def test_answer_key_is_out_of_sight(world):
    # neither the copy's answer key of the graded module nor the teacher's (found through the .venv) is readable
    r = row(world, "f-answer-key")
    m = r["modules"]["03"]
    assert m["passed"] == m["untouched"] < 37, r
    assert_nothing_outside_changed(world)


def test_answer_key_through_git_is_out_of_sight(world):
    # the git data of the teacher's checkout, of this checkout (a worktree: its common dir too) are hidden:
    # neither `git show HEAD:solutions/...` nor the loose object of the key's blob gives the answers
    r = row(world, "j-git-key")
    m = r["modules"]["03"]
    assert m["passed"] == m["untouched"] < 37, r
    assert_nothing_outside_changed(world)


def test_disk_fill_stops_at_the_size_of_each_writable_place(world):
    r = row(world, "g-disk-fill")
    assert r["modules"]["03"]["passed"] == 37 and r["status"] == "ok", (r["status"], r.get("error"),
                                                                         r["modules"]["03"]["failures"][:2])
    assert_nothing_outside_changed(world)


def test_fork_bomb_is_held_to_the_pids_limit(world):
    # as an unprivileged user the limit refuses the forks; as root (exempt from RLIMIT_NPROC) the sandbox's first
    # process kills the whole namespace when it counts more: either way no 1000 processes, and no score for a bomb
    r = row(world, "h-fork-bomb")
    limited = r["modules"]["03"]["passed"] == 37
    killed = r["status"] == "error" and "processes" in (r["error"] or "") and r["modules"]["03"]["passed"] == 0
    assert limited or killed, (r["status"], r.get("error"), r["modules"]["03"]["failures"][:2])
    if world["as"] == "as-nobody":
        assert limited, r
    assert_nothing_outside_changed(world)


def test_a_daemon_holding_the_output_pipes_does_not_stall_the_grading(world):
    r = row(world, "i-daemon-pipes")
    honest = row(world, "a-honest")
    assert r["status"] == "ok" and r["modules"]["03"]["passed"] == 37, r
    assert r["wall_s"] < honest["wall_s"] + 120, (r["wall_s"], honest["wall_s"])   # a stall is >= 150 s more
    assert r["left"] and r["left"] >= 1, r
    assert_nothing_outside_changed(world)


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
