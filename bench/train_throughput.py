#!/usr/bin/env python3
"""Training throughput of the course's from-scratch transformer vs the same model on torch's fused modules.

    python bench/train_throughput.py                      # StoryLM-5M and -30M, fp32 and bf16, 16 x 256
    python bench/train_throughput.py --quick              # smoke run: tiny batch, one repeat
    python bench/train_throughput.py --models StoryLM-1M --batch-size 8 --context 128 --repeats 7

For each ladder configuration and precision it times one full training step (forward,
cross-entropy, backward, global-norm clipping, AdamW) of three implementations of the
*same* architecture with the *same* weights:

    course        g2c.transformer.TransformerLM with the course's AdamW and clip_grad_norm_
    course+sdpa   the same, with ``set_fused_attention(True)`` (torch's SDPA kernel)
    torch fused   the reference model below: nn.Embedding, nn.LayerNorm, nn.Linear, nn.GELU,
                  F.scaled_dot_product_attention, torch.optim.AdamW, torch's clip_grad_norm_

It warms up, then reports the median over repeats (CONVENTIONS §7), in tokens/s, and the
ratio course time / torch-fused time. Results are in ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import platform
from contextlib import nullcontext

import torch
import torch.nn as nn
import torch.nn.functional as F

import g2c.course.solved  # noqa: F401  (first: applies the answer key before course modules load)
from g2c.assets.cli import choice_list, count, device_name
from g2c.nn import time_call
from g2c.pretraining import lm_cross_entropy, no_decay_params
from g2c.training import AdamW, clip_grad_norm_
from g2c.transformer import LADDER, TransformerLM

# Shape letters: B batch, T time, D width, H heads, V vocabulary.


# -- the reference: the same architecture from torch's fused modules -----------------------

class RefBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, hidden_dim: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.ln_1 = nn.LayerNorm(dim, eps=1e-5)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-5)
        self.fc = nn.Linear(dim, hidden_dim)
        self.act = nn.GELU()                                   # exact (erf) GELU, as the course's
        self.mlp_proj = nn.Linear(hidden_dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, D = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(D, dim=-1)                   # (B, T, D) each
        q, k, v = (t.view(B, T, self.num_heads, D // self.num_heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)         # (B, H, T, d)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, D))
        return x + self.mlp_proj(self.act(self.fc(self.ln_2(x))))


class RefLM(nn.Module):
    """GPT-2-shaped LM on torch modules: learned positions, pre-norm blocks, tied unembedding."""

    def __init__(self, vocab_size: int, dim: int, num_layers: int, num_heads: int, max_seq_len: int,
                 hidden_dim: int) -> None:
        super().__init__()
        self.token_embed = nn.Embedding(vocab_size, dim)
        self.pos_embed = nn.Embedding(max_seq_len, dim)
        self.blocks = nn.ModuleList(RefBlock(dim, num_heads, hidden_dim) for _ in range(num_layers))
        self.ln_final = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        T = ids.shape[1]
        x = self.token_embed(ids) + self.pos_embed(torch.arange(T, device=ids.device))   # (B, T, D)
        for blk in self.blocks:
            x = blk(x)
        return self.ln_final(x) @ self.token_embed.weight.t()       # (B, T, V); torch reference, not the course model

    @torch.no_grad()
    def copy_from(self, course: TransformerLM) -> "RefLM":
        """Load the course model's weights (course ``Linear`` stores (out, in), as torch does)."""
        def put(dst: torch.Tensor, src: torch.Tensor) -> None:
            dst.copy_(src.detach())

        put(self.token_embed.weight, course.token_embed.weight)
        put(self.pos_embed.weight, course.pos_embed.weight)
        for mine, theirs in zip(self.blocks, course.blocks):
            pairs = [(mine.ln_1, theirs.ln_1), (mine.ln_2, theirs.ln_2), (mine.qkv, theirs.attn.qkv),
                     (mine.proj, theirs.attn.proj), (mine.fc, theirs.mlp.fc), (mine.mlp_proj, theirs.mlp.proj)]
            for a, b in pairs:
                put(a.weight, b.weight)
                put(a.bias, b.bias)
        put(self.ln_final.weight, course.ln_final.weight)
        put(self.ln_final.bias, course.ln_final.bias)
        return self


# -- one training step per implementation --------------------------------------------------

def course_step_fn(model: TransformerLM, bf16: bool, device: torch.device):
    opt = AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1, no_decay=no_decay_params(model))
    params = model.parameters()

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        with _autocast(bf16, device):
            logits = model(x)                                                # (B, T, V)
        loss = lm_cross_entropy(logits.float(), y)
        opt.zero_grad()
        loss.backward()
        clip_grad_norm_(params, 1.0)
        opt.step()
        return float(loss.detach())
    return step


def ref_step_fn(model: RefLM, bf16: bool, device: torch.device):
    rest = no_decay_params(model)
    decay = [p for p in model.parameters() if all(p is not q for q in rest)]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}]
    try:
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), fused=True)
    except (RuntimeError, TypeError, ValueError):                            # no fused kernel here
        opt = torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), foreach=True)

    def step(x: torch.Tensor, y: torch.Tensor) -> float:
        with _autocast(bf16, device):
            logits = model(x)                                                # (B, T, V)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss.detach())
    return step


