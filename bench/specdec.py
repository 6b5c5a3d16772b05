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

import os

os.environ.setdefault("G2C_APPLY_SOLUTIONS", "all")
os.environ.setdefault("G2C_QUIET", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from g2c.assets.artifacts import ArtifactError, load_model  # noqa: E402
from g2c.assets.data import load_split_text, load_token_stream  # noqa: E402
from g2c.nn import time_call  # noqa: E402
from g2c.sampling import generate  # noqa: E402
from g2c.specdec import SpecStats, mtp_generate, speculative_generate, train_mtp_head  # noqa: E402


def prompts_from_val(tokenizer, n: int, num_tokens: int) -> list[list[int]]:
    """The first ``num_tokens`` tokens of the first n validation stories."""
    try:
        stories = load_split_text("val")
    except FileNotFoundError as err:
        raise SystemExit(f"bench/specdec.py needs the validation split: {err}\n"
                         "Prepare it with ./datasets.sh (see README).") from err
    out = []
    for story in stories:
        ids = tokenizer.encode(story)
        if len(ids) >= num_tokens:
            out.append(ids[:num_tokens])
        if len(out) == n:
            return out
    raise SystemExit(f"only {len(out)} validation stories have {num_tokens} tokens; lower --prompt-tokens")


def timed(fn, device, repeats: int) -> tuple[float, object]:
    """Warm up once, then the median seconds of ``repeats`` runs (``g2c.nn.time_call``);
    returns (seconds, last result)."""
    timing = time_call(fn, device=device, warmup=1, repeats=repeats)
    return timing.median_s, timing.result


# -- the benchmark ------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
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
    if args.threads is not None:
        if args.threads < 1:
            ap.error(f"--threads {args.threads}: use 1 or more")
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    ks = [int(k) for k in args.ks.split(",")]
    drafter_names = [d for d in args.drafters.split(",") if d]

    try:
        target, tokenizer = load_model(args.target, device=args.device)
        drafters = {name: load_model(name, device=args.device)[0] for name in drafter_names}
    except ArtifactError as err:
        raise SystemExit(f"bench/specdec.py: {err}") from err
    device = target.device
    eos = tokenizer.eot_id
    prompts = prompts_from_val(tokenizer, args.prompts, args.prompt_tokens)
    print(f"# bench/specdec.py: {len(prompts)} val prompts x {args.new_tokens} new tokens, device {device}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats}", flush=True)

    def plain(model):
        return [generate(model, p, args.new_tokens, temperature=0.0, eos_id=eos) for p in prompts]

    def speculative(drafter, k):
        runs = [speculative_generate(target, drafter, p, args.new_tokens, k=k, eos_id=eos) for p in prompts]
        return [out for out, _ in runs], [s for _, s in runs]

    rows = []

    def add_row(drafter_name, target_name, k, reference, outs, stats_list, plain_s, spec_s):
        total = SpecStats()
        for s in stats_list:
            total.target_passes += s.target_passes
            total.drafted += s.drafted
            total.accepted += s.accepted
            total.generated += s.generated
        lossless = sum(o.tolist() == r.tolist() for o, r in zip(outs, reference))
        plain_tps, spec_tps = total.generated / plain_s, total.generated / spec_s
        rows.append((drafter_name, target_name, str(k), f"{lossless}/{len(outs)}", f"{total.acceptance_rate:.3f}",
                     f"{total.tokens_per_pass:.2f}", f"{plain_tps:.1f}", f"{spec_tps:.1f}",
                     f"{spec_tps / plain_tps:.2f}x"))
        print("  " + " | ".join(rows[-1]), flush=True)

    print(f"plain greedy with {args.target} ...", flush=True)
    plain_s, reference = timed(lambda: plain(target), device, args.repeats)
    for i, name in enumerate(drafter_names):
        for k in (ks if i == 0 else [4]):
            spec_s, (outs, stats_list) = timed(lambda: speculative(drafters[name], k), device, args.repeats)
            add_row(name, args.target, k, reference, outs, stats_list, plain_s, spec_s)

    if args.mtp_steps > 0:
        try:
            base = drafters.get(args.mtp_base) or load_model(args.mtp_base, device=args.device)[0]
            print(f"training an MTPHead on frozen {args.mtp_base} for {args.mtp_steps} steps ...", flush=True)
            t0 = time.perf_counter()

            def log(record):
                if record["step"] == 1 or record["step"] % max(1, args.mtp_steps // 5) == 0:
                    print(f"  mtp step {record['step']:4d}/{args.mtp_steps}  loss {record['loss']:.3f}  "
                          f"two-ahead top-1 {record['accuracy']:.3f}  ({time.perf_counter() - t0:.0f}s)", flush=True)

            head, _ = train_mtp_head(base, load_token_stream("train"), steps=args.mtp_steps, batch_size=8,
                                     seq_len=128, lr=1e-3, generator=torch.Generator().manual_seed(args.seed),
                                     on_step=log)
        except (ArtifactError, FileNotFoundError) as err:
            print(f"skipping MTP self-speculation: {err}", flush=True)
        else:
            base_plain_s, base_reference = timed(lambda: plain(base), device, args.repeats)

            def self_spec():
                runs = [mtp_generate(base, head, p, args.new_tokens, eos_id=eos) for p in prompts]
                return [out for out, _ in runs], [s for _, s in runs]

            spec_s, (outs, stats_list) = timed(self_spec, device, args.repeats)
            add_row(f"MTP head ({args.mtp_steps} steps)", args.mtp_base, 1, base_reference, outs, stats_list,
                    base_plain_s, spec_s)

    header = ("drafter", "target", "k", "lossless", "acceptance", "tokens/pass", "plain tok/s", "spec tok/s",
              "speed-up")
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n(device {device}, {torch.get_num_threads()} torch threads, median of {args.repeats} after 1 warm-up)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
