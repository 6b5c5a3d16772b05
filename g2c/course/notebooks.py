"""The notebook launcher behind ``./notebook.sh``.

    ./notebook.sh <id> [--fresh] [--apply SEL] [--solutions[=SEL]] [--no-launch] [--execute]

Each course module has a clean notebook under ``notebooks/clean/`` (its Answer cells blank,
its code exercises raising ``NotImplementedError``). You work in a copy under
``notebooks/work/`` (git ignores it), created from the clean one the first time.
``--fresh`` moves your old copy to ``notebooks/work/archive/<stem>-YYYYmmdd-HHMMSS.ipynb``
and starts again from the clean notebook. By default your copy runs with the answer key
applied to the modules this one needs that you have not edited (the same set ``./test.sh ID``
grades with; one line says which); your own code, this module's included, stays yours.
``--apply SEL`` uses ``G2C_APPLY_SOLUTIONS=SEL`` instead (same grammar as the environment
variable; an exported ``G2C_APPLY_SOLUTIONS`` is honoured too); ``--apply 0`` applies nothing.

``--solutions`` opens the *solved* copy ``notebooks/work/<stem>.solved.ipynb`` instead: worked
answers, rubrics and exercise code, built from the answer key ``solutions/notebooks/<stem>.py``
(``scripts/notebooks/build.py``), with every module's solutions applied (``--solutions=SEL``:
only those). It is rebuilt (the old one archived) when the answer key changed or with
``--fresh``; your own copy is never touched.

``--execute`` runs the copy headless instead of opening Jupyter: every code cell top to bottom
in a fresh kernel (from the repository root, with the same answer-key selection as above), one
``[cell i/N]`` line per cell, the cells' printed output and progress bars (as text) streamed to
the terminal, and the executed notebook, outputs included, written back to the copy (also when
a cell fails: it stops there, names the cell and its error, and exits 1).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from .files import clean_leftovers, write_bytes_atomic, write_problem, write_text_atomic
from .registry import MODULES, REPO_ROOT, SOLUTIONS_ENV, get_module, parse_selection, selector_for
from .scaffolds import default_selection, stack_hints

ENV_VAR = SOLUTIONS_ENV


def working_copy_path(module_id: str, *, root: Path = REPO_ROOT) -> Path:
    """Where the student's working copy of a module's notebook lives."""
    return root / "notebooks" / "work" / Path(get_module(module_id).notebook).name


def solved_copy_path(module_id: str, *, root: Path = REPO_ROOT) -> Path:
    """Where the solved copy of a module's notebook goes: ``notebooks/work/<stem>.solved.ipynb``."""
    return root / "notebooks" / "work" / f"{Path(get_module(module_id).notebook).stem}.solved.ipynb"


def prepare_solved_copy(module_id: str, *, fresh: bool = False, root: Path = REPO_ROOT) -> Path:
    """Return the solved copy of ``module_id``'s notebook, built from the answer key.

    The solved copy (worked answers, rubrics, exercise code) is built from
    ``solutions/notebooks/<stem>.py`` by ``scripts/notebooks/build.py``. An existing copy whose
    cells still match the answer key is kept with its outputs (your runs); one whose cells
    differ (the answer key changed, or you edited it) is archived like a working copy and
    rebuilt, and so is any copy with ``fresh=True``.

    Raises:
        ValueError: unknown module id, or the source breaks the notebook format.
        FileNotFoundError: the module has no source ``solutions/notebooks/<stem>.py``, or the
            builder ``scripts/notebooks/build.py`` is missing.
    """
    import json

    module = get_module(module_id)
    path = solved_copy_path(module.id, root=root)
    script = root / "scripts" / "notebooks" / "build.py"
    if not script.is_file():
        raise FileNotFoundError(f"the notebook builder {script} is missing; the solved notebook is built by it")
    spec = importlib.util.spec_from_file_location("g2c_notebook_build", script)
    build = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build)
    text = build.build_module(module, solved=True, rubrics=True, root=root)
    if path.exists():

        def cells(raw: str) -> list:
            try:
                return [(c["cell_type"], "".join(c["source"])) for c in json.loads(raw)["cells"]]
            except (ValueError, KeyError, TypeError):
                return []

        if not fresh and cells(path.read_text(encoding="utf-8")) == cells(text):
            return path
        _archive(path, root)
    write_text_atomic(path, text)  # a full disk or Ctrl-C leaves no half-written notebook
    return path


