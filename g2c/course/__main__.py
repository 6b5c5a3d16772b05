"""``python -m g2c.course``: the student's view of the course.

    python -m g2c.course grade [ID ...]      grade these modules on your code (default: the ones you edited);
                                             exit 1 if one fails, or if its test files differ from the
                                             recorded ones (tests/pristine.sha256: then no valid grade).
                                             Same as ./test.sh ID
    python -m g2c.course grade 16 --solve 11 the same, with the answer key for 11 too although you edited it
    python -m g2c.course progress            every module in graph order: your modules graded, the rest untouched
                                             (reuses the last results when nothing changed; --regrade runs anyway)
    python -m g2c.course graph               the module graph: each module and what it needs
    python -m g2c.course worked              the modules whose exercise files you edited (space-separated)
    python -m g2c.course prereqs ID          the G2C_APPLY_SOLUTIONS selector of ID's prerequisites
    python -m g2c.course grade ID --json F   also write the results as JSON to F (one object; see docs/teaching.md)

Teachers (docs/teaching.md):
    python -m g2c.course submit [--name N]   hand in: one .zip of your edited exercise files and notebook
                                             working copies, with a manifest (./test.sh --submit)
    python -m g2c.course grade-class DIR     grade every submission in DIR on this checkout's tests:
                                             CSV, JSON and an answers page; exit 0 all graded, 1 some
                                             submission could not be graded fully, 2 usage error

Grading applies the answer key to exactly the modules the graded one needs (the closure of its
``requires``) that you have not edited, and never to your own code.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from .progress import format_table, grade, grade_unless_unchanged, legend, result_dict, untouched_result
from .registry import MODULES, get_module, grading_selection, prerequisites, prerequisites_selector, selector_for
from .scaffolds import grade_command, worked_modules


def graph_lines() -> list[str]:
    """The module graph in course order: ``id  <- requires  (needs: closure)``."""
    width = max(len(m.id) for m in MODULES)
    out = []
    for m in MODULES:
        req = ", ".join(m.requires) or "-"
        out.append(f"{m.id.ljust(width)}  <- {req}" + (f"   (all it needs: {', '.join(prerequisites(m.id))})"
                                                       if len(prerequisites(m.id)) > len(m.requires) else ""))
    return out


def report(results, worked: list[str]) -> list[str]:
    """One line per module that is not done: what fails in the student's code, and what is blocked by whom."""
    lines = []
    for r in results:
        if r.total == 0:
            tests = " ".join(get_module(r.id).tests)
            lines.append(f"module {r.id}: no tests ran; run them to see why: ./test.sh {tests}")
            continue
        if r.own_failures:
            env = f"G2C_APPLY_SOLUTIONS={selector_for(list(r.applied))} " if r.applied else ""
            if set(r.applied) & set(worked):      # an explicit --solve of an edited prerequisite
                env = "G2C_REPLACE_EDITED=1 " + env
            why = ("" if r.id in worked else f" (you have not edited module {r.id}'s exercise files yet, so these "
                   "are its unwritten exercises)")
            key = "with the answer key as when grading" if r.applied else "as when grading"
            lines.append(f"module {r.id}: {r.own_failures} of {r.total} tests fail in your code{why}. See them, {key}: "
                         f"{env}./test.sh {' '.join(get_module(r.id).tests)} -x")
        for pre, n in r.blocked:
            lines.append(f"module {r.id}: {n} tests fail because module {pre} (which {r.id} needs"
                         f"{', and you edited' if pre in worked else ''}) has an unwritten exercise: finish {pre} "
                         f"({grade_command(pre)}), or grade {r.id} with {pre}'s answer key: "
                         f"{grade_command(r.id)} --solve {pre}")
    return lines


