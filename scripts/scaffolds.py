#!/usr/bin/env python3
"""Generate the student scaffolds under ``g2c/`` from the answer key under ``solutions/g2c/``.

Every block between a ``# BEGIN SOLUTION`` line and an ``# END SOLUTION`` line becomes a
``# TODO`` line plus ``raise NotImplementedError(...)`` at the same indent; everything else
(imports, docstrings, signatures, provided helpers) is copied unchanged (the generator is
``g2c/course/scaffolds.py``).

    python scripts/scaffolds.py           # regenerate every scaffold (never over your own work)
    python scripts/scaffolds.py --force   # ... replacing edited files too, after a backup
    python scripts/scaffolds.py --check   # exit 1, naming each stale file, if any differs

A scaffold is replaced only when it is still the previous generation (its sha256 is the one
recorded in ``solutions/generated.json``). A file you edited is left alone and named; with
``--force`` it is first copied to ``.g2c-backup/<YYYYmmdd-HHMMSS>/...`` (ignored by git).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from g2c.course.scaffolds import (  # noqa: E402
    BACKUP_DIR,
    HEADER,
    LINT,
    RECORD,
    REGENERATE,
    backup,
    expected,
    record_text,
    scaffold_text,
    status,
)

__all__ = ["HEADER", "LINT", "expected", "main", "scaffold_text"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 if a scaffold is stale")
    ap.add_argument("--force", action="store_true",
                    help=f"also replace files you edited (each is first copied under {BACKUP_DIR}/)")
    args = ap.parse_args(argv)
    fresh = expected(ROOT)
    states = {s.rel: s for s in status(ROOT, fresh)}
    record = ROOT / RECORD
    rec_text = record_text(fresh, ROOT)
    if args.check:
        stale = [rel for rel, s in states.items() if s.state != "fresh"]
        record_stale = not record.is_file() or record.read_text(encoding="utf-8") != rec_text
        if stale or record_stale:
            print("stale scaffolds (they differ from a fresh generation of solutions/):", file=sys.stderr)
            for rel in stale:
                note = " (edited by hand: your own work? --force backs it up first)" \
                    if states[rel].state == "edited" else ""
                print(f"  {rel}  <- solutions/{rel}{note}", file=sys.stderr)
            if record_stale:
                print(f"  {RECORD}  (the record of the last generation)", file=sys.stderr)
            if any(states[rel].state == "edited" for rel in stale):   # a student's own work: not a stale scaffold
                print("your edited exercise files differ from the scaffolds, as they should: --check is the course "
                      "authors' freshness check; grade your work with ./test.sh ID", file=sys.stderr)
            if any(states[rel].state != "edited" for rel in stale) or record_stale:
                print(f"fix (course authors): run `{REGENERATE}` and commit the result", file=sys.stderr)
            return 1
        print(f"scaffolds: {len(fresh)} files up to date")
        return 0

    stamp = time.strftime("%Y%m%d-%H%M%S")
    kept, backups = [], []
    for path, text in fresh.items():
        rel = path.relative_to(ROOT).as_posix()
        state = states[rel].state
        if state == "fresh":
            continue
        if state == "edited":
            if not args.force:
                kept.append(states[rel])
                continue
            backups.append((rel, backup(path, ROOT, stamp)))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {rel}")
    if not record.is_file() or record.read_text(encoding="utf-8") != rec_text:
        record.write_text(rec_text, encoding="utf-8")
        print(f"wrote {RECORD}")
    if backups:
        print(f"backed up {len(backups)} edited file(s) before replacing them:")
        for rel, copy in backups:
            print(f"  {rel} -> {copy.relative_to(ROOT).as_posix()}")
    if kept:
        print("not overwritten: these files differ from the generated scaffold (your own work?):", file=sys.stderr)
        for s in kept:
            print(f"  {s.rel}  (module {s.module})", file=sys.stderr)
        print(f"`{REGENERATE} --force` replaces them after copying each to {BACKUP_DIR}/<timestamp>/",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
