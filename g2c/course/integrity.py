"""What grading must not change, and how ``grade-class`` sees that it did: the second line behind the sandbox
(``sandbox.py``), and the only one when a class is graded ``--uncontained``.

Watched, before the class and after each submission:

- **every file under the teacher's checkout** (``.git`` included), its ``.venv`` (all of site-packages:
  ``.pth`` files, packages, ``__pycache__``), ``artifacts/`` and ``data/``, the Python installation's
  ``site-packages`` and the top level of each folder on its import path, and the start-up files of
  ``$HOME`` (``.bashrc``, ``.profile``, ``.gitconfig``, ...): a file is *changed* when its change time
  (ctime) is later than a stamp taken just before the submission started. Hashing all of torch before and
  after each submission would cost seconds; the ctime is the kernel's own record of the last change to a
  file's content or metadata, which no unprivileged process can set back (``utime`` sets mtime and atime,
  and moves ctime to *now*), a new file has a fresh ctime and a removed or renamed one changes its folder's.
  So one ``find -newercc`` pass over about 60,000 files (0.15 s) finds every file written since the stamp,
  whoever wrote it. (It assumes file systems with sub-second timestamps, as ext4, xfs, btrfs, tmpfs and APFS
  have; ``sandbox.wait_for_clock`` makes the stamp strictly earlier than any later change.)
- **the checkout as git sees it**: ``git status`` before and after;
- **the tests against the record as committed** (``git show HEAD:tests/pristine.sha256``, not the working
  copy's record, which a submission could rewrite together with a test);
- **the artifacts against their pins** (``g2c/assets/pins.json`` as committed): sha256 of every file at the
  start, and of any artifact file the ctime pass names afterwards.

Tooling only.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HOME_FILES", "Watch", "begin", "changes", "newer", "restore_lines", "stamp"]

RECORD = "tests/pristine.sha256"
COUNTS = "tests/pristine.json"
PINS = "g2c/assets/pins.json"
HOME_FILES = (".bashrc", ".bash_profile", ".bash_login", ".bash_logout", ".profile", ".zshrc", ".zshenv", ".zprofile",
              ".zlogin", ".config/fish/config.fish", ".gitconfig", ".config/git/config", ".ssh/authorized_keys",
              ".ssh/config", ".ssh/rc", ".pythonrc", ".pythonrc.py", ".pydistutils.cfg", ".config/pip/pip.conf",
              ".pip/pip.conf", ".netrc", ".inputrc", ".xprofile", ".config/autostart")
MAX_LISTED = 200        # changed paths kept per check (a submission that rewrote all of torch is one finding)


def _git(root: Path, *args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True,
                              text=True, timeout=120, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def git_refusal(root: Path) -> str | None:
    """Why git refuses the checkout ``root`` although it is one: a repository owned by another user ("dubious
    ownership", git 2.35.2 and later), with the command that lifts it. None when git does not say so."""
    try:
        proc = subprocess.run(["git", "--no-optional-locks", "-C", str(root), "rev-parse", "--git-dir"],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0 and "dubious ownership" in proc.stderr:
        return (f"git refuses {root}: it is owned by another user than the one grading (git's \"dubious "
                f"ownership\"). Trust it with: git config --global --add safe.directory {root}")
    return None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _parse_record(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        digest, _, rel = line.strip().partition("  ")
        if len(digest) == 64 and rel:
            out[rel] = digest
    return out


@dataclass
class Watch:
    """The watched places of one class run (``begin`` fills it)."""

    root: Path
    deep: list[Path] = field(default_factory=list)
    shallow: list[Path] = field(default_factory=list)
    home_files: list[Path] = field(default_factory=list)
    prune: list[Path] = field(default_factory=list)
    labels: list[tuple[Path, str]] = field(default_factory=list)
    git_status: str | None = None
    record: dict[str, str] = field(default_factory=dict)
    record_from: str = "the working copy"
    blobs: dict[str, str] = field(default_factory=dict)   # the records at the start: path -> sha256
    pins: dict = field(default_factory=dict)
    home_state: dict[Path, bool] = field(default_factory=dict)

    def label(self, path: Path) -> str:
        for prefix, what in self.labels:
            if path == prefix or prefix in path.parents:
                return what
        return "your files"


def _real(path: Path) -> Path:
    return Path(os.path.realpath(path))


def _python_places(root: Path, venv: Path | None) -> list[Path]:
    """The folders of the Python installation on the import path outside the checkout and its ``.venv`` (the
    standard library, ``lib-dynload``; the base ``site-packages`` only where the ``.venv`` includes it), to be
    watched one level deep: a ``sitecustomize.py``, a ``.pth`` or a new top-level module there runs in every
    later grading. (The ``.venv`` itself is watched whole.)"""
    shallow = []
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        p = _real(Path(entry))
        inside = [q for q in (root, venv) if q is not None and (p == q or q in p.parents)]
        if not inside and p not in shallow:
            shallow.append(p)
    return shallow


def begin(root: Path, *, prune: list[Path] = (), home: Path | None = None) -> tuple[Watch, list[str], list[str]]:
    """Start watching the teacher's checkout ``root``. Returns ``(watch, refusals, warnings)``: ``refusals``
    when the tests differ from their committed record (grades would not be the course's), ``warnings`` when an
    artifact differs from its pin or the checkout has no git (the record is then the working copy's)."""
    root = _real(Path(root))
    w = Watch(root)
    w.prune = [_real(Path(p)) for p in prune]
    venv = _real(root / ".venv") if (root / ".venv").exists() else None
    w.deep = [root]
    w.labels = []
    for name, what in ((".venv", ".venv"), ("artifacts", "artifacts/"), ("data", "data/")):
        target = root / name
        if target.exists():
            real = _real(target)
            w.labels.append((real, what))
            if not (real == root or root in real.parents):
                w.deep.append(real)
    w.shallow = _python_places(root, venv)
    for s in w.shallow:
        w.labels.append((s, "the Python installation"))
    w.labels.append((root / ".git", "the checkout's .git"))
    w.prune.append(root / ".git" / "objects")       # nothing runs from git's objects; big in a long history
    common = _git(root, "rev-parse", "--git-common-dir")
    if common:                                  # a worktree's hooks and config live in the main repository's .git
        common_dir = _real(root / common.strip())
        if not (common_dir == root or root in common_dir.parents):
            for place in (common_dir / "hooks", common_dir / "config"):
                if place.exists():
                    w.deep.append(place)
                    w.labels.append((place, "the checkout's .git"))
    w.labels.append((root, "the checkout"))
    if home is not None and home.is_dir():
        w.home_files = [home / f for f in HOME_FILES]
        for f in w.home_files:
            w.labels.append((f, "$HOME"))
            w.home_state[f] = f.exists()
    w.labels.sort(key=lambda item: len(str(item[0])), reverse=True)
    w.git_status = _git(root, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    refusals, warnings = [], []
    committed = _git(root, "show", f"HEAD:{RECORD}") if w.git_status is not None else None
    if committed is not None:
        w.record = _parse_record(committed)
        w.record_from = f"the record as committed (git show HEAD:{RECORD})"
        for rel in (RECORD, COUNTS, PINS):
            blob = _git(root, "show", f"HEAD:{rel}")
            if blob is not None and (root / rel).is_file() \
                    and _sha256(root / rel) != hashlib.sha256(blob.encode("utf-8")).hexdigest():
                warnings.append(f"{rel} differs from its committed version (the class is graded with the working "
                                "copy's)")
        pins_text = _git(root, "show", f"HEAD:{PINS}")
    else:
        try:
            w.record = _parse_record((root / RECORD).read_text(encoding="utf-8"))
        except OSError:
            w.record = {}
        refused = git_refusal(root)
        warnings.append(f"{refused}. Until then its tests are checked against the working copy's record "
                        f"({RECORD}), and git status cannot list changes" if refused else
                        f"{root} is not a git checkout (or git is missing): its tests are checked against the working "
                        f"copy's record ({RECORD}), and git status cannot list changes")
        try:
            pins_text = (root / PINS).read_text(encoding="utf-8")
        except OSError:
            pins_text = None
    for rel in (RECORD, COUNTS, PINS):          # from now on, any change to these is a finding
        if (root / rel).is_file():
            w.blobs[rel] = _sha256(root / rel)
    try:
        w.pins = json.loads(pins_text)["artifacts"] if pins_text else {}
    except (ValueError, KeyError, TypeError):
        w.pins = {}
    for problem in test_problems(w):
        refusals.append(problem)
    for problem in artifact_problems(w):
        warnings.append(problem)
    return w, refusals, warnings


def test_problems(w: Watch) -> list[str]:
    """The course's tests and shared test helpers (not the tooling's own tests) that differ from ``w.record``, and
    the records themselves changed since the class run began."""
    out = []
    for rel, want in sorted(w.record.items()):
        if rel.startswith("tests/tooling/"):
            continue
        path = w.root / rel
        if not path.is_file():
            out.append(f"{rel} is missing (it is in {w.record_from})")
        elif _sha256(path) != want:
            out.append(f"{rel} differs from {w.record_from}")
    for rel, want in sorted(w.blobs.items()):
        path = w.root / rel
        if not path.is_file() or _sha256(path) != want:
            out.append(f"{rel} changed since the class run began")
    return out


def _artifact_files(w: Watch) -> dict[Path, dict]:
    """Every pinned artifact file present under ``artifacts/``: path -> its pin."""
    out = {}
    folder = w.root / "artifacts"
    for name, files in w.pins.items():
        for kind in ("models", "tokenizers", "corpora"):
            d = folder / kind / name
            if d.is_dir():
                for fname, pin in files.items():
                    if (d / fname).exists():
                        out[_real(d / fname)] = pin
    return out


def artifact_problems(w: Watch, only: set[Path] | None = None) -> list[str]:
    """Pinned artifact files whose size or sha256 is not the pin's (``only``: just these paths)."""
    out = []
    for path, pin in sorted(_artifact_files(w).items()):
        if only is not None and path not in only:
            continue
        try:
            size = path.stat().st_size
            ok = size == pin.get("size") and _sha256(path) == pin.get("sha256")
        except OSError:
            ok = False
        if not ok:
            out.append(f"{path} is not its pinned copy ({PINS})")
    return out


def stamp(folder: Path) -> int:
    """A reference time before a submission runs: touch a file in ``folder`` and wait until the file system's
    clock has moved past it; return the file's ctime (ns). Every change made afterwards has a strictly later
    ctime."""
    folder.mkdir(parents=True, exist_ok=True)
    ref = folder / ".g2c-stamp"
    ref.write_bytes(b"")
    first = ref.stat().st_ctime_ns
    tick = folder / ".g2c-stamp-tick"
    for _ in range(2000):
        tick.write_bytes(b"")
        if tick.stat().st_ctime_ns > first:
            break
        time.sleep(0.001)
    return first


def _find_newer(roots: list[Path], prune: list[Path], since_ns: int, depth: int | None, scratch: Path) -> list[Path]:
    """Paths under ``roots`` whose ctime is later than ``since_ns`` (GNU find when present, else a walk)."""
    roots = [r for r in roots if r.exists()]
    if not roots:
        return []
    # only what lies under a root can be pruned (each pattern costs find a match per file)
    prune = [p for p in prune if p.exists() and any(p == r or r in p.parents for r in roots)]
    find = shutil.which("find")
    if find and sys.platform.startswith("linux"):
        ref = scratch / ".g2c-ref"
        ref.write_bytes(b"")
        os.utime(ref, ns=(since_ns, since_ns))        # -newermc: the reference's mtime, set to the stamp
        expr = []
        for p in prune:
            expr += ["-path", str(p), "-o"]
        cmd = [find, "-P", *map(str, roots)]
        if depth is not None:
            cmd += ["-maxdepth", str(depth)]
        if expr:
            cmd += ["(", *expr[:-1], ")", "-prune", "-o"]
        cmd += ["-newercm", str(ref), "-print0"]
        try:
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
            found, buf = [], b""
            assert proc.stdout is not None
            for chunk in iter(lambda: proc.stdout.read(1 << 16), b""):
                buf += chunk
                *done, buf = buf.split(b"\0")
                found += [Path(os.fsdecode(d)) for d in done if d]
                if len(found) >= MAX_LISTED:
                    proc.kill()
                    break
            proc.wait()
            return found[:MAX_LISTED]
        except OSError:
            pass
    found = []
    stack = [(r, 0) for r in roots]
    while stack and len(found) < MAX_LISTED:
        folder, level = stack.pop()
        if folder in prune:
            continue
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        try:
            if folder.stat(follow_symlinks=False).st_ctime_ns > since_ns:
                found.append(folder)
        except OSError:
            pass
        for e in entries:
            path = Path(e.path)
            try:
                st = e.stat(follow_symlinks=False)
            except OSError:
                continue
            if e.is_dir(follow_symlinks=False):
                if depth is None or level + 1 < depth:
                    stack.append((path, level + 1))
                elif st.st_ctime_ns > since_ns:
                    found.append(path)
            elif st.st_ctime_ns > since_ns:
                found.append(path)
    return found[:MAX_LISTED]


def newer(roots: list[Path], since_ns: int, scratch: Path) -> list[Path]:
    """Files and folders under ``roots`` changed since ``since_ns`` (a ``stamp``), at most ``MAX_LISTED``."""
    scratch.mkdir(parents=True, exist_ok=True)
    return _find_newer([_real(Path(r)) for r in roots], [], since_ns, None, scratch)


def changes(w: Watch, since_ns: int, scratch: Path) -> list[tuple[str, str]]:
    """What changed in the watched places since ``since_ns`` (a ``stamp``): ``(what, detail)`` pairs, ``what``
    one of ".venv", "artifacts/", "data/", "the checkout", "the checkout's .git", "the Python installation",
    "$HOME", "tests"; empty when nothing did."""
    out: list[tuple[str, str]] = [("tests", problem) for problem in test_problems(w)]
    # the installation's own __pycache__ folders change when any process of this user first imports a module
    # (not only a graded one): one level down they say nothing about what was written, so they are left out
    paths = _find_newer(w.deep, w.prune, since_ns, None, scratch) + [
        p for p in _find_newer(w.shallow, w.prune, since_ns, 1, scratch) if p.name != "__pycache__"]
    named = set()
    if w.git_status is not None:
        now = _git(w.root, "status", "--porcelain=v1", "-z", "--untracked-files=all")
        if now is not None and now != w.git_status:
            before = set(w.git_status.split("\0"))
            for entry in now.split("\0"):
                if entry and entry not in before:
                    out.append(("the checkout", f"git status: {entry}"))
                    named.add(w.root / entry[3:])
            w.git_status = now
    found = set(paths)
    seen = set()
    for p in paths:
        # a folder is listed only for what happened to itself (a removal); a file git status named, once
        if p in seen or p in named or any(q != p and p in q.parents for q in found):
            continue
        seen.add(p)
        what = w.label(p)
        try:
            shown = p.relative_to(w.root).as_posix()
        except ValueError:
            shown = str(p)
        out.append((what, f"{shown} (new or changed)"))
    for f in w.home_files:
        try:
            exists, newer = True, f.stat(follow_symlinks=False).st_ctime_ns > since_ns
        except OSError:
            exists, newer = False, False
        if newer or exists != w.home_state.get(f, False):
            out.append(("$HOME", f"{f} ({'new or changed' if exists else 'removed'})"))
        w.home_state[f] = exists
    changed = {p for p in paths}
    for problem in artifact_problems(w, only=changed):
        out.append(("artifacts/", problem))
    first = {"tests": 0, "artifacts/": 1}           # the findings that say most first; the ctime pass's last
    return sorted(out, key=lambda item: (first.get(item[0], 2 if item[1].startswith("git status") else 3)))


def restore_lines(w: Watch, found: list[tuple[str, str]]) -> list[str]:
    """How to put the teacher's environment back, for what ``changes`` found."""
    kinds = {what for what, _ in found}
    root = w.root
    out = []
    if ".venv" in kinds or "the Python installation" in kinds:
        out.append(f"rebuild the Python environment: cd {root} && rm -rf .venv && ./setup.sh"
                   + (f" (and reinstall the Python at {sys.base_prefix}, which .venv is made from)"
                      if "the Python installation" in kinds else ""))
    if kinds & {"the checkout", "tests", "the checkout's .git"}:
        out.append(f"restore the checkout: cd {root} && git status (it lists what changed); git stash -u keeps your "
                   "own edits aside, then git checkout -- . and git clean -n (it shows the new files; -f removes "
                   "them)")
    if "tests" in kinds:
        out.append(f"the tests are compared with {w.record_from}: git checkout -- tests/ restores them")
    if "the checkout's .git" in kinds:
        out.append(f"look at {root}/.git/hooks and {root}/.git/config for anything you did not put there (a hook "
                   "runs as you at your next commit)")
    if "artifacts/" in kinds:
        out.append(f"restore the artifacts: cd {root} && ./checkpoints.sh (it restores a changed artifact from git)")
    if "data/" in kinds:
        out.append(f"rebuild the data: cd {root} && ./datasets.sh --force")
    if "$HOME" in kinds:
        out.append("read the start-up files named above before you open a new shell: they run as you")
    out.append("then grade the class again (after the submission that did it is removed or graded in a container)")
    return out
