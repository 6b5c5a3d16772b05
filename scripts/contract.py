#!/usr/bin/env python3
"""The scaffold contract: how many tests of each file pass on the untouched scaffolds.

Every test file has a recorded *pristine result* in ``tests/pristine.json``: the number of
tests that pass and fail on the untouched scaffold of the module that owns the file, with the
answer key applied to exactly that module's prerequisites (the closure of its ``requires``):
what a student entering at that module sees from ``./test.sh ID`` before writing a line. Test
files no module owns (tooling) run with no answer key at all. A test that passes there must be
testing provided code, by design; if that number changes, either a scaffold leaks part of an
answer, a test lost its teeth, or a test needs a module its owner does not declare.

    python scripts/contract.py --record   # run the suite once on the scaffolds, write tests/pristine.json
    python scripts/contract.py --check    # run it again and compare; exit 1 on any mismatch
    python scripts/contract.py --record tests/test_kvcache.py   # (re)record just these files
    python scripts/contract.py --graph    # the module graph holds: each module's tests with exactly its
                                          # prerequisites solved keep the pristine counts; solved too, all pass
    python scripts/contract.py --record-hashes  # rewrite only tests/pristine.sha256 (no test run)

Beside the counts, ``tests/pristine.sha256`` records the sha256 of every recorded test file and of
the shared helpers (``tests/conftest.py``, ``tests/*_mocks.py``), in ``sha256sum`` format
(``sha256sum -c tests/pristine.sha256`` at the repository root checks it). ``--record`` rewrites the
hashes of the files it records; ``--check`` fails when a file differs from its recorded hash.
``./test.sh ID`` warns that a result is no valid grade when a module's test files differ from these
hashes (``g2c/course/progress.py``), and class grading always runs the teacher's own tests.

Both run ``tests/`` in one pytest process per module (its files, its prerequisites solved) plus
one for the unowned files (nothing solved). Errors (collection or fixture errors) count as
failures. A skipped test is a contract violation (the pristine run must exercise everything).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRISTINE = ROOT / "tests" / "pristine.json"
HASHES = ROOT / "tests" / "pristine.sha256"
RECORD = "python scripts/contract.py --record"


def helper_files(root: Path = ROOT) -> list[str]:
    """The shared test helpers every module's run loads: ``tests/*.py`` that are not ``test_*.py``."""
    return sorted(p.relative_to(root).as_posix() for p in (root / "tests").glob("*.py")
                  if not p.name.startswith("test_"))


