#!/usr/bin/env python3
"""Generate the student scaffolds under ``g2c/`` from the answer key under ``solutions/g2c/``.

Every block between a ``# BEGIN SOLUTION`` line and an ``# END SOLUTION`` line becomes a
``# TODO`` line plus ``raise NotImplementedError(...)`` at the same indent; everything else
(imports, docstrings, signatures, provided helpers) is copied unchanged.

    python scripts/scaffolds.py           # regenerate every scaffold
    python scripts/scaffolds.py --check   # exit 1, naming each stale file, if any differs
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from g2c.course import module_for_file  # noqa: E402

BEGIN = re.compile(r"^(\s*)# BEGIN SOLUTION\s*$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
DEF = re.compile(r"^(\s*)(?:async\s+)?def\s+(\w+)")
CLASS = re.compile(r"^(\s*)class\s+(\w+)")
REGENERATE = "python scripts/scaffolds.py"


def _qualname(lines: list[str], at: int, indent: int) -> str:
    """Qualified name of the function enclosing line ``at`` (e.g. ``LayerNorm.forward``)."""
    names: list[str] = []
    limit = indent
    for line in reversed(lines[:at]):
        m = DEF.match(line) or CLASS.match(line)
        if m and len(m.group(1)) < limit:
            names.append(m.group(2))
            limit = len(m.group(1))
            if limit == 0:
                break
    return ".".join(reversed(names)) or "<module>"


def scaffold_text(source: str, rel: str) -> str:
    """Return the scaffold for the solution text of repo-relative file ``rel`` (``g2c/...``)."""
    module = module_for_file(rel)
    if module is None:
        raise SystemExit(f"{rel}: no course module owns this file; add it to g2c/course/registry.py")
    lines = source.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = BEGIN.match(lines[i])
        if not m:
            if END.match(lines[i]):
                raise SystemExit(f"solutions/{rel}:{i + 1}: '# END SOLUTION' without a BEGIN")
            out.append(lines[i])
            i += 1
            continue
        indent = m.group(1)
        name = _qualname(lines, i, len(indent))
        j = i + 1
        while j < len(lines) and not END.match(lines[j]):
            if BEGIN.match(lines[j]):
                raise SystemExit(f"solutions/{rel}:{j + 1}: nested '# BEGIN SOLUTION'")
            j += 1
        if j == len(lines):
            raise SystemExit(f"solutions/{rel}:{i + 1}: '# BEGIN SOLUTION' without an END")
        out.append(f"{indent}# TODO: implement this (module {module.id}, see {module.lesson}).\n")
        out.append(
            f"{indent}raise NotImplementedError(\n"
            f"{indent}    \"module {module.id}: {name} in {rel} is not implemented yet. \"\n"
            f"{indent}    \"Write it, or run with G2C_APPLY_SOLUTIONS={module.id} "
            f"to use the reference solution.\"\n"
            f"{indent})\n"
        )
        i = j + 1
    return "".join(out)


def expected() -> dict[Path, str]:
    """Map each scaffold path to the text a fresh generation would write."""
    result = {}
    for sol in sorted((ROOT / "solutions" / "g2c").rglob("*.py")):
        rel = sol.relative_to(ROOT / "solutions").as_posix()
        result[ROOT / rel] = scaffold_text(sol.read_text(encoding="utf-8"), rel)
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 if a scaffold is stale")
    args = ap.parse_args(argv)
    stale = []
    for path, text in expected().items():
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        if args.check:
            stale.append(path.relative_to(ROOT).as_posix())
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path.relative_to(ROOT).as_posix()}")
    if stale:
        print("stale scaffolds (they differ from a fresh generation of solutions/):", file=sys.stderr)
        for s in stale:
            print(f"  {s}  <- solutions/{s}", file=sys.stderr)
        print(f"fix: run `{REGENERATE}` and commit the result", file=sys.stderr)
        return 1
    if args.check:
        print(f"scaffolds: {len(expected())} files up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
