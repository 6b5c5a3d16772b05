#!/usr/bin/env python3
"""The sampled speculative loop on the StoryLM ladder: drafters x prompt entropy x k control.

    python bench/specdec_sampling.py            # the full run (about 10 minutes on one CPU thread)
    python bench/specdec_sampling.py --quick    # a smoke run (a minute or two)

Two prompt sets that differ in entropy, as in the lecture's lab: open-ended story openings
(the first tokens of validation stories) and copy-heavy prompts that repeat names and
phrases the continuation is likely to repeat again. For each set, greedy (temperature 0)
and sampled (temperature 0.8, a fixed ``torch.Generator`` seed per prompt), it times plain
decoding with the target (``g2c.sampling.generate``) and ``speculative_sample`` with:
StoryLM-1M (static k = 4, and the cost-model controller), the MTP head on the target
(``MTPDrafter``, k = 1, trained in this run for ``--mtp-steps`` steps) and the n-gram
prompt-lookup drafter (static k = 4, and the cost-model controller). Rows marked "cached" keep
module 16's KV cache: plain cached decoding (``g2c.kvcache.cached_generate``) and
``speculative_sample(..., use_cache=True)`` with ``LMDrafter(..., use_cache=True)`` or the MTP
head (its drafter keeps a cache of its own; the n-gram drafter has no model, so only the target
caches). It prints one table: tok/s, speed-up over plain (uncached), tokens per
CPU-second of this process and its speed-up (robust when other processes share the cores),
tokens per target pass, acceptance rate, and how many outputs equal plain greedy (greedy rows:
losslessness) or, for sampled cached rows, the uncached row's output for the same seed.

Only some rows (the plain rows always run, as the baseline):

    python bench/specdec_sampling.py --rows "StoryLM-1M" --sets open-ended --modes sampled

Timing (CONVENTIONS §7): one warm-up call, then ``--repeats`` timed runs (median), the
device synchronised before each clock read. Threads: ``--threads`` (default 1: the course
machine's 2 cores are shared by several people, so one thread is the reproducible setting).
Reference solutions are applied (G2C_APPLY_SOLUTIONS defaults to ``all`` here).
"""

from __future__ import annotations

import argparse
import sys

import torch

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets.artifacts import ArtifactError, load_model
from g2c.assets.cli import choice_list, count, device_name, model_name, real, seed
from g2c.assets.data import validation_prompts
from g2c.kvcache import cached_generate
from g2c.nn import time_call
from g2c.sampling import generate
from g2c.specdec import SpecStats
from g2c.specdec.sampling.controllers import CostModelK, StaticK
from g2c.specdec.sampling.drafters import LMDrafter, NGramDrafter
from g2c.specdec.sampling.eagle import MTPDrafter
from g2c.specdec.sampling.loop import speculative_sample

COPY_HEAVY = [   # repeated sentences, refrains, lists: the continuation tends to copy the context
    'Lily said, "I love my mom. I love my dad. I love my dog." Then Lily said it again: "I love my mom.',
    "The dog said woof. The dog said woof. The dog said woof. The dog said woof. The dog",
    "Knock, knock. Who is there? It is Sam. Knock, knock. Who is there? It is Lily. Knock, knock. Who is there?",
    'Mia said to Ben, "Can we go to the park and play on the big swing?" Ben said, "Yes, Mia, we can go to the '
    'park and play on the big swing." The next day, Mia said to Ben, "',
    "Tom counted his toys: one red car, one blue car, one green car. Then Tom counted them again: one red car,",
    "Lily had a little red hat, a little red bag and a little red ball. Her friend Max had a little blue hat, "
    "a little blue bag and",
]


def open_ended_prompts(tokenizer, n: int, num_tokens: int) -> list[list[int]]:
    """The first ``num_tokens`` tokens of the first n validation stories."""
    try:
        return validation_prompts(tokenizer, n, num_tokens)
    except (FileNotFoundError, ValueError) as err:
        raise SystemExit(f"bench/specdec_sampling.py: {err}") from err


def timed(fn, device, repeats: int):
    """Medians of ``repeats`` runs (``g2c.nn.time_call``, no warm-up): wall seconds (device synchronised
    around each) and this process's CPU seconds (robust to other processes sharing the cores, meaningful
    on a CPU device only); and the last result."""
    t = time_call(fn, device=device, warmup=0, repeats=repeats)
    return t.median_s, t.median_cpu_s, t.result


