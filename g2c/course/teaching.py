"""The teacher's path: a student hands in, a teacher grades the class on the course's own tests and reads
every written answer. ``docs/teaching.md`` is the guide.

    python -m g2c.course submit [--name NAME] [--out FILE.zip]       (./test.sh --submit)
    python -m g2c.course grade-class DIR [--modules SEL] [--out DIR] [--timeout S] [--jobs N]
                                         [--container IMAGE | --uncontained]

**Hand in** (``submit``) writes one zip archive of exactly what the student wrote: every exercise
file they edited (``scaffolds.status`` says "edited": neither the fresh scaffold nor its recorded
generation) and every notebook working copy under ``notebooks/work/`` that differs from its clean
notebook, plus ``manifest.json`` (format version, the student's name, the course commit, the modules
worked, and each file's path, size and sha256). Nothing else: no tests, no provided code, no
``.venv``, data or artifacts. Edits outside the exercise files (provided code included), a damaged
notebook and one over the size cap are listed as warnings. It refuses a folder that is not a g2c
checkout, or a checkout other than the one whose ``g2c`` runs. It reads the checkout and writes only
the archive (a temporary file in the target folder, then a rename).

**Grade a class** (``grade-class``) takes a folder of submissions: ``.zip`` archives from ``submit``,
the same archives unpacked (a folder holding ``manifest.json``), or whole clones of the course (a
folder holding a g2c checkout, directly or one level down). Each submission is graded in its own
temporary copy of the teacher's checkout (the overlay): every exercise file reset to its fresh
scaffold, then the student's exercise files placed in it; the teacher's tests, contract and the answer
key of only the prerequisites it stands in for; the one shared ``.venv``, ``artifacts/`` and ``data/``
linked in. The overlay runs ``python -m g2c.course.grader`` (``grader.py``: the same per-module pytest
runs as ``./test.sh IDS``, with ``gradeplugin.py``'s check tests and outcome stream), contained
(``sandbox.py``: Linux namespaces, sandbox-exec, a container, or ``--uncontained`` said on the report's
first line): it writes only private folders, sees no other submission and no answer key of its own,
has no network, leaves no process; its results come back over a pipe only the grader holds, read after
the sandbox is gone.
The teacher's checkout, ``.venv``, artifacts and tests are checked after each submission
(``integrity.py``); a change marks it tampered and stops the class. A module of a submission gets
``--timeout`` seconds (its run is killed when that much time passes without a module's result, and a
fresh one grades the modules after the hung one); a crash, a hang or garbage on stdout is reported on
its row and never stops the class.

Output (``--out``, default ``<DIR>-grades`` beside the submissions folder), written last and each file
atomically: ``grades.csv`` (one row per student and module, formula cells neutralised),
``grades.json`` (everything, including each failing test), ``answers.html`` and ``answers.md`` (each
notebook question with the answer key's rubric and worked answer, then every student's answer), and
``summary.txt`` (what was contained, then the table printed on stdout).

Exit codes of ``grade-class``: 0 every submission was graded; 1 at least one could not be graded
fully (unreadable, tampered or forged, grader error, timeout, not graded after the class stopped), or
the reports could not be written; 2 usage error (no such folder, bad ``--modules`` or ``--timeout``,
not run from a g2c checkout, no containment without ``--uncontained``, tests that differ from their
committed record). Failing tests are results, not errors: they never change the exit code.
``submit``: 0 archive written (warnings printed), 2 refused.
"""

from __future__ import annotations

import csv
import datetime as _dt
import hashlib
import html
import importlib.util
import io
import json
import math
import os
import re
import shutil
import signal
import stat
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import forgery, integrity, sandbox
from .files import check_writable, write_problem, write_text_atomic
from .progress import GRADE_FDS_ENV, NAMESPACE_ENV
from .registry import MODULES, REPO_ROOT, get_module, module_for_file, module_ids, parse_selection, selector_for

FORMAT = 1
KIND = "g2c-submission"
MANIFEST = "manifest.json"
HAND_IN_DIR = "hand-in"  # git ignores it
WORK_DIR = "notebooks/work"
MAX_FILE_BYTES = 50 * 2**20       # one handed-in file (a notebook with figures stays far below)
MAX_ARCHIVE_BYTES = 200 * 2**20   # all files of one archive, uncompressed
EXIT_OK, EXIT_INCOMPLETE, EXIT_USAGE = 0, 1, 2
# Never copied into a grading overlay (linked or not needed): the teacher's own state.
OVERLAY_SKIP = {".git", ".venv", "data", "artifacts", "runs", "__pycache__", ".pytest_cache", ".ruff_cache",
                ".hypothesis", ".ipynb_checkpoints", ".g2c-backup", HAND_IN_DIR}
LINKED = (".venv", "artifacts", "data")

__all__ = ["EXIT_INCOMPLETE", "EXIT_OK", "EXIT_USAGE", "FORMAT", "Submission", "collect_hand_in", "find_root",
           "grade_class", "load_submission", "submit", "write_archive"]


class Refused(ValueError):
    """The command cannot run here (the message says why and what to do)."""


# -- shared helpers ------------------------------------------------------------------------------

def _say(line: str) -> None:
    print(clean_text(line), flush=True)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def find_root(start: Path) -> Path | None:
    """The g2c checkout that holds ``start`` (itself or a parent), or None."""
    start = Path(start).resolve()
    for p in (start, *start.parents):
        if (p / "g2c" / "course" / "registry.py").is_file() and (p / "solutions" / "generated.json").is_file():
            return p
    return None


# A student's clone is read with git's configured commands switched off (a clone's .git/config is the student's).
UNTRUSTED_GIT = ("-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null", "-c", "core.pager=cat",
                 "-c", "protocol.allow=never")


