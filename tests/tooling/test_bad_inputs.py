"""Standing guard (issue 22): every public entry point x every bad-input class.

Covered, generated from the tables below (a new entry point is covered once it is listed):

* Loops (``LOOPS``, 13 entry points): module 11's ``generate``, module 16's ``cached_generate``,
  the Beyond loops ``speculative_generate``, ``speculative_sample`` (the engine; the tree and lineage
  loops are its presets and share its checks),
  ``speculative_generate_cached``, ``mtp_generate``, ``mtp_generate_cached``,
  ``tree_speculative_generate``, ``lineage_generate``, ``batched_greedy``,
  ``batched_speculative_generate``, and the
  recurrent ``plain_greedy`` and ``speculative_generate_stateful``; x ``BAD_ARGS`` (23 classes: a
  float, ``None`` or negative budget; an empty, float, negative-id or out-of-vocabulary prompt; a
  NaN or infinite temperature, a seed as generator and a generator on another device than the CPU,
  where the loop samples; an ``eos_id``
  outside the vocabulary, negative or a float, where the loop takes one; top-k 0 or 2.5, top-p 1.5,
  a string or 1e-46 (0 in float32), where the loop warps; a zero or string repetition penalty, a
  stop id outside the vocabulary, stop strings without decode, where the loop takes them); plus a model that
  produced NaN (1 class, every loop) and, with hypothesis, any non-integer or negative budget.
* Verifiers (5: ``greedy_verify``, ``speculative_verify``, ``greedy_tree_verify``,
  ``tree_speculative_verify``, ``typical_tree_verify``) x ``BAD_TABLES`` (11 classes: target rows
  summing to 10, draft rows summing to 0.01, raw logits as probabilities, a NaN probability row, a
  NaN score row, an all -inf score row, a draft id outside the vocabulary, integer counts as
  target or draft probabilities, a bool one-hot as probabilities, integer scores); good tables
  in every float dtype are accepted; a seed as generator; ``typical_accept``'s tables and knobs.
* Issue 31's families: one-shot iterables read once (rank paths, fusion layers, tree parents,
  a static tree's choices); static-tree choices checked where they enter; a custom drafter's tree
  checked before the target reads it (``DraftTree.check``); the fast path's vocabulary check; a
  ragged cache's row indices; heads on a bfloat16 base (every head) and a head on another base
  or left in another dtype; ranges before use (``optimal_k``). The standing fuzz pass over the
  same entry points is ``tests/tooling/test_fuzz.py``.
* Caches and transactions: a cache built for another model or dtype, ``KVCache.advance(2.5)``,
  a (2, 3) block on a batch-1 transaction, an empty prefill, a transaction of another model or
  already used.
* Scripts (``SCRIPTS``, 17: every ``bench/*.py`` and ``g2c/assets`` entry point;
  ``test_every_script_is_listed`` fails until a new one is listed) x their options (10 classes: a
  negative count, a non-number, an unknown choice, NaN or inf where a finite number is needed,
  an unknown model, an unavailable device, an unknown option, an output path that is a folder
  where a file is written or a file where a folder is (issue 31), a model of the wrong kind): one
  error line, exit 2 (1 for ./checkpoints.sh's unknown name and the exports' runtime checks).
  Unwritable outputs, full disks and interrupted writes: tests/tooling/test_trust.py.

* Issue 57's families, each closed where the value enters:
  - a decode that is not prefix-monotone (a byte decode showing a cut character as U+FFFD): stop strings
    cut where plain decoding cuts, through the engine, the tree preset and the lineage loop, k = 1 and 4
    (``StopRule.cut`` decodes every prefix);
  - every output path option of every script (``OUTPUT_OPTIONS``; ``test_every_output_option_of_every_
    script_is_listed_and_typed`` fails until a new one is listed and typed) x ``BAD_OUTPUTS`` (6 classes: a
    folder that cannot exist, a path under a file, a name too long, a NUL, an empty path, a path inside the
    shipped artifacts): one error line, exit 2, before any work (``g2c.assets.cli.output_file`` /
    ``output_dir`` -> ``g2c.course.files.check_output_path``, a real write probe; ``shipped_problem``); a
    list of only commas (``roofline --paths ,``); a disk that fills after the work;
  - messages that named the wrong cause (an export under a file, into the shipped artifacts, an edited pin,
    ``G2C_APPLY_SOLUTIONS='all,'``, a module id that exists, an interrupted GGUF read-back);
  - controls handed to the wrong object (the stateful preset names ``speculative_sample``);
  - raw library errors and wrong types reported as wrong values (``ngram_lookup(min_n=1.5)``, a head on
    ``object()``, ``block_loss_weights``'s gamma, ``check_whole``'s TypeError; ``torch.save`` past a
    file-size limit, the real call in a child process);
  - a read-only checkout stops ``./setup.sh`` before pip;
  - MPS's silent causal mask in half precision (pytorch/pytorch#195910): tests/tooling/test_fake_device.py;
  - the building blocks of modules 03-11 (the trial's ``blocks`` surface): ``TrainConfig``/``StoryLMConfig``
    fields, the constructors of every layer, the training controls, ``get_lm_batch``/``split_stream``/
    ``stream_loss``/``Trainer``, ``time_call``/``resolve_device``, the losses, the attention helpers, the
    forwards' inputs and module 11's warpers: sizes are ints (no bool, float or tensor of several elements),
    rates finite reals in range, each checked where it enters in provided code (``g2c.nn.module.check_int``,
    ``check_real``, ``check_features``; module 03b's ``check_int_arg``/``check_real_arg``, module 06's
    ``check_scores``: those modules need no module 03).
  The trial that found them (>= 900 inputs over every surface, classified clear / unclear / silent) is
  ``tests/tooling/trial_bad_inputs.py``.

Every error must be a ValueError/TypeError on one line naming the argument, the rule and the fix.
The type rule: a Python value of the wrong type (a float, bool, string or None where an int or a
number is needed; a non-tensor where a tensor is needed) is a TypeError; a tensor of the wrong
dtype or shape, and a value of the right type outside its range, is a ValueError. Tables that are
not floating point are refused, never converted (``g2c.sampling.model.check_table_dtype``).
Script controllers (``HeuristicK``, ``CostModelK``) are covered in tests/test_specdec_sampling.py,
files and manifests in tests/tooling/test_checkpoints.py, test_artifacts.py and test_data.py.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from g2c.course import REPO_ROOT

# script -> {bad-input class: (argv, match on the one error line)}
SCRIPTS: dict[str, dict[str, tuple[list[str], str]]] = {
    "bench/ab.py": {
        "no command": (["--a", str(REPO_ROOT), "--b", str(REPO_ROOT)], r"give the bench command after --"),
        "not a number": (["--a", str(REPO_ROOT), "--b", str(REPO_ROOT), "--repeats", "x", "--", "bench/lineage.py"],
                         r"argument --repeats: invalid int value: 'x'"),
        "no runs": (["--a", str(REPO_ROOT), "--b", str(REPO_ROOT), "--repeats", "0", "--", "bench/lineage.py"],
                    r"--repeats must be >= 1, got 0"),
        "not a checkout": (["--a", "/nonexistent-g2c", "--b", str(REPO_ROOT), "--", "bench/lineage.py"],
                           r"/nonexistent-g2c has no bench/lineage.py"),
    },
    "bench/specdec.py": {
        "negative count": (["--new-tokens", "-1"], r"--new-tokens -1: use 1 or more"),
        "not a number": (["--ks", "1,x"], r"--ks 1,x: give comma-separated draft lengths"),
        "unknown name": (["--target", "nope"], r"unknown artifact 'nope'"),
        "output is a folder": (["--out", str(REPO_ROOT / "docs")], r"argument --out: .*docs is a folder; give the "
                                                                     r"file to write"),
        "unknown choice": (["--dtype", "fp8"], r"argument --dtype: invalid choice: 'fp8'"),
        "option without its mode": (["--seed-table", "--dtype", "bfloat16"], r"--dtype goes with the drafter table"),
        "seed-table option alone": (["--mtp-steps", "5"], r"--mtp-steps goes with --seed-table \(the drafter table "
                                                          r"uses the shipped heads"),
        "draft past the window": (["--ks", "4,9999"], r"--ks 9999: at most 254 draft tokens fit StoryLM-30M's "
                                                      r"256-token window"),
    },
    "bench/specdec_sampling.py": {
        "negative count": (["--new-tokens", "-3"], r"argument --new-tokens: -3 is below 1; use an int >= 1"),
        "not a number": (["--k", "two"], r"argument --k: 'two' is not an integer"),
        "unknown choice": (["--modes", "fast"], r"argument --modes: 'fast': choose from greedy, sampled"),
        "non-finite": (["--temperature", "nan"], r"argument --temperature: nan is not allowed; use a finite number > "),
        "unknown name": (["--drafter", "GPT-9"], r"argument --drafter: unknown model 'GPT-9'; use one of StoryLM-1M"),
        "unknown device": (["--device", "tpu"], r"argument --device: unknown device 'tpu'"),
    },
    "bench/lineage.py": {
        "negative count": (["--prompts", "-2"], r"argument --prompts: -2 is below 1"),
        "zero temperature": (["--temperature", "0"], r"argument --temperature"),
        "unknown row": (["--rows", "Medusa,Hydra"], r"argument --rows: 'Hydra': choose from"),
        "output is a folder": (["--json", str(REPO_ROOT / "docs")], r"argument --json: .*docs is a folder"),
        "no drafters there": (["--drafters", str(REPO_ROOT / "docs")], r"argument --drafters: .*docs holds no "
                                                                        r"drafters .*--budget"),
        "no such folder": (["--drafters", str(REPO_ROOT / "runs" / "budget-7")], r"argument --drafters: .*budget-7: "
                                                                                  r"no such folder"),
        "one level too deep": (["--drafters", str(REPO_ROOT / "docs/bench/budgets/budget-512000/models/StoryLM-30M-"
                                                  "Block")],
                               r"inside a budgeted run's folder: give the folder itself, .*budgets/budget-512000$"),
        "two modes at once": (["--ttt-agreement-only", "--draft-vocab-only"], r"are separate measurements"),
        "a row the mode lacks": (["--draft-vocab-only", "--rows", "Medusa"], r"measures the EAGLE-3 row"),
        "option without its mode": (["--draft-dtype", "bfloat16"], r"--draft-dtype sets the fast path's drafters: "
                                                                    r"add --fast"),
        "backend without --fast": (["--fast-backend", "plain"], r"--fast-backend chooses the fast path's backend: "
                                                                 r"add --fast"),
        "nothing to convert": (["--fast", "--draft-dtype", "bfloat16", "--rows", "ngram"],   # a trial: it ran
                               r"--rows n-gram has none \(the n-gram row looks tokens up in the prompt\)"),
        "empty row list": (["--rows", ""], r"argument --rows: an empty list: choose from"),
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
        "output is a file": (["--out", str(REPO_ROOT / "README.md")], r"argument --out: .*README\.md is a file; give "
                                                                       r"a folder"),
    },
    "bench/specdec_serving.py": {
        "negative count": (["--new-tokens", "-1"], r"argument --new-tokens: -1 is below 1"),
        "not a number": (["--batches", "1,b"], r"argument --batches: 'b' is not an integer"),
        "zero repeats": (["--repeats", "0"], r"argument --repeats: 0 is below 1"),
        "output is a file": (["--out", str(REPO_ROOT / "README.md")], r"argument --out: .*README\.md is a file; give "
                                                                       r"a folder"),
    },
    "bench/peer_hf.py": {
        "negative count": (["--prompts", "-8"], r"argument --prompts: -8 is below 1"),
        "not a number": (["--ks", "1,2,x"], r"argument --ks: 'x' is not an integer"),
        "unknown choice": (["--dtypes", "float64"], r"argument --dtypes: 'float64' \(did you mean 'float16'\?\): "
                                                    r"choose from float32"),
        "unknown name": (["--drafters", "StoryLM-1M,nope"], r"argument --drafters: unknown model 'nope'"),
    },
    "bench/train_throughput.py": {
        "negative count": (["--steps", "0"], r"argument --steps: 0 is below 1"),
        "not a number": (["--batch-size", "x"], r"argument --batch-size: 'x' is not an integer"),
        "unknown choice": (["--precisions", "fp8"], r"argument --precisions: 'fp8': choose from fp32, bf16"),
        "unknown device": (["--device", "auto"], r"argument --device: 'auto' is not accepted here"),
    },
    "bench/linear_kernels.py": {
        "negative count": (["--rounds", "0"], r"argument --rounds: 0 is below 1"),
        "unknown choice": (["--clock", "sundial"], r"argument --clock: invalid choice"),
    },
    "bench/roofline.py": {
        "negative count": (["--context", "-3"], r"argument --context: -3 is below 1"),
        "not a number": (["--rows", "1,2,x"], r"argument --rows: 'x' is not an integer"),
        "unknown name": (["--models", "StoryLM-1M,nope"], r"argument --models: unknown model 'nope'"),
        "unknown device": (["--device", "tpu"], r"argument --device: unknown device 'tpu'"),
        "output is a folder": (["--plot", str(REPO_ROOT / "docs")], r"argument --plot: .*docs is a folder"),
    },
    "bench/llamacpp.py": {
        "negative count": (["--k", "0"], r"argument --k: 0 is below 1"),
        "not a number": (["--new-tokens", "many"], r"argument --new-tokens: 'many' is not an integer"),
        "unknown name": (["--drafter", "nope"], r"argument --drafter: unknown model 'nope'"),
        "wrong kind": (["--drafter", "StoryLM-30M-EAGLE"], r"argument --drafter: StoryLM-30M-EAGLE is a draft head on "
                                                           r"StoryLM-30M.s states; llama\.cpp.s draft-model "
                                                           r"speculation needs a standalone language model"),
        "draft past the window": (["--k", "300"], r"argument --k: 300: at most 254 draft tokens fit StoryLM-30M's"),
        "missing folder": (["--bin", "/nonexistent/llama"], r"argument --bin: /nonexistent/llama: no such folder; "
                                                            r"build llama\.cpp's tools with python "
                                                            r"bench/setup_llamacpp\.py"),
    },
    "bench/setup_llamacpp.py": {
        "negative count": (["--jobs", "-1"], r"argument --jobs: -1 is below 1"),
        "unknown choice": (["--backend", "vulkan9"], r"argument --backend: invalid choice"),
    },
    "g2c/assets/gguf.py": {
        "unknown name": (["StoryLM-2M", "x.gguf"], r"argument name: unknown model 'StoryLM-2M'"),
        "unknown choice": (["StoryLM-1M", "x.gguf", "--outtype", "q3"], r"argument --outtype: invalid choice"),
        "wrong kind": (["--check", "x.gguf", "StoryLM-30M-MTP"], r"error: StoryLM-30M-MTP is a draft head, not a "
                                                                 r"language model"),
        "output is a folder": (["StoryLM-1M", str(REPO_ROOT / "docs")], r"error: .*docs is a folder; give the "
                                                                        r"\.gguf file"),
    },
    "g2c/assets/data.py": {
        "unknown option": (["--tokens", "5"], r"unrecognized arguments: --tokens 5"),
    },
    "g2c/assets/checkpoints.py": {
        "unknown name": (["StoryLM-2M"], r"checkpoints: error: unknown artifact 'StoryLM-2M'"),
        "a near miss": (["StoryLM-30"], r"unknown artifact 'StoryLM-30' \(did you mean 'StoryLM-30M'\?\)"),
        "a name's last part": (["--train", "EAGLE"], r"\(did you mean 'StoryLM-30M-EAGLE'\?\)"),
    },
    "g2c/assets/export.py": {
        "unknown choice": (["StoryLM-1M", "--hf", "x", "--dtype", "float64"], r"argument --dtype: invalid choice"),
        "wrong kind": (["StoryLM-30M-EAGLE", "--hf", "x"], r"error: StoryLM-30M-EAGLE is a draft head on a base "
                                                           r"model, not a language model"),
        "output is a file": (["StoryLM-1M", "--hf", str(REPO_ROOT / "README.md")], r"error: .*README\.md is a file"),
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


# -- the Python API: every loop x every bad argument ------------------------------------------

V = 16


def _lm(seed: int = 0):
    import torch

    from g2c.transformer import TransformerLM

    return TransformerLM(V, 8, 1, 2, 32, generator=torch.Generator().manual_seed(seed)).eval()


def _recurrent():
    import torch

    from g2c.recurrent import RecurrentLM, fan_in_init_

    return fan_in_init_(RecurrentLM(V, 16, 2, 2, layout="RA", max_seq_len=32),
                        generator=torch.Generator().manual_seed(0)).eval()


def _loops():
    """name -> (call(prompt, max_new_tokens, **extra), the extra keyword arguments it samples with)."""
    import torch

    from g2c.kvcache import cached_generate
    from g2c.recurrent import greedy_drafter, plain_greedy, speculative_generate_stateful
    from g2c.sampling import generate
    from g2c.specdec import MTPHead, mtp_generate, speculative_generate
    from g2c.specdec.lab.batched import batched_greedy, batched_speculative_generate
    from g2c.specdec.lineage import MedusaDrafter, MedusaHeads, lineage_generate
    from g2c.specdec.sampling.cached import mtp_generate_cached, speculative_generate_cached
    from g2c.specdec.sampling.drafters import LMDrafter
    from g2c.specdec.sampling.loop import speculative_sample
    from g2c.specdec.serving import constrained_generate, constrained_speculative_sample
    from g2c.specdec.trees.verify import tree_speculative_generate

    target, draft = _lm(0), _lm(1)
    medusa = MedusaDrafter(MedusaHeads(target, 2))
    head = MTPHead(target, generator=torch.Generator().manual_seed(2))
    rec = _recurrent()
    constraint = _constraint()
    sampled = SAMPLED
    return {
        "generate": (lambda p, n, **kw: generate(target, p, n, **kw), sampled),
        "cached_generate": (lambda p, n, **kw: cached_generate(target, p, n, **kw), sampled),
        "speculative_generate": (lambda p, n, **kw: speculative_generate(target, draft, p, n, k=2, **kw), ()),
        "speculative_sample": (lambda p, n, **kw: speculative_sample(target, LMDrafter(draft), p, n, k=2, **kw),
                               sampled),
        "speculative_generate_cached": (lambda p, n, **kw: speculative_generate_cached(target, draft, p, n, k=2,
                                                                                       **kw), ()),
        "mtp_generate": (lambda p, n, **kw: mtp_generate(target, head, p, n, **kw), ()),
        "mtp_generate_cached": (lambda p, n, **kw: mtp_generate_cached(target, head, p, n, **kw), ()),
        "tree_speculative_generate": (lambda p, n, **kw: tree_speculative_generate(target, draft, p, n, num_nodes=4,
                                                                                   **kw), sampled),
        "batched_greedy": (lambda p, n, **kw: batched_greedy(target, [p], n, **kw), ()),
        "batched_speculative_generate": (lambda p, n, **kw: batched_speculative_generate(target, draft, [p], n, k=2,
                                                                                         **kw), ()),
        "lineage_generate": (lambda p, n, **kw: lineage_generate(target, medusa, p, n, num_nodes=3, **kw), sampled),
        "plain_greedy": (lambda p, n, **kw: plain_greedy(rec, p, n, **kw), ()),
        "speculative_generate_stateful": (lambda p, n, **kw: speculative_generate_stateful(
            rec, greedy_drafter(rec), p, n, k=2, **kw), ()),
        # specdec-serving: the constraint covers the new tokens; its EOS is the loop's (cases below)
        "constrained_generate": (lambda p, n, **kw: constrained_generate(target, p, n, constraint, **kw), sampled),
        "constrained_speculative_sample": (lambda p, n, **kw: constrained_speculative_sample(
            target, LMDrafter(draft), p, n, constraint, k=2, **kw), sampled),
    }


def _constraint(pattern: str = "[a-o]+", vocab: int = V, eos_id: int = 0):
    """A ``TokenConstraint`` over a toy vocabulary: id 0 special (EOS), ids 1.. the bytes a, b, c, ..."""
    from g2c.specdec.serving import TokenConstraint

    return TokenConstraint(pattern, [None] + [bytes([0x61 + i]) for i in range(vocab - 1)], eos_id)


SAMPLED = ("temperature", "generator")
EOS = ("eos_id",)
WARPED = ("top_k", "top_p")          # issue 28: the engine's warpers reach every preset that samples
PENALTY = ("repetition_penalty",)    # issue 28: module 11's penalty, and the engine's stops, on every engine preset
STOPS = ("stop_ids", "stop_strings")
# loop -> the knobs it takes (sampling: temperature and generator; eos_id); the calls live in _loops()
LOOPS: dict[str, tuple[str, ...]] = {
    "generate": SAMPLED + WARPED + EOS + PENALTY, "cached_generate": SAMPLED + WARPED + EOS + PENALTY,
    "speculative_generate": EOS, "speculative_sample": SAMPLED + WARPED + EOS + PENALTY + STOPS,
    "speculative_generate_cached": EOS, "mtp_generate": EOS, "mtp_generate_cached": EOS,
    "tree_speculative_generate": SAMPLED + WARPED + EOS + PENALTY + STOPS, "batched_greedy": EOS,
    "batched_speculative_generate": EOS, "lineage_generate": SAMPLED + WARPED + EOS + PENALTY + STOPS,
    "plain_greedy": (),
    "speculative_generate_stateful": EOS,
    # specdec-serving: EOS is the constraint's (test_constrained_loops_take_the_constraints_eos_only)
    "constrained_generate": SAMPLED + WARPED, "constrained_speculative_sample": SAMPLED + WARPED + PENALTY + STOPS,
}

def _generator_on(device: str):
    """A CPU ``torch.Generator`` that reports another device: a CUDA or MPS generator, without the GPU."""
    import torch

    class Elsewhere(torch.Generator):
        @property
        def device(self):
            return torch.device(device)

    return Elsewhere().manual_seed(0)


# class -> (prompt, max_new_tokens, extra kwargs, the keyword it needs or None, error, match)
BAD_ARGS = {
    "float budget": ([1, 2], 2.5, {}, None, TypeError, r"max_new_tokens must be an int.*got float 2\.5"),
    "None budget": ([1, 2], None, {}, None, TypeError, r"max_new_tokens must be an int.*got NoneType None"),
    "negative budget": ([1, 2], -1, {}, None, ValueError, r"max_new_tokens must be (an int )?>= 0"),
    "empty prompt": ([], 3, {}, None, ValueError, r"must be a non-empty 1-D sequence of token ids"),
    "float prompt": ([1.5, 2.0], 3, {}, None, ValueError, r"must hold integer token ids, got dtype torch\.float"),
    "negative id": ([1, -1], 3, {}, None, ValueError, r"holds token id -1, outside the vocabulary \[0, 16\)"),
    "out-of-vocabulary id": ([1, V], 3, {}, None, ValueError, r"holds token id 16, outside the vocabulary \[0, 16\)"),
    "NaN temperature": ([1, 2], 3, {"temperature": float("nan")}, "temperature", ValueError,
                        r"temperature must be >= 0 and finite"),
    "infinite temperature": ([1, 2], 3, {"temperature": float("inf")}, "temperature", ValueError,
                             r"temperature must be >= 0 and finite"),
    "seed as generator": ([1, 2], 3, {"temperature": 1.0, "generator": 0}, "generator", TypeError,
                          r"generator must be a torch\.Generator or None, got int 0; use torch\.Generator\(\)"),
    # a CUDA or MPS generator reached torch's own device error in the middle of a loop (the draws are on the CPU)
    "generator on another device": ([1, 2], 3, {"temperature": 1.0, "generator": _generator_on("cuda:0")}, "generator",
                                    ValueError, r"generator is on cuda:0; g2c draws its random numbers on the CPU "
                                                r".*use torch\.Generator\(\)\.manual_seed\(seed\)"),
    # issue 31: an eos_id the model can never emit made every loop run silently to its budget
    "eos outside the vocabulary": ([1, 2], 3, {"eos_id": V}, "eos_id", ValueError,
                                   r"eos_id 16 is outside the vocabulary \[0, 16\): the loop could never emit it"),
    "negative eos": ([1, 2], 3, {"eos_id": -1}, "eos_id", ValueError, r"eos_id -1 is outside the vocabulary"),
    "float eos": ([1, 2], 3, {"eos_id": 2.0}, "eos_id", TypeError, r"eos_id must be an int, got float 2\.0"),
    # issue 28: top-k / top-p on every loop that samples, the same rule as module 11's
    "zero top_k": ([1, 2], 3, {"temperature": 1.0, "top_k": 0}, "top_k", ValueError, r"top_k must be (an int )?>= 1"),
    "float top_k": ([1, 2], 3, {"temperature": 1.0, "top_k": 2.5}, "top_k", TypeError,
                    r"top_k must be an int, got float 2\.5"),
    "top_p above 1": ([1, 2], 3, {"temperature": 1.0, "top_p": 1.5}, "top_p", ValueError,
                      r"top_p must be in \(0, 1\] or None, got 1\.5"),
    "string top_p": ([1, 2], 3, {"temperature": 1.0, "top_p": "0.5"}, "top_p", TypeError,
                     r"top_p must be a real number in \(0, 1\] or None, got str '0\.5'"),
    # a helper's trial: a positive top_p that float32 rounds to 0 kept no token (torch's raw multinomial error)
    "top_p that float32 rounds to 0": ([1, 2], 3, {"temperature": 1.0, "top_p": 1e-46}, "top_p", ValueError,
                                       r"top_p=1e-46 rounds to 0 in float32 .* use e\.g\. 1e-9"),
    # issue 28: the engine's controls, refused as module 11 refuses its penalty
    "zero repetition_penalty": ([1, 2], 3, {"repetition_penalty": 0.0}, "repetition_penalty", ValueError,
                                r"repetition_penalty must be > 0 and finite"),
    "string repetition_penalty": ([1, 2], 3, {"repetition_penalty": "1.2"}, "repetition_penalty", TypeError,
                                  r"repetition_penalty must be a real number > 0, got str '1\.2'"),
    "stop id outside the vocabulary": ([1, 2], 3, {"stop_ids": [V]}, "stop_ids", ValueError,
                                       r"stop_ids: 16 is outside the vocabulary \[0, 16\)"),
    "stop strings without decode": ([1, 2], 3, {"stop_strings": ["The end"]}, "stop_strings", ValueError,
                                    r"stop_strings need decode"),
}


@pytest.fixture(scope="module")
def loops():
    return _loops()


def test_every_loop_is_listed(loops):
    assert set(loops) == set(LOOPS)


@pytest.mark.parametrize("loop, case", [(loop, case) for loop, knobs in LOOPS.items() for case, bad in BAD_ARGS.items()
                                        if bad[3] is None or bad[3] in knobs])
def test_loop_bad_argument_is_a_one_line_error(loops, loop, case):
    prompt, budget, extra, _, error, match = BAD_ARGS[case]
    with pytest.raises(error, match=match) as info:
        loops[loop][0](prompt, budget, **extra)
    assert "\n" not in str(info.value)


# -- caches and counts that enter elsewhere ----------------------------------------------------

def test_cache_from_another_model_or_dtype_is_refused():
    import torch

    from g2c.kvcache import KVCache, cached_forward, cached_generate
    from g2c.transformer import TransformerLM

    model = _lm()
    other = TransformerLM(V, 16, 1, 4, 32, generator=torch.Generator().manual_seed(0))
    ids = torch.tensor([[1, 2]])
    with pytest.raises(ValueError, match=r"the cache holds 4 heads of 4 but the model has 2 of 4: it was built for "
                                         r"another model; build it with KVCache\.for_model\(model\)"):
        cached_forward(model, ids, KVCache.for_model(other))
    with pytest.raises(ValueError, match=r"the cache is torch\.float16 on cpu but the model computes in "
                                         r"torch\.float32"):
        cached_forward(model, ids, KVCache.for_model(model, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"built for another model"):
        cached_generate(model, [1, 2], 3, cache=KVCache.for_model(other))


@pytest.mark.parametrize("value, error, match", [
    (2.5, TypeError, r"KVCache\.advance: num_new must be an int, got float 2\.5"),
    (None, TypeError, r"num_new must be an int, got NoneType None"),
    (-1, ValueError, r"KVCache\.advance: cannot move length 0 by -1"),
])
def test_cache_advance_refuses_a_non_count(value, error, match):
    from g2c.kvcache import KVCache

    cache = KVCache(1, 1, 1, 2, 8)
    with pytest.raises(error, match=match):
        cache.advance(value)
    assert cache.length == 0


def test_a_choice_list_reads_names_without_their_dashes_and_suggests_the_closest():
    import argparse

    from g2c.assets.cli import choice_list

    rows = choice_list("n-gram", "EAGLE", "EAGLE-2", "EAGLE-3", "EAGLE static tree")
    assert rows("ngram, eagle3,EAGLE static tree") == "n-gram,EAGLE-3,EAGLE static tree"
    assert rows("eagle_2") == "EAGLE-2" and rows("EAGLE") == "EAGLE"
    with pytest.raises(argparse.ArgumentTypeError, match=r"'EAGEL-3' \(did you mean 'EAGLE-3'\?\): choose from"):
        rows("EAGEL-3")
    twins = choice_list("a-b", "ab")                   # choices that differ only by a dash keep their spellings
    assert twins("a-b") == "a-b" and twins("AB") == "ab"
    with pytest.raises(argparse.ArgumentTypeError, match=r"'a_b'"):
        twins("a_b")


@pytest.mark.parametrize("text, expected", [
    ("", r"an empty list: choose from n-gram, EAGLE"),            # a student trial: "'': choose from ..."
    (" , ", r"an empty list"),
    ("ngram,,EAGLE", r"'ngram,,EAGLE' has an empty item between commas \(something left out\?\)"),   # was accepted
    ("EAGLE,", r"has an empty item between commas"),
    ("ngram,n-gram", r"n-gram named twice in 'ngram,n-gram': name each once"),
])
def test_every_list_option_refuses_an_empty_list_an_empty_item_and_a_repeat(text, expected):
    import argparse

    from g2c.assets.cli import choice_list, int_list, model_list

    with pytest.raises(argparse.ArgumentTypeError, match=expected):
        choice_list("n-gram", "EAGLE")(text)
    if "named twice" not in expected:                   # the same rule for ints and model names
        rule = "an empty list" if "empty list" in expected else "has an empty item between commas"
        with pytest.raises(argparse.ArgumentTypeError, match=rule):
            int_list()(text.replace("ngram", "1").replace("EAGLE", "4"))
        with pytest.raises(argparse.ArgumentTypeError, match=rule):
            model_list()(text.replace("ngram", "StoryLM-1M").replace("EAGLE", "StoryLM-5M"))
    assert int_list()("1, 2,4") == "1,2,4" and model_list()("storylm-1m") == "StoryLM-1M"


def test_shared_validators_name_the_argument_and_the_fix():
    import numpy as np
    import torch

    from g2c.sampling.model import check_count, check_generator, check_temperature

    assert check_count(np.int64(3), "k", minimum=1) == 3 and check_count(torch.tensor(2), "n") == 2
    with pytest.raises(TypeError, match=r"k must be an int >= 1, got bool True; pass a whole number"):
        check_count(True, "k", minimum=1)
    with pytest.raises(TypeError, match=r"n must be an int >= 0, got str '3'"):
        check_count("3", "n")
    with pytest.raises(TypeError, match=r"generator must be a torch\.Generator or None, got int 7; use "
                                        r"torch\.Generator\(\)\.manual_seed\(seed\)"):
        check_generator(7)
    with pytest.raises(TypeError, match=r"temperature must be a real number >= 0 \(0 = greedy\), got str"):
        check_temperature("hot")
    assert check_temperature(torch.tensor(0.5)) == 0.5


# -- verifiers: every flat and tree verifier x every bad table (families 1-3) --------------------

def _tables():
    """A 2-token draft (flat) and a root -> a -> b chain tree over V = 3, with good tables."""
    import torch

    from g2c.specdec.trees import DraftTree

    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]])
    q = torch.tensor([[0.2, 0.5, 0.3], [0.4, 0.4, 0.2]])
    draft = torch.tensor([1, 0])
    tree = DraftTree(torch.tensor([1, 0]), torch.tensor([-1, 0]), proposal_probs=q)
    return draft, tree, p, q


def _verifiers():
    """name -> call(draft, tree, target table, draft/proposal table)."""
    import torch

    from g2c.specdec import greedy_verify, speculative_verify
    from g2c.specdec.lineage.medusa import typical_tree_verify
    from g2c.specdec.trees import DraftTree, greedy_tree_verify, tree_speculative_verify

    def gen():
        return torch.Generator().manual_seed(0)

    def with_q(tree, q):
        return DraftTree(tree.tokens, tree.parents, proposal_probs=q)

    return {
        "greedy_verify": lambda d, t, p, q: greedy_verify(d, p),
        "speculative_verify": lambda d, t, p, q: speculative_verify(d, p, q, generator=gen()),
        "greedy_tree_verify": lambda d, t, p, q: greedy_tree_verify(t, p),
        "tree_speculative_verify": lambda d, t, p, q: tree_speculative_verify(with_q(t, q), p, generator=gen()),
        "typical_tree_verify": lambda d, t, p, q: typical_tree_verify(with_q(t, q), p, generator=gen()),
    }


PROB_VERIFIERS = ("speculative_verify", "tree_speculative_verify", "typical_tree_verify")
SCORE_VERIFIERS = ("greedy_verify", "greedy_tree_verify")
# class -> (verifiers, (p, q) -> (p, q) damaged, error match)
BAD_TABLES = {
    "target rows summing to 10": (PROB_VERIFIERS, lambda p, q: (10 * p, q),
                                  r"target_probs must hold probabilities: row 0 sums to 10, not 1 "
                                  r"\(tolerance 0\.001\)"),
    "draft rows summing to 0.01": (PROB_VERIFIERS, lambda p, q: (p, 0.01 * q),
                                   r"(draft|proposal)_probs must hold probabilities: row 0 sums to 0\.01, not 1"),
    "raw logits as probabilities": (PROB_VERIFIERS, lambda p, q: (p.log(), q),
                                    r"target_probs must hold probabilities: row 0 has a NaN, infinite or negative"),
    "NaN probability row": (PROB_VERIFIERS, lambda p, q: (p.index_fill(0, __import__("torch").tensor([1]),
                                                                       float("nan")), q),
                            r"target_probs must hold probabilities: row 1 has a NaN"),
    "NaN score row": (SCORE_VERIFIERS, lambda p, q: (p.index_fill(0, __import__("torch").tensor([1]), float("nan")),
                                                     q), r"target_logits holds NaN: the model produced NaN scores"),
    "all -inf score row": (SCORE_VERIFIERS, lambda p, q: (p.index_fill(0, __import__("torch").tensor([0]),
                                                                       float("-inf")), q),
                           r"target_logits row 0 is all -inf: every token is masked"),
    # issue 31: tables that are not floating point were waved through (an int64 table of counts of p
    # made speculative_verify emit q's distribution); they are refused, never converted
    "integer counts as target probabilities": (PROB_VERIFIERS, lambda p, q: ((p * 10).long(), q),
                                               r"target_probs must hold probabilities as a floating-point tensor "
                                               r"\(float32, float16, bfloat16\), got dtype torch\.int64; normalise"),
    "integer counts as draft probabilities": (PROB_VERIFIERS, lambda p, q: (p, (q * 10).long()),
                                              r"(draft_probs|tree\.proposal_probs) must hold probabilities as a "
                                              r"floating-point tensor .*got dtype torch\.int64"),
    "bool one-hot as probabilities": (PROB_VERIFIERS, lambda p, q: (p == p.amax(-1, keepdim=True), q),
                                      r"target_probs must hold probabilities as a floating-point tensor .*torch\.bool"),
    "integer scores": (SCORE_VERIFIERS, lambda p, q: ((p * 10).long(), q),
                       r"target_logits must hold scores as a floating-point tensor .*got dtype torch\.int64"),
    "draft id outside the vocabulary": (SCORE_VERIFIERS + PROB_VERIFIERS, None,
                                        r"(draft_ids|tree\.tokens) holds token id 3, outside the vocabulary \[0, 3\)"),
}


@pytest.mark.parametrize("verifier, case", [(v, c) for c, (vs, _, _) in BAD_TABLES.items() for v in vs])
def test_verifier_bad_table_is_a_one_line_error(verifier, case):
    import torch

    from g2c.specdec.trees import DraftTree

    draft, tree, p, q = _tables()
    _, damage, match = BAD_TABLES[case]
    if damage is None:
        draft, tree = torch.tensor([1, 3]), DraftTree(torch.tensor([1, 3]), torch.tensor([-1, 0]), proposal_probs=q)
    else:
        p, q = damage(p, q)
    with pytest.raises(ValueError, match=match) as info:
        _verifiers()[verifier](draft, tree, p, q)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_verifiers_accept_good_tables(dtype):
    import torch

    draft, tree, p, q = _tables()
    p, q = p.to(getattr(torch, dtype)), q.to(getattr(torch, dtype))     # every float dtype is a table
    for name, call in _verifiers().items():
        path_or_count, token = call(draft, tree, p, q)
        assert 0 <= token < 3, name


@pytest.mark.parametrize("verifier", PROB_VERIFIERS)
def test_sampling_verifier_refuses_a_seed_as_generator(verifier):
    # issue 31: an int generator reached torch.rand and came back as a torch argument-parsing error
    from g2c.specdec import speculative_verify
    from g2c.specdec.lineage.medusa import typical_tree_verify
    from g2c.specdec.trees import tree_speculative_verify

    draft, tree, p, q = _tables()
    call = {"speculative_verify": lambda: speculative_verify(draft, p, q, generator=7),
            "tree_speculative_verify": lambda: tree_speculative_verify(tree, p, generator=7),
            "typical_tree_verify": lambda: typical_tree_verify(tree, p, generator=7)}[verifier]
    with pytest.raises(TypeError, match=r"generator must be a torch\.Generator or None, got int 7"):
        call()


def test_typical_accept_refuses_counts_and_non_numbers():
    import torch

    from g2c.specdec.lineage.medusa import typical_accept

    with pytest.raises(ValueError, match=r"probs must hold probabilities as a floating-point tensor"):
        typical_accept(torch.tensor([[3, 1]]), torch.tensor([0]))      # was: tensor([True]) from counts
    with pytest.raises(TypeError, match=r"typical_accept: epsilon must be a real number, got str"):
        typical_accept(torch.tensor([[0.5, 0.5]]), torch.tensor([0]), epsilon="0.1")
    with pytest.raises(ValueError, match=r"typical_accept: tokens holds token id 2, outside the vocabulary"):
        typical_accept(torch.tensor([[0.5, 0.5]]), torch.tensor([2]))


# -- a model that produced NaN: every loop stops with an error naming the step (family 3) ------

@pytest.fixture(scope="module")
def nan_loops():
    import torch

    loops = _loops()
    for fn, _ in loops.values():          # every model the calls close over gets a NaN embedding
        for cell in fn.__closure__ or ():
            model = cell.cell_contents
            if hasattr(model, "token_embed"):
                with torch.no_grad():
                    model.token_embed.weight.fill_(float("nan"))
    return loops


@pytest.mark.parametrize("loop", list(LOOPS))
def test_loop_with_a_nan_model_names_the_step(nan_loops, loop):
    extra = {"temperature": 1.0, "generator": __import__("torch").Generator().manual_seed(0)} \
        if "temperature" in LOOPS[loop] else {}
    with pytest.raises(ValueError, match=r"(holds? NaN|must hold probabilities: row \d+ has a NaN)") as info:
        nan_loops[loop][0]([1, 2, 3], 4, **extra)
    assert "\n" not in str(info.value)


def test_generate_names_the_position_of_a_nan_or_dead_row():
    import torch
    from specdec_mocks import TableLM

    from g2c.sampling import generate

    table = torch.zeros(4, 4)
    table[2] = float("-inf")                                    # after token 2 every token is masked
    model = TableLM(table)
    with pytest.raises(ValueError, match=r"logits is all -inf at the step scoring position 3"):
        generate(model, [0, 1, 2], 3, temperature=0.0)
    table[2] = float("nan")
    with pytest.raises(ValueError, match=r"logits holds NaN at the step scoring position 3"):
        generate(model, [0, 1, 2], 3, temperature=1.0, generator=torch.Generator().manual_seed(0))


# -- recurrent transactions refuse misuse (family 5) --------------------------------------------

def test_transaction_refuses_a_block_of_another_batch_and_an_empty_prefill():
    from g2c.recurrent import make_transaction

    txn = make_transaction(_recurrent(), "replay")
    txn.begin()
    with pytest.raises(ValueError, match=r"advance\(\) got a block of shape \(2, 3\) but the transaction holds 1 "
                                         r"row\(s\); pass \(T,\) for batch 1"):
        txn.advance([[1, 2, 3], [4, 5, 6]])
    with pytest.raises(ValueError, match=r"advance\(\) tokens holds token id 16, outside the vocabulary"):
        txn.advance([1, 16])
    txn.rollback()
    with pytest.raises(ValueError, match=r"prefill\(\) needs at least one token id, got an empty prompt"):
        make_transaction(_recurrent(), "snapshot").prefill([])


@pytest.mark.parametrize("strategy", ["snapshot", "replay", "recompute"])
def test_stateful_loop_refuses_a_used_or_foreign_transaction(strategy):
    import torch

    from g2c.recurrent import RecurrentLM, fan_in_init_, greedy_drafter, make_transaction, speculative_generate_stateful

    target = _recurrent()
    other = fan_in_init_(RecurrentLM(V, 16, 2, 2, layout="RA", max_seq_len=32),
                         generator=torch.Generator().manual_seed(9))
    with pytest.raises(ValueError, match=r"transaction was built on another model, not on target"):
        speculative_generate_stateful(target, greedy_drafter(target), [1, 2], 4, strategy=make_transaction(other,
                                                                                                           strategy))
    txn = make_transaction(target, strategy)
    first, _, _ = speculative_generate_stateful(target, greedy_drafter(target), [1, 2], 4, strategy=txn)
    with pytest.raises(ValueError, match=r"transaction was used already .*build a fresh one with make_transaction"):
        speculative_generate_stateful(target, greedy_drafter(target), [1, 2], 4, strategy=txn)
    again, _, _ = speculative_generate_stateful(target, greedy_drafter(target), [1, 2], 4,
                                                strategy=make_transaction(target, strategy))
    assert again.tolist() == first.tolist()


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(loop=st.sampled_from(list(LOOPS)),   # floats (even 2.0: never truncated), negatives, None, text
       budget=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(max_value=-1), st.none(),
                        st.text(max_size=3)))
def test_any_bad_budget_is_refused_by_every_loop(loops, loop, budget):
    with pytest.raises((TypeError, ValueError), match=r"max_new_tokens"):
        loops[loop][0]([1, 2], budget)


# -- issue 31: one-shot iterables are read once, before validation (family: iterables) ----------

def test_every_iterable_argument_is_read_once():
    """A generator of rank paths, fusion layers or tree parents gives the list's result."""
    import torch

    from g2c.specdec.lineage import MedusaDrafter, MedusaHeads
    from g2c.specdec.lineage.eagle3 import check_fusion_layers
    from g2c.specdec.lineage.medusa import medusa_tree
    from g2c.specdec.theory import tree_expected_tokens
    from g2c.specdec.trees.builders import check_choices
    from g2c.specdec.trees.verify import tree_speculative_generate

    paths = [(0,), (1,), (0, 0)]
    probs = torch.softmax(torch.arange(10.0).view(2, 5), dim=-1)
    assert medusa_tree(probs, iter(paths)).num_nodes == 3                     # was a 0-node tree
    assert MedusaDrafter(MedusaHeads(_lm(), 2), iter(paths)).choices == paths
    assert check_choices(iter(paths)) == paths
    assert check_fusion_layers(iter([3, 1, 2]), 4) == (1, 2, 3)
    assert tree_expected_tokens(iter([-1, 0]), iter([0.5, 0.5])) == 1.75
    from g2c.specdec.trees import static_choices

    assert static_choices(5, iter((0.6, 0.2))) == static_choices(5, (0.6, 0.2)) != []   # was [] from a generator
    target, draft = _lm(0), _lm(1)
    want, _ = tree_speculative_generate(target, draft, [1, 2], 8, tree="static", choices=paths)
    got, stats = tree_speculative_generate(target, draft, [1, 2], 8, tree="static", choices=iter(paths))
    assert got.tolist() == want.tolist()
    assert stats.drafted > 3                      # every pass drafted (a consumed generator drafts once, then never)


