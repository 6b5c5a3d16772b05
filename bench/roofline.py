#!/usr/bin/env python3
"""Is verification free here? The decode roofline of the StoryLM ladder, measured on this machine.

    python bench/roofline.py                  # the ladder, teaching + fast paths (a few minutes, 1 thread)
    python bench/roofline.py --quick          # a smoke run (StoryLM-1M and -30M, fewer rows and rounds)
    python bench/roofline.py --models StoryLM-1M,StoryLM-30M --rows 1,5 --rounds 40   # issue 55's step table
    python bench/roofline.py --threads 2 --device cuda --plot runs/roofline-cuda.png
    python bench/roofline.py --plot docs/img/roofline.png                           # replace the committed figure

What it measures (CONVENTIONS §7: 1 torch thread by default, the count printed; every clock
read synchronises the device; rows timed interleaved: one warm-up call per row, then rounds of
one call per row, the median per row):

1. **Read bandwidth** beta: seconds to sum a float32 buffer four times the last-level cache
   (256 MiB on a CPU; 1 GiB on CUDA/MPS), bytes / median seconds.
2. **Compute peak** pi: a float32 (and bfloat16 on CPU/CUDA) matrix product big enough to be
   compute-bound, 2 n^3 / median seconds.
3. **Weight bytes per step** of each ladder model: the bytes its weight products read for one
   decode step (``FastLM.weight_bytes``: every Linear plus the tied unembedding, float32 or
   bfloat16), and the floor bytes / beta (``g2c.specdec.theory.memory_floor_step_s``).
4. **T_verify(k)**: the seconds of one cached pass with k + 1 = 1, 2, 3, 5, 9, 17, 33 new rows
   on a cache holding ``--context`` committed positions, for the teaching path (module 16's
   ``cached_forward`` on the ``TransformerLM``), the fast path (``g2c.kvcache.fast.fast_model``,
   its fused step ``g2c.kvcache.step.FusedStep``: float32, equal logits; and its bfloat16
   products, their own model), the fast path's older lean loop (``backend="plain"``, the
   "plain" paths) and, on request, the fused step under ``torch.compile`` ("compiled" paths).
   The **knee**: the first row count whose pass costs more than 1.25x the 1-row pass (the
   verification pass is no longer free there).
4b. **Per step, each path against its floor** (issue 55): the 1-row step over its weight-read
   floor, the seconds of the step's weight products alone (every product of the model called once
   on one row with the fast path's kernels, timed interleaved with the passes) and the step over
   them, and the operations the step dispatches (``g2c.kvcache.step.dispatch_counts``; the
   compiled paths are counted with torch's profiler, which the compiled graph does not refuse)
   with the copies among them (``COPY_OPS``: copy_, dtype conversions, index_copy_, cat ...).
5. The lecture's model next to it: T_verify(k) = max(bytes / beta, k * 2P / pi) with the
   measured beta and pi (MBU = MFU = 1), drawn dashed in the plot.

Clock: on a CPU with one thread the default is this process's CPU seconds
(``time.process_time``): other jobs on a shared machine then add no waiting time to a
measurement (they still share the memory bus). ``--clock wall`` for wall-clock seconds.

Output: one table per model (ms per pass and the ratio to the 1-row pass), a summary with the
issue's targets (5-row pass <= 1.25x the 1-row step on StoryLM-30M; 1-row step <= 1.5x the
floor), and a matplotlib plot (default runs/roofline.png, never the committed
docs/img/roofline.png unless ``--plot`` names it; ``--plot ''`` skips it).
Timings on a shared machine are noisy: the medians over interleaved rounds are the numbers.
Reference solutions are applied (``import g2c.course.solved``): it measures the answer key.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets.artifacts import ArtifactError, load_model
from g2c.assets.cli import choice_list, count, device_name, int_list, model_list, output_file
from g2c.course.files import atomic_path, write_problem
from g2c.kvcache import KVCache, cached_forward
from g2c.kvcache.fast import fast_model, packed_kernels_available
from g2c.kvcache.step import COPY_OPS, dispatch_counts
from g2c.nn import resolve_device, synchronize
from g2c.specdec.theory import memory_floor_step_s

ROOT = Path(__file__).resolve().parents[1]
ROWS = (1, 2, 3, 5, 9, 17, 33)
PATHS = ("teaching", "plain fp32", "plain bf16", "fast fp32", "fast bf16", "compiled fp32", "compiled bf16")
DEFAULT_PATHS = ("teaching", "plain fp32", "plain bf16", "fast fp32", "fast bf16")
KNEE = 1.25
STEP_TARGET = 1.25            # issue 55: the fast 1-row step within 1.25x its weight-read floor


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=model_list(ladder_only=True), default=None,
                    help="comma-separated ladder models (default: StoryLM-1M,5M,30M; "
                    "--quick: StoryLM-1M,StoryLM-30M)")
    ap.add_argument("--rows", type=int_list(1), default=None,
                    help="rows per pass, k + 1 (default 1,2,3,5,9,17,33; --quick 1,2,5,9)")
    ap.add_argument("--rounds", type=count(1), default=None,
                    help="timed rounds after the warm-up (default 15; --quick 4)")
    ap.add_argument("--context", type=count(1), default=64,
                    help="committed positions in the cache (default 64; clamped per model to max_seq_len - the "
                         "largest --rows, and the clamped value is printed)")
    ap.add_argument("--paths", type=choice_list(*PATHS), default=",".join(DEFAULT_PATHS),
                    help=f"which of {', '.join(PATHS)} (comma-separated; default {','.join(DEFAULT_PATHS)}: "
                         "'fast' is the fused step, 'plain' the lean loop it replaced, 'compiled' the fused step "
                         "under torch.compile, which compiles once per row count)")
    ap.add_argument("--threads", type=count(1), default=1, help="torch.set_num_threads (default 1; printed)")
    ap.add_argument("--device", type=device_name(), default="cpu", help="cpu (default), cuda, mps or auto")
    ap.add_argument("--plot", type=output_file(allow_empty=True), default=None,
                    help="where to save the plot ('' = no plot; default runs/roofline.png, and no plot with "
                         "--quick; the committed docs/img/roofline.png is replaced only when named here)")
    ap.add_argument("--clock", choices=("auto", "wall", "cpu"), default="auto",
                    help="wall: time.perf_counter; cpu: this process's CPU seconds (time.process_time), the "
                         "robust clock on a shared CPU with 1 thread (it counts the work, not the waiting for a "
                         "core); auto (default): cpu on a CPU with 1 thread, else wall")
    ap.add_argument("--quick", action="store_true", help="a smoke run")
    args = ap.parse_args(argv)
    if args.plot is None:
        args.plot = "" if args.quick else str(ROOT / "runs" / "roofline.png")
    args.models = args.models or ("StoryLM-1M,StoryLM-30M" if args.quick else "StoryLM-1M,StoryLM-5M,StoryLM-30M")
    args.rows = args.rows or ("1,2,5,9" if args.quick else ",".join(map(str, ROWS)))
    args.rounds = args.rounds or (4 if args.quick else 15)
    try:
        args.rows = sorted({int(r) for r in args.rows.split(",")})
    except ValueError:
        ap.error(f"--rows must be comma-separated integers, got {args.rows!r}")
    if args.rows[0] < 1:
        ap.error("--rows must be >= 1")
    args.paths = args.paths.split(",")                     # choice_list: known names, at least one, none twice
    if args.threads < 1:
        ap.error("--threads must be >= 1")
    return args


CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter          # set in main from --clock
clock_name = "wall"


def _median_time(fn, device, rounds: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        synchronize(device)
        t0 = clock()
        fn()
        synchronize(device)
        times.append(clock() - t0)
    return statistics.median(times)


def read_bandwidth(device: torch.device, rounds: int) -> float:
    """Bytes per second to read a float32 buffer larger than the caches (sum reduction)."""
    nbytes = 2**28 if device.type == "cpu" else 2**30
    buf = torch.ones(nbytes // 4, device=device)
    seconds = _median_time(lambda: buf.sum(), device, rounds, warmup=2)
    return nbytes / seconds


def compute_peak(device: torch.device, dtype: torch.dtype, rounds: int) -> float:
    """FLOP/s of an n x n x n matrix product (n = 1024 on a CPU, 4096 elsewhere)."""
    n = 1024 if device.type == "cpu" else 4096
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device, dtype)
    b = torch.randn(n, n, generator=gen).to(device, dtype)
    return 2 * n**3 / _median_time(lambda: a @ b, device, max(3, rounds // 3), warmup=2)


def _pass_fn(model, cache: KVCache, context: int, rows: int, device):
    gen = torch.Generator().manual_seed(rows)
    ids = torch.randint(0, model.vocab_size, (1, rows), generator=gen).to(device)

    def run():
        cache.crop(context)                          # roll back: every pass sees the same committed context
        cached_forward(model, ids, cache)
    return run


def build_path(model, path: str):
    """The model a path runs: the teaching ``TransformerLM``, or its fast copy with the path's
    backend ("fast": the fused step, "plain": the lean loop, "compiled": the fused step compiled)
    and dtype."""
    if path == "teaching":
        return model
    kind, dtype = path.split()
    return fast_model(model, dtype=dtype, backend={"fast": "fused", "plain": "plain", "compiled": "compiled"}[kind])


def _products_fn(fast, device):
    """One call of every weight product of a fast model on one row (the step's products alone,
    with the fused step's kernels)."""
    step = fast_model(fast.source, dtype=fast.dtype).step
    products = [p for blk in step.blocks for p in (blk.qkv, blk.proj, blk.fc, blk.mlp_proj)] + [step.head]
    gen = torch.Generator().manual_seed(0)
    inputs = [torch.randn(1, p.in_features, generator=gen).to(device, p.dtype) for p in products]

    def run():
        for p, x in zip(products, inputs):
            p(x)
    return run


def count_ops(fn, compiled: bool) -> tuple[int, int]:
    """(operations dispatched, copies among them) by one call of ``fn`` (after its warm-up)."""
    if not compiled:
        counts = dispatch_counts(fn)
    else:                               # a dispatch mode would stop the compiled graph: count with the profiler
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        counts = Counter(e.name.removeprefix("aten::") for e in prof.events() if e.name.startswith("aten::")
                         and (e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")))
    return sum(counts.values()), sum(n for name, n in counts.items() if name in COPY_OPS)


def measure_ladder(args, device: torch.device) -> dict:
    """{model: {path: {rows: seconds}}} plus each model's weight bytes, the products' seconds per
    dtype and the operations per pass, timed interleaved."""
    out, calls = {}, []
    for name in args.models.split(","):
        try:
            model, _ = load_model(name.strip(), device=device)
        except (ArtifactError, ValueError) as exc:
            raise SystemExit(f"roofline: cannot load {name!r}: {exc}")
        context = min(args.context, model.max_seq_len - max(args.rows))
        if context < 1:
            raise SystemExit(f"roofline: {name} holds {model.max_seq_len} positions, too few for {max(args.rows)} "
                             "rows per pass; use smaller --rows")
        if context != args.context:
            print(f"{name}: measuring at context {context}, not {args.context}: clamped to max_seq_len "
                  f"{model.max_seq_len} - {max(args.rows)} rows")
        variants = {path: build_path(model, path) for path in args.paths}
        for path, m in variants.items():
            if getattr(m, "backend_note", ""):
                print(f"{name} {path}: {m.backend_note}")
        fast32, fast16 = fast_model(model), fast_model(model, dtype="bf16")
        info = {"params": sum(p.numel() for b in model.blocks for p in (b.attn.qkv.weight, b.attn.proj.weight,
                                                                         b.mlp.fc.weight, b.mlp.proj.weight))
                + model.token_embed.weight.numel(),
                "bytes": {"fp32": fast32.weight_bytes, "bf16": fast16.weight_bytes},
                "times": {p: {} for p in args.paths}, "context": context, "products": {}, "ops": {}}
        out[model.name if hasattr(model, "name") else name] = info
        for tag, fast in (("fp32", fast32), ("bf16", fast16)):
            if any(p.endswith(tag) for p in args.paths):
                calls.append((info["products"], tag, _products_fn(fast, device)))
        prompt = torch.randint(0, model.vocab_size, (1, context), generator=torch.Generator().manual_seed(1))
        for path in args.paths:
            m = variants[path]
            cache = KVCache.for_model(m)
            cached_forward(m, prompt.to(device), cache)                     # the committed context
            for rows in args.rows:
                calls.append((info["times"][path], rows, _pass_fn(m, cache, context, rows, device)))
    with torch.no_grad():
        for _, _, fn in calls:                                              # warm-up every row
            fn()
            fn()
        samples = {id(fn): [] for _, _, fn in calls}
        for _ in range(args.rounds):                                        # rounds of one call per row
            for _, _, fn in calls:
                synchronize(device)
                t0 = clock()
                fn()
                synchronize(device)
                samples[id(fn)].append(clock() - t0)
    for times, rows, fn in calls:
        times[rows] = statistics.median(samples[id(fn)])
    for info in out.values():                                               # operations per pass, after the timing
        for path, times in info["times"].items():
            info["ops"][path] = {}
    for times, rows, fn in calls:
        for info in out.values():
            for path, t in info["times"].items():
                if t is times:
                    with torch.no_grad():
                        info["ops"][path][rows] = count_ops(fn, path.startswith("compiled"))
    return out


def knee(times: dict[int, float]) -> int | None:
    """The first row count whose pass costs more than KNEE x the 1-row pass (None: flat throughout)."""
    base = times[min(times)]
    for rows in sorted(times):
        if times[rows] > KNEE * base:
            return rows
    return None


def lecture_model(rows: int, nbytes: float, params: int, beta: float, pi: float) -> float:
    """The lecture's T_verify: max(memory time, compute time), MBU = MFU = 1, batch 1, KV read ignored."""
    return max(memory_floor_step_s(nbytes, beta), rows * 2 * params / pi)


def plot(results: dict, beta: float, pi: dict, out: str, threads: int, device: torch.device) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 4.0), squeeze=False)
    colors = {"teaching": "tab:red", "fast fp32": "tab:blue", "fast bf16": "tab:green", "plain fp32": "tab:cyan",
              "plain bf16": "tab:olive", "compiled fp32": "tab:purple", "compiled bf16": "tab:pink"}
    for ax, name in zip(axes[0], names):
        info = results[name]
        for path, times in info["times"].items():
            rows = sorted(times)
            ax.plot(rows, [times[r] * 1e3 for r in rows], "o-", color=colors[path], label=path)
        rows = sorted(next(iter(info["times"].values())))
        for tag, style in (("fp32", "--"), ("bf16", ":")):
            if tag == "bf16" and not any(p.endswith("bf16") for p in info["times"]):
                continue
            model = [lecture_model(r, info["bytes"][tag], info["params"], beta, pi[tag]) * 1e3 for r in rows]
            ax.plot(rows, model, style, color="gray", label=f"lecture T_verify, {tag}")
        ax.axhline(memory_floor_step_s(info["bytes"]["fp32"], beta) * 1e3, color="black", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(rows)
        ax.set_xticklabels([str(r) for r in rows])
        ax.set_ylim(bottom=0)
        ax.set_xlabel("rows per cached pass (k + 1)")
        ax.set_ylabel("ms per pass")
        ax.set_title(f"{name}: {info['bytes']['fp32'] / 1e6:.0f} MB fp32 weights")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Cached pass cost vs rows, {device.type}, {threads} thread(s), {clock_name} clock\n"
                 f"black line: fp32 weight-read floor at {beta / 1e9:.1f} GB/s", fontsize=10)
    fig.tight_layout()
    with atomic_path(out) as tmp:  # an interrupted or disk-full run leaves the previous figure
        fig.savefig(tmp, dpi=110)
    print(f"plot: {out}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    global clock, clock_name
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    if args.clock == "auto":
        args.clock = "cpu" if device.type == "cpu" and args.threads == 1 else "wall"
    clock, clock_name = CLOCK[args.clock], args.clock
    print(f"device {device}, torch {torch.__version__}, {torch.get_num_threads()} thread(s), {args.clock} clock, "
          f"oneDNN packing fp32 {packed_kernels_available(torch.float32)} / bf16 "
          f"{packed_kernels_available(torch.bfloat16)}, context {args.context} asked (each model's table says the "
          f"context it measured at), {args.rounds} interleaved rounds")
    beta = read_bandwidth(device, args.rounds)
    pi = {"fp32": compute_peak(device, torch.float32, args.rounds)}
    pi["bf16"] = compute_peak(device, torch.bfloat16, args.rounds) if device.type != "mps" else pi["fp32"]
    print(f"read bandwidth beta = {beta / 1e9:.1f} GB/s; matmul peak pi = {pi['fp32'] / 1e9:.0f} GFLOP/s fp32, "
          f"{pi['bf16'] / 1e9:.0f} GFLOP/s bf16; ridge pi/beta = {pi['fp32'] / beta:.0f} FLOP/byte (fp32)")
    results = measure_ladder(args, device)
    print()
    print("| model | weight bytes/step fp32 | bf16 | floor fp32 (ms) | floor bf16 (ms) | lecture k* (fp32) |")
    print("|---|---|---|---|---|---|")
    for name, info in results.items():
        f32 = memory_floor_step_s(info["bytes"]["fp32"], beta)
        f16 = memory_floor_step_s(info["bytes"]["bf16"], beta)
        kstar = f32 / (2 * info["params"] / pi["fp32"])
        print(f"| {name} | {info['bytes']['fp32'] / 1e6:.1f} MB | {info['bytes']['bf16'] / 1e6:.1f} MB | "
              f"{f32 * 1e3:.2f} | {f16 * 1e3:.2f} | {kstar:.0f} rows |")
    for name, info in results.items():
        print(f"\n{name}: ms per cached pass (ratio to the 1-row pass) at context {info['context']}"
              f"{' (clamped from ' + str(args.context) + ')' if info['context'] != args.context else ''}, "
              f"{torch.get_num_threads()} thread(s)")
        rows = sorted(next(iter(info["times"].values())))
        print("| path | " + " | ".join(f"{r} rows" for r in rows) + " | knee (> 1.25x) |")
        print("|---|" + "---|" * (len(rows) + 1))
        for path, times in info["times"].items():
            base = times[rows[0]]
            cells = " | ".join(f"{times[r] * 1e3:.2f} ({times[r] / base:.2f}x)" for r in rows)
            k = knee(times)
            print(f"| {path} | {cells} | {'none' if k is None else f'{k} rows'} |")
    for name, info in results.items():
        print(f"\n{name}: the 1-row step against its weight-read floor and its products, per path (issue 55)")
        print("| path | 1-row step (ms) | floor (ms) | step / floor | products alone (ms) | step / products | "
              "ops per step (copies) | " + " | ".join(f"ops per {r}-row pass" for r in sorted(
                  next(iter(info["ops"].values()))) if r != 1) + " |")
        print("|---|---|---|---|---|---|---|" + "---|" * (len(next(iter(info["ops"].values()))) - 1))
        for path, times in info["times"].items():
            if 1 not in times:
                continue
            tag = "bf16" if path.endswith("bf16") else "fp32"
            floor = memory_floor_step_s(info["bytes"][tag], beta)
            prods = info["products"].get(tag)
            ops = info["ops"][path]
            cells = [f"{times[1] * 1e3:.2f}", f"{floor * 1e3:.2f}", f"{times[1] / floor:.2f}x",
                     "-" if prods is None else f"{prods * 1e3:.2f}",
                     "-" if prods is None else f"{times[1] / prods:.2f}x", f"{ops[1][0]} ({ops[1][1]})"]
            cells += [f"{ops[r][0]} ({ops[r][1]})" for r in sorted(ops) if r != 1]
            print(f"| {path} | " + " | ".join(cells) + " |")
    big = results.get("StoryLM-30M")
    if big is not None:
        print("\ntargets (StoryLM-30M):")
        for path, times in big["times"].items():
            tag = "bf16" if path.endswith("bf16") else "fp32"
            floor = memory_floor_step_s(big["bytes"][tag], beta)
            goal = f"target <= {STEP_TARGET}x" if path.startswith("fast") else "issue 23's target <= 1.5x"
            line = f"  {path:13s} 1-row step {times[1] * 1e3:.2f} ms = {times[1] / floor:.2f}x its floor " \
                   f"({floor * 1e3:.2f} ms; {goal})" if 1 in times else f"  {path:13s}"
            if 1 in times and 5 in times:
                line += f"; 5-row pass {times[5] / times[1]:.2f}x the 1-row step (target <= 1.25x)"
            print(line)
        if "teaching" in big["times"] and 1 in big["times"]["teaching"]:
            base = big["times"]["teaching"][1]
            print("  1-row step speed-up over the teaching path: " + ", ".join(
                f"{p} {base / t[1]:.2f}x" for p, t in big["times"].items() if p != "teaching" and 1 in t))
    for name, info in results.items():
        if name == "StoryLM-30M":
            continue
        lines = [f"{p} {t[1] / info['products'][tag]:.2f}x" for p, t in info["times"].items()
                 if p.startswith("fast") and 1 in t and (tag := p.split()[1]) in info["products"]]
        if lines:
            print(f"drafter step against its products ({name}; target <= 2x): " + ", ".join(lines))
    if args.plot:
        try:
            plot(results, beta, pi, args.plot, torch.get_num_threads(), device)
        except OSError as err:                              # a disk that filled during the run
            print(f"bench/roofline.py: error: {write_problem(err, args.plot)} (the tables above are the run's "
                  "result)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