def _git(root: Path, *args: str, untrusted: bool = False) -> str | None:
    try:
        proc = subprocess.run(["git", *(UNTRUSTED_GIT if untrusted else ()), "-C", str(root), *args],
                              capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def course_commit(root: Path, *, untrusted: bool = False) -> str | None:
    out = _git(root, "rev-parse", "HEAD", untrusted=untrusted)
    return out.strip() if out else None


def notebook_names() -> dict[str, str]:
    """Working-copy path (``notebooks/work/<stem>.ipynb``) -> module id, for every module."""
    return {f"{WORK_DIR}/{Path(m.notebook).name}": m.id for m in MODULES}


def allowed_kind(rel: str) -> tuple[str, str] | None:
    """``(kind, module id)`` of a path a submission may carry (an exercise file or a notebook working copy)."""
    m = module_for_file(rel)
    if m is not None:
        return "exercise", m.id
    nb = notebook_names().get(rel)
    return ("notebook", nb) if nb else None


def _safe_rel(name: str) -> str | None:
    """A normalised repo-relative path, or None for absolute paths, ``..`` and other tricks."""
    name = name.replace("\\", "/")
    parts = name.split("/")
    if name.startswith("/") or re.match(r"^[A-Za-z]:", name) or any(p in ("", ".", "..") for p in parts):
        return None
    return name


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` through a temporary file in the same folder and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a plain file would be created (mkstemp makes it 0600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


# -- hand in -------------------------------------------------------------------------------------

@dataclass
class HandIn:
    """What ``submit`` would archive: ``files`` as (path, kind, module id) and the warnings to print."""

    root: Path
    files: list[tuple[str, str, str]]
    warnings: list[str]
    worked: list[str]


def _dirty_paths(root: Path) -> list[tuple[str, str]] | None:
    """``(status, path)`` of every changed or new file git sees (None without git)."""
    out = _git(root, "status", "--porcelain", "--untracked-files=all", "-z")
    if out is None:
        return None
    entries, parts, i = [], out.split("\0"), 0
    while i < len(parts):
        item = parts[i]
        i += 1
        if len(item) < 4:
            continue
        code, path = item[:2], item[3:]
        if code[0] in "RC":  # a rename or copy: the next field is the old path
            i += 1
        entries.append((code, path))
    return entries


def collect_hand_in(root: Path) -> HandIn:
    """Find the student's work in checkout ``root``; read-only.

    Raises:
        Refused: ``root`` is not a g2c checkout.
    """
    from .progress import test_file_problems
    from .scaffolds import expected, status

    if find_root(root) != Path(root).resolve():
        raise Refused(f"{root} is not a g2c checkout (no g2c/course/registry.py and solutions/generated.json): "
                      "run this in the course folder you worked in")
    root = Path(root).resolve()
    fresh = expected(root)
    states = status(root, fresh)
    files: list[tuple[str, str, str]] = []
    warnings: list[str] = []
    for s in states:
        if s.state == "edited":
            files.append((s.rel, "exercise", s.module))
            try:
                compile((root / s.rel).read_bytes(), s.rel, "exec")
            except SyntaxError as exc:
                warnings.append(f"{s.rel} has a syntax error (line {exc.lineno}): it is handed in, but every test of "
                                f"module {s.module} will fail")
        elif s.state == "missing":
            warnings.append(f"{s.rel} (module {s.module}) is missing: nothing to hand in for it, the scaffold grades")
    for rel, module_id in notebook_names().items():
        work, clean = root / rel, root / get_module(module_id).notebook
        if not work.is_file():
            continue
        size = work.stat().st_size
        if size > MAX_FILE_BYTES:
            warnings.append(f"{rel} is {size / 2**20:.0f} MiB, over the {MAX_FILE_BYTES // 2**20} MiB your teacher's "
                            "grader reads: it is left out. Clear its outputs (in Jupyter: Kernel > Restart & Clear "
                            "Output, then save) and hand in again")
            continue
        data = work.read_bytes()
        if clean.is_file() and data == clean.read_bytes():
            continue
        files.append((rel, "notebook", module_id))
        problem = notebook_problem(data)
        if problem:
            warnings.append(f"{rel} is not a readable notebook ({problem}): it is handed in, but your teacher will "
                            f"see none of its answers. Open it in Jupyter and save it again, or start a fresh copy "
                            f"with ./notebook.sh {module_id} --fresh (the old one is kept in notebooks/work/archive/)")
    handed = {rel for rel, _, _ in files}
    exercises = {s.rel for s in states}
    dirty = _dirty_paths(root)
    if dirty is None:
        warnings.append("not a git checkout: edits outside the exercise files cannot be listed (they are never "
                        "handed in)")
    else:
        for code, rel in dirty:
            if rel in handed or rel in exercises or rel.startswith((f"{HAND_IN_DIR}/", f"{WORK_DIR}/",
                                                                   ".g2c-backup/")):
                continue
            what = "new file" if code == "??" else ("deleted" if "D" in code else "changed")
            owner = module_for_file(rel)
            if owner is not None:
                why = (f"provided code of module {owner.id}, not an exercise file: your teacher grades with the "
                       "course's own copy of it, so your exercises must work with that one")
            elif rel.startswith("tests/"):
                why = "your teacher grades with the course's own tests"
            elif rel.startswith("g2c/"):
                why = "only exercise files are handed in; code that needs it will fail when graded"
            else:
                why = "only exercise files and notebook working copies are handed in"
            warnings.append(f"{rel} ({what}): not handed in ({why})")
    for m in MODULES:
        for problem in test_file_problems(m, root):
            line = f"{problem}: your local ./test.sh results are not a valid grade (the teacher's tests grade)"
            if line not in warnings:
                warnings.append(line)
    worked = [m.id for m in MODULES if any(k == "exercise" and i == m.id for _, k, i in files)]
    return HandIn(root, sorted(files), warnings, worked)


def notebook_problem(data: bytes) -> str | None:
    """Why ``data`` is not a notebook the answers page can read (None when it is one)."""
    try:
        nb = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        return "not UTF-8 text"
    except ValueError as exc:
        return f"{type(exc).__name__} at line {getattr(exc, 'lineno', '?')}"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return "no list of cells"
    return None


def _default_name(root: Path) -> str:
    name = (_git(root, "config", "user.name") or "").strip()
    if not name:
        import getpass

        try:
            name = getpass.getuser()
        except Exception:  # no user database entry: the archive still needs a name
            name = "student"
    return name


def _slug(name: str) -> str:
    """The archive's file-name part for ``name``: letters of any script, digits, ``.``, ``_`` and ``-`` kept
    (``Zoë Ñúñez`` -> ``Zoë-Ñúñez``, NFC), every other run of characters one ``-``; ``""`` when nothing is left."""
    import unicodedata

    return re.sub(r"[^\w.-]+", "-", unicodedata.normalize("NFC", name.strip())).strip("-._")


MAX_SLUG_BYTES = 100    # of the archive's file name made from the student's name (file systems allow 255)


def _short_slug(slug: str) -> str:
    """``slug`` cut to at most ``MAX_SLUG_BYTES`` bytes of UTF-8, at a character boundary."""
    out = slug
    while len(out.encode("utf-8")) > MAX_SLUG_BYTES:
        out = out[:-1]
    return out.strip("-._")


def write_archive(hand_in: HandIn, out: Path, student: str) -> dict:
    """Write the archive ``out`` (atomically) for ``hand_in``; return its manifest."""
    entries = []
    blobs = {}
    for rel, kind, module_id in hand_in.files:
        data = (hand_in.root / rel).read_bytes()
        blobs[rel] = data
        entries.append({"path": rel, "kind": kind, "module": module_id, "bytes": len(data), "sha256": sha256(data)})
    commit = course_commit(hand_in.root)
    record = hand_in.root / "solutions" / "generated.json"
    manifest = {
        "kind": KIND, "format": FORMAT, "student": student,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "course": {"commit": commit,
                   "scaffolds_sha256": sha256(record.read_bytes()) if record.is_file() else None},
        "worked": hand_in.worked,
        "files": entries,
        "warnings": hand_in.warnings,
    }
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(zipfile.ZipInfo(MANIFEST, (1980, 1, 1, 0, 0, 0)), json.dumps(manifest, indent=1) + "\n",
                    compress_type=zipfile.ZIP_DEFLATED)
        for rel in sorted(blobs):
            zf.writestr(zipfile.ZipInfo(rel, (1980, 1, 1, 0, 0, 0)), blobs[rel], compress_type=zipfile.ZIP_DEFLATED)
    _atomic_write(out, buf.getvalue())
    return manifest


def submit(root: Path, *, name: str | None = None, out: Path | None = None, echo=_say) -> Path:
    """Hand in the work of checkout ``root``: write the archive and return its path.

    Raises:
        Refused: not a g2c checkout, or not the checkout whose ``g2c`` this Python imports; an empty
            ``name``; an ``out`` that is not a ``.zip`` name, is a folder, lies in a folder that does not
            exist, or cannot be written.
    """
    found = find_root(root)
    if found is None:
        raise Refused(f"{Path(root).resolve()} is not inside a g2c checkout: run ./test.sh --submit in the course "
                      "folder you worked in")
    if found != REPO_ROOT.resolve():
        raise Refused(f"this Python runs the course in {REPO_ROOT}, but you are in the checkout {found}: hand in "
                      f"from {found} with its own environment (cd {found} && ./test.sh --submit)")
    if name is not None and not name.strip():
        raise Refused("--name is empty: give your name (--name 'Ada Lovelace'), or leave --name out to use "
                      "git's user.name")
    if name is not None and out is None and not _slug(name):
        raise Refused(f"--name {name!r} has no letter or digit to name the archive with: give your name "
                      "(--name 'Ada Lovelace'), or --out FILE.zip")
    hand_in = collect_hand_in(found)
    student = name or _default_name(found)
    given = out is not None
    slug = _slug(student) or "student"
    if not given and _short_slug(slug) != slug:
        slug = _short_slug(slug)
        echo(f"note: your name is long: the archive is named after its first {len(slug)} characters (g2c-{slug}.zip); "
             "the manifest keeps it whole")
    out = Path(out) if out else found / HAND_IN_DIR / f"g2c-{slug}.zip"
    if len(os.fsencode(out.name)) > 255:
        raise Refused(f"--out: the file name {out.name[:40]}... is {len(os.fsencode(out.name))} bytes, longer than "
                      "a file system allows (255): give a shorter one")
    if out.is_dir():                        # before the suffix: --out hand-in, --out '' (the current folder)
        raise Refused(f"--out {out} is a folder: give the archive's file name, ending in .zip")
    if out.suffix.lower() != ".zip":
        raise Refused(f"--out {out}: the archive is a zip file; give a name ending in .zip")
    blocker = next((p for p in out.parents if p.exists()), None)
    if given and blocker is not None and not blocker.is_dir():
        raise Refused(f"--out {out}: {blocker} is a file, not a folder: give a path in a folder (e.g. "
                      f"{blocker.parent / out.name})")
    if given and not out.parent.is_dir():   # a mistyped folder is named, never created in silence
        raise Refused(f"--out {out}: the folder {out.parent} does not exist; create it first or give another path")
    existed = out.exists()
    try:
        manifest = write_archive(hand_in, out, student)
    except OSError as exc:  # an unwritable folder, a full disk: one line, nothing half-written left behind
        raise Refused(f"--out: {write_problem(exc, out)}") from None
    for w in hand_in.warnings:
        echo(f"warning: {w}")
    files = manifest["files"]
    if not files:
        echo("warning: you have not edited any exercise file or notebook working copy: the archive holds only "
             "its manifest")
    for e in files:
        echo(f"  {e['path']}  ({e['kind']}, module {e['module']}, {e['bytes']} bytes)")
    shown = out.relative_to(found) if out.is_relative_to(found) else out
    echo(f"{'replaced' if existed else 'wrote'} {shown}: {sum(e['kind'] == 'exercise' for e in files)} exercise "
         f"file(s) of module(s) {', '.join(manifest['worked']) or 'none'}, "
         f"{sum(e['kind'] == 'notebook' for e in files)} notebook(s), for {student!r}"
         f"{', course commit ' + manifest['course']['commit'][:12] if manifest['course']['commit'] else ''}. "
         "Hand this one file in; nothing in your checkout was changed.")
    return out


ENV_PREFIX = "G2C_APPLY_SOLUTIONS: "  # parse_selection's messages name the variable; --modules is no variable


# -- loading submissions ---------------------------------------------------------------------------

@dataclass
class Submission:
    """One student's hand-in, as read by the teacher.

    ``files``: repo-relative path -> bytes (exercise files and notebook working copies, verified);
    ``problems``: what makes it not cleanly gradable (tampering, an unreadable archive), each one line;
    ``notes``: what the teacher should know but does not invalidate the grade (ignored extra files,
    edited tests in a clone, another course commit); ``error``: set when it cannot be graded at all.
    """

    name: str
    source: Path
    kind: str                      # "archive", "folder" (an unpacked archive) or "clone"
    student: str = ""
    commit: str | None = None
    files: dict[str, bytes] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def exercise_files(self) -> dict[str, bytes]:
        return {r: b for r, b in self.files.items() if allowed_kind(r) and allowed_kind(r)[0] == "exercise"}

    @property
    def notebooks(self) -> dict[str, bytes]:
        return {r: b for r, b in self.files.items() if allowed_kind(r) and allowed_kind(r)[0] == "notebook"}

    @property
    def worked(self) -> list[str]:
        mods = {module_for_file(r).id for r in self.exercise_files}
        return [i for i in module_ids() if i in mods]


def _read_manifest_files(sub: Submission, manifest_bytes: bytes | None, names: list[str], read,
                         refused: set[str] = frozenset()) -> None:
    """Check a manifest against the files beside it (``names``, read with ``read(name)``) and keep the good ones;
    ``refused``: entries already reported (links, FIFOs), neither read nor reported again."""
    if manifest_bytes is None:
        sub.error = f"no {MANIFEST}: not an archive made by `python -m g2c.course submit`"
        return
    try:
        manifest = json.loads(manifest_bytes.decode("utf-8"))
        assert isinstance(manifest, dict) and manifest.get("kind") == KIND
        entries = manifest["files"]
        assert isinstance(entries, list)
    except (ValueError, AssertionError, KeyError, UnicodeDecodeError):
        sub.error = f"{MANIFEST} is not a g2c submission manifest"
        return
    if manifest.get("format") != FORMAT:
        sub.error = f"{MANIFEST} has format {manifest.get('format')!r}; this course reads format {FORMAT}"
        return
    sub.student = str(manifest.get("student") or "")
    sub.commit = (manifest.get("course") or {}).get("commit")
    claimed = manifest.get("worked", [])
    unknown = [str(i) for i in claimed if str(i) not in module_ids()] if isinstance(claimed, list) else [claimed]
    if unknown:
        shown = ", ".join(one_line(repr(i), 40) for i in unknown[:5]) + (" ..." if len(unknown) > 5 else "")
        sub.problems.append(f"tampered: its {MANIFEST} names worked modules the course does not have ({shown}): "
                            "ignored; the modules of its files count")
    listed = {}
    for e in entries:
        rel = _safe_rel(str(e.get("path", ""))) if isinstance(e, dict) else None
        if rel is None or not isinstance(e.get("sha256"), str):
            sub.problems.append(f"tampered: a manifest entry is malformed ({str(e)[:80]})")
            continue
        listed[rel] = e["sha256"]
    present = set(names) - {MANIFEST}
    total = 0
    for name in sorted(present | set(listed)):
        if name in refused:
            continue
        rel = _safe_rel(name)
        if rel is None:
            sub.problems.append(f"tampered: the archive holds an unsafe path {name!r} (ignored)")
            continue
        if rel not in listed:
            sub.problems.append(f"tampered: {rel} is in the archive but not in its manifest (ignored)")
            continue
        if rel not in present:
            sub.problems.append(f"tampered: {rel} is in the manifest but missing from the archive")
            continue
        if allowed_kind(rel) is None:
            what = "the course's own tests grade" if rel.startswith("tests/") else "not an exercise file or notebook"
            sub.problems.append(f"tampered: the archive carries {rel}, which submit never hands in (ignored: {what})")
            continue
        data = read(name)
        if data is None:
            sub.problems.append(f"{rel} is larger than {MAX_FILE_BYTES // 2**20} MiB (ignored)")
            continue
        total += len(data)
        if total > MAX_ARCHIVE_BYTES:
            sub.error = f"the archive holds more than {MAX_ARCHIVE_BYTES // 2**20} MiB"
            return
        if sha256(data) != listed[rel]:
            sub.problems.append(f"tampered: {rel} does not match its sha256 in the manifest (graded as found)")
        sub.files[rel] = data


def _load_archive(sub: Submission) -> None:
    try:
        with zipfile.ZipFile(sub.source) as zf:
            infos = {i.filename: i for i in zf.infolist() if not i.is_dir()}

            def read(name: str) -> bytes | None:
                if infos[name].file_size > MAX_FILE_BYTES:
                    return None
                return zf.read(infos[name])

            manifest = read(MANIFEST) if MANIFEST in infos else None
            _read_manifest_files(sub, manifest, list(infos), read)
    except (zipfile.BadZipFile, OSError, RuntimeError, EOFError, ValueError) as exc:
        try:
            empty = Path(sub.source).stat().st_size == 0
        except OSError:
            empty = False
        sub.error = ("an empty file (0 bytes), not a zip archive: the hand-in did not finish; ask for it again "
                     "(./test.sh --submit)" if empty else
                     f"not a readable zip archive, damaged or cut short in the copy ({type(exc).__name__}: "
                     f"{str(exc)[:120]}): ask for it again (./test.sh --submit)")


def odd_file(path: Path) -> str | None:
    """Why ``path`` is no plain file a hand-in may carry (a link, a FIFO, a socket, a device), or None. Never
    opens it (a FIFO would block the reader)."""
    try:
        st = path.lstat()
    except OSError:
        return None
    if stat.S_ISLNK(st.st_mode):
        try:
            return f"a link (to {os.readlink(path)})"
        except OSError:
            return "a link"
    if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
        return None
    return "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else \
        "a device or other special file"


def _load_folder(sub: Submission) -> None:
    root = sub.source
    if odd_file(root / MANIFEST):
        sub.error = f"its {MANIFEST} is {odd_file(root / MANIFEST)}, not a file: refused"
        return
    names, odd = [], {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        why = odd_file(p)
        if why:
            odd[rel] = why
        elif p.is_file():
            names.append(rel)

    def read(name: str) -> bytes | None:
        path = root / name
        return None if path.stat().st_size > MAX_FILE_BYTES else path.read_bytes()

    for rel, why in odd.items():
        sub.problems.append(f"tampered: {rel} in the hand-in folder is {why}: refused (never read); the scaffold "
                            "grades")
    _read_manifest_files(sub, (root / MANIFEST).read_bytes(), names, read, refused=set(odd))


def _load_clone(sub: Submission, clone: Path, teacher_root: Path) -> None:
    """A student's whole checkout: their edited exercise files and changed notebook working copies."""
    from .progress import file_sha256, read_hashes
    from .scaffolds import expected, read_record

    fresh = expected(teacher_root)
    own_record, teacher_record = read_record(clone), read_record(teacher_root)
    real_clone = os.path.realpath(clone)

    def readable(rel: str) -> bool:
        """A regular file inside the clone, no link on the way, under the cap; a problem said otherwise."""
        theirs = clone / rel
        why = odd_file(theirs)
        if why and not why.startswith("a link"):
            sub.problems.append(f"tampered: {rel} in the clone is {why}: refused (never read); the scaffold grades")
            return False
        if not (theirs.is_file() or theirs.is_symlink()):
            return False
        if theirs.is_symlink() or os.path.realpath(theirs) != os.path.join(real_clone, rel):
            sub.problems.append(f"tampered: {rel} in the clone is a link (to {os.path.realpath(theirs)}): refused, "
                                "as in a folder hand-in; the scaffold grades")
            return False
        if theirs.stat().st_size > MAX_FILE_BYTES:
            sub.problems.append(f"{rel} is larger than {MAX_FILE_BYTES // 2**20} MiB (ignored)")
            return False
        return True

    for path, text in fresh.items():
        rel = path.relative_to(teacher_root).as_posix()
        theirs = clone / rel
        if not readable(rel):
            continue
        data = theirs.read_bytes()
        digest = sha256(data)
        if data != text.encode("utf-8") and digest not in (own_record.get(rel), teacher_record.get(rel)):
            sub.files[rel] = data
    for rel, module_id in notebook_names().items():
        work = clone / rel
        clean = teacher_root / get_module(module_id).notebook
        if readable(rel) and (not clean.is_file() or work.read_bytes() != clean.read_bytes()):
            sub.files[rel] = work.read_bytes()
    odd_tests = {rel: why for rel in ["tests", *read_hashes(teacher_root)]
                 if (why := odd_file(clone / rel)) and not rel.startswith("tests/tooling/")}
    if odd_tests:
        shown = "; ".join(f"{rel} is {why}" for rel, why in list(odd_tests.items())[:4])
        sub.notes.append(f"the clone's tests are not plain files ({shown}{'; ...' if len(odd_tests) > 4 else ''}): "
                         "ignored, never read; the course's tests grade")
    linked_tests = "tests" in odd_tests
    changed = [rel for rel, want in read_hashes(teacher_root).items()   # the course's tests, not its tooling tests
               if not linked_tests and rel not in odd_tests and not rel.startswith("tests/tooling/")
               and (clone / rel).is_file() and file_sha256(clone / rel) != want]
    if changed:
        sub.notes.append(f"the clone's test files differ from the course's ({', '.join(changed[:4])}"
                         f"{', ...' if len(changed) > 4 else ''}): ignored, the course's tests grade")
    sub.commit = course_commit(clone, untrusted=True)
    sub.student = (_git(clone, "config", "user.name", untrusted=True) or "").strip()


def load_submission(entry: Path, teacher_root: Path) -> Submission | None:
    """Read one entry of a submissions folder (None for files that are no submission, e.g. ``.DS_Store``)."""
    entry = Path(entry)
    if entry.name.startswith("."):
        return None
    if entry.is_file():
        if entry.suffix.lower() != ".zip":
            return None
        sub = Submission(entry.stem, entry, "archive")
        _load_archive(sub)
    elif entry.is_dir():
        if (entry / MANIFEST).is_file():
            sub = Submission(entry.name, entry, "folder")
            _load_folder(sub)
        else:
            sub = Submission(entry.name, entry, "clone")
            candidates = [entry] + [d for d in sorted(entry.iterdir()) if d.is_dir() and not d.name.startswith(".")]
            clone = next((c for c in candidates if find_root(c) == c.resolve()), None)
            if clone is None:
                sub.error = ("neither a submission archive (no manifest.json) nor a g2c checkout (no "
                             "g2c/course/registry.py here or one folder down)")
            else:
                _load_clone(sub, clone, teacher_root)
    else:
        return None
    if sub.error is None and sub.commit and (teacher := course_commit(teacher_root)) and sub.commit != teacher:
        sub.notes.append(f"handed in from course commit {sub.commit[:12]}, graded on the teacher's {teacher[:12]}")
    return sub


# -- grading ---------------------------------------------------------------------------------------

def _overlay_ignore(teacher_root: Path):
    def ignore(folder: str, names: list[str]) -> set[str]:
        rel = Path(os.path.relpath(folder, teacher_root)).as_posix()
        skip = {n for n in names if n in OVERLAY_SKIP or n.endswith(".egg-info")}
        if rel == "notebooks":
            skip.add("work")
        return skip
    return ignore


def make_overlay(teacher_root: Path, dest: Path, files: dict[str, bytes], fresh: dict[Path, str]) -> Path:
    """A grading copy of the teacher's checkout in ``dest``: every exercise file as its fresh scaffold, then
    the student's ``files`` written over them; ``.venv``, ``artifacts`` and ``data`` linked to the teacher's."""
    shutil.copytree(teacher_root, dest, ignore=_overlay_ignore(teacher_root), symlinks=True)
    for path, text in fresh.items():
        target = dest / path.relative_to(teacher_root)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
    for rel, data in files.items():
        if allowed_kind(rel) and allowed_kind(rel)[0] == "exercise":
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)
    for name in LINKED:
        if (teacher_root / name).exists():
            (dest / name).symlink_to((teacher_root / name).resolve(), target_is_directory=True)
    return dest


# The teacher's environment variables a grading run keeps (none of the teacher's tokens or keys reach the
# graded code): these names, and names with these prefixes (thread counts, devices, the course's own).
KEPT_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM", "SYSTEMROOT", "COMSPEC", "PATHEXT", "MPLBACKEND")
KEPT_ENV_PREFIXES = ("LC_", "G2C_", "OMP_", "MKL_", "OPENBLAS_", "CUDA_", "HF_", "TORCH", "PYTORCH_", "NVIDIA_")


def grade_env(overlay: Path, *, home: str | None = None, tmp: str | None = None) -> dict[str, str]:
    """The environment of a submission's grading run: its overlay first on the import path, a private ``HOME``
    and ``TMPDIR``, no bytecode written, and of the teacher's environment only ``KEPT_ENV`` (no selection of the
    teacher's shell, ``G2C_APPLY_SOLUTIONS`` or ``G2C_REPLACE_EDITED``, leaks in). Nothing of the run's check
    tests is in it: the grader gets them over a pipe (``grader.py``)."""
    env = {k: v for k, v in os.environ.items()
           if (k in KEPT_ENV or k.startswith(KEPT_ENV_PREFIXES))
           and k not in ("G2C_APPLY_SOLUTIONS", "G2C_REPLACE_EDITED", "G2C_GRADE_CHECKS", GRADE_FDS_ENV,
                         NAMESPACE_ENV)}
    env.update(PYTHONPATH=str(overlay), G2C_QUIET="1", PYTHONIOENCODING="utf-8", PYTHONDONTWRITEBYTECODE="1",
               PYTHONNOUSERSITE="1")
    env.setdefault("PATH", os.defpath)
    if home:
        env["HOME"] = home
    if tmp:
        env["TMPDIR"] = tmp
    return env


MAX_RESULTS_BYTES = 64 * 2**20   # the grader's results, as read from its pipe


def _tail(path: Path, n: int = 1500) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - n))
            data = f.read(n)
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    return "".join(c if c.isprintable() or c in "\n\t" else "?" for c in text)


_STOPPING = threading.Event()           # set when grade-class is interrupted or stops: no new grading run starts


def stop_grading() -> None:
    """Kill every grading run in flight and start no new one. The grading runs live in sessions (and, contained,
    namespaces) of their own, which also keeps a terminal's Ctrl-C or a SIGTERM from reaching them: grade-class
    calls this when it is interrupted, so no student's endless loop outlives it."""
    _STOPPING.set()
    sandbox.stop_all()


class Stopped(RuntimeError):
    """The class run stopped (interrupted, or the teacher's environment changed) while this one was graded."""


class ResultsPipe:
    """The grader's results, read from the pipe only the grader holds (``grader.py``): one JSON line per module,
    then an end line. Read in a thread as they come (a module's result restarts its deadline); complete only
    once every process of the sandbox is gone (end of file)."""

    def __init__(self, fd: int):
        self.fd, self.modules, self.crashed, self.end, self.problems = fd, {}, {}, None, []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _line(self, raw: bytes) -> None:
        try:
            rec = json.loads(raw.decode("utf-8"))
        except ValueError:
            self.problems.append("a line of the grader's results is not JSON")
            return
        if not isinstance(rec, dict):
            self.problems.append("a line of the grader's results is no record")
        elif self.end is not None:
            self.problems.append("the grader's results go on after their end")
        elif isinstance(rec.get("module"), dict) and isinstance(rec["module"].get("id"), str):
            if rec["module"]["id"] in self.modules:
                self.problems.append(f"module {rec['module']['id'][:20]} was reported twice")
            else:
                self.modules[rec["module"]["id"]] = rec["module"]
        elif isinstance(rec.get("crashed"), str):
            self.crashed[rec["crashed"]] = str(rec.get("cause") or "")[:300]
        elif rec.get("end") is True:
            self.end = rec
        else:
            self.problems.append("a line of the grader's results is no record it writes")

    def _read(self) -> None:
        buf, size = b"", 0
        while True:
            try:
                chunk = os.read(self.fd, 1 << 16)
            except OSError:
                break
            if not chunk:
                break
            size += len(chunk)
            if size > MAX_RESULTS_BYTES:
                with self._lock:
                    self.problems.append("the grader's results are too long")
                break
            buf += chunk
            *lines, buf = buf.split(b"\n")
            with self._lock:
                for line in lines:
                    if line.strip():
                        self._line(line)
        with self._lock:
            if buf.strip():
                self._line(buf)

    def done(self) -> int:
        with self._lock:
            return len(self.modules) + len(self.crashed)

    def close(self, wait: float = 10.0) -> None:
        """Wait (at most ``wait`` s) for the end of file, then close the pipe (once)."""
        self._thread.join(wait)
        if self.fd is not None and not self._thread.is_alive():
            os.close(self.fd)
            self.fd = None


def _run_with_module_deadline(start, results: ResultsPipe, timeout: float) -> tuple[int | None, bool, int | None,
                                                                                     float | None, int | None]:
    """Run one grader (``start()`` returns its ``sandbox.Run``); stop it when ``timeout`` seconds pass without a
    new module's result on ``results`` (the deadline restarts at each). Returns (exit code, timed out, processes
    it left behind that had to be killed, seconds the sandbox took to set up, processes counted when the
    sandbox killed it for holding more than its limit). ``results`` is read to its end only after the sandbox
    and every process in it are gone.

    Raises:
        Stopped: the class run was interrupted or stopped while it ran."""
    timed_out, seen = False, 0
    if _STOPPING.is_set():
        raise Stopped("grade-class was interrupted before this submission was graded")
    run = start()
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                run.wait(timeout=max(0.0, min(0.5, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                pass
            if _STOPPING.is_set():
                run.kill(hard=True)
                break
            done = results.done()
            if done > seen:            # a module finished: the next one gets its own `timeout`
                seen, deadline = done, time.monotonic() + timeout
            elif time.monotonic() >= deadline:
                timed_out = True
                run.kill()
                break
    finally:                           # an exception or an interrupt here: the run never outlives us
        if run.poll() is None:
            run.kill(hard=True)
        rc, left = run.finish()
        results.close()
    if _STOPPING.is_set():
        raise Stopped("grade-class was interrupted while this submission was graded")
    if run.setup_error():
        raise RuntimeError(run.setup_error())
    setup = (run.report or {}).get("setup_s")
    crowd = (run.report or {}).get("pids_exceeded")
    return rc, timed_out, (None if timed_out else left), (setup if isinstance(setup, (int, float)) else None), \
        (crowd if isinstance(crowd, int) else None)


@dataclass
class ClassRun:
    """What every submission's grading in one class run shares."""

    teacher_root: Path
    fresh: dict[Path, str]
    ids: list[str]
    timeout: float
    containment: sandbox.Containment
    work: Path                                 # the class run's own folder (each submission's copy inside)
    hide: list[Path] = field(default_factory=list)
    expose: list[Path] = field(default_factory=list)
    home: Path | None = None
    recorded: dict[str, int | None] = field(default_factory=dict)
    python: str = sys.executable


def _blank(m: dict, state: str) -> dict:
    """A module's result whose numbers no longer count: kept in grades.json under ``reported``, scores blank."""
    kept = {k: m.get(k) for k in ("passed", "failed", "skipped", "total")}
    return {**m, "passed": 0, "failed": 0, "skipped": 0, "total": 0, "state": state, "valid": False,
            "reported": kept}


def grade_submission(sub: Submission, ids: list[str], teacher_root: Path, fresh: dict[Path, str], *,
                     timeout: float, python: str = sys.executable, run: ClassRun | None = None) -> dict:
    """Grade one submission on modules ``ids`` in its own overlay, contained as ``run`` says (uncontained
    without one); return its JSON-ready record."""
    from .progress import untouched_result

    if run is None:
        work = Path(tempfile.mkdtemp(prefix="g2c-class-"))
        run = ClassRun(teacher_root, fresh, ids, timeout, sandbox.choose_containment(uncontained=True), work,
                       recorded={i: untouched_result(i, teacher_root).recorded for i in ids}, python=python)
        owned = True
    else:
        owned = False
    record = _record(sub, "ok", None)
    record["files"] = {r: sha256(b) for r, b in sorted(sub.files.items())}
    try:
        if sub.error:
            record.update(status="error", error=sub.error)
            return record
        record["flags"] = forgery.flags(sub.exercise_files, teacher_root,
                                        {p.relative_to(teacher_root).as_posix(): t for p, t in fresh.items()})
        if not ids:  # nothing to grade: only the checks of the hand-in itself (and its answers) count
            record["status"] = "tampered" if sub.problems else "ok"
            return record
        _grade_in_copy(sub, ids, run, record)
    finally:
        if owned:
            shutil.rmtree(run.work, ignore_errors=True)
    return record


def _edited_modules(files: dict[str, bytes], teacher_root: Path, fresh: dict[Path, str]) -> list[str]:
    """Ids of the modules with an exercise file in ``files`` that differs from its fresh scaffold (the grader's
    ``worked``: the answer key never stands in for them)."""
    scaffold = {p.relative_to(teacher_root).as_posix(): t.encode("utf-8") for p, t in fresh.items()}
    edited = {module_for_file(r).id for r, b in files.items()
              if allowed_kind(r) and allowed_kind(r)[0] == "exercise" and module_for_file(r)
              and scaffold.get(r) != b}
    return [i for i in module_ids() if i in edited]


def hide_answer_key(copy: Path, ids: list[str], worked: list[str]) -> list[str]:
    """Remove from a grading ``copy`` the answer key of every exercise file the grading of ``ids`` does not apply
    (it stands in only for the prerequisites the student did not edit): the graded code cannot read the
    solution of its own module. Returns the removed repo-relative paths."""
    from .registry import grading_selection

    applied = {a for i in ids for a in grading_selection(i, worked)}
    removed = []
    for m in MODULES:
        if m.id in applied:
            continue
        for rel in m.files:
            key = copy / "solutions" / rel
            if key.is_file() or key.is_symlink():
                key.unlink()
                removed.append(f"solutions/{rel}")
    return removed


def answer_key_places(teacher_root: Path) -> list[Path]:
    """Every answer key the graded code could reach through the teacher's files: ``solutions/`` of the teacher's
    checkout, of the checkout this code runs from, and of the checkouts the ``.venv`` (its real path) and the
    Python's prefix lie in, and the git data of each of them (its commits hold the key). The sandbox hides
    them all."""
    roots = {teacher_root, REPO_ROOT, Path(os.path.realpath(sys.prefix)).parent,
             Path(os.path.realpath(teacher_root / ".venv")).parent}
    places = {Path(os.path.realpath(r / "solutions")) for r in roots if (r / "solutions").is_dir()}
    for r in roots:
        places.update(git_places(r))
    return sorted(places)


def git_places(root: Path) -> set[Path]:
    """The git data of the checkout ``root``: its ``.git`` (a folder, or the file a worktree has), the git dir
    and common dir that file points to, and every alternates object store. The answer key is committed, so
    anything here gives it back (``git show HEAD:solutions/...``, or the objects read directly): the sandbox
    hides them all. Found from the files themselves, without running git (a refused or missing git must not
    leave them visible)."""
    found: set[Path] = set()
    dot = root / ".git"
    if not (dot.is_dir() or dot.is_file()):
        return found
    found.add(Path(os.path.realpath(dot)))
    git_dirs = [Path(os.path.realpath(dot))] if dot.is_dir() else []
    if dot.is_file():
        try:
            text = dot.read_text(errors="replace")
        except OSError:
            text = ""
        for line in text.splitlines():
            if line.startswith("gitdir:"):
                d = Path(line[len("gitdir:"):].strip())
                git_dirs.append(Path(os.path.realpath(d if d.is_absolute() else root / d)))
    for d in list(git_dirs):
        try:
            common = (d / "commondir").read_text(errors="replace").strip()
        except OSError:
            common = ""
        if common:
            c = Path(common)
            git_dirs.append(Path(os.path.realpath(c if c.is_absolute() else d / c)))
    for d in git_dirs:
        if d.is_dir():
            found.add(d)
            try:
                alternates = (d / "objects" / "info" / "alternates").read_text(errors="replace").splitlines()
            except OSError:
                alternates = []
            for alt in alternates:
                alt = alt.strip()
                if alt and not alt.startswith("#"):
                    a = Path(alt)
                    a = Path(os.path.realpath(a if a.is_absolute() else d / "objects" / a))
                    if a.is_dir():
                        found.add(a)
    return found


def _grade_in_copy(sub: Submission, ids: list[str], run: ClassRun, record: dict) -> None:
    from .progress import NAMESPACE_ENV, untouched_result

    start = time.monotonic()
    hung: list[str] = []     # modules killed after `timeout` s without a result
    pending, rc, tail, left, crowd = list(ids), 0, "", None, None
    got: dict = {}
    crashed_in: dict[str, str] = {}
    stream_problems: list[str] = []
    incomplete = False
    here = Path(tempfile.mkdtemp(prefix="sub-", dir=run.work))
    try:
        overlay = make_overlay(run.teacher_root, here / "g2c", sub.files, run.fresh)
        worked = _edited_modules(sub.files, run.teacher_root, run.fresh)
        hide_answer_key(overlay, ids, worked)
        files = [t for i in ids for t in get_module(i).tests if (overlay / t).is_file()]
        checks = forgery.make_checks(files)
        results = here / "results"
        results.mkdir()
        private = here / "private"
        kind = run.containment.kind
        if kind == "namespaces":
            home, tmp = (str(run.home) if run.home else "/tmp"), "/tmp"
        elif kind == "container":
            home, tmp = sandbox.CONTAINER_HOME, "/tmp"
        else:
            home, tmp = str(private / "home"), str(private / "tmp")
            for d in (home, tmp):
                Path(d).mkdir(parents=True, exist_ok=True)
        env = grade_env(overlay, home=home, tmp=tmp)
        if kind == "namespaces":
            env[NAMESPACE_ENV] = "1"
        jail = sandbox.Jail(copy=overlay, results=results, private=private, hide=run.hide, expose=run.expose,
                            home=run.home, links=[p.resolve() for p in (overlay / "artifacts", overlay / "data")
                                                  if p.exists()])
        copy_since = integrity.stamp(here / "stamps")
        while pending:        # one grading process; after a kill, a fresh one for the modules after the hung one
            log = here / f"grade-{len(hung)}.log"
            config_r, config_w = os.pipe()
            results_r, results_w = os.pipe()
            mine = {config_r, config_w, results_w}        # closed once each (another thread may reuse a number)

            def shut(fd: int) -> None:
                if fd in mine:
                    mine.discard(fd)
                    os.close(fd)
            pipe = ResultsPipe(results_r)
            cmd = [run.python, "-m", "g2c.course.grader", str(config_r), str(results_w)]
            plan = json.dumps({"ids": pending, "worked": worked, "checks": checks}).encode("utf-8")
            try:
                with open(log, "wb") as logf:
                    def begin():
                        try:
                            return sandbox.launch(run.containment, jail, cmd, env, logf, (config_r, results_w))
                        finally:
                            shut(config_r)
                            shut(results_w)
                            try:
                                os.write(config_w, plan)          # small: the pipe holds it at once
                            except OSError:
                                pass
                            shut(config_w)
                    rc, timed_out, left_now, setup_now, crowd_now = _run_with_module_deadline(begin, pipe,
                                                                                              run.timeout)
            finally:
                for fd in list(mine):
                    shut(fd)
                pipe.close()
            now = pipe.modules
            stream_problems += pipe.problems
            for i, cause in pipe.crashed.items():
                crashed_in.setdefault(i, cause)
            if pipe.end is not None and isinstance(pipe.end.get("left"), int) and pipe.end["left"] > 0:
                left_now = (left_now or 0) + pipe.end["left"]
            if left_now:
                left = (left or 0) + left_now
            if crowd_now:
                crowd = crowd_now
            if setup_now is not None:
                record.setdefault("sandbox_setup_s", []).append(setup_now)
            for i, m in now.items():
                got.setdefault(i, m)
            tail = _tail(log)
            if not timed_out:
                incomplete = pipe.end is None
                break
            stuck = next((i for i in pending if i not in now and i not in pipe.crashed), None)
            if stuck is None:     # killed after the last result was written: nothing left to grade
                break
            hung.append(stuck)
            pending = pending[pending.index(stuck) + 1:]
        moved = integrity.newer([overlay], copy_since, here / "stamps")
        if moved:                  # read-only when contained; uncontained, its own code or a neighbour's did it
            shown = ", ".join(p.relative_to(overlay).as_posix() if p != overlay else "." for p in moved[:5])
            record["problems"].insert(0, f"tampered: the copy it was graded in changed during its grading ({shown}"
                                         f"{', ...' if len(moved) > 5 else ''}): not a valid grade")
    finally:
        shutil.rmtree(here, ignore_errors=True)
    timed_out = bool(hung)
    record["wall_s"] = round(time.monotonic() - start, 1)
    record["left"] = left
    if left:
        record["notes"].append(f"left {left} process{'es' if left > 1 else ''} running after its grading (killed)")
    forged: list[str] = [f"the grader's results: {p}" for p in sorted(set(stream_problems))]
    for i in ids:
        m = got.get(i)
        r = untouched_result(i, run.teacher_root)
        crashed = i in crashed_in and m is None
        if crashed:
            cause = one_line(crashed_in[i]) or "see grades.json"
            record["notes"].append(f"module {i}: the code breaks before any test starts ({cause}): it scores 0")
        if m is None:
            m = {"id": i, "title": r.title, "passed": 0, "failed": 0, "skipped": 0, "total": 0,
                 "recorded": r.recorded, "untouched": r.untouched, "own_failures": 0, "blocked": {}, "applied": [],
                 "failures": [{"test": f"(no test could start: {one_line(crashed_in[i]) or 'see grades.json'})",
                               "blocked_by": None}] if crashed else [],
                 "warnings": [], "valid": crashed, "checks": {},
                 "state": "crashed" if crashed else "timeout" if i in hung else "error"}
        else:
            raw_forged = [str(x)[:300] for x in m.get("forged", [])] if isinstance(m.get("forged"), list) else []
            raw_incomplete = m.get("incomplete") if isinstance(m.get("incomplete"), list) else []
            m = _sanitised(m, r)
            mine = {f: c for f, c in checks.items() if f in get_module(i).tests}
            bad, invalid = forgery.verify(m, mine, run.recorded.get(i, r.recorded))
            forged += [f"module {i}: {b}" for b in [*raw_forged, *bad]]
            if raw_incomplete:
                incomplete = True
            if invalid:
                m["warnings"] = [*m["warnings"], *invalid]
                m["valid"] = False
            m["state"] = _state(m, i in sub.worked)
        record["modules"][i] = m
    if forged:
        record["modules"] = {i: _blank(m, "forged") if m["state"] not in ("timeout", "crashed") else m
                             for i, m in record["modules"].items()}
        record.update(status="forged", error="the grader's report is not the course's tests run honestly: "
                                             + "; ".join(forged[:3]) + (f" (and {len(forged) - 3} more)"
                                                                        if len(forged) > 3 else ""))
    elif crowd:
        record["modules"] = {i: _blank(m, "error") for i, m in record["modules"].items()}
        record.update(status="error", error=f"killed: it held {crowd} processes at once, over the limit of "
                                            f"{sandbox.PIDS_LIMIT} (a fork bomb?), so none of its scores count")
    elif timed_out:
        rest = [i for i in ids if i not in hung]
        others = f"; its other modules are graded ({', '.join(rest)})" if rest else ""
        record.update(status="timeout", error=f"killed after {run.timeout:g} s in module {', '.join(hung)} (an "
                                              f"endless loop or a very slow submission){others}")
    elif rc != 0 or incomplete or len(got) + len([i for i in crashed_in if i not in got]) < len(ids):
        how = f"exited with code {rc}" if rc is not None else "was killed"
        if rc == 0:
            how = "stopped before its results were complete"
        record["modules"] = {i: _blank(m, "error") for i, m in record["modules"].items()}
        record.update(status="error", error=f"the grader {how}, so none of its scores count"
                                            + (f" ({one_line(last_error(tail))})" if last_error(tail) else ""))
    elif record["problems"]:
        record["status"] = "tampered"
    if record["status"] != "ok":
        record["log_tail"] = tail


CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
ANSI = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")


def clean_text(text: str) -> str:
    """``text`` with terminal escape sequences removed and every other control or bidirectional character shown
    as ``?`` (newlines and tabs kept): what a report cell or line may hold."""
    return CONTROL.sub("?", ANSI.sub("", str(text)).replace("\r\n", "\n"))


def one_line(text: str, width: int = 300) -> str:
    """``text`` cleaned (``clean_text``) and on one line of at most ``width`` characters."""
    flat = " ".join(clean_text(text).split())
    return flat if len(flat) <= width else flat[:width - 3] + "..."


def last_error(tail: str) -> str:
    """The last exception line (``SomeError: why``) in a log tail, or "" (never a whole traceback)."""
    for line in reversed(clean_text(tail).splitlines()):
        line = line.strip().lstrip("E").strip()
        if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b", line):
            return line
    return ""


def _sanitised(m: dict, r) -> dict:
    """A module's result from the grader's file, in the shape the reports read (the file is the graded code's to
    write: every field is checked, the teacher's own title and record are used)."""
    def count(key):
        v = m.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0

    failures = [f for f in m.get("failures", []) if isinstance(f, dict) and isinstance(f.get("test"), str)]
    blocked = {str(k): v for k, v in (m.get("blocked") or {}).items() if isinstance(v, int)} \
        if isinstance(m.get("blocked"), dict) else {}
    out = {"id": r.id, "title": r.title, "passed": count("passed"), "failed": count("failed"),
           "skipped": count("skipped"), "recorded": r.recorded, "untouched": r.untouched, "blocked": blocked,
           "applied": [str(a) for a in m.get("applied", []) if isinstance(a, str)] if isinstance(
               m.get("applied"), list) else [],
           "failures": [{"test": f["test"][:500], "blocked_by": f.get("blocked_by") if isinstance(
               f.get("blocked_by"), str) else None} for f in failures[:2000]],
           "warnings": [str(w)[:500] for w in m.get("warnings", [])[:20]] if isinstance(m.get("warnings"), list)
           else [],
           "checks": {str(k): str(v) for k, v in m["checks"].items()} if isinstance(m.get("checks"), dict) else {},
           "seconds": m.get("seconds") if isinstance(m.get("seconds"), (int, float)) else None}
    out["total"] = out["passed"] + out["failed"] + out["skipped"]
    out["own_failures"] = max(0, out["failed"] - sum(blocked.values()))
    out["valid"] = not out["warnings"] and m.get("valid", True) is True
    return out


def _state(m: dict, worked: bool) -> str:
    if m["total"] == 0:
        return "no tests ran"
    if not m.get("valid", True):
        return "invalid"
    if m["failed"] == 0 and m["skipped"] == 0 and (m["recorded"] is None or m["total"] >= m["recorded"]):
        return "done"
    if m["blocked"] and m["own_failures"] == 0:
        return "blocked"
    return "in progress" if worked or (m["untouched"] is not None and m["passed"] > m["untouched"]) \
        else "not started"


def _cell(m: dict) -> str:
    denominator = m["recorded"] if m.get("recorded") is not None else m["total"]
    if m["state"] in ("timeout", "error", "forged", "not graded"):
        return m["state"]
    if m["state"] == "crashed":
        return f"0/{denominator} crashed"
    text = f"{m['passed']}/{denominator}"
    if m["state"] == "blocked" or m["blocked"]:
        text += " b"
    if m["state"] == "invalid":
        text += " !"
    return text


def _report_folder(entry: Path) -> bool:
    """A folder ``grade-class`` wrote its reports into (never a submission)."""
    try:
        head = (entry / "grades.json").read_bytes()[:200] if (entry / "grades.json").is_file() else b""
    except OSError:
        head = b""
    return b'"g2c-class-grades"' in head or ((entry / "summary.txt").is_file() and (entry / "grades.csv").is_file())


def _load_class(folder: Path, teacher_root: Path, out: Path | None) -> tuple[list[Submission], list[str]]:
    """Every submission in ``folder`` and the lines to say about what was skipped or renamed."""
    said = []
    subs = []
    for entry in sorted(folder.iterdir()):
        if entry.is_dir() and ((out is not None and entry.resolve() == out.resolve()) or _report_folder(entry)):
            said.append(f"skipped {entry.name}/: a report folder of grade-class, not a submission")
            continue
        sub = load_submission(entry, teacher_root)
        if sub is not None:
            subs.append(sub)
    by_name: dict[str, list[Submission]] = {}
    for s in subs:
        by_name.setdefault(s.name, []).append(s)
    for name, same in by_name.items():
        if len(same) > 1:
            shown = [s.source.name + ("/" if s.kind != "archive" else "") for s in same]
            for s, new in zip(same, shown):
                s.name = new
                s.notes.append(f"{len(same)} submissions are named {name!r} ({', '.join(shown)}): this row is {new}")
            said.append(f"{len(same)} submissions are named {name!r}: their rows are {', '.join(shown)}")
    return subs, said


def _record(sub: Submission, status: str, error: str | None) -> dict:
    """A submission's row in grades.json before any module is graded (problems and notes capped)."""
    return {"name": sub.name, "source": str(sub.source), "kind": sub.kind, "student": sub.student,
            "commit": sub.commit, "worked": sub.worked, "problems": _capped(sub.problems, MAX_LINES_JSON),
            "notes": _capped(sub.notes, MAX_LINES_JSON), "flags": [], "files": {}, "modules": {}, "status": status,
            "error": error, "wall_s": 0.0, "left": None}


def _not_graded(sub: Submission, why: str) -> dict:
    return _record(sub, "not graded", why)


def _places(teacher_root: Path) -> list[Path]:
    """What the grader needs to see, wherever it lies: the checkout, its linked folders, the Python installation
    and every folder on the import path (the sandbox binds back those that sit under a hidden folder)."""
    out = [teacher_root]
    for name in LINKED:
        if (teacher_root / name).exists():
            out.append((teacher_root / name).resolve())
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
              *sys.path):
        if p and os.path.isdir(p):
            out.append(Path(os.path.realpath(p)))
    return sorted(set(out))


def _home() -> Path | None:
    home = os.environ.get("HOME") or os.path.expanduser("~")
    p = Path(home)
    return p.resolve() if home and p.is_absolute() and p.is_dir() and p.resolve() != Path("/") else None


def grade_class(folder: Path, *, teacher_root: Path = REPO_ROOT, modules: str | None = None, out: Path | None = None,
                timeout: float | None = None, jobs: int = 1, echo=_say, container: str | None = None,
                uncontained: bool = False) -> int:
    """Grade every submission in ``folder`` on the teacher's checkout, each contained (``sandbox``) and watched
    (``integrity``); write the reports last; return the exit code.

    Raises:
        Refused: ``folder`` is missing or is itself a checkout; ``modules`` is malformed or selects no module
            with tests ("--modules 0 selects no module"); ``timeout`` is not a finite number of seconds above 0;
            no containment works here and ``uncontained`` is not set; the teacher's tests differ from their
            committed record (exit code 2, before any report is written).
    """
    from .progress import share_cores, test_file_problems, untouched_result
    from .scaffolds import expected

    folder = Path(folder)
    if timeout is not None and not (math.isfinite(timeout) and timeout > 0):
        raise Refused(f"--timeout {timeout:g}: give the seconds one module of a submission may take, a number above "
                      "0 (e.g. --timeout 600)")
    if not folder.is_dir():
        raise Refused(f"{folder} is not a folder: give the folder that holds the submissions (zip archives or clones)")
    if find_root(folder) == folder.resolve():
        raise Refused(f"{folder} is a g2c checkout itself: give the folder that holds the submissions")
    teacher_root = Path(teacher_root).resolve()
    out = Path(out) if out else folder.resolve().parent / f"{folder.resolve().name}-grades"
    subs, said = _load_class(folder, teacher_root, out)
    try:
        ids = parse_selection(modules) if modules else \
            [i for i in module_ids() if any(i in s.worked for s in subs)]
    except ValueError as exc:
        raise Refused(f"--modules: {str(exc).replace(ENV_PREFIX, '')}") from None
    if not subs or all(s.error and s.error.startswith("neither a submission archive") for s in subs):
        # only folders that are no hand-in (e.g. the g2c/ package folder inside one): a wrong folder, not a class
        entries = sorted(e.name for e in folder.iterdir())
        more = f" and {len(entries) - 3} more" if len(entries) > 3 else ""
        seen = f"; it holds only {', '.join(entries[:3])}{more}" if entries else "; it is empty"
        raise Refused(f"{folder} holds no submission (a .zip from ./test.sh --submit, an unpacked one, or a clone "
                      f"of the course){seen}: check the folder")
    graded = [i for i in ids if get_module(i).tests]
    if modules and not graded:       # an explicit selection that grades nothing must not replace a class's reports
        what = f"selects {', '.join(ids)}, which {'has' if len(ids) == 1 else 'have'} no tests" if ids else \
            "selects no module"
        raise Refused(f"--modules {modules} {what}: give the ids of modules to grade, e.g. --modules 03,04 or "
                      "--modules 01-11 (python -m g2c.course graph lists them)")
    ids = graded
    timeout = float(timeout) if timeout else 300.0      # per module
    try:
        containment = sandbox.choose_containment(container=container, uncontained=uncontained)
    except sandbox.Unavailable as exc:
        raise Refused(str(exc)) from None
    try:  # before any grading: a report folder that cannot be written must not cost a class's run
        if out.exists() and not out.is_dir():
            raise Refused(f"--out {out} is a file: give a folder for the reports")
        out.mkdir(parents=True, exist_ok=True)
        check_writable(out, "report")
    except OSError as exc:
        raise Refused(f"--out: {write_problem(exc, out)}") from None
    bytecode = sys.dont_write_bytecode
    sys.dont_write_bytecode = True           # the watch below sees any file written: this process writes none
    home = _home()
    work = Path(tempfile.mkdtemp(prefix="g2c-class-")).resolve()
    try:
        watch, refusals, warnings = integrity.begin(teacher_root, prune=[out.resolve(), work, folder.resolve()],
                                                    home=home)
        if refusals:
            shown = "; ".join(refusals[:5]) + (f" (and {len(refusals) - 5} more)" if len(refusals) > 5 else "")
            raise Refused(f"the teacher's checkout {teacher_root} is not the course as committed: {shown}. Its "
                          "grades would not be the course's: restore the tests (git checkout -- tests/), or, if you "
                          "changed them on purpose, record and commit them (python scripts/contract.py --record "
                          "FILE; git commit)")
        hide = sorted({folder.resolve(), out.resolve(), work, *(Path(os.path.realpath(s.source)) for s in subs),
                       *answer_key_places(teacher_root)})
        run = ClassRun(teacher_root, expected(teacher_root), ids, timeout, containment, work, hide=hide,
                       expose=_places(teacher_root), home=home,
                       recorded={i: untouched_result(i, teacher_root).recorded for i in ids})
        return _grade_all(subs, run, folder=folder, out=out, jobs=jobs, echo=echo, watch=watch, said=said,
                          warnings=warnings, test_file_problems=test_file_problems, share_cores=share_cores)
    finally:
        sys.dont_write_bytecode = bytecode
        shutil.rmtree(work, ignore_errors=True)


def _grade_all(subs, run: ClassRun, *, folder, out, jobs, echo, watch, said, warnings, test_file_problems,
               share_cores) -> int:
    ids, teacher_root = run.ids, run.teacher_root
    teacher_commit = course_commit(teacher_root)
    echo(run.containment.headline())
    echo(f"grading {len(subs)} submission(s) from {folder} on module(s) {', '.join(ids) or 'none'} with the tests "
         f"of {teacher_root}{' (commit ' + teacher_commit[:12] + ')' if teacher_commit else ''}; "
         f"{jobs} at a time, at most {run.timeout:g} s per module")
    for line in said:
        echo(f"note: {line}")
    for w in warnings:
        echo(f"WARNING: {w}")
    for m in ids:
        for p in test_file_problems(get_module(m), teacher_root):
            echo(f"WARNING: the teacher's checkout: {p} (module {m}); run `git checkout -- tests/` or re-record")
    lock = threading.Lock()
    started = time.monotonic()
    done = [0]
    changed: list[tuple[str, str]] = []
    stopped_by: list[str] = []
    running: set[str] = set()
    stamps = run.work / "stamps"

    def one(sub: Submission) -> dict:
        if stopped_by:
            return _not_graded(sub, f"not graded: the class run stopped after {stopped_by[0]}'s grading changed "
                                    "the teacher's environment")
        with lock:
            since = integrity.stamp(stamps)
            beside = set(running)
            running.add(sub.name)
        try:
            rec = grade_submission(sub, ids, teacher_root, run.fresh, timeout=run.timeout, run=run)
        except Stopped as exc:
            rec = _not_graded(sub, f"not graded: {exc}" if not stopped_by else
                              f"not graded: the class run stopped after {stopped_by[0]}'s grading changed the "
                              "teacher's environment")
        except Exception as exc:  # one broken submission never stops the class
            rec = _not_graded(sub, one_line(f"{type(exc).__name__}: {exc}", 600))
            rec["status"] = "error"
        with lock:
            running.discard(sub.name)
            beside |= running
            if rec["status"] != "not graded" and ids and sub.error is None:    # its code ran: was it contained?
                t0 = time.monotonic()
                found = integrity.changes(watch, since, stamps)
                rec["checks_s"] = round(time.monotonic() - t0, 3)
                if found:
                    what = "; ".join(list(dict.fromkeys(f"{w}: {d}" for w, d in found))[:5])
                    more = f" (and {len(found) - 5} more)" if len(found) > 5 else ""
                    also = (f" (graded at the same time as {', '.join(sorted(beside))}: either may have done it)"
                            if beside else "")
                    rec["problems"].insert(0, f"tampered: wrote outside its copy ({what}{more}){also}")
                    rec["status"] = "tampered"
                    changed.extend(found)
                    if not stopped_by:
                        stopped_by.append(sub.name)
                        _STOPPING.set()
                        sandbox.stop_all()
            done[0] += 1
            if not (_STOPPING.is_set() and not stopped_by):
                echo(f"[{done[0]}/{len(subs)}] {one_line(sub.name, 200)}: {rec['status']} ({rec['wall_s']:.1f} s)")
        return rec

    try:
        if ids:
            share_cores(jobs)                 # grading runs side by side: each gets its share of the cores
            pool = ThreadPoolExecutor(max_workers=max(1, jobs))
            try:
                records = list(pool.map(one, subs))
            except BaseException:             # Ctrl-C / SIGTERM: kill the grading runs, start no other submission
                stop_grading()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            pool.shutdown()
        else:
            records = [one(s) for s in subs]
    finally:
        if stopped_by:
            _STOPPING.clear()
    forgery.slow_fast_flags(records)
    wall = time.monotonic() - started
    report = {"kind": "g2c-class-grades", "format": FORMAT,
              "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
              "containment": {"kind": run.containment.kind, "user": run.containment.user,
                              "lines": run.containment.lines()},
              "teacher": {"root": str(teacher_root), "commit": teacher_commit},
              "modules": ids, "selector": selector_for(ids), "timeout_s": run.timeout, "jobs": jobs,
              "wall_s": round(wall, 1), "notes": said + warnings,
              "environment_changed": {"by": stopped_by[0], "found": [f"{w}: {d}" for w, d in changed][:MAX_LINES_JSON],
                                      "restore": integrity.restore_lines(watch, changed)} if stopped_by else None,
              "submissions": records}
    summary = summary_text(report)
    page = answers_page(subs, teacher_root)
    texts = {"grades.json": json.dumps(report, indent=1) + "\n", "grades.csv": csv_text(report),
             "summary.txt": summary + "\n", "answers.html": answers_html(page), "answers.md": answers_markdown(page)}
    for name, text in texts.items():      # last, each atomically: a reader never sees half a report
        try:
            write_text_atomic(out / name, text)
        except OSError as exc:
            echo(summary)
            print(f"grade-class: {write_problem(exc, out / name)}", file=sys.stderr)
            return EXIT_INCOMPLETE
    echo(summary)
    echo(f"wrote {out}/grades.csv, grades.json, summary.txt, answers.html, answers.md ({wall:.1f} s in all)")
    return EXIT_OK if all(r["status"] == "ok" for r in records) else EXIT_INCOMPLETE


# -- reports -------------------------------------------------------------------------------------

MAX_DETAIL_LINES = 10      # problem lines per submission in the summary ("and N more": grades.json has them)
MAX_LINES_JSON = 200       # problems and notes kept per submission in grades.json
MAX_CELL = 10_000          # characters of one CSV cell (spreadsheets take 32,767; csv readers 131,072)
NO_SCORE = ("timeout", "error", "forged", "not graded")


def _capped(lines: list[str], n: int) -> list[str]:
    return lines if len(lines) <= n else [*lines[:n], f"... and {len(lines) - n} more"]


def summary_text(report: dict) -> str:
    """The readable report: what was contained (first line), the environment's state, then a row per student and
    a column per module (passed / tests the course records), then at most ``MAX_DETAIL_LINES`` lines of details
    per submission."""
    ids = report["modules"]
    head = list(report.get("containment", {}).get("lines", []))
    changed = report.get("environment_changed")
    if changed:
        head += ["", f"THE TEACHER'S ENVIRONMENT CHANGED while {changed['by']} was graded: the class run stopped, and "
                     "the submissions after it are not graded. What changed:",
                 *(f"  {line}" for line in _capped(changed["found"], MAX_DETAIL_LINES)), "To restore it:",
                 *(f"  {line}" for line in changed["restore"])]
    rows = [("student", "status", *ids, "notes")]
    details = []
    for r in report["submissions"]:
        notes, mine = [], []
        for i in ids:
            m = r["modules"].get(i)
            if not m:
                continue
            blocked = ", ".join(f"{b} ({n})" for b, n in m["blocked"].items())
            if blocked:
                notes.append(f"{i} blocked by {blocked}")
            own = [f["test"] for f in m["failures"] if not f["blocked_by"]]
            if own and i in r["worked"] and m["state"] not in ("timeout", "error", "crashed", "forged"):
                mine.append(f"{i}: {len(own)} failing: "
                            + ", ".join(t.split("::", 1)[-1] for t in own[:6]) + (" ..." if len(own) > 6 else ""))
            for w in m.get("warnings", []):
                mine.append(f"{i}: NOT VALID: {w}")
        if r["error"]:
            mine.append(f"{r['status'].upper()}: {r['error']}")
        mine += list(r["problems"])
        mine += [f"LOOK: {f}" for f in r.get("flags", [])]
        mine += [f"note: {n}" for n in r["notes"]]
        details += [f"  {one_line(r['name'], 200)}: {one_line(line, 1000)}" for line in _capped(mine, MAX_DETAIL_LINES)]
        rows.append((one_line(r["name"], 60), r["status"],
                     *(_cell(r["modules"][i]) + ("*" if i in r["worked"] else "") if i in r["modules"] else "-"
                       for i in ids), "; ".join(notes)))
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    legend = ("cells: tests passed / tests the course records for the module (its own tests, the answer key for the "
              "prerequisites the student did not edit); *: the student handed in exercise files of this module (the "
              "others run the untouched scaffold); b: some failures come from an unwritten prerequisite the student "
              "edited (blocking, not failing); !: not a valid grade; crashed: no test could start (scores 0); "
              "forged: the report is not the course's tests run honestly (no score); timeout / error / not graded: "
              "no score. LOOK: a sign worth reading the code for. Failing tests are listed for the modules handed "
              "in.")
    out = [*head, "", *lines, "", legend]
    if details:
        out += ["", "details:", *details]
    n = len(report["submissions"])
    bad = [r["name"] for r in report["submissions"] if r["status"] != "ok"]
    checks = [r["checks_s"] for r in report["submissions"] if isinstance(r.get("checks_s"), (int, float))]
    if checks:
        out.append("")
        out.append(f"the checks after each submission took {statistics.median(checks):.2f} s (median; python -m "
                   "g2c.course.sandbox --cost measures them and the sandbox's start)")
    out.append("")
    out.append(f"{n} submission(s) in {report['wall_s']:.1f} s; "
               + (f"not graded cleanly: {', '.join(bad)}" if bad else "all graded"))
    return clean_text("\n".join(out))


CSV_FIELDS = ["student", "name_in_manifest", "status", "module", "state", "passed", "failed", "skipped", "ran",
              "recorded", "score", "blocked_by", "failing_tests", "valid", "notes", "flags"]


def csv_cell(value) -> str:
    """A CSV cell a spreadsheet shows as text: a cell that starts with ``=``, ``+``, ``-``, ``@``, a tab or a
    carriage return gets a leading ``'`` (it would be read as a formula), and a cell is cut at ``MAX_CELL``
    characters (grades.json keeps everything)."""
    text = "" if value is None else one_line(str(value), 10**9)
    if len(text) > MAX_CELL:
        text = text[:MAX_CELL - 60] + f" ... (cut: {len(text) - MAX_CELL + 60} more characters in grades.json)"
    if text[:1] in ("=", "+", "-", "@", "\t", "\r"):
        text = "'" + text
    return text


def csv_text(report: dict) -> str:
    """One row per student and module (a row with an empty module for a submission that was not graded)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=CSV_FIELDS, lineterminator="\n")
    w.writeheader()

    def row(values: dict) -> None:
        w.writerow({k: csv_cell(v) for k, v in values.items()})

    for r in report["submissions"]:
        notes = "; ".join(_capped([*([r["error"]] if r["error"] else []), *r["problems"], *r["notes"]],
                                  MAX_DETAIL_LINES))
        flags = "; ".join(r.get("flags", []))
        if not r["modules"]:
            row({"student": r["name"], "name_in_manifest": r["student"], "status": r["status"], "notes": notes,
                 "flags": flags})
        for i, m in r["modules"].items():
            denominator = m["recorded"] if m.get("recorded") is not None else m["total"]
            scored = m["state"] not in NO_SCORE and r["status"] not in NO_SCORE
            row({
                "student": r["name"], "name_in_manifest": r["student"], "status": r["status"], "module": i,
                "state": m["state"], "passed": m["passed"] if scored else "", "failed": m["failed"] if scored else "",
                "skipped": m["skipped"] if scored else "", "ran": m["total"] if scored else "",
                "recorded": m.get("recorded"),
                "score": f"{m['passed'] / denominator:.3f}" if denominator and scored else "",
                "blocked_by": ";".join(f"{b}:{n}" for b, n in m["blocked"].items()),
                "failing_tests": ";".join(f["test"] for f in m["failures"]),
                "valid": "yes" if m.get("valid") and scored else "no",
                "notes": "; ".join([notes, *m.get("warnings", [])]).strip("; "),
                "flags": flags,
            })
    return buf.getvalue()


# -- answers -------------------------------------------------------------------------------------

def _notebook_builder(root: Path):
    script = root / "scripts" / "notebooks" / "build.py"
    spec = importlib.util.spec_from_file_location("g2c_notebook_build_teaching", script)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    return build


def questions_of(module, root: Path) -> list[dict]:
    """The written questions of a module's notebook, from the answer key: question, worked answer, rubric, and
    the clean notebook's cell id of the Answer cell."""
    build = _notebook_builder(root)
    src = build.read_source(build.source_path(module, root=root))
    out = []
    for index, cell in enumerate(src.cells):
        text = cell.source
        if cell.cell_type == "markdown" and text.lstrip("\n").startswith(build.ANSWER):
            answer, rubric = build.split_answer(text, f"{module.id}: cell {index + 1}")
            question = src.cells[index - 1].source.strip()
            out.append({"cell_id": f"cell-{index + 1:02d}", "question": question, "worked": answer, "rubric": rubric})
    return out


def student_answers(raw: bytes, questions: list[dict]) -> tuple[list[str | None], str | None]:
    """Each question's answer in a student's notebook (None: no Answer cell for it), and an error if unreadable.

    An Answer cell is matched by its cell id (the clean notebook's ids are fixed), else by its order."""
    try:
        cells = json.loads(raw.decode("utf-8"))["cells"]
        texts = [(c.get("id"), "".join(c["source"]) if isinstance(c["source"], list) else str(c["source"]))
                 for c in cells if c.get("cell_type") == "markdown"]
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
        return [None] * len(questions), f"unreadable notebook ({type(exc).__name__})"
    answers = [(cid, t) for cid, t in texts if t.lstrip().startswith("**Answer:**")]
    by_id = {cid: t for cid, t in answers if cid}
    out = []
    for k, q in enumerate(questions):
        text = by_id.get(q["cell_id"])
        if text is None and k < len(answers):
            text = answers[k][1]
        out.append(None if text is None else text.lstrip().removeprefix("**Answer:**").strip())
    return out, None


def answers_page(subs: list[Submission], root: Path) -> list[dict]:
    """Per notebook handed in (course order): its questions with rubric and worked answer, every student's answer."""
    pages = []
    for m in MODULES:
        rel = f"{WORK_DIR}/{Path(m.notebook).name}"
        handed = [s for s in subs if rel in s.files]
        if not handed:
            continue
        try:
            questions = questions_of(m, root)
        except Exception as exc:  # a broken answer key must not hide the answers
            pages.append({"module": m.id, "title": m.title, "error": f"answer key unreadable: {exc}",
                          "questions": [], "students": []})
            continue
        students = []
        for s in subs:
            if rel in s.files:
                answers, error = student_answers(s.files[rel], questions)
            else:
                answers, error = [None] * len(questions), "no notebook handed in"
            students.append({"name": s.name, "answers": answers, "error": error})
        pages.append({"module": m.id, "title": m.title, "notebook": rel, "questions": questions,
                      "students": students, "error": None})
    return pages


CSS = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.45}
.q{border-left:4px solid #4a6fa5;padding-left:1rem;margin:2rem 0}.pre{white-space:pre-wrap}
.rubric{background:#f3f6fa;padding:.5rem 1rem}.ans{border-top:1px solid #ddd;padding:.4rem 0}
.who{font-weight:600}.blank{color:#a33}table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px}"""


def answers_html(pages: list[dict]) -> str:
    """A self-contained HTML page (every student text escaped, shown as written)."""
    e = html.escape
    out = ["<!doctype html><html><head><meta charset='utf-8'><title>g2c: notebook answers</title>",
           f"<style>{CSS}</style></head><body><h1>Notebook answers</h1>"]
    if not pages:
        out.append("<p>No notebook working copy was handed in.</p>")
    for p in pages:
        out.append(f"<h2 id='m-{e(p['module'])}'>Module {e(p['module'])}: {e(p['title'])}</h2>")
        if p["error"]:
            out.append(f"<p class='blank'>{e(p['error'])}</p>")
            continue
        for k, q in enumerate(p["questions"]):
            out.append(f"<div class='q'><h3>Question {k + 1}</h3><div class='pre'>{e(q['question'])}</div>")
            out.append(f"<details open class='rubric'><summary>Rubric</summary><div class='pre'>{e(q['rubric'])}"
                       "</div></details>")
            out.append(f"<details class='rubric'><summary>Worked answer</summary><div class='pre'>{e(q['worked'])}"
                       "</div></details>")
            for s in p["students"]:
                a = s["answers"][k]
                body = (f"<span class='blank'>({e(s['error'])})</span>" if s["error"] else
                        "<span class='blank'>(no Answer cell)</span>" if a is None else
                        "<span class='blank'>(blank)</span>" if not a else f"<div class='pre'>{e(a)}</div>")
                out.append(f"<div class='ans'><span class='who'>{e(s['name'])}</span>{body}</div>")
            out.append("</div>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def answers_markdown(pages: list[dict]) -> str:
    """The same page in markdown; a student's text is quoted with its HTML escaped (a viewer never runs it)."""
    out = ["# Notebook answers", ""]
    if not pages:
        out.append("No notebook working copy was handed in.")
    for p in pages:
        out += [f"## Module {p['module']}: {p['title']}", ""]
        if p["error"]:
            out += [p["error"], ""]
            continue
        for k, q in enumerate(p["questions"]):
            out += [f"### Question {k + 1}", "", q["question"], "", "**Rubric:**", "", q["rubric"], "",
                    "<details><summary>Worked answer</summary>", "", q["worked"], "", "</details>", ""]
            for s in p["students"]:
                a = s["answers"][k]
                text = (f"*({md_escape(s['error'])})*" if s["error"] else "*(no Answer cell)*" if a is None else
                        "*(blank)*" if not a else md_fenced(a))
                out += [f"**{md_escape(s['name'])}**:", "", text, ""]
    return "\n".join(out) + "\n"


def md_escape(text: str) -> str:
    """``text`` (cleaned, on one line) as markdown that renders as itself: its HTML escaped and every markdown
    punctuation mark backslash-escaped, so a student's ``[x](javascript:...)`` or ``<img>`` is no link or tag."""
    flat = html.escape(one_line(text, 1000), quote=False)
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|~>])", r"\\\1", flat)


def md_fenced(text: str) -> str:
    """A student's answer as a fenced code block: shown as written, nothing in it a link, tag or heading. The
    fence is longer than any run of backticks in the text, so the text cannot close it."""
    body = clean_text(text).replace("\r", "\n").rstrip("\n")
    runs = [len(m) for m in re.findall(r"`+", body)]
    fence = "`" * max(3, max(runs, default=0) + 1)
    return "\n".join([fence + "text", body, fence])


# -- command line --------------------------------------------------------------------------------

def _submit_cmd(args) -> int:
    try:
        submit(Path.cwd(), name=args.name, out=args.out)
    except Refused as exc:
        print(f"submit: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


def _grade_class_cmd(args) -> int:
    if args.jobs < 1:
        print(f"grade-class: --jobs {args.jobs}: give how many submissions to grade at once, 1 or more",
              file=sys.stderr)
        return EXIT_USAGE
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        print(f"grade-class: --timeout {args.timeout:g}: give the seconds one module of a submission may take, a "
              "number above 0 (e.g. --timeout 600); without a bound a submission that hangs hangs the class",
              file=sys.stderr)
        return EXIT_USAGE
    if args.container and args.uncontained:
        print("grade-class: --container and --uncontained exclude each other: choose one", file=sys.stderr)
        return EXIT_USAGE
    root = find_root(Path.cwd())
    if root is None or root != REPO_ROOT.resolve():
        print(f"grade-class: run it in the teacher's g2c checkout ({REPO_ROOT}), whose tests grade", file=sys.stderr)
        return EXIT_USAGE
    def terminate(signum, frame):         # SIGTERM as Ctrl-C: the grading groups are killed on the way out
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, terminate)
    try:
        return grade_class(Path(args.folder), teacher_root=root, modules=args.modules, out=args.out,
                           timeout=args.timeout, jobs=args.jobs, container=args.container,
                           uncontained=args.uncontained)
    except Refused as exc:
        print(f"grade-class: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        stop_grading()
        print("grade-class: interrupted: the grading processes are stopped and no report is written; run it "
              "again to grade the class", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def add_submit_parser(sub) -> None:
    p = sub.add_parser("submit", help="hand in: one zip of your edited exercise files and notebooks (docs/teaching.md)",
                       description="Write one zip of exactly what you wrote: your edited exercise files, your notebook "
                                   "working copies, and a manifest (sha256 of each, the course commit). Nothing in "
                                   "your checkout changes. Exit codes: 0 written (warnings printed), 2 refused. "
                                   "See docs/teaching.md.")
    p.add_argument("--name", default=None, help="your name in the manifest and the file name (default: git's "
                                                "user.name, else your login)")
    p.add_argument("--out", type=Path, default=None, metavar="FILE.zip",
                   help=f"where to write the archive (default: {HAND_IN_DIR}/g2c-NAME.zip in the checkout)")
    p.set_defaults(func=_submit_cmd)


def add_grade_class_parser(sub) -> None:
    p = sub.add_parser("grade-class", help="grade a folder of submissions on this checkout's tests "
                                           "(exit 0 all graded, 1 some not, 2 usage)",
                       description="Grade every submission in DIR (zip archives from `submit`, unpacked archives, or "
                                   "clones) on this checkout's own tests, each in its own temporary copy; write "
                                   "grades.csv, grades.json, summary.txt, answers.html and answers.md. Exit codes: 0 "
                                   "every submission graded; 1 some submission not graded cleanly (unreadable or "
                                   "tampered archive, forged report, grader error, timeout); 2 usage error. Each "
                                   "submission's code runs contained: it can write only a private /tmp and $HOME, "
                                   "sees no other submission, has no network, leaves no process. See "
                                   "docs/teaching.md.")
    p.add_argument("folder", metavar="DIR", help="a folder of submission zips, unpacked submissions or clones")
    p.add_argument("--modules", default=None, metavar="SEL",
                   help="modules to grade, as G2C_APPLY_SOLUTIONS (e.g. 03,04 or 03-11; default: every module some "
                        "submission edited)")
    p.add_argument("--out", type=Path, default=None, metavar="DIR", help="report folder (default: DIR-grades)")
    p.add_argument("--timeout", type=float, default=None, metavar="S",
                   help="seconds one module of a submission may take before it is stopped; its other "
                        "modules are still graded (default 300)")
    p.add_argument("--jobs", type=int, default=1, metavar="N", help="submissions graded at once (default 1)")
    p.add_argument("--container", default=None, metavar="IMAGE",
                   help="grade each submission in a docker or podman container of IMAGE (its python3 must hold the "
                        "course's dependencies); default: Linux namespaces, or sandbox-exec on macOS")
    p.add_argument("--uncontained", action="store_true",
                   help="grade even where no containment works: the code runs as you and can change your files "
                        "and other grades (every report says so on its first line); only for code you trust")
    p.set_defaults(func=_grade_class_cmd)