def file_hash(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_hashes(path: Path = HASHES) -> dict[str, str]:
    """Repo-relative path -> sha256 from a ``sha256sum``-format file ({} when missing)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        digest, _, rel = line.strip().partition("  ")
        if len(digest) == 64 and rel:
            out[rel] = digest
    return out


def write_hashes(files: list[str], root: Path = ROOT, path: Path = HASHES) -> dict[str, str]:
    """(Re)record the sha256 of ``files`` and of the shared helpers; other recorded hashes are kept unless the file
    is gone."""
    hashes = {rel: h for rel, h in read_hashes(path).items() if (root / rel).is_file()}
    for rel in [*files, *helper_files(root)]:
        if (root / rel).is_file():
            hashes[rel] = file_hash(root / rel)
    path.write_text("".join(f"{h}  {rel}\n" for rel, h in sorted(hashes.items())), encoding="utf-8")
    return hashes


def hash_problems(files: list[str], root: Path = ROOT, path: Path = HASHES) -> list[str]:
    """One line per recorded test file or helper whose content differs from its recorded sha256 (or has none)."""
    hashes = read_hashes(path)
    problems = []
    for rel in [*files, *helper_files(root)]:
        if not (root / rel).is_file():
            continue
        if rel not in hashes:
            problems.append(f"{rel}: no recorded sha256 in {path.relative_to(root).as_posix()}; run `{RECORD} {rel}`")
        elif file_hash(root / rel) != hashes[rel]:
            problems.append(f"{rel}: the file changed since its contract was recorded (sha256 differs); check its "
                            f"counts and run `{RECORD} {rel}` (students see a 'not a valid grade' warning until then)")
    return problems


def test_files(root: Path = ROOT) -> list[str]:
    """Every test file under ``tests/``, repo-relative, sorted."""
    return sorted(p.relative_to(root).as_posix() for p in (root / "tests").rglob("test_*.py"))


def pristine_env(root: Path = ROOT) -> dict[str, str]:
    """The environment of a pristine run: no solutions, quiet, artifacts required once shipped."""
    env = dict(os.environ)
    env.pop("G2C_APPLY_SOLUTIONS", None)
    env["G2C_QUIET"] = "1"
    if (root / "artifacts" / ".require").exists():
        env["G2C_REQUIRE_ARTIFACTS"] = "1"
    return env


# every failing test seen in this process: file -> "name: first line of the message", printed for a file whose
# counts break the contract (a CI log then says which tests moved, not only how many)
FAILURES: dict[str, list[str]] = defaultdict(list)


def parse_junit(xml_text: str) -> tuple[dict[str, Counter], list[str]]:
    """Per-file outcome counts (``passed``/``failed``/``skipped``) and a line per skipped test; each failing
    test is also noted in ``FAILURES``."""
    counts: dict[str, Counter] = defaultdict(Counter)
    skips: list[str] = []
    for case in ET.fromstring(xml_text).iter("testcase"):
        file = case.get("file") or ""
        if not file:  # fall back to the dotted module in classname/name
            dotted = case.get("classname") or case.get("name") or "?"
            file = dotted.replace(".", "/") + ".py"
        if (bad := case.find("failure")) is not None or (bad := case.find("error")) is not None:
            counts[file]["failed"] += 1
            message = (bad.get("message") or bad.text or "").strip().splitlines()
            FAILURES[file].append(f"{case.get('name')}: {message[0][:300] if message else '(no message)'}")
        elif (skipped := case.find("skipped")) is not None:
            counts[file]["skipped"] += 1
            skips.append(f"{file}::{case.get('name')}: {skipped.get('message', '')}")
        else:
            counts[file]["passed"] += 1
    return counts, skips


def groups(files: list[str], root: Path = ROOT) -> list[tuple[str, list[str]]]:
    """``files`` grouped by the answer key their pristine run applies: (selector, files) pairs, one per owning
    module (its prerequisites' selector), then the files no module owns ("")."""
    sys.path.insert(0, str(root))
    from g2c.course import MODULES, prerequisites, selector_for

    out, claimed = [], set()
    for m in MODULES:
        mine = [f for f in files if f in m.tests]
        claimed.update(mine)
        if mine:
            out.append((selector_for(prerequisites(m.id)), mine))
    rest = [f for f in files if f not in claimed]
    if rest:
        out.append(("", rest))
    return out


def run_pristine(root: Path = ROOT, paths: list[str] | None = None,
                 jobs: int = 1) -> tuple[dict[str, Counter], list[str], int]:
    """The pristine run of ``tests/`` (or just ``paths``): each module's files with exactly its prerequisites
    solved, the unowned files with nothing solved; per-file counts, skip lines, the worst exit code.

    ``jobs`` > 1 runs that many pytest processes at once, and the unowned files (the tooling tests, the
    largest group) one process per file so that they spread over the processes; the counts are the same."""
    todo = groups(paths or test_files(root), root)
    if jobs > 1:
        todo = [(sel, [f]) for sel, files in todo if not sel for f in files] + [g for g in todo if g[0]]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda group: run_tests(root, group[1], group[0]), todo))
    counts: dict[str, Counter] = defaultdict(Counter)
    skips: list[str] = []
    worst = 0
    for c, s, rc in results:
        for f, n in c.items():
            counts[f].update(n)
        skips += s
        worst = max(worst, rc)
    return counts, skips, worst


