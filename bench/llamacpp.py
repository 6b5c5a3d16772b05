#!/usr/bin/env python3
"""g2c against llama.cpp on the same weights, prompts and thread count: plain greedy and
draft-model speculative decoding, in one run.

    python bench/setup_llamacpp.py                 # once: builds llama.cpp's tools (~10 min on 2 cores)
    python bench/llamacpp.py                       # StoryLM-30M, StoryLM-1M-distilled drafts, k = 4, 1 thread
    python bench/llamacpp.py --quick               # 2 prompts x 32 tokens, 2 rounds
    python bench/llamacpp.py --drafter StoryLM-1M --k 4 --threads 2
    python bench/llamacpp.py --dtype bfloat16      # bf16 GGUFs and g2c in bfloat16, same weights

What it does:

1. Exports the target and the drafter to float32 GGUF under ``runs/gguf/`` with llama.cpp's own
   converter (``python -m g2c.assets.gguf``, ``--via converter``; reused when present) and
   checks each file's read-back logits against g2c. ``--dtype bfloat16``: bf16 GGUFs of the same
   weights (their matrices are the bfloat16 weights g2c loads with ``dtype="bfloat16"``; norms
   and biases stay float32 in the file), and every g2c row in bfloat16: each engine's bfloat16
   model is its own model, so greedy texts may part where two logits nearly tie.
2. Takes ``--prompts`` validation-story openings (``--prompt-tokens`` tokens, decoded to text:
   both engines tokenize the same text; g2c re-encodes it with the StoryTokenizer).
3. Runs, interleaved (one warm-up call per row, then ``--rounds`` rounds of one call per row,
   the median per row):

   * g2c plain cached decoding (``cached_generate``, the teaching path) - every speed-up divides this;
   * g2c plain cached decoding on the fast path (``g2c.kvcache.fast.fast_model``: its fused step,
     ``g2c.kvcache.step``), and on the fast path's older lean loop (``backend="plain"``, the
     "plain loop" rows: the before of issue 55);
   * g2c greedy speculative decoding with KV caches (``speculative_generate_cached``), on the
     teaching path and on both fast backends (target and drafter);
   * llama.cpp ``llama-completion`` greedy (``--temp 0``) and ``llama-speculative-simple``
     with the drafter GGUF as ``--model-draft`` (``--spec-type draft-simple
     --spec-draft-n-max k --spec-draft-n-min 0``).

   All at ``--threads`` (default 1) threads; g2c sets ``torch.set_num_threads``, llama.cpp gets
   ``-t``/``-td``. llama.cpp's tok/s is its own decode timer (prompt processing and model
   loading excluded); g2c's is new tokens / wall seconds of the whole call (prompt prefill
   included, so g2c is measured slightly pessimistically).
4. Prints: whether llama.cpp's greedy text equals g2c's (per prompt; where not, the first
   differing character; the speculative tool may run up to k tokens past ``-n``, so texts are
   compared over their common length), tokens per target pass (g2c: generated / target
   passes; llama.cpp: every pass emits exactly one token of the target's own, so passes =
   decoded - accepted), tok/s and the speed-up over g2c's plain cached decoding.

Needs ``bench/setup_llamacpp.py`` first (the message says so). Reference solutions are applied.
"""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets.artifacts import DRAFTERS, ArtifactError, canonical_name, load_model, model_names
from g2c.assets.cli import count, draft_room_problem, model_name
from g2c.assets.data import validation_prompts
from g2c.assets.gguf import check_gguf, export_gguf, llama_cpp_source
from g2c.kvcache import cached_generate
from g2c.kvcache.fast import fast_model
from g2c.specdec.sampling.cached import speculative_generate_cached
from g2c.transformer.config import LADDER

ROOT = Path(__file__).resolve().parents[1]
BIN = ROOT / "runs" / "llama.cpp" / "build" / "bin"
GGUF_DIR = ROOT / "runs" / "gguf"
FALLBACK = ["Once upon a time", "Tom and his dog went to the park. The sun was"]


