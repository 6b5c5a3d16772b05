"""Grade a student's own code, module by module, like a grader would.

One pytest run (with a junit report) per graded module over its test files (the registry's
``tests`` field). The student's code is graded as it is: the answer key is applied to exactly
the module's prerequisites (the closure of ``requires``) that the student has not edited, and
never to the graded module or to another module the student edited (unless they opt in with
``--solve ID``). Failures raised by an unwritten exercise of a prerequisite are counted apart
and named.

    python -m g2c.course progress      # every module: tests passed / total on your code
    ./test.sh --progress               # the same
    ./test.sh                          # with exercise files edited: grades the modules you worked on
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from .registry import MODULES, REPO_ROOT, SOLUTIONS_ENV, get_module, grading_selection, module_ids, selector_for

__all__ = ["ModuleResult", "format_table", "grade", "parse_junit", "untouched_result"]


@dataclass(frozen=True)
class ModuleResult:
    """Outcome counts of one module's test files.

    ``blocked`` maps a prerequisite id to the number of failing tests whose error is that
    prerequisite's ``NotImplementedError`` (an exercise there is unwritten): those failures are
    not the graded module's. ``applied`` is the answer key the run used.
    """

    id: str
    title: str
    passed: int
    failed: int
    skipped: int
    untouched: int | None  # tests that pass on the untouched scaffold (tests/pristine.json)
    blocked: tuple[tuple[str, int], ...] = ()
    applied: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped

    @property
    def own_failures(self) -> int:
        """Failing tests that are not explained by an unwritten prerequisite."""
        return self.failed - sum(n for _, n in self.blocked)


UNWRITTEN = re.compile(r"module ([0-9a-z][0-9a-z-]*):\s+\S+\s+in\s+\S+\s+is\s+not\s+implemented\s+yet")


def parse_junit(xml_text: str) -> dict[str, Counter]:
    """Per test file (repo-relative) counts of ``passed`` / ``failed`` / ``skipped``, and of
    ``unwritten:<id>`` for failures raised by module <id>'s unwritten exercise."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for case in ET.fromstring(xml_text).iter("testcase"):
        file = case.get("file") or (case.get("classname") or "?").replace(".", "/") + ".py"
        bad = case.find("failure")
        if bad is None:
            bad = case.find("error")
        if bad is not None:
            counts[file]["failed"] += 1
            m = UNWRITTEN.search(f"{bad.get('message', '')}\n{bad.text or ''}")
            if m:
                counts[file][f"unwritten:{m.group(1)}"] += 1
        elif case.find("skipped") is not None:
            counts[file]["skipped"] += 1
        else:
            counts[file]["passed"] += 1
    return counts


def _untouched(module, root: Path) -> int | None:
    try:
        pristine = json.loads((root / "tests" / "pristine.json").read_text(encoding="utf-8"))
        return sum(pristine[t]["passed"] for t in module.tests)
    except (OSError, ValueError, KeyError):
        return None


