# %% [markdown]
# # Module 16: the KV cache and incremental decoding
#
# Module 11's `generate` re-scores the whole context for every new token. A causal model never
# lets an old position see a new one, so the keys and values of old positions never change:
# keep them, and each new token costs one row instead of the whole context. This notebook
# builds that intuition on the StoryLM ladder: you decode by hand with a `KVCache` and measure
# what the cache buys. (Speculative decoding on this cache, where rollback is a pointer move,
# is the Beyond module specdec-sampling's: `./notebook.sh specdec-sampling`.)
#
# `./notebook.sh 16` runs it with your own module 16 and the answer key for the modules it needs
# that you have not edited; `./notebook.sh 16 --solutions` opens the solved copy. Lesson: `docs/modules/16-kv-cache.md`.
# `G2C_QUICK=1` shrinks every loop (CI uses it).

# %%
import os
import statistics
import time

import torch

from g2c.assets import load_model
from g2c.kvcache import KVCache, cached_forward, cached_generate
from g2c.nn import resolve_device, synchronize
from g2c.sampling import generate

DEVICE = "auto"
QUICK = os.environ.get("G2C_QUICK", "") == "1"
device = resolve_device(DEVICE)
target, tok = load_model("StoryLM-30M", device=device)
drafter, _ = load_model("StoryLM-1M", device=device)
print(device, torch.get_num_threads(), "threads")

# %% [markdown]
# ## 1. What the cache holds
#
# One K and one V buffer per layer, shape (B, H, T_max, d), allocated once at the context
# window T_max = `max_seq_len`, and a pointer `length`.

# %%
for name in ("StoryLM-1M", "StoryLM-5M", "StoryLM-30M"):
    model = target if name == "StoryLM-30M" else load_model(name, device=device)[0]
    cache = KVCache.for_model(model)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    print(f"{name}: cache {cache.nbytes / 2**20:5.1f} MiB for {cache.max_seq_len} positions "
          f"({cache.bytes_per_position / 1024:.0f} KiB per position), weights {weights / 2**20:5.1f} MiB")

# %% [markdown]
# **Question:** Write the cache size as a formula in L, B, H, d, T_max and the bytes per number,
# and check it against the StoryLM-30M line above. At batch 1, is a decode step's memory traffic
# dominated by the cache or by the weights? At what batch size would the full 30M cache weigh as
# much as its weights?

# %% [markdown]
# **Answer:**
# <!-- BEGIN ANSWER -->
# nbytes = 2 (K and V) · L · B · H · T_max · d · bytes = 2 · L · B · T_max · D · bytes. For
# StoryLM-30M in float32: 2 · 9 · 1 · 256 · 512 · 4 = 9,437,184 bytes = 9 MiB, against 116 MiB of
# weights (30.4M parameters, tied embedding counted once). A decode step reads every weight once
# but at most `length` cache rows, so at batch 1 the weights dominate (about 13x even with a full
# window). The cache grows linearly with B while the weights do not: at B ≈ 13 a full-window
# cache weighs as much as the weights, which is why serving systems with large batches manage
# cache memory (paging, quantised caches) more carefully than weights.
# <!-- END ANSWER -->
# <!-- BEGIN RUBRIC -->
# Full marks: the formula with the factor 2 and the layer count; 9 MiB (9.4 MB) for 30M at
# fp32, T_max 256; weights ~116-122 MB dominate at B = 1; crossover near B = 12-13 (ratio of
# weight bytes to one full cache). Half marks for the formula without the crossover.
# <!-- END RUBRIC -->

# %% [markdown]
# ## 2. Decode by hand
#
# Prefill the prompt into an empty cache, then feed ONE token at a time with `cached_forward`,
# choosing the argmax each step. Collect in `steps` the (V,) logits row each new token was
# chosen from, in order: `steps[0]` is the **last row of the prefill** (the logits after the
# prompt, which choose the first new token), `steps[i]` the row of the i-th one-token pass; so
# `len(steps) == n_new`. Append the tokens to `ids`. The check below compares `steps[i]` with row
# `len(prompt) - 1 + i` of one full pass.