def _tools_folder(text: str) -> Path:
    """``--bin``: an existing folder (the tools in it are looked for after parsing)."""
    path = Path(text).expanduser()
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no such folder; build llama.cpp's tools with python "
                                         "bench/setup_llamacpp.py, or give the folder that holds llama-completion "
                                         "and llama-speculative-simple")
    return path


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=model_name(ladder_only=True), default="StoryLM-30M")
    ap.add_argument("--drafter", type=model_name(), default="StoryLM-1M-distilled",
                    help="an LM drafter (default: the best shipped)")
    ap.add_argument("--k", type=count(1), default=4, help="draft tokens per target pass (default 4)")
    ap.add_argument("--prompts", type=count(1), default=None, help="validation prompts (default 4; --quick 2)")
    ap.add_argument("--prompt-tokens", type=count(1), default=12)
    ap.add_argument("--new-tokens", type=count(1), default=None, help="tokens per prompt (default 64; --quick 32)")
    ap.add_argument("--rounds", type=count(1), default=None, help="timed rounds (default 3; --quick 2)")
    ap.add_argument("--threads", type=count(1), default=1, help="threads for both engines (default 1; printed)")
    ap.add_argument("--bin", type=_tools_folder, default=BIN, help="llama.cpp tools (default runs/llama.cpp/build/bin)")
    ap.add_argument("--reexport", action="store_true", help="export the GGUF files again")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="both engines' weights: float32 GGUFs and models (default), or bfloat16 (bf16 GGUFs of the "
                         "same weights; g2c loads them with load_model(..., dtype='bfloat16'))")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    args.prompts = args.prompts or (2 if args.quick else 4)
    args.new_tokens = args.new_tokens or (32 if args.quick else 64)
    args.rounds = args.rounds or (2 if args.quick else 3)
    for flag in ("k", "prompts", "prompt_tokens", "new_tokens", "rounds", "threads"):
        if getattr(args, flag) < 1:
            ap.error(f"--{flag.replace('_', '-')} must be >= 1")
    if tail := draft_room_problem(args.k, LADDER[args.target].max_seq_len, whose=f"{args.target}'s"):
        ap.error(f"argument --k: {args.k}: {tail}")
    if args.drafter in DRAFTERS and DRAFTERS[args.drafter]["kind"] != "lm":
        standalone = ", ".join(list(model_names()) + [n for n, d in DRAFTERS.items() if d["kind"] == "lm"])
        ap.error(f"argument --drafter: {args.drafter} is a draft head on {DRAFTERS[args.drafter]['base']}'s states; "
                 f"llama.cpp's draft-model speculation needs a standalone language model: {standalone}")
    return args


def gguf_for(name: str, reexport: bool, outtype: str = "f32") -> Path:
    path = GGUF_DIR / f"{name}.{outtype}.gguf"
    if reexport or not path.exists():
        via = "converter" if llama_cpp_source() is not None else "writer"
        print(f"exporting {name} -> {path} (via {via}, {outtype}) ...", flush=True)
        export_gguf(name, path, via=via, outtype=outtype)
    model, _ = load_model(name, device="cpu")
    print(f"  {path.name}: read-back logits within {check_gguf(path, model):.1e} of g2c's float32 model", flush=True)
    return path


_EVAL = re.compile(r"perf_print:\s+eval time =\s*([\d.]+) ms /\s*(\d+) runs")
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_DRAFTED = re.compile(r"n_drafted\s*=\s*(\d+)")
_ACCEPTED = re.compile(r"n_accept\s*=\s*(\d+)")
LLAMA_TRIES = 3                  # runs of a llama.cpp tool before a missing statistic is an error (run_llama)


def run_llama(cmd: list[str], needs: tuple[re.Pattern, ...] = (), tries: int = LLAMA_TRIES) -> tuple[str, str]:
    """Run one llama.cpp tool; (stdout, stderr). A run that exits 0 without printing every
    statistic in ``needs`` is run again, up to ``tries`` runs in all: llama-speculative-simple
    sometimes stops right after loading its draft model with exit 0 and no decoding (seen once
    in four bfloat16 benches on a 2-core Xeon; the same command then decodes normally).

    Raises:
        SystemExit: the tool exits non-zero, or ``tries`` runs in a row lack a statistic (the
            message names the tool and shows its last stderr lines).
    """
    name = Path(cmd[0]).name
    for attempt in range(1, tries + 1):
        done = subprocess.run(cmd, capture_output=True, text=True)
        tail = "\n".join(done.stderr.strip().splitlines()[-6:])
        if done.returncode != 0:
            raise SystemExit(f"bench/llamacpp.py: {name} failed (exit {done.returncode}):\n{tail}")
        if all(pattern.search(done.stderr) for pattern in needs):
            return done.stdout, done.stderr
        if attempt < tries:
            print(f"  note: {name} printed no statistics (exit 0, run {attempt} of {tries}); running it again",
                  flush=True)
    raise SystemExit(f"bench/llamacpp.py: could not read {name}'s statistics in {tries} runs of {' '.join(cmd[1:])!r}; "
                     f"its last lines:\n{tail}")


