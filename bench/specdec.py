#!/usr/bin/env python3
"""Speculative decoding on the StoryLM ladder: every drafter against StoryLM-30M, one run.

    python bench/specdec.py                 # the drafter table (about 10 minutes on 2 CPU cores)
    python bench/specdec.py --quick         # a smoke run (a minute or two)
    python bench/specdec.py --seed-table    # the seed's uncached greedy table (docs/beyond/specdec.md)

The drafter table: for N validation-split prompts, the target decodes alone with module 16's
KV cache (``cached_generate``: the baseline every speed-up divides), then
``speculative_sample(..., use_cache=True)`` runs every drafter at every k, greedy
(temperature 0) and sampled (``--temperature``, same seed for every row):

* StoryLM-1M, StoryLM-1M-distilled, StoryLM-5M: ``LMDrafter(model, use_cache=True)``;
* StoryLM-30M-EAGLE: ``EagleDrafter`` (feature-level drafting on the target's states);
* StoryLM-30M-MTP: ``CachedMTPDrafter`` (one draft per pass, so k = 1 only);
* StoryLM-5M-MTP drafting for its own base, StoryLM-5M (its baseline is the 5M alone).

Columns: lossless (greedy: prompts whose output equals plain greedy decoding, token for
token; sampled: "-"), acceptance rate (accepted / drafted), per-position acceptance (the
fraction of rounds that drafted >= i tokens whose i-th draft was accepted, i = 1..k), tokens
per target pass, c (the drafter's seconds per drafted token, its ``propose`` and ``commit``
together, over the target's seconds per token when it decodes alone), plain and
speculative tok/s and the speed-up.

Timing (CONVENTIONS §7): one warm-up run, then the median of ``--repeats`` runs, the device
synchronised before every clock read (``g2c.nn.time_call``). Threads: torch's default
unless ``--threads``; the count is printed. Reference solutions are applied
(``import g2c.course.solved``), so the numbers measure the answer key.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets.artifacts import DRAFTERS, ArtifactError, canonical_name, load_model, model_names
from g2c.assets.data import load_token_stream, validation_prompts
from g2c.kvcache import cached_generate
from g2c.nn import time_call
from g2c.sampling import generate
from g2c.specdec import SpecStats, mtp_generate, speculative_generate, train_mtp_head
from g2c.specdec.sampling.drafters import LMDrafter
from g2c.specdec.sampling.eagle import CachedMTPDrafter, EagleDrafter
from g2c.specdec.sampling.loop import speculative_sample

HEADER = ("drafter", "target", "k", "lossless", "acceptance", "tokens/pass", "plain tok/s", "spec tok/s", "speed-up")
DRAFTER_HEADER = ("drafter", "target", "mode", "k", "lossless", "acceptance", "per-position acceptance",
                  "tokens/pass", "c", "plain tok/s", "spec tok/s", "speed-up")
DEFAULT_DRAFTERS = "StoryLM-1M,StoryLM-1M-distilled,StoryLM-5M,StoryLM-30M-EAGLE,StoryLM-30M-MTP,StoryLM-5M-MTP"


FULL = dict(prompts=6, new_tokens=48, ks="1,2,4,8", repeats=2, mtp_steps=300)
QUICK = dict(prompts=2, new_tokens=16, ks="1,4", repeats=1, mtp_steps=20)


def parse_args(argv: list[str] | None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="StoryLM-30M", help="a ladder model (head drafters use their own base)")
    ap.add_argument("--drafters", default=None,
                    help=f"comma-separated, any case (default: {DEFAULT_DRAFTERS}; --seed-table: "
                         "StoryLM-1M,StoryLM-5M)")
    ap.add_argument("--ks", default=None, help="draft lengths, e.g. 1,2,4,8 (--seed-table: the first drafter's)")
    ap.add_argument("--prompts", type=int, default=None, help="validation prompts (default 6; --quick 2)")
    ap.add_argument("--prompt-tokens", type=int, default=12)
    ap.add_argument("--new-tokens", type=int, default=None, help="tokens per prompt (default 48; --quick 16)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs after one warm-up (default 2; --quick 1)")
    ap.add_argument("--temperature", type=float, default=0.8, help="the sampled rows' temperature (default 0.8)")
    ap.add_argument("--seed-table", action="store_true",
                    help="the seed's table instead: uncached greedy, LM drafters, an MTP head trained in the run")
    ap.add_argument("--mtp-base", default="StoryLM-5M", help="--seed-table: base of the MTP head it trains")
    ap.add_argument("--mtp-steps", type=int, default=None, help="--seed-table: steps of that head (default 300)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads(N) before timing (default: torch's choice); the count is printed. "
                         "On a shared machine, 1 thread avoids oversubscription")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="also write the drafter table (markdown, with the command) here")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 2 prompts, 16 tokens, k in {1, 4}, 1 repeat (options you give still win)")
    args = ap.parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        ap.error(f"--ks {args.ks}: give comma-separated draft lengths, e.g. 1,2,4,8")
    for flag, value in (("--ks", min(ks)), ("--prompts", args.prompts), ("--prompt-tokens", args.prompt_tokens),
                        ("--new-tokens", args.new_tokens), ("--repeats", args.repeats)):
        if value < 1:
            ap.error(f"{flag} {value}: use 1 or more")
    if args.mtp_steps < 0:
        ap.error(f"--mtp-steps {args.mtp_steps}: use 0 (no MTP row) or more")
    if args.threads is not None and args.threads < 1:
        ap.error(f"--threads {args.threads}: use 1 or more")
    if not args.temperature > 0:
        ap.error(f"--temperature {args.temperature}: the sampled rows need a temperature > 0")
    if args.drafters is None:
        args.drafters = "StoryLM-1M,StoryLM-5M" if args.seed_table else DEFAULT_DRAFTERS
    try:
        args.target = canonical_name(args.target)
        names = [canonical_name(d.strip()) for d in args.drafters.split(",") if d.strip()]
    except ValueError as err:
        ap.error(str(err))
    if args.target not in model_names():
        ap.error(f"--target {args.target}: use a ladder model ({', '.join(model_names())})")
    if not names:
        ap.error("--drafters: name at least one drafter")
    args.drafters = ",".join(names)
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


class _Timed:
    """Wraps a drafter: sums the seconds of its ``propose`` and ``commit`` and the tokens drafted."""

    def __init__(self, drafter) -> None:
        self.inner, self.seconds, self.drafted = drafter, 0.0, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start(self, *a, **kw):
        return self.inner.start(*a, **kw)

    def propose(self, context_ids, k):
        t0 = time.perf_counter()
        out = self.inner.propose(context_ids, k)
        self.seconds += time.perf_counter() - t0
        self.drafted += len(out[0])
        return out

    def commit(self, *a, **kw):
        t0 = time.perf_counter()
        out = self.inner.commit(*a, **kw)
        self.seconds += time.perf_counter() - t0
        return out


def markdown_table(header, rows) -> str:
    """A markdown table: the header, the separator, one line per row."""
    return "\n".join(["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
                     + ["| " + " | ".join(row) + " |" for row in rows])


def make_drafter(name: str, models: dict, sample: bool):
    model, kind = models[name], DRAFTERS.get(name, {}).get("kind", "lm")
    if kind == "eagle":
        return EagleDrafter(model, sample=sample)
    if kind == "mtp":
        return CachedMTPDrafter(model, sample=sample)
    return LMDrafter(model, sample=sample, use_cache=True)


def per_position(rounds: list[tuple[int, int]], k: int) -> str:
    """'a1/a2/.../ak': of the rounds that drafted >= i tokens, the fraction whose i-th was accepted."""
    out = []
    for i in range(1, k + 1):
        tried = [a for d, a in rounds if d >= i]
        out.append(f"{sum(a >= i for a in tried) / len(tried):.2f}" if tried else "-")
    return "/".join(out)


def drafter_table(args, argv: list[str] | None = None) -> int:
    """Every drafter x k x {greedy, sampled} with the KV cache, against cached plain decoding."""
    ks = [int(k) for k in args.ks.split(",")]
    names = [d for d in args.drafters.split(",") if d]
    try:
        target, tokenizer = load_model(args.target, device=args.device)
        models = {name: load_model(name, device=args.device)[0] for name in names}
        prompts = validation_prompts(tokenizer, args.prompts, args.prompt_tokens)
    except (ArtifactError, FileNotFoundError, ValueError) as err:
        raise SystemExit(f"bench/specdec.py: {err}") from err
    device, eos = target.device, tokenizer.eot_id
    print(f"# bench/specdec.py: {len(prompts)} val prompts x {args.new_tokens} new tokens, device {device}, "
          f"{torch.get_num_threads()} threads, median of {args.repeats} after 1 warm-up, sampled rows at "
          f"T={args.temperature}", flush=True)
    modes = [("greedy", 0.0), (f"T={args.temperature:g}", args.temperature)]
    baselines = {}

    def plain(base, base_name, temperature):
        key = (id(base), temperature)
        if key not in baselines:
            def run():
                return [cached_generate(base, p, args.new_tokens, temperature=temperature, eos_id=eos,
                                        generator=torch.Generator().manual_seed(args.seed + i))
                        for i, p in enumerate(prompts)]
            timing = time_call(run, device=device, warmup=1, repeats=args.repeats)
            outs = timing.result
            tokens = sum(len(o) - len(p) for o, p in zip(outs, prompts))
            baselines[key] = (timing.median_s, outs, tokens)
            print(f"  plain cached {base_name}, T={temperature:g}: {tokens / timing.median_s:.1f} tok/s", flush=True)
        return baselines[key]

    rows = []
    for name in names:
        kind = DRAFTERS.get(name, {}).get("kind", "lm")
        base_name = DRAFTERS[name]["base"] if kind in ("mtp", "eagle") else args.target
        base = models[name].base if kind in ("mtp", "eagle") else target
        if base_name != args.target:
            print(f"  note: {name} drafts from {base_name}'s states: its rows use {base_name} as the target",
                  flush=True)
        for mode, temperature in modes:
            plain_s, reference, plain_tokens = plain(base, base_name, temperature)
            for k in ([1] if kind == "mtp" else ks):
                rounds, wrapped = [], []

                def run():
                    rounds.clear()
                    wrapped.clear()
                    outs, stats = [], []
                    for i, p in enumerate(prompts):
                        d = _Timed(make_drafter(name, models, sample=temperature > 0))
                        wrapped.append(d)
                        out, s = speculative_sample(
                            base, d, p, args.new_tokens, k=k, temperature=temperature, eos_id=eos,
                            generator=torch.Generator().manual_seed(args.seed + i), use_cache=True,
                            on_round=lambda r: rounds.append((len(r.draft), r.accepted)))
                        outs.append(out)
                        stats.append(s)
                    return outs, stats

                timing = time_call(run, device=device, warmup=1, repeats=args.repeats)
                outs, stats_list = timing.result
                total = sum(stats_list, SpecStats())
                spec_tps = total.generated / timing.median_s
                plain_tps = plain_tokens / plain_s
                draft_s = sum(d.seconds for d in wrapped)
                drafted = sum(d.drafted for d in wrapped)
                c = (draft_s / drafted) / (plain_s / plain_tokens) if drafted else float("nan")
                lossless = (f"{sum(o.tolist() == r.tolist() for o, r in zip(outs, reference))}/{len(outs)}"
                            if temperature == 0 else "-")
                rows.append((name, base_name, mode, str(k), lossless, f"{total.acceptance_rate:.3f}",
                             per_position(rounds, k), f"{total.tokens_per_pass:.2f}", f"{c:.3f}",
                             f"{plain_tps:.1f}", f"{spec_tps:.1f}", f"{spec_tps / plain_tps:.2f}x"))
                print("  " + " | ".join(rows[-1]), flush=True)
    table = markdown_table(DRAFTER_HEADER, rows)
    note = (f"(device {device}, {torch.get_num_threads()} torch threads, {len(prompts)} validation prompts of "
            f"{args.prompt_tokens} tokens, {args.new_tokens} new tokens each, median of {args.repeats} after 1 "
            f"warm-up; plain = cached_generate of the row's target; sampled rows at T={args.temperature:g})")
    print("\n" + table + "\n\n" + note)
    if args.out:
        command = "python bench/specdec.py " + " ".join(sys.argv[1:] if argv is None else argv)
        from pathlib import Path

        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(f"Measured with `{command.strip()}`.\n\n{table}\n\n{note}\n")
        print(f"wrote {args.out}")
    return 0


def seed_table(args) -> int:
    """The seed's table: uncached greedy speculative decoding with LM drafters + MTP on the 5M."""
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
    print("\n" + markdown_table(HEADER, rows))
    print(f"\n(device {device}, {torch.get_num_threads()} torch threads, median of {args.repeats} after 1 warm-up)")
    return 0



def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    return seed_table(args) if args.seed_table else drafter_table(args, argv)


if __name__ == "__main__":
    sys.exit(main())
