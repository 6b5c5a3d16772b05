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
* StoryLM-30M-MTP: ``MTPDrafter`` (one draft per pass, so k = 1 only);
* StoryLM-5M-MTP drafting for its own base, StoryLM-5M (its baseline is the 5M alone).

Columns: lossless (greedy: prompts whose output equals plain greedy decoding, token for
token; sampled: "-"), acceptance rate (accepted / drafted), per-position acceptance (the
fraction of rounds that drafted >= i tokens whose i-th draft was accepted, i = 1..k), tau
(tokens per target pass), c/round (the drafter's seconds per round, its ``propose`` and
``commit`` together, over the target's seconds per token when it decodes alone), verify v
(the target's verification pass, timed on its own, in the same one-row steps: 1.0 would make
verification free), the law tau / (1 + c) (``g2c.specdec.theory.speedup_per_round``) and the
same law with the measured verify cost, tau / (v + c) (``speedup_per_round(tau / v, c / v)``;
what it misses of the measured speed-up is the loop's own Python), then plain and
speculative tok/s and the measured speed-up, in wall time and in this process's CPU time (c
and v are CPU seconds on a CPU: robust when other jobs share the cores). Every speed-up is
over plain CACHED decoding (``cached_generate``) of the row's target on the teaching path,
same dtype (float32, or ``--dtype bfloat16`` for every model, the baseline included) and threads.
In bfloat16 the fast path's products round differently from the teaching path's: it is its own
model, and its greedy rows are judged lossless against plain decoding on the same fast model
(the teaching-vs-fast agreement is printed with the plain rows). ``--fast`` adds the fast path
(``g2c.kvcache.fast``): plain cached decoding on it and every drafter row, greedy and sampled
(LMs, the EAGLE and MTP heads), with a fast target and drafter (rows marked "(fast)"; a sampled
fast row draws with the same seed as its teaching row, so its speed-up compares the same run on
the two paths).

Timing (CONVENTIONS §7): every row, the plain baselines included, is timed interleaved with
the others: one warm-up call per row, then ``--repeats`` rounds of one call per row, the
median per row, the device synchronised before every clock read. Threads: torch's default
unless ``--threads``; the count is printed. Reference solutions are applied
(``import g2c.course.solved``), so the numbers measure the answer key.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets.artifacts import DRAFTERS, ArtifactError, canonical_name, load_model, model_names
from g2c.assets.cli import COUNT_MAX, draft_room_problem, output_file, seed
from g2c.assets.data import load_token_stream, validation_prompts
from g2c.kvcache import cached_generate
from g2c.kvcache import forward_rows as _forward_rows
from g2c.kvcache.fast import fast_model
from g2c.nn import synchronize, time_call
from g2c.sampling import generate
from g2c.specdec import SpecStats, mtp_generate, speculative_generate, train_mtp_head
from g2c.specdec.sampling.drafters import LMDrafter
from g2c.specdec.sampling.eagle import EagleDrafter, MTPDrafter
from g2c.specdec.sampling.loop import speculative_sample
from g2c.specdec.theory import speedup_per_round
from g2c.transformer.config import LADDER

HEADER = ("drafter", "target", "k", "lossless", "acceptance", "tokens/pass", "plain tok/s", "spec tok/s", "speed-up")
DRAFTER_HEADER = ("drafter", "target", "mode", "k", "lossless", "acceptance", "per-position acceptance",
                  "tau (tokens/pass)", "c/round", "verify (steps)", "law tau/(1+c)", "law tau/(v+c)", "plain tok/s",
                  "spec tok/s", "speed-up", "speed-up (CPU time)")
# The best shipped drafter first (StoryLM-1M-distilled: the highest tokens per pass at StoryLM-1M's cost).
DEFAULT_DRAFTERS = "StoryLM-1M-distilled,StoryLM-1M,StoryLM-5M,StoryLM-30M-EAGLE,StoryLM-30M-MTP,StoryLM-5M-MTP"


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
    ap.add_argument("--mtp-base", default=None,
                    help="--seed-table: base of the MTP head it trains (default StoryLM-5M)")
    ap.add_argument("--mtp-steps", type=int, default=None, help="--seed-table: steps of that head (default 300)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch.set_num_threads(N) before timing (default: torch's choice); the count is printed. "
                         "On a shared machine, 1 thread avoids oversubscription")
    ap.add_argument("--seed", type=seed(), default=0)
    ap.add_argument("--fast", action="store_true",
                    help="add the fast path (g2c.kvcache.fast, float32): plain cached decoding and every drafter "
                         "row, greedy and sampled (LMs and heads), with fast target and drafter")
    ap.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32",
                    help="the drafter table's dtype: every model (target, drafters, heads) loaded in it, the baseline "
                         "plain cached decoding in it too; bfloat16 is its own model, lossless against itself "
                         "(default float32)")
    ap.add_argument("--out", type=output_file(), default=None,
                    help="also write the drafter table (markdown, with the command) here")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: 2 prompts, 16 tokens, k in {1, 4}, 1 repeat (options you give still win)")
    args = ap.parse_args(argv)
    given = [flag for flag, value in (("--mtp-base", args.mtp_base), ("--mtp-steps", args.mtp_steps))
             if value is not None]
    if given and not args.seed_table:       # the drafter table has no head trained in the run: say so, do not ignore it
        ap.error(f"{' and '.join(given)} {'go' if len(given) > 1 else 'goes'} with --seed-table (the drafter table "
                 "uses the shipped heads, e.g. --drafters StoryLM-30M-MTP)")
    args.mtp_base = args.mtp_base or "StoryLM-5M"
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    try:
        ks = [int(k) for k in args.ks.split(",")]
    except ValueError:
        ap.error(f"--ks {args.ks}: give comma-separated draft lengths, e.g. 1,2,4,8")
    for flag, value in (("--ks", min(ks)), ("--prompts", args.prompts), ("--prompt-tokens", args.prompt_tokens),
                        ("--new-tokens", args.new_tokens), ("--repeats", args.repeats), ("--threads", args.threads)):
        if value is not None and value < 1:
            ap.error(f"{flag} {value}: use 1 or more")
    if args.mtp_steps < 0:
        ap.error(f"--mtp-steps {args.mtp_steps}: use 0 (no MTP row) or more")
    for flag, value in (("--prompts", args.prompts), ("--prompt-tokens", args.prompt_tokens),
                        ("--new-tokens", args.new_tokens), ("--repeats", args.repeats), ("--threads", args.threads),
                        ("--mtp-steps", args.mtp_steps)):
        if value is not None and value > COUNT_MAX:   # torch's sizes and thread counts are C ints
            ap.error(f"{flag} {value}: use at most {COUNT_MAX:,} (2**31 - 1)")
    if not args.temperature > 0:
        ap.error(f"--temperature {args.temperature}: the sampled rows need a temperature > 0")
    if args.dtype != "float32" and args.seed_table:
        ap.error("--dtype goes with the drafter table (the seed's table is float32)")
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
    if tail := draft_room_problem(max(ks), LADDER[args.target].max_seq_len, whose=f"{args.target}'s"):
        ap.error(f"--ks {max(ks)}: {tail}; lower it")
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
    """Wraps a drafter: sums the seconds of its ``propose`` and ``commit`` and the tokens drafted
    (``clock``: ``time.perf_counter``, or ``time.process_time`` for CPU seconds)."""

    def __init__(self, drafter, clock=time.perf_counter) -> None:
        self.inner, self.seconds, self.drafted, self.clock = drafter, 0.0, 0, clock

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def start(self, *a, **kw):
        return self.inner.start(*a, **kw)

    def propose(self, context_ids, k):
        t0 = self.clock()
        out = self.inner.propose(context_ids, k)
        self.seconds += self.clock() - t0
        self.drafted += out.numel()
        return out

    def commit(self, *a, **kw):
        t0 = self.clock()
        out = self.inner.commit(*a, **kw)
        self.seconds += self.clock() - t0
        return out


