#!/usr/bin/env python3
"""Print the README's module table from the course registry (g2c/course/registry.py).

    python scripts/readme_table.py            # print the table
    python scripts/readme_table.py --write    # replace the table between the README markers
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from g2c.course import MODULES  # noqa: E402

BEGIN, END = "<!-- modules:begin -->", "<!-- modules:end -->"


def table() -> str:
    """The markdown table: id, title, package, lesson, notebook."""
    rows = ["| id | module | code | lesson | notebook |", "|---|---|---|---|---|"]
    for m in MODULES:
        packages = sorted({"/".join(f.split("/")[:2]) for f in m.files})
        code = ", ".join(f"`{p}`" for p in packages)
        rows.append(f"| {m.id} | {m.title} | {code} | [{Path(m.lesson).name}]({m.lesson}) | "
                    f"`./notebook.sh {m.id}` |")
    return "\n".join(rows) + "\n"


def readme_with_table(text: str) -> str:
    """``text`` with the block between the markers replaced by a fresh table."""
    pattern = re.compile(re.escape(BEGIN) + r"\n.*?" + re.escape(END), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md: markers {BEGIN} / {END} not found")
    return pattern.sub(lambda _: f"{BEGIN}\n{table()}{END}", text)


def main(argv: list[str]) -> int:
    if "--write" in argv:
        readme = ROOT / "README.md"
        readme.write_text(readme_with_table(readme.read_text(encoding="utf-8")), encoding="utf-8")
        print("README.md: module table updated")
    else:
        sys.stdout.write(table())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