def llama_plain(args, model: Path, prompt: str) -> dict:
    out, err = run_llama([str(args.bin / "llama-completion"), "-m", str(model), "-p", prompt, "-n",
                          str(args.new_tokens), "--temp", "0", "-t", str(args.threads), "-c", "256", "-no-cnv",
                          "--no-display-prompt"], needs=(_EVAL,))
    evals = _EVAL.findall(err)
    ms, runs = float(evals[-1][0]), int(evals[-1][1])
    text = out.replace("[end of text]", "").rstrip("\n")
    return {"text": text, "seconds": ms / 1e3, "tokens": runs, "passes": runs}


def llama_spec(args, target: Path, drafter: Path, prompt: str) -> dict:
    out, err = run_llama([str(args.bin / "llama-speculative-simple"), "-m", str(target), "-md", str(drafter), "-p",
                          prompt, "-n", str(args.new_tokens), "--temp", "0", "-t", str(args.threads), "-td",
                          str(args.threads), "-c", "256", "--spec-type", "draft-simple", "--spec-draft-n-max",
                          str(args.k), "--spec-draft-n-min", "0"], needs=(_DECODED, _DRAFTED, _ACCEPTED))
    decoded, drafted, accepted = _DECODED.search(err), _DRAFTED.search(err), _ACCEPTED.search(err)
    tokens, seconds = int(decoded.group(1)), float(decoded.group(2))
    # every target pass emits exactly one token of its own (correction or bonus): passes = tokens - accepted
    passes = max(1, tokens - int(accepted.group(1)))
    text = out.strip("\n")
    text = text[len(prompt):] if text.startswith(prompt) else text
    return {"text": text.rstrip("\n"), "seconds": seconds, "tokens": tokens, "passes": passes,
            "drafted": int(drafted.group(1)), "accepted": int(accepted.group(1))}