class _TimedTarget:
    """Wraps a target model: records (rows, seconds) of every cached pass it runs.

    Every cached pass goes through module 16's trunk ``forward_rows(model, ids, cache, ...)``,
    which hands the pass to a model's own ``forward_rows`` when it has one: this wrapper has one,
    times the real pass (the wrapped model's, teaching or fast) and forwards everything else.
    """

    def __init__(self, model, clock=time.perf_counter) -> None:
        self.inner, self.clock, self.passes = model, clock, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def __call__(self, *a, **kw):
        return self.inner(*a, **kw)

    def forward_rows(self, ids, cache, **kwargs):
        t0 = self.clock()
        out = _forward_rows(self.inner, ids, cache, **kwargs)
        self.passes.append((ids.shape[1], self.clock() - t0))
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
        return MTPDrafter(model, sample=sample)
    return LMDrafter(model, sample=sample, use_cache=True)


def per_position(rounds: list[tuple[int, int]], k: int) -> str:
    """'a1/a2/.../ak': of the rounds that drafted >= i tokens, the fraction whose i-th was accepted."""
    out = []
    for i in range(1, k + 1):
        tried = [a for d, a in rounds if d >= i]
        out.append(f"{sum(a >= i for a in tried) / len(tried):.2f}" if tried else "-")
    return "/".join(out)


