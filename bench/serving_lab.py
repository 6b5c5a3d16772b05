#!/usr/bin/env python3
"""The serving lab on a CPU: where does batched speculative decoding stop paying?

    python bench/serving_lab.py                  # the full grid (several minutes on 1 thread)
    python bench/serving_lab.py --quick          # CI smoke run (B in {1, 4}, 8 tokens)
    python bench/serving_lab.py --out DIR        # where the CSV and the plots go (default runs/serving_lab)
    python bench/serving_lab.py --export-prompts exported/prompts   # the prompt sets as JSONL for vLLM

Lab 8 of the lecture, scaled to the StoryLM ladder: StoryLM-30M serves B requests at once,
plain batched greedy decoding against batched speculative decoding with StoryLM-1M drafting
k in {1, 2, 4} tokens (``g2c.specdec.lab.batched``: ragged per-row commits, lossless per row),
at B in {1, 8, 32, 64}, on two prompt sets of different entropy:

- ``endings``: story endings ("And they all lived happily ever after."), after which the
  ladder writes <|endoftext|> and its stock opening: near-deterministic text, the
  TinyStories analogue of code boilerplate (measured tau about 3.3 at k = 4);
- ``dialogue``: open quotes mid-scene ("The fox whispered to the owl, \""), the entropic
  part of a story (tau about 2.1 at k = 4).

Per cell it reports throughput (new tokens/s over the batch), TPOT (per row: decode time /
new tokens, averaged), ITL P50/P99 (gaps between consecutive tokens of a row, from
per-token timestamps: all tokens of one round share the round's timestamp, so speculation
makes the ITL distribution bimodal), measured tau (tokens per target pass) and the speed-up
over plain decoding at the same B; also throughput per second of process CPU time
(``cpu_tok_s``, ``cpu_speedup``: with one thread this is robust when other processes share
the cores and stretch the wall clock). It writes ``serving_lab.csv`` and two plots:
``speedup_vs_batch.png`` (with the 1.0 line) and ``itl_hist.png`` (B = 1, plain vs k = 4).

It also measures this machine's float32 matmul throughput and memory bandwidth, prints the
ridge point pi / beta and the arithmetic intensity of each speculative batch (the formula of
``g2c.specdec.theory.speculative_intensity``, with float32 weights: 4 bytes per parameter
for 2 FLOPs), so the measured break-even batch can be compared with the roofline argument.

Timing: torch runs with ONE thread (``--threads``; the course machine's 2 cores are
shared), one warm-up per configuration, wall clock read after a device synchronise.
Reference solutions are applied (G2C_APPLY_SOLUTIONS defaults to ``all`` here).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
from pathlib import Path

import torch

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets import load_model
from g2c.assets.cli import count, device_name, int_list, model_name, output_dir, output_file
from g2c.course.files import atomic_path, atomic_write, write_problem, write_text_atomic
from g2c.specdec.lab.batched import batched_greedy, batched_speculative_generate

PROMPT_SETS = {
    # Story endings: the ladder continues with <|endoftext|> and its stock opening
    # ("Once upon a time, there was a little girl named Lily. She loved to ..."), the
    # TinyStories analogue of code boilerplate: the 1M drafter guesses it well.
    "endings": [
        "And they all lived happily ever after.",
        "The moral of the story is to always share with your friends.",
        "From that day on, Lily and Tom were best friends. The end.",
        "Ben said sorry, and his mom gave him a big hug.",
        "They went home and had a good sleep.",
        "The bird flew away, happy and free.",
        "The moral of the story is that being kind is important.",
        "Sam smiled. He was glad he had helped his friend.",
    ],
    # Open quotes in the middle of a scene: what a character says next is the entropic
    # part of a story, and the drafter guesses it far less often.
    "dialogue": [
        "\"Why is the sky green today?\" asked Zoe. Her grandpa scratched his beard and said, \"",
        "Max held up the strange key. \"",
        "\"I do not want soup!\" shouted Ollie. \"",
        "The fox whispered to the owl, \"",
        "Mia pointed at the map. \"First we go past the",
        "\"How many stars are there?\" Ben asked. Dad said, \"",
        "The robot beeped twice and said, \"",
        "\"Guess what I found under my bed,\" said Lucy. \"",
    ],
}


def measure_machine(threads: int) -> dict[str, float]:
    """float32 matmul FLOP/s and copy bandwidth (bytes/s), median of 5, after a warm-up."""
    n = 1024
    a, b = torch.randn(n, n), torch.randn(n, n)
    times = []
    for i in range(6):
        t0 = time.perf_counter()
        a @ b
        if i:
            times.append(time.perf_counter() - t0)
    flops = 2 * n ** 3 / statistics.median(times)
    src = torch.randn(32 * 2 ** 20)            # 128 MiB, far beyond any cache
    dst = torch.empty_like(src)
    times = []
    for i in range(6):
        t0 = time.perf_counter()
        dst.copy_(src)
        if i:
            times.append(time.perf_counter() - t0)
    bw = 2 * src.numel() * 4 / statistics.median(times)     # read + write
    return {"threads": threads, "matmul_flops": flops, "bandwidth_bytes": bw, "ridge": flops / bw}


def fp32_intensity(params: int, batch: int, k: int, context: int, kv_bytes_per_token: int) -> float:
    """FLOP/byte of one verify step with float32 weights: 2P B (k+1) / (4P + B L kv)."""
    return 2 * params * batch * (k + 1) / (4 * params + batch * context * kv_bytes_per_token)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))]


def run_cell(target, drafter, prompts, new_tokens: int, k: int) -> dict:
    t0, cpu0 = time.perf_counter(), time.process_time()
    if k == 0:
        res = batched_greedy(target, prompts, new_tokens)
    else:
        res = batched_speculative_generate(target, drafter, prompts, new_tokens, k=k)
    end, cpu = time.perf_counter(), time.process_time() - cpu0
    decode = end - res.start_time
    itl, tpot = [], []
    for times in res.token_times:
        prev = res.start_time
        for t in times:
            itl.append(t - prev)
            prev = t
        tpot.append((times[-1] - res.start_time) / len(times))
    emitted = sum(e for rows in res.rounds for _, e in rows)
    passes = sum(len(rows) for rows in res.rounds)
    return {"throughput": emitted / decode, "cpu_throughput": emitted / cpu, "tpot_ms": 1e3 * statistics.mean(tpot),
            "itl_p50_ms": 1e3 * percentile(itl, 50), "itl_p99_ms": 1e3 * percentile(itl, 99),
            "tau": emitted / passes, "target_passes": res.target_passes, "wall_s": end - t0,
            "prefill_s": res.start_time - t0, "itl": itl, "outputs": res.outputs}


def _prefix(text: str) -> str:
    """--export-prompts PREFIX: the files PREFIX-<set>.jsonl must be writable (``output_file``), checked at parse
    time like every output path."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty prefix; give one such as runs/prompts (writes "
                                         "runs/prompts-<set>.jsonl)")
    output_file()(f"{text}-{next(iter(PROMPT_SETS))}.jsonl")
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=model_name(ladder_only=True), default="StoryLM-30M")
    ap.add_argument("--drafter", type=model_name(standalone=True), default="StoryLM-1M")
    ap.add_argument("--batches", type=int_list(1), help="comma list (default 1,8,32,64; --quick: 1,4)")
    ap.add_argument("--ks", type=int_list(1), help="draft lengths (default 1,2,4; --quick: 1,4)")
    ap.add_argument("--new-tokens", type=count(1), help="new tokens per request (default 32; --quick: 8)")
    ap.add_argument("--threads", type=count(1), default=1)
    ap.add_argument("--device", type=device_name(), default="cpu")
    ap.add_argument("--out", type=output_dir(), default="runs/serving_lab")
    ap.add_argument("--quick", action="store_true", help="CI smoke run: B in {1, 4}, k in {1, 4}, 8 tokens")
    ap.add_argument("--export-prompts", metavar="PREFIX", type=_prefix,
                    help="write PREFIX-<set>.jsonl ({\"prompt\": ...} per line) for vllm bench serve, then exit")
    args = ap.parse_args(argv)
    if args.export_prompts:
        import json

        for set_name, texts in PROMPT_SETS.items():
            path = Path(f"{args.export_prompts}-{set_name}.jsonl")
            write_text_atomic(path, "".join(json.dumps({"prompt": t}) + "\n" for t in texts))
            print(f"wrote {path}")
        return 0
    quick = {"batches": "1,4", "ks": "1,4", "new_tokens": 8}
    full = {"batches": "1,8,32,64", "ks": "1,2,4", "new_tokens": 32}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    from tqdm import tqdm

    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    target, tok = load_model(args.target, device=args.device)
    drafter, _ = load_model(args.drafter, device=args.device)
    params = sum(p.numel() for p in target.parameters())
    kv_per_token = 2 * target.num_layers * target.embedding_dim * 4          # K and V, float32
    machine = measure_machine(args.threads)
    print(f"machine: {args.threads} thread(s), matmul {machine['matmul_flops'] / 1e9:.1f} GFLOP/s, "
          f"copy bandwidth {machine['bandwidth_bytes'] / 1e9:.1f} GB/s, ridge {machine['ridge']:.1f} FLOP/byte")
    print(f"target {args.target}: {params / 1e6:.1f}M parameters, {4 * params / 1e6:.0f} MB float32, "
          f"KV {kv_per_token / 1024:.0f} KiB per token")

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, itl_keep = [], {}
    configs = [0] + ks
    cells = [(s, b, k) for s in PROMPT_SETS for b in batches for k in configs]
    # one warm-up per configuration (allocator, first-call overheads)
    first = next(iter(PROMPT_SETS))
    warm = tok.encode_batch_fast(PROMPT_SETS[first][:2])
    for k in configs:
        run_cell(target, drafter, warm, 2, k)
    for set_name, batch, k in tqdm(cells, desc="serving lab", unit="cell"):
        texts = [PROMPT_SETS[set_name][i % len(PROMPT_SETS[set_name])] for i in range(batch)]
        prompts = tok.encode_batch_fast(texts)
        cell = run_cell(target, drafter, prompts, args.new_tokens, k)
        if k == 0:
            plain = cell
        else:
            assert [o.tolist() for o in cell["outputs"]] == [o.tolist() for o in plain["outputs"]], \
                "speculative output differs from plain greedy"
        context = max(len(p) for p in prompts) + args.new_tokens // 2
        row = {"prompts": set_name, "batch": batch, "config": "plain" if k == 0 else f"spec k={k}", "k": k,
               "throughput_tok_s": round(cell["throughput"], 1), "tpot_ms": round(cell["tpot_ms"], 2),
               "itl_p50_ms": round(cell["itl_p50_ms"], 2), "itl_p99_ms": round(cell["itl_p99_ms"], 2),
               "tau": round(cell["tau"], 3), "speedup": round(cell["throughput"] / plain["throughput"], 3),
               "cpu_tok_s": round(cell["cpu_throughput"], 1),
               "cpu_speedup": round(cell["cpu_throughput"] / plain["cpu_throughput"], 3),
               "intensity_flop_per_byte": round(fp32_intensity(params, batch, k, context, kv_per_token), 1),
               "new_tokens": args.new_tokens, "threads": args.threads}
        rows.append(row)
        if batch == 1:
            itl_keep[(set_name, k)] = cell["itl"]

    try:                              # a disk that fills during the run: one line, the table printed is the result
        with atomic_write(out / "serving_lab.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        header = f"{'prompts':10} {'B':>3} {'config':9} {'tok/s':>8} {'TPOT ms':>8} {'ITL p50':>8} {'ITL p99':>8} " \
                 f"{'tau':>5} {'speedup':>7} {'cpu x':>6} {'I':>6}"
        print(header)
        for r in rows:
            print(f"{r['prompts']:10} {r['batch']:>3} {r['config']:9} {r['throughput_tok_s']:>8.1f} "
                  f"{r['tpot_ms']:>8.2f} {r['itl_p50_ms']:>8.2f} {r['itl_p99_ms']:>8.2f} {r['tau']:>5.2f} "
                  f"{r['speedup']:>7.2f} {r['cpu_speedup']:>6.2f} "
                  f"{r['intensity_flop_per_byte']:>6.1f}")
        for set_name in PROMPT_SETS:
            for k in ks:
                mine = [r for r in rows if r["prompts"] == set_name and r["k"] == k]
                wall = [r["batch"] for r in mine if r["speedup"] > 1.0]
                cpu = [r["batch"] for r in mine if r["cpu_speedup"] > 1.0]
                print(f"{set_name:10} k={k}: speculation pays (speed-up > 1) at B in {cpu or '-'} by CPU time, "
                      f"{wall or '-'} by wall clock; roofline: verify stops being free near B(k+1) = 2 x ridge = "
                      f"{2 * machine['ridge']:.0f} tokens per step, B ~ {2 * machine['ridge'] / (k + 1):.1f}")

        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, len(PROMPT_SETS), figsize=(10, 3.6), sharey=True)
        for ax, set_name in zip(axes, PROMPT_SETS):
            for i, k in enumerate(ks):
                mine = [r for r in rows if r["prompts"] == set_name and r["k"] == k]
                color = f"C{i}"
                ax.plot([r["batch"] for r in mine], [r["cpu_speedup"] for r in mine], marker="o", color=color,
                        label=f"k={k} (CPU time)")
                ax.plot([r["batch"] for r in mine], [r["speedup"] for r in mine], marker=".", ls=":", color=color,
                        alpha=0.6, label=f"k={k} (wall clock)")
            ax.axhline(1.0, color="black", lw=1, ls="--")
            ax.set_xscale("log", base=2)
            ax.set_xticks(batches, [str(b) for b in batches])
            ax.set_xlabel("batch size B")
            ax.set_title(f"{set_name} prompts")
        axes[0].set_ylabel("speed-up over plain decoding")
        axes[0].legend(fontsize=7)
        fig.suptitle(f"{args.drafter} drafting for {args.target}, {args.threads} CPU thread(s)")
        fig.tight_layout()
        with atomic_path(out / "speedup_vs_batch.png") as tmp:
            fig.savefig(tmp, dpi=110)

        fig, ax = plt.subplots(figsize=(6, 3.4))
        k_hist = max(ks)
        plain_itl = [1e3 * x for x in itl_keep.get((first, 0), [])]
        spec_itl = [1e3 * x for x in itl_keep.get((first, k_hist), [])]
        if plain_itl and spec_itl:
            top = max(plain_itl + spec_itl)
            bins = [top * i / 40 for i in range(41)]
            ax.hist(plain_itl, bins=bins, alpha=0.6, label="plain")
            ax.hist(spec_itl, bins=bins, alpha=0.6, label=f"speculative k={k_hist}")
        ax.set_xlabel("inter-token latency (ms)")
        ax.set_ylabel("tokens")
        ax.set_title(f"B = 1, {first} prompts: speculation makes ITL bimodal", fontsize=9)
        ax.legend()
        fig.tight_layout()
        with atomic_path(out / "itl_hist.png") as tmp:
            fig.savefig(tmp, dpi=110)
    except OSError as err:
        print(f"bench/serving_lab.py: error: {write_problem(err, out)}", file=sys.stderr)
        return 1
    print(f"wrote {out / 'serving_lab.csv'}, {out / 'speedup_vs_batch.png'}, {out / 'itl_hist.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