def test_commit_tree_kv_refuses_a_float_path():
    from g2c.kvcache import KVCache
    from g2c.specdec.trees import commit_tree_kv

    cache = KVCache(1, 1, 1, 2, 8)
    with pytest.raises(TypeError, match=r"commit_tree_kv: a path node must be an int, got float 0\.7"):
        commit_tree_kv(cache, 0, [0.7])                                   # was: silently node 0
    assert cache.length == 0


@pytest.mark.parametrize("choices, error, match", [
    ([(0.7,)], TypeError, r"rank in \(0\.7,\) must be an int, got float 0\.7"),     # was silently rank 0
    ([0, 1], TypeError, r"each choice must be a rank path"),
    ("01", TypeError, r"choices must be a list of rank paths"),
    ([(1,), (0,)], ValueError, r"sorted by \(depth, ranks\)"),
    ([(0, 0)], ValueError, r"\(0, 0\) has no prefix \(0,\)"),
])
def test_static_tree_choices_are_checked_where_they_enter(choices, error, match):
    from g2c.specdec.trees.verify import tree_speculative_generate

    with pytest.raises(error, match=match):
        tree_speculative_generate(_lm(0), _lm(1), [1, 2], 4, tree="static", choices=choices)


# -- issue 31: token ids against the vocabulary in every path ------------------------------------