def _write_json(path: Path, payload: dict) -> None:
    """Write ``payload`` to ``path`` atomically (a temporary file in the same folder, then a rename)."""
    import tempfile

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(payload, f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


WARNING_RULE = "!" * 100


# What the front ends call the subcommands: test.sh sets G2C_FRONT=test.sh, so usage lines and errors name the
# command the student typed (./test.sh --progress), not this module.
FRONTS = {"test.sh": {"": "./test.sh", "grade": "./test.sh", "progress": "./test.sh --progress",
                      "submit": "./test.sh --submit"}}
# A front-end option typed as a module id (./test.sh progress): the command meant.
OPTION_WORDS = {"progress": "--progress", "regrade": "--progress --regrade", "submit": "--submit",
                "author": "--author", "solve": "ID --solve ID", "help": "--help"}


def _front(cmd: str = "") -> str:
    """How the student called ``cmd``: ``./test.sh --progress`` under test.sh (``G2C_FRONT=test.sh``), else
    ``python -m g2c.course progress``."""
    names = FRONTS.get(os.environ.get("G2C_FRONT", ""), {})
    return names.get(cmd) or " ".join(["python -m g2c.course", cmd]).strip()


def _split_ids(ids: list[str], flag: str = "") -> list[str]:
    """Module ids as typed, each once in the order given: ``03 04``, ``03,04`` and ``03, 04`` are the same two ids;
    a front-end option typed as an id (``./test.sh progress``) is refused with the option meant, a package or
    test-file name (``nn``) with the module it belongs to. ``flag`` (``"--solve"``) prefixes the errors.

    Raises:
        ValueError: an option word as an id (the message names ``./test.sh --progress``), an empty id list
            (``./test.sh ""``, ``--solve ,``), or an unknown id.
    """
    out: list[str] = []
    parts = [p.strip() for text in ids for p in str(text).split(",")]
    if ids and not any(parts):
        where = f"{flag} " if flag else ""
        raise ValueError(f"{where}{' '.join(map(repr, ids))} names no module; give ids such as 03 or 16 "
                         f"({_front()} --help)")
    for part in filter(None, parts):
        if part.lower() in OPTION_WORDS and os.environ.get("G2C_FRONT") == "test.sh" and not flag:
            raise ValueError(f"'{part}' is not a module id; did you mean ./test.sh {OPTION_WORDS[part.lower()]}?")
        try:
            module = get_module(part).id
        except ValueError as exc:
            name = part.lower().removesuffix(".py").removeprefix("test_")
            owner = [m.id for m in MODULES if f"tests/test_{name}.py" in m.tests]
            hint = f"; module {owner[0]} is the one tested by tests/test_{name}.py" if owner else ""
            where = f"{flag} {part}: " if flag else ""      # ./test.sh 05 --solve zz: say which list held it
            raise ValueError(f"{where}{exc}{hint}") from None
        if module not in out:
            out.append(module)
    return out


def _grade(ids: list[str], solve: list[str], json_path: str | None = None) -> int:
    worked = worked_modules()
    ids = _split_ids(ids) or worked
    solve = _split_ids(solve, "--solve")
    for i in solve:                       # refused before the banner, as grade() would refuse them
        if i in ids:
            raise ValueError(f"--solve {i} would grade the answer key instead of your module {i}")
    if not ids:
        print(f"grade: you have not edited any exercise file yet; name a module (e.g. {_front('grade')} 16) or run "
              f"{_front('progress')}")
        return 0
    needed = {n for i in ids for n in prerequisites(i)}
    unneeded = [i for i in solve if i not in needed]
    if unneeded:                          # --solve 07 for module 05: nothing 05 runs comes from 07
        graded = f"module {ids[0]} does" if len(ids) == 1 else f"modules {', '.join(ids)} do"
        print(f"note: --solve {','.join(unneeded)} changes nothing: {graded} not build on {', '.join(unneeded)} "
              f"({_front('progress')} lists what each module needs)", flush=True)
    idle = [i for i in solve if i not in worked and i in needed]
    if idle:                              # the answer key stands in for an unedited module anyway: say so
        print(f"note: --solve {','.join(idle)}: you have not edited module(s) {', '.join(idle)}, so the answer "
              "key stands in for them anyway; --solve matters only for a prerequisite you edited", flush=True)
    print(f"grading your own code for module(s) {', '.join(ids)}; the answer key stands in only for the modules "
          "they need that you have not edited", flush=True)
    done: list = []
    payload = {"format": 1, "worked": worked, "requested": ids, "modules": []}

    def save(result) -> None:
        done.append(result)
        if json_path:
            payload["modules"] = [result_dict(r) for r in done]
            _write_json(Path(json_path), payload)

    if json_path:
        _write_json(Path(json_path), payload)
    results = grade(ids, worked=worked, solve=solve, echo=True, on_result=save)
    invalid = [r for r in results if r.warnings]
    if invalid:
        _warn_invalid(invalid)
    print(format_table(results, worked))
    print(legend(worked))
    for r in results:
        print(f"module {r.id}: answer key applied to {', '.join(r.applied) if r.applied else 'nothing'}")
    bad = [r for r in results if r.failed or r.total == 0]
    for line in report(results, worked):
        print(line)
    if invalid:
        _warn_invalid(invalid)
    elif not bad:
        print(f"all {sum(r.total for r in results)} tests of your module(s) pass")
    return 1 if bad or invalid else 0


def _warn_invalid(invalid) -> None:
    """The loud banner: these results were not produced by the course's own tests, so they are no grade."""
    print(WARNING_RULE)
    for r in invalid:
        for w in r.warnings:
            print(f"WARNING: module {r.id}: {w}")
    print(f"WARNING: the result of module(s) {', '.join(r.id for r in invalid)} below is NOT A VALID GRADE: it did "
          "not come from the course's own tests. Restore them (git checkout -- tests/) and grade again; a teacher "
          "grades with the course's tests anyway (docs/teaching.md).")
    print(WARNING_RULE)


def _progress(regrade: bool = False) -> int:
    worked = worked_modules()
    if not worked:
        print("no exercise file edited yet: every module shows its untouched counts", flush=True)
    graded, when = {}, None
    if worked:
        results, when = grade_unless_unchanged(worked, worked=worked, regrade=regrade, on_grading=lambda: print(
            "grading the modules you edited on your own code (the others show their untouched counts)...",
            flush=True))
        graded = {r.id: r for r in results}
    if when:
        print(f"nothing changed since the grading of {when} (your code, the tests, the answer key): its results "
              "below, not run again; ./test.sh --progress --regrade runs them anyway", flush=True)
    results = [graded.get(m.id) or untouched_result(m.id) for m in MODULES if m.tests]
    print(format_table(results, worked))
    print(legend(worked))
    for line in report([r for r in results if r.id in graded], worked):
        print(line)
    invalid = [r for r in graded.values() if getattr(r, "warnings", ())]
    if invalid:
        _warn_invalid(invalid)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m g2c.course", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    pr = sub.add_parser("progress", help="every module in graph order: your modules graded, the rest untouched",
                        description="A table of every module in graph order: the modules whose exercise files you "
                                    "edited are graded on your code, the others show their untouched counts. The "
                                    "grading is kept in .g2c-cache/progress.json and reused while nothing it depends "
                                    "on changed (your code, the tests, the answer key); --regrade runs the tests "
                                    "anyway.")
    pr.add_argument("--regrade", action="store_true",
                    help="run the tests even when nothing changed since the last --progress (its results are "
                         "reused otherwise)")
    g = sub.add_parser("grade", help="grade modules on your own code (default: those you edited)")
    g.add_argument("ids", nargs="*", metavar="ID")
    g.add_argument("--solve", action="append", default=[], metavar="ID[,ID]",
                   help="also apply the answer key to these prerequisites although you edited them (repeatable)")
    sub.add_parser("graph", help="the module graph: what each module needs")
    sub.add_parser("worked", help="the modules whose exercise files you edited")
    from g2c.assets.cli import output_file

    g.add_argument("--json", default=None, metavar="FILE", type=output_file(),
                   help="also write the results to FILE as JSON (rewritten after each module)")
    p = sub.add_parser("prereqs", help="the G2C_APPLY_SOLUTIONS selector of ID's prerequisites")
    p.add_argument("id", metavar="ID")
    from .teaching import add_grade_class_parser, add_submit_parser

    add_submit_parser(sub)
    add_grade_class_parser(sub)
    ap.prog = _front()
    for name, parser in sub.choices.items():        # usage lines name the command the student typed
        parser.prog = _front(name)
    if not (sys.argv[1:] if argv is None else argv):  # argparse would say "required: cmd", an internal name
        ap.error(f"choose a command: {', '.join(sub.choices)} ({_front()} --help)")
    args, extra = ap.parse_known_args(argv)
    if args.cmd == "grade":           # ./test.sh 03 -- -x: an option after "--" is still no module id
        extra += [i for i in args.ids if i.startswith("-")]
        args.ids = [i for i in args.ids if not i.startswith("-")]
        if extra:
            print(f"{ap.prog}: {_grade_extra_message(args.ids, extra)}", file=sys.stderr)
            return 2
    if extra:                         # the subcommand's own usage, not the top level's (./test.sh --progress x)
        chosen = sub.choices.get(getattr(args, "cmd", None), ap)
        chosen.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        return _run(args)
    except BrokenPipeError:
        # `./test.sh --progress | head -6`: the reader left; stop quietly, as a shell tool does.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except OSError:
            pass
        return 141  # 128 + SIGPIPE, what a shell reports for a tool its reader left


