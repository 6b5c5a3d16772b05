"""A grade that the graded code cannot write for itself, and the cheap signs that make a teacher look.

The graded code runs in the same pytest process as the tests that grade it, so whatever that process reports it
could have forged. ``grade-class`` therefore takes the grade from no file and no channel that process can write
undetected (``grader.py``, ``gradeplugin.py``; docs/teaching.md, "What a grade proves"):

- **Check tests** (``make_checks``). Per run and test file a few tests with fresh random names, ``assert a * b ==
  c``, some made to pass and some to fail, handed to the pytest run over a pipe its plugin reads and closes
  before any submission code is imported (in no file, environment variable or command line), and placed among
  the file's own tests. A report in which they did not come out as they must (``verify``) is **forged**: a
  blanket "everything passed", a no-op ``runtest``, outcomes written ahead of time, or a run killed before them.
- **The stream.** Every outcome goes to the grader as it happens; a line twice or after the end, or a junit file
  that disagrees with the stream, is forged (``progress.fold_stream``).
- **The expected count.** The course records how many tests each file holds (``tests/pristine.json``, as
  the teacher has it); a report with fewer is no valid grade, one with more passes than that is forged.
- **Abnormal ends.** A grader that exits other than 0, or whose results stop before their end, has its scores
  blanked.

What remains possible: code written against this grader that finds the check tests in its own process's memory
and forges outcomes consistent with them. The flags below (``flags``) make that code visible: it has to mention
pytest's internals, and a module whose tests did not run comes back far faster than the class median.

Tooling only.
"""

from __future__ import annotations

import re
import secrets
import statistics
from pathlib import Path

__all__ = ["FLAG_PATTERNS", "flags", "make_checks", "must_pass", "slow_fast_flags", "verify"]

# What makes a teacher look at an exercise file: (pattern, what it means). Flagged only when neither the
# scaffold nor the answer key of that file has it.
FLAG_PATTERNS = (
    (r"_pytest|\bpytest\b|junit|conftest|pytest_\w+", "pytest internals"),
    (r"/proc\b", "/proc"),
    (r"\bsubprocess\b|\bos\.(system|popen|fork|execv\w*|spawn\w*|setsid)\b", "subprocess"),
    (r"site-packages|sitecustomize|usercustomize|\.pth\b|getsitepackages", "site-packages"),
    (r"\bsolutions\b", "solutions"),
    (r"\bos\._exit\b", "os._exit"),
    (r"(?<![.\w`])(?<!def )(exec|eval|compile|__import__)\s*\(|\bimportlib\b|\b(b64|b32|b16|a85|b85)decode\b"
     r"|\bmarshal\b|\bcodecs\.decode\b|\bgetattr\s*\(\s*(os|sys|builtins|__builtins__)\b", "code built at run time"),
)
# ``getattr`` on an alias of ``os`` or ``sys`` (``import os as _o; getattr(_o, "po" + "pen")``) is found by
# ``_aliases`` below: a name found in the text, so it cannot be one fixed pattern.
RUNTIME_CODE = "code built at run time"


def make_checks(files: list[str], *, n: int = 4) -> dict[str, list[tuple[str, int, int, int]]]:
    """Per test file, ``n`` check tests ``(token, a, b, c)``: a fresh random token each (``gradeplugin`` names
    the test after one of the file's own with the token as its parameter), each ``assert a * b == c``,
    which must pass when ``c`` is the product and must fail when it is one more; at least one of each kind."""
    out = {}
    for rel in files:
        kinds = [True, False] + [secrets.randbelow(2) == 1 for _ in range(max(0, n - 2))]
        order = sorted(range(len(kinds)), key=lambda _: secrets.randbelow(1 << 30))
        items = []
        for i in order:
            a, b = 3 + secrets.randbelow(997), 3 + secrets.randbelow(997)
            items.append((secrets.token_hex(6), a, b, a * b + (0 if kinds[i] else 1)))
        out[rel] = items
    return out


def must_pass(check) -> bool:
    """Whether a check test of ``make_checks`` (or an older ``(name, must pass)`` pair) must pass."""
    if len(check) == 2:
        return bool(check[1])
    _, a, b, c = check
    return a * b == c


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
        for check in items:
            total += 1
            got = reported.get(f"{rel}::{check[0]}")
            want = "passed" if must_pass(check) else "failed"
            if got is None:
                missing += 1
            elif got not in (want, "skipped"):
                wrong.append(f"{rel}::{check[0]} {got}, where it must have {want}")
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
    aliases = re.findall(r"\bimport\s+(?:os|sys|builtins)\s+as\s+(\w+)|\bfrom\s+\S+\s+import\s+(?:os|sys)\s+as\s+(\w+)",
                         text)
    names = sorted({a or b for a, b in aliases})
    if names:
        m = re.search(r"\bgetattr\s*\(\s*(" + "|".join(map(re.escape, names)) + r")\b", text)
        if m:
            line = text.count("\n", 0, m.start()) + 1
            out[RUNTIME_CODE] = min(out.get(RUNTIME_CODE, line), line)
    return out


def flags(files: dict[str, bytes], teacher_root: Path, fresh: dict[str, str]) -> list[str]:
    """Cheap signs in a submission's exercise files that make a teacher look: a file byte-identical to the answer
    key, or one that mentions pytest internals, ``/proc``, ``subprocess``, ``site-packages``, ``solutions``,
    ``os._exit`` or builds code at run time (``exec``/``eval``/``compile``/``__import__``, ``importlib``,
    ``base64``'s decoders, ``marshal``, ``codecs.decode``, ``getattr`` on ``os``/``sys`` or an alias of them)
    where its scaffold and answer key do not. ``fresh``: repo-relative path -> scaffold text."""
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


def slow_fast_flags(records: list[dict], *, ratio: float = 0.25, floor_s: float = 0.5) -> None:
    """Flag (in each record's ``flags``) a module graded far faster than the class median for it: less than
    ``ratio`` of the median, when the median is over ``floor_s`` seconds and at least three submissions have
    it. A module's seconds are its tests' own (first outcome to end, the grader's clock: no interpreter start or
    import in them), so tests that did not run come back at once. Forged, crashed and failed rows are left out
    of the median; a forged row is flagged too (one more sign for the teacher)."""
    by_module: dict[str, list[tuple[dict, float, bool]]] = {}
    for r in records:
        for mid, m in r.get("modules", {}).items():
            s = m.get("seconds")
            if isinstance(s, (int, float)) and m.get("state") not in ("error", "timeout", "crashed"):
                by_module.setdefault(mid, []).append((r, float(s), m.get("state") != "forged"))
    for mid, rows in by_module.items():
        honest = [s for _, s, counts in rows if counts]
        if len(honest) < 3:
            continue
        median = statistics.median(honest)
        if median < floor_s:
            continue
        for r, s, _ in rows:
            if s < ratio * median and mid in r.get("worked", []):
                r.setdefault("flags", []).append(f"module {mid} was graded in {s:.1f} s, the class median is "
                                                 f"{median:.1f} s")