def _pytest(files: list[str], selection: list[str], root: Path, python: str, echo: bool) -> dict[str, Counter]:
    """One pytest run over ``files`` with the answer key applied to exactly ``selection``."""
    env = dict(os.environ)
    env.pop(SOLUTIONS_ENV, None)
    if selection:
        env[SOLUTIONS_ENV] = selector_for(selection)
    env["G2C_QUIET"] = "1"
    # The grader chose the selection itself: edited modules are in it only through an explicit --solve.
    env["G2C_REPLACE_EDITED"] = "1"
    with tempfile.TemporaryDirectory(prefix="g2c-grade-") as tmp:
        xml = Path(tmp) / "report.xml"
        cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
               f"--junitxml={xml}", "-o", "junit_family=xunit1", *files]
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if not xml.exists():
            raise RuntimeError(f"pytest wrote no report (exit code {proc.returncode}):\n"
                               f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        if echo:
            tail = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
            for line in tail[:40]:
                print(f"  {line}")
            if len(tail) > 40:
                print(f"  ... and {len(tail) - 40} more")
        return parse_junit(xml.read_text(encoding="utf-8"))


def grade(ids: list[str], *, worked: list[str] | None = None, solve: list[str] = (), root: Path = REPO_ROOT,
          python: str = sys.executable, echo: bool = False) -> list[ModuleResult]:
    """Grade modules ``ids`` on the student's code, one pytest run per module.

    Each module runs with the answer key applied to exactly its prerequisites that the student
    has not edited (``grading_selection``), plus ``solve``: prerequisites the student edited
    but asks to have solved for this run (an explicit opt-in). The graded module itself always
    runs the student's code.

    Raises:
        ValueError: an unknown id, or ``solve`` names a graded module.
        RuntimeError: pytest wrote no report (collection crashed); the message holds its output.
    """
    from .scaffolds import worked_modules

    worked = worked_modules(root) if worked is None else worked
    modules = [get_module(i) for i in ids]
    solve = [get_module(i).id for i in solve]
    results = []
    for m in modules:
        if m.id in solve:
            raise ValueError(f"--solve {m.id} would grade the answer key instead of your module {m.id}")
        selection = [i for i in module_ids() if i in set(grading_selection(m.id, worked)) | set(solve)]
        files = [t for t in m.tests if (root / t).is_file()]
        counts = _pytest(files, selection, root, python, echo) if files else {}
        c = Counter()
        for t in m.tests:
            c.update(counts.get(t, Counter()))
        blocked = tuple((i, c[f"unwritten:{i}"]) for i in module_ids() if i != m.id and c[f"unwritten:{i}"])
        results.append(ModuleResult(m.id, m.title, c["passed"], c["failed"], c["skipped"], _untouched(m, root),
                                    blocked, tuple(selection)))
    return results


def untouched_result(module_id: str, root: Path = REPO_ROOT) -> ModuleResult:
    """A module the student has not started: its recorded pristine counts (its tests on the untouched
    scaffold with its prerequisites solved; a tooling test keeps that true), without running them."""
    m = get_module(module_id)
    try:
        pristine = json.loads((root / "tests" / "pristine.json").read_text(encoding="utf-8"))
        passed = sum(pristine[t]["passed"] for t in m.tests)
        failed = sum(pristine[t]["failed"] for t in m.tests)
    except (OSError, ValueError, KeyError):
        passed = failed = 0
    return ModuleResult(m.id, m.title, passed, failed, 0, passed)


def format_table(results: list[ModuleResult], worked: list[str] = ()) -> str:
    """A module x tests table: passed / total on the student's code, failures split by owner, a state."""
    rows = [("id", "module", "needs", "passed/total", "untouched", "yours failing", "blocked by", "state")]
    for r in results:
        if r.total == 0:
            state = "no tests"
        elif r.failed == 0 and r.skipped == 0:
            state = "done"
        elif r.id in worked or (r.untouched is not None and r.passed > r.untouched):
            state = "in progress"
        else:
            state = "not started"
        title = r.title if len(r.title) <= 48 else r.title[:47] + "…"
        needs = ",".join(get_module(r.id).requires) or "-"
        blocked = ", ".join(f"{i} ({n})" for i, n in r.blocked) or "-"
        rows.append((r.id + ("*" if r.id in worked else ""), title, needs, f"{r.passed}/{r.total}",
                     "-" if r.untouched is None else str(r.untouched),
                     str(r.own_failures) if r.id in worked else "-", blocked, state))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i in (0, 1, 2, 6, 7) else cell.rjust(w) for i, (cell, w) in
                       enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def legend(worked: list[str]) -> str:
    text = ("passed/total: tests of the module passing on your code, with the answer key applied only to the "
            "modules it needs (the 'needs' column, transitively) that you have not edited; untouched: how many "
            "pass on the untouched scaffold (tests of provided code); blocked by: failures caused by an "
            "unwritten exercise of a module you edited.")
    if worked:
        text += " * = you edited its exercise files."
    return text


def modules_with_tests() -> list[str]:
    return [m.id for m in MODULES if m.tests]