def _interleaved(calls: dict, device, repeats: int) -> dict:
    """Time every row interleaved (CONVENTIONS §7): one warm-up call per row, then ``repeats``
    rounds of one call per row. ``calls`` maps a key to a function returning (result, extra);
    returns {key: (median seconds, last result, [extra of every timed call], median CPU seconds)}.
    CPU seconds (``time.process_time``) count this process's work, not its waiting for a core:
    with one thread on a shared machine they are the robust measure."""
    for fn in calls.values():                                       # warm-up every row
        fn()
    seen = {key: ([], None, [], []) for key in calls}
    for _ in range(repeats):                                        # rounds of one call per row
        for key, fn in calls.items():
            synchronize(device)
            t0, c0 = time.perf_counter(), time.process_time()
            result, extra = fn()
            synchronize(device)
            times, _, extras, cpu = seen[key]
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
            extras.append(extra)
            seen[key] = (times, result, extras, cpu)
    return {key: (statistics.median(t), r, e, statistics.median(c)) for key, (t, r, e, c) in seen.items()}


def drafter_table(args, argv: list[str] | None = None) -> int:
    """Every drafter x k x {greedy, sampled} with the KV cache, against cached plain decoding.

    Every row (the plain baselines included) is timed interleaved with the others: warm-up
    every row, then ``--repeats`` rounds of one call per row, the median per row. Per
    speculative row: tau (tokens per target pass), c (the drafter's seconds per ROUND over
    the target's one-row step), v (one verification pass, timed by wrapping the target, in
    one-row steps), the law tau / (1 + c) (``speedup_per_round``: verification free) and the
    same law with the measured verify cost, tau / (v + c)
    (``speedup_per_round(tau / v, c / v)``), next to the measured speed-up. ``--fast`` adds the
    fast path (``g2c.kvcache.fast.fast_model``, float32, same logits): plain cached decoding on
    it and every drafter row, greedy and sampled (LMs and the EAGLE/MTP heads), with fast target
    and drafter; their speed-up is still over plain cached decoding on the teaching path (same
    dtype and threads)."""
    ks = [int(k) for k in args.ks.split(",")]
    names = [d for d in args.drafters.split(",") if d]
    try:
        target, tokenizer = load_model(args.target, device=args.device, dtype=args.dtype)
        models = {name: load_model(name, device=args.device, dtype=args.dtype)[0] for name in names}
        prompts = validation_prompts(tokenizer, args.prompts, args.prompt_tokens)
    except (ArtifactError, FileNotFoundError, ValueError) as err:
        raise SystemExit(f"bench/specdec.py: {err}") from err
    device, eos = target.device, tokenizer.eot_id
    print(f"# bench/specdec.py: {len(prompts)} val prompts x {args.new_tokens} new tokens, {args.dtype}, "
          f"device {device}, "
          f"{torch.get_num_threads()} threads, rows timed interleaved: 1 warm-up each, then median of "
          f"{args.repeats} rounds; sampled rows at T={args.temperature}", flush=True)
    modes = [("greedy", 0.0), (f"T={args.temperature:g}", args.temperature)]
    # c and v: CPU seconds on a CPU (robust when other jobs share the cores), wall seconds elsewhere
    on_cpu = torch.device(device).type == "cpu"
    clock = time.process_time if on_cpu else time.perf_counter
    fast = {}                                      # teaching model id -> its fast copy (FastLM, or a head's)
    if args.fast:
        fast[id(target)] = fast_model(target)
        for name in names:
            if DRAFTERS.get(name, {}).get("kind", "lm") in ("mtp", "eagle"):     # a head: its base is the target
                base = models[name].base
                fast.setdefault(id(base), fast_model(base))
            fast[id(models[name])] = fast_model(models[name])   # an LM's FastLM; a head's swapped leaves

    def plain_call(base, temperature):
        def run():
            return [cached_generate(base, p, args.new_tokens, temperature=temperature, eos_id=eos,
                                    generator=torch.Generator().manual_seed(args.seed + i))
                    for i, p in enumerate(prompts)], None
        return run

    def spec_call(base, name, k, temperature, drafter_model):
        timed_base = _TimedTarget(base, clock)

        def run():
            rounds, wrapped, outs, stats = [], [], [], []
            timed_base.passes.clear()
            for i, p in enumerate(prompts):
                own = models if drafter_model is None else {**models, name: drafter_model}
                d = _Timed(make_drafter(name, own, sample=temperature > 0), clock)
                wrapped.append(d)
                out, s = speculative_sample(
                    timed_base, d, p, args.new_tokens, k=k, temperature=temperature, eos_id=eos,
                    generator=torch.Generator().manual_seed(args.seed + i), use_cache=True,
                    on_round=lambda r: rounds.append((len(r.draft), r.accepted)))
                outs.append(out)
                stats.append(s)
            verify = [sec for rows, sec in timed_base.passes if 2 <= rows <= k + 2]   # verification passes
            return (outs, stats, rounds), (sum(d.seconds for d in wrapped), sum(verify) / max(1, len(verify)))
        return run

    calls, plans = {}, []
    for name in names:
        kind = DRAFTERS.get(name, {}).get("kind", "lm")
        base_name = DRAFTERS[name]["base"] if kind in ("mtp", "eagle") else args.target
        base = models[name].base if kind in ("mtp", "eagle") else target
        if base_name != args.target:
            print(f"  note: {name} drafts from {base_name}'s states: its rows use {base_name} as the target",
                  flush=True)
        for mode, temperature in modes:
            calls.setdefault(("plain", base_name, temperature), plain_call(base, temperature))
            if id(base) in fast:
                calls.setdefault(("plain fast", base_name, temperature), plain_call(fast[id(base)], temperature))
            for k in ([1] if kind == "mtp" else ks):
                key = ("spec", name, mode, k)
                calls[key] = spec_call(base, name, k, temperature, None)
                plans.append((key, name, base, base_name, mode, temperature, k, ""))
                if id(base) in fast and id(models[name]) in fast:
                    fkey = ("spec fast", name, mode, k)
                    calls[fkey] = spec_call(fast[id(base)], name, k, temperature, fast[id(models[name])])
                    plans.append((fkey, name, base, base_name, mode, temperature, k, " (fast)"))
    print(f"  timing {len(calls)} rows interleaved ...", flush=True)
    timed_rows = _interleaved(calls, device, args.repeats)

    rows = []
    for (_, base_name, temperature), (plain_s, outs, _, _) in [(k, v) for k, v in timed_rows.items()
                                                                if k[0] == "plain"]:
        tokens = sum(len(o) - len(p) for o, p in zip(outs, prompts))
        print(f"  plain cached {base_name}, T={temperature:g}: {tokens / plain_s:.1f} tok/s", flush=True)
        fkey = ("plain fast", base_name, temperature)
        if fkey in timed_rows:
            fast_s, fast_outs, _, fast_cpu = timed_rows[fkey]
            plain_cpu = timed_rows[("plain", base_name, temperature)][3]
            same = sum(a.tolist() == b.tolist() for a, b in zip(fast_outs, outs))
            print(f"  plain cached {base_name}, fast path, T={temperature:g}: {tokens / fast_s:.1f} tok/s "
                  f"({plain_s / fast_s:.2f}x the teaching path, {plain_cpu / fast_cpu:.2f}x in CPU time; outputs "
                  f"equal {same}/{len(outs)})", flush=True)
    for key, name, base, base_name, mode, temperature, k, tag in plans:
        plain_s, reference, _, plain_cpu = timed_rows[("plain", base_name, temperature)]
        plain_tokens = sum(len(o) - len(p) for o, p in zip(reference, prompts))
        spec_s, (outs, stats_list, rounds), draft_seconds, spec_cpu = timed_rows[key]
        total = sum(stats_list, SpecStats())
        num_rounds = max(1, total.target_passes)
        step_s = plain_cpu / plain_tokens if on_cpu else plain_s / plain_tokens   # one plain cached step
        draft_s = statistics.median(d for d, _ in draft_seconds)
        c = draft_s / num_rounds / step_s                            # drafter cost per round, in target steps
        v = statistics.median(t for _, t in draft_seconds) / step_s  # one verification pass, in target steps
        tau = total.tokens_per_pass
        law = speedup_per_round(tau, c)
        law_v = speedup_per_round(tau / v, c / v) if v > 0 else float("nan")
        spec_tps, plain_tps = total.generated / spec_s, plain_tokens / plain_s
        if tag and args.dtype != "float32":      # a half-precision fast path is its own model: judge it by itself
            reference = timed_rows[("plain fast", base_name, temperature)][1]
        lossless = (f"{sum(o.tolist() == r.tolist() for o, r in zip(outs, reference))}/{len(outs)}"
                    if temperature == 0 else "-")
        rows.append((name + tag, base_name, mode, str(k), lossless, f"{total.acceptance_rate:.3f}",
                     per_position(rounds, k), f"{tau:.2f}", f"{c:.2f}", f"{v:.2f}", f"{law:.2f}x",
                     f"{law_v:.2f}x", f"{plain_tps:.1f}", f"{spec_tps:.1f}", f"{spec_tps / plain_tps:.2f}x",
                     f"{plain_cpu / spec_cpu:.2f}x"))
        print("  " + " | ".join(rows[-1]), flush=True)
    table = markdown_table(DRAFTER_HEADER, rows)
    note = (f"({args.dtype}, device {device}, {torch.get_num_threads()} torch threads, {len(prompts)} validation "
            f"prompts of "
            f"{args.prompt_tokens} tokens, {args.new_tokens} new tokens each; every row timed interleaved: 1 "
            f"warm-up, then the median of {args.repeats} rounds; plain = cached_generate of the row's target on "
            f"the teaching path; c = drafter seconds per round / plain step, v = one verification pass / "
            f"plain step ({'CPU' if on_cpu else 'wall'} seconds), law = tau/(1+c), law(v) = tau/(v+c); "
            f"speed-up (CPU time) = plain CPU seconds / speculative CPU seconds; sampled rows at "
            f"T={args.temperature:g})")
    print("\n" + table + "\n\n" + note)
    if args.out:
        command = "python bench/specdec.py " + " ".join(sys.argv[1:] if argv is None else argv)

        from g2c.course.files import write_text_atomic

        write_text_atomic(args.out, f"Measured with `{command.strip()}`.\n\n{table}\n\n{note}\n")
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
    except (ArtifactError, FileNotFoundError, ValueError) as err:
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