def test_a_custom_drafters_tree_is_checked_before_the_target_reads_it():
    import torch

    from g2c.specdec.lineage import TreeDrafter, lineage_generate
    from g2c.specdec.trees import DraftTree

    target = _lm(0)

    class Drafter(TreeDrafter):
        vocab_size, base = V, target

        def __init__(self, tree):
            self.tree = tree

        def draft(self, context_ids, *, max_nodes, max_depth):
            return self.tree

    bad = DraftTree(torch.tensor([3, V]), torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"Drafter\.draft\(\): tree\.tokens holds token id 16, outside the "
                                         r"vocabulary \[0, 16\)"):
        lineage_generate(target, Drafter(bad), [1, 2], 4)                  # was a raw IndexError
    with pytest.raises(TypeError, match=r"Drafter\.draft\(\) must return a DraftTree .*got list"):
        lineage_generate(target, Drafter([3, 4]), [1, 2], 4)
    good = DraftTree(torch.tensor([3, 4]), torch.tensor([-1, 0]))
    ids, _ = lineage_generate(target, Drafter(good), [1, 2], 4)
    from g2c.sampling import generate
    assert ids.tolist() == generate(target, [1, 2], 4, temperature=0.0).tolist()


def test_tree_drafts_and_tree_presets_refuse_bad_input_by_name():
    """Issue 28: a tree draft enters the engine through the drafter protocol, so it is checked there, and
    the tree presets check their own knobs before a pass runs (each was a raw error deep inside)."""
    import torch

    from g2c.kvcache import KVCache
    from g2c.specdec.lineage import lineage_generate
    from g2c.specdec.sampling.drafters import Drafter
    from g2c.specdec.sampling.loop import speculative_sample
    from g2c.specdec.sampling.target import CachedTarget
    from g2c.specdec.trees import DraftTree, tree_speculative_generate

    target, draft = _lm(0), _lm(1)

    class Proposer(Drafter):
        vocab_size = V

        def __init__(self, tree):
            self.tree = tree

        def propose(self, context_ids, k):
            return self.tree

    chain = DraftTree(torch.tensor([3, 4]), torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"Proposer\.propose: tree\.tokens holds token id 16, outside"):
        speculative_sample(CachedTarget(target), Proposer(DraftTree(torch.tensor([V]), torch.tensor([-1]))),
                           [1, 2], 3)
    seeded = lambda: torch.Generator().manual_seed(0)                      # noqa: E731  (sampled: one seed per run)
    ids, _ = speculative_sample(target, Proposer(chain), [1, 2], 3, generator=seeded())   # recompute: any draft
    assert len(ids) == 5
    cached, _ = speculative_sample(target, Proposer(chain), [1, 2], 3, use_cache=True, generator=seeded())  # cached
    assert cached.tolist() == ids.tolist()
    wide = DraftTree(torch.full((40,), 3), -torch.ones(40, dtype=torch.long))
    with pytest.raises(ValueError, match=r"CachedTarget: a tree of 40 nodes does not fit the window"):
        speculative_sample(CachedTarget(target), Proposer(wide), [1, 2], 3)
    ids, _ = speculative_sample(CachedTarget(target), Proposer(chain), [1, 2], 3)    # a hand-made tree is fine
    assert len(ids) == 5 and len(chain) == chain.numel() == 2
    with pytest.raises(TypeError, match=r"on_pass must be a callable or None, got str"):
        speculative_sample(target, Proposer(chain), [1, 2], 3, on_pass="print")
    with pytest.raises(TypeError, match=r"epsilon must be a real number, got str 'x'"):
        lineage_generate(target, _medusa(target), [1, 2], 3, acceptance="typical", epsilon="x")
    with pytest.raises(TypeError, match=r"width must be an int, got str '2'"):
        tree_speculative_generate(target, draft, [1, 2], 3, tree="dynamic", width="2")
    with pytest.raises(ValueError, match=r"width must be an int >= 1"):
        tree_speculative_generate(target, draft, [1, 2], 3, tree="dynamic", width=0)
    for shape in ("chain", "static"):          # width is EAGLE-2's: never ignored in silence (as choices)
        with pytest.raises(ValueError, match=rf"width shapes a dynamic tree only .* with tree='{shape}' it would be "
                                             r"ignored"):
            tree_speculative_generate(target, draft, [1, 2], 3, tree=shape, width=2)
    with pytest.raises(TypeError, match=r"target_cache must be a g2c\.kvcache\.KVCache"):
        tree_speculative_generate(target, draft, [1, 2], 3, target_cache="cache")
    with pytest.raises(TypeError, match=r"drafts trees with a language model .* got function"):
        tree_speculative_generate(target, lambda ids: ids, [1, 2], 3)
    out, _ = tree_speculative_generate(target, draft, [1, 2], 3, target_cache=KVCache.for_model(target))
    assert len(out) == 5


def test_engine_refuses_the_wrong_collaborator_by_name():
    """A student's trial (issue 28): the engine's target, drafter and controller are checked before a pass
    runs; each was a raw AttributeError or a confusing message ("vocab_size 16 differs from 16")."""
    import torch

    from g2c.specdec.sampling.draft import Draft
    from g2c.specdec.sampling.drafters import LMDrafter, NGramDrafter
    from g2c.specdec.sampling.loop import speculative_sample

    target, draft = _lm(0), _lm(1)
    with pytest.raises(TypeError, match=r"drafter \(TransformerLM\) does not satisfy the drafter protocol .*"
                                        r"missing start, propose, commit; wrap a model as LMDrafter\(model\)"):
        speculative_sample(target, draft, [1, 2], 3)
    with pytest.raises(TypeError, match=r"drafter \(NoneType\) does not satisfy the drafter protocol"):
        speculative_sample(target, None, [1, 2], 3)
    with pytest.raises(TypeError, match=r"target is a drafter \(LMDrafter\): pass the target model"):
        speculative_sample(LMDrafter(draft), LMDrafter(draft), [1, 2], 3)
    with pytest.raises(TypeError, match=r"target \(NoneType\) does not satisfy g2c\.sampling\.LanguageModel"):
        speculative_sample(None, NGramDrafter(), [1, 2], 3)
    with pytest.raises(TypeError, match=r"controller \(str\) must have next_k\(\) and update"):
        speculative_sample(target, NGramDrafter(), [1, 2], 3, controller="abc")
    odd = NGramDrafter()
    odd.vocab_size = "16"
    with pytest.raises(TypeError, match=r"drafter vocab_size must be an int .*got str '16'"):
        speculative_sample(target, odd, [1, 2], 3)
    with pytest.raises(ValueError, match=r"prompt_ids holds token id 1000, outside the vocabulary \[0, 16\)"):
        speculative_sample(target, NGramDrafter(), [1, 1000], 3)          # before any drafter reads it
    with pytest.raises(TypeError, match=r"use_cache must be True or False, got str 'yes'"):
        speculative_sample(target, LMDrafter(draft), [1, 2], 3, use_cache="yes")
    with pytest.raises(TypeError, match=r"stop_strings must be a str or a list of str, got int 5"):
        speculative_sample(target, NGramDrafter(), [1, 2], 3, stop_strings=5, decode=str)
    with pytest.raises(TypeError, match=r"prompt_lookup_max must be an int, got str '3'"):
        NGramDrafter(prompt_lookup_max="3")

    class ZeroQ(NGramDrafter):                       # drafts token 3 but reports a q row without it
        vocab_size = V

        def propose(self, context_ids, k):
            q = torch.zeros(1, V)
            q[0, 4] = 1.0
            return Draft(torch.tensor([3]), q)

    with pytest.raises(ValueError, match=r"ZeroQ\.propose: node 0 \(token 3\) gives probability 0 to its own token"):
        speculative_sample(target, ZeroQ(), [1, 2], 3, temperature=1.0, generator=torch.Generator().manual_seed(0))


def test_an_authors_new_drafter_meets_named_errors():
    """A helper wrote a new drafter from the docs: an integer q table (a one-hot of the draft as int64) was
    converted and run at T > 0, against the shared rule (refused, never converted); float or empty float ids
    were named by shape only, although the shape was legal and the dtype was wrong."""
    import torch

    from g2c.specdec.sampling.draft import Draft
    from g2c.specdec.sampling.drafters import Drafter
    from g2c.specdec.sampling.loop import speculative_sample

    target = _lm(0)

    class IntTable(Drafter):
        def propose(self, context_ids, k):
            d = torch.ones(k, dtype=torch.long)
            return Draft(d, torch.nn.functional.one_hot(d, V))                # int64 rows

    class FloatIds(Drafter):
        def propose(self, context_ids, k):
            return Draft(torch.ones(k))

    class NoMatch(Drafter):
        def propose(self, context_ids, k):
            return Draft(torch.tensor([]))                                    # float32, empty

    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match=r"Draft: proposal_probs must be floating-point "
                                         r"probabilities, got dtype torch\.int64: .* refused, never converted"):
        speculative_sample(target, IntTable(), [1, 2], 4, k=2, temperature=1.0, generator=gen)
    with pytest.raises(ValueError, match=r"Draft: tokens must be a 1-D integer tensor, got shape \(2,\) "
                                         r"dtype torch\.float32\Z"):
        speculative_sample(target, FloatIds(), [1, 2], 4, k=2)
    with pytest.raises(ValueError, match=r"got shape \(0,\) dtype torch\.float32; an empty draft is "
                                         r"Draft\.empty\(\)"):
        speculative_sample(target, NoMatch(), [1, 2], 4, k=2)


