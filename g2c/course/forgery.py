"""A grade that the graded code cannot write for itself, and the cheap signs that make a teacher look.

The graded code runs in the same pytest process as the tests that grade it, so whatever that process
reports it could have forged: patched pytest so that every test passes, or written the results file
itself and exited. ``grade-class`` therefore does not take the report on trust:

- **Check tests.** Before each run it appends a few tests to the copy's own test files, new names each run
  (``test_grade_check_<hex>``), some that must pass and some that must fail (``make_checks``). They run in
  the same process, after the student's code is imported, and are reported like any test
  (``G2C_GRADE_CHECKS`` tells the grader their names so it reports them apart from the course's counts).
  A report in which they did not come out as they must (``verify``) is **forged**: a blanket "everything
  passed", a results file written ahead of time, or a grader killed before it wrote them.
- **The expected count.** The course records how many tests each file holds (``tests/pristine.json``, as
  the teacher has it); a report with fewer is no valid grade, one with more passes than that is forged.
- **Abnormal exits.** A grader that exits other than 0 (all pass) or 1 (some fail) has its scores blanked.

What remains possible: code written against this grader that reads the appended tests (they are in its
copy) and forges a report consistent with them. The flags below (``flags``) make that code visible: it has
to mention pytest's internals or the results file, and a hand-made report of a whole module comes back
far faster than the class median.

Tooling only.
"""

from __future__ import annotations

import re
import secrets
import statistics
from pathlib import Path

from .progress import CHECKS_ENV, CHECKS_MARKER  # the grader's variable; the line that starts a check block

__all__ = ["CHECKS_ENV", "CHECKS_MARKER", "FLAG_PATTERNS", "append_checks", "check_block", "flags", "make_checks",
           "slow_fast_flags", "verify"]

# What makes a teacher look at an exercise file: (pattern, what it means). Flagged only when neither the
# scaffold nor the answer key of that file has it.
FLAG_PATTERNS = (
    (r"_pytest|\bpytest\b|junit|conftest|pytest_\w+", "pytest internals"),
    (r"/proc\b", "/proc"),
    (r"\bsubprocess\b|\bos\.(system|popen|fork|execv\w*|spawn\w*|setsid)\b", "subprocess"),
    (r"site-packages|sitecustomize|usercustomize|\.pth\b|getsitepackages", "site-packages"),
    (r"\bsolutions\b", "solutions"),
    (r"\bos\._exit\b", "os._exit"),
)


def make_checks(files: list[str], *, n: int = 4) -> dict[str, list[tuple[str, bool]]]:
    """Per test file, ``n`` check tests ``(name, must pass)``: fresh random names, at least one of each kind."""
    out = {}
    for rel in files:
        kinds = [True, False] + [secrets.randbelow(2) == 1 for _ in range(max(0, n - 2))]
        order = sorted(range(len(kinds)), key=lambda _: secrets.randbelow(1 << 30))
        out[rel] = [(f"test_grade_check_{secrets.token_hex(5)}", kinds[i]) for i in order]
    return out


def check_block(checks: list[tuple[str, bool]]) -> str:
    """The source appended to a copy's test file: each test compares two products, equal or one apart."""
    lines = [f"{CHECKS_MARKER.decode().lstrip()}: appended to this copy for one grading run, never part of the "
             "course --", "", ""]
    for name, must_pass in checks:
        a, b = 3 + secrets.randbelow(97), 3 + secrets.randbelow(97)
        lines += [f"def {name}():", f"    assert {a} * {b} == {a * b + (0 if must_pass else 1)}", "", ""]
    return "\n".join(lines)


def append_checks(copy: Path, checks: dict[str, list[tuple[str, bool]]]) -> None:
    """Append each file's check block to its copy (the copy is the submission's overlay, before it runs)."""
    for rel, items in checks.items():
        path = copy / rel
        if path.is_file():
            path.write_bytes(path.read_bytes() + b"\n" + check_block(items).encode("utf-8"))