def run_tests(root: Path = ROOT, paths: list[str] | None = None,
              selector: str = "") -> tuple[dict[str, Counter], list[str], int]:
    """Run ``tests/`` (or just ``paths``) once on the scaffolds, with the answer key applied to the modules
    of ``selector`` (none by default); return per-file counts, skip lines, pytest's exit code."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "pristine.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               "--continue-on-collection-errors", f"--junitxml={xml}", "-o", "junit_family=xunit1",
               *(paths or ["tests"])]
        env = pristine_env(root)
        if selector:
            env["G2C_APPLY_SOLUTIONS"] = selector
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if not xml.exists():
            sys.stdout.write(proc.stdout)
            sys.stderr.write(proc.stderr)
            raise SystemExit(f"contract: pytest wrote no report (exit code {proc.returncode})")
        counts, skips = parse_junit(xml.read_text(encoding="utf-8"))
    return counts, skips, proc.returncode


def counts_only(rec: dict | None) -> dict[str, int] | None:
    """The pass/fail counts of a record entry (None stays None)."""
    return None if rec is None else {"passed": rec.get("passed", 0), "failed": rec.get("failed", 0)}


def as_record(counts: dict[str, Counter], files: list[str]) -> dict[str, dict[str, int]]:
    return {f: {"passed": counts[f]["passed"], "failed": counts[f]["failed"]}
            for f in sorted(set(files) | set(counts))}


def compare(expected: dict[str, dict[str, int]], got: dict[str, dict[str, int]],
            files: list[str]) -> list[str]:
    """Human-readable mismatches between the recorded and the observed pristine counts."""
    problems = []
    for f in sorted(set(expected) | set(got) | set(files)):
        if f not in expected:
            problems.append(f"{f}: no recorded pristine result (got {_fmt(got.get(f))} pass/fail); "
                            f"run `{RECORD}`")
        elif f not in got and f not in files:
            problems.append(f"{f}: recorded {_fmt(expected[f])} but the file is gone; run `{RECORD}`")
        elif counts_only(expected[f]) != got.get(f, {"passed": 0, "failed": 0}):
            problems.append(f"{f}: expected {_fmt(expected[f])} pass/fail, "
                            f"got {_fmt(got.get(f, {'passed': 0, 'failed': 0}))}")
    return problems


def graph_problems(module_id: str, root: Path = ROOT, *, pristine: bool = True) -> list[str]:
    """Check one module against the registry's graph by running its tests twice.

    1. With exactly its prerequisites (the closure of ``requires``) solved, every test file keeps its
       pristine pass/fail counts: the tests need nothing outside the closure, and the module's own
       unwritten exercises are what fails. (``pristine=False`` skips this run: ``--check`` makes exactly
       the same run for every module's files, and ``./test.sh`` runs both.)
    2. With the module solved too, every test passes.
    """
    sys.path.insert(0, str(root))
    from g2c.course import get_module, prerequisites, selector_for

    m = get_module(module_id)
    files = [t for t in m.tests if (root / t).is_file()]
    if not files:
        return [f"module {m.id}: no test files"]
    expected = {f: counts_only(r) for f, r in json.loads(PRISTINE.read_text(encoding="utf-8")).items()} \
        if PRISTINE.exists() else {}
    closure = prerequisites(m.id)
    problems = []
    counts, skips, _ = run_tests(root, files, selector_for(closure)) if pristine else (defaultdict(Counter), [], 0)
    got = as_record(counts, files)
    for f in files if pristine else ():
        if got.get(f) != expected.get(f):
            problems.append(f"module {m.id}: {f} with its prerequisites solved ({', '.join(closure) or 'none'}) "
                            f"gives {_fmt(got.get(f))} pass/fail, its pristine contract is {_fmt(expected.get(f))}")
    counts, skips, _ = run_tests(root, files, selector_for([*closure, m.id]))
    for f in files:
        if counts[f]["failed"] or counts[f]["skipped"]:
            problems.append(f"module {m.id}: {f} with the module and its prerequisites solved has "
                            f"{counts[f]['failed']} failing and {counts[f]['skipped']} skipped tests; "
                            "a prerequisite is missing from `requires` in g2c/course/registry.py")
    return problems


def _jobs(text: str) -> int:
    sys.path.insert(0, str(ROOT))
    from g2c.assets.cli import count

    return count(1)(text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", action="store_true", help=f"write {PRISTINE.relative_to(ROOT)}")
    mode.add_argument("--check", action="store_true", help="compare with the recorded counts")
    mode.add_argument("--record-hashes", action="store_true",
                      help="rewrite only tests/pristine.sha256 for the recorded files (no test run); use it when "
                           "--check holds the counts and only the hashes are stale")
    mode.add_argument("--graph", nargs="*", metavar="ID",
                      help="check the module graph (default: every module): closure solved -> pristine counts, "
                           "module solved too -> every test passes")
    ap.add_argument("--jobs", "-j", type=_jobs, default=1, metavar="N",
                    help="run up to N pytest processes at once (./test.sh: one per core); same results")
    ap.add_argument("--solved-only", action="store_true",
                    help="with --graph: only the second run (module solved too -> every test passes); the first, "
                         "closure solved -> pristine counts, is the same run --check makes")
    ap.add_argument("files", nargs="*", help="only these test files (repo-relative); the others keep their record")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be >= 1, got {args.jobs}")
    sys.path.insert(0, str(ROOT))
    from g2c.course.progress import share_cores

    share_cores(args.jobs)   # pytest processes side by side: each gets its share of the cores as torch threads
    if args.record_hashes:  # no test run: the hashes of the files whose counts are recorded, and the helpers
        recorded = json.loads(PRISTINE.read_text(encoding="utf-8")) if PRISTINE.exists() else {}
        hashes = write_hashes([f for f in [Path(f).as_posix() for f in args.files] or test_files() if f in recorded])
        print(f"contract: recorded the sha256 of {len(hashes)} files in {HASHES.relative_to(ROOT)}")
        return 0
    if args.graph is not None:
        from g2c.course import module_ids

        problems = []
        ids = args.graph or module_ids()
        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            found_all = pool.map(lambda i: graph_problems(i, pristine=not args.solved_only), ids)
            for module_id, found in zip(ids, found_all):     # in module order, each as soon as it is known
                print(f"graph: module {module_id}: {'ok' if not found else f'{len(found)} problem(s)'}", flush=True)
                for p in found:
                    print(f"  {p}", flush=True)
                problems += found
        if problems:
            print(f"module graph: {len(problems)} problem(s) above", file=sys.stderr)
        return 1 if problems else 0

    files = [Path(f).as_posix() for f in args.files] or test_files()
    counts, skips, _ = run_pristine(paths=args.files or None, jobs=args.jobs)
    got = as_record(counts, files)
    if args.record:
        if skips:
            _report_skips(skips)
            return 1
        if args.files and PRISTINE.exists():
            got = {**json.loads(PRISTINE.read_text(encoding="utf-8")), **got}
        PRISTINE.write_text(json.dumps(got, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        write_hashes(files)
        print(f"contract: recorded {len(got)} test files in {PRISTINE.relative_to(ROOT)} and their sha256 in "
              f"{HASHES.relative_to(ROOT)}")
        return 0

    expected = json.loads(PRISTINE.read_text(encoding="utf-8")) if PRISTINE.exists() else {}
    if args.files:
        expected = {f: rec for f, rec in expected.items() if f in files}
    width = max((len(f) for f in got), default=10)
    print(f"{'test file':<{width}}  recorded pass/fail   now pass/fail")
    for f, now in got.items():
        print(f"{f:<{width}}  {_fmt(expected.get(f)):>18}   {_fmt(now):>13}")
    problems = compare(expected, got, files) + hash_problems([f for f in files if f in got])
    if skips:
        _report_skips(skips)
    if problems:
        print("scaffold contract violated:", file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
            for line in FAILURES.get(p.split(":", 1)[0], [])[:12]:
                print(f"      failing: {line}", file=sys.stderr)
        print(f"if the change is intended, run `{RECORD}` and commit tests/pristine.json and tests/pristine.sha256",
              file=sys.stderr)
    if problems or skips:
        return 1
    print(f"scaffold contract: {len(got)} test files match tests/pristine.json")
    return 0


def _fmt(rec: dict[str, int] | None) -> str:
    return f"{rec['passed']}/{rec['failed']}" if rec else "-"


def _report_skips(skips: list[str]) -> None:
    print(f"contract: {len(skips)} test(s) skipped in the pristine run; every test must run:",
          file=sys.stderr)
    for line in skips:
        print(f"  {line}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
