#!/usr/bin/env python3
"""The weight products of one StoryLM-30M decode step, alone, under each candidate kernel.

    python bench/linear_kernels.py               # 1 thread, rows 1,2,3,5,9,17,33, 9 rounds
    python bench/linear_kernels.py --rounds 21

Why the fast path (``g2c.kvcache.fast``) uses what it uses: the 37 products of one step of
StoryLM-30M (per block qkv 512->1536, proj 512->512, fc 512->2048, proj 2048->512; the tied
unembedding 512->4096), random weights of the same shapes, timed for M = 1 ... 33 rows:

* ``x @ W.t()``      the course ``Linear`` (module 03) in float32;
* ``F.linear``       torch's fused linear, float32;
* ``addmm(W^T)``     a contiguous pre-transposed float32 weight;
* ``W @ x^T``        the product the other way round, float32;
* ``onednn packed``  the weight reordered once by oneDNN for small M (float32), as the fast path;
* ``bf16 F.linear``  bfloat16 weights and inputs, torch's product;
* ``bf16 packed``    bfloat16, oneDNN-packed, as the fast path's ``dtype=bfloat16``;
* ``int8 w-only``    int8 weights with per-row scales, bfloat16 inputs (``torch._weight_int8pack_mm``).

Rows are timed interleaved (one warm-up call per kernel and row, then rounds of one call
each, the median); the clock is this process's CPU time on a 1-thread CPU run (robust on a
shared machine) unless ``--clock wall``. Kernels this torch lacks are skipped with a note.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from g2c.assets.cli import count

ROWS = (1, 2, 3, 5, 9, 17, 33)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=count(1), default=1)
    ap.add_argument("--rounds", type=count(1), default=9)
    ap.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    clock = time.process_time if (args.clock == "cpu" or (args.clock == "auto" and args.threads == 1)) \
        else time.perf_counter
    D = 512
    shapes = [(3 * D, D), (D, D), (4 * D, D), (D, 4 * D)] * 9 + [(4096, D)]
    g = torch.Generator().manual_seed(0)
    ws = [torch.randn(o, i, generator=g) * 0.02 for o, i in shapes]
    bs = [torch.randn(o, generator=g) * 0.02 for o, _ in shapes]
    xs = {r: {i: torch.randn(r, i, generator=g) for i in (D, 4 * D)} for r in ROWS}
    wts = [w.t().contiguous() for w in ws]
    wbf, bbf = [w.bfloat16() for w in ws], [b.bfloat16() for b in bs]
    xbf = {r: {i: x.bfloat16() for i, x in v.items()} for r, v in xs.items()}
    kernels = {
        "x @ W.t()": lambda r: [(xs[r][w.shape[1]] @ w.t()).add_(b) for w, b in zip(ws, bs)],
        "F.linear": lambda r: [F.linear(xs[r][w.shape[1]], w, b) for w, b in zip(ws, bs)],
        "addmm(W^T)": lambda r: [torch.addmm(b, xs[r][w.shape[0]], w) for w, b in zip(wts, bs)],
        "W @ x^T": lambda r: [torch.addmm(b[:, None], w, xs[r][w.shape[1]].t()) for w, b in zip(ws, bs)],
        "bf16 F.linear": lambda r: [F.linear(xbf[r][w.shape[1]], w, b) for w, b in zip(wbf, bbf)],
    }
    try:
        pk = [torch.ops.mkldnn._reorder_linear_weight(w, 4) for w in ws]
        pkb = [torch.ops.mkldnn._reorder_linear_weight(w, 4) for w in wbf]
        kernels["onednn packed"] = lambda r: [torch.ops.mkldnn._linear_pointwise(xs[r][w.shape[1]], p, b, "none",
                                                                                  [], "")
                                              for w, p, b in zip(ws, pk, bs)]
        kernels["bf16 packed"] = lambda r: [torch.ops.mkldnn._linear_pointwise(xbf[r][w.shape[1]], p, b, "none",
                                                                                [], "")
                                            for w, p, b in zip(wbf, pkb, bbf)]
        kernels["onednn packed"](1)
        kernels["bf16 packed"](1)
    except (RuntimeError, AttributeError) as err:
        kernels.pop("onednn packed", None)
        kernels.pop("bf16 packed", None)
        print(f"note: oneDNN packing unavailable here ({str(err).splitlines()[0]})")
    try:
        q = []
        for w in ws:
            scale = w.abs().amax(dim=1) / 127
            q.append(((w / scale[:, None]).round().clamp(-127, 127).to(torch.int8), scale.bfloat16()))
        kernels["int8 w-only"] = lambda r: [torch._weight_int8pack_mm(xbf[r][wq.shape[1]], wq, s).add_(b)
                                            for (wq, s), b in zip(q, bbf)]
        kernels["int8 w-only"](1)
    except (RuntimeError, AttributeError) as err:
        kernels.pop("int8 w-only", None)
        print(f"note: int8 weight-only product unavailable here ({str(err).splitlines()[0]})")
    for r in ROWS:                                    # warm-up every (kernel, rows)
        for fn in kernels.values():
            fn(r)
    samples = {(n, r): [] for n in kernels for r in ROWS}
    for _ in range(args.rounds):
        for r in ROWS:
            for n, fn in kernels.items():
                t0 = clock()
                fn(r)
                samples[n, r].append(clock() - t0)
    nbytes = sum(w.numel() for w in ws) * 4
    print(f"# 37 weight products of one StoryLM-30M step ({nbytes / 1e6:.1f} MB in float32), torch "
          f"{torch.__version__}, {torch.get_num_threads()} thread(s), "
          f"{'CPU' if clock is time.process_time else 'wall'} clock, median of {args.rounds} interleaved rounds")
    print("| kernel | " + " | ".join(f"{r} rows (ms)" for r in ROWS) + " | 5 rows / 1 row |")
    print("|---|" + "---|" * (len(ROWS) + 1))
    for n in kernels:
        med = {r: statistics.median(samples[n, r]) for r in ROWS}
        print(f"| {n} | " + " | ".join(f"{med[r] * 1e3:.2f}" for r in ROWS) + f" | {med[5] / med[1]:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
