#!/usr/bin/env python3
"""Print the README's module table, module graph and shipped-artifact counts from the registries
(g2c/course/registry.py for the modules, g2c/assets for the artifacts: ``checkpoints.all_names``,
``artifacts.DRAFTERS``), so the README cannot go stale.

    python scripts/readme_table.py            # print the table and the graph
    python scripts/readme_table.py --write    # replace them between the README markers, and the layer
                                              # map of docs/CONTRIBUTING.md
    python scripts/readme_table.py --check    # exit 1 if the README's copies are stale
"""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from g2c.course import MODULES  # noqa: E402

BEGIN, END = "<!-- modules:begin -->", "<!-- modules:end -->"
GRAPH_BEGIN, GRAPH_END = "<!-- graph:begin -->", "<!-- graph:end -->"
LAYERS_BEGIN, LAYERS_END = "<!-- layers:begin -->", "<!-- layers:end -->"
ARTIFACTS_BEGIN, ARTIFACTS_END = "<!-- artifacts:begin -->", "<!-- artifacts:end -->"
NUMBER_WORDS = ("no", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven",
                "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen", "twenty")


def number_word(n: int) -> str:
    return NUMBER_WORDS[n] if 0 <= n < len(NUMBER_WORDS) else str(n)


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


def artifacts() -> str:
    """The README's paragraph on the shipped artifacts and the ``./checkpoints.sh`` block: the counts and
    names come from ``g2c.assets`` (the corpus, the tokenizer, the ladder, ``DRAFTERS``)."""
    from g2c.assets.artifacts import CORPUS_NAMES, DRAFTERS, TOKENIZER_NAMES, model_names
    from g2c.assets.checkpoints import all_names

    ladder = model_names()
    sizes = [n.removeprefix("StoryLM") for n in ladder]
    models = f"StoryLM{sizes[0]}" if len(sizes) == 1 else \
        f"StoryLM{', '.join(sizes[:-1])} and {sizes[-1]}"             # StoryLM-1M, -5M and -30M
    drafters = list(DRAFTERS)
    assert CORPUS_NAMES == ("TinyStories-sample",) and TOKENIZER_NAMES == ("StoryTokenizer",), \
        "scripts/readme_table.py: describe the new corpus or tokenizer in artifacts()"
    total = len(all_names())
    paragraph = (f"The TinyStories sample, the StoryTokenizer, the {models} models and "
                 f"{number_word(len(drafters))} drafters trained against them ({', '.join(drafters)}) ship in "
                 f"`artifacts/`, {number_word(total)} artifacts in all, each with a manifest of sha256 checksums "
                 "(see [docs/models.md](docs/models.md)). `./checkpoints.sh` checks them:")
    lines = [*textwrap.wrap(paragraph, 95, break_on_hyphens=False, break_long_words=False),
             "",
             "```bash",
             f"./checkpoints.sh                        # verify all {number_word(total)}, one line each; "
             "exit 0 iff all OK",
             "./checkpoints.sh --from /path/to/mirror # install from a folder laid out like artifacts/",
             "G2C_ARTIFACTS_URL=https://host/g2c ./checkpoints.sh   # download missing or corrupted ones",
             f"./checkpoints.sh --train {ladder[0]}     # retrain one with its recorded recipe (--force: from scratch)",
             "```"]
    return "\n".join(lines) + "\n"


def _replace(text: str, begin: str, end: str, body: str) -> str:
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"README.md: markers {begin} / {end} not found")
    return pattern.sub(lambda _: f"{begin}\n{body}{end}", text)


def readme_with_table(text: str) -> str:
    """``text`` with the blocks between the markers replaced by a fresh table, graph and artifact counts."""
    text = _replace(_replace(text, BEGIN, END, table()), GRAPH_BEGIN, GRAPH_END, graph())
    return _replace(text, ARTIFACTS_BEGIN, ARTIFACTS_END, artifacts())


def contributing_with_layers(text: str) -> str:
    """``text`` (docs/CONTRIBUTING.md) with the layer map between its markers regenerated."""
    return _replace(text, LAYERS_BEGIN, LAYERS_END, layers())


def main(argv: list[str]) -> int:
    readme = ROOT / "README.md"
    contributing = ROOT / "docs" / "CONTRIBUTING.md"
    if "--write" in argv:
        readme.write_text(readme_with_table(readme.read_text(encoding="utf-8")), encoding="utf-8")
        contributing.write_text(contributing_with_layers(contributing.read_text(encoding="utf-8")), encoding="utf-8")
        print("README.md: module table, graph and artifact counts updated; docs/CONTRIBUTING.md: layer map updated")
    elif "--check" in argv:
        text = readme.read_text(encoding="utf-8")
        other = contributing.read_text(encoding="utf-8")
        if readme_with_table(text) != text or contributing_with_layers(other) != other:
            print("README.md or docs/CONTRIBUTING.md is stale; run python scripts/readme_table.py --write")
            return 1
        print("README.md: module table, graph and artifact counts up to date; docs/CONTRIBUTING.md: layer map "
              "up to date")
    else:
        sys.stdout.write(table() + "\n" + graph() + "\n" + artifacts())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