def _archive(work: Path, root: Path, *, tag: str = "") -> Path:
    """Move ``work`` to ``notebooks/work/archive/<stem>[-tag]-YYYYmmdd-HHMMSS.ipynb`` and say where."""
    archive = work.parent / "archive"
    archive.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    stem = f"{work.stem}-{tag}" if tag else work.stem
    target = archive / f"{stem}-{stamp}{work.suffix}"
    n = 1
    while target.exists():  # two --fresh runs within the same second
        target = archive / f"{stem}-{stamp}-{n}{work.suffix}"
        n += 1
    shutil.move(str(work), str(target))
    if not tag:
        print(f"archived your previous copy to {_shown(target, root)}", file=sys.stderr)
    return target


def _shown(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def notebook_problem(path: Path) -> str | None:
    """Why ``path`` is not a notebook Jupyter can open (truncated by a full disk or a killed
    write, not JSON, no ``cells`` list), or None when it parses."""
    import json

    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        return f"it is not UTF-8 text (byte {exc.start})"
    except ValueError as exc:
        return f"it is not valid JSON ({exc}; a truncated file?)"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list) or "nbformat" not in nb:
        return "it is JSON but not a notebook (no nbformat / cells)"
    return None


def prepare_working_copy(module_id: str, *, fresh: bool = False, root: Path = REPO_ROOT) -> Path:
    """Return the working copy of ``module_id``'s notebook, creating it from the clean one if missing.

    With ``fresh=True`` an existing working copy is first moved to
    ``notebooks/work/archive/<stem>-YYYYmmdd-HHMMSS.ipynb``.

    A working copy that does not parse (truncated by a full disk or a killed write) is never
    handed to Jupyter: it is moved to ``notebooks/work/archive/<stem>-damaged-<stamp>.ipynb``,
    the student is told (one line on stderr naming the backup), and a copy of the clean
    notebook takes its place. Copies are written atomically (temp file, fsync, rename), and
    temporaries an interrupted earlier copy left are removed (and reported).

    Raises:
        ValueError: unknown module id (the message lists the valid ids).
        FileNotFoundError: the module's clean notebook does not exist yet.
        OSError: ``notebooks/work/`` cannot be written (read-only, full disk).
    """
    module = get_module(module_id)
    clean = root / module.notebook
    work = working_copy_path(module.id, root=root)
    if not clean.is_file():
        raise FileNotFoundError(
            f"module {module.id} has no clean notebook yet: {module.notebook} does not exist"
        )
    clean_leftovers(work.parent, log=lambda line: print(f"notebook.sh: {line}", file=sys.stderr))
    if fresh and work.exists():
        _archive(work, root)
    if work.exists():
        problem = notebook_problem(work)
        if problem is not None:
            backup = _archive(work, root, tag="damaged")
            print(f"notebook.sh: your working copy {_shown(work, root)} cannot be opened: {problem}. It is backed up "
                  f"to {_shown(backup, root)} (recover your code from it with a text editor); starting a fresh copy "
                  "from the clean notebook", file=sys.stderr)
    if not work.exists():
        write_bytes_atomic(work, clean.read_bytes())
    return work


