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

import hashlib
import json
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from .registry import MODULES, REPO_ROOT, SOLUTIONS_ENV, get_module, grading_selection, module_ids, selector_for

__all__ = ["HASHES", "ModuleResult", "failing_tests", "format_table", "grade", "parse_junit", "read_hashes",
           "result_dict", "share_cores", "test_file_problems", "untouched_result", "usable_cores"]

HASHES = "tests/pristine.sha256"  # sha256sum format: the recorded test files (scripts/contract.py --record)


# A container's CPU limit (docker --cpus, a CI runner's quota): cgroup v2, then v1. The affinity mask of such a
# container still lists every core of the host, so counting it alone would start a worker per host core.
PROC_CGROUP = "/proc/self/cgroup"                               # "0::/user.slice/job.scope" (v2)
CGROUP_CPU_MAX = "/sys/fs/cgroup/cpu.max"                       # "200000 100000" (quota period) or "max 100000"
CGROUP_V1_QUOTA = ("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "/sys/fs/cgroup/cpu/cpu.cfs_period_us")   # -1: none


def _cgroup_v2_files() -> list[Path]:
    """The cgroup v2 ``cpu.max`` files that limit this process: the root one (a container's own, in
    its cgroup namespace) and, from ``/proc/self/cgroup``'s ``0::/path`` line, the file of its cgroup
    and of every ancestor under the same root (a systemd slice or a batch scheduler's job limits a
    process without a namespace: only the nested file holds its quota)."""
    root = Path(CGROUP_CPU_MAX).parent
    files = [Path(CGROUP_CPU_MAX)]
    try:
        lines = Path(PROC_CGROUP).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return files
    for line in lines:
        if line.startswith("0::"):
            parts = [p for p in line[3:].strip().split("/") if p and p not in (".", "..")]
            files += [root.joinpath(*parts[:i], "cpu.max") for i in range(len(parts), 0, -1)]
    return files


def _quota_cap(quota: str, period: str) -> int | None:
    """CPUs a quota/period pair allows, rounded up; None for no limit ("max", -1) or garbage."""
    if quota.lstrip("-").isdigit() and int(quota) > 0 and period.isdigit() and int(period) > 0:
        return -(-int(quota) // int(period))
    return None


def usable_cores() -> int:
    """How many CPUs this process can keep busy: its affinity mask (``os.sched_getaffinity``, else
    ``os.cpu_count()``), capped by the tightest cgroup CPU quota rounded up (a quota of 1.5 CPUs gives
    2): cgroup v2 ``cpu.max`` at the root and along this process's own cgroup path
    (``_cgroup_v2_files``), else the v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``. A missing or
    unreadable quota file means no cap. Always >= 1. ``./test.sh`` sizes its parallel steps
    (pytest-xdist workers, contract and notebook jobs, at most 8) with it."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    caps, v2_found = [], False
    for path in _cgroup_v2_files():
        try:
            quota, period = path.read_text(encoding="ascii").split()[:2]
        except (OSError, ValueError, UnicodeDecodeError):
            continue
        v2_found = True
        caps.append(_quota_cap(quota, period))
    if not v2_found:
        try:
            quota, period = (Path(f).read_text(encoding="ascii").strip() for f in CGROUP_V1_QUOTA)
            caps.append(_quota_cap(quota, period))
        except (OSError, ValueError, UnicodeDecodeError):
            pass
    caps = [c for c in caps if c is not None]
    return max(1, min([n, *caps]))


def share_cores(jobs: int) -> int:
    """Give each of ``jobs`` processes run side by side its share of the CPU as torch threads.

    torch starts as many intra-op threads as there are cores in *every* process, so ``jobs``
    processes oversubscribe the CPU, and OpenMP threads that wait for each other spin: on a 2-core
    machine the fake-device suite took 38 min with two pytest workers at torch's default and 9-14 min
    with one thread each. Sets ``OMP_NUM_THREADS`` (inherited by every child process, read by
    torch at start-up) to ``max(1, cores // jobs)`` when ``jobs > 1`` and it is not set already (a
    value you chose is kept); cores are ``usable_cores()``. Returns the thread count the children will
    use (0: torch's default).
    Callers: ``scripts/contract.py --jobs``, ``scripts/run_notebooks.py --jobs``,
    ``grade-class --jobs`` (``./test.sh`` exports the same value itself)."""
    if "OMP_NUM_THREADS" in os.environ:
        return int(os.environ["OMP_NUM_THREADS"]) if os.environ["OMP_NUM_THREADS"].isdigit() else 0
    if jobs <= 1:
        return 0
    threads = max(1, usable_cores() // jobs)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    return threads


@dataclass(frozen=True)
class ModuleResult:
    """Outcome counts of one module's test files.

    ``blocked`` maps a prerequisite id to the number of failing tests whose error is that
    prerequisite's ``NotImplementedError`` (an exercise there is unwritten): those failures are
    not the graded module's. ``applied`` is the answer key the run used. ``failures`` names each
    failing test as ``(test id, prerequisite id or "")``, the id blaming an unwritten prerequisite.
    ``recorded`` is how many tests the course's contract records for the module's files
    (``tests/pristine.json``); ``warnings`` say why the result is not a valid grade (the test
    files differ from the recorded ones, or fewer tests ran than recorded). ``checks`` holds the
    outcome of each check test ``grade-class`` added to the run (``gradeplugin.py``, ``g2c/course/forgery.py``),
    counted apart from everything else; ``seconds`` the pytest run's wall time (in a
    class grading run: from its first test's outcome to its end, as the grader saw them arrive).
    """

    id: str
    title: str
    passed: int
    failed: int
    skipped: int
    untouched: int | None  # tests that pass on the untouched scaffold (tests/pristine.json)
    blocked: tuple[tuple[str, int], ...] = ()
    applied: tuple[str, ...] = ()
    failures: tuple[tuple[str, str], ...] = ()
    recorded: int | None = None
    warnings: tuple[str, ...] = ()
    graded: bool = True  # False: the recorded untouched counts, shown without running the tests
    checks: tuple[tuple[str, str], ...] = ()  # grade-class's check tests: ("file::name", outcome), apart
    seconds: float = 0.0  # wall time of the module's pytest run
    forged: tuple[str, ...] = ()      # a class grading run: why its streamed outcomes cannot be an honest run
    incomplete: tuple[str, ...] = ()  # a class grading run: why its streamed outcomes are incomplete

    @property
    def total(self) -> int:
        return self.passed + self.failed + self.skipped

    @property
    def own_failures(self) -> int:
        """Failing tests that are not explained by an unwritten prerequisite."""
        return self.failed - sum(n for _, n in self.blocked)


UNWRITTEN = re.compile(r"module ([0-9a-z][0-9a-z-]*):\s+\S+\s+in\s+\S+\s+is\s+not\s+implemented\s+yet")


def _cases(xml_text: str):
    """Every junit test case, in run order, as ``(case, file, bad, kind, unwritten)``: ``bad`` its
    ``failure`` or ``error`` element (None when it did not fail), ``kind`` "FAILED" or "ERROR", and
    ``unwritten`` the ``UNWRITTEN`` match in the failure's message or traceback (or None)."""
    for case in ET.fromstring(xml_text).iter("testcase"):
        file = case.get("file") or (case.get("classname") or "?").replace(".", "/") + ".py"
        bad, kind = case.find("failure"), "FAILED"
        if bad is None:
            bad, kind = case.find("error"), "ERROR"
        m = None if bad is None else UNWRITTEN.search(f"{bad.get('message', '')}\n{bad.text or ''}")
        yield case, file, bad, kind, m


def parse_junit(xml_text: str) -> dict[str, Counter]:
    """Per test file (repo-relative) counts of ``passed`` / ``failed`` / ``skipped``, and of
    ``unwritten:<id>`` for failures raised by module <id>'s unwritten exercise."""
    counts: dict[str, Counter] = defaultdict(Counter)
    for case, file, bad, _, m in _cases(xml_text):
        if bad is not None:
            counts[file]["failed"] += 1
            if m:
                counts[file][f"unwritten:{m.group(1)}"] += 1
        elif case.find("skipped") is not None:
            counts[file]["skipped"] += 1
        else:
            counts[file]["passed"] += 1
    return counts


_FILE_LINE = re.compile(r'File "([^"]+)", line (\d+)')
_FRAME = re.compile(r"^(\S+\.py):(\d+): in ", re.M)


def import_failure(text: str) -> str:
    """The cause of a collection error, on one line, from its junit traceback ``text``: the exception's
    last line and the deepest course file and line it names, e.g. "SyntaxError: Function parameters
    cannot be parenthesized (g2c/specdec/verify.py:77)"; "" when the traceback holds no ``E`` line."""
    errors = [line[1:].strip() for line in text.splitlines() if line.startswith("E ")]
    if not errors:
        return ""
    cause = errors[-1]
    where = ""
    m = _FILE_LINE.findall("\n".join(errors))
    if m:
        path, line = m[-1]
        cut = path.replace("\\", "/").rfind("/g2c/")
        where = f"{path[cut + 1:] if cut >= 0 else Path(path).name}:{line}"
    else:
        frames = [f"{f}:{n}" for f, n in _FRAME.findall(text) if not f.startswith(("/", "<", "."))]
        where = frames[-1] if frames else ""
    return " ".join(f"{cause} ({where})".split()) if where else " ".join(cause.split())


def _case_id(case, file: str) -> str:
    """A pytest-like id of a junit test case: ``tests/test_nn.py::TestX::test_y[p]``; a file that could
    not be collected reads ``tests/test_x.py (collection error: <import_failure>)``."""
    name, classname = case.get("name") or "?", case.get("classname") or ""
    if not classname:  # a collection error: the name is the dotted test module
        bad = case.find("error")
        cause = import_failure(bad.text or "") if bad is not None else ""
        if len(cause) > REASON_WIDTH:
            cause = cause[:REASON_WIDTH - 3] + "..."
        return f"{file} (collection error: {cause})" if cause else f"{file} (collection error)"
    dotted = file[:-3].replace("/", ".") if file.endswith(".py") else file
    cls = classname[len(dotted) + 1:] if classname.startswith(dotted + ".") else ""
    return f"{file}::{cls.replace('.', '::') + '::' if cls else ''}{name}"


def failing_tests(xml_text: str) -> list[tuple[str, str]]:
    """``(test id, unwritten prerequisite id or "")`` for every failing or erroring test case, in run order."""
    return [(_case_id(case, file), m.group(1) if m else "")
            for case, file, bad, _, m in _cases(xml_text) if bad is not None]


def passing_lines(xml_text: str, width: int = 100) -> list[str]:
    """What passes, compactly: per test file, ``passed in <file> (n): test_a, test_b, ...`` (test names
    without the file, classes kept: ``TestX::test_y``), wrapped at ``width`` characters; a grade lists
    the tests that pass as well as those that fail."""
    by_file: dict[str, list[str]] = defaultdict(list)
    for case, file, bad, _, _ in _cases(xml_text):
        if bad is None and case.find("skipped") is None and case.get("classname"):
            by_file[file].append(_case_id(case, file).split("::", 1)[-1])
    return [textwrap.fill(", ".join(names), width=width, initial_indent=f"passed in {file} ({len(names)}): ",
                          subsequent_indent="    ", break_on_hyphens=False)
            for file, names in by_file.items()]


REASON_WIDTH = 160  # characters of a failure's first message line shown after its test id


def failure_lines(xml_text: str) -> list[str]:
    """``FAILED <test id> - <reason>`` for every failing or erroring test case, in run order.

    The reason is the "module X: f in file is not implemented yet" sentence wherever the failure's
    message or traceback holds one (also inside a ``pytest.raises(..., match=...)`` mismatch, whose
    first line alone reads "Regex pattern did not match"), else the message on one line, cut at
    ``REASON_WIDTH`` characters. pytest's own summary lines are cut at the terminal width (80
    columns in a pipe), which hid the reason."""
    out = []
    for case, file, bad, kind, m in _cases(xml_text):
        if bad is None:
            continue
        if not (case.get("classname") or ""):    # a collection error: its id already names the cause
            out.append(f"{kind} {_case_id(case, file)}")
            continue
        reason = m.group(0) if m else " ".join((bad.get("message") or "").split())   # every line: a regex mismatch
        # says what was expected only on its "Regex:" and "Input:" lines
        if len(reason) > REASON_WIDTH:
            reason = reason[:REASON_WIDTH - 3] + "..."
        out.append(f"{kind} {_case_id(case, file)}" + (f" - {' '.join(reason.split())}" if reason else ""))
    return out


def _pristine(root: Path) -> dict:
    try:
        return json.loads((root / "tests" / "pristine.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _recorded(module, root: Path) -> int | None:
    """How many tests the contract records for the module's files (None without a complete record)."""
    pristine = _pristine(root)
    try:
        return sum(pristine[t]["passed"] + pristine[t]["failed"] for t in module.tests)
    except (KeyError, TypeError):
        return None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


GRADE_FDS_ENV = "G2C_GRADE_FDS"         # gradeplugin's two descriptors (check tests in, outcomes out)
NAMESPACE_ENV = "G2C_GRADE_NAMESPACE"   # "1": the grader runs in grade-class's namespace sandbox


def split_checks(xml_text: str, checks: dict[str, set[str]]) -> tuple[str, dict[str, str]]:
    """Take grade-class's check tests out of a junit report: (the report without them, {"file::token": outcome})
    with outcome "passed", "failed" or "skipped". ``checks``: test file -> the checks' tokens; ``gradeplugin``
    names each check like a test of its file with the token as its parameter (``test_x[token]``)."""
    if not checks:
        return xml_text, {}
    owner = {token: f for f, tokens in checks.items() for token in tokens}
    root = ET.fromstring(xml_text)
    found = {}
    for suite in root.iter("testsuite"):
        for case in list(suite.findall("testcase")):
            name = case.get("name") or ""
            token = name[name.rfind("[") + 1:-1] if name.endswith("]") and "[" in name else ""
            if token in owner:
                bad = case.find("failure") is not None or case.find("error") is not None
                found[f"{owner[token]}::{token}"] = "failed" if bad else "skipped" \
                    if case.find("skipped") is not None else "passed"
                suite.remove(case)
    return ET.tostring(root, encoding="unicode"), found


def read_hashes(root: Path = REPO_ROOT) -> dict[str, str]:
    """Repo-relative path -> recorded sha256, from ``tests/pristine.sha256`` ({} when there is none).

    The file is in ``sha256sum`` format (``<hex>  <path>`` a line), so ``sha256sum -c tests/pristine.sha256``
    run at the repository root checks it too.
    """
    try:
        lines = (root / HASHES).read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    out = {}
    for line in lines:
        digest, _, rel = line.strip().partition("  ")
        if len(digest) == 64 and rel:
            out[rel] = digest
    return out


def support_files(hashes: dict[str, str]) -> list[str]:
    """The recorded files every module's run loads besides its own tests: ``tests/conftest.py`` and the
    shared helpers (``tests/*.py`` that are not ``test_*.py``)."""
    return sorted(rel for rel in hashes if rel.startswith("tests/") and rel.count("/") == 1
                  and not Path(rel).name.startswith("test_"))


def test_file_problems(module, root: Path = REPO_ROOT) -> list[str]:
    """Why ``module``'s test files in ``root`` are not the course's recorded ones ([] = they are, or there is
    no record): a test file or shared helper whose sha256 differs from ``tests/pristine.sha256``, or is gone.
    """
    hashes = read_hashes(root)
    if not hashes:
        return []
    problems = []
    for rel in [*module.tests, *support_files(hashes)]:
        want, path = hashes.get(rel), root / rel
        if want is None:
            continue
        if not path.is_file():
            problems.append(f"{rel} is missing")
        elif file_sha256(path) != want:
            problems.append(f"{rel} differs from the course's recorded test file")
    return problems


def _untouched(module, root: Path) -> int | None:
    try:
        pristine = json.loads((root / "tests" / "pristine.json").read_text(encoding="utf-8"))
        return sum(pristine[t]["passed"] for t in module.tests)
    except (OSError, ValueError, KeyError):
        return None


def _read_stream(fd: int, done: threading.Event, lines: list[bytes], times: dict[str, float],
                 cap: int = 32 * 2**20) -> None:
    """Collect the plugin's lines from ``fd`` until end of file, or until ``done`` is set and nothing more is
    waiting (a process the run left behind may hold the pipe open); at most ``cap`` bytes are kept. ``times``
    gets when the first test outcome (``first``) and the end (``end``) arrived, by this process's clock."""
    buf, size = b"", 0
    while True:
        ready, _, _ = select.select([fd], [], [], 0.05)
        if not ready:
            if done.is_set():
                break
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        if b'"when"' in chunk:
            times.setdefault("first", time.monotonic())
        if b'"end"' in chunk:
            times.setdefault("end", time.monotonic())
        size += len(chunk)
        if size <= cap:
            buf += chunk
    lines.extend(buf.split(b"\n"))


def fold_stream(lines: list[bytes], checks: dict[str, list], finished: bool) -> tuple[dict[str, Counter],
                                                                                      dict[str, str], list[str],
                                                                                      list[str]]:
    """The grade from the plugin's stream (``gradeplugin``): per test file counts of passed, failed and skipped,
    the check tests' outcomes (``"file::name"`` -> outcome), why the stream cannot be the tests run honestly
    (a line twice, a line after the end, a line that is no outcome) and why it is incomplete (no end)."""
    names = {f"[{c[0]}]": f"{rel}::{c[0]}" for rel, items in checks.items() for c in items}
    phases: dict[str, dict[str, str]] = {}
    collected: dict[str, Counter] = defaultdict(Counter)
    forged, incomplete, ended = [], [], False
    for raw in lines:
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw.decode("utf-8"))
            if not isinstance(rec, dict):
                raise ValueError
        except ValueError:
            forged.append("a line of the test outcomes is not one the grader writes")
            continue
        if ended:
            forged.append("test outcomes arrived after the run's end")
            continue
        if "end" in rec:
            ended = True
        elif "collect" in rec:
            if isinstance(rec["collect"], str) and rec.get("outcome") in ("failed", "skipped"):
                collected[rec["collect"].split("::", 1)[0]][rec["outcome"]] += 1
        elif isinstance(rec.get("id"), str) and rec.get("when") in ("setup", "call", "teardown") and \
                rec.get("outcome") in ("passed", "failed", "skipped"):
            seen = phases.setdefault(rec["id"], {})
            if rec["when"] in seen:
                forged.append(f"the outcome of {rec['id'][:200]} ({rec['when']}) was reported twice")
            seen[rec["when"]] = rec["outcome"]
        else:
            forged.append("a line of the test outcomes is not one the grader writes")
    if not ended and finished:
        incomplete.append("the test outcomes stop before the run's end (the test process died or was killed)")
    counts: dict[str, Counter] = defaultdict(Counter, {f: Counter(c) for f, c in collected.items()})
    outcomes = {}
    for nodeid, seen in phases.items():
        if "failed" in seen.values():
            outcome = "failed"
        elif "skipped" in seen.values():
            outcome = "skipped"
        elif seen.get("call") == "passed":
            outcome = "passed"
        else:
            outcome = "failed"                        # set up, never called: it did not pass
        key = nodeid[nodeid.rfind("["):] if nodeid.endswith("]") else ""
        if key in names and nodeid.startswith(names[key].split("::", 1)[0] + "::"):
            outcomes[names[key]] = outcome
        else:
            counts[nodeid.split("::", 1)[0]][outcome] += 1
    return counts, outcomes, sorted(set(forged))[:10], incomplete


def _pytest(files: list[str], selection: list[str], root: Path, python: str, echo: bool,
            checks: dict[str, list] | None = None) -> tuple[dict[str, Counter], list[tuple[str, str]],
                                                           dict[str, str], float, list[str], list[str]]:
    """One pytest run over ``files`` with the answer key applied to exactly ``selection``: per-file counts,
    the failing tests, the outcomes of grade-class's check tests (apart), the run's wall time, why its report
    is forged and why it is incomplete.

    With ``checks`` (a class grading run, ``grader.py``) the run loads ``gradeplugin``, which adds those check
    tests and streams every outcome over a pipe: the counts come from that stream; pytest's junit file (for the
    failures' details) must agree with it. The run's output goes to a file, never to pipes a process it leaves
    behind could hold open."""
    env = dict(os.environ)
    env.pop(SOLUTIONS_ENV, None)
    env.pop(GRADE_FDS_ENV, None)
    if selection:
        env[SOLUTIONS_ENV] = selector_for(selection)
    env["G2C_QUIET"] = "1"
    # The grader chose the selection itself: edited modules are in it only through an explicit --solve.
    env["G2C_REPLACE_EDITED"] = "1"
    forged: list[str] = []
    incomplete: list[str] = []
    with tempfile.TemporaryDirectory(prefix="g2c-grade-") as tmp:
        xml = Path(tmp) / "report.xml"
        cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
               f"--junitxml={xml}", "-o", "junit_family=xunit1", *files]
        fds, lines, times, done, reader = (), [], {}, threading.Event(), None
        if checks is not None:
            secret_r, secret_w = os.pipe()
            stream_r, stream_w = os.pipe()
            fds = (secret_r, stream_w)
            env[GRADE_FDS_ENV] = f"{secret_r},{stream_w}"
            cmd[3:3] = ["-p", "g2c.course.gradeplugin"]
        start = time.monotonic()
        with open(Path(tmp) / "output.txt", "w+b") as out:
            try:
                proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, pass_fds=fds)
            finally:
                for fd in fds:
                    os.close(fd)
            if checks is not None:
                with os.fdopen(secret_w, "wb") as f:     # read by the plugin before any test module is imported
                    try:
                        f.write(json.dumps(checks).encode("utf-8"))
                    except OSError:
                        pass
                reader = threading.Thread(target=_read_stream, args=(stream_r, done, lines, times), daemon=True)
                reader.start()
            returncode = proc.wait()
            seconds = time.monotonic() - start
            if checks is not None:
                left_behind()                          # inside the sandbox: whatever the run left is killed now
                done.set()
                reader.join()
                os.close(stream_r)
                if "first" in times and "end" in times:   # the tests themselves, by the grader's clock
                    seconds = times["end"] - times["first"]
            out.seek(0, os.SEEK_END)
            out.seek(max(0, out.tell() - 6000))
            output = out.read().decode("utf-8", errors="replace")
        if not xml.exists():
            raise RuntimeError(f"pytest wrote no report (exit code {returncode}):\n{output}")
        try:
            xml_text = xml.read_text(encoding="utf-8")
            ET.fromstring(xml_text)
        except (OSError, ValueError, ET.ParseError):
            if checks is None:
                raise RuntimeError(f"pytest's report is unreadable (exit code {returncode}):\n{output}") from None
            xml_text, forged = "<testsuites/>", ["pytest's report file was replaced by something unreadable"]
        names = {f: {c[0] for c in items} for f, items in (checks or {}).items()}
        text, found = split_checks(xml_text, names)
        counts = parse_junit(text)
        if checks is not None:
            streamed, found, bad, incomplete = fold_stream(lines, checks, finished=True)
            forged += bad
            for f in sorted(set(streamed) | set(counts)):
                if counts.get(f, Counter())["passed"] != streamed.get(f, Counter())["passed"]:
                    forged.append(f"pytest's report of {f} disagrees with the outcomes streamed as its tests ran "
                                  f"({counts.get(f, Counter())['passed']} passed in the report, "
                                  f"{streamed.get(f, Counter())['passed']} as they ran)")
                    counts[f] = Counter({**counts.get(f, Counter()), **{k: streamed.get(f, Counter())[k]
                                                                       for k in ("passed", "failed", "skipped")}})
        if echo:
            for line in passing_lines(text):
                print(textwrap.indent(line, "  "))
            tail = failure_lines(text)
            for line in tail[:40]:
                print(f"  {line}")
            if len(tail) > 40:
                print(f"  ... and {len(tail) - 40} more")
        return counts, failing_tests(text), found, seconds, forged, incomplete


def left_behind() -> int:
    """Inside a class grading sandbox's PID namespace (``G2C_GRADE_NAMESPACE`` set and this namespace's first
    process the sandbox's): kill every process but the first and this one, and return how many there were
    (a daemon the test run left). 0 anywhere else, where nothing is killed."""
    if os.environ.get(NAMESPACE_ENV) != "1" or not Path("/proc/1/cmdline").is_file():
        return 0
    try:
        if b"sandbox_init.py" not in Path("/proc/1/cmdline").read_bytes():
            return 0
    except OSError:
        return 0
    me, count = os.getpid(), 0
    for _ in range(50):
        alive = []
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) not in (1, me):
                try:
                    state = Path(f"/proc/{name}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
                except (OSError, IndexError):
                    continue
                if state not in (b"Z", b"X"):
                    alive.append(int(name))
        count = max(count, len(alive))
        if not alive:
            break
        try:
            os.kill(-1, signal.SIGKILL)            # every process this one may signal, but itself and PID 1
        except ProcessLookupError:
            pass
        time.sleep(0.01)
    global LEFT_BEHIND
    LEFT_BEHIND += count
    return count


LEFT_BEHIND = 0             # processes left_behind() killed in this process's life (the grader reports them)


def grade(ids: list[str], *, worked: list[str] | None = None, solve: list[str] = (), root: Path = REPO_ROOT,
          python: str = sys.executable, echo: bool = False, on_result=None,
          checks: dict[str, list] | None = None) -> list[ModuleResult]:
    """Grade modules ``ids`` on the student's code, one pytest run per module.

    Each module runs with the answer key applied to exactly its prerequisites that the student
    has not edited (``grading_selection``), plus ``solve``: prerequisites the student edited
    but asks to have solved for this run (an explicit opt-in). The graded module itself always
    runs the student's code. Each result carries the contract's test count and a warning when the
    module's test files differ from the recorded ones or fewer tests ran than recorded; ``on_result``
    (if given) is called with each result as soon as its module is graded. ``checks`` (a class grading run,
    ``grader.py``): the check tests of each test file, added and counted through ``gradeplugin``.

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
        mine = None if checks is None else {f: c for f, c in checks.items() if f in files}
        counts, failures, found, seconds, forged, incomplete = _pytest(files, selection, root, python, echo, mine) \
            if files else ({}, [], {}, 0.0, [], [])
        pristine = _pristine(root)
        crashed = {t.split(" ", 1)[0] for t, _ in failures if " (collection error" in t}
        for t in crashed & set(m.tests):   # none of the file's tests could run: each recorded test fails
            want = pristine.get(t, {})
            need = want.get("passed", 0) + want.get("failed", 0) if isinstance(want, dict) else 0
            if need > 1:
                counts[t] = Counter({**counts.get(t, Counter()), "failed": need})
        c = Counter()
        for t in m.tests:
            c.update(counts.get(t, Counter()))
        blocked = tuple((i, c[f"unwritten:{i}"]) for i in module_ids() if i != m.id and c[f"unwritten:{i}"])
        recorded = _recorded(m, root)
        warnings = test_file_problems(m, root)
        for t in m.tests:  # a file that could not be collected (the code crashed at import) fails; it is no tampering
            want = pristine.get(t, {})
            ran = sum(counts.get(t, Counter())[k] for k in ("passed", "failed", "skipped"))
            if t not in crashed and isinstance(want, dict) and ran < want.get("passed", 0) + want.get("failed", 0):
                need = want["passed"] + want["failed"]
                warnings.append(f"{t}: {ran} tests ran where the course's contract (tests/pristine.json) records "
                                f"{need}: {need - ran} are missing (renamed, deleted or not collected)")
        result = ModuleResult(m.id, m.title, c["passed"], c["failed"], c["skipped"], _untouched(m, root),
                              blocked, tuple(selection), tuple((t, b if b != m.id else "") for t, b in failures),
                              recorded, tuple(warnings), checks=tuple(sorted(found.items())),
                              seconds=round(seconds, 2), forged=tuple(forged), incomplete=tuple(incomplete))
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results


def result_dict(r: ModuleResult) -> dict:
    """A JSON-ready dict of one module's result (the ``--json`` output of ``grade``)."""
    return {"id": r.id, "title": r.title, "passed": r.passed, "failed": r.failed, "skipped": r.skipped,
            "total": r.total, "recorded": r.recorded, "untouched": r.untouched, "own_failures": r.own_failures,
            "blocked": {i: n for i, n in r.blocked}, "applied": list(r.applied),
            "failures": [{"test": t, "blocked_by": b or None} for t, b in r.failures],
            "warnings": list(r.warnings), "valid": not r.warnings, "checks": dict(r.checks), "seconds": r.seconds,
            "forged": list(r.forged), "incomplete": list(r.incomplete)}


def untouched_result(module_id: str, root: Path = REPO_ROOT) -> ModuleResult:
    """A module the student has not started: its recorded pristine counts (its tests on the untouched
    scaffold with its prerequisites solved; a tooling test keeps that true), without running them."""
    m = get_module(module_id)
    pristine = _pristine(root)
    try:
        passed = sum(pristine[t]["passed"] for t in m.tests)
        failed = sum(pristine[t]["failed"] for t in m.tests)
    except (KeyError, TypeError):
        passed = failed = 0
    return ModuleResult(m.id, m.title, passed, failed, 0, passed, recorded=passed + failed, graded=False)


TITLE_WIDTH = 40  # the module column wraps long titles onto continuation lines (never cuts them)


PROGRESS_CACHE = Path(".g2c-cache") / "progress.json"   # under the repository root; ignored by git


def code_fingerprint(root: Path = REPO_ROOT) -> str:
    """A sha256 over everything a grade can depend on: every file under ``g2c/``, ``solutions/`` and
    ``tests/`` (path and bytes), the artifacts' names and sizes, the Python interpreter and the
    ``G2C_*`` environment (``G2C_QUIET`` aside). Equal fingerprints mean a regrade would run the same
    code on the same tests; any edit anywhere changes it."""
    h = hashlib.sha256()
    for top in ("g2c", "solutions", "tests"):
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    artifacts = root / "artifacts"
    for path in sorted(artifacts.rglob("*")) if artifacts.is_dir() else ():
        if path.is_file():
            h.update(f"{path.relative_to(root).as_posix()}:{path.stat().st_size}\0".encode())
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("G2C_") and k != "G2C_QUIET")
    h.update(json.dumps([sys.executable, env]).encode())
    return h.hexdigest()


def _result_from_dict(d: dict) -> ModuleResult:
    """``dataclasses.asdict(result)`` read back (its tuples come back from JSON as lists).

    Raises:
        TypeError: a count that is not an int, or a field ModuleResult lacks (a hand-edited or older
            cache): the caller regrades."""
    for key in ("passed", "failed", "skipped"):
        if type(d[key]) is not int:
            raise TypeError(f"{key} is not a count")
    return ModuleResult(**{**d, "blocked": tuple(tuple(b) for b in d["blocked"]), "applied": tuple(d["applied"]),
                           "failures": tuple(tuple(f) for f in d["failures"]), "warnings": tuple(d["warnings"]),
                           "checks": tuple(tuple(c) for c in d.get("checks", ())),
                           "forged": tuple(d.get("forged", ())), "incomplete": tuple(d.get("incomplete", ()))})


def grade_unless_unchanged(ids: list[str], *, worked: list[str], root: Path = REPO_ROOT, regrade: bool = False,
                           echo: bool = False, on_grading=None) -> tuple[list[ModuleResult], str | None]:
    """``grade(ids)``, or the results of the last graded run when nothing it depends on changed since
    (``code_fingerprint``, the same edited modules): (results, when) with ``when`` the last run's time
    (``"2026-12-04 22:31"``) if its results were reused, else None. ``regrade=True`` always runs the tests;
    ``on_grading`` (if given) is called just before they run (to announce it).
    The results are kept in ``.g2c-cache/progress.json`` (written atomically); a missing, unreadable or
    stale file means a regrade, never an error."""
    import dataclasses
    import time

    from .files import write_text_atomic

    path = root / PROGRESS_CACHE
    fingerprint = code_fingerprint(root)
    if not regrade:
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            if saved["fingerprint"] == fingerprint and saved["worked"] == list(worked) and saved["ids"] == list(ids):
                return [_result_from_dict(d) for d in saved["results"]], saved["when"]
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            pass
    if on_grading is not None:
        on_grading()
    results = grade(ids, worked=worked, root=root, echo=echo)
    payload = {"fingerprint": fingerprint, "worked": list(worked), "ids": list(ids),
               "when": time.strftime("%Y-%m-%d %H:%M"), "results": [dataclasses.asdict(r) for r in results]}
    if code_fingerprint(root) == fingerprint:      # nothing was edited while the tests ran
        try:
            write_text_atomic(path, json.dumps(payload, indent=1) + "\n")
        except OSError:                            # a read-only checkout or a full disk: just no reuse next time
            pass
    return results, None


def format_table(results: list[ModuleResult], worked: list[str] = ()) -> str:
    """A module x tests table: passed / total on the student's code, failures split by owner, a state.

    A title longer than ``TITLE_WIDTH`` wraps onto continuation lines under the module column."""
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
        title = textwrap.wrap(r.title, TITLE_WIDTH, break_on_hyphens=False) or [""]
        needs = ",".join(get_module(r.id).requires) or "-"
        blocked = ", ".join(f"{i} ({n})" for i, n in r.blocked) or "-"
        rows.append((r.id + ("*" if r.id in worked else ""), title[0], needs, f"{r.passed}/{r.total}",
                     "-" if r.untouched is None else str(r.untouched),
                     str(r.own_failures) if r.graded else "-", blocked, state))
        rows.extend(("", more, "", "", "", "", "", "") for more in title[1:])
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) if i in (0, 1, 2, 6, 7) else cell.rjust(w) for i, (cell, w) in
                       enumerate(zip(row, widths))).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def legend(worked: list[str]) -> str:
    """What the table's columns mean, one column a line (wrapped to 100 characters)."""
    items = [
        "passed/total: tests of the module passing on your code, with the answer key applied only to the modules "
        "it needs (the 'needs' column, transitively) that you have not edited",
        "untouched: how many pass on the untouched scaffold (tests of provided code)",
        "yours failing: the module's failing tests that no unwritten prerequisite explains (- = not run this time)",
        "blocked by: failures caused by an unwritten exercise of a module you edited",
    ]
    if worked:
        items.append("* = you edited its exercise files")
    return "\n".join(textwrap.fill(item, width=100, subsequent_indent="    ") for item in items)


def modules_with_tests() -> list[str]:
    return [m.id for m in MODULES if m.tests]
