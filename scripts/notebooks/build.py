#!/usr/bin/env python3
"""Build the course notebooks from their sources (CONVENTIONS §6).

Every module in the registry has ONE notebook source, ``solutions/notebooks/<stem>.py``, in
jupytext's percent format (``# %%`` code cells, ``# %% [markdown]`` markdown cells), where
``<stem>`` is the stem of the module's clean notebook (``notebooks/clean/<stem>.ipynb``).
From it this script generates:

- the clean notebook ``notebooks/clean/<stem>.ipynb`` (committed; what a student opens):
  every Answer cell reduced to ``**Answer:**`` and a blank line, rubrics removed, every code
  block between ``# BEGIN SOLUTION`` and ``# END SOLUTION`` replaced by a TODO comment and
  ``raise NotImplementedError("notebook exercise ...")`` at the same indent, no outputs,
  fixed metadata and cell ids (rebuilding is byte-identical);
- the solved twin (``--solved DIR``; not committed): answers kept, code blocks kept
  (marker lines included), rubrics only with ``--rubrics``. CI executes the solved twins
  (``scripts/run_notebooks.py``); ``./notebook.sh <id> --solutions`` opens one.

    python scripts/notebooks/build.py                        # write every clean notebook
    python scripts/notebooks/build.py specdec 03             # only these module ids
    python scripts/notebooks/build.py --check                # exit 1, naming each stale notebook
    python scripts/notebooks/build.py --solved /tmp/solved   # write <stem>.ipynb solved twins there
    python scripts/notebooks/build.py --solved DIR --rubrics # ... with the rubrics

Source format (written questions). A markdown cell starting ``**Question:**`` is followed by
a markdown cell whose first line is exactly ``**Answer:**``; in the source that cell holds
the worked answer between lines ``<!-- BEGIN ANSWER -->`` and ``<!-- END ANSWER -->``, then
a rubric (what a full answer contains, the numbers to expect on the shipped ladder) between
``<!-- BEGIN RUBRIC -->`` and ``<!-- END RUBRIC -->``, and nothing else. Code the student
writes sits between ``# BEGIN SOLUTION`` / ``# END SOLUTION`` lines in a code cell.
A source that breaks these rules is an error naming the file, the cell and the rule.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from g2c.assets.cli import output_dir  # noqa: E402
from g2c.course import MODULES, get_module  # noqa: E402

SOURCE_DIR = "solutions/notebooks"
BUILD_CMD = "python scripts/notebooks/build.py"

QUESTION = "**Question:**"
ANSWER = "**Answer:**"
BLANK_ANSWER = ANSWER + "\n\n"
ANSWER_BEGIN, ANSWER_END = "<!-- BEGIN ANSWER -->", "<!-- END ANSWER -->"
RUBRIC_BEGIN, RUBRIC_END = "<!-- BEGIN RUBRIC -->", "<!-- END RUBRIC -->"
MARKERS = (ANSWER_BEGIN, ANSWER_END, RUBRIC_BEGIN, RUBRIC_END)
CODE_BEGIN = re.compile(r"^(\s*)# BEGIN SOLUTION\s*$")
CODE_END = re.compile(r"^\s*# END SOLUTION\s*$")

KERNELSPEC = {"display_name": "Python 3", "language": "python", "name": "python3"}
METADATA = {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}


class SourceError(ValueError):
    """A notebook source breaks the format rules (the message names file, cell and rule)."""


# -- paths ------------------------------------------------------------------------------
def stem_of(module) -> str:
    """The notebook stem of a registry module, e.g. ``"03-nn"``."""
    return Path(module.notebook).stem


def source_path(module, *, root: Path = ROOT) -> Path:
    """``solutions/notebooks/<stem>.py`` of a registry module."""
    return root / SOURCE_DIR / f"{stem_of(module)}.py"


def clean_path(module, *, root: Path = ROOT) -> Path:
    """``notebooks/clean/<stem>.ipynb`` of a registry module."""
    return root / module.notebook


# -- parsing ------------------------------------------------------------------------------
def read_source(path: Path):
    """Parse a percent-format source into an nbformat notebook (cells only; metadata is ours).

    Raises:
        FileNotFoundError: the source does not exist (the message names the expected path).
    """
    import jupytext

    if not path.is_file():
        raise FileNotFoundError(f"notebook source {path} does not exist; write it in jupytext percent "
                                f"format (see {SOURCE_DIR}/ and docs/CONTRIBUTING.md)")
    return jupytext.reads(path.read_text(encoding="utf-8"), fmt="py:percent")


def _block(lines: list[str], begin: str, end: str, where: str) -> tuple[int, int]:
    """Indices (i, j) of the begin and end marker lines; raises SourceError unless exactly one pair."""
    starts = [i for i, line in enumerate(lines) if line.strip() == begin]
    ends = [i for i, line in enumerate(lines) if line.strip() == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise SourceError(f"{where}: the Answer cell needs exactly one '{begin}' line followed by one "
                          f"'{end}' line (found {len(starts)} and {len(ends)})")
    return starts[0], ends[0]


def split_answer(text: str, where: str) -> tuple[str, str]:
    """(answer, rubric) of a source Answer cell, markers removed and stripped.

    Raises:
        SourceError: the first line is not exactly ``**Answer:**``, a block is missing, empty,
            repeated or out of order, or text sits outside the two blocks (it would leak into
            the clean notebook otherwise).
    """
    lines = text.strip("\n").split("\n")
    if lines[0].strip() != ANSWER:
        raise SourceError(f"{where}: an Answer cell's first line must be exactly '{ANSWER}' "
                          f"(put the worked answer between {ANSWER_BEGIN} and {ANSWER_END})")
    a0, a1 = _block(lines, ANSWER_BEGIN, ANSWER_END, where)
    r0, r1 = _block(lines, RUBRIC_BEGIN, RUBRIC_END, where)
    if not a1 < r0:
        raise SourceError(f"{where}: the rubric block must follow the answer block")
    outside = lines[1:a0] + lines[a1 + 1:r0] + lines[r1 + 1:]
    if any(line.strip() for line in outside):
        raise SourceError(f"{where}: text outside the ANSWER/RUBRIC blocks of an Answer cell: "
                          f"{next(line for line in outside if line.strip())!r}")
    answer = "\n".join(lines[a0 + 1:a1]).strip()
    rubric = "\n".join(lines[r0 + 1:r1]).strip()
    if not answer or not rubric:
        raise SourceError(f"{where}: empty {'answer' if not answer else 'rubric'} block")
    return answer, rubric


def blank_code(text: str, where: str, *, module_id: str) -> str:
    """Replace every ``# BEGIN SOLUTION`` .. ``# END SOLUTION`` block of a code cell by a TODO
    and ``raise NotImplementedError`` at the marker's indent.

    Raises:
        SourceError: a marker without its partner, or nested BEGIN markers.
    """
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = CODE_BEGIN.match(lines[i])
        if not m:
            if CODE_END.match(lines[i]):
                raise SourceError(f"{where}: '# END SOLUTION' without a BEGIN")
            out.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not CODE_END.match(lines[j]):
            if CODE_BEGIN.match(lines[j]):
                raise SourceError(f"{where}: nested '# BEGIN SOLUTION'")
            j += 1
        if j == len(lines):
            raise SourceError(f"{where}: '# BEGIN SOLUTION' without an END")
        indent = m.group(1)
        out.append(f"{indent}# TODO: your code here (notebook exercise; the text above says what to write).")
        out.append(f"{indent}raise NotImplementedError(\"notebook exercise: write the code marked TODO in this "
                   f"cell (worked version: ./notebook.sh {module_id} --solutions)\")")
        i = j + 1
    return "\n".join(out)


# -- building -----------------------------------------------------------------------------
def build_notebook(source_nb, *, module_id: str, solved: bool = False, rubrics: bool = False,
                   name: str = "<source>"):
    """The clean (default) or solved notebook for a parsed source.

    Args:
        source_nb: the notebook ``read_source`` returned (not modified).
        module_id: the registry id (named in the exercise stubs).
        solved: keep answers and code (the solved twin) instead of blanking them.
        rubrics: with ``solved``, append each rubric under its answer.
        name: the source's name, for error messages.

    Raises:
        SourceError: the source breaks a format rule (see the module docstring).
    """
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata = copy.deepcopy(METADATA)
    previous = None
    for index, cell in enumerate(source_nb.cells):
        where = f"{name}: cell {index + 1}"
        text = cell.source
        meta = {k: v for k, v in cell.get("metadata", {}).items() if k not in ("id", "lines_to_next_cell")}
        if cell.cell_type == "markdown":
            first = text.lstrip("\n").split("\n", 1)[0]
            if first.startswith(ANSWER):
                if previous is None or previous.cell_type != "markdown" \
                        or not previous.source.lstrip().startswith(QUESTION):
                    raise SourceError(f"{where}: an Answer cell must follow a '{QUESTION}' markdown cell")
                answer, rubric = split_answer(text, where)
                if not solved:
                    text = BLANK_ANSWER
                else:
                    text = f"{ANSWER}\n\n{answer}"
                    if rubrics:
                        text += f"\n\n**Rubric** (for grading):\n\n{rubric}"
            elif first.startswith(QUESTION):
                nxt = source_nb.cells[index + 1] if index + 1 < len(source_nb.cells) else None
                if nxt is None or nxt.cell_type != "markdown" or not nxt.source.lstrip().startswith(ANSWER):
                    raise SourceError(f"{where}: a Question cell must be followed by an '{ANSWER}' cell")
            if not first.startswith(ANSWER) and any(marker in text for marker in MARKERS):
                raise SourceError(f"{where}: answer/rubric markers outside an Answer cell")
            new = nbformat.v4.new_markdown_cell(text, metadata=meta)
        elif cell.cell_type == "code":
            if not solved:
                text = blank_code(text, where, module_id=module_id)
            else:
                blank_code(text, where, module_id=module_id)  # validate the markers either way
            new = nbformat.v4.new_code_cell(text, metadata=meta)
        else:
            new = nbformat.v4.new_raw_cell(text, metadata=meta)
        new["id"] = f"cell-{index + 1:02d}"
        nb.cells.append(new)
        previous = cell
    return nb


def notebook_text(nb) -> str:
    """The exact bytes (as text) a built notebook is written with."""
    import nbformat

    nbformat.validate(nb)
    return nbformat.writes(nb, version=4) + "\n"  # indent 1, sorted keys, sources split into lines


def build_module(module, *, solved: bool = False, rubrics: bool = False, root: Path = ROOT) -> str:
    """The clean (or solved) notebook text of one registry module, built from its source."""
    path = source_path(module, root=root)
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    nb = build_notebook(read_source(path), module_id=module.id, solved=solved, rubrics=rubrics, name=rel)
    return notebook_text(nb)


def write_solved(module, out_dir: Path, *, rubrics: bool = False, root: Path = ROOT,
                 name: str | None = None) -> Path:
    """Write the solved twin of ``module`` to ``out_dir / (name or <stem>.ipynb)``; return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / (name or f"{stem_of(module)}.ipynb")
    out.write_text(build_module(module, solved=True, rubrics=rubrics, root=root), encoding="utf-8")
    return out


