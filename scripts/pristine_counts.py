#!/usr/bin/env python3
"""Print how many tests of a module pass and fail on the untouched scaffold, per test file, from the
recorded contract (``tests/pristine.json``, written by ``python scripts/contract.py --record``).

The lessons do not state these counts: they went stale each time a test was added. They point here.

    python scripts/pristine_counts.py specdec-sampling     # one module
    python scripts/pristine_counts.py                      # every module

Output, one line per test file, then the module's total::

    specdec-sampling
      tests/test_specdec_cached.py: P pass, F fail
      ...
      total: P pass, F fail (the passing ones test provided code)

Exit status 2 for an id that is not a module (the error lists the ids), 1 when a module's test file
has no record (run ``python scripts/contract.py --record`` first).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from g2c.course import MODULES, module_ids  # noqa: E402

PRISTINE = ROOT / "tests" / "pristine.json"


def counts(module_id: str, record: dict | None = None) -> list[tuple[str, int, int]]:
    """``[(test_file, passed, failed), ...]`` for one module, in the registry's order of its test files.

    Raises ``KeyError`` for an unknown module id and ``LookupError`` for a test file without a record.
    """
    record = json.loads(PRISTINE.read_text(encoding="utf-8")) if record is None else record
    by_id = {m.id: m for m in MODULES}
    if module_id not in by_id:
        raise KeyError(f"no module {module_id!r}; the modules are {', '.join(module_ids())}")
    rows = []
    for test_file in by_id[module_id].tests:
        if test_file not in record:
            raise LookupError(f"{test_file} has no record in {PRISTINE.relative_to(ROOT)}: "
                              "run `python scripts/contract.py --record` first")
        rows.append((test_file, record[test_file]["passed"], record[test_file]["failed"]))
    return rows


def render(module_id: str, record: dict | None = None) -> str:
    rows = counts(module_id, record)
    lines = [module_id] + [f"  {t}: {p} pass, {f} fail" for t, p, f in rows]
    lines.append(f"  total: {sum(r[1] for r in rows)} pass, {sum(r[2] for r in rows)} fail "
                 "(the passing ones test provided code)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ids", nargs="*", metavar="ID", help="module ids (default: every module)")
    args = ap.parse_args(argv)
    try:
        print("\n".join(render(i) for i in (args.ids or module_ids())))
    except KeyError as e:
        print(f"pristine_counts: {e.args[0]}", file=sys.stderr)
        return 2
    except LookupError as e:
        print(f"pristine_counts: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
