"""Standing guard: every script's bad options stop at parse time with one line, exit 2.

SCRIPTS lists every command-line script (``bench/*.py`` and the ``g2c/assets`` entry points);
a new script is covered once it is listed (``test_every_script_is_listed`` fails until it is).
Each is run in-process (the running solution selection is kept: ``g2c.course.solved``) with
``BAD_OPTIONS``: a negative count, a non-number, an unknown choice, NaN where a finite number is
needed, an unknown model and an unavailable device, wherever the script has such an option.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re

import pytest

from g2c.course import REPO_ROOT

# script -> {bad-input class: (argv, match on the one error line)}
SCRIPTS: dict[str, dict[str, tuple[list[str], str]]] = {
    "bench/specdec.py": {
        "negative count": (["--new-tokens", "-1"], r"--new-tokens -1: use 1 or more"),
        "not a number": (["--ks", "1,x"], r"--ks 1,x: give comma-separated draft lengths"),
        "unknown name": (["--target", "nope"], r"unknown artifact 'nope'"),
    },
    "bench/specdec_sampling.py": {
        "negative count": (["--new-tokens", "-3"], r"argument --new-tokens: -3 is below 1; use an int >= 1"),
        "not a number": (["--k", "two"], r"argument --k: 'two' is not an integer"),
        "unknown choice": (["--modes", "fast"], r"argument --modes: 'fast': choose from greedy, sampled"),
        "non-finite": (["--temperature", "nan"], r"argument --temperature: nan is not allowed; use a finite number > "),
        "unknown name": (["--drafter", "GPT-9"], r"argument --drafter: unknown model 'GPT-9'; use one of StoryLM-1M"),
        "unknown device": (["--device", "tpu"], r"argument --device: unknown device 'tpu'"),
    },
    "bench/specdec_trees.py": {
        "negative count": (["--new-tokens", "-5"], r"argument --new-tokens: -5 is below 1"),
        "not a number": (["--budgets", "4,many"], r"argument --budgets: 'many' is not an integer"),
        "unknown choice": (["--trees", "bush"], r"argument --trees: 'bush': choose from chain, static, dynamic"),
        "non-finite": (["--temperature", "inf"], r"argument --temperature: inf is not allowed"),
        "unknown name": (["--target", "StoryLM-1M-distilled"], r"argument --target: StoryLM-1M-distilled is not a "
                                                               r"ladder model"),
        "unknown device": (["--device", "tpu"], r"argument --device: unknown device 'tpu'"),
    },
    "bench/specdec_state.py": {
        "negative count": (["-k", "-2"], r"argument -k: -2 is below 1"),
        "not a number": (["--capacity", "1.5"], r"argument --capacity: '1.5' is not an integer"),
    },
    "bench/serving_lab.py": {
        "negative count": (["--new-tokens", "-1"], r"argument --new-tokens: -1 is below 1"),
        "not a number": (["--batches", "1,b"], r"argument --batches: 'b' is not an integer"),
        "unknown name": (["--target", "nope"], r"argument --target: unknown model 'nope'"),
        "unknown device": (["--device", "tpu"], r"argument --device: unknown device 'tpu'"),
    },
    "bench/peer_hf.py": {
        "negative count": (["--prompts", "-8"], r"argument --prompts: -8 is below 1"),
        "not a number": (["--ks", "1,2,x"], r"argument --ks: 'x' is not an integer"),
        "unknown choice": (["--dtypes", "float64"], r"argument --dtypes: 'float64': choose from float32"),
        "unknown name": (["--drafters", "StoryLM-1M,nope"], r"argument --drafters: unknown model 'nope'"),
    },
    "bench/train_throughput.py": {
        "negative count": (["--steps", "0"], r"argument --steps: 0 is below 1"),
        "not a number": (["--batch-size", "x"], r"argument --batch-size: 'x' is not an integer"),
        "unknown choice": (["--precisions", "fp8"], r"argument --precisions: 'fp8': choose from fp32, bf16"),
        "unknown device": (["--device", "auto"], r"argument --device: 'auto' is not accepted here"),
    },
    "g2c/assets/data.py": {
        "unknown option": (["--tokens", "5"], r"unrecognized arguments: --tokens 5"),
    },
    "g2c/assets/checkpoints.py": {
        "unknown name": (["StoryLM-2M"], r"checkpoints: error: unknown artifact 'StoryLM-2M'"),
    },
    "g2c/assets/export.py": {
        "unknown choice": (["StoryLM-1M", "--hf", "x", "--dtype", "float64"], r"argument --dtype: invalid choice"),
    },
}


def _load(script: str):
    path = REPO_ROOT / script
    spec = importlib.util.spec_from_file_location("g2c_script_" + re.sub(r"\W", "_", script), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(script: str, argv: list[str]) -> tuple[object, str, str]:
    module = _load(script)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = module.main(argv)
        except SystemExit as exc:
            rc = exc.code
    return rc, out.getvalue(), err.getvalue()


def test_every_script_is_listed():
    scripts = {p.relative_to(REPO_ROOT).as_posix() for d in ("bench", "g2c/assets")
               for p in (REPO_ROOT / d).glob("*.py") if "__main__" in p.read_text()}
    assert scripts == set(SCRIPTS), "list every script (and its bad-option cases) in SCRIPTS"


@pytest.mark.parametrize("script, case", [(s, c) for s, cases in SCRIPTS.items() for c in cases])
def test_script_bad_option_is_one_line_and_a_nonzero_exit(script, case):
    argv, match = SCRIPTS[script][case]
    rc, out, err = _run(script, argv)
    assert rc not in (0, None), (rc, out, err)
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and re.search(match, errors[0]), err
    assert "Traceback" not in err and not out.strip(), out