def test_a_helpers_trial_of_the_engine_is_mended():
    """A helper's break test of the engine (each was a hang, a silent loss or a raw torch error): a callback that
    drains or extends the tokens it is given changes nothing; a Target built without the states an EAGLE drafter
    reads is refused (it drafted nothing, in silence); a proposal that is not a pair, a NaN drafter row and a NaN
    or all -inf target row at T > 0 are named; the targets check their model and callbacks; flags are bools."""
    import torch
    from specdec_mocks import TableLM

    from g2c.specdec import MTPHead
    from g2c.specdec.sampling.drafters import LMDrafter, NGramDrafter
    from g2c.specdec.sampling.eagle import EagleDrafter, FeatureDrafter, MTPDrafter
    from g2c.specdec.sampling.loop import CachedTarget, RecomputeTarget, speculative_sample
    from g2c.specdec.trees import tree_speculative_generate

    target, draft = _lm(0), _lm(1)
    plain, plain_stats = speculative_sample(target, LMDrafter(draft), [1, 2, 3], 6, k=3, temperature=0.0)

    def drain(emitted, _):
        emitted.clear()

    def extend(emitted, _):
        emitted.append(0)

    for callback in (drain, extend):                        # the hang, and a budget overrun
        out, stats = speculative_sample(target, LMDrafter(draft), [1, 2, 3], 6, k=3, temperature=0.0,
                                        on_pass=callback)
        assert out.tolist() == plain.tolist() and stats.generated == plain_stats.generated == 6

    head = FeatureDrafter(target, generator=torch.Generator().manual_seed(0)).eval()
    for tgt in (CachedTarget(target), RecomputeTarget(target)):
        with pytest.raises(ValueError, match=rf"EagleDrafter drafts from the target's states, but this "
                                             rf"{type(tgt).__name__} was built without them .*want_hidden=True"):
            speculative_sample(tgt, EagleDrafter(head), [1, 2, 3], 4)
    mtp = MTPDrafter(MTPHead(target, generator=torch.Generator().manual_seed(0)).eval())
    with pytest.raises(ValueError, match=r"MTPDrafter drafts from the target's states"):
        speculative_sample(CachedTarget(target), mtp, [1, 2, 3], 4)
    _, ok = speculative_sample(CachedTarget(target, want_hidden=True), EagleDrafter(head), [1, 2, 3], 4)
    assert ok.drafted > 0

    class Shaped(NGramDrafter):
        def __init__(self, result):
            super().__init__()
            self.result = result

        def propose(self, context_ids, k):
            return self.result

    ids2 = torch.tensor([3, 4])
    for result, match in (((ids2,), r"got tuple: return Draft\(draft_ids, draft_probs\)"),
                          (torch.tensor([3]), r"got Tensor: return Draft"), ((ids2, None), r"got tuple: return Draft"),
                          ("ids", r"got str\Z")):
        with pytest.raises(TypeError, match=r"Shaped\.propose must return a Draft .*" + match):
            speculative_sample(target, Shaped(result), [1, 2, 3], 4, k=2)

    sampled = {"temperature": 1.0, "generator": torch.Generator().manual_seed(0)}
    broken = _lm(1)
    with torch.no_grad():
        broken.token_embed.weight.fill_(float("nan"))
    with pytest.raises(ValueError, match=r"LMDrafter's logits holds NaN .*at temperature 1\.0"):
        speculative_sample(target, LMDrafter(broken, sample=True), [1, 2, 3], 4, **sampled)
    with pytest.raises(ValueError, match=r"the target's logits hold NaN \(a broken model"):
        speculative_sample(broken, NGramDrafter(), [1, 2, 1, 2], 4, **sampled)
    table = torch.zeros(4, 4)
    table[2] = float("-inf")                                    # after token 2 every token is masked
    with pytest.raises(ValueError, match=r"-inf for every token .*repetition penalty"):
        speculative_sample(TableLM(table), NGramDrafter(), [0, 1, 2], 2, **sampled)

    with pytest.raises(TypeError, match=r"got a RecomputeTarget: pass its \.model"):
        tree_speculative_generate(RecomputeTarget(target), draft, [1, 2], 3)
    with pytest.raises(TypeError, match=r"target \(str\) does not satisfy g2c\.sampling\.LanguageModel"):
        tree_speculative_generate("StoryLM-30M", draft, [1, 2], 3)
    with pytest.raises(TypeError, match=r"RecomputeTarget's target \(str\) does not satisfy"):
        RecomputeTarget("StoryLM-30M")
    with pytest.raises(TypeError, match=r"on_round must be a callable or None, got int 5"):
        CachedTarget(target, on_round=5)
    for build, match in ((lambda: LMDrafter(draft, use_cache="False"), r"LMDrafter use_cache must be True or False"),
                         (lambda: LMDrafter(draft, sample="no"), r"LMDrafter sample must be True or False"),
                         (lambda: EagleDrafter(head, sample="no"), r"EagleDrafter sample must be True or False"),
                         (lambda: tree_speculative_generate(target, draft, [1, 2], 3, use_cache="False"),
                          r"use_cache must be True or False, got str 'False'")):
        with pytest.raises(TypeError, match=match):
            build()


def test_numpy_scalars_count_as_ints_and_reals():
    """A helper's trial: ``k=np.int64(2)`` was refused as "k must be >= 1 ... got np.int64(2)" and
    ``np.float32`` temperatures and penalties as not real numbers, while budgets and eos ids took
    NumPy scalars. Every count and real knob of the engine and its presets now takes them, as Python's."""
    import numpy as np
    import torch

    from g2c.specdec.lineage import lineage_generate
    from g2c.specdec.sampling.controllers import CostModelK, HeuristicK
    from g2c.specdec.sampling.drafters import LMDrafter
    from g2c.specdec.sampling.loop import speculative_sample
    from g2c.specdec.trees import tree_speculative_generate

    target, draft = _lm(0), _lm(1)
    want, _ = speculative_sample(target, LMDrafter(draft), [1, 2, 3], 5, k=2, temperature=0.0,
                                 repetition_penalty=1.2)
    got, _ = speculative_sample(target, LMDrafter(draft), [1, 2, 3], 5, k=np.int64(2), temperature=np.float32(0.0),
                                repetition_penalty=np.float32(1.2))
    assert got.tolist() == want.tolist()
    sampled = [speculative_sample(target, LMDrafter(draft), [1, 2, 3], 5, k=2, temperature=t, top_p=p,
                                  generator=torch.Generator().manual_seed(0))[0].tolist()
               for t, p in ((0.8, 0.9), (np.float32(0.8), np.float32(0.9)))]
    assert sampled[0] == sampled[1]
    tree = [tree_speculative_generate(target, draft, [1, 2, 3], 5, num_nodes=n)[0].tolist() for n in (4, np.int64(4))]
    assert tree[0] == tree[1]
    medusa = _medusa(target)
    lin = [lineage_generate(target, medusa, [1, 2, 3], 5, num_nodes=n)[0].tolist() for n in (3, np.int64(3))]
    assert lin[0] == lin[1]
    for controller in (HeuristicK(np.int64(3)), CostModelK(np.int64(3), k_max=np.int64(8))):
        k = controller.next_k()
        assert k == 3 and type(k) is int
    with pytest.raises(TypeError, match=r"k must be >= 1 draft tokens per target pass \(an int\), got 2\.0"):
        speculative_sample(target, LMDrafter(draft), [1, 2, 3], 5, k=2.0)   # floats stay refused
    with pytest.raises(TypeError, match=r"num_nodes must be an int >= 1 .*got True"):
        tree_speculative_generate(target, draft, [1, 2, 3], 5, num_nodes=True)


def test_numpy_ints_reach_every_count_check():
    """The review after the NumPy mend: the batched, recurrent, cached and simulator loops' ``k``, the
    EAGLE tree's ``width`` and every ``refill_tokens`` still refused ``np.int64`` while the engine took
    it. One shared ``check_whole`` now serves them all, with each caller's own message; floats, bools
    and out-of-range values stay refused."""
    import numpy as np
    import torch

    from g2c.kvcache import cached_generate
    from g2c.recurrent import greedy_drafter, speculative_generate_stateful
    from g2c.specdec.lab.batched import batched_speculative_generate
    from g2c.specdec.lab.simulate import simulate_rounds
    from g2c.specdec.lineage import EagleTreeDrafter
    from g2c.specdec.sampling.cached import speculative_generate_cached
    from g2c.specdec.sampling.eagle import FeatureDrafter
    from g2c.specdec.sampling.target import CachedTarget
    from g2c.specdec.trees import chain_choices, static_choices

    target, draft = _lm(0), _lm(1)
    prompt = [1, 2, 3]
    pairs = {
        "cached loop": lambda k: speculative_generate_cached(target, draft, prompt, 6, k=k)[0].tolist(),
        "batched loop": lambda k: [o.tolist() for o in batched_speculative_generate(target, draft, [prompt], 6,
                                                                                     k=k).outputs],
        "recurrent loop": lambda k: speculative_generate_stateful(_recurrent(), greedy_drafter(_recurrent()),
                                                                   prompt, 6, k=k)[0].tolist(),
        "simulator": lambda k: (lambda r: (r.accepted.tolist(), r.k, type(r.k)))(
            simulate_rounds(0.7, k, 0.1, 20, generator=torch.Generator().manual_seed(0))),
        "cached_generate refill": lambda r: cached_generate(target, list(range(1, 12)) * 2, 12,
                                                            refill_tokens=r, temperature=0.0).tolist(),
        "chain_choices": lambda k: chain_choices(k),
        "static_choices": lambda k: static_choices(k),
    }
    for name, call in pairs.items():
        assert call(np.int64(3)) == call(3), name
    head = FeatureDrafter(target, generator=torch.Generator().manual_seed(3))
    assert EagleTreeDrafter(head, width=np.int64(2)).width == 2
    assert type(CachedTarget(target, refill_tokens=np.int32(5)).refill_tokens) is int
    with pytest.raises(TypeError, match=r"k must be an int >= 1 \(draft tokens per round\), got 2\.0"):
        batched_speculative_generate(target, draft, [prompt], 6, k=2.0)
    with pytest.raises(ValueError, match=r"refill_tokens must be an int in \[1, max_seq_len=32\], got np\.int64\(33\)"):
        cached_generate(target, prompt, 3, refill_tokens=np.int64(33))
    with pytest.raises(TypeError, match=r"width must be an int in \[1, \d+\] .*got True"):
        EagleTreeDrafter(head, width=True)
    from g2c.sampling.model import as_whole
    from g2c.specdec.lineage import BlockDrafter, BlockHead, MedusaHeads
    from g2c.specdec.sampling.controllers import HeuristicK
    from g2c.specdec.trees.builders import sample_children

    assert HeuristicK(2, grow=np.int64(3)).grow == 3 and type(HeuristicK(2, grow=np.int64(3)).grow) is int
    assert MedusaHeads(target, np.int64(2)).num_heads == 2
    block = BlockHead(_lm4(torch.float32), generator=torch.Generator().manual_seed(0))
    assert BlockDrafter(block, block_size=np.int64(4)).block_size == 4
    tokens, _ = sample_children(torch.tensor([0.5, 0.3, 0.2]), np.int64(2), generator=torch.Generator().manual_seed(0))
    assert len(tokens) == 2
    assert [as_whole(v) for v in (torch.tensor(3), torch.tensor(True), torch.tensor([3]), np.int8(3))] == [3, None,
                                                                                                          None, 3]


def test_meta_device_prompts_and_models_are_named():
    """A helper's trial: a prompt or a model on torch's meta device (shapes, no values) reached torch's
    own errors, one a NotImplementedError, which the course uses to mean "exercise not written". The
    prompt check and the model check now name the meta device, before any pass."""
    import torch

    from g2c.kvcache import cached_generate
    from g2c.specdec.sampling.drafters import LMDrafter
    from g2c.specdec.sampling.loop import speculative_sample

    target = _lm(0)
    with pytest.raises(ValueError, match=r"prompt_ids is on the meta device \(a shape without values\)"):
        cached_generate(target, torch.tensor([1, 2], device="meta"), 3)
    with pytest.raises(ValueError, match=r"model \(TransformerLM\) is on the meta device"):
        cached_generate(_lm(0).to("meta"), [1, 2], 3)
    with pytest.raises(ValueError, match=r"drafter \(TransformerLM\) is on the meta device"):
        speculative_sample(target, LMDrafter(_lm(1).to("meta")), [1, 2], 3, k=2)
    assert cached_generate(target, torch.tensor([1, 2]), 3, temperature=0.0).numel() == 5   # a real one passes


def test_the_model_loops_tell_a_wrapped_drafter_to_pass_its_model():
    """A helper's trial: the cached, tree and batched loops take the bare draft model (only the engine takes a
    drafter); an ``LMDrafter`` there, or a drafter without ``vocab_size`` in the batched loop (a raw
    AttributeError before), is refused by name, and the message says what to pass instead."""
    from g2c.specdec.lab.batched import batched_speculative_generate
    from g2c.specdec.sampling.cached import speculative_generate_cached
    from g2c.specdec.sampling.drafters import LMDrafter
    from g2c.specdec.trees import tree_speculative_generate

    target, draft = _lm(0), _lm(1)
    wrapped = r"does not satisfy g2c\.sampling\.LanguageModel: .*pass drafter\.model \(the model you wrapped\)"
    with pytest.raises(TypeError, match=r"drafter \(LMDrafter\) " + wrapped):
        speculative_generate_cached(target, LMDrafter(draft), [1, 2], 3)
    with pytest.raises(TypeError, match=r"drafter \(LMDrafter\) " + wrapped):
        batched_speculative_generate(target, LMDrafter(draft), [[1, 2]], 3)
    with pytest.raises(TypeError, match=r"target \(LMDrafter\) does not satisfy .*pass target\.model"):
        batched_speculative_generate(LMDrafter(target), draft, [[1, 2]], 3)
    with pytest.raises(TypeError, match=r"drafter \(object\) does not satisfy g2c\.sampling\.LanguageModel: "
                                        r"missing vocab_size, max_seq_len, device, __call__ \(a model needs"):
        batched_speculative_generate(target, object(), [[1, 2]], 3)
    with pytest.raises(TypeError, match=r"got LMDrafter: pass drafter\.model, the model it wraps"):
        tree_speculative_generate(target, LMDrafter(draft), [1, 2], 3)
    with pytest.raises(TypeError, match=r"got function\Z"):                   # no hint for what wraps no model
        tree_speculative_generate(target, lambda ids: ids, [1, 2], 3)
    out = batched_speculative_generate(target, draft, [[1, 2]], 3).outputs   # the bare models pass
    assert len(out) == 1 and len(out[0]) == 5


def _medusa(target):
    from g2c.specdec.lineage import MedusaDrafter, MedusaHeads

    return MedusaDrafter(MedusaHeads(target, 2))


def test_a_tree_drafter_needs_no_head_and_no_base():
    """A ``TreeDrafter``'s ``head`` and ``base`` are optional (a drafter of no model reads none), and so are its
    state hooks; an object with the hooks but not the base class is refused by name, and a drafter used
    before ``bind`` says so."""
    import torch

    from g2c.kvcache import cached_generate
    from g2c.specdec.lineage import TreeDrafter, lineage_generate
    from g2c.specdec.trees import DraftTree

    class Plain(TreeDrafter):                     # only the one hook a drafter must write: draft
        vocab_size, target_layers = V, ()

        def draft(self, context_ids, *, max_nodes, max_depth):
            return DraftTree(torch.tensor([3]), torch.tensor([-1]))

    class Duck:                                   # the hooks without the base class: not a drafter of the engine
        vocab_size, target_layers = V, ()

        def draft(self, context_ids, *, max_nodes, max_depth):
            return DraftTree(torch.tensor([3]), torch.tensor([-1]))

    target = _lm(0)
    with pytest.raises(TypeError, match=r"needs a TreeDrafter .*got Duck"):
        lineage_generate(target, Duck(), [1, 2], 6)
    with pytest.raises(RuntimeError, match="bind the drafter to its tree target first"):
        Plain().start(torch.tensor([1, 2]), sampler=None, generator=None)
    ids, stats = lineage_generate(target, Plain(), [1, 2], 6)
    assert ids.tolist() == cached_generate(target, [1, 2], 6, temperature=0.0).tolist()
    assert stats.drafted == stats.target_passes - (stats.target_passes - stats.rounds_with_draft)


def test_a_tree_drafter_that_writes_into_the_context_cannot_change_the_text():
    """The hooks read a copy of the visible context: a drafter that scribbles on it (an in-place edit
    meant for its own scratch copy) leaves the committed text, and so the output, as plain greedy's."""
    import torch

    from g2c.kvcache import cached_generate
    from g2c.specdec.lineage import TreeDrafter, lineage_generate
    from g2c.specdec.trees import DraftTree

    class Scribbler(TreeDrafter):
        vocab_size, target_layers = V, ()

        def read_prefill(self, context_ids, states):
            context_ids.fill_(1)

        def draft(self, context_ids, *, max_nodes, max_depth):
            context_ids.zero_()
            return DraftTree(torch.tensor([3]), torch.tensor([-1]))

        def read_commit(self, context_ids, states):
            context_ids[-1] = 2

    target = _lm(0)
    ids, _ = lineage_generate(target, Scribbler(), [1, 2, 5], 8)
    assert ids.tolist() == cached_generate(target, [1, 2, 5], 8, temperature=0.0).tolist()


@pytest.mark.parametrize("fused", [True, False])
def test_fast_path_keeps_the_vocabulary_check(fused):
    import torch

    from g2c.kvcache import KVCache, cached_forward
    from g2c.kvcache.fast import fast_model

    fast = fast_model(_lm(), fused=fused)
    for bad in (V, -1):
        with pytest.raises((ValueError, IndexError), match=rf"(holds token id {bad}, outside the vocabulary \[0, 16\)"
                                                          r"|must lie in \[0, 16\))"):
            cached_forward(fast, torch.tensor([[1, bad]]), KVCache.for_model(fast))   # was a raw IndexError
    with pytest.raises(ValueError, match=r"holds token id 16"):
        fast(torch.tensor([[1, V]]))


