#!/usr/bin/env python3
"""Speculative decoding on the StoryLM ladder: losslessness, tokens per pass, wall clock.

    python bench/specdec.py            # the full run (about 10 minutes on 2 CPU cores)
    python bench/specdec.py --quick    # a smoke run (a minute or two)

For N validation-split prompts it runs plain greedy decoding with the target, then greedy
speculative decoding with each drafter and draft length k, and MTP self-speculation (an
``MTPHead`` trained for a few hundred steps on the frozen StoryLM-5M, drafting one token per
pass for its own base). It prints one table: drafter, target, k, lossless count (speculative
output byte-identical to plain greedy), acceptance rate, tokens per target pass, plain and
speculative tokens/s and the speed-up, all measured in this run.

Timing (CONVENTIONS §7): one warm-up run, then the median of ``--repeats`` runs, the device
synchronised before every clock read. Threads: torch's default unless ``--threads``.
Reference solutions are applied (G2C_APPLY_SOLUTIONS defaults to ``all`` here), so the
numbers measure the answer key, not a half-finished scaffold.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets.artifacts import ArtifactError, load_model
from g2c.assets.data import load_token_stream, validation_prompts
from g2c.nn import time_call
from g2c.sampling import generate
from g2c.specdec import SpecStats, mtp_generate, speculative_generate, train_mtp_head

HEADER = ("drafter", "target", "k", "lossless", "acceptance", "tokens/pass", "plain tok/s", "spec tok/s", "speed-up")


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="StoryLM-30M")
    ap.add_argument("--drafters", default="StoryLM-1M,StoryLM-5M")
    ap.add_argument("--ks", default="1,2,4,8", help="draft lengths for the first drafter; the others use k=4")
    ap.add_argument("--prompts", type=int, default=6)
    ap.add_argument("--prompt-tokens", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--mtp-base", default="StoryLM-5M")
    ap.add_argument("--mtp-steps", type=int, default=300)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads(N) before timing (default: torch's choice); the count is printed. "
                         "On a shared machine, 1 thread avoids oversubscription")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="smoke run: 2 prompts, 16 tokens, k in {1, 4}, 1 repeat")
    args = ap.parse_args(argv)
    if args.quick:
        args.prompts, args.new_tokens, args.ks, args.repeats, args.mtp_steps = 2, 16, "1,4", 1, 20
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads {args.threads}: use 1 or more")
    return args


def timed(fn, device, repeats: int) -> tuple[float, object]:
    """Warm up once, then the median seconds of ``repeats`` runs (``g2c.nn.time_call``);
    returns (seconds, last result)."""
    timing = time_call(fn, device=device, warmup=1, repeats=repeats)
    return timing.median_s, timing.result


def table_row(drafter_name, target_name, k, reference, outs, stats_list, plain_s, spec_s) -> tuple[str, ...]:
    """One table row: losslessness against the plain outputs, pooled counters, tok/s and speed-up."""
    total = sum(stats_list, SpecStats())
    lossless = sum(o.tolist() == r.tolist() for o, r in zip(outs, reference))
    plain_tps, spec_tps = total.generated / plain_s, total.generated / spec_s
    return (drafter_name, target_name, str(k), f"{lossless}/{len(outs)}", f"{total.acceptance_rate:.3f}",
            f"{total.tokens_per_pass:.2f}", f"{plain_tps:.1f}", f"{spec_tps:.1f}", f"{spec_tps / plain_tps:.2f}x")


def train_head(base, args):
    """The MTP head for self-speculation, trained on the frozen base (progress printed)."""
    print(f"training an MTPHead on frozen {args.mtp_base} for {args.mtp_steps} steps ...", flush=True)
    t0 = time.perf_counter()

    def log(record):
        if record["step"] == 1 or record["step"] % max(1, args.mtp_steps // 5) == 0:
            print(f"  mtp step {record['step']:4d}/{args.mtp_steps}  loss {record['loss']:.3f}  "
                  f"two-ahead top-1 {record['accuracy']:.3f}  ({time.perf_counter() - t0:.0f}s)", flush=True)

    head, _ = train_mtp_head(base, load_token_stream("train"), steps=args.mtp_steps, batch_size=8, seq_len=128,
                             lr=1e-3, generator=torch.Generator().manual_seed(args.seed), on_step=log)
    return head


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    ks = [int(k) for k in args.ks.split(",")]
    drafter_names = [d for d in args.drafters.split(",") if d]
    try:
        target, tokenizer = load_model(args.target, device=args.device)
        drafters = {name: load_model(name, device=args.device)[0] for name in drafter_names}
        prompts = validation_prompts(tokenizer, args.prompts, args.prompt_tokens)
    except (ArtifactError, FileNotFoundError) as err:
        raise SystemExit(f"bench/specdec.py: {err}") from err
    device, eos = target.device, tokenizer.eot_id
    print(f"# bench/specdec.py: {len(prompts)} val prompts x {args.new_tokens} new tokens, device {device}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}", flush=True)

    def plain(model):
        return [generate(model, p, args.new_tokens, temperature=0.0, eos_id=eos) for p in prompts]

    def unzip(runs):
        return [out for out, _ in runs], [s for _, s in runs]

    rows = []
    print(f"plain greedy with {args.target} ...", flush=True)
    plain_s, reference = timed(lambda: plain(target), device, args.repeats)
    for i, name in enumerate(drafter_names):
        for k in (ks if i == 0 else [4]):
            spec_s, (outs, stats_list) = timed(lambda: unzip(
                [speculative_generate(target, drafters[name], p, args.new_tokens, k=k, eos_id=eos) for p in prompts]),
                device, args.repeats)
            rows.append(table_row(name, args.target, k, reference, outs, stats_list, plain_s, spec_s))
            print("  " + " | ".join(rows[-1]), flush=True)
    if args.mtp_steps > 0:
        try:
            base = drafters.get(args.mtp_base) or load_model(args.mtp_base, device=args.device)[0]
            head = train_head(base, args)
        except (ArtifactError, FileNotFoundError) as err:
            print(f"skipping MTP self-speculation: {err}", flush=True)
        else:
            base_plain_s, base_reference = timed(lambda: plain(base), device, args.repeats)
            spec_s, (outs, stats_list) = timed(lambda: unzip(
                [mtp_generate(base, head, p, args.new_tokens, eos_id=eos) for p in prompts]), device, args.repeats)
            rows.append(table_row(f"MTP head ({args.mtp_steps} steps)", args.mtp_base, 1, base_reference, outs,
                                  stats_list, base_plain_s, spec_s))
    print("\n| " + " | ".join(HEADER) + " |\n|" + "---|" * len(HEADER))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n(device {device}, {torch.get_num_threads()} torch threads, median of {args.repeats} after 1 warm-up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