def launch_env(solutions: str | None, environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for Jupyter: ``solutions`` (a selector) overrides an exported one.

    Raises:
        ValueError: the selector is malformed (the message lists the valid ids).
    """
    env = dict(os.environ if environ is None else environ)
    if solutions is not None:
        env[ENV_VAR] = solutions
    parse_selection(env.get(ENV_VAR, ""))  # validate early, before Jupyter starts
    return env


# Run in the kernel before the first cell: `tqdm.auto` would draw ipywidgets bars, which a headless
# run can neither show nor save (a reopened notebook says "model not found"); text bars go to stderr.
_TEXT_BARS = "import tqdm.auto as _g2c_a, tqdm.std as _g2c_s\n_g2c_a.tqdm, _g2c_a.trange = _g2c_s.tqdm, _g2c_s.trange\n"


def _first_line(source: str) -> str:
    for line in source.splitlines():
        if line.strip():
            return line.strip()[:70]
    return "(empty)"


def execute_notebook(path: Path, env: dict[str, str], *, root: Path = REPO_ROOT, out=None) -> int:
    """Run the notebook at ``path`` headless and write it back with its outputs; return an exit code.

    Every code cell runs in order in a fresh ``python3`` kernel started from ``root`` with ``env``
    (its ``G2C_APPLY_SOLUTIONS`` is the answer-key selection). Before each code cell a line
    ``[cell i/N] <its first line>`` goes to ``out`` (default: stdout); the cell's stdout and stderr
    (``tqdm`` bars as text) follow as they arrive. The executed notebook is written to ``path``
    atomically (a temporary file, then a rename) when the run ends, whether it passed or not.

    Returns:
        0 when every cell ran; 1 when a cell raised, the kernel died, or the run was interrupted
        (one line names the cell and the error; the notebook keeps the outputs up to there).

    Raises:
        ValueError: ``path`` is not a notebook nbformat can read.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, DeadKernelError

    out = out or sys.stdout
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # nbformat raises several types on a broken file
        raise ValueError(f"{path} is not a readable notebook ({type(e).__name__}: {e}); "
                         f"./notebook.sh ID --fresh starts a new copy (the old one is archived)") from None
    code = [i for i, c in enumerate(nb.cells) if c.cell_type == "code"]

    class EchoClient(NotebookClient):
        def output(self, outs, msg, display_id, cell_index):
            if msg["msg_type"] == "stream":
                stream = sys.stderr if msg["content"].get("name") == "stderr" else out
                stream.write(msg["content"].get("text", ""))
                stream.flush()
            return super().output(outs, msg, display_id, cell_index)

    client = EchoClient(nb, kernel_name="python3", coalesce_streams=True,  # a bar's \r updates saved as one line
                        resources={"metadata": {"path": str(root)}})
    rel = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
    failure = None
    t0 = time.perf_counter()
    try:
        # the kernel's own log lines (a transport warning at start-up) would bury the cells' output
        with client.setup_kernel(env=env, stderr=subprocess.DEVNULL):
            info = client.wait_for_reply(client.kc.kernel_info())
            nb.metadata["language_info"] = info["content"]["language_info"]
            client.wait_for_reply(client.kc.execute(_TEXT_BARS, silent=True, store_history=False))
            for n, index in enumerate(code, 1):
                cell = nb.cells[index]
                print(f"[cell {n}/{len(code)}] {_first_line(cell.source)}", file=out, flush=True)
                try:
                    client.execute_cell(cell, index, execution_count=n)
                except CellExecutionError as e:
                    failure = f"cell {n}/{len(code)} failed: {e.ename}: {e.evalue}".rstrip(": ")
                    break
    except DeadKernelError as e:
        failure = f"the kernel died ({e}); out of memory?"
    except KeyboardInterrupt:
        failure = "interrupted"
    except Exception as e:  # no kernel spec, the kernel would not start, ...
        failure = f"could not run the kernel: {type(e).__name__}: {e}"
    finally:
        tmp = path.with_name(f".{path.name}.executing")
        nbformat.write(nb, tmp)
        os.replace(tmp, path)
    if failure:
        print(f"notebook.sh: {failure}; the outputs so far (and any traceback) are saved in {rel}", file=sys.stderr)
        return 1
    print(f"ran {len(code)} cells in {time.perf_counter() - t0:.0f} s; executed notebook: {rel}", file=out)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="./notebook.sh", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("module_id", nargs="?", help="a course module id, e.g. 03, 03b, specdec")
    ap.add_argument("--fresh", action="store_true",
                    help="archive the working copy and start from the clean one")
    ap.add_argument("--apply", default=None, metavar="SEL",
                    help="open your copy with these modules' reference solutions applied instead of the default "
                         "(the prerequisites you have not edited); e.g. 03,03b, or 0 for none")
    ap.add_argument("--solutions", nargs="?", const="all", default=None, metavar="SEL",
                    help="open the solved notebook (worked answers, rubrics, code), solutions applied "
                         "(default: all; or e.g. 01-11)")
    ap.add_argument("--no-launch", action="store_true", help="prepare the copy and print what would run")
    ap.add_argument("--execute", action="store_true",
                    help="run the copy headless instead of opening Jupyter (cell i/N progress, printed output "
                         "and bars shown), write it back with its outputs; exit 1 if a cell fails")
    args = ap.parse_args(argv)
    if args.module_id is None and args.solutions not in (None, "all"):
        # ./notebook.sh --solutions 03: the optional SEL took the id; the solved notebook of 03, every solution
        try:
            get_module(args.solutions)
        except ValueError:        # ./notebook.sh --solutions 01-11: a selection, and no module id at all
            ap.error(f"'{args.solutions}' is not a module id, and a module id is needed: the notebook to open "
                     f"comes first and a selection goes after an '=', "
                     f"e.g. ./notebook.sh 03 --solutions={args.solutions}")
        args.module_id, args.solutions = args.solutions, "all"
    if args.module_id is None:
        ap.error("give a module id, e.g. ./notebook.sh 03 (./notebook.sh --help)")
    if args.execute and args.no_launch:
        ap.error("--execute runs the notebook and --no-launch only prints what would run: give one of them")
    if args.module_id.strip().lower() in ("help", "list", "ids"):
        print(f"notebook.sh: '{args.module_id}' is not a module id; ./notebook.sh --help lists the options and the "
              f"ids are {', '.join(m.id for m in MODULES if m.notebook)}", file=sys.stderr)
        return 2
    try:
        args.module_id = get_module(args.module_id).id      # 3b -> 03b: messages below name the real id
        if args.solutions is not None and args.apply is not None:
            raise ValueError("--solutions opens the solved notebook and --apply your own copy; give one of them")
        chosen = args.solutions if args.solutions is not None else args.apply
        flag = "--solutions" if args.solutions is not None else "--apply" if args.apply is not None else None
        default = chosen is None and ENV_VAR not in os.environ
        if default:
            chosen = selector_for(default_selection(args.module_id))
        try:
            env = launch_env(chosen)
        except ValueError as e:             # a selector the student typed: name the flag, not the variable
            if flag is None:
                raise
            raise ValueError(f"{flag} {chosen}: {str(e).removeprefix(ENV_VAR + ': ')}") from None
        if args.solutions is not None:
            path = prepare_solved_copy(args.module_id, fresh=args.fresh)
        else:
            path = prepare_working_copy(args.module_id, fresh=args.fresh)
    except (ValueError, FileNotFoundError) as e:
        print(f"notebook.sh: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # notebooks/work/ read-only, a full disk
        print(f"notebook.sh: {write_problem(e)}", file=sys.stderr)
        return 1
    jupyter = Path(sys.executable).with_name("jupyter")
    cmd = [str(jupyter) if jupyter.exists() else "jupyter", "lab", str(path)]
    selected = parse_selection(env.get(ENV_VAR, ""))
    rel = path.relative_to(REPO_ROOT).as_posix() if path.is_relative_to(REPO_ROOT) else str(path)
    print(f"{'solved copy' if args.solutions is not None else 'working copy'}: {rel}")
    print(f"solutions applied: {', '.join(selected) if selected else 'none'}"
          + (f" (by default: the modules {args.module_id} needs that you have not edited; --apply SEL overrides)"
             if default else ""))
    for line in stack_hints(args.module_id, selected):
        print(line)
    if args.execute:
        env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")  # this venv's kernel
        try:
            return execute_notebook(path, env)
        except ValueError as e:
            print(f"notebook.sh: {e}", file=sys.stderr)
            return 2
    if args.no_launch:
        print("would run: " + (f"{ENV_VAR}={env[ENV_VAR]} " if selected else "") + " ".join(cmd))
        return 0
    if hasattr(os, "geteuid") and os.geteuid() == 0:     # a container's root: Jupyter refuses it without the flag
        print("notebook.sh: note: running as root (a container?), so Jupyter gets --allow-root", file=sys.stderr)
        cmd.append("--allow-root")
    os.chdir(REPO_ROOT)
    os.execvpe(cmd[0], cmd, env)
    return 0  # pragma: no cover


if __name__ == "__main__":
    sys.exit(main())
