"""Grade a student's own code, module by module, like a grader would.

One pytest run (with a junit report) over the test files of the chosen modules; each test
file belongs to one module through the registry's ``tests`` field. The student's code is
graded as it is: ``G2C_APPLY_SOLUTIONS`` never selects a graded module (``progress`` drops
it entirely; ``grade`` keeps an exported selector for the *other* modules, the prerequisites).

    python -m g2c.course progress      # every module: tests passed / total on your code
    ./test.sh --progress               # the same
    ./test.sh                          # with exercise files edited: grades the modules you worked on
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from .registry import MODULES, REPO_ROOT, SOLUTIONS_ENV, get_module, parse_selection, prerequisites_selector

__all__ = ["ModuleResult", "format_table", "parse_junit", "run_tests"]


@dataclass(frozen=True)
class ModuleResult:
    """Outcome counts of one module's test files."""

    id: str
    title: str
    passed: int
    failed: int
    skipped: int
    untouched: int | None  # tests that pass on the untouched scaffold (tests/pristine.json)

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped


def parse_junit(xml_text: str) -> dict[str, Counter]:
    """Per test file (repo-relative) counts of ``passed`` / ``failed`` / ``skipped``."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for case in ET.fromstring(xml_text).iter("testcase"):
        file = case.get("file") or (case.get("classname") or "?").replace(".", "/") + ".py"
        if case.find("failure") is not None or case.find("error") is not None:
            counts[file]["failed"] += 1
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


def run_tests(ids: list[str], *, keep_selector: bool = False, root: Path = REPO_ROOT,
              python: str = sys.executable, echo: bool = False) -> tuple[list[ModuleResult], list[str]]:
    """Run the test files of modules ``ids`` once on the student's code.

    Args:
        ids: module ids to grade (course order is kept).
        keep_selector: keep an exported ``G2C_APPLY_SOLUTIONS`` for modules outside ``ids``
            (the prerequisites); otherwise no solution is applied at all.
        echo: print pytest's own short summary.

    Returns:
        (one result per module, the selector applied to the other modules or []).

    Raises:
        ValueError: an unknown id, or a malformed exported selector.
        RuntimeError: pytest wrote no report (collection crashed); the message holds its output.
    """
    modules = [get_module(i) for i in ids]
    env = dict(os.environ)
    applied: list[str] = []
    if keep_selector:
        applied = [i for i in parse_selection(env.get(SOLUTIONS_ENV, "")) if i not in ids]
    env.pop(SOLUTIONS_ENV, None)
    if applied:
        env[SOLUTIONS_ENV] = ",".join(applied)
    env["G2C_QUIET"] = "1"
    files = [t for m in modules for t in m.tests if (root / t).is_file()]
    counts: dict[str, Counter] = {}
    if files:
        with tempfile.TemporaryDirectory(prefix="g2c-progress-") as tmp:
            xml = Path(tmp) / "report.xml"
            cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
                   f"--junitxml={xml}", "-o", "junit_family=xunit1", *files]
            proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
            if not xml.exists():
                raise RuntimeError(f"pytest wrote no report (exit code {proc.returncode}):\n"
                                   f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
            counts = parse_junit(xml.read_text(encoding="utf-8"))
            if echo:
                tail = [line for line in proc.stdout.splitlines() if line.startswith(("FAILED", "ERROR"))]
                for line in tail[:40]:
                    print(f"  {line}")
                if len(tail) > 40:
                    print(f"  ... and {len(tail) - 40} more")
    results = []
    for m in modules:
        c = Counter()
        for t in m.tests:
            c.update(counts.get(t, Counter()))
        results.append(ModuleResult(m.id, m.title, c["passed"], c["failed"], c["skipped"], _untouched(m, root)))
    return results, applied


def format_table(results: list[ModuleResult], worked: list[str] = ()) -> str:
    """A module x tests table: passed / total on the student's code, and a one-word state."""
    rows = [("id", "module", "passed/total", "untouched", "state")]
    for r in results:
        if r.total == 0:
            state = "no tests"
        elif r.failed == 0 and r.skipped == 0:
            state = "done"
        elif r.id in worked or (r.untouched is not None and r.passed > r.untouched):
            state = "in progress"
        else:
            state = "not started"
        title = r.title if len(r.title) <= 60 else r.title[:59] + "…"
        rows.append((r.id + ("*" if r.id in worked else ""), title, f"{r.passed}/{r.total}",
                     "-" if r.untouched is None else str(r.untouched), state))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i in (0, 1, 4) else cell.rjust(w) for i, (cell, w) in
                       enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def legend(worked: list[str]) -> str:
    text = ("passed/total: tests of the module passing on your code (no reference solutions applied); "
            "untouched: how many pass on the untouched scaffold (tests of provided code).")
    if worked:
        text += " * = you edited its exercise files."
    return text


def selector_line(module_id: str) -> str:
    sel = prerequisites_selector(module_id)
    if not sel:
        return f"module {module_id} builds on no other module"
    return (f"{SOLUTIONS_ENV}={sel} applies the reference solutions of the modules before {module_id} "
            "and keeps your own code")


def modules_with_tests() -> list[str]:
    return [m.id for m in MODULES if m.tests]
