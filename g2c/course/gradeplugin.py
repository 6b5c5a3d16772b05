"""The pytest plugin of a class grading run (``grade-class``; tooling, never imported by course code).

``g2c/course/grader.py`` starts each module's pytest run inside the sandbox as
``python -m pytest -p g2c.course.gradeplugin ...`` with ``G2C_GRADE_FDS=SECRET,STREAM`` (two descriptor
numbers, nothing else). Loaded with ``-p``, this module is imported before any ``conftest.py`` or test module,
so before any of the submission's code:

1. It reads the run's check tests from ``SECRET`` (JSON ``{test file: [[name, a, b, c], ...]}``) and closes
   it: neither their names nor what they must do is in the environment, a file or a command line.
2. After collection it adds them to their test files' items, each at a random place among that file's own
   tests and named like one of them with a random parameter (``test_linear_shapes[5e0c9a1b2d3f]``), its code
   compiled as if it stood in that file: ``assert a * b == c``, which passes when the grader made ``c`` the
   product and fails when it made it one more. A blanket "everything passed" or a no-op ``runtest`` passes the
   ones that must fail.
3. As each test runs it writes its outcome to ``STREAM``, one JSON line per phase
   (``{"id": nodeid, "when": "setup"|"call"|"teardown", "outcome": ...}``), a line per file that could not be
   collected (``{"collect": path, "outcome": "failed"}``) and a last line ``{"end": exit status, "items": n}``.
   The grader counts the grade from these lines, not from any file: a report file rewritten afterwards
   disagrees with them, a line written twice is a forgery.

What it cannot prevent: the submission's code runs in this process after step 1; code written against this
plugin can find the check tests in memory and forge outcomes consistent with them. ``forgery.flags`` names the
signs of such code (it mentions pytest's internals); ``docs/teaching.md`` says so.
"""

from __future__ import annotations

import json
import os
import secrets

FDS_ENV = "G2C_GRADE_FDS"

_checks: dict[str, list] = {}
_stream: int | None = None


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _load() -> None:
    global _stream
    raw = os.environ.pop(FDS_ENV, "")
    try:
        secret, stream = (int(x) for x in raw.split(","))
    except ValueError:
        return
    try:
        data = json.loads(_read_all(secret).decode("utf-8") or "{}")
    finally:
        os.close(secret)
    for rel, items in data.items():
        _checks[str(rel)] = [(str(n), int(a), int(b), int(c)) for n, a, b, c in items]
    _stream = stream


_load()


def _send(record: dict) -> None:
    if _stream is None:
        return
    line = (json.dumps(record) + "\n").encode("utf-8")
    if len(line) > 4000:          # one write of at most PIPE_BUF bytes is never interleaved with another
        record = {**record, "id": str(record.get("id", ""))[:1000], "collect": str(record.get("collect", ""))[:1000]}
        line = (json.dumps(record) + "\n").encode("utf-8")[:4000]
    try:
        os.write(_stream, line)
    except OSError:
        pass


def _check(a: int, b: int, c: int, filename: str, module: str):
    """The check test's function, compiled as if it stood in the test file ``filename`` of module ``module``."""
    space = {"__name__": module, "_a": a, "_b": b, "_c": c}
    exec(compile("def check():\n    assert _a * _b == _c\n", filename, "exec"), space)   # noqa: S102
    return space["check"]


def pytest_collection_modifyitems(session, config, items):
    import pytest

    if not _checks:
        return
    files: dict[str, list[int]] = {}
    for i, item in enumerate(items):
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(i)
    added = []
    for rel, checks in _checks.items():
        where = files.get(rel)
        if not where:
            continue                                  # not collected (its code crashed at import): no check runs
        module = items[where[0]].getparent(pytest.Module)
        if module is None:
            continue
        own = [items[i] for i in where if items[i].getparent(pytest.Module) is module]
        for token, a, b, c in checks:
            # named like one of the file's own tests with a parameter: nothing in the name tells it apart
            like = own[secrets.randbelow(len(own))] if own else None
            real = getattr(like, "originalname", None) or "test"
            fn = _check(a, b, c, str(module.path), getattr(module.obj, "__name__", "tests"))
            item = pytest.Function.from_parent(module, name=f"{real}[{token}]", callobj=fn)
            item.originalname = real          # after: pytest 9 builds the node id from it
            added.append((where[0] + secrets.randbelow(len(where) + 1), item))
    _checks.clear()
    for pos, item in sorted(added, key=lambda x: -x[0]):   # from the back: earlier positions stay valid
        items.insert(pos, item)


def pytest_collectreport(report):
    if report.failed or report.skipped:
        _send({"collect": report.nodeid, "outcome": report.outcome})


def pytest_runtest_logreport(report):
    _send({"id": report.nodeid, "when": report.when, "outcome": report.outcome})


def pytest_sessionfinish(session, exitstatus):
    _send({"end": int(exitstatus), "items": len(session.items)})
