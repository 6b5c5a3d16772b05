"""./notebook.sh: working copies, --fresh archives, selector handling (no Jupyter started)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from g2c.course import REPO_ROOT, get_module, module_ids
from g2c.course.notebooks import launch_env, main, prepare_working_copy, working_copy_path


def _nb(tag: str) -> str:
    """A minimal notebook (it must parse: a copy that does not is backed up, issue 31)."""
    return json.dumps({"cells": [], "metadata": {"tag": tag}, "nbformat": 4, "nbformat_minor": 5})


CLEAN, MINE = _nb("clean"), _nb("my answers")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    clean = tmp_path / get_module("03").notebook
    clean.parent.mkdir(parents=True)
    clean.write_text(CLEAN)
    return tmp_path


def test_prepare_working_copy_creates_copy_from_clean(root):
    work = prepare_working_copy("03", root=root)
    assert work == root / "notebooks" / "work" / Path(get_module("03").notebook).name
    assert work.read_text() == CLEAN


def test_prepare_working_copy_keeps_existing_copy(root):
    work = prepare_working_copy("03", root=root)
    work.write_text(MINE)
    assert prepare_working_copy("03", root=root).read_text() == MINE
    assert not (work.parent / "archive").exists()


def test_prepare_working_copy_fresh_archives_with_timestamp(root):
    work = prepare_working_copy("03", root=root)
    work.write_text(MINE)
    again = prepare_working_copy("03", fresh=True, root=root)
    assert again == work and again.read_text() == CLEAN
    archived = list((work.parent / "archive").iterdir())
    assert len(archived) == 1
    assert re.fullmatch(rf"{re.escape(work.stem)}-\d{{8}}-\d{{6}}\.ipynb", archived[0].name)
    assert archived[0].read_text() == MINE


def test_prepare_working_copy_fresh_twice_keeps_both_archives(root):
    work = prepare_working_copy("03", root=root)
    for text in (_nb("first"), _nb("second")):
        work.write_text(text)
        prepare_working_copy("03", fresh=True, root=root)
    archived = sorted(p.read_text() for p in (work.parent / "archive").iterdir())
    assert archived == [_nb("first"), _nb("second")]


def test_prepare_working_copy_fresh_without_copy_just_copies(root):
    work = prepare_working_copy("03", fresh=True, root=root)
    assert work.read_text() == CLEAN


def test_prepare_working_copy_unknown_id_lists_valid_ids(root):
    with pytest.raises(ValueError, match=r"valid ids: 03, 03b.*specdec"):
        prepare_working_copy("42", root=root)


def test_prepare_working_copy_missing_clean_notebook_is_clear(root):
    with pytest.raises(FileNotFoundError, match=r"module 04 has no clean notebook yet: notebooks/clean/04-"):
        prepare_working_copy("04", root=root)


def test_working_copy_path_uses_clean_file_name(root):
    assert working_copy_path("specdec", root=root).name == Path(get_module("specdec").notebook).name


def test_launch_env_flag_overrides_exported_selector():
    assert launch_env("03,03b", {"G2C_APPLY_SOLUTIONS": "all"})["G2C_APPLY_SOLUTIONS"] == "03,03b"
    assert launch_env(None, {"G2C_APPLY_SOLUTIONS": "09"})["G2C_APPLY_SOLUTIONS"] == "09"
    assert "G2C_APPLY_SOLUTIONS" not in launch_env(None, {})


def test_launch_env_bogus_selector_lists_ids():
    with pytest.raises(ValueError, match=r"Valid ids: 03, 03b"):
        launch_env("bogus", {})


def test_main_unknown_id_exits_2_listing_ids(capsys):
    assert main(["42", "--no-launch"]) == 2
    assert re.search(r"valid ids: 03, 03b.*specdec", capsys.readouterr().err)


def test_main_bogus_solutions_exits_2(capsys):
    assert main(["03", "--solutions=bogus", "--no-launch"]) == 2
    assert "Valid ids" in capsys.readouterr().err


@pytest.mark.parametrize("argv, expected", [
    # a trial: --execute ran the notebook although --no-launch promised only to print; no id said
    # "required: module_id"; an id typed as 'help'; a bad selector named G2C_APPLY_SOLUTIONS, not the flag
    (["03", "--execute", "--no-launch"], "--execute runs the notebook and --no-launch only prints what would run"),
    (["--no-launch"], "give a module id, e.g. ./notebook.sh 03"),
    (["03", "--apply", "zz", "--no-launch"], "notebook.sh: --apply zz: unknown module id 'zz'"),
    (["03", "--solutions", "zz", "--no-launch"], "notebook.sh: --solutions zz: unknown module id 'zz'"),
])
def test_main_names_what_was_typed(capsys, argv, expected):
    try:
        rc = main(argv)
    except SystemExit as exit_:                      # argparse's own refusals
        rc = exit_.code
    err = capsys.readouterr().err
    assert rc == 2 and expected in err and "G2C_APPLY_SOLUTIONS:" not in err, err


def test_main_reads_an_id_after_solutions_and_echoes_its_canonical_spelling(tmp_path, monkeypatch, capsys):
    # ./notebook.sh --solutions 03: the optional SEL took the id ("required: module_id"); 3b was echoed as "3b"
    import g2c.course.notebooks as nbmod

    seen = {}
    monkeypatch.setattr(nbmod, "prepare_solved_copy", lambda mid, fresh: seen.setdefault("solved", mid) and tmp_path)
    monkeypatch.setattr(nbmod, "prepare_working_copy", lambda mid, fresh: seen.setdefault("work", mid) and tmp_path)
    assert main(["--solutions", "03", "--no-launch"]) == 0 and seen["solved"] == "03"
    assert "G2C_APPLY_SOLUTIONS=all" in capsys.readouterr().out
    monkeypatch.delenv("G2C_APPLY_SOLUTIONS", raising=False)
    assert main(["3b", "--no-launch"]) == 0 and seen["work"] == "03b"
    assert "the modules 03b needs" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:                 # a selection with no id: said so, not "unknown id 01-11"
        main(["--solutions", "01-11", "--no-launch"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "'01-11' is not a module id, and a module id is needed" in err
    assert "./notebook.sh 03 --solutions=01-11" in err and "unknown course module id" not in err


@pytest.fixture
def tmp_repo(tmp_path: Path) -> Path:
    """A minimal repo copy with notebook.sh, the registry, the launcher and one clean notebook."""
    course = [f"g2c/course/{p.name}" for p in (REPO_ROOT / "g2c/course").glob("*.py")]
    stem = Path(get_module("specdec").notebook).stem
    for rel in ("notebook.sh", "g2c/__init__.py", *course, "scripts/notebooks/build.py",
                f"solutions/notebooks/{stem}.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes((REPO_ROOT / rel).read_bytes())
    (tmp_path / "notebook.sh").chmod(0o755)
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    clean = tmp_path / get_module("specdec").notebook
    clean.parent.mkdir(parents=True)
    clean.write_text(CLEAN)
    return tmp_path


def _notebook_sh(root: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("G2C_APPLY_SOLUTIONS", "G2C_QUIET")}
    env.update(env_extra)
    return subprocess.run(["bash", str(root / "notebook.sh"), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=60)


def test_notebook_sh_no_launch_prints_path_and_command(tmp_repo):
    proc = _notebook_sh(tmp_repo, "specdec", "--apply", "01-11", "--no-launch")
    assert proc.returncode == 0, proc.stderr
    name = Path(get_module("specdec").notebook).name
    assert f"working copy: notebooks/work/{name}" in proc.stdout
    assert (tmp_repo / "notebooks" / "work" / name).read_text() == CLEAN
    numbered = [i for i in module_ids() if get_module(i).number is not None and 1 <= get_module(i).number <= 11]
    assert "solutions applied: " + ", ".join(numbered) + "\n" in proc.stdout
    assert re.search(r"would run: G2C_APPLY_SOLUTIONS=01-11 \S*jupyter lab \S+", proc.stdout)


def test_notebook_sh_solutions_names_and_builds_the_solved_copy(tmp_repo):
    proc = _notebook_sh(tmp_repo, "specdec", "--solutions", "--no-launch")
    assert proc.returncode == 0, proc.stderr
    stem = Path(get_module("specdec").notebook).stem
    assert f"solved copy: notebooks/work/{stem}.solved.ipynb" in proc.stdout
    assert "solutions applied: " + ", ".join(module_ids()) in proc.stdout
    assert re.search(rf"would run: G2C_APPLY_SOLUTIONS=all \S*jupyter lab \S+{stem}\.solved\.ipynb", proc.stdout)
    solved = (tmp_repo / "notebooks" / "work" / f"{stem}.solved.ipynb").read_text()
    assert "Rubric" in solved and "BEGIN SOLUTION" in solved
    assert (tmp_repo / "notebooks" / "work" / f"{stem}.ipynb").exists() is False  # the student's copy: untouched
    # A copy whose cells match the answer key is kept with its outputs; --fresh archives and rebuilds;
    # a copy whose cells no longer match (answer key changed) is archived and rebuilt.
    work = tmp_repo / "notebooks" / "work" / f"{stem}.solved.ipynb"
    ran = solved.replace('"outputs": []', '"outputs": [{"name": "stdout", "output_type": "stream", "text": "hi"}]', 1)
    work.write_text(ran)
    assert _notebook_sh(tmp_repo, "specdec", "--solutions", "--no-launch").returncode == 0
    assert work.read_text() == ran
    assert _notebook_sh(tmp_repo, "specdec", "--solutions", "--fresh", "--no-launch").returncode == 0
    assert work.read_text() == solved
    work.write_text("stale")
    assert _notebook_sh(tmp_repo, "specdec", "--solutions", "--no-launch").returncode == 0
    assert work.read_text() == solved
    archived = sorted(p.read_text() for p in (tmp_repo / "notebooks" / "work" / "archive").iterdir())
    assert archived == sorted([ran, "stale"])


def test_notebook_sh_solutions_and_apply_together_exit_2(tmp_repo):
    proc = _notebook_sh(tmp_repo, "specdec", "--solutions", "--apply", "01-11", "--no-launch")
    assert proc.returncode == 2 and "give one of them" in proc.stderr


def test_notebook_sh_honours_exported_selector(tmp_repo):
    proc = _notebook_sh(tmp_repo, "specdec", "--no-launch", G2C_APPLY_SOLUTIONS="09,11", G2C_QUIET="1")
    assert proc.returncode == 0, proc.stderr
    assert "solutions applied: 09, 11" in proc.stdout


def test_notebook_sh_unknown_id_exits_2_listing_ids(tmp_repo):
    proc = _notebook_sh(tmp_repo, "99", "--no-launch")
    assert proc.returncode == 2
    assert "valid ids: " + ", ".join(module_ids()) in proc.stderr


def _tiny_notebook(path: Path, *sources: str) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# a lesson"), *(nbformat.v4.new_code_cell(s) for s in sources)]
    nbformat.write(nb, path)


def test_notebook_sh_execute_runs_headless_with_the_selection_and_progress(tmp_repo):
    import nbformat

    clean = tmp_repo / get_module("specdec").notebook
    _tiny_notebook(clean, "import os\nprint('selection', os.environ['G2C_APPLY_SOLUTIONS'], os.getcwd())",
                   "from tqdm.auto import tqdm\nfor _ in tqdm(range(3), desc='steps'): pass",
                   "print('done')")
    proc = _notebook_sh(tmp_repo, "specdec", "--apply", "03,04", "--execute")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[cell 1/3] import os" in proc.stdout and "[cell 3/3] print('done')" in proc.stdout
    assert f"selection 03,04 {tmp_repo}" in proc.stdout                 # the selector, from the repo root
    assert "steps: 100%" in proc.stderr                                  # tqdm.auto as a text bar, visible
    work = tmp_repo / "notebooks" / "work" / clean.name
    cells = nbformat.read(work, as_version=4).cells
    assert cells[3].outputs[0]["text"] == "done\n"                       # the executed copy is written back
    assert "steps: 100%" in cells[2].outputs[0]["text"] and "\r" not in cells[2].outputs[0]["text"]
    assert "Kernel is running" not in proc.stderr                        # no kernel log noise


def test_notebook_sh_execute_stops_at_the_failing_cell_and_keeps_the_outputs(tmp_repo):
    import nbformat

    clean = tmp_repo / get_module("specdec").notebook
    _tiny_notebook(clean, "print('first')", "raise NotImplementedError('notebook exercise: write it')", "print('x')")
    proc = _notebook_sh(tmp_repo, "specdec", "--apply", "0", "--execute")
    assert proc.returncode == 1
    name = clean.name
    assert (f"notebook.sh: cell 2/3 failed: NotImplementedError: notebook exercise: write it; the outputs so far "
            f"(and any traceback) are saved in notebooks/work/{name}") in proc.stderr
    cells = nbformat.read(tmp_repo / "notebooks" / "work" / name, as_version=4).cells
    assert cells[1].outputs[0]["text"] == "first\n" and cells[2].outputs[0]["ename"] == "NotImplementedError"
    assert cells[3].outputs == []                                        # never ran


def test_notebook_sh_execute_never_runs_a_damaged_copy(tmp_repo):
    # A working copy truncated by a full disk: backed up to archive/ (the student is told where),
    # and a fresh copy is executed instead; the damaged bytes are never handed to the kernel.
    name = Path(get_module("specdec").notebook).name
    work = tmp_repo / "notebooks" / "work" / name
    work.parent.mkdir(parents=True, exist_ok=True)
    work.write_text(CLEAN[: len(CLEAN) // 2])
    proc = _notebook_sh(tmp_repo, "specdec", "--apply", "0", "--execute")
    assert proc.returncode == 0, proc.stderr
    backups = list((work.parent / "archive").glob("*-damaged-*.ipynb"))
    assert len(backups) == 1 and backups[0].read_text() == CLEAN[: len(CLEAN) // 2]
    assert "cannot be opened" in proc.stderr and backups[0].name in proc.stderr
    assert json.loads(work.read_text())["cells"] is not None                # what ran parses
