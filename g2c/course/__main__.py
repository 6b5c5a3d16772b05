"""``python -m g2c.course``: the student's view of the course.

    python -m g2c.course progress        table of modules x tests passed / total on your own code
    python -m g2c.course grade [ID ...]  grade these modules (default: the ones you edited); exit 1 if one fails
    python -m g2c.course worked          the modules whose exercise files you edited (space-separated)
    python -m g2c.course prereqs ID      the G2C_APPLY_SOLUTIONS selector for the modules before ID
"""

from __future__ import annotations

import argparse
import sys

from .progress import format_table, legend, modules_with_tests, run_tests, selector_line
from .registry import SOLUTIONS_ENV, get_module, prerequisites_selector
from .scaffolds import worked_modules


def _progress() -> int:
    worked = worked_modules()
    print("running every module's tests on your own code (no reference solutions; about a minute or two)...",
          flush=True)
    results, _ = run_tests(modules_with_tests())
    print(format_table(results, worked))
    print(legend(worked))
    return 0


def _grade(ids: list[str]) -> int:
    worked = worked_modules()
    ids = [get_module(i).id for i in ids] or worked
    if not ids:
        print("grade: you have not edited any exercise file yet; name modules (e.g. `grade 03`) or run "
              "`python -m g2c.course progress`")
        return 0
    print(f"grading your own code for module(s) {', '.join(ids)} (no reference solutions applied to them)",
          flush=True)
    results, applied = run_tests(ids, keep_selector=True, echo=True)
    if applied:
        print(f"reference solutions applied to the other modules from your {SOLUTIONS_ENV}: {', '.join(applied)}")
    print(format_table(results, worked))
    print(legend(worked))
    bad = [r for r in results if r.failed or r.total == 0]
    for r in bad:
        print(f"module {r.id}: {r.failed} of {r.total} tests fail on your code. Run them: "
              f"./test.sh {' '.join(get_module(r.id).tests)}  ({selector_line(r.id)}).")
    if not bad:
        print(f"all {sum(r.total for r in results)} tests of your module(s) pass")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m g2c.course", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("progress", help="table of modules x tests passed / total on your own code")
    g = sub.add_parser("grade", help="grade modules on your own code (default: those you edited)")
    g.add_argument("ids", nargs="*", metavar="ID")
    sub.add_parser("worked", help="the modules whose exercise files you edited")
    p = sub.add_parser("prereqs", help=f"the {SOLUTIONS_ENV} selector for the modules before ID")
    p.add_argument("id", metavar="ID")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "progress":
            return _progress()
        if args.cmd == "grade":
            return _grade(args.ids)
        if args.cmd == "worked":
            print(" ".join(worked_modules()))
            return 0
        module = get_module(args.id)
        print(prerequisites_selector(module.id))
        print(selector_line(module.id), file=sys.stderr)
        return 0
    except (ValueError, RuntimeError) as exc:
        print(f"python -m g2c.course: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
