#!/usr/bin/env python3
"""Draft trees on the StoryLM ladder: chain vs static tree vs dynamic tree at equal node budgets.

    python bench/specdec_trees.py --threads 1           # the full run (about 10 minutes on 1 CPU thread)
    python bench/specdec_trees.py --threads 1 --quick   # a smoke run (about a minute)

StoryLM-1M-distilled (the best shipped drafter; ``--drafter``) drafts for StoryLM-30M. For node
budgets n in {4, 8, 16} it runs tree speculative
decoding with a chain of n drafts, a static Medusa-style tree of n nodes
(``static_choices(n)``) and a dynamic EAGLE-2-style tree of n nodes (width 4), each
greedy (checked token for token against plain greedy decoding) and sampled (temperature
0.8, seeded). It prints one table: mode, tree, n, lossless count (greedy), tokens per target
pass (measured; for sampled runs also the tree formula's expectation from the target's own
probabilities), drafter passes per target pass, plain and speculative tokens/s, speed-up.

Timing (CONVENTIONS §7): every code path is warmed up once first, then each row is the median
of ``--repeats`` runs, the device synchronised before every clock read; the thread count is
printed. Besides wall-clock tok/s the table gives the speed-up in CPU time (this process's
``time.process_time``): on a machine shared with other jobs and one torch thread it measures
the work, not the waiting, and is the number to compare. Reference solutions are
applied (G2C_APPLY_SOLUTIONS defaults to ``all``), so the numbers measure the answer key.
Every pass recomputes the whole context (no KV cache), for the plain baseline too, unless
``--use-cache``: then the target keeps module 16's ``KVCache`` across tree passes
(``tree_speculative_generate(..., use_cache=True)``: the tree pass reads the committed rows, the
accepted path is gathered into contiguous rows) and the table adds the bytes that gather copied
per pass; the plain baseline is then plain CACHED decoding (module 16's ``cached_generate``,
same outputs), so every cached row's speed-up is over the fastest plain loop the course has.
The drafter still recomputes.
"""

from __future__ import annotations

import argparse

import torch

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets import ArtifactError, load_model
from g2c.assets.cli import choice_list, count, device_name, int_list, model_name, real, seed
from g2c.assets.data import validation_prompts
from g2c.kvcache import cached_generate
from g2c.nn import time_call
from g2c.sampling import generate
from g2c.specdec.trees.verify import TreeStats, tree_speculative_generate

FALLBACK_PROMPTS = [
    "Once upon a time, there was a little girl named Lily. She loved to play",
    "Tom and his dog went to the park. The sun was",
    "One day, a big bear found a red ball in the forest. He",
    "Sara wanted to bake a cake for her mom. She got",
    "There was a small bird who could not fly. Every day he",
    "Ben had a new toy car. It was blue and",
]


def load_prompts(tokenizer, n: int, num_tokens: int) -> list[list[int]]:
    """Validation-story openings, or fixed openings when the split is not prepared (``./datasets.sh``)."""
    try:
        return validation_prompts(tokenizer, n, num_tokens)
    except FileNotFoundError:
        print("# validation split missing: using fixed story openings", flush=True)
        return [tokenizer.encode(s) for s in FALLBACK_PROMPTS[:n]]
    except ValueError as err:
        raise SystemExit(f"bench/specdec_trees.py: {err}") from err