def stale_notebooks(modules=MODULES, *, root: Path = ROOT) -> list[str]:
    """One line per module whose clean notebook is missing, stale or has no source ([] = fresh)."""
    problems = []
    for module in modules:
        src, clean = source_path(module, root=root), clean_path(module, root=root)
        if not src.is_file():
            problems.append(f"module {module.id}: no notebook source {src.relative_to(root).as_posix()}")
            continue
        want = build_module(module, root=root)
        have = clean.read_text(encoding="utf-8") if clean.is_file() else None
        if have != want:
            state = "missing" if have is None else "stale"
            problems.append(f"{module.notebook} is {state} (source {src.relative_to(root).as_posix()}); "
                            f"run: {BUILD_CMD} {module.id}")
    return problems


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("ids", nargs="*", help="module ids (default: every module in the registry)")
    ap.add_argument("--check", action="store_true", help="exit 1 if a clean notebook differs from a fresh build")
    ap.add_argument("--solved", type=output_dir(as_path=True), metavar="DIR",
                    help="write the solved twins to DIR instead")
    ap.add_argument("--rubrics", action="store_true", help="with --solved: keep the rubrics under the answers")
    args = ap.parse_args(argv)
    try:
        modules = [get_module(i) for i in args.ids] if args.ids else list(MODULES)
        if args.check:
            problems = stale_notebooks(modules)
            for line in problems:
                print(line, file=sys.stderr)
            if problems:
                print(f"notebooks: {len(problems)} stale; regenerate with: {BUILD_CMD}", file=sys.stderr)
                return 1
            print(f"notebooks: {len(modules)} clean notebooks match their sources")
            return 0
        for module in modules:
            if args.solved is not None:
                out = write_solved(module, args.solved, rubrics=args.rubrics)
            else:
                out = clean_path(module)
                text = build_module(module)
                if out.is_file() and out.read_text(encoding="utf-8") == text:
                    continue
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(text, encoding="utf-8")
            print(f"wrote {out.relative_to(ROOT).as_posix() if out.is_relative_to(ROOT) else out}")
    except (ValueError, FileNotFoundError) as err:
        print(f"build.py: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