def _grade_extra_message(ids: list[str], extra: list[str]) -> str:
    """Why ``./test.sh 03 -x`` is refused, and the command that does it: grading by id takes ids and ``--solve``;
    pytest's options go with a test file (the graded module's own), a front-end option goes first on its own."""
    arg = next((e for e in extra if e.startswith("-")), extra[0])
    word = arg.lstrip("-").split("=")[0].lower()
    if arg.startswith("--") and word in OPTION_WORDS and os.environ.get("G2C_FRONT") == "test.sh":
        return f"{arg} is an option on its own, not one for grading by module id: ./test.sh {OPTION_WORDS[word]}"
    try:
        wanted = _split_ids(ids)
    except ValueError as exc:          # a mistyped id first: the test file named below would be a guess
        return str(exc)
    files = [t for i in wanted for t in get_module(i).tests]
    target = " ".join(files) or "tests/test_FILE.py"
    worked = worked_modules()
    key = selector_for(sorted({n for i in wanted for n in grading_selection(i, worked)}))
    command = f"{_front()} {target} {' '.join(extra)}".rstrip()
    # that route is plain pytest: the answer key stands in for nothing unless the selector says so
    with_key = (f" (plain pytest on your code, no answer key; G2C_APPLY_SOLUTIONS={key} {command} applies it to the "
                "modules these need that you have not edited, as grading does)") if key else ""
    return (f"grading by module id takes ids and --solve ID, not '{arg}'; pytest's options go with the module's test "
            f"file(s): {command}{with_key}")


def _run(args) -> int:
    try:
        if args.cmd in ("submit", "grade-class"):
            return args.func(args)
        if args.cmd == "progress":
            return _progress(args.regrade)
        if args.cmd == "grade":
            return _grade(args.ids, args.solve, args.json)
        if args.cmd == "graph":
            print("\n".join(graph_lines()))
            return 0
        if args.cmd == "worked":
            worked = worked_modules()
            print(" ".join(worked))           # test.sh reads this line: an empty one means none
            if not worked and sys.stdout.isatty():
                print("(you have not edited any exercise file yet)", file=sys.stderr)
            return 0
        module = get_module(args.id)
        print(prerequisites_selector(module.id))
        print(f"module {module.id} needs {', '.join(prerequisites(module.id)) or 'no other module'}; grade it with "
              f"{grade_command(module.id)} (it never applies the answer key to a module you edited)", file=sys.stderr)
        return 0
    except (ValueError, RuntimeError) as exc:
        print(f"{_front()}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