def test_ragged_cache_row_indices_are_checked():
    import torch

    from g2c.kvcache.ragged import RaggedKVCache, ragged_forward

    model = _lm()
    cache = RaggedKVCache.for_model(model, batch_size=2)
    with pytest.raises(ValueError, match=r"RaggedKVCache\.keys: row 5 is outside the batch \[0, 2\)"):
        cache.keys(0, row=5)
    with pytest.raises(ValueError, match=r"RaggedKVCache\.values: row -1 is outside the batch \[0, 2\)"):
        cache.values(0, row=-1)                                            # was: silently the last row
    with pytest.raises(TypeError, match=r"RaggedKVCache\.keys: row must be an int, got float 1\.0"):
        cache.keys(0, row=1.0)
    with pytest.raises(ValueError, match=r"RaggedKVCache\.keep: row 3 is outside the batch \[0, 2\)"):
        cache.keep(torch.tensor([0, 3]))
    with pytest.raises(ValueError, match=r"RaggedKVCache\.keep: rows must be a 1-D list of int row indices"):
        cache.keep(torch.tensor([True, False]))
    assert cache.batch_size == 2
    with pytest.raises(ValueError, match=r"ragged_forward: ids holds token id 16, outside the vocabulary"):
        ragged_forward(model, torch.tensor([[1, V], [1, 2]]), cache)


# -- issue 31: heads take their base's dtype; a head on another base is refused ------------------

def _heads(base):
    import torch

    from g2c.specdec import MTPHead
    from g2c.specdec.lineage import BlockHead, Eagle3Head, MedusaHeads
    from g2c.specdec.sampling.eagle import FeatureDrafter

    gen = torch.Generator().manual_seed(3)
    return {"MedusaHeads": MedusaHeads(base, 2), "FeatureDrafter": FeatureDrafter(base, generator=gen),
            "Eagle3Head": Eagle3Head(base, generator=gen), "BlockHead": BlockHead(base, generator=gen),
            "MTPHead": MTPHead(base, generator=gen)}


def _lm4(dtype):
    import torch

    from g2c.transformer import TransformerLM

    return TransformerLM(V, 8, 4, 2, 32, generator=torch.Generator().manual_seed(0)).eval().to(dtype=dtype)


def test_heads_built_on_a_bfloat16_base_draft_in_bfloat16():
    import torch

    from g2c.sampling import generate
    from g2c.specdec.lineage import BlockDrafter, Eagle3Drafter, EagleTreeDrafter, MedusaDrafter, lineage_generate
    from g2c.specdec.sampling.cached import mtp_generate_cached

    base = _lm4(torch.bfloat16)
    heads = _heads(base)
    assert {name: h.parameters()[0].dtype for name, h in heads.items()} == dict.fromkeys(heads, torch.bfloat16)
    want = generate(base, [1, 2], 6, temperature=0.0).tolist()
    for drafter in (MedusaDrafter(heads["MedusaHeads"]), EagleTreeDrafter(heads["FeatureDrafter"]),
                    Eagle3Drafter(heads["Eagle3Head"]), BlockDrafter(heads["BlockHead"])):
        ids, _ = lineage_generate(base, drafter, [1, 2], 6)                # was: dtype errors from torch
        assert len(ids) == 8 and all(0 <= t < V for t in ids.tolist()), drafter
    ids, _ = mtp_generate_cached(base, heads["MTPHead"], [1, 2], 6)
    assert ids.tolist() == want


def test_a_head_on_another_base_or_left_in_another_dtype_is_refused():
    import torch

    from g2c.specdec import MTPHead
    from g2c.specdec.sampling.cached import mtp_generate_cached

    base, other = _lm4(torch.float32), _lm4(torch.float32)
    with pytest.raises(ValueError, match=r"head \(MTPHead\) was built on another model: .*pass head\.base"):
        mtp_generate_cached(base, MTPHead(other), [1, 2], 4)               # was: silently the wrong drafts
    head = MTPHead(base)
    base.to(dtype=torch.bfloat16)                                         # the head stays behind
    with pytest.raises(ValueError, match=r"head \(MTPHead\) computes in torch\.float32 but its base in "
                                         r"torch\.bfloat16; convert the head with its base"):
        mtp_generate_cached(base, head, [1, 2], 4)


# -- issue 31: a wrong type is a TypeError, a range is checked before use ------------------------

def test_ranges_are_checked_before_use():
    from g2c.specdec.sampling.controllers import optimal_k

    with pytest.raises(ValueError, match=r"optimal_k: need k_min <= k_max, got k_min=5, k_max=3"):
        optimal_k(0.5, 0.1, k_min=5, k_max=3)                              # was: "max() arg is an empty sequence"
    with pytest.raises(TypeError, match=r"optimal_k: k_max must be an int"):
        optimal_k(0.5, 0.1, k_max=4.0)
    assert optimal_k(0.7, 0.1, k_min=4, k_max=4) == 4


def test_a_tree_drafter_author_trial_bad_members_are_named():
    """A course author's trial (a new TreeDrafter): vocab_size left at None gave a raw TypeError from the
    id check; a string "16" was reported as "16 differs from 16"; target_layers "12" ran as layers
    (1, 2) and (True,) as 1; chain_tree cast floats and flattened rows; a sampled row that gives its own
    node probability 0 was accepted every time (p / 0), a silent wrong distribution."""
    import torch

    from g2c.specdec.lineage import TreeDrafter, lineage_generate
    from g2c.specdec.trees import DraftTree, chain_tree

    def drafter(vocab=V, layers=(), q=None):
        class D(TreeDrafter):
            vocab_size, target_layers = vocab, layers

            def draft(self, context_ids, *, max_nodes, max_depth):
                return DraftTree(torch.tensor([1]), torch.tensor([-1]), q)
        return D()

    target = _lm(0)
    for vocab in (None, "16", 16.0, True):
        with pytest.raises(TypeError, match="vocab_size must be an int"):
            lineage_generate(target, drafter(vocab=vocab), [1, 2], 4)
    for layers in ("12", (True,), (1.5,), 3):
        with pytest.raises(TypeError, match="target_layers must be a tuple"):
            lineage_generate(target, drafter(layers=layers), [1, 2], 4)
    for bad in ([1.9], torch.tensor([True]), [[1, 2], [3, 4]]):
        with pytest.raises(ValueError, match="chain_tree: tokens must be a 1-D integer tensor"):
            chain_tree(bad)
    with pytest.raises(TypeError, match="chain_tree: tokens must be a 1-D integer tensor or list of ints"):
        chain_tree("abc")
    assert chain_tree([]).num_nodes == 0 and chain_tree([3, 4]).parents.tolist() == [-1, 0]
    wrong_row = torch.nn.functional.one_hot(torch.tensor([5]), V).float()       # the row of another token
    with pytest.raises(ValueError, match=r"node 0 \(token 1\) gives probability 0 to its own token"):
        lineage_generate(target, drafter(q=wrong_row), [1, 2], 4, temperature=0.8,
                         generator=torch.Generator().manual_seed(0))


def test_a_drafter_that_writes_into_its_context_never_changes_the_callers_prompt():
    """A course author's trial: a drafter that zeroed the context it was handed in round 1 turned the
    caller's own prompt tensor into zeros (the loop's ids WERE the caller's tensor). as_token_ids copies,
    so whatever a misbehaving drafter does to the loop's text, the caller's prompt survives."""
    import torch

    from g2c.sampling.generate import as_token_ids
    from g2c.specdec.sampling.draft import Draft
    from g2c.specdec.sampling.drafters import Drafter
    from g2c.specdec.sampling.loop import speculative_sample

    class Vandal(Drafter):
        vocab_size = V

        def propose(self, context_ids, k):
            context_ids.zero_()
            return Draft.empty()

    prompt = torch.tensor([1, 2, 5])
    assert as_token_ids(prompt) is not prompt and as_token_ids(prompt).data_ptr() != prompt.data_ptr()
    speculative_sample(_lm(0), Vandal(), prompt, 4, k=2, temperature=0.0)
    assert prompt.tolist() == [1, 2, 5]


# -- issue 57: the residue (one family per test; tests/tooling/trial_bad_inputs.py is the trial) ------------

LEAD, CONT = 26, 27                       # the two bytes of "é" (0xC3 0xA9); V = 32 below


def byte_decode(ids) -> str:
    """A byte-level decode: a cut character shows as U+FFFD until its next byte comes (not prefix-monotone)."""
    raw = bytes(0xC3 if t == LEAD else 0xA9 if t == CONT else 0x61 + int(t) % 26 for t in ids)
    return raw.decode("utf-8", errors="replace")


@pytest.mark.parametrize("k", [1, 4])
@pytest.mark.parametrize("preset", ["engine", "tree", "lineage"])
def test_a_stop_string_is_found_with_a_decode_that_is_not_prefix_monotone(preset, k):
    """StopRule.cut decoded the round's prefixes only when the round's whole text held a stop string: with a
    byte decode, "b c \\ufffd" (plain decoding's stop) became "b c é d" and the run went on (silent)."""
    import torch
    from specdec_mocks import TableLM, chain_table

    from g2c.sampling import generate
    from g2c.specdec.lineage import MedusaDrafter, MedusaHeads, lineage_generate
    from g2c.specdec.sampling.drafters import LMDrafter
    from g2c.specdec.sampling.loop import speculative_sample
    from g2c.specdec.trees.verify import tree_speculative_generate

    next_of = [(v + 1) % 32 for v in range(32)]
    next_of[2], next_of[LEAD], next_of[CONT] = LEAD, CONT, 3
    model = TableLM(chain_table(next_of, generator=torch.Generator().manual_seed(0)), max_seq_len=32)
    plain = generate(model, [0], 12, temperature=0.0)[1:].tolist()
    want = next(plain[:i + 1] for i in range(12) if "\ufffd" in byte_decode(plain[:i + 1]))
    assert want == [1, 2, LEAD] and "\ufffd" not in byte_decode(plain)
    stops = {"stop_strings": ["\ufffd"], "decode": byte_decode, "temperature": 0.0}
    if preset == "engine":
        ids, _ = speculative_sample(model, LMDrafter(model), [0], 12, k=k, **stops)
    elif preset == "tree":
        ids, _ = tree_speculative_generate(model, model, [0], 12, num_nodes=k, **stops)
    else:      # Medusa reads a TransformerLM's states; its decode shows a token as "?" while it is the last one
        lm = _lm(1)
        lm_plain = generate(lm, [1, 2], 12, temperature=0.0)[2:].tolist()
        special = next(b for a, b in zip(lm_plain, lm_plain[1:]) if a != b)        # 12, then other tokens

        def decode(ids):
            return "".join(chr(97 + int(t)) for t in ids[:-1]) + ("?" if int(ids[-1]) == special else chr(97 + ids[-1]))

        cut = next(i + 1 for i in range(12) if "?" in decode(lm_plain[:i + 1]))
        assert 1 < cut < 12 and "?" not in decode(lm_plain)
        ids, _ = lineage_generate(lm, MedusaDrafter(MedusaHeads(lm, 2)), [1, 2], 12, num_nodes=k + 1,
                                  **{**stops, "stop_strings": ["?"], "decode": decode})
        assert ids[2:].tolist() == lm_plain[:cut]
        return
    assert ids[1:].tolist() == want


OUTPUT_OPTIONS = {          # script -> (argv before the path, option or None for a positional, writes a folder)
    "bench/specdec.py": [([], "--out", False)],
    "bench/lineage.py": [([], "--figure", False), ([], "--json", False)],
    "bench/roofline.py": [([], "--plot", False)],
    "bench/serving_lab.py": [([], "--out", True), ([], "--export-prompts", False)],
    "bench/specdec_serving.py": [([], "--out", True)],
    "bench/setup_llamacpp.py": [([], "--work", True)],
    "g2c/assets/export.py": [(["StoryLM-1M"], "--hf", True)],
    "g2c/assets/gguf.py": [(["StoryLM-1M"], None, False)],
    "scripts/agreement_figure.py": [([], "--out", False)],
    "scripts/run_notebooks.py": [([], "--save", True)],
    "scripts/notebooks/build.py": [([], "--solved", True)],
    "scripts/notebooks/screenshot.py": [(["03"], "--out", True)],
}


def _output_option_lines() -> set[tuple[str, str]]:
    """(script, option) of every add_argument whose type is output_file/output_dir or whose name says it writes."""
    found = set()
    for script in {*SCRIPTS, "scripts/agreement_figure.py", "scripts/run_notebooks.py", "scripts/notebooks/build.py",
                   "scripts/notebooks/screenshot.py", "scripts/new_module.py", "scripts/model_card.py"}:
        text = (REPO_ROOT / script).read_text()
        for m in re.finditer(r'add_argument\(\s*"([^"]+)"[^)]*?(output_file|output_dir|_prefix)', text, re.S):
            found.add((script, m.group(1)))
    return found


def test_every_output_option_of_every_script_is_listed_and_typed():
    listed = {(s, opt or "out") for s, rows in OUTPUT_OPTIONS.items() for _, opt, _ in rows}
    assert _output_option_lines() == listed, "an output path option must use cli.output_file/output_dir and be listed"


BAD_OUTPUTS = {             # class -> (path for a file, path for a folder, the one error line's match)
    "a folder that cannot exist": ("/proc/g2c-57/x.png", "/proc/g2c-57/x", r"cannot write the output folder .*/proc"),
    "under a file": ("README.md/x.png", "README.md/x", r"README\.md is a file, not a folder"),
    "a name too long": ("runs/" + "n" * 300 + ".png", "runs/" + "n" * 300, r"has \d+ bytes and this file system takes "
                                                                            r"at most"),
    "a NUL character": ("x\x00.png", "x\x00", r"holds a NUL character"),
    "an empty path": ("", "", r"an empty path"),
    "inside the shipped artifacts": ("artifacts/models/StoryLM-1M/model.safetensors", "artifacts/models/StoryLM-1M",
                                     r"inside the shipped artifacts \(artifacts/models/StoryLM-1M\)"),
}


@pytest.mark.parametrize("case", sorted(BAD_OUTPUTS))
@pytest.mark.parametrize("script, row", [(s, i) for s, rows in OUTPUT_OPTIONS.items() for i in range(len(rows))])
def test_every_output_option_refuses_a_path_no_writer_could_use(script, row, case, monkeypatch):
    """Issue 57: lineage --figure, roofline --plot and serving_lab --out took a folder that cannot exist and
    ended in a traceback after the work; an export into artifacts/ overwrote a shipped model. Every output
    option goes through g2c.assets.cli.output_file/output_dir (g2c.course.files.check_output_path)."""
    monkeypatch.chdir(REPO_ROOT)
    pre, option, folder = OUTPUT_OPTIONS[script][row]
    file_path, folder_path, match = BAD_OUTPUTS[case]
    path = folder_path if folder else file_path
    if option == "--export-prompts" and case == "inside the shipped artifacts":
        path = "artifacts/models/StoryLM-1M/prompts"
    if case == "an empty path" and option in ("--export-prompts", "--plot"):
        return                                                 # a prefix '' writes '-endings.jsonl'; --plot '': no plot
    argv = pre + ([f"{option}={path}"] if option else [path])
    rc, out, err = _run(script, argv)
    assert rc == 2, (rc, out, err)
    errors = [line for line in err.splitlines() if "error" in line]
    assert len(errors) == 1 and re.search(match, errors[0]), err
    assert "Traceback" not in err


def test_roofline_paths_of_only_commas_is_a_usage_error():
    rc, out, err = _run("bench/roofline.py", ["--paths", ","])                       # was StopIteration
    assert rc == 2 and re.search(r"argument --paths: an empty list: choose from teaching", err), err


def test_a_late_write_failure_is_one_line_after_the_run(monkeypatch, capsys, tmp_path):
    """A disk that fills while the run works: the benches' write is one line naming the file and the fix."""
    import errno

    module = _load("bench/lineage.py")

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(module, "write_text_atomic", full)
    assert module.save_json(tmp_path / "x.json", {}) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "the disk is full while writing" in err and "Traceback" not in err


