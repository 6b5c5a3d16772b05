"""The G2C_APPLY_SOLUTIONS import hook (CONVENTIONS §2).

Each test starts a fresh interpreter so the hook sees exactly the environment given here,
whatever the outer run applies.
"""

from __future__ import annotations

import os
import subprocess
import sys

from g2c.course import REPO_ROOT, module_ids

BANNER = "g2c: using reference solutions"


def run_py(code: str, *, solutions: str | None = None, quiet: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("G2C_APPLY_SOLUTIONS", "G2C_QUIET")}
    if solutions is not None:
        env["G2C_APPLY_SOLUTIONS"] = solutions
    if quiet:
        env["G2C_QUIET"] = "1"
    return subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_hook_bogus_selector_exits_nonzero_listing_ids():
    proc = run_py("import g2c", solutions="bogus")
    assert proc.returncode != 0
    assert "'bogus'" in proc.stderr
    assert ", ".join(module_ids()) in proc.stderr
    # issue 31: one line naming the value and the fix, no traceback through the import machinery
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.returncode == 1 and "fix or unset G2C_APPLY_SOLUTIONS" in proc.stderr


def test_hook_range_01_11_selects_every_id_up_to_11():
    proc = run_py("import g2c; print(','.join(g2c.APPLIED_SOLUTIONS))", solutions="01-11", quiet=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "03,03b,04,05,06,07,08,09,09b,10,11"


def test_hook_banner_printed_once_naming_modules():
    proc = run_py("import g2c, g2c.nn, g2c.training; import g2c.nn.layers", solutions="03,03b")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count(BANNER) == 1
    assert "modules 03, 03b" in proc.stderr
    assert proc.stdout == ""


def test_hook_banner_silenced_by_quiet():
    proc = run_py("import g2c, g2c.nn", solutions="all", quiet=True)
    assert proc.returncode == 0, proc.stderr
    assert BANNER not in proc.stderr


def test_hook_no_selection_prints_nothing():
    proc = run_py("import g2c, g2c.nn; print(g2c.APPLIED_SOLUTIONS)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout.strip() == "[]"


SOURCES = """
import inspect
from pathlib import Path
import g2c
from g2c.nn import Linear
from g2c.training import AdamW
root = Path(g2c.course.REPO_ROOT)
for obj in (Linear.forward, AdamW.step):
    print(Path(inspect.getsourcefile(inspect.unwrap(obj))).resolve().relative_to(root).as_posix())
"""


def test_hook_selected_module_loads_solution_others_stay_scaffolds():
    proc = run_py(SOURCES, solutions="03", quiet=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["solutions/g2c/nn/layers.py", "g2c/training/adamw.py"]


def test_hook_without_selection_loads_scaffolds():
    proc = run_py(SOURCES)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["g2c/nn/layers.py", "g2c/training/adamw.py"]


def test_hook_classes_keep_one_identity_across_importers():
    code = (
        "from g2c.nn import Linear as A\n"
        "from g2c.nn.layers import Linear as B\n"
        "import g2c.nn.layers as L, importlib\n"
        "C = importlib.import_module('g2c.nn.layers').Linear\n"
        "from g2c.training import AdamW as D\n"
        "from g2c.training.adamw import AdamW as E\n"
        "print(A is B is C is L.Linear, D is E, 'solutions' in L.__file__)\n"
    )
    proc = run_py(code, solutions="03,03b", quiet=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "True", "True"]


def test_hook_scaffold_raises_not_implemented_naming_module_and_function():
    code = (
        "from g2c.training import cosine_with_warmup\n"
        "cosine_with_warmup(0, warmup_steps=1, max_steps=2, max_lr=1.0)\n"
    )
    proc = run_py(code)
    assert proc.returncode != 0
    assert "NotImplementedError" in proc.stderr
    assert "module 03b: cosine_with_warmup" in proc.stderr
    # the hint names the grading command, never a selector (which could replace the student's own code)
    assert "grade module 03b with ./test.sh 03b" in proc.stderr
    assert "G2C_APPLY_SOLUTIONS=" not in proc.stderr