def first_difference(a: str, b: str) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"char {i}: {a[max(0, i - 10):i + 10]!r} vs {b[max(0, i - 10):i + 10]!r}"
    return f"lengths {len(a)} vs {len(b)}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    missing = [t for t in ("llama-completion", "llama-speculative-simple") if not (args.bin / t).exists()]
    if missing:
        raise SystemExit(f"bench/llamacpp.py: {', '.join(missing)} not found in {args.bin}: run "
                         "python bench/setup_llamacpp.py first (a benchmark-only build, 10-30 minutes on 2 cores)")
    torch.set_num_threads(args.threads)
    try:
        args.target, args.drafter = canonical_name(args.target), canonical_name(args.drafter)
        target, tok = load_model(args.target, device="cpu", dtype=args.dtype)
        drafter, _ = load_model(args.drafter, device="cpu", dtype=args.dtype)
    except (ArtifactError, ValueError) as err:
        raise SystemExit(f"bench/llamacpp.py: {err}") from err
    try:
        texts = [tok.decode(p) for p in validation_prompts(tok, args.prompts, args.prompt_tokens)]
    except FileNotFoundError:
        texts = FALLBACK[:args.prompts]
    except ValueError as err:
        raise SystemExit(f"bench/llamacpp.py: {err}") from err
    outtype = {"float32": "f32", "bfloat16": "bf16"}[args.dtype]
    tgt_gguf, dr_gguf = gguf_for(args.target, args.reexport, outtype), gguf_for(args.drafter, args.reexport, outtype)
    prompts = [(t, tok.encode(t)) for t in texts]
    eos = tok.eot_id
    ftarget, fdrafter = fast_model(target), fast_model(drafter)
    ptarget, pdrafter = fast_model(target, backend="plain"), fast_model(drafter, backend="plain")
    print(f"# bench/llamacpp.py: {args.target} (target), {args.drafter} (drafter), k = {args.k}, {len(prompts)} "
          f"prompts x {args.new_tokens} new tokens, greedy, {args.dtype}, {torch.get_num_threads()} thread(s) for both "
          f"engines; 1 warm-up + median of {args.rounds} interleaved rounds", flush=True)

    def g2c_plain(model):
        def run():
            outs = [cached_generate(model, ids, args.new_tokens, temperature=0.0, eos_id=eos) for _, ids in prompts]
            return {"outs": outs, "passes": sum(len(o) - len(ids) for o, (_, ids) in zip(outs, prompts))}
        return run

    def g2c_spec(t, d):
        def run():
            outs, passes = [], 0
            for _, ids in prompts:
                out, stats = speculative_generate_cached(t, d, ids, args.new_tokens, k=args.k, eos_id=eos)
                outs.append(out)
                passes += stats.target_passes
            return {"outs": outs, "passes": passes}
        return run

    def llama(kind):
        def run():
            rows = [llama_plain(args, tgt_gguf, text) if kind == "plain" else llama_spec(args, tgt_gguf, dr_gguf, text)
                    for text, _ in prompts]
            return {"rows": rows, "seconds": sum(r["seconds"] for r in rows), "tokens": sum(r["tokens"] for r in rows),
                    "passes": sum(r["passes"] for r in rows)}
        return run

    calls = {"g2c plain cached (teaching)": g2c_plain(target),
             "g2c plain cached (fast, plain loop)": g2c_plain(ptarget),
             "g2c plain cached (fast)": g2c_plain(ftarget),
             f"g2c speculative k={args.k} (teaching)": g2c_spec(target, drafter),
             f"g2c speculative k={args.k} (fast, plain loop)": g2c_spec(ptarget, pdrafter),
             f"g2c speculative k={args.k} (fast)": g2c_spec(ftarget, fdrafter),
             "llama.cpp plain (llama-completion)": llama("plain"),
             f"llama.cpp speculative k={args.k} (llama-speculative-simple)": llama("spec")}
    for fn in calls.values():                                   # warm-up every row
        fn()
    samples = {key: [] for key in calls}
    last = {}
    for _ in range(args.rounds):                                # rounds of one call per row
        for key, fn in calls.items():
            t0 = time.perf_counter()
            res = fn()
            wall = time.perf_counter() - t0
            if "outs" in res:
                tokens = sum(len(o) - len(ids) for o, (_, ids) in zip(res["outs"], prompts))
                samples[key].append(tokens / wall)
            else:
                samples[key].append(res["tokens"] / res["seconds"])
            last[key] = res

    base_key = "g2c plain cached (teaching)"
    g2c_texts = [tok.decode(o[len(ids):].tolist()) for o, (_, ids) in zip(last[base_key]["outs"], prompts)]
    print("\nGreedy text, llama.cpp vs g2c (same prompt text, same weights):")
    for key in ("llama.cpp plain (llama-completion)", f"llama.cpp speculative k={args.k} (llama-speculative-simple)"):
        rows = last[key]["rows"]
        # the speculative tool may run past -n by up to k tokens: compare the common length
        same = [r["text"][:len(g)] == g[:len(r["text"])] for r, g in zip(rows, g2c_texts)]
        print(f"  {key}: equal {sum(same)}/{len(same)}")
        for i, (r, g, ok) in enumerate(zip(rows, g2c_texts, same)):
            if not ok:
                print(f"    prompt {i}: {first_difference(r['text'], g)}")
    fast_same = sum(a.tolist() == b.tolist() for a, b in zip(last["g2c plain cached (fast)"]["outs"],
                                                            last[base_key]["outs"]))
    spec_same = sum(a.tolist() == b.tolist() for a, b in zip(last[f"g2c speculative k={args.k} (fast)"]["outs"],
                                                            last[base_key]["outs"]))
    print(f"  g2c fast path plain / speculative equal to g2c plain: {fast_same}/{len(prompts)}, "
          f"{spec_same}/{len(prompts)}")
    loop_same = sum(a.tolist() == b.tolist() for a, b in zip(last[f"g2c speculative k={args.k} (fast)"]["outs"],
                                                            last["g2c plain cached (fast)"]["outs"]))
    print(f"  g2c fast speculative equal to g2c fast plain (lossless against its own model): "
          f"{loop_same}/{len(prompts)}")
    base = statistics.median(samples[base_key])
    print(f"\n| row | tokens/pass | tok/s (median of {args.rounds}) | speed-up over g2c plain cached |")
    print("|---|---|---|---|")
    for key, res in last.items():
        tps = statistics.median(samples[key])
        tokens = (sum(len(o) - len(ids) for o, (_, ids) in zip(res["outs"], prompts)) if "outs" in res
                  else res["tokens"])
        per_pass = tokens / max(1, res["passes"])
        extra = ""
        if "rows" in res and any("drafted" in r for r in res["rows"]):
            d, a = sum(r["drafted"] for r in res["rows"]), sum(r["accepted"] for r in res["rows"])
            extra = f" ({a}/{d} drafts accepted)"
        print(f"| {key}{extra} | {per_pass:.2f} | {tps:.1f} | {tps / base:.2f}x |")
    print(f"\n(threads {args.threads}; llama.cpp tok/s from its decode timer; g2c tok/s = new tokens / wall time "
          "of the call, prompt prefill included)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
