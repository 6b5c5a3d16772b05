"""The grader of one submission inside its sandbox (``grade-class``; tooling, never imported by course code).

``teaching.py`` starts, contained (``sandbox.py``)::

    python -m g2c.course.grader CONFIG_FD RESULTS_FD

in the submission's copy. The grade travels over descriptors, never through a file the graded code could
write:

1. Before anything else this process makes itself non-dumpable (on Linux): no process of the submission,
   though it runs as the same user, can read its memory or open its descriptors through ``/proc``, nor
   trace it. It imports no exercise file itself.
2. It reads its plan from ``CONFIG_FD`` (JSON: ``ids`` to grade, ``worked`` modules, the per-run ``checks``
   of each test file) and closes it.
3. For each module it runs pytest with ``gradeplugin`` (``progress.grade(checks=...)``): the check tests go to
   that run over a pipe, its outcomes come back over another, its output goes to a file. Inside the sandbox
   it kills whatever a test run left behind before the next starts.
4. It writes one JSON line per module to ``RESULTS_FD`` as soon as the module is graded
   (``{"module": {...}}``, ``progress.result_dict``) and a last line ``{"end": true, "left": n}``. Only this
   process holds that pipe; ``teaching.py`` reads it to its end, after the sandbox is gone.
"""

from __future__ import annotations

import json
import os
import sys


def _not_dumpable() -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)         # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError):
        pass


def _read_all(fd: int) -> bytes:
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def main(argv: list[str]) -> int:
    _not_dumpable()
    config_fd, results_fd = int(argv[1]), int(argv[2])
    if results_fd in (1, 2):           # a container: results on standard output; this process's own output to stderr
        results_fd = os.dup(results_fd)
        os.dup2(2, 1)
    try:
        config = json.loads(_read_all(config_fd).decode("utf-8"))
    finally:
        os.close(config_fd)
    from . import progress

    results = os.fdopen(results_fd, "wb", buffering=0)

    def send(record: dict) -> None:
        results.write((json.dumps(record) + "\n").encode("utf-8"))

    def on_result(result) -> None:
        send({"module": progress.result_dict(result)})

    checks = {str(f): [list(c) for c in items] for f, items in config.get("checks", {}).items()}
    for i in config["ids"]:              # one module at a time: a crash in one leaves the others graded
        try:
            progress.grade([i], worked=list(config.get("worked", [])), on_result=on_result, checks=checks)
        except RuntimeError as exc:      # pytest wrote no report: the code breaks before any test starts
            text = str(exc)
            cause = next((line[1:].strip() for line in reversed(text.splitlines())
                          if line.startswith("E ") and ("Error" in line or "Exception" in line)), "")
            send({"crashed": i, "cause": cause[:300]})
            print(text, flush=True)
    send({"end": True, "left": progress.LEFT_BEHIND + progress.left_behind()})
    results.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
