#!/usr/bin/env python3
"""Print the README's module table and module graph from the course registry (g2c/course/registry.py).

    python scripts/readme_table.py            # print the table and the graph
    python scripts/readme_table.py --write    # replace both between the README markers, and the layer
                                              # map of docs/CONTRIBUTING.md
    python scripts/readme_table.py --check    # exit 1 if the README's copies are stale
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from g2c.course import MODULES  # noqa: E402

BEGIN, END = "<!-- modules:begin -->", "<!-- modules:end -->"
GRAPH_BEGIN, GRAPH_END = "<!-- graph:begin -->", "<!-- graph:end -->"
LAYERS_BEGIN, LAYERS_END = "<!-- layers:begin -->", "<!-- layers:end -->"


def code_folder(files: tuple[str, ...]) -> str:
    """The folder that holds a module's files (``g2c/specdec/sampling`` for specdec-sampling)."""
    return os.path.commonpath([str(Path(f).parent) for f in files]).replace(os.sep, "/")


def table() -> str:
    """The markdown table: id, title, what it needs, its folder, lesson, the grading command, notebook."""
    rows = ["| id | module | needs | code | lesson | grade | notebook |", "|---|---|---|---|---|---|---|"]
    for m in MODULES:
        needs = ", ".join(m.requires) or "-"
        lesson = f"[{Path(m.lesson).name}]({m.lesson})"
        rows.append(f"| {m.id} | {m.title} | {needs} | `{code_folder(m.files)}` | {lesson} | "
                    f"`./test.sh {m.id}` | `./notebook.sh {m.id}` |")
    return "\n".join(rows) + "\n"


def graph() -> str:
    """The module graph as a mermaid flowchart: an arrow from each module to every module it requires."""
    def node(i: str) -> str:
        return "m_" + re.sub(r"[^0-9a-z]", "_", i)

    lines = ["```mermaid", "flowchart BT"]
    for m in MODULES:
        lines.append(f'    {node(m.id)}["{m.id}"]')
    for m in MODULES:
        for r in m.requires:
            lines.append(f"    {node(m.id)} --> {node(r)}")
    lines.append("```")
    return "\n".join(lines) + "\n"


def layers() -> str:
    """docs/CONTRIBUTING.md's map of the layers, the module rows generated from the registry."""
    numbered = [m for m in MODULES if not m.beyond]
    beyond = [m for m in MODULES if m.beyond]
    width = max(len(m.id) for m in MODULES)

    def rows(mods):
        return [f"    {m.id.ljust(width)}  {code_folder(m.files) + '/':<22} needs {', '.join(m.requires) or '-'}"
                for m in mods]

    lines = ["```",
             "course mechanics     g2c/course/ (registry, solutions hook, grading, notebooks), scripts/,",
             "                     test.sh, notebook.sh, setup.sh: serve every layer below, imported by none",
             "        |",
             "numbered modules     the course stack; import only numbered modules (and torch)",
             *rows(numbered),
             "        |  (nothing numbered imports what follows)",
             "Beyond modules       each after the seed's specdec owns one folder; import numbered modules and the",
             "                     Beyond modules they need",
             *rows(beyond),
             "        |",
             "assets, bench,       g2c/assets/ (artifacts, data, checkpoints; recipes/ trains every shipped model),",
             "scripts              bench/*.py (measurements), scripts/*.py (author tools): use any layer above",
             "```"]
    return "\n".join(lines) + "\n"


def _replace(text: str, begin: str, end: str, body: str) -> str:
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md: markers {begin} / {end} not found")
    return pattern.sub(lambda _: f"{begin}\n{body}{end}", text)


def readme_with_table(text: str) -> str:
    """``text`` with the blocks between the markers replaced by a fresh table and graph."""
    return _replace(_replace(text, BEGIN, END, table()), GRAPH_BEGIN, GRAPH_END, graph())


def contributing_with_layers(text: str) -> str:
    """``text`` (docs/CONTRIBUTING.md) with the layer map between its markers regenerated."""
    return _replace(text, LAYERS_BEGIN, LAYERS_END, layers())


def main(argv: list[str]) -> int:
    readme = ROOT / "README.md"
    contributing = ROOT / "docs" / "CONTRIBUTING.md"
    if "--write" in argv:
        readme.write_text(readme_with_table(readme.read_text(encoding="utf-8")), encoding="utf-8")
        contributing.write_text(contributing_with_layers(contributing.read_text(encoding="utf-8")), encoding="utf-8")
        print("README.md: module table and graph updated; docs/CONTRIBUTING.md: layer map updated")
    elif "--check" in argv:
        text = readme.read_text(encoding="utf-8")
        other = contributing.read_text(encoding="utf-8")
        if readme_with_table(text) != text or contributing_with_layers(other) != other:
            print("README.md or docs/CONTRIBUTING.md is stale; run python scripts/readme_table.py --write")
            return 1
        print("README.md: module table and graph up to date; docs/CONTRIBUTING.md: layer map up to date")
    else:
        sys.stdout.write(table() + "\n" + graph())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