def timed(fn, device, repeats: int):
    """(median wall s, median CPU s, last result) of ``repeats`` synchronised runs (``g2c.nn.time_call``,
    no warm-up). CPU seconds count this process's work only: the robust number on a shared machine."""
    t = time_call(fn, device=device, warmup=0, repeats=repeats)
    return t.median_s, t.median_cpu_s, t.result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=model_name(ladder_only=True), default="StoryLM-30M")
    ap.add_argument("--drafter", type=model_name(standalone=True), default="StoryLM-1M-distilled",
                    help="an LM drafter (default: the best shipped)")
    ap.add_argument("--budgets", type=int_list(1), default="4,8,16")
    ap.add_argument("--trees", type=choice_list("chain", "static", "dynamic"), default="chain,static,dynamic")
    ap.add_argument("--width", type=count(1), default=4, help="EAGLE-2 top-k of the dynamic tree")
    ap.add_argument("--prompts", type=count(1), default=4)
    ap.add_argument("--prompt-tokens", type=count(1), default=16)
    ap.add_argument("--new-tokens", type=count(1), default=48)
    ap.add_argument("--temperature", type=real(0.0), default=0.8, help="sampled rows (0 skips them)")
    ap.add_argument("--repeats", type=count(1), default=1)
    ap.add_argument("--device", type=device_name(), default="auto")
    ap.add_argument("--threads", type=count(1), default=None)
    ap.add_argument("--seed", type=seed(), default=0)
    ap.add_argument("--use-cache", action="store_true", help="the target keeps a KVCache across tree passes")
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 prompts, 24 tokens, n in {4, 16}, 1 repeat")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.new_tokens, args.budgets, args.repeats = 2, 24, "4,16", 1
    if args.threads:
        torch.set_num_threads(args.threads)
    budgets = [int(b) for b in args.budgets.split(",")]
    kinds = [t for t in args.trees.split(",") if t]
    try:
        target, tokenizer = load_model(args.target, device=args.device)
        drafter, _ = load_model(args.drafter, device=args.device)
    except ArtifactError as err:
        raise SystemExit(f"bench/specdec_trees.py: {err}") from err
    device = target.device
    eos = tokenizer.eot_id
    prompts = load_prompts(tokenizer, args.prompts, args.prompt_tokens)
    print(f"# bench/specdec_trees.py: {args.drafter} drafts for {args.target}; {len(prompts)} prompts x "
          f"{args.new_tokens} new tokens; device {device}; {torch.get_num_threads()} threads; "
          f"median of {args.repeats}", flush=True)

    # Warm-up (CONVENTIONS §7): every code path once, on a short budget, before any clock runs.
    for kind in kinds:
        tree_speculative_generate(target, drafter, prompts[0], 8, tree=kind, num_nodes=4, temperature=0.0,
                                  use_cache=args.use_cache)
    plain_loop = cached_generate if args.use_cache else generate   # --use-cache: over plain CACHED decoding
    plain_loop(target, prompts[0], 8, temperature=0.0)

    modes = [("greedy", 0.0)] + ([("sampled", args.temperature)] if args.temperature > 0 else [])
    header = ("mode", "tree", "n", "lossless", "tok/pass", "formula", "drafter passes/pass", "plain tok/s",
              "tree tok/s", "speed-up (wall)", "speed-up (CPU time)", "KV bytes gathered/pass")
    rows = []
    for mode, temp in modes:
        def plain(temp=temp):
            g = torch.Generator().manual_seed(args.seed)
            return [plain_loop(target, p, args.new_tokens, temperature=temp, eos_id=eos, generator=g)
                    for p in prompts]

        plain_s, plain_cpu, reference = timed(plain, device, args.repeats)
        plain_tokens = sum(len(r) - len(p) for r, p in zip(reference, prompts))
        label = f"plain {'cached ' if args.use_cache else ''}{mode}"
        print(f"{label}: {plain_tokens / plain_s:.1f} tok/s wall, {plain_tokens / plain_cpu:.1f} tok per CPU-s",
              flush=True)
        for n in budgets:
            for kind in kinds:
                def spec(kind=kind, n=n, temp=temp):
                    g = torch.Generator().manual_seed(args.seed)
                    return [tree_speculative_generate(target, drafter, p, args.new_tokens, tree=kind, num_nodes=n,
                                                      width=args.width if kind == "dynamic" else None,
                                                      temperature=temp, generator=g, eos_id=eos,
                                                      use_cache=args.use_cache)
                            for p in prompts]

                spec_s, spec_cpu, runs = timed(spec, device, args.repeats)
                total = TreeStats()
                for _, s in runs:
                    for f in ("target_passes", "drafted", "accepted", "generated", "drafter_passes",
                              "expected_accepted", "kv_bytes_moved"):
                        setattr(total, f, getattr(total, f) + getattr(s, f))
                lossless = (f"{sum(o.tolist() == r.tolist() for (o, _), r in zip(runs, reference))}/{len(runs)}"
                            if temp == 0.0 else "-")
                formula = (f"{1 + total.expected_accepted / total.target_passes:.2f}" if temp > 0 else "-")
                plain_tps, spec_tps = plain_tokens / plain_s, total.generated / spec_s
                cpu_speedup = (total.generated / spec_cpu) / (plain_tokens / plain_cpu)
                rows.append((mode, kind, str(n), lossless, f"{total.tokens_per_pass:.2f}", formula,
                             f"{total.drafter_passes / total.target_passes:.1f}", f"{plain_tps:.1f}",
                             f"{spec_tps:.1f}", f"{spec_tps / plain_tps:.2f}x", f"{cpu_speedup:.2f}x",
                             f"{total.kv_bytes_moved / total.target_passes:.0f}" if args.use_cache else "-"))
                print("  " + " | ".join(rows[-1]), flush=True)
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
