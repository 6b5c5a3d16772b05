#!/usr/bin/env python3
"""Speculation under load and under a grammar (module specdec-serving), measured on this machine.

    python bench/specdec_serving.py --quick      # B in {1, 8, 32}, k in {1, 2, 4}, 16 tokens (a few minutes)
    python bench/specdec_serving.py              # B in {1, 8, 32, 64}, 32 tokens
    python bench/specdec_serving.py --out DIR    # where the CSVs go (default runs/specdec_serving)
    python bench/specdec_serving.py --engine     # only: the lab's batched loop vs batched_speculative_sample

Part 1, the serving lab with a controller: StoryLM-30M serves B requests (the two prompt sets of
``bench/serving_lab.py``) with StoryLM-1M drafting, through the lab's batched loop
(``g2c.specdec.lab.batched_speculative_generate``): plain decoding, every static k, and
``LoadAwareK`` (k per round from the calibrated round costs, corrected online, and the running
acceptance; the calibration is cached under ``runs/specdec_serving/``), both cold (a fresh
controller per cell: ``adaptive``) and warm (one controller per prompt set kept across the cells
and repeats, as a server keeps it across requests: ``adaptive-warm``). Throughput is new tokens per second of
process CPU time (one thread: robust when other processes share the cores). Each row also has
the acceptance metrics of ``g2c.specdec.serving.metrics`` (mean acceptance length, per-position
rates, histogram) and the collapse alarm's count. Outputs are checked equal to plain decoding.
Writes ``serving.csv``.

Part 2, structured output: constrained greedy decoding of StoryLM-5M with StoryLM-1M drafting,
forced-token drafting on and off, against plain constrained decoding (equal token for token);
tokens per target pass and CPU seconds. Writes ``constrained.csv``.

``--engine`` (alone, part 1 and 2 skipped): greedy batched speculation through the lab's loop
(one LM drafter stepped over every row in one ragged pass) against the engine's batched round
``g2c.specdec.serving.batched_speculative_sample`` (one cached ``LMDrafter`` per row), same target
pass, on the endings prompts; runs interleaved, median of the repeats, outputs checked equal to
each other. Writes ``engine.csv``.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets import load_model
from g2c.assets.cli import count, int_list, output_dir
from g2c.course.files import atomic_write
from g2c.specdec.lab.batched import batched_greedy, batched_speculative_generate
from g2c.specdec.sampling.drafters import LMDrafter
from g2c.specdec.sampling.target import CachedTarget
from g2c.specdec.serving.batched import batched_speculative_sample
from g2c.specdec.serving.constrain import constrained_generate, constrained_speculative_sample
from g2c.specdec.serving.controller import LoadAwareK, PassCosts, StaticBatchK, break_even_batch
from g2c.specdec.serving.metrics import AcceptanceAlarm, AcceptanceCollapse, RoundLog
from g2c.specdec.serving.regex import TokenConstraint

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serving_lab import PROMPT_SETS  # noqa: E402

CONSTRAINTS = {
    "story-opening": " Once upon a time, there was a( little| big)( girl| boy| dog| cat) named [A-Z][a-z]+\\. "
                     "(She|He) (liked|loved) to [a-z]+( [a-z]+)*\\.",
    "yes-no": " The answer is( yes| no)\\.",
}


def _cell(target, drafter, prompts, new_tokens: int, controller) -> dict:
    log = RoundLog(alarm=AcceptanceAlarm(window=32, threshold=1.2))
    cpu0 = time.process_time()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", AcceptanceCollapse)
        if controller is None:
            res = batched_greedy(target, prompts, new_tokens)
        else:
            res = batched_speculative_generate(target, drafter, prompts, new_tokens, controller=log.watch(controller))
    cpu = time.process_time() - cpu0
    emitted = sum(e for rows in res.rounds for _, e in rows)
    m = log.metrics()
    return {"cpu_tok_s": emitted / cpu, "passes": res.target_passes, "outputs": [o.tolist() for o in res.outputs],
            "metrics": m, "alarms": log.alarm.alarms}


def _engine_vs_lab(target, drafter, tok, batches, ks, new_tokens: int, repeats: int, threads: int, out: Path) -> int:
    """The lab's batched loop against the engine's batched round, interleaved; writes engine.csv."""
    runs = {"lab": lambda p, k: batched_speculative_generate(target, drafter, p, new_tokens, k=k),
            "engine": lambda p, k: batched_speculative_sample(target, lambda: LMDrafter(drafter, use_cache=True), p,
                                                              new_tokens, k=k, temperature=0.0)}
    texts = PROMPT_SETS["endings"]
    runs["lab"](tok.encode_batch_fast(texts[:2]), 2)                      # warm-up
    runs["engine"](tok.encode_batch_fast(texts[:2]), 2)
    rows = []
    for b in batches:
        prompts = tok.encode_batch_fast([texts[i % len(texts)] for i in range(b)])
        for k in ks:
            cpu: dict[str, list[float]] = {name: [] for name in runs}
            outs, passes = {}, {}
            for _ in range(repeats):                                      # interleaved repeats, median kept
                for name, run in runs.items():
                    cpu0 = time.process_time()
                    res = run(prompts, k)
                    cpu[name].append(time.process_time() - cpu0)
                    outs[name], passes[name] = [o.tolist() for o in res.outputs], res.target_passes
            assert outs["lab"] == outs["engine"], f"B={b} k={k}: the two batched rounds disagree"
            emitted = sum(len(o) - len(p) for o, p in zip(outs["lab"], prompts))
            lab_s, eng_s = statistics.median(cpu["lab"]), statistics.median(cpu["engine"])
            rows.append({"batch": b, "k": k, "lab_tok_cpu_s": round(emitted / lab_s, 1),
                         "engine_tok_cpu_s": round(emitted / eng_s, 1), "engine_over_lab": round(lab_s / eng_s, 3),
                         "lab_passes": passes["lab"], "engine_passes": passes["engine"], "new_tokens": new_tokens,
                         "threads": threads, "repeats": repeats})
            r = rows[-1]
            print(f"threads={threads} B={b:<3} k={k}  lab {r['lab_tok_cpu_s']:>8.1f} tok/cpu-s  engine "
                  f"{r['engine_tok_cpu_s']:>8.1f} tok/cpu-s  engine/lab x{r['engine_over_lab']:.2f}  passes "
                  f"{r['lab_passes']}/{r['engine_passes']}")
    with atomic_write(out / "engine.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"wrote {out / 'engine.csv'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batches", type=int_list(1), help="comma list (default 1,8,32,64; --quick: 1,8,32)")
    ap.add_argument("--ks", type=int_list(1), help="static draft lengths (default 1,2,4)")
    ap.add_argument("--new-tokens", type=count(1), help="new tokens per request (default 32; --quick: 16)")
    ap.add_argument("--threads", type=count(1), default=1)
    ap.add_argument("--out", type=output_dir(), default="runs/specdec_serving")
    ap.add_argument("--repeats", type=count(1), default=3, help="interleaved runs per cell, median kept (default 3)")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--engine", action="store_true", help="only compare the lab's batched loop with the engine's "
                    "batched round (engine.csv)")
    args = ap.parse_args(argv)
    batches = [int(b) for b in (args.batches or ("1,8,32" if args.quick else "1,8,32,64")).split(",")]
    ks = [int(k) for k in (args.ks or "1,2,4").split(",")]
    new_tokens = args.new_tokens or (16 if args.quick else 32)
    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    target, tok = load_model("StoryLM-30M")
    drafter, _ = load_model("StoryLM-1M")
    if args.engine:
        return _engine_vs_lab(target, drafter, tok, batches, ks, new_tokens, args.repeats, args.threads, out)
    t0 = time.perf_counter()
    costs = PassCosts.load_or_measure(target, drafter, name="StoryLM-30M+StoryLM-1M",
                                      path=out / f"calibration-{args.threads}t.json",
                                      round_ks=tuple(range(max(ks) + 1)))
    print(f"calibration ({time.perf_counter() - t0:.1f}s, cached in {out}): target pass B=1: "
          + ", ".join(f"T={t} {1e3 * costs.target_s(1, t):.1f} ms" for t in (1, 2, 3, 5))
          + f"; B=32 T=1 {1e3 * costs.target_s(32, 1):.1f} ms, T=5 {1e3 * costs.target_s(32, 5):.1f} ms; "
          f"drafter B=1 {1e3 * costs.drafter_s(1):.1f} ms")
    for b in (1, 8, 32):
        print(f"  round B={b}: " + ", ".join(f"k={k} {1e3 * costs.round_s(b, k):.0f} ms" for k in range(max(ks) + 1)))
    for a in (0.5, 0.7, 0.9):
        print(f"  break-even batch at alpha={a}: {break_even_batch(a, costs, k_max=max(ks))}")

    warm = tok.encode_batch_fast(PROMPT_SETS["endings"][:2])
    for ctl in (None, StaticBatchK(2), LoadAwareK(costs, k_max=max(ks))):
        _cell(target, drafter, warm, 2, ctl)
    rows = []
    for set_name, texts in PROMPT_SETS.items():
        warm = LoadAwareK(costs, k_max=max(ks))
        for b in batches:
            prompts = tok.encode_batch_fast([texts[i % len(texts)] for i in range(b)])
            names = ["plain"] + [f"k={k}" for k in ks] + ["adaptive", "adaptive-warm"]
            cells: dict[str, list[dict]] = {name: [] for name in names}
            used: dict[str, list[int]] = {name: [] for name in names}
            for _ in range(args.repeats):                         # interleaved repeats, median kept
                for name in names:
                    if name == "adaptive-warm":                   # a server's controller: kept across cells
                        ctl = warm
                        ctl.new_run()
                    elif name == "adaptive":                      # a cold start in every cell
                        ctl = LoadAwareK(costs, k_max=max(ks))
                    else:
                        ctl = None if name == "plain" else StaticBatchK(int(name[2:]))
                    before = len(getattr(ctl, "history", []))
                    cells[name].append(_cell(target, drafter, prompts, new_tokens, ctl))
                    used[name] += [k for _, k in getattr(ctl, "history", [])[before:]]
            plain_rate = statistics.median(c["cpu_tok_s"] for c in cells["plain"])
            for name in names:
                cell = cells[name][-1]
                assert all(c["outputs"] == cells["plain"][0]["outputs"] for c in cells[name]), \
                    f"{name}: output differs from plain greedy"
                rate = statistics.median(c["cpu_tok_s"] for c in cells[name])
                m = cell["metrics"]
                ks_used = used[name]
                rows.append({"prompts": set_name, "batch": b, "config": name,
                             "cpu_tok_s": round(rate, 1),
                             "speedup": round(rate / plain_rate, 3),
                             "target_passes": cell["passes"],
                             "mean_accept_len": round(m["mean_acceptance_length"], 3),
                             "per_position": ";".join(f"{x:.2f}" for x in m["per_position"]),
                             "histogram": ";".join(str(x) for x in m["histogram"]),
                             "mean_k": round(sum(ks_used) / len(ks_used), 2) if ks_used else "",
                             "alarms": cell["alarms"], "new_tokens": new_tokens, "threads": args.threads,
                             "repeats": args.repeats})
                r = rows[-1]
                print(f"{set_name:9} B={b:<3} {name:13} {r['cpu_tok_s']:>8.1f} tok/cpu-s  x{r['speedup']:.2f}  "
                      f"passes {r['target_passes']:>3}  accept len {r['mean_accept_len']:.2f}  mean k {r['mean_k']}")
    with atomic_write(out / "serving.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)

    small, _ = load_model("StoryLM-5M")
    crow = []
    for cname, pattern in CONSTRAINTS.items():
        c = TokenConstraint.from_tokenizer(pattern, tok)
        prompt = torch.tensor(tok.encode("Tom and Sue went to the park."))
        want = constrained_generate(small, prompt, 48, c, temperature=0.0)
        for forced in (False, True):
            cpu0 = time.process_time()
            ids, st = constrained_speculative_sample(CachedTarget(small), LMDrafter(drafter, use_cache=True), prompt,
                                                     48, c, forced=forced, k=4, temperature=0.0)
            cpu = time.process_time() - cpu0
            assert ids.tolist() == want.tolist(), "constrained speculative output differs from constrained greedy"
            crow.append({"constraint": cname, "forced_drafts": forced, "tokens": st.generated,
                         "target_passes": st.target_passes, "tokens_per_pass": round(st.tokens_per_pass, 3),
                         "forced_tokens": st.drafter.forced_tokens, "drafter_calls": st.drafter.drafter_calls,
                         "cpu_s": round(cpu, 3)})
            print(f"constraint {cname:13} forced={forced!s:5} tokens {st.generated:>3} passes {st.target_passes:>3} "
                  f"tok/pass {st.tokens_per_pass:.2f} forced {st.drafter.forced_tokens:>3} drafter calls "
                  f"{st.drafter.drafter_calls:>3} cpu {cpu:.2f}s")
        print(f"  text: {tok.decode(want[len(prompt):].tolist())!r}")
    with atomic_write(out / "constrained.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(crow[0]))
        w.writeheader()
        w.writerows(crow)
    print(f"wrote {out / 'serving.csv'} and {out / 'constrained.csv'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
