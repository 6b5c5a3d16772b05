#!/usr/bin/env python3
"""State costs of speculative decoding: snapshot vs checkpoint + input replay vs recompute.

    python bench/specdec_state.py --quick    # the lesson's table (seconds, 1 thread)
    python bench/specdec_state.py            # longer runs, more drafters

Targets are untrained ``RecurrentLM``s (``fan_in_init_``, fixed seeds): the recurrent model
at two head counts (same width, so the same input log per token but a 4x larger state per
layer with fewer heads), a hybrid (recurrent + attention layers) and an attention-only
model, whose K/V rows roll back by pointer: the reference every strategy is compared with.
Drafters are same-family twins (``perturbed_twin``: the target's weights plus relative
noise sigma), so acceptance is swept without training; losslessness and the counted
costs do not depend on training, acceptance does.

For every (target, drafter, strategy) it runs plain greedy decoding and speculative
decoding from the same prompts, checks the tokens are identical and the committed state
matches plain decoding after the last round (1e-5), and prints one markdown table of the
costs counted by the transaction on those runs, per speculative round: accepted drafts,
emitted tokens, target passes, state bytes copied, input bytes logged, K/V bytes written,
state-update FLOPs and readout FLOPs. Counts, not timings: they are exact and do not depend
on the machine. Threads: 1 (``torch.set_num_threads``).
"""

from __future__ import annotations

import argparse

import torch

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets.cli import count
from g2c.recurrent import (
    RecurrentLM,
    fan_in_init_,
    greedy_drafter,
    perturbed_twin,
    plain_greedy,
    speculative_generate_stateful,
)

STRATEGIES = ("snapshot", "replay", "recompute")


def build_target(layout: str, *, vocab: int, dim: int, heads: int, max_seq_len: int, seed: int) -> RecurrentLM:
    m = RecurrentLM(vocab, dim, len(layout), heads, layout=layout, max_seq_len=max_seq_len)
    return fan_in_init_(m, generator=torch.Generator().manual_seed(seed)).eval()


def run_case(target: RecurrentLM, drafter: RecurrentLM, prompts: list[list[int]], num_new: int, k: int,
             strategy: str, capacity: int) -> dict:
    totals = dict(rounds=0, accepted=0, generated=0, model_passes=0, bytes_copied=0, bytes_logged=0,
                  kv_bytes_written=0, update_flops=0, readout_flops=0, folds=0)
    lossless = 0
    for prompt in prompts:
        final = {}

        def on_token(state, ids, final=final):
            final[len(ids)] = {i: s.clone() for i, s in state.states.items()}

        ref = plain_greedy(target, prompt, num_new, on_token=on_token)
        kw = {"capacity": capacity} if strategy == "replay" else {}
        ids, stats, txn = speculative_generate_stateful(target, greedy_drafter(drafter), prompt, num_new, k=k,
                                                        strategy=strategy, **kw)
        same_state = all(torch.allclose(s, final[len(ids)][i], atol=1e-5, rtol=1e-5)
                         for i, s in txn.committed_state().items())
        lossless += int(ids.tolist() == ref.tolist() and same_state)
        totals["accepted"] += stats.accepted
        totals["generated"] += stats.generated
        for name in ("rounds", "model_passes", "bytes_copied", "bytes_logged", "kv_bytes_written",
                     "update_flops", "readout_flops", "folds"):
            totals[name] += getattr(txn.costs, name)
    totals["lossless"] = f"{lossless}/{len(prompts)}"
    return totals


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="the lesson's table: 2 prompts, 48 new tokens")
    ap.add_argument("-k", type=count(1), default=4, help="draft length (default 4)")
    ap.add_argument("--capacity", type=count(1), default=16, help="replay buffer positions (default 16)")
    ap.add_argument("--threads", type=count(1), default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    num_prompts, num_new = (2, 48) if args.quick else (8, 160)
    sigmas = (0.0, 0.03, 0.1, 1.0) if args.quick else (0.0, 0.01, 0.03, 0.1, 0.3, 1.0)
    vocab, dim, layers = 256, 64, 4
    targets = [("recurrent", "RRRR", 8), ("recurrent", "RRRR", 2), ("hybrid", "RARA", 8), ("attention", "AAAA", 8)]
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, vocab, (8,), generator=g).tolist() for _ in range(num_prompts)]

    print(f"bench/specdec_state.py{' --quick' if args.quick else ''}: V={vocab} D={dim} L={layers}, "
          f"k={args.k}, replay capacity {args.capacity}, {num_prompts} prompts x {num_new} new tokens, "
          f"torch threads {torch.get_num_threads()}; costs per speculative round\n")
    print("| target | heads (state/layer) | drafter sigma | strategy | lossless | accepted | emitted "
          "| passes | state bytes copied | input bytes logged | K/V bytes written | state-update FLOPs "
          "| readout FLOPs | folds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind, layout, heads in targets:
        target = build_target(layout, vocab=vocab, dim=dim, heads=heads, max_seq_len=num_new + 16, seed=1)
        d = dim // heads
        state_desc = f"H={heads} ({heads * d * d * 4} B)" if "R" in layout else f"H={heads} (none)"
        strategies = STRATEGIES if "R" in layout else ("replay",)   # attention-only: one K/V path
        for sigma in sigmas:
            drafter = perturbed_twin(target, sigma=sigma, generator=torch.Generator().manual_seed(2))
            for strategy in strategies:
                t = run_case(target, drafter, prompts, num_new, args.k, strategy, args.capacity)
                r = t["rounds"]
                name = strategy if "R" in layout else "K/V pointer"
                print(f"| {kind} {layout} | {state_desc} | {sigma:g} | {name} | {t['lossless']} "
                      f"| {t['accepted'] / r:.2f} | {t['generated'] / r:.2f} | {t['model_passes'] / r:.2f} "
                      f"| {t['bytes_copied'] / r:,.0f} | {t['bytes_logged'] / r:,.0f} "
                      f"| {t['kv_bytes_written'] / r:,.0f} | {t['update_flops'] / r:,.0f} "
                      f"| {t['readout_flops'] / r:,.0f} | {t['folds'] / r:.2f} |", flush=True)


if __name__ == "__main__":
    main()