def _autocast(bf16: bool, device: torch.device):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16) if bf16 else nullcontext()


def time_steps(step, batches, *, warmup: int, repeats: int, steps: int, device: torch.device) -> float:
    """Median seconds per step over ``repeats`` timings of ``steps`` steps, after ``warmup``
    untimed steps; the clock handling is ``g2c.nn.time_call`` (synchronised, median)."""
    counter = iter(range(10**9))

    def run(n: int) -> None:
        for _ in range(n):
            step(*batches[next(counter) % len(batches)])

    run(warmup)
    return time_call(lambda: run(steps), device=device, warmup=0, repeats=repeats).median_s / steps


# -- main ----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="StoryLM-5M,StoryLM-30M", help="comma list of LADDER names")
    ap.add_argument("--batch-size", type=count(1), default=16)
    ap.add_argument("--context", type=count(1), default=256)
    ap.add_argument("--precisions", type=choice_list("fp32", "bf16"), default="fp32,bf16",
                    help="comma list of fp32, bf16")
    ap.add_argument("--warmup", type=count(0), default=2, help="untimed steps first")
    ap.add_argument("--repeats", type=count(1), default=5, help="timings; the median is reported")
    ap.add_argument("--steps", type=count(1), default=2, help="steps per timing")
    ap.add_argument("--threads", type=count(0), default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--device", type=device_name(auto=False), default="cpu")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: batch 2, context 32, 1 warm-up, 1 repeat of 1 step")
    args = ap.parse_args(argv)
    if args.quick:
        args.batch_size, args.context, args.warmup, args.repeats, args.steps = 2, 32, 1, 1, 1
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    names = [n.strip() for n in args.models.split(",") if n.strip()]
    for n in names:
        if n not in LADDER:
            ap.error(f"unknown model {n!r}; choose from {', '.join(LADDER)}")
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    for p in precisions:
        if p not in ("fp32", "bf16"):
            ap.error(f"unknown precision {p!r}; choose from fp32, bf16")

    B, T = args.batch_size, args.context
    print(f"torch {torch.__version__} on {platform.processor() or platform.machine()}, device {device}, "
          f"{torch.get_num_threads()} threads; batch {B} x context {T}; warm-up {args.warmup}, "
          f"median of {args.repeats} x {args.steps} steps")
    header = (f"{'model':12s} {'prec':5s} {'course tok/s':>13s} {'course+sdpa':>12s} {'torch fused':>12s} "
              f"{'course/fused':>13s} {'sdpa/fused':>11s}")
    print(header)
    print("-" * len(header))
    for name in names:
        cfg = LADDER[name]
        if T > cfg.max_seq_len:
            ap.error(f"--context {T} exceeds {name}'s max_seq_len {cfg.max_seq_len}")
        gen = torch.Generator().manual_seed(0)
        batches = []
        for _ in range(4):
            w = torch.randint(0, cfg.vocab_size, (B, T + 1), generator=gen)
            batches.append((w[:, :-1].to(device), w[:, 1:].to(device)))
        # The reference must compute the same function: same weights, same logits.
        course = cfg.build(generator=torch.Generator().manual_seed(0)).to(device)
        ref = RefLM(cfg.vocab_size, cfg.embedding_dim, cfg.num_layers, cfg.num_heads, cfg.max_seq_len,
                    course.hidden_dim).to(device).copy_from(course)
        with torch.no_grad():
            diff = (ref(batches[0][0]) - course(batches[0][0])).abs().max().item()
        if diff > 1e-4:
            raise SystemExit(f"{name}: the torch reference differs from the course model (max |logit diff| {diff:.2e})")
        del course, ref
        for prec in precisions:
            bf16 = prec == "bf16"
            results = {}
            for impl in ("course", "course+sdpa", "torch fused"):
                torch.manual_seed(0)
                course = cfg.build(generator=torch.Generator().manual_seed(0)).to(device)
                if impl == "torch fused":
                    model = RefLM(cfg.vocab_size, cfg.embedding_dim, cfg.num_layers, cfg.num_heads,
                                  cfg.max_seq_len, course.hidden_dim).to(device).copy_from(course)
                    step = ref_step_fn(model, bf16, device)
                else:
                    course.set_fused_attention(impl == "course+sdpa")
                    step = course_step_fn(course, bf16, device)
                results[impl] = time_steps(step, batches, warmup=args.warmup, repeats=args.repeats,
                                                         steps=args.steps, device=device)
            tok = {k: B * T / v for k, v in results.items()}
            ref_s = results["torch fused"]
            print(f"{name:12s} {prec:5s} {tok['course']:13,.0f} {tok['course+sdpa']:12,.0f} "
                  f"{tok['torch fused']:12,.0f} {results['course'] / ref_s:12.2f}x "
                  f"{results['course+sdpa'] / ref_s:10.2f}x", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