def train_mtp_head(base, *, steps: int, seed: int):
    """The CLI's recipe (``python -m g2c.specdec --drafter mtp``): a fresh head, ``steps`` AdamW steps."""
    from g2c.specdec.__main__ import _train_mtp_head
    return _train_mtp_head(base, steps=steps, seed=seed)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=model_name(ladder_only=True), default="StoryLM-30M")
    ap.add_argument("--drafter", type=model_name(standalone=True), default="StoryLM-1M")
    ap.add_argument("--prompts", type=count(1), default=4, help="prompts per set")
    ap.add_argument("--prompt-tokens", type=count(1), default=12, help="open-ended prompt length")
    ap.add_argument("--new-tokens", type=count(1), default=48)
    ap.add_argument("--temperature", type=real(0.0, lo_open=True), default=0.8)
    ap.add_argument("--k", type=count(1), default=4)
    ap.add_argument("--mtp-steps", type=count(0), default=100)
    ap.add_argument("--repeats", type=count(1), default=1)
    ap.add_argument("--device", type=device_name(), default="cpu")
    ap.add_argument("--threads", type=count(1), default=1)
    ap.add_argument("--seed", type=seed(), default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 prompts per set, 16 tokens, 10 MTP steps")
    ap.add_argument("--rows", default="", help="only drafter rows whose name contains one of these "
                    "comma-separated strings (e.g. 'StoryLM-1M,n-gram'); default all")
    ap.add_argument("--sets", type=choice_list("open-ended", "copy-heavy"),
                    default="open-ended,copy-heavy", help="prompt sets to run (comma-separated)")
    ap.add_argument("--modes", type=choice_list("greedy", "sampled"),
                    default="greedy,sampled", help="greedy and/or sampled (comma-separated)")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.new_tokens, args.mtp_steps = 2, 16, 10
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    try:
        target, tok = load_model(args.target, device=args.device)
        small, _ = load_model(args.drafter, device=args.device)
    except ArtifactError as err:
        raise SystemExit(f"bench/specdec_sampling.py: {err}") from err
    device, eos = target.device, tok.eot_id
    sets = {"open-ended": open_ended_prompts(tok, args.prompts, args.prompt_tokens),
            "copy-heavy": [tok.encode(p) for p in COPY_HEAVY[:args.prompts]]}
    print(f"# bench/specdec_sampling.py: target {args.target}, {args.prompts} prompts per set x {args.new_tokens} "
          f"new tokens, device {device}, {torch.get_num_threads()} thread(s), median of {args.repeats}", flush=True)
    wanted = [w for w in args.rows.split(",") if w]
    sets = {name: prompts for name, prompts in sets.items() if name in args.sets.split(",")}
    temps = [t for t, mode in ((0.0, "greedy"), (args.temperature, "sampled")) if mode in args.modes.split(",")]
    head = None
    mtp_rows = (f"MTP head ({args.mtp_steps} steps)", f"MTP head ({args.mtp_steps} steps) cached")
    if not wanted or any(w in name for w in wanted for name in mtp_rows):
        print(f"training the MTP head on {args.target} for {args.mtp_steps} steps ...", flush=True)
        head = train_mtp_head(target, steps=args.mtp_steps, seed=args.seed)
    generate(target, sets["open-ended"][0], 4, temperature=0.0)                 # warm-up

    def drafters(sample: bool):
        rows = [   # (name, drafter factory, controller factory, use_cache)
            (f"{args.drafter}", lambda: LMDrafter(small, sample=sample), lambda: StaticK(args.k), False),
            (f"{args.drafter} cached", lambda: LMDrafter(small, sample=sample, use_cache=True),
             lambda: StaticK(args.k), True),
            (f"{args.drafter} dynamic", lambda: LMDrafter(small, sample=sample), lambda: CostModelK(args.k, k_max=8),
             False),
            (f"{args.drafter} dynamic cached", lambda: LMDrafter(small, sample=sample, use_cache=True),
             lambda: CostModelK(args.k, k_max=8), True),
            (f"MTP head ({args.mtp_steps} steps)", lambda: MTPDrafter(head, sample=sample), lambda: StaticK(1), False),
            (f"MTP head ({args.mtp_steps} steps) cached", lambda: MTPDrafter(head, sample=sample), lambda: StaticK(1),
             True),
            ("n-gram", lambda: NGramDrafter(), lambda: StaticK(args.k), False),
            ("n-gram cached", lambda: NGramDrafter(), lambda: StaticK(args.k), True),
            ("n-gram dynamic", lambda: NGramDrafter(), lambda: CostModelK(args.k, k_max=8), False),
        ]
        return [r for r in rows if not wanted or any(w in r[0] for w in wanted)]

    rows = []
    for set_name, prompts in sets.items():
        for temp in temps:
            mode = "greedy" if temp == 0 else f"T={temp}"

            def plain(loop=generate):
                return [loop(target, p, args.new_tokens, temperature=temp, eos_id=eos,
                             generator=torch.Generator().manual_seed(args.seed + i)) for i, p in enumerate(prompts)]

            plain_s, plain_cpu, plain_out = timed(plain, device, args.repeats)
            plain_tokens = sum(len(o) - len(p) for o, p in zip(plain_out, prompts))
            plain_tps, plain_cps = plain_tokens / plain_s, plain_tokens / plain_cpu
            rows.append((set_name, mode, "plain (target only)", "-", f"{plain_tps:.1f}", "1.00x", f"{plain_cps:.1f}",
                         "1.00x", "1.00", "-", "-"))
            print("  " + " | ".join(rows[-1]), flush=True)
            cached_s, cached_cpu, cached_out = timed(lambda: plain(cached_generate), device, args.repeats)
            cached_tokens = sum(len(o) - len(p) for o, p in zip(cached_out, prompts))
            same = sum(o.tolist() == r.tolist() for o, r in zip(cached_out, plain_out))
            rows.append((set_name, mode, "plain cached (target only)", "-", f"{cached_tokens / cached_s:.1f}",
                         f"{cached_tokens / cached_s / plain_tps:.2f}x", f"{cached_tokens / cached_cpu:.1f}",
                         f"{cached_tokens / cached_cpu / plain_cps:.2f}x", "1.00", "-",
                         f"{same}/{len(prompts)}" if temp == 0 else f"{same}/{len(prompts)} = uncached"))
            print("  " + " | ".join(rows[-1]), flush=True)
            uncached_out = {}
            for name, make_drafter, make_ctl, use_cache in drafters(sample=temp > 0):
                def spec():
                    runs, ks = [], []
                    for i, p in enumerate(prompts):
                        ctl = make_ctl()
                        runs.append(speculative_sample(
                            target, make_drafter(), p, args.new_tokens, temperature=temp, eos_id=eos, controller=ctl,
                            generator=torch.Generator().manual_seed(args.seed + i), use_cache=use_cache))
                        ks.append(ctl.next_k())
                    return runs, ks

                spec_s, spec_cpu, (runs, ks) = timed(spec, device, args.repeats)
                total = sum((s for _, s in runs), SpecStats())
                tps, cps = total.generated / spec_s, total.generated / spec_cpu
                outs, key = [o.tolist() for o, _ in runs], name.replace(" cached", "")
                if temp == 0:
                    lossless = f"{sum(o == r.tolist() for o, r in zip(outs, plain_out))}/{len(prompts)}"
                elif use_cache and key in uncached_out and "dynamic" not in name:   # same seed, same draws
                    lossless = f"{sum(o == r for o, r in zip(outs, uncached_out[key]))}/{len(prompts)} = uncached"
                else:   # a dynamic k follows wall-clock costs, so its draws differ from run to run
                    lossless = "-"
                if not use_cache:
                    uncached_out[key] = outs
                k_desc = "1" if name.startswith("MTP") else (
                    f"{args.k}" if "dynamic" not in name else f"cost: end k {','.join(map(str, ks))}")
                rows.append((set_name, mode, name, k_desc, f"{tps:.1f}", f"{tps / plain_tps:.2f}x", f"{cps:.1f}",
                             f"{cps / plain_cps:.2f}x", f"{total.tokens_per_pass:.2f}", f"{total.acceptance_rate:.3f}",
                             lossless))
                print("  " + " | ".join(rows[-1]), flush=True)

    header = ("prompts", "decoding", "drafter", "k", "tok/s", "speed-up", "tok/CPU-s", "speed-up (CPU)", "tokens/pass",
              "acceptance", "= greedy / uncached")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
