#!/usr/bin/env python3
"""Two checkouts, one bench, runs interleaved: is a change within noise of the commit before it?

A refactoring must not cost speed, and a speed-up printed by one run and compared with another run
an hour later measures the machine's load as much as the code. This script runs the same bench
command in two checkouts alternately (A, B, A, B, ...), each run writing its numbers as JSON, and
prints, per row, the median speed-up over plain cached decoding that each bench measured inside its
own run (so every ratio is already "same process, same load"), and the ratio B / A of the medians.

    git worktree add /tmp/before 869377e          # the commit before the change (read-only use)
    .venv/bin/python bench/ab.py --a /tmp/before --b . --repeats 3 -- \\
        bench/lineage.py --fast --greedy-only --no-sweep --threads 1

The command after ``--`` is run as ``PYTHON COMMAND... --json FILE`` with the working directory set
to each checkout, the interpreter of this process, and ``PYTHONPATH`` set to the checkout (so each
run imports its own ``g2c``, ahead of the editable install in ``.venv``). Benches supported: any that
writes ``{"tables": {name: [row, ...]}}`` with rows holding ``drafter`` and ``speedup_cpu`` or
``speedup`` (``bench/lineage.py``); a flat ``{"rows": [...]}`` is read the same way. With
``--result-option=--out`` the bench writes a markdown table instead (``bench/specdec.py``): its
rows are keyed by their drafter, mode and k columns and compared on ``speed-up (CPU time)``.

    .venv/bin/python bench/ab.py --a /tmp/before --b . --result-option=--out -- \\
        bench/specdec.py --fast --threads 1 --drafters StoryLM-1M-distilled --ks 4

Exit status: 0; 2 on a bad option (argparse) or a checkout without the bench; 1 when a run fails
(its last lines are printed).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def rows_of(data: dict) -> dict[tuple[str, str], dict]:
    """Every row of a bench's JSON, keyed by (table, drafter)."""
    tables = data.get("tables") or {"": data.get("rows", [])}
    out = {}
    for name, rows in tables.items():
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and "drafter" in row:
                out[(name, str(row["drafter"]))] = row
    return out


def rows_of_markdown(text: str) -> dict[tuple[str, str], dict]:
    """The rows of the first markdown table whose header names ``drafter`` and a ``speed-up`` column."""
    lines = [line.strip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        cells = [c.strip() for c in line.strip("|").split("|")]
        if line.startswith("|") and "drafter" in cells and any(c.startswith("speed-up") for c in cells):
            out = {}
            for row in lines[i + 2:]:
                if not row.startswith("|"):
                    break
                values = dict(zip(cells, (c.strip() for c in row.strip("|").split("|"))))
                key = " ".join(f"{values[c]}" for c in ("drafter", "mode") if c in values)
                key += f" k={values['k']}" if "k" in values else ""
                numbers = {c.replace("speed-up (CPU time)", "speedup_cpu").replace("speed-up", "speedup"):
                           float(v.rstrip("x")) for c, v in values.items() if c.startswith("speed-up")}
                out[("", key)] = {"drafter": key, **numbers}
            return out
    return {}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--a", type=Path, required=True, help="the checkout before the change")
    ap.add_argument("--b", type=Path, required=True, help="the checkout after the change")
    ap.add_argument("--repeats", type=int, default=3, help="runs per checkout, interleaved (default 3)")
    ap.add_argument("--result-option", default="--json",
                    help="the bench's option that writes its result file: --json (default) or, written with "
                         "=, --result-option=--out (a markdown table)")
    ap.add_argument("--key", default=None, help="the row field to compare (default speedup_cpu, else speedup)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- bench/SCRIPT.py [its options]")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the bench command after --, e.g. -- bench/lineage.py --fast --greedy-only")
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    for side in (args.a, args.b):
        if not (side / command[0]).is_file():
            ap.error(f"{side} has no {command[0]}: --a and --b must be checkouts of the course")
    results: dict[str, list[dict]] = {"A": [], "B": []}
    with tempfile.TemporaryDirectory(prefix="g2c-ab-") as tmp:
        for i in range(args.repeats):
            for label, side in (("A", args.a), ("B", args.b)):
                out = Path(tmp) / f"{label}{i}.{'json' if args.result_option == '--json' else 'md'}"
                print(f"run {i + 1}/{args.repeats} {label} ({side})", flush=True)
                env = dict(os.environ, PYTHONPATH=str(side.resolve()))    # this checkout's g2c first
                proc = subprocess.run([sys.executable, *command, args.result_option, str(out)], cwd=side,
                                      capture_output=True, text=True, env=env)
                if proc.returncode != 0 or not out.is_file():
                    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-8:])
                    print(f"bench/ab.py: error: run {label}{i} exited {proc.returncode}:\n{tail}", file=sys.stderr)
                    return 1
                text = out.read_text()
                results[label].append(rows_of(json.loads(text)) if out.suffix == ".json" else rows_of_markdown(text))
    keys = [k for k in results["A"][0] if all(k in r for runs in results.values() for r in runs)]
    print(f"\n{' '.join(command)}; {args.repeats} runs per checkout, interleaved; A = {args.a}, B = {args.b}")
    print("| table | row | A (median) | B (median) | B / A |\n|---|---|---|---|---|")
    for key in keys:
        field = args.key or ("speedup_cpu" if "speedup_cpu" in results["A"][0][key] else "speedup")
        a = statistics.median(r[key][field] for r in results["A"])
        b = statistics.median(r[key][field] for r in results["B"])
        print(f"| {key[0]} | {key[1]} | {a:.2f}x | {b:.2f}x | {b / a:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
