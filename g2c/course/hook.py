"""The ``G2C_APPLY_SOLUTIONS`` import hook.

When a module id is selected, every file it owns that has an answer-key twin under
``solutions/g2c/...`` is imported from that twin *under the student module's name*. There
is only ever one module object per name in ``sys.modules``, so classes keep one identity
no matter who imports them. Modules that are not selected load the student scaffolds.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys
from pathlib import Path

from .registry import MODULES, REPO_ROOT, SOLUTIONS_ENV, SOLUTIONS_ROOT, parse_selection

ENV_VAR = SOLUTIONS_ENV


def _solution_map(selected: list[str]) -> dict[str, Path]:
    """Dotted module name -> solution file, for the selected module ids."""
    out: dict[str, Path] = {}
    for m in MODULES:
        if m.id not in selected:
            continue
        for rel in m.files:
            sol = SOLUTIONS_ROOT / rel
            if not sol.is_file():
                continue
            parts = Path(rel).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = sol
    return out


class SolutionFinder(importlib.abc.MetaPathFinder):
    """Meta-path finder that serves selected modules from ``solutions/``."""

    def __init__(self, mapping: dict[str, Path]):
        self.mapping = mapping

    def find_spec(self, fullname, path=None, target=None):  # noqa: D401 - importlib API
        sol = self.mapping.get(fullname)
        if sol is None:
            return None
        is_pkg = sol.name == "__init__.py"
        pkg_dir = REPO_ROOT / "g2c" / Path(*fullname.split(".")[1:])
        return importlib.util.spec_from_file_location(
            fullname, sol, submodule_search_locations=[str(pkg_dir)] if is_pkg else None,
        )


class SelectorError(ValueError):
    """A malformed ``G2C_APPLY_SOLUTIONS`` in the environment. Uncaught in a script or a CLI it
    prints one line (``g2c: error: ...``) and exits 1 instead of a traceback (see ``install``)."""


def _one_line(kind, exc, tb, _previous=sys.excepthook):
    if isinstance(exc, SelectorError):
        print(f"g2c: error: {exc}", file=sys.stderr)
    else:
        _previous(kind, exc, tb)


def install() -> list[str]:
    """Read ``G2C_APPLY_SOLUTIONS`` and install the finder. Returns the selected ids.

    Raises:
        SelectorError (a ValueError): the selector is malformed (the message lists the valid ids
            and says to fix or unset the variable); left uncaught in a script, it is one line on
            stderr and exit status 1, not a traceback (Jupyter and pytest show it as usual).
    """
    try:
        selected = parse_selection(os.environ.get(ENV_VAR, ""))
    except ValueError as exc:
        if sys.excepthook is sys.__excepthook__:
            sys.excepthook = _one_line
        raise SelectorError(f"{exc} (read from the environment: fix or unset {ENV_VAR})") from None
    for f in list(sys.meta_path):
        if isinstance(f, SolutionFinder):
            sys.meta_path.remove(f)
    if selected:
        sys.meta_path.insert(0, SolutionFinder(_solution_map(selected)))
        if os.environ.get("G2C_QUIET", "") not in ("1", "true", "yes"):
            print(f"g2c: using reference solutions for modules {', '.join(selected)} "
                  f"({ENV_VAR}={os.environ.get(ENV_VAR)!r}; G2C_QUIET=1 hides this)", file=sys.stderr)
            replaced = _replaced_own_work(selected)
            if replaced:
                print(f"g2c: this replaces your own code for module(s) {', '.join(replaced)}; to grade yours, run "
                      f"./test.sh {replaced[-1]} (the answer key only for what it needs that you have not edited)",
                      file=sys.stderr)
    return selected


def _replaced_own_work(selected: list[str]) -> list[str]:
    """Selected modules whose exercise files the student edited (advice only; never raises)."""
    try:
        from .scaffolds import worked_modules

        return [i for i in worked_modules() if i in selected]
    except Exception:  # an advisory line must never break `import g2c`
        return []


def loaded_course_modules() -> list[str]:
    """Dotted names of course-module files (registry-owned) already in ``sys.modules``."""
    names = set()
    for m in MODULES:
        for rel in m.files:
            parts = Path(rel).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.add(".".join(parts))
    return sorted(n for n in names if n in sys.modules)


def use_solutions(selector: str) -> list[str]:
    """Select the answer key from code, the way ``G2C_APPLY_SOLUTIONS`` does from the shell.

    Call it before importing any course module (``g2c.nn``, ``g2c.specdec``, ...): the hook
    decides which file a module is loaded from at import time, so a module already imported
    keeps the code it was loaded with. The selector is also written to the environment
    variable, so subprocesses (notebook kernels, pytest runs) inherit it.

    Args:
        selector: as ``G2C_APPLY_SOLUTIONS``: ``"all"``, ``"09,11,specdec"``, ``"01-11"``, ``""``.

    Returns:
        The selected module ids, in course order.

    Raises:
        ValueError: a malformed selector (the message lists the valid ids).
        RuntimeError: a course module is already imported; the message names them and says
            to call ``use_solutions`` first (or to set the environment variable before Python starts).
    """
    parse_selection(selector)  # raises on a malformed selector before anything changes
    loaded = loaded_course_modules()
    if loaded:
        raise RuntimeError(f"g2c.use_solutions({selector!r}) must run before any course module is imported, "
                           f"but these are loaded already: {', '.join(loaded)}. Call it first, or set "
                           f"{ENV_VAR} before Python starts.")
    os.environ[ENV_VAR] = selector
    return install()