def verify(module: dict, checks: dict[str, list[tuple[str, bool]]], recorded: int | None) -> tuple[list[str],
                                                                                                    list[str]]:
    """Check one module's reported result against its check tests and the recorded count.

    Returns ``(forged, invalid)``: why the report cannot have come from the course's tests run honestly, and why
    it is no valid grade. A test file that could not be collected (its code crashed at import) legitimately
    runs no check test; a skipped check test is accepted (skipping earns nothing)."""
    forged, invalid = [], []
    reported = module.get("checks")
    if not isinstance(reported, dict):
        reported = {}
    failures = [f.get("test", "") for f in module.get("failures", []) if isinstance(f, dict)]
    missing, wrong, total = 0, [], 0
    for rel, items in checks.items():
        if any(t.startswith(f"{rel} (collection error") for t in failures):
            continue
        for name, must_pass in items:
            total += 1
            got = reported.get(f"{rel}::{name}")
            want = "passed" if must_pass else "failed"
            if got is None:
                missing += 1
            elif got not in (want, "skipped"):
                wrong.append(f"{rel}::{name} {got}, where it must have {want}")
    if missing:
        forged.append(f"{missing} of its {total} check tests are missing from the report")
    if wrong:
        forged.append(f"{len(wrong)} check test{'s' if len(wrong) > 1 else ''} came out wrong ({wrong[0]}"
                      + (f"; and {len(wrong) - 1} more" if len(wrong) > 1 else "") + ")")
    counts = [module.get(k) for k in ("passed", "failed", "skipped")]
    if not all(isinstance(c, int) and c >= 0 for c in counts):
        forged.append("the report's counts are not whole numbers")
    elif recorded is not None:
        ran = sum(counts)
        crashed = any(" (collection error" in t for t in failures)
        if counts[0] > recorded:
            forged.append(f"{counts[0]} tests passed where the course records {recorded}")
        elif ran < recorded and not crashed:
            invalid.append(f"{ran} tests ran where the course records {recorded}")
    return forged, invalid


def _mentions(text: str) -> dict[str, int]:
    """What of ``FLAG_PATTERNS`` a text mentions: label -> first line number."""
    out = {}
    for pattern, label in FLAG_PATTERNS:
        m = re.search(pattern, text)
        if m and label not in out:
            out[label] = text.count("\n", 0, m.start()) + 1
    return out


def flags(files: dict[str, bytes], teacher_root: Path, fresh: dict[str, str]) -> list[str]:
    """Cheap signs in a submission's exercise files that make a teacher look: a file byte-identical to the answer
    key, or one that mentions pytest internals, ``/proc``, ``subprocess``, ``site-packages``, ``solutions`` or
    ``os._exit`` where its scaffold and answer key do not. ``fresh``: repo-relative path -> scaffold text."""
    out = []
    for rel, data in sorted(files.items()):
        if rel not in fresh:
            continue                                   # a notebook
        key = teacher_root / "solutions" / rel
        try:
            answer = key.read_bytes()
        except OSError:
            answer = b""
        if answer and data == answer:
            out.append(f"{rel} is byte-identical to the answer key")
            continue
        text = data.decode("utf-8", errors="replace")
        known = {**_mentions(answer.decode("utf-8", errors="replace")), **_mentions(fresh[rel])}
        for label, line in _mentions(text).items():
            if label not in known:
                out.append(f"{rel} mentions {label} (line {line}), which its scaffold and the answer key do not")
    return out


def slow_fast_flags(records: list[dict], *, ratio: float = 0.25, floor_s: float = 2.0) -> None:
    """Flag (in each record's ``flags``) a module graded far faster than the class median for it: less than
    ``ratio`` of the median, when the median is over ``floor_s`` seconds and at least three submissions have
    it. A report made by hand comes back at once."""
    by_module: dict[str, list[tuple[dict, float]]] = {}
    for r in records:
        for mid, m in r.get("modules", {}).items():
            s = m.get("seconds")
            if isinstance(s, (int, float)) and m.get("state") not in ("error", "timeout", "forged", "crashed"):
                by_module.setdefault(mid, []).append((r, float(s)))
    for mid, rows in by_module.items():
        if len(rows) < 3:
            continue
        median = statistics.median(s for _, s in rows)
        if median < floor_s:
            continue
        for r, s in rows:
            if s < ratio * median and mid in r.get("worked", []):
                r.setdefault("flags", []).append(f"module {mid} was graded in {s:.1f} s, the class median is "
                                                 f"{median:.1f} s")