# %%
prompt = tok.encode("Once upon a time, there was a little")
n_new = 8 if QUICK else 24
cache = KVCache.for_model(target)
ids = list(prompt)
steps = []
# BEGIN SOLUTION
logits = cached_forward(target, torch.tensor([ids], device=device), cache)[0, -1]
for _ in range(n_new):
    steps.append(logits)
    ids.append(int(logits.argmax()))
    logits = cached_forward(target, torch.tensor([[ids[-1]]], device=device), cache)[0, -1]
# END SOLUTION
with torch.no_grad():
    full = target(torch.tensor([ids], device=device))[0]      # (T, V), one full pass
worst = max(float((s - full[len(prompt) - 1 + i]).abs().max()) for i, s in enumerate(steps))
print(tok.decode(ids))
print(f"largest |cached - full| logit difference: {worst:.2e}  (cache length {cache.length})")
assert len(steps) == n_new, f"steps holds {len(steps)} rows, expected n_new = {n_new} (steps[0] = the prefill's last row)"
assert worst < 1e-3, f"steps[i] differs from the full pass by {worst:.2e}: is steps[0] the prefill's last row?"
assert ids == generate(target, prompt, n_new, temperature=0.0).tolist(), "ids differ from module 11's greedy generate"

# %% [markdown]
# ## 3. What the cache buys
#
# Time one step at growing context lengths: a full recompute (module 11) against a one-row
# cached step. Timing synchronises the device, warms up and takes a median.

# %%
def median_ms(fn, repeats=3 if QUICK else 7):
    fn()
    out = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


lengths = [16, 128] if QUICK else [16, 64, 128, 192, 255]
base_ids = generate(drafter, prompt, 255 - len(prompt), temperature=0.0)[:255]
for n in lengths:
    ctx = base_ids[:n].unsqueeze(0).to(device)
    c = KVCache.for_model(target)
    cached_forward(target, ctx[:, :-1], c)

    def one_step():
        c.crop(n - 1)
        cached_forward(target, ctx[:, -1:], c)

    with torch.no_grad():
        full_ms = median_ms(lambda: target(ctx))
    print(f"context {n:3d}: full recompute {full_ms:6.1f} ms, cached step {median_ms(one_step):6.1f} ms")

# %% [markdown]
# **Question:** The cached step barely grows with the context, while the full recompute grows
# about linearly. Explain both from what each pass reads and computes. Why is the cached step
# still far from free at batch 1?

# %% [markdown]
# **Answer:**
# <!-- BEGIN ANSWER -->
# A full recompute runs every layer on all n positions: the matrix multiplications do n rows of
# work (≈ 2 · 30M · n FLOPs) plus attention over n², so its time grows with n once n rows
# make it compute-bound. A cached step runs one row: ≈ 2 · 30M FLOPs plus attention over n
# cached keys (n · D per layer, tiny next to the weights). Its cost is dominated by reading all
# weights once (122 MB in float32), which does not depend on n. That read is why the step is not
# free: at a few GB/s of memory bandwidth, 122 MB takes ~12-25 ms whatever the context, the
# weight-read floor. Halving the bytes (bfloat16) or emitting several tokens per weight read
# (speculative decoding) are the two ways below it.
# <!-- END ANSWER -->
# <!-- BEGIN RUBRIC -->
# Full marks: full pass ∝ n (matmul rows) + n² attention; cached step ∝ weights read once,
# attention ∝ n is small; names the memory-bandwidth floor (weight bytes / bandwidth) with a
# number of the right order (10-30 ms for 30M fp32 on a laptop/VM CPU). Expect on the 2-core
# course VM: full recompute ~60 ms at 16 and ~400+ ms at 255, cached step ~20-40 ms flat.
# <!-- END RUBRIC -->

# %% [markdown]
# ## 4. Half precision
#
# The artifacts are float16 on disk; `load_model(..., dtype=torch.bfloat16)` halves the bytes a
# decode step reads. Greedy output can change where two logits nearly tie.

# %%
half, _ = load_model("StoryLM-30M", device=device, dtype=torch.bfloat16 if device.type != "mps" else torch.float16)
n_cmp = 16 if QUICK else 48
a = cached_generate(target, prompt, n_cmp, temperature=0.0)
b = cached_generate(half, prompt, n_cmp, temperature=0.0)
first_diff = next((i for i, (x, y) in enumerate(zip(a.tolist(), b.tolist())) if x != y), None)
print("float32 :", tok.decode(a.tolist()))
print("half    :", tok.decode(b.tolist()))
print("first difference at position", first_diff)
