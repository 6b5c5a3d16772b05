#!/usr/bin/env python3
"""Execute the clean notebooks top to bottom, as CI does.

    python scripts/run_notebooks.py                          # every notebooks/clean/*.ipynb
    python scripts/run_notebooks.py notebooks/clean/03-nn.ipynb

Each notebook runs in a fresh ``python3`` kernel (this interpreter's environment) from the
repository root with ``G2C_APPLY_SOLUTIONS=all``, ``G2C_QUICK=1`` (notebooks may shrink
loop sizes) and ``G2C_QUIET=1``; the executed copy is not written back. The first failing
cell stops that notebook and is reported with its error; the exit code is 1 if any failed.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 900
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NOTEBOOK_ENV = {"G2C_APPLY_SOLUTIONS": "all", "G2C_QUICK": "1", "G2C_QUIET": "1"}


def run_one(path: Path, *, timeout: int = TIMEOUT_S) -> str | None:
    """Execute one notebook; return None on success, else a description of the failing cell."""
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
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="*", type=Path,
                    help="notebooks to run (default: notebooks/clean/*.ipynb)")
    ap.add_argument("--timeout", type=int, default=TIMEOUT_S, help="per-notebook timeout in seconds")
    args = ap.parse_args(argv)
    paths = args.notebooks or sorted((ROOT / "notebooks" / "clean").glob("*.ipynb"))
    # The kernel inherits this environment; make sure it finds this venv's python first.
    os.environ.update(NOTEBOOK_ENV)
    bindir = str(Path(sys.executable).parent)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    failed: list[str] = []
    for path in paths:
        resolved = path.resolve()
        name = resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(path)
        t0 = time.perf_counter()
        error = run_one(path, timeout=args.timeout)
        dt = time.perf_counter() - t0
        if error is None:
            print(f"ok    {name}  ({dt:.1f} s)", flush=True)
        else:
            print(f"FAIL  {name}  ({dt:.1f} s)\n{error}", flush=True)
            failed.append(name)
    print(f"notebooks: {len(paths) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