def test_wrong_cause_messages_name_the_real_cause(monkeypatch, tmp_path):
    """Issue 57's wrong causes: an export into a file's 'folder' was told to make it writable; an edited pin was
    told to run --force; 'all,' was refused while recommending 'all'; an existing numeric module id was told
    its package name is not an identifier."""
    import subprocess
    import sys

    import g2c.assets.artifacts as artifacts
    from g2c.assets.export import export_hf
    from g2c.course.registry import module_ids, parse_selection

    (tmp_path / "afile").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"afile is a file, not a folder"):
        export_hf("StoryLM-1M", tmp_path / "afile" / "out")
    before = {p.name: p.stat().st_mtime_ns for p in artifacts.artifact_dir("StoryLM-1M").iterdir()}
    with pytest.raises(ValueError, match=r"inside the shipped artifacts .*checkpoints\.sh installs"):
        export_hf("StoryLM-1M", artifacts.artifact_dir("StoryLM-1M"), overwrite=True)
    assert {p.name: p.stat().st_mtime_ns for p in artifacts.artifact_dir("StoryLM-1M").iterdir()} == before
    monkeypatch.setattr(artifacts, "pin_edited", lambda name: True)
    fix = artifacts._pin_fix("StoryLM-1M", "run ./checkpoints.sh --force")
    assert "git checkout -- g2c/assets/pins.json" in fix and "--force reinstalls the files, which fail" in fix
    monkeypatch.setattr(artifacts, "pin_edited", lambda name: None)               # no git to ask
    assert "if g2c/assets/pins.json itself was edited" in artifacts._pin_fix("StoryLM-1M", "run --force")
    assert parse_selection("all,") == module_ids() == parse_selection("09,all")
    with pytest.raises(ValueError, match=r"'1' means every module only on its own"):
        parse_selection("1,03")
    done = subprocess.run([sys.executable, "scripts/new_module.py", "16", "Dup", "--no-record"], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 1 and "module id '16' is already in g2c/course/registry.py" in done.stderr


def test_an_interrupted_gguf_read_back_says_the_file_is_complete_but_unchecked(monkeypatch, tmp_path, capsys):
    import g2c.assets.gguf as gguf

    def stop(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(gguf, "export_gguf", lambda *a, **k: (tmp_path / "m.gguf").write_bytes(b"x") and
                        tmp_path / "m.gguf")
    monkeypatch.setattr(gguf, "check_gguf", stop)
    assert gguf.main(["StoryLM-1M", str(tmp_path / "m.gguf")]) == 130
    err = capsys.readouterr().err
    assert "complete but unchecked" in err and "--check" in err and "no partial file" not in err


@pytest.mark.parametrize("control, value", [("repetition_penalty", 1.5), ("stop_strings", ["x"]), ("stop_ids", [3]),
                                            ("logprobs", True), ("temperature", 0.7)])
def test_a_control_handed_to_the_stateful_preset_names_the_call_that_takes_it(control, value):
    """It failed inside the transaction's constructor ("unexpected keyword argument")."""
    from g2c.recurrent import greedy_drafter, speculative_generate_stateful

    rec = _recurrent()
    with pytest.raises(TypeError, match=rf"takes no sampling controls \({control}\); the engine takes them: "
                                        r"speculative_sample\(TransactionTarget"):
        speculative_generate_stateful(rec, greedy_drafter(rec), [1, 2], 3, **{control: value})


def test_library_errors_and_wrong_types_are_named_where_the_value_enters():
    """Raw library errors (ngram_lookup(min_n=1.5): "'float' object cannot be interpreted as an integer";
    MedusaHeads(object(), 2): an AttributeError) and a wrong type reported as a wrong value."""
    import torch

    from g2c.sampling.model import check_whole
    from g2c.specdec import MTPHead
    from g2c.specdec.lineage import MedusaHeads
    from g2c.specdec.lineage.block import block_loss_weights
    from g2c.specdec.sampling import FeatureDrafter, ngram_lookup

    with pytest.raises(TypeError, match=r"min_n must be an int, got float 1\.5"):
        ngram_lookup([1, 2, 3, 1, 2], 2, min_n=1.5)
    for head in (MedusaHeads, MTPHead, FeatureDrafter):
        with pytest.raises(TypeError, match=r"base \(object\) does not satisfy g2c\.sampling\.LanguageModel"):
            head(object(), 2) if head is MedusaHeads else head(object())
    with pytest.raises(TypeError, match=r"generator must be a torch\.Generator or None, got int 3"):
        MTPHead(_lm(), generator=3)
    with pytest.raises(TypeError, match=r"gamma must be a real number, got str"):
        block_loss_weights(4, "2")
    torch.testing.assert_close(block_loss_weights(4, torch.tensor(2.0)), block_loss_weights(4, 2.0))   # a 0-d real
    with pytest.raises(TypeError, match=r"k must be >= 1, got 2\.5 \(float; pass a whole number\)"):
        check_whole(2.5, "k must be >= 1, got 2.5")
    with pytest.raises(ValueError, match=r"^k must be >= 1, got 0$"):
        check_whole(0, "k must be >= 1, got 0")


def test_a_checkpoint_save_past_a_file_size_limit_is_one_oserror(tmp_path):
    """torch.save onto a full disk raised "[enforce fail at inline_container.cc:...]": a RuntimeError. The real
    torch.save, in a child process under a 4 KiB file-size limit (no root needed)."""
    import subprocess
    import sys

    code = ("import resource, signal, sys, torch\n"
            "from g2c.pretraining.trainer import save_checked\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))\n"
            f"save_checked({{'w': torch.zeros(100000)}}, {str(tmp_path / 'c.pt')!r})\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**__import__("os").environ, "G2C_APPLY_SOLUTIONS": "all", "G2C_QUIET": "1"})
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and last.startswith("OSError: [Errno 27] could not save the checkpoint"), done.stderr
    assert "the previous checkpoint is unchanged" in last and "inline_container" not in done.stderr
    assert not list(tmp_path.iterdir())                                          # no temporary left


def test_a_read_only_checkout_stops_setup_before_pip(tmp_path):
    """./setup.sh in a read-only checkout failed inside pip (an OSError deep in an editable install). Root passes
    permission bits, so the write probe's mktemp is made to fail as on a read-only mount."""
    import shutil
    import subprocess

    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "mktemp").write_text("#!/bin/sh\necho 'mktemp: Read-only file system' >&2\nexit 1\n")
    (shim / "mktemp").chmod(0o755)
    (shim / "pip").write_text("#!/bin/sh\necho pip ran >&2\nexit 3\n")
    (shim / "pip").chmod(0o755)
    copy = tmp_path / "co"
    copy.mkdir()
    shutil.copy(REPO_ROOT / "setup.sh", copy / "setup.sh")
    done = subprocess.run(["bash", "setup.sh"], cwd=copy, capture_output=True, text=True,
                          env={"PATH": f"{shim}:/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert f"setup.sh: cannot write {copy}" in done.stderr and "copy the checkout somewhere writable" in done.stderr
    assert not (copy / ".venv").exists()


@pytest.mark.parametrize("bad", [3, 1.5, ["float32"]])
def test_fast_model_names_a_wrong_dtype_type(bad):
    from g2c.kvcache.fast import fast_model

    with pytest.raises(TypeError, match=r"fast_model: dtype must be a torch.dtype"):   # was a ValueError
        fast_model(_lm(), dtype=bad)
    with pytest.raises(ValueError, match=r"unknown dtype 'float8'"):
        fast_model(_lm(), dtype="float8")


# -- issue 57, the building blocks of modules 03-11 (the trial's "blocks" surface): each value is checked where it
# enters, by ``g2c.nn.module.check_int`` / ``check_real`` (module 03b's and 06's own copies: they need no module 03),
# from provided code (constructors, config ``__post_init__``, provided lines before an exercise body)

_NOT_INTS = [(True, "bool"), (2.5, "float"), ("3", "str"), (None, "NoneType"), ([2], "list")]


@pytest.mark.parametrize("field, bad, exc, match", [
    *[(f, v, TypeError, rf"TrainConfig: {f} must be an int >= {lo}, got {t}") for f, lo in
      [("batch_size", 1), ("context", 1), ("max_steps", 1), ("eval_batches", 1), ("eval_every", 0), ("seed", 0)]
      for v, t in _NOT_INTS],
    ("batch_size", 0, ValueError, r"TrainConfig: batch_size must be >= 1, got 0"),
    ("warmup_steps", 11, ValueError, r"TrainConfig: warmup_steps must be >= 0 and <= 10, got 11"),
    ("warmup_steps", -1, ValueError, r"warmup_steps must be >= 0"),
    ("max_lr", float("nan"), ValueError, r"TrainConfig: max_lr must be a finite number in \(0, inf\), got nan"),
    ("max_lr", 0.0, ValueError, r"max_lr must be a finite number in \(0, inf\)"),
    ("max_lr", "1e-3", TypeError, r"TrainConfig: max_lr must be a real number .* got str '1e-3'"),
    ("max_lr", True, TypeError, r"max_lr must be a real number"),
    ("min_lr", 1.0, ValueError, r"TrainConfig: min_lr must be a finite number in \[0, 0.001\], got 1.0"),
    ("weight_decay", float("inf"), ValueError, r"weight_decay must be a finite number"),
    ("grad_clip", 0.0, ValueError, r"grad_clip must be a finite number in \(0, inf\)"),
    ("grad_clip", None, TypeError, r"grad_clip must be a real number"),
    ("betas", (0.9,), TypeError, r"TrainConfig: betas must be a pair"),
    ("betas", "0.9", TypeError, r"TrainConfig: betas must be a pair"),
    ("betas", (1.0, 0.999), ValueError, r"TrainConfig: betas\[0\] must be a finite number in \[0, 1\)"),
    ("betas", (0.9, float("nan")), ValueError, r"betas\[1\] must be a finite number"),
    ("bf16", "no", TypeError, r"TrainConfig: bf16 must be True or False, got str"),
    ("device", None, TypeError, r"TrainConfig: device must be a string"),
])
def test_train_config_checks_every_field_where_it_enters(field, bad, exc, match):
    from g2c.pretraining import TrainConfig

    good = dict(batch_size=2, context=8, max_steps=10, warmup_steps=2, max_lr=1e-3, min_lr=1e-4)
    with pytest.raises(exc, match=match):
        TrainConfig(**{**good, field: bad})


def test_train_config_keeps_good_values_and_normalises_them():
    import numpy as np
    import torch

    from g2c.pretraining import TrainConfig

    c = TrainConfig(batch_size=np.int64(4), context=torch.tensor(8), max_steps=10, warmup_steps=10, max_lr=1,
                    min_lr=0, betas=[0.9, 0.95], eval_every=0)
    assert (c.batch_size, c.context, c.warmup_steps, c.max_lr, c.min_lr, c.betas) == (4, 8, 10, 1.0, 0.0, (0.9, 0.95))
    assert type(c.batch_size) is int and type(c.context) is int and type(c.max_lr) is float


@pytest.mark.parametrize("field, bad, exc, match", [
    *[(f, v, TypeError, rf"StoryLMConfig: {f} must be an int >= 1, got {t}") for f in
      ["vocab_size", "embedding_dim", "num_layers", "num_heads", "max_seq_len"] for v, t in _NOT_INTS],
    *[(f, 0, ValueError, rf"StoryLMConfig: {f} must be >= 1, got 0") for f in
      ["vocab_size", "embedding_dim", "num_layers", "num_heads", "max_seq_len"]],
    ("hidden_dim", -1, ValueError, r"StoryLMConfig: hidden_dim must be >= 1, got -1"),
    ("hidden_dim", 2.5, TypeError, r"StoryLMConfig: hidden_dim must be an int >= 1 or None, got float 2.5"),
    ("num_heads", 3, ValueError, r"StoryLMConfig: num_heads=3 does not divide embedding_dim=128"),
    ("dropout", 1.0, ValueError, r"StoryLMConfig: dropout must be a finite number in \[0, 1\), got 1.0"),
    ("dropout", float("nan"), ValueError, r"dropout must be a finite number"),
    ("dropout", "0.1", TypeError, r"StoryLMConfig: dropout must be a real number"),
    ("name", 3, TypeError, r"StoryLMConfig: name must be a string"),
    ("name", None, TypeError, r"StoryLMConfig: name must be a string"),
    ("name", " ", ValueError, r"StoryLMConfig: name must be a non-empty string"),
])
def test_story_lm_config_checks_every_field_where_it_enters(field, bad, exc, match):
    from g2c.transformer import LADDER, StoryLMConfig

    with pytest.raises(exc, match=match):
        StoryLMConfig(**{"name": "x", field: bad})
    assert StoryLMConfig.from_dict(LADDER["StoryLM-1M"].to_dict()).to_dict() == LADDER["StoryLM-1M"].to_dict()


def _constructors():
    import torch

    from g2c.attention import CausalSelfAttention, MultiHeadAttention
    from g2c.nn import Dropout, Embedding, LayerNorm, Linear
    from g2c.recurrent import GatedLinearAttention
    from g2c.transformer import MLP, Block, TransformerLM

    lm = dict(vocab_size=16, embedding_dim=8, num_layers=1, num_heads=2, max_seq_len=16)
    return {   # name -> (build(**kw), good kwargs, {argument: kind}); kind: size, prob, pos (> 0), nonneg, real
        "Linear": (Linear, dict(in_features=4, out_features=3), {"in_features": "size", "out_features": "size",
                                                                  "init_std": "nonneg"}),
        "Embedding": (Embedding, dict(num_embeddings=5, embedding_dim=3),
                      {"num_embeddings": "size", "embedding_dim": "size", "init_std": "nonneg"}),
        "LayerNorm": (LayerNorm, dict(dim=4), {"dim": "size", "eps": "nonneg"}),
        "Dropout": (Dropout, dict(p=0.1), {"p": "prob"}),
        "CausalSelfAttention": (CausalSelfAttention, dict(dim=8), {"dim": "size"}),
        "MultiHeadAttention": (MultiHeadAttention, dict(dim=8, num_heads=2), {"dim": "size", "num_heads": "size",
                                                                             "dropout": "prob"}),
        "MLP": (MLP, dict(dim=8, hidden_dim=16), {"dim": "size", "hidden_dim": "size", "dropout": "prob"}),
        "Block": (Block, dict(dim=8, num_heads=2, hidden_dim=16), {"dim": "size", "num_heads": "size",
                                                                   "hidden_dim": "size", "dropout": "prob"}),
        "TransformerLM": (TransformerLM, lm, {**dict.fromkeys(lm, "size"), "hidden_dim": "size", "dropout": "prob"}),
        "GatedLinearAttention": (GatedLinearAttention, dict(dim=8, num_heads=2), {"dim": "size", "num_heads": "size",
                                                                                 "decay_bias": "real"}),
    }, torch


_BAD_BY_KIND = {   # kind -> [(value, exception, what the message says after "must be ")]
    "size": [(True, TypeError, "an int >= 1"), (2.5, TypeError, "an int >= 1"), ("3", TypeError, "an int >= 1"),
             ("tensor2", TypeError, "an int >= 1"), (0, ValueError, ">= 1, got 0"), (-1, ValueError, ">= 1, got -1")],
    "prob": [(True, TypeError, "a real number"), ("0.1", TypeError, "a real number"),
             (None, TypeError, "a real number"),
             (1.0, ValueError, r"a finite number in \[0, 1\)"), (float("nan"), ValueError, "a finite number")],
    "nonneg": [(True, TypeError, "a real number"), (-0.5, ValueError, r"a finite number in \[0, inf\)"),
               (float("inf"), ValueError, "a finite number")],
    "real": [(True, TypeError, "a real number"), ("2", TypeError, "a real number"), (float("nan"), ValueError,
                                                                                     "a finite number")],
}


@pytest.mark.parametrize("layer", ["Linear", "Embedding", "LayerNorm", "Dropout", "CausalSelfAttention",
                                   "MultiHeadAttention", "MLP", "Block", "TransformerLM", "GatedLinearAttention"])
def test_building_block_constructors_check_every_size_and_rate(layer):
    table, torch = _constructors()
    build, good, args = table[layer]
    build(**good)                                                            # the good control builds
    for arg, kind in args.items():
        for value, exc, rule in _BAD_BY_KIND[kind]:
            value = torch.tensor([1, 2]) if value == "tensor2" else value
            with pytest.raises(exc, match=rf"^{layer}: {re.escape(arg)}.* must be {rule}"):
                build(**{**good, arg: value})


@pytest.mark.parametrize("layer, kw, match", [
    ("MultiHeadAttention", dict(dim=8, num_heads=3), r"embedding dim 8 is not divisible by num_heads 3"),
    ("Block", dict(dim=8, num_heads=3, hidden_dim=16), r"Block: num_heads=3 does not divide dim=8"),
    ("GatedLinearAttention", dict(dim=8, num_heads=3), r"dim 8 is not divisible by num_heads 3"),
    ("TransformerLM", dict(vocab_size=16, embedding_dim=8, num_layers=1, num_heads=3, max_seq_len=16),
     r"not divisible by num_heads 3"),
])
def test_heads_that_do_not_divide_the_width_are_refused(layer, kw, match):
    build = _constructors()[0][layer][0]
    with pytest.raises(ValueError, match=match):
        build(**kw)


def test_building_blocks_take_numpy_and_0d_tensor_sizes():
    import numpy as np

    table, torch = _constructors()
    lin = table["Linear"][0](np.int64(4), torch.tensor(3))
    assert lin.weight.shape == (3, 4) and type(lin.in_features) is int
    assert table["Dropout"][0](np.float32(0.25)).p == 0.25


def _param():
    import torch

    return torch.zeros(3, requires_grad=True)


@pytest.mark.parametrize("call, exc, match", [
    *[(lambda v=v, a=a: __import__("g2c.training", fromlist=["x"]).cosine_with_warmup(
        **{"step": 3, "warmup_steps": 2, "max_steps": 10, "max_lr": 1e-3, **{a: v}}), TypeError,
       rf"cosine_with_warmup: {a} must be an int, got {t}")
      for a in ("step", "warmup_steps", "max_steps") for v, t in _NOT_INTS],
    *[(lambda v=v, a=a: __import__("g2c.training", fromlist=["x"]).cosine_with_warmup(
        3, **{"warmup_steps": 2, "max_steps": 10, "max_lr": 1e-3, **{a: v}}), exc,
       rf"cosine_with_warmup: {a} must be a {'real number' if exc is TypeError else 'finite number'}")
      for a in ("max_lr", "min_lr") for v, exc in [(True, TypeError), ("1", TypeError), (float("nan"), ValueError),
                                                   (float("inf"), ValueError)]],
    *[(lambda v=v, a=a: __import__("g2c.training", fromlist=["x"]).clip_grad_norm_([_param()], **{"max_norm": 1.0,
                                                                                              a: v}), exc,
       rf"clip_grad_norm_: {a} must be a {'real number' if exc is TypeError else 'finite number'}")
      for a in ("max_norm", "eps") for v, exc in [(True, TypeError), ("1", TypeError), (None, TypeError),
                                                  (float("nan"), ValueError), (float("inf"), ValueError)]],
    (lambda: __import__("g2c.training", fromlist=["x"]).clip_grad_norm_([_param()], 1.0, eps=-1.0), ValueError,
     r"clip_grad_norm_: eps must be a finite number >= 0, got -1.0"),
    (lambda: __import__("g2c.training", fromlist=["x"]).clip_grad_norm_(3, 1.0), TypeError,
     r"clip_grad_norm_: params must be an iterable of tensors, got int"),
    (lambda: __import__("g2c.training", fromlist=["x"]).clip_grad_norm_([1.0], 1.0), TypeError,
     r"clip_grad_norm_: params must be tensors, got \['float'\]"),
    *[(lambda v=v, a=a: __import__("g2c.training", fromlist=["x"]).AdamW([_param()], **{a: v}), exc,
       rf"AdamW: {re.escape(a)} must be a {'real number' if exc is TypeError else 'finite number'}")
      for a in ("lr", "eps", "weight_decay") for v, exc in [(True, TypeError), ("1", TypeError), (None, TypeError),
                                                            (float("nan"), ValueError), (float("inf"), ValueError)]],
    (lambda: __import__("g2c.training", fromlist=["x"]).AdamW(None), TypeError, r"AdamW: params must be an iterable"),
    (lambda: __import__("g2c.training", fromlist=["x"]).AdamW([3.0]), TypeError, r"AdamW: params must be tensors"),
    (lambda: __import__("g2c.training", fromlist=["x"]).AdamW([_param()], betas="0.9"), TypeError,
     r"AdamW: betas must be a pair"),
    (lambda: __import__("g2c.training", fromlist=["x"]).AdamW([_param()], betas=(float("nan"), 0.9)), ValueError,
     r"AdamW: betas\[0\] must be a finite number"),
])
def test_training_controls_check_their_arguments_where_they_enter(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_training_controls_keep_their_good_values():
    import numpy as np
    import torch

    from g2c.training import AdamW

    opt = AdamW(iter([_param()]), lr=0, eps=0.0, weight_decay=np.float32(0.0), betas=[0.5, torch.tensor(0.9)])
    assert (opt.lr, opt.eps, opt.weight_decay, opt.betas) == (0.0, 0.0, 0.0, (0.5, pytest.approx(0.9)))
    assert type(opt.weight_decay) is float and len(opt.params) == 1


@pytest.mark.parametrize("bad, exc, match", [
    ("1.0", TypeError, r"perplexity: loss must be a real number .* got str '1.0'"),
    (True, TypeError, r"perplexity: loss must be a real number .* got bool True"),
    (None, TypeError, r"perplexity: loss must be a real number"),
    ("2 losses", TypeError, r"perplexity: loss must be a real number .* got Tensor"),
    (float("nan"), ValueError, r"perplexity: loss must be a finite number >= 0 .*got nan"),
    (float("inf"), ValueError, r"perplexity: loss must be a finite number >= 0"),
    (-0.5, ValueError, r"perplexity: loss must be a finite number >= 0 .*got -0.5"),
])
def test_perplexity_checks_its_loss(bad, exc, match):
    import torch

    from g2c.lm import perplexity

    with pytest.raises(exc, match=match):
        perplexity(torch.tensor([1.0, 2.0]) if bad == "2 losses" else bad)


def _stream_and_model():
    import numpy as np
    import torch

    from g2c.transformer import TransformerLM

    return np.arange(200) % 16, TransformerLM(16, 8, 1, 2, 16, generator=torch.Generator().manual_seed(0)), torch


@pytest.mark.parametrize("case, exc, match", [
    ("batch_size=True", TypeError, r"get_lm_batch: batch_size must be an int >= 1, got bool True"),
    ("batch_size=2.0", TypeError, r"get_lm_batch: batch_size must be an int >= 1, got float 2.0"),
    ("context=torch.tensor([1, 2])", TypeError, r"get_lm_batch: context must be an int >= 1, got Tensor"),
    ("context=0", ValueError, r"get_lm_batch: context must be >= 1, got 0"),
    ("ids=[1.5] * 50", TypeError, r"get_lm_batch: ids must be a tensor or a NumPy array of token ids, got list"),
    ("ids='abc'", TypeError, r"get_lm_batch: ids must be a tensor or a NumPy array of token ids, got str"),
    ("ids=np.arange(50) / 2", TypeError, r"get_lm_batch: ids must hold integer token ids, got dtype float64"),
    ("generator=3", TypeError, r"get_lm_batch: generator must be a torch.Generator or None, got int 3"),
    ("generator=cuda", ValueError, r"get_lm_batch: generator is on cuda:0; the window starts are drawn on the CPU"),
])
def test_get_lm_batch_checks_its_arguments(case, exc, match):
    import numpy as np

    from g2c.pretraining import get_lm_batch

    stream, _, torch = _stream_and_model()

    class Elsewhere(torch.Generator):
        @property
        def device(self):
            return torch.device("cuda:0")

    kw = dict(ids=stream, batch_size=2, context=8, generator=torch.Generator().manual_seed(0))
    name, text = case.split("=", 1)
    kw[name] = Elsewhere() if text == "cuda" else eval(text, {"np": np, "torch": torch})  # noqa: S307 - the table
    with pytest.raises(exc, match=match):
        get_lm_batch(kw.pop("ids"), kw.pop("batch_size"), kw.pop("context"), **kw)


@pytest.mark.parametrize("call, exc, match", [
    (lambda s, m: __import__("g2c.pretraining", fromlist=["x"]).split_stream(s, True), TypeError,
     r"val_fraction must be a real number in \(0, 1\), got bool True"),
    (lambda s, m: __import__("g2c.pretraining", fromlist=["x"]).split_stream("abc", 0.1), TypeError,
     r"split_stream: ids must be a tensor or a NumPy array"),
    (lambda s, m: __import__("g2c.pretraining", fromlist=["x"]).stream_loss(m, s, context=True), TypeError,
     r"stream_loss: context must be an int >= 1, got bool True"),
    (lambda s, m: __import__("g2c.pretraining", fromlist=["x"]).stream_loss(m, s, context=0), ValueError,
     r"stream_loss: context must be >= 1, got 0"),
    (lambda s, m: __import__("g2c.pretraining", fromlist=["x"]).stream_loss(m, s, context=8, batch_size=-5),
     ValueError, r"stream_loss: batch_size must be >= 1, got -5"),
    (lambda s, m: __import__("g2c.pretraining", fromlist=["x"]).Trainer(object(), s), TypeError,
     r"Trainer: model must be a course Module"),
    (lambda s, m: __import__("g2c.pretraining", fromlist=["x"]).Trainer(m, None), TypeError,
     r"Trainer \(train_ids\): ids must be a tensor or a NumPy array of token ids, got NoneType"),
    (lambda s, m: __import__("g2c.pretraining", fromlist=["x"]).Trainer(m, s, config="fast"), TypeError,
     r"Trainer: config must be a TrainConfig or None, got str"),
])
def test_pretraining_helpers_check_their_arguments(call, exc, match):
    stream, model, _ = _stream_and_model()
    with pytest.raises(exc, match=match):
        call(stream, model)


@pytest.mark.parametrize("call, exc, match", [
    (lambda: __import__("g2c.nn", fromlist=["x"]).time_call(lambda: 1, warmup=2.5), TypeError,
     r"time_call: warmup must be an int, got float 2.5"),
    (lambda: __import__("g2c.nn", fromlist=["x"]).time_call(lambda: 1, repeats=True), TypeError,
     r"time_call: repeats must be an int, got bool True"),
    (lambda: __import__("g2c.nn", fromlist=["x"]).time_call(lambda: 1, repeats=0), ValueError,
     r"time_call: repeats must be an int >= 1, got 0"),
    (lambda: __import__("g2c.nn", fromlist=["x"]).time_call(3), TypeError, r"time_call: fn must be a callable"),
    (lambda: __import__("g2c.nn", fromlist=["x"]).resolve_device(None), TypeError,
     r"resolve_device: device must be a string .* or a torch.device, got NoneType None"),
    (lambda: __import__("g2c.nn", fromlist=["x"]).resolve_device(3), TypeError,
     r"resolve_device: device must be a string"),
])
def test_nn_helpers_check_their_arguments(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@pytest.mark.parametrize("name, kw, exc, match", [
    ("sample_from_logits", dict(temperature=True), TypeError, r"temperature must be a real number"),
    ("sample_from_logits", dict(top_k=2.5), TypeError, r"top_k must be an int >= 1, got float 2.5"),
    ("sample_from_logits", dict(top_p=True), TypeError, r"top_p must be a real number in \(0, 1\] or None"),
    ("sample_from_logits", dict(generator=object()), TypeError, r"generator must be a torch.Generator or None"),
    ("sample_from_logits", dict(logits="nan"), ValueError, r"logits holds NaN at sample_from_logits"),
    ("sample_from_logits", dict(logits="-inf"), ValueError, r"logits is all -inf at sample_from_logits"),
    ("sample_from_logits", dict(logits="int"), ValueError, r"sample_from_logits: logits must be a floating-point"),
    ("sample_from_logits", dict(logits=[1.0, 2.0]), TypeError, r"sample_from_logits: logits must be a float tensor"),
    ("sample_from_logits", dict(logits="empty"), ValueError, r"sample_from_logits: logits must have at least one"),
    ("top_k_filter", dict(k="2"), TypeError, r"top_k must be an int, got str '2'"),
    ("top_k_filter", dict(logits="int"), ValueError, r"top_k_filter: logits must be a floating-point tensor"),
    ("top_p_filter", dict(p=True), TypeError, r"top_p must be a real number in \(0, 1\], got bool True"),
    ("top_p_filter", dict(p=1e-46), ValueError, r"top_p=1e-46 rounds to 0 in float32"),
    ("top_p_filter", dict(logits=[1.0]), TypeError, r"top_p_filter: logits must be a float tensor"),
    ("apply_temperature", dict(temperature=True), TypeError, r"temperature must be a real number > 0, got bool"),
    ("apply_repetition_penalty", dict(penalty=float("nan")), ValueError, r"repetition_penalty must be > 0 and finite"),
    ("apply_repetition_penalty", dict(penalty=True), TypeError, r"repetition_penalty must be a real number > 0"),
    ("apply_repetition_penalty", dict(previous_ids="neg"), ValueError, r"previous_ids holds token id -1, outside"),
    ("apply_repetition_penalty", dict(previous_ids=[1, 2]), TypeError, r"previous_ids must be a tensor"),
])
def test_sampling_steps_check_their_arguments(name, kw, exc, match):
    import torch

    import g2c.sampling as S

    named = {"nan": torch.full((16,), float("nan")), "-inf": torch.full((16,), float("-inf")),
             "int": torch.ones(16, dtype=torch.long), "empty": torch.randn(0)}
    logits = kw.pop("logits", torch.randn(16))
    logits = named[logits] if isinstance(logits, str) else logits
    if kw.get("previous_ids") == "neg":
        kw["previous_ids"] = torch.tensor([-1])
    calls = {
        "sample_from_logits": lambda: S.sample_from_logits(logits, **kw),
        "top_k_filter": lambda: S.top_k_filter(logits, kw.get("k", 3)),
        "top_p_filter": lambda: S.top_p_filter(logits, kw.get("p", 0.9)),
        "apply_temperature": lambda: S.apply_temperature(logits, kw.get("temperature", 0.7)),
        "apply_repetition_penalty": lambda: S.apply_repetition_penalty(
            logits, kw.get("previous_ids", torch.tensor([1])), kw.get("penalty", 1.2)),
    }
    with pytest.raises(exc, match=match):
        calls[name]()


def test_next_token_logits_checks_its_model_and_ids():
    import torch

    from g2c.sampling import next_token_logits

    _, model, _ = _stream_and_model()
    with pytest.raises(TypeError, match=r"model \(object\) does not satisfy g2c.sampling.LanguageModel"):
        next_token_logits(object(), torch.tensor([1, 2]))
    with pytest.raises(TypeError, match=r"next_token_logits: ids must be a 1-D tensor of token ids, got list"):
        next_token_logits(model, [1, 2])
    with pytest.raises(ValueError, match=r"next_token_logits: ids must be 1-D \(one sequence\), got shape \(1, 2\)"):
        next_token_logits(model, torch.tensor([[1, 2]]))


@pytest.mark.parametrize("case, exc, match", [
    ("A.causal_mask(2.5)", TypeError, r"causal_mask: num_queries must be an int, got float 2.5"),
    ("A.causal_mask(True)", TypeError, r"causal_mask: num_queries must be an int, got bool True"),
    ("A.causal_mask(3, torch.tensor(5.0))", TypeError, r"causal_mask: num_keys must be an int or None, got Tensor"),
    ("A.causal_mask(3, 2)", ValueError, r"causal_mask needs 1 <= num_queries <= num_keys, got 3, 2"),
    ("A.split_heads(torch.randn(1, 3, 8), True)", TypeError, r"split_heads: num_heads must be an int >= 1, got bool"),
    ("A.split_heads(torch.randn(1, 3, 8), 0)", ValueError, r"split_heads: num_heads must be >= 1, got 0"),
    ("A.split_heads([1.0], 2)", TypeError, r"split_heads: x must be a tensor \(B, T, D\), got list"),
    ("A.merge_heads('x')", TypeError, r"merge_heads: x must be a tensor \(B, H, T, d\), got str"),
    ("A.merge_heads(torch.randn(2, 3, 4))", ValueError,
     r"merge_heads: x must be \(B, H, T, d\), got shape \(2, 3, 4\)"),
    ("A.scaled_dot_product_attention(q.long(), q, q)", ValueError,
     r"scaled_dot_product_attention: q must be floating point, got dtype torch.int64"),
    ("A.scaled_dot_product_attention([1.0], q, q)", TypeError,
     r"scaled_dot_product_attention: q must be a float tensor"),
    ("LM.log_softmax([1.0, 2.0])", TypeError, r"log_softmax: logits must be a float tensor \(\.\.\., V\), got list"),
    ("LM.log_softmax(torch.ones(2, 3, dtype=torch.long))", ValueError, r"log_softmax: logits must be floating point"),
    ("LM.log_softmax(torch.randn(2, 0))", ValueError, r"log_softmax: logits must have a vocabulary dimension"),
    ("LM.cross_entropy(torch.randn(3, 16), torch.tensor([1, 2, 16]))", ValueError,
     r"cross_entropy: target 16 is outside \[0, 16\)"),
    ("LM.cross_entropy(torch.randn(3, 16), torch.tensor([1, 2, -5]))", ValueError,
     r"cross_entropy: target -5 is outside \[0, 16\)"),
    ("LM.cross_entropy(torch.randn(3, 16), torch.ones(3))", ValueError,
     r"cross_entropy: targets must be integer class ids, got dtype torch.float32"),
    ("LM.cross_entropy(torch.ones(3, 16, dtype=torch.long), torch.tensor([1, 2, 3]))", ValueError,
     r"cross_entropy: logits must be floating point"),
    ("LM.cross_entropy(torch.randn(0, 16), torch.zeros(0, dtype=torch.long))", ValueError,
     r"cross_entropy: no rows \(N = 0\)"),
    ("LM.cross_entropy(torch.randn(3, 16), [1, 2, 3])", TypeError, r"cross_entropy: targets must be a tensor"),
    ("PT.lm_cross_entropy([1.0], torch.tensor([[1]]))", TypeError, r"lm_cross_entropy: logits must be a float tensor"),
    ("PT.lm_cross_entropy(torch.randn(1, 2, 16), [[1, 2]])", TypeError, r"lm_cross_entropy: targets must be a tensor"),
    ("NN.Linear(3, 2)(torch.randn(2, 4))", ValueError, r"Linear: x must be \(\.\.\., 3\), got shape \(2, 4\)"),
    ("NN.Linear(3, 2)(torch.ones(2, 3, dtype=torch.long))", ValueError, r"Linear: x must be floating point"),
    ("NN.Linear(3, 2)([1.0, 2.0, 3.0])", TypeError, r"Linear: x must be a float tensor \(\.\.\., 3\), got list"),
    ("NN.LayerNorm(4)('x')", TypeError, r"LayerNorm: x must be a float tensor \(\.\.\., 4\), got str"),
    ("NN.LayerNorm(4)(torch.randn(2, 5))", ValueError, r"LayerNorm: x must be \(\.\.\., 4\), got shape \(2, 5\)"),
    ("NN.Embedding(5, 3)([1, 2])", TypeError, r"Embedding expects integer ids as a tensor, got list"),
    ("A.MultiHeadAttention(8, 2)(torch.randn(1, 3, 7))", ValueError,
     r"MultiHeadAttention: x must be \(\.\.\., 8\), got shape \(1, 3, 7\)"),
    ("A.MultiHeadAttention(8, 2)(torch.randn(3, 8))", ValueError,
     r"MultiHeadAttention: x must be \(B, T, 8\), got shape \(3, 8\)"),
    ("E.embed_tokens_and_positions([1, 2], NN.Embedding(16, 4), NN.Embedding(8, 4))", TypeError,
     r"embed_tokens_and_positions: ids must be an integer tensor \(B, T\), got list"),
    ("T.TransformerLM(16, 8, 1, 2, 16).hidden_states([[1, 2]])", TypeError,       # forward's provided check
     r"TransformerLM expects integer ids of shape \(B, T\) as a tensor; got list"),
])
def test_block_functions_and_forwards_check_their_inputs(case, exc, match):
    import torch

    import g2c.attention as A
    import g2c.embeddings as E
    import g2c.lm as LM
    import g2c.nn as NN
    import g2c.pretraining as PT
    import g2c.transformer as T

    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(exc, match=match):
        eval(case, {"A": A, "E": E, "LM": LM, "NN": NN, "PT": PT, "T": T, "torch": torch, "q": q})  # noqa: S307


def test_trainer_refuses_a_stream_outside_the_models_vocabulary():
    import numpy as np

    from g2c.pretraining import TrainConfig, Trainer

    _, model, _ = _stream_and_model()
    cfg = TrainConfig(batch_size=2, context=8, max_steps=2, warmup_steps=1)
    with pytest.raises(ValueError, match=r"train_ids holds token id 16, outside the model's vocabulary \[0, 16\)"):
        Trainer(model, np.array([1, 16] * 40), config=cfg)
    with pytest.raises(ValueError, match=r"val_ids holds token id -1, outside"):
        Trainer(model, np.arange(80) % 16, np.array([-1] + [1] * 40), config=cfg)


# -- specdec-serving: constraints, the masked verify rows, the load-aware controller ----------------
# (the two constrained loops are rows of LOOPS above: every bad prompt, budget and sampling knob)

def _serving_costs():
    from g2c.specdec.serving import PassCosts

    grid = (1, 2, 4)
    return PassCosts(target={b: {t: 1.0 + 0.01 * b * t for t in (1, 2, 3, 5)} for b in grid},
                     drafter={b: 0.1 for b in grid})


@pytest.mark.parametrize("entry", ["constrained_generate", "constrained_speculative_sample", "ConstrainedTarget",
                                   "ConstrainedDrafter", "mask_verify_rows"])
@pytest.mark.parametrize("case, error, match", [
    ("a pattern string", TypeError, r"constraint must be a g2c\.specdec\.serving\.TokenConstraint, got str"),
    ("None", TypeError, r"constraint must be a g2c\.specdec\.serving\.TokenConstraint, got NoneType"),
    # was: constrained_speculative_sample read constraint.eos_id first (AttributeError on a str)
    ("another vocabulary", ValueError, r"the constraint's vocabulary has V=9 tokens but the model's has "
                                       r"vocab_size=16: build the constraint from the model's tokenizer"),
])
def test_serving_entry_points_refuse_a_wrong_constraint(entry, case, error, match):
    import torch

    from g2c.specdec.sampling.drafters import LMDrafter
    from g2c.specdec.serving import (
        ConstrainedDrafter,
        ConstrainedTarget,
        constrained_generate,
        constrained_speculative_sample,
        mask_verify_rows,
    )

    bad = {"a pattern string": "[a-o]+", "None": None, "another vocabulary": _constraint("[a-h]+", vocab=9)}[case]
    target = _lm(0)
    calls = {
        "constrained_generate": lambda: constrained_generate(target, [1, 2], 3, bad),
        "constrained_speculative_sample": lambda: constrained_speculative_sample(target, LMDrafter(_lm(1)), [1, 2],
                                                                                 3, bad, k=2),
        "ConstrainedTarget": lambda: ConstrainedTarget(target, bad),
        "ConstrainedDrafter": lambda: ConstrainedDrafter(LMDrafter(_lm(1)), bad),
        # mask_verify_rows has no model: a constraint of another V meets the logits' shape check
        "mask_verify_rows": lambda: mask_verify_rows(torch.zeros(1, V), bad, 0, torch.zeros(0, dtype=torch.long)),
    }
    if entry == "mask_verify_rows" and case == "another vocabulary":
        error, match = ValueError, r"logits must be \(k'\+1, V\) = \(1, 9\) for 0 drafts, got \(1, 16\)"
    with pytest.raises(error, match=match) as info:
        calls[entry]()
    assert "\n" not in str(info.value)


def test_serving_a_drafter_over_another_vocabulary_is_refused():
    from g2c.specdec.sampling.drafters import LMDrafter
    from g2c.specdec.serving import constrained_speculative_sample
    from g2c.transformer import TransformerLM

    small = TransformerLM(9, 8, 1, 2, 32).eval()
    with pytest.raises(ValueError, match=r"the constraint's vocabulary has V=16 tokens but the model's has "
                                         r"vocab_size=9"):
        constrained_speculative_sample(_lm(0), LMDrafter(small), [1, 2], 3, _constraint(), k=2)


@pytest.mark.parametrize("eos, error, match", [
    (V, ValueError, r"eos_id 16 is outside the vocabulary \[0, 16\): the loop could never emit it"),   # was "differs"
    (-1, ValueError, r"eos_id -1 is outside the vocabulary"),
    (0.0, TypeError, r"eos_id must be an int, got float 0\.0"),      # was: accepted (0.0 == the constraint's 0)
    (True, TypeError, r"eos_id must be an int, got bool True"),
    (None, ValueError, r"eos_id=None differs from the constraint's eos_id=0: leave eos_id out"),
    (3, ValueError, r"eos_id=3 differs from the constraint's eos_id=0: leave eos_id out"),
])
def test_serving_constrained_loops_take_the_constraints_eos_only(eos, error, match):
    from g2c.specdec.sampling.drafters import LMDrafter
    from g2c.specdec.serving import constrained_speculative_sample

    with pytest.raises(error, match=match) as info:
        constrained_speculative_sample(_lm(0), LMDrafter(_lm(1)), [1, 2], 3, _constraint(), k=2, eos_id=eos)
    assert "\n" not in str(info.value)
    ids, _ = constrained_speculative_sample(_lm(0), LMDrafter(_lm(1)), [1, 2], 3, _constraint(), k=2, eos_id=0)
    new = ids[2:].tolist()                        # the constraint's EOS given explicitly is taken: "[a-o]+" then EOS
    assert ids[:2].tolist() == [1, 2] and 1 <= len(new) <= 3 and all(1 <= t < V for t in new[:-1])
    assert new[0] != 0 and (new[-1] == 0 or len(new) == 3)


@pytest.mark.parametrize("k, error, match", [
    (0, ValueError, r"k must be >= 1 draft tokens per target pass \(an int\), got 0"),
    (-1, ValueError, r"k must be >= 1 draft tokens per target pass \(an int\), got -1"),
    (2.0, TypeError, r"k must be >= 1 draft tokens per target pass \(an int\), got 2\.0 \(float"),
])
def test_serving_constrained_speculation_refuses_a_bad_k(k, error, match):
    from g2c.specdec.sampling.drafters import LMDrafter
    from g2c.specdec.serving import constrained_speculative_sample

    with pytest.raises(error, match=match):
        constrained_speculative_sample(_lm(0), LMDrafter(_lm(1)), [1, 2], 3, _constraint(), k=k)


_TOY_BYTES = [None] + [bytes([0x61 + i]) for i in range(V - 1)]     # id 0 special, ids 1..15 the bytes a..o


@pytest.mark.parametrize("pattern, token_bytes, eos, error, match", [
    (3, _TOY_BYTES, 0, TypeError, r"pattern must be a str, got int"),
    ("(ab", _TOY_BYTES, 0, ValueError, r"pattern '\(ab': '\(' is never closed at position 3"),
    ("[z-a]", _TOY_BYTES, 0, ValueError, r"pattern '\[z-a\]': bad range z-a"),
    ("a{2}", _TOY_BYTES, 0, ValueError, r"pattern 'a\{2\}': '\{' is not supported"),
    # was: accepted, then a ValueError at the first mask() inside a generation loop
    ("z+", _TOY_BYTES, 0, ValueError, r"the vocabulary has no token for byte 0x7a, which pattern 'z\+' needs"),
    # ... and a byte a later state needs (was: accepted, then the error once a loop reached that state)
    ("abz", _TOY_BYTES, 0, ValueError, r"the vocabulary has no token for byte 0x7a, which pattern 'abz' needs"),
    ("(ab|cd)z", _TOY_BYTES, 0, ValueError, r"no token for byte 0x7a, which pattern '\(ab\|cd\)z' needs"),
    ("a", _TOY_BYTES, V, ValueError, r"eos_id must be an int id in \[0, 16\), got 16"),
    ("a", _TOY_BYTES, -1, ValueError, r"eos_id must be an int id in \[0, 16\), got -1"),
    ("a", _TOY_BYTES, 1.0, TypeError, r"eos_id must be an int id in \[0, 16\), got float 1\.0"),   # was a ValueError
    ("a", _TOY_BYTES, None, TypeError, r"eos_id must be an int id in \[0, 16\), got NoneType None"),
    ("a", "abc", 0, TypeError, r"token_bytes must be a sequence of bytes or None per id, got str"),
    ("a", 16, 0, TypeError, r"token_bytes must be a sequence of bytes or None per id, got int"),   # was 'int' ...
    ("a", ["a", "b"], 0, TypeError, r"token_bytes must hold bytes or None, got str"),
    ("a", [], 0, ValueError, r"token_bytes is empty"),
])
def test_serving_token_constraint_names_a_bad_pattern_vocabulary_or_eos(pattern, token_bytes, eos, error, match):
    from g2c.specdec.serving import TokenConstraint

    with pytest.raises(error, match=match) as info:
        TokenConstraint(pattern, token_bytes, eos)
    assert "\n" not in str(info.value)


def test_serving_token_constraint_takes_numpy_and_tensor_eos_ids():
    import numpy as np
    import torch

    from g2c.specdec.serving import TokenConstraint

    for eos in (np.int64(0), torch.tensor(0)):
        c = TokenConstraint("a", _TOY_BYTES, eos)
        assert type(c.eos_id) is int and c.eos_id == 0 and c.mask(c.step(c.start, 1)).nonzero().tolist() == [[0]]


@pytest.mark.parametrize("case, logits, state, drafts, error, match", [
    ("float drafts", "ok", 0, [1.0, 2.0], ValueError, r"draft_ids must hold integer token ids, got dtype torch\.float"),
    ("draft outside V", "ok", 0, [1, V], ValueError, r"draft_ids holds token id 16, outside the constraint's "
                                                     r"vocabulary \[0, 16\)"),          # was: a silent DEAD row
    ("negative draft", "ok", 0, [-1, 2], ValueError, r"draft_ids holds token id -1, outside"),
    ("list drafts", "ok", 0, "list", ValueError, r"draft_ids must be a 1-D tensor of ids"),
    ("2-D drafts", "ok", 0, [[1, 2]], ValueError, r"draft_ids must be a 1-D tensor of ids"),
    ("float state", "ok", 0.0, [1, 2], TypeError, r"state must be an int, got float 0\.0"),    # was: accepted
    ("bool state", "ok", True, [1, 2], TypeError, r"state must be an int, got bool True"),     # was: state 1
    ("None state", "ok", None, [1, 2], TypeError, r"state must be an int, got NoneType None"),
    ("state past the automaton", "ok", 99, [1, 2], ValueError,
     r"state 99 is not a state of the constraint \(0\.\.1, DONE=-2 or DEAD=-1\)"),           # was an IndexError
    ("negative state", "ok", -7, [1, 2], ValueError, r"state -7 is not a state of the constraint"),  # was: as DEAD
    ("integer logits", "long", 0, [1, 2], ValueError, r"logits must be floating point .* got dtype torch\.int64"),
    ("bool logits", "bool", 0, [1, 2], ValueError, r"logits must be floating point .* got dtype torch\.bool"),
    ("rows for another k", "short", 0, [1, 2], ValueError, r"logits must be \(k'\+1, V\) = \(3, 16\) for 2 drafts, "
                                                            r"got \(2, 16\)"),
])
def test_serving_mask_verify_rows_checks_its_inputs_before_the_exercise(case, logits, state, drafts, error, match):
    import torch

    from g2c.specdec.serving import mask_verify_rows

    rows = {"ok": torch.zeros(3, V), "long": torch.zeros(3, V, dtype=torch.long),
            "bool": torch.zeros(3, V, dtype=torch.bool), "short": torch.zeros(2, V)}[logits]
    draft_ids = [1, 2] if drafts == "list" else torch.tensor(drafts)
    with pytest.raises(error, match=match) as info:
        mask_verify_rows(rows, _constraint("[a-o]+"), state, draft_ids)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("batch, error, match", [
    (0, ValueError, r"batch must be an int >= 1, got 0"),
    (-3, ValueError, r"batch must be an int >= 1, got -3"),
    (2.5, TypeError, r"batch must be an int >= 1, got float 2\.5"),          # was a ValueError
    (True, TypeError, r"batch must be an int >= 1, got bool True"),
    (None, TypeError, r"batch must be an int >= 1, got NoneType None"),
    ("4", TypeError, r"batch must be an int >= 1, got str '4'"),
])
def test_serving_controllers_refuse_a_bad_batch_size(batch, error, match):
    import numpy as np

    from g2c.specdec.serving import LoadAwareK, best_k

    ctl = LoadAwareK(_serving_costs(), clock=None)
    with pytest.raises(error, match=match):
        ctl.next_k(batch)
    assert ctl.history == []                             # a refused call records no round
    with pytest.raises(error, match=match):
        best_k(0.7, batch, _serving_costs())
    assert ctl.next_k(np.int64(2)) == best_k(0.7, 2, _serving_costs())     # was: a NumPy int refused
    assert ctl.history == [(2, ctl.history[0][1])] and type(ctl.history[0][0]) is int


@pytest.mark.parametrize("call, error, match", [
    (lambda m: m.LoadAwareK(_serving_costs(), k_max=2.0), TypeError, r"k_max must be an int >= 1, got float 2\.0"),
    (lambda m: m.LoadAwareK(_serving_costs(), k_max=0), ValueError, r"k_max must be an int >= 1, got 0"),
    (lambda m: m.LoadAwareK(_serving_costs(), prior_alpha="0.5"), TypeError,           # was torch/Python's '<='
     r"prior_alpha must be a real number, got str '0\.5'"),
    (lambda m: m.LoadAwareK(_serving_costs(), prior_alpha=1.5), ValueError, r"prior_alpha must be a finite number "
                                                                           r"in \[0, 1\], got 1\.5"),
    (lambda m: m.LoadAwareK(_serving_costs(), prior_weight=float("inf")), ValueError,   # was: alpha = nan
     r"prior_weight must be a finite number in \[0, inf\), got inf"),
    (lambda m: m.LoadAwareK(_serving_costs(), decay=0.0), ValueError, r"decay must be a finite number in \(0, 1\]"),
    (lambda m: m.LoadAwareK(_serving_costs(), probe_every=0), ValueError, r"probe_every must be an int >= 1, got 0"),
    (lambda m: m.LoadAwareK(_serving_costs(), clock=3), TypeError, r"clock must be a callable .* got int"),
    (lambda m: m.LoadAwareK({"1": 1.0}), TypeError, r"costs must be a PassCosts, got dict"),
    (lambda m: m.LoadAwareK(_serving_costs(), clock=None).update(drafted=4, accepted=[5]), ValueError,
     r"accepted must be in \[0, drafted=4\], got 5"),                          # was: alpha silently above 1
    (lambda m: m.LoadAwareK(_serving_costs(), clock=None).update(drafted=4, accepted=[-1]), ValueError,
     r"accepted must be an int >= 0, got -1"),
    (lambda m: m.LoadAwareK(_serving_costs(), clock=None).update(drafted=2.5, accepted=1), TypeError,
     r"drafted must be an int >= 0, got float 2\.5"),
    (lambda m: m.StaticBatchK(1.0), TypeError, r"k must be an int >= 0, got float 1\.0"),
    (lambda m: m.StaticBatchK(-1), ValueError, r"k must be an int >= 0, got -1"),
    (lambda m: m.best_k("0.5", 2, _serving_costs()), TypeError, r"alpha must be a real number, got str"),
    (lambda m: m.best_k(float("nan"), 2, _serving_costs()), ValueError, r"alpha must be a finite number in \[0, 1\]"),
    (lambda m: m.best_k(0.5, 2, {}), TypeError, r"costs must be a PassCosts, got dict"),
    (lambda m: m.expected_tokens(0.5, 2.0), TypeError, r"k must be an int >= 0, got float 2\.0"),
    (lambda m: m.break_even_batch(0.5, _serving_costs(), max_batch=0), ValueError,      # was: None (never pays off)
     r"max_batch must be an int >= 1, got 0"),
    (lambda m: m.PassCosts({}, {1: 0.1}), ValueError, r"PassCosts\.target must be a non-empty dict"),   # was: an
    (lambda m: m.PassCosts({1: {1: -1.0}}, {1: 0.1}), ValueError,                       # IndexError at best_k
     r"PassCosts\.target seconds must be a finite number in \[0, inf\), got -1\.0"),
    (lambda m: m.PassCosts({1: {0: 1.0}}, {1: 0.1}), ValueError, r"PassCosts\.target\[1\] T must be an int >= 1"),
    (lambda m: m.PassCosts({1: {1: 1.0}}, {0: 0.1}), ValueError, r"PassCosts\.drafter batch size must be an int >= 1"),
], ids=lambda v: "" if callable(v) else None)
def test_serving_controller_arguments_are_checked_where_they_enter(call, error, match):
    import g2c.specdec.serving as m

    with pytest.raises(error, match=match) as info:
        call(m)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kw, error, match", [
    ({"batches": (2.5,)}, TypeError, r"batches entry must be an int >= 1, got float 2\.5"),   # was KVCache's message
    ({"batches": (0,)}, ValueError, r"batches entry must be an int >= 1, got 0"),
    ({"batches": ()}, ValueError, r"batches must hold at least one value"),
    ({"batches": 4}, TypeError, r"batches must be a list of ints, got int 4"),               # was 'int' not iterable
    ({"tokens": (True,)}, TypeError, r"tokens entry must be an int >= 1, got bool True"),
    ({"repeats": 0}, ValueError, r"repeats must be an int >= 1, got 0"),          # was statistics' "no median"
    ({"context": 1.5}, TypeError, r"context must be an int >= 1, got float 1\.5"),
])
def test_serving_calibration_grid_is_checked_before_timing(kw, error, match):
    from g2c.specdec.serving import measure_costs, measure_round_costs

    model = _lm(0)
    with pytest.raises(error, match=match):
        measure_costs(model, model, **{"batches": (1,), "tokens": (1,), "context": 4, "repeats": 1, **kw})
    if "batches" in kw:                                   # was: True taken as batch 1, 2.5 a range() error
        with pytest.raises(error, match=match):
            measure_round_costs(model, model, batches=kw["batches"], ks=(0,), rounds=1, prompt_len=2)


@pytest.mark.parametrize("text, match", [
    ("{oops", r"not JSON \(Expecting property name"),                               # was a JSONDecodeError
    ("[1, 2]", r"JSON list, not an object with \"target\" and \"drafter\""),          # was a TypeError
    ('{"drafter": {"1": 0.1}}', r"no 'target' entry"),                                # was a KeyError
    ('{"target": {"x": {"1": 1}}, "drafter": {"1": 0.1}}', r"invalid literal for int\(\)"),
    ('{"target": {"1": {"1": NaN}}, "drafter": {"1": 0.1}}', r"target seconds must be a finite number"),  # was kept
])
def test_serving_a_broken_cached_calibration_names_the_file_and_the_rebuild(tmp_path, text, match):
    from g2c.specdec.serving import PassCosts

    with pytest.raises(ValueError, match=r"not a PassCosts calibration: .*" + match):
        PassCosts.from_json(text)
    path = tmp_path / "cal.json"
    path.write_text(text)
    model = _lm(0)
    with pytest.raises(ValueError, match=rf"cached calibration {re.escape(str(path))} is broken \(.*{match}.*\): "
                                         rf"delete it \(rm {re.escape(str(path))}\) and call "
                                         r"PassCosts\.load_or_measure again") as info:
        PassCosts.load_or_measure(model, model, path=path, batches=(1, 2), tokens=(1,), context=4, repeats=1)
    assert "\n" not in str(info.value) and path.read_text() == text         # refused, not overwritten


def test_serving_a_cached_calibration_of_another_grid_is_remeasured_one_that_lies_is_refused(tmp_path):
    from g2c.specdec.serving import PassCosts

    model, path = _lm(0), tmp_path / "cal.json"
    grid = {"batches": (1, 2), "tokens": (1,), "context": 4, "repeats": 1}
    other = _serving_costs()                                 # batches 1, 2, 4 and tokens 1, 2, 3, 5
    other.meta["grid"] = [[1, 4], [1], 4, 1]                 # written for another grid: measured again
    path.write_text(other.to_json())
    costs = PassCosts.load_or_measure(model, model, path=path, **grid)
    assert sorted(costs.target) == [1, 2] and PassCosts.from_json(path.read_text()).target == costs.target
    other.meta["grid"] = [[1, 2], [1], 4, 1]                 # claims this grid, holds another: refused
    path.write_text(other.to_json())
    with pytest.raises(ValueError, match=r"cached calibration .*cal\.json claims the grid batches=\[1, 2\], "
                                         r"tokens=\[1\] but holds batches=\[1, 2, 4\], tokens=\[1, 2, 3, 5\]: "
                                         r"delete it \(rm .*\)"):
        PassCosts.load_or_measure(model, model, path=path, **grid)
    with pytest.raises(TypeError, match=r"path must be a str or os\.PathLike or None, got int"):
        PassCosts.load_or_measure(model, model, path=3, **grid)
