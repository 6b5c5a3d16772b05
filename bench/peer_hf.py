#!/usr/bin/env python3
"""g2c's KV-cached decoding against transformers, same weights, same process.

    python bench/peer_hf.py --quick              # a smoke run (a few minutes on 1 thread)
    python bench/peer_hf.py                      # 8 prompts x 64 new tokens, median of 3
    python bench/peer_hf.py --dtypes float32     # one dtype only

Exports the StoryLM ladder to ``transformers.GPT2LMHeadModel`` with ``to_hf_gpt2`` and times,
for each dtype (float32, bfloat16), with greedy decoding and no end-of-sequence stop:

- g2c plain, uncached (module 11 ``generate``) and KV-cached (module 16 ``cached_generate``);
- g2c speculative, uncached (specdec) and cached (``speculative_generate_cached``) with the
  1M and 5M drafters, k in {1, 2, 4}; MTP self-speculation with the cache
  (``mtp_generate_cached``; the head is trained here for ``--mtp-steps`` on frozen StoryLM-5M,
  needs ``./datasets.sh``; its row compares with plain cached 5M);
- transformers greedy with its cache, assisted generation with the same drafters (its default
  dynamic draft length), and prompt-lookup decoding.

Every row's output is checked against g2c plain cached greedy at the same dtype ("same" column:
identical outputs / prompts). Columns: tok/s, tokens per target pass (g2c: verification passes
from ``SpecStats``; transformers: target forward calls counted by a hook, the first one is the
prefill), speed-up over g2c plain cached at the same dtype. Plain rows also print the
weight-read floor: the target's weight bytes / the memory read bandwidth measured here (a
large matrix-vector product, the decode step's own kernel), i.e. the fastest a memory-bound
one-token step can be.

Then a profile of one speculative round (1M drafter, k = 4, 30M target): drafter steps, the
target's verification pass, verify + rollback, and the rest (Python) against the measured
per-round time.

Timing (CONVENTIONS §7): warm-up run, median of ``--repeats``, device synchronised around every
clock read; ``--threads`` (default 1) threads. Needs the ``bench`` extra (transformers).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets import ArtifactError, load_model
from g2c.assets.cli import choice_list, count, int_list, model_list, model_name
from g2c.assets.data import load_token_stream
from g2c.kvcache import KVCache, cached_forward, cached_generate
from g2c.nn import time_call
from g2c.sampling import generate
from g2c.specdec import greedy_verify, speculative_generate
from g2c.specdec.mtp import train_mtp_head
from g2c.specdec.sampling import mtp_generate_cached, speculative_generate_cached
from g2c.transformer.export import to_hf_gpt2

PROMPTS = [
    "Once upon a time",
    "One day, a little girl named Lily went to the park.",
    "Tom had a red ball. He liked to",
    "The sun was hot and the birds were singing.",
    "There was a big dog who lived in a small house.",
    "Sara and her mom went to the store to buy",
    "The little bunny was scared of the dark. Every night",
    "Ben found a shiny key under the tree.",
]


def timed(fn, repeats: int, device) -> tuple[float, object]:
    """Warm up once, then the median seconds of ``repeats`` runs (``g2c.nn.time_call``)."""
    t = time_call(fn, device=device, warmup=1, repeats=repeats)
    return t.median_s, t.result


def read_bandwidth(repeats: int = 5) -> float:
    """Bytes/s a matrix-vector product reads: W (4096, 8192) float32 (128 MiB) @ v."""
    w = torch.randn(4096, 8192)
    v = torch.randn(8192)
    best = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        w @ v
        best.append(time.perf_counter() - t0)
    return w.numel() * w.element_size() / statistics.median(best[1:])


def weight_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters())


class PassCounter:
    """Counts forward calls of a transformers model (target passes)."""

    def __init__(self, model) -> None:
        self.n = 0
        model.register_forward_hook(lambda *_: setattr(self, "n", self.n + 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=model_name(ladder_only=True), default="StoryLM-30M")
    ap.add_argument("--drafters", type=model_list(ladder_only=True), default="StoryLM-1M,StoryLM-5M")
    ap.add_argument("--ks", type=int_list(1), default="1,2,4")
    ap.add_argument("--dtypes", type=choice_list("float32", "bfloat16", "float16"), default="float32,bfloat16")
    ap.add_argument("--prompts", type=count(1), default=8)
    ap.add_argument("--new-tokens", type=count(1), default=64)
    ap.add_argument("--repeats", type=count(1), default=3)
    ap.add_argument("--threads", type=count(1), default=1)
    ap.add_argument("--mtp-steps", type=count(0), default=300, help="MTP head training steps on StoryLM-5M (0 = skip)")
    ap.add_argument("--no-uncached", action="store_true", help="skip the uncached g2c rows")
    ap.add_argument("--quick", action="store_true", help="4 prompts x 32 tokens, 1 repeat, 60 MTP steps")
    if "--quick" in (sys.argv[1:] if argv is None else argv):   # quick defaults; explicit flags still win
        ap.set_defaults(prompts=4, new_tokens=32, repeats=1, mtp_steps=60)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    try:
        import transformers
    except ImportError as err:
        raise SystemExit("bench/peer_hf.py needs transformers: pip install -e '.[bench]'") from err
    transformers.logging.set_verbosity_error()
    ks = [int(k) for k in args.ks.split(",")]
    drafter_names = [d for d in args.drafters.split(",") if d]
    N = args.new_tokens
    bw = read_bandwidth()
    print(f"# bench/peer_hf.py: {args.prompts} prompts x {N} new tokens (greedy, no EOS stop), "
          f"{torch.get_num_threads()} thread(s), median of {args.repeats}, transformers {transformers.__version__}, "
          f"torch {torch.__version__}; measured read bandwidth {bw / 1e9:.1f} GB/s", flush=True)

    head = None
    if args.mtp_steps > 0:
        try:
            base32, _ = load_model("StoryLM-5M", device="cpu")
            print(f"training an MTPHead on frozen StoryLM-5M for {args.mtp_steps} steps ...", flush=True)
            head, _ = train_mtp_head(base32, load_token_stream("train"), steps=args.mtp_steps, batch_size=8,
                                     seq_len=128, lr=1e-3, generator=torch.Generator().manual_seed(0))
        except (ArtifactError, FileNotFoundError, SystemExit) as err:
            print(f"skipping MTP: {err}", flush=True)

    tables, round_times = {}, {}
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        try:
            target, tok = load_model(args.target, device="cpu", dtype=dtype)
            drafters = {n: load_model(n, device="cpu", dtype=dtype)[0] for n in drafter_names}
        except ArtifactError as err:
            raise SystemExit(f"bench/peer_hf.py: {err}") from err
        prompts = [tok.encode(p) for p in PROMPTS[:args.prompts]]
        hf_target = to_hf_gpt2(load_model(args.target, device="cpu")[0]).to(dtype)
        hf_drafters = {n: to_hf_gpt2(load_model(n, device="cpu")[0]).to(dtype) for n in drafter_names}
        counter = PassCounter(hf_target)
        total = N * len(prompts)
        floor_tps = bw / weight_bytes(target)
        rows = []
        print(f"\n## {dtype_name}: {args.target} weights {weight_bytes(target) / 1e6:.0f} MB, "
              f"weight-read floor {1e3 / floor_tps:.1f} ms/token = {floor_tps:.0f} tok/s", flush=True)

        def run(name, fn, passes_of=None, hf=False, base_ref=None):
            counter.n = 0
            seconds, result = timed(fn, args.repeats, "cpu")
            outs = [r[0] if isinstance(r, tuple) else r for r in result]
            outs = [o[-N:].tolist() for o in outs]
            ref = base_ref if base_ref is not None else reference
            same = sum(o == r for o, r in zip(outs, ref)) if ref is not None else len(outs)
            if hf:
                passes = counter.n / (args.repeats + 1)
            elif passes_of is not None:
                passes = sum(passes_of(r) for r in result)
            else:
                passes = total
            tps = total / seconds
            if name == f"g2c speculative, KV cache, {drafter_names[0]} k=4":
                round_times[dtype_name] = seconds / passes
            rows.append([name, f"{tps:.1f}", f"{total / passes:.2f}" if passes else "-", f"{same}/{len(outs)}", tps])
            print(f"  {name:<44} {tps:7.1f} tok/s  tokens/pass {rows[-1][2]:>5}  same {same}/{len(outs)}", flush=True)
            return seconds, result

        reference = None
        _, res = run("g2c plain, KV cache", lambda: [cached_generate(target, p, N, temperature=0.0) for p in prompts])
        reference = [o[-N:].tolist() for o in res]
        plain_tps = rows[-1][4]
        rows[-1][0] += f" (floor {floor_tps:.0f} tok/s)"
        if not args.no_uncached:
            run("g2c plain, no cache", lambda: [generate(target, p, N, temperature=0.0) for p in prompts])
            run(f"g2c speculative, no cache, {drafter_names[0]} k=4",
                lambda: [speculative_generate(target, drafters[drafter_names[0]], p, N, k=4) for p in prompts],
                passes_of=lambda r: r[1].target_passes)
        for name in drafter_names:
            for k in ks:
                run(f"g2c speculative, KV cache, {name} k={k}",
                    lambda: [speculative_generate_cached(target, drafters[name], p, N, k=k) for p in prompts],
                    passes_of=lambda r: r[1].target_passes)
        run("transformers greedy, KV cache",
            lambda: [hf_target.generate(torch.tensor([p]), max_new_tokens=N, min_new_tokens=N, do_sample=False,
                                        eos_token_id=None, pad_token_id=0)[0] for p in prompts], hf=True)
        for name in drafter_names:
            run(f"transformers assisted, {name}",
                lambda: [hf_target.generate(torch.tensor([p]), assistant_model=hf_drafters[name], max_new_tokens=N,
                                            min_new_tokens=N, do_sample=False, eos_token_id=None,
                                            pad_token_id=0)[0] for p in prompts], hf=True)
        run("transformers prompt lookup (10 tokens)",
            lambda: [hf_target.generate(torch.tensor([p]), prompt_lookup_num_tokens=10, max_new_tokens=N,
                                        min_new_tokens=N, do_sample=False, eos_token_id=None,
                                        pad_token_id=0)[0] for p in prompts], hf=True)
        if head is not None:
            base = drafters.get("StoryLM-5M") or load_model("StoryLM-5M", device="cpu", dtype=dtype)[0]
            head.to(dtype=dtype)
            _, base_res = run("g2c plain, KV cache, StoryLM-5M (MTP base)",
                              lambda: [cached_generate(base, p, N, temperature=0.0) for p in prompts],
                              base_ref=[None] * len(prompts))
            base_ref = [o[-N:].tolist() for o in base_res]
            rows[-1][3] = "ref"
            run(f"g2c MTP self-spec, KV cache, 5M + head ({args.mtp_steps} steps)",
                lambda: [mtp_generate_cached(base, head, p, N) for p in prompts],
                passes_of=lambda r: r[1].target_passes, base_ref=base_ref)
        for r in rows:
            r.append(f"{r[4] / plain_tps:.2f}x")
        tables[dtype_name] = rows

        # A profile of one speculative round at this dtype: first drafter, k = 4.
        profile_round(target, drafters[drafter_names[0]], prompts[0], k=4, repeats=max(5, args.repeats),
                      measured_round_s=round_times.get(dtype_name))

    print()
    for dtype_name, rows in tables.items():
        print(f"\n{dtype_name}, {torch.get_num_threads()} thread(s):\n")
        print("| run | tok/s | tokens/target pass | same output | speed-up vs g2c plain cached |")
        print("|---|---|---|---|---|")
        for name, tps, tpp, same, _, speed in rows:
            print(f"| {name} | {tps} | {tpp} | {same} | {speed} |")
    return 0


@torch.no_grad()
def profile_round(target, drafter, prompt, *, k: int, repeats: int, measured_round_s: float | None) -> None:
    """Time the parts of one round at a context of prompt + 32 tokens: the drafter's k one-row
    steps, the target's (k+1)-row verification pass, verify + both rollbacks."""
    ctx = cached_generate(target, prompt, 32, temperature=0.0).tolist()
    tc, dc = KVCache.for_model(target), KVCache.for_model(drafter)
    cached_forward(target, torch.tensor([ctx[:-1]]), tc)
    cached_forward(drafter, torch.tensor([ctx[:-1]]), dc)
    n = tc.length

    def draft():
        dc.crop(n)
        tokens, nxt = [], ctx[-1]
        for _ in range(k):
            nxt = int(cached_forward(drafter, torch.tensor([[nxt]]), dc)[0, -1].argmax())
            tokens.append(nxt)
        return tokens

    draft_s, tokens = timed(draft, repeats, "cpu")

    def verify_pass():
        tc.crop(n)
        return cached_forward(target, torch.tensor([[ctx[-1]] + tokens]), tc)[0]

    target_s, logits = timed(verify_pass, repeats, "cpu")

    def verify_rollback():
        out = greedy_verify(torch.tensor(tokens), logits.float())
        tc.crop(n)
        dc.crop(n)
        return out

    verify_s, _ = timed(verify_rollback, repeats, "cpu")

    def one_row():
        tc.crop(n)
        return cached_forward(target, torch.tensor([[ctx[-1]]]), tc)

    one_s, _ = timed(one_row, repeats, "cpu")

    parts = draft_s + target_s + verify_s
    rest = f"{(measured_round_s - parts) * 1e3:.1f} ms" if measured_round_s else "n/a"
    print(f"  profile of one round (k={k}, context {n + 1}, {target.token_embed.weight.dtype}): "
          f"drafter {k} steps {draft_s * 1e3:.1f} ms, target verify pass ({k + 1} rows) {target_s * 1e3:.1f} ms "
          f"[one-row step {one_s * 1e3:.1f} ms], verify + rollback {verify_s * 1e3:.2f} ms; "
          f"sum {parts * 1e3:.1f} ms; measured per round in the run "
          f"{measured_round_s * 1e3 if measured_round_s else float('nan'):.1f} ms, rest (Python, sampling "
          f"bookkeeping, prefill share) {rest}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
