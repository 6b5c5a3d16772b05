"""Notebook sources and the builder (CONVENTIONS §6): clean notebooks hold no answers.

Every registry module has one source ``solutions/notebooks/<stem>.py``; the committed clean
notebook is exactly its blanked build; no clean notebook contains answer text, a rubric, a
marker, exercise code or outputs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import textwrap
from pathlib import Path

import nbformat
import pytest

from g2c.course import MODULES, REPO_ROOT, get_module

_spec = importlib.util.spec_from_file_location("g2c_notebook_build", REPO_ROOT / "scripts" / "notebooks" / "build.py")
build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(build)

IDS = [m.id for m in MODULES]
MARKER_WORDS = ("BEGIN ANSWER", "END ANSWER", "BEGIN RUBRIC", "END RUBRIC", "BEGIN SOLUTION", "END SOLUTION")


def _clean(module):
    return nbformat.read(REPO_ROOT / module.notebook, as_version=4)


@pytest.mark.parametrize("module_id", IDS)
def test_every_module_has_a_notebook_source(module_id):
    path = build.source_path(get_module(module_id))
    assert path.is_file(), f"module {module_id} has no notebook source {path.relative_to(REPO_ROOT)}"


@pytest.mark.parametrize("module_id", IDS)
def test_clean_notebook_is_the_fresh_build_of_its_source(module_id):
    assert build.stale_notebooks([get_module(module_id)]) == []


@pytest.mark.parametrize("module_id", IDS)
def test_clean_notebook_contains_no_answer_text(module_id):
    module = get_module(module_id)
    nb = _clean(module)
    text = (REPO_ROOT / module.notebook).read_text(encoding="utf-8")
    for word in MARKER_WORDS:
        assert word not in text, f"{module.notebook} contains the marker {word!r}"
    assert "Rubric" not in text and "RUBRIC" not in text
    answers = [c for c in nb.cells if c.cell_type == "markdown" and c.source.lstrip().startswith("**Answer:**")]
    questions = [c for c in nb.cells if c.cell_type == "markdown" and c.source.lstrip().startswith("**Question:**")]
    assert questions, f"{module.notebook} asks no written question"
    assert len(answers) == len(questions)
    for cell in answers:
        assert cell.source.strip() == "**Answer:**", f"{module.notebook}: an Answer cell is not blank"
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, f"{module.notebook} stores outputs"


@pytest.mark.parametrize("module_id", IDS)
def test_source_answers_and_rubrics_are_absent_from_the_clean_notebook(module_id):
    module = get_module(module_id)
    source = build.read_source(build.source_path(module))
    text = (REPO_ROOT / module.notebook).read_text(encoding="utf-8")
    for i, cell in enumerate(source.cells):
        if cell.cell_type == "markdown" and cell.source.lstrip().startswith("**Answer:**"):
            answer, rubric = build.split_answer(cell.source, f"cell {i + 1}")
            assert "RUBRIC TODO" not in rubric, f"{module_id}: cell {i + 1} has no rubric yet"
            for part in (answer, rubric):
                first = json.dumps(part.splitlines()[0])[1:-1]  # as the JSON stores it
                assert first not in text, f"{module.notebook} leaks {part.splitlines()[0]!r}"


def test_specdec_notebook_has_a_code_exercise():
    nb = _clean(get_module("specdec"))
    stubs = [c for c in nb.cells
             if c.cell_type == "code" and "raise NotImplementedError(\"notebook exercise" in c.source]
    assert stubs, "the specdec notebook's self-speculation loop should be a code exercise"


# -- the builder on small sources ---------------------------------------------------------
SOURCE = textwrap.dedent('''\
    # %% [markdown]
    # # Title

    # %%
    x = 1
    def f(y):
        # BEGIN SOLUTION
        z = y + x
        return z
        # END SOLUTION

    # %% [markdown]
    # **Question:** Why?

    # %% [markdown]
    # **Answer:**
    #
    # <!-- BEGIN ANSWER -->
    # Because 42.
    # <!-- END ANSWER -->
    #
    # <!-- BEGIN RUBRIC -->
    # Names 42.
    # <!-- END RUBRIC -->
    ''')


def _nb(text):
    import jupytext

    return jupytext.reads(text, fmt="py:percent")


def test_build_clean_blanks_answers_rubrics_and_code_keeping_indent():
    nb = build.build_notebook(_nb(SOURCE), module_id="03", name="t.py")
    code = nb.cells[1].source.split("\n")
    assert code[:2] == ["x = 1", "def f(y):"]
    assert code[2].startswith("    # TODO") and code[3].startswith("    raise NotImplementedError(\"notebook exercise")
    assert "./notebook.sh 03 --solutions" in code[3] and len(code) == 4
    assert nb.cells[3].source == "**Answer:**\n\n"
    text = build.notebook_text(nb)
    assert "42" not in text and "y + x" not in text


def test_build_solved_keeps_answers_and_code_rubrics_on_request():
    solved = build.build_notebook(_nb(SOURCE), module_id="03", solved=True, name="t.py")
    assert "z = y + x" in solved.cells[1].source
    assert solved.cells[3].source == "**Answer:**\n\nBecause 42."
    graded = build.build_notebook(_nb(SOURCE), module_id="03", solved=True, rubrics=True, name="t.py")
    assert "Because 42." in graded.cells[3].source and "Names 42." in graded.cells[3].source
    assert "<!--" not in graded.cells[3].source


def test_build_is_deterministic_with_fixed_ids_and_metadata():
    one = build.notebook_text(build.build_notebook(_nb(SOURCE), module_id="03", name="t.py"))
    two = build.notebook_text(build.build_notebook(_nb(SOURCE), module_id="03", name="t.py"))
    assert one == two
    nb = json.loads(one)
    assert [c["id"] for c in nb["cells"]] == ["cell-01", "cell-02", "cell-03", "cell-04"]
    assert nb["metadata"] == build.METADATA


@pytest.mark.parametrize("broken, match", [
    (SOURCE.replace("# **Answer:**\n", "# **Answer:** Because 42.\n"), r"cell 4: an Answer cell's first line"),
    (SOURCE.replace("# <!-- BEGIN RUBRIC -->\n# Names 42.\n# <!-- END RUBRIC -->\n", ""), r"cell 4: .*BEGIN RUBRIC"),
    (SOURCE.replace("# <!-- END ANSWER -->\n", "# <!-- END ANSWER -->\n# leaked\n"), r"text outside .*'leaked'"),
    (SOURCE.replace("# **Question:** Why?", "# Why?"), r"cell 4: an Answer cell must follow a '\*\*Question:\*\*'"),
    (SOURCE.replace("    # END SOLUTION\n", ""), r"cell 2: '# BEGIN SOLUTION' without an END"),
    (SOURCE.replace("# **Answer:**\n#\n", "# Not an answer\n#\n"), r"cell 3: a Question cell must be followed"),
])
def test_build_rejects_malformed_sources_naming_cell_and_rule(broken, match):
    with pytest.raises(build.SourceError, match=match):
        build.build_notebook(_nb(broken), module_id="03", name="t.py")


def test_check_names_the_stale_notebook_and_the_command(tmp_path: Path):
    module = get_module("03")
    src = tmp_path / build.SOURCE_DIR / f"{build.stem_of(module)}.py"
    src.parent.mkdir(parents=True)
    src.write_text(SOURCE)
    assert build.stale_notebooks([module], root=tmp_path) == [
        f"{module.notebook} is missing (source {build.SOURCE_DIR}/{src.name}); run: {build.BUILD_CMD} 03"]
    clean = tmp_path / module.notebook
    clean.parent.mkdir(parents=True)
    clean.write_text(build.build_module(module, root=tmp_path))
    assert build.stale_notebooks([module], root=tmp_path) == []
    src.write_text(SOURCE.replace("x = 1", "x = 2"))
    assert build.stale_notebooks([module], root=tmp_path) == [
        f"{module.notebook} is stale (source {build.SOURCE_DIR}/{src.name}); run: {build.BUILD_CMD} 03"]
    src.unlink()
    assert build.stale_notebooks([module], root=tmp_path) == [
        f"module 03: no notebook source {build.SOURCE_DIR}/{src.name}"]


def test_run_notebooks_caps_jobs_at_the_notebooks_and_cores(tmp_path, monkeypatch, capsys):
    """A helper's trial: ``--jobs 999`` started as many kernels as asked for (each loads its models); the
    runner caps the jobs at the notebooks it has and the usable cores, and says so."""
    spec = importlib.util.spec_from_file_location("g2c_run_notebooks", REPO_ROOT / "scripts" / "run_notebooks.py")
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    for key, value in {**runner.NOTEBOOK_ENV, "PATH": os.environ.get("PATH", "")}.items():
        monkeypatch.setenv(key, value)          # main() exports these for its kernels: restored afterwards
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1 + 1")])
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, path)
    assert runner.main([str(path), "--jobs", "999", "--timeout", "120"]) == 0
    out = capsys.readouterr().out
    assert "--jobs 999 capped at 1 (1 notebook(s)" in out and "ok    " in out, out
    with pytest.raises(SystemExit) as info:                                      # below 1: refused at parse time
        runner.main([str(path), "--jobs", "0"])
    assert info.value.code == 2 and "argument --jobs/-j: 0 is below 1" in capsys.readouterr().err
