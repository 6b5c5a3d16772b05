#!/usr/bin/env python3
"""Execute the course notebooks top to bottom, as CI does.

    python scripts/run_notebooks.py                    # every module's notebook
    python scripts/run_notebooks.py specdec 03         # some modules (ids, clean notebooks or sources)
    python scripts/run_notebooks.py --save DIR         # also keep the executed copies in DIR
    python scripts/run_notebooks.py path/to/any.ipynb  # run that file as it is
    python scripts/run_notebooks.py --jobs 2           # two notebooks at a time (./test.sh: one per core)

A clean notebook leaves its code exercises blank (they raise ``NotImplementedError``), so it
cannot run to the end. For every registry module this script therefore:

1. checks that the committed clean notebook is exactly the blanked form of its source
   ``solutions/notebooks/<stem>.py`` (what ``python scripts/notebooks/build.py --check`` checks);
2. builds the solved twin from the same source into a temporary directory and executes it.

Each notebook runs in a fresh ``python3`` kernel (this interpreter's environment) from the
repository root with ``G2C_APPLY_SOLUTIONS=all``, ``G2C_QUICK=1`` (notebooks shrink their
loops) and ``G2C_QUIET=1``. The first failing cell stops that notebook and is reported with
its error; the exit code is 1 if any notebook failed or is stale. With ``--jobs N`` up to N
notebooks run at once, each in its own kernel with its share of the cores as torch threads
(``OMP_NUM_THREADS`` = cores // N unless you set it; no notebook writes a shared file: checkpoints go
to temporary folders, data is prepared before by ``./datasets.sh``); each result line is printed
when its notebook ends, in the order they finish.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import re
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from g2c.assets.cli import count, output_dir  # noqa: E402
from g2c.course import MODULES, get_module  # noqa: E402
from g2c.course.progress import share_cores, usable_cores  # noqa: E402

TIMEOUT_S = 900
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NOTEBOOK_ENV = {"G2C_APPLY_SOLUTIONS": "all", "G2C_QUICK": "1", "G2C_QUIET": "1"}

_spec = importlib.util.spec_from_file_location("g2c_notebook_build", ROOT / "scripts" / "notebooks" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)


def run_one(path: Path, *, timeout: int = TIMEOUT_S, save: Path | None = None) -> str | None:
    """Execute one notebook; return None on success, else a description of the failing cell.

    With ``save``, the executed notebook (outputs included, also on failure) is written there.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    deadline = time.monotonic() + timeout

    def remaining(cell) -> int:  # the whole notebook shares one budget of `timeout` seconds
        return max(1, int(deadline - time.monotonic()))

    client = NotebookClient(nb, timeout_func=remaining, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT)}})
    try:
        client.execute()
    except CellTimeoutError as e:
        return f"notebook exceeded its {timeout} s budget: {e}"
    except (CellExecutionError, DeadKernelError) as e:
        return ANSI.sub("", str(e))
    finally:
        if save is not None:
            save.parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, save)
    return None


def resolve(item: str):
    """A module for an id, a clean notebook or a source path; else the Path to run as is."""
    path = Path(item)
    for module in MODULES:
        if path.suffix in (".ipynb", ".py") and path.resolve() in (
                (ROOT / module.notebook).resolve(), build.source_path(module).resolve()):
            return module
    if path.suffix in (".ipynb", ".py") or path.exists():
        return path
    return get_module(item)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*",
                    help="module ids, clean notebooks, sources or other .ipynb files (default: every module)")
    ap.add_argument("--timeout", type=count(1), default=TIMEOUT_S, help="per-notebook timeout in seconds")
    ap.add_argument("--save", type=output_dir(as_path=True), metavar="DIR",
                    help="write each executed notebook to DIR/<stem>.ipynb")
    ap.add_argument("--jobs", "-j", type=count(1), default=1, metavar="N",
                    help="run up to N notebooks at once, each in its own kernel (default 1)")
    args = ap.parse_args(argv)
    try:
        items = [resolve(item) for item in args.notebooks] if args.notebooks else list(MODULES)
    except ValueError as err:
        print(f"run_notebooks.py: {err}", file=sys.stderr)
        return 2
    # The kernel inherits this environment; make sure it finds this venv's python first.
    os.environ.update(NOTEBOOK_ENV)
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    # more kernels than notebooks or cores only costs memory (each loads its models): cap, and say so
    cores = usable_cores()
    jobs = min(args.jobs, max(1, len(items)), cores)
    if jobs < args.jobs:
        print(f"run_notebooks.py: --jobs {args.jobs} capped at {jobs} ({len(items)} notebook(s), "
              f"{cores} usable core(s))", flush=True)
    share_cores(jobs)   # N kernels side by side: each gets its share of the cores as torch threads
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="g2c-solved-") as tmp:
        runs: list[tuple[str, Path]] = []
        for item in items:
            if isinstance(item, Path):
                runs.append((str(item), item))
                continue
            stale = build.stale_notebooks([item])
            if stale:
                print(f"FAIL  {stale[0]}", flush=True)
                failed.append(item.notebook)
                continue
            name = f"{item.notebook} (solved twin of {build.source_path(item).relative_to(ROOT).as_posix()})"
            runs.append((name, build.write_solved(item, Path(tmp))))

        def one(run: tuple[str, Path]) -> str | None:
            name, path = run
            t0 = time.perf_counter()
            save = args.save / path.name if args.save else None
            try:
                error = run_one(path, timeout=args.timeout, save=save)
            except (ValueError, FileNotFoundError) as err:  # e.g. an .ipynb that is not a notebook
                error = str(err)
            dt = time.perf_counter() - t0
            if error is None:
                print(f"ok    {name}  ({dt:.1f} s)", flush=True)
            else:
                print(f"FAIL  {name}  ({dt:.1f} s)\n{error}", flush=True)
            return error

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for (name, _), error in zip(runs, pool.map(one, runs)):
                if error is not None:
                    failed.append(name)
    print(f"notebooks: {len(items) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
