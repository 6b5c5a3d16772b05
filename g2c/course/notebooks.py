"""The notebook launcher behind ``./notebook.sh``.

    ./notebook.sh <id> [--fresh] [--solutions[=SEL]] [--no-launch]

Each course module has a clean notebook under ``notebooks/clean/``. You work in a copy
under ``notebooks/work/`` (git ignores it), created from the clean one the first time.
``--fresh`` moves your old copy to ``notebooks/work/archive/<stem>-YYYYmmdd-HHMMSS.ipynb``
and starts again from the clean notebook. ``--solutions`` (all modules) or
``--solutions=SEL`` starts Jupyter with ``G2C_APPLY_SOLUTIONS`` set (same grammar as the
environment variable); an already exported ``G2C_APPLY_SOLUTIONS`` is honoured too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

from .registry import REPO_ROOT, SOLUTIONS_ENV, get_module, parse_selection
from .scaffolds import stack_hints

ENV_VAR = SOLUTIONS_ENV


def working_copy_path(module_id: str, *, root: Path = REPO_ROOT) -> Path:
    """Where the student's working copy of a module's notebook lives."""
    return root / "notebooks" / "work" / Path(get_module(module_id).notebook).name


def prepare_working_copy(module_id: str, *, fresh: bool = False, root: Path = REPO_ROOT) -> Path:
    """Return the working copy of ``module_id``'s notebook, creating it from the clean one if missing.

    With ``fresh=True`` an existing working copy is first moved to
    ``notebooks/work/archive/<stem>-YYYYmmdd-HHMMSS.ipynb``.

    Raises:
        ValueError: unknown module id (the message lists the valid ids).
        FileNotFoundError: the module's clean notebook does not exist yet.
    """
    module = get_module(module_id)
    clean = root / module.notebook
    work = working_copy_path(module.id, root=root)
    if not clean.is_file():
        raise FileNotFoundError(
            f"module {module.id} has no clean notebook yet: {module.notebook} does not exist"
        )
    if fresh and work.exists():
        archive = work.parent / "archive"
        archive.mkdir(parents=True, exist_ok=True)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        target = archive / f"{work.stem}-{stamp}{work.suffix}"
        n = 1
        while target.exists():  # two --fresh runs within the same second
            target = archive / f"{work.stem}-{stamp}-{n}{work.suffix}"
            n += 1
        shutil.move(str(work), str(target))
        print(f"archived your previous copy to {target.relative_to(root).as_posix()}", file=sys.stderr)
    if not work.exists():
        work.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(clean, work)
    return work


def launch_env(solutions: str | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for Jupyter: ``solutions`` (a selector) overrides an exported one.

    Raises:
        ValueError: the selector is malformed (the message lists the valid ids).
    """
    env = dict(os.environ if environ is None else environ)
    if solutions is not None:
        env[ENV_VAR] = solutions
    parse_selection(env.get(ENV_VAR, ""))  # validate early, before Jupyter starts
    return env


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="./notebook.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("module_id", help="a course module id, e.g. 03, 03b, specdec")
    ap.add_argument("--fresh", action="store_true",
                    help="archive the working copy and start from the clean one")
    ap.add_argument("--solutions", nargs="?", const="all", default=None, metavar="SEL",
                    help="apply reference solutions in Jupyter (default: all; or e.g. 03,03b or 01-08)")
    ap.add_argument("--no-launch", action="store_true", help="prepare the copy and print what would run")
    args = ap.parse_args(argv)
    try:
        get_module(args.module_id)
        env = launch_env(args.solutions)
        path = prepare_working_copy(args.module_id, fresh=args.fresh)
    except (ValueError, FileNotFoundError) as e:
        print(f"notebook.sh: {e}", file=sys.stderr)
        return 2
    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [str(jupyter) if jupyter.exists() else "jupyter", "lab", str(path)]
    selected = parse_selection(env.get(ENV_VAR, ""))
    rel = path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else str(path)
    print(f"working copy: {rel}")
    print(f"solutions applied: {', '.join(selected) if selected else 'none'}")
    for line in stack_hints(args.module_id, selected):
        print(line)
    if args.no_launch:
        print("would run: " + (f"{ENV_VAR}={env[ENV_VAR]} " if selected else "") + " ".join(cmd))
        return 0
    os.chdir(REPO_ROOT)
    os.execvpe(cmd[0], cmd, env)
    return 0  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
