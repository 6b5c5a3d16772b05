# %% [markdown]
# # 03b · Training controls: AdamW, clipping, warmup + cosine
#
# Lesson: `docs/modules/03b-training.md`. We plot the learning-rate schedule, run our AdamW
# and torch's side by side on the same problem, and watch clipping at work.

# %%
import os

import matplotlib.pyplot as plt
import torch

from g2c.training import AdamW, clip_grad_norm_, cosine_with_warmup

QUICK = os.environ.get("G2C_QUICK") == "1"
STEPS = 60 if QUICK else 300

# %% [markdown]
# ## The schedule

# %%
warm, total = 100, 1000
lrs = [cosine_with_warmup(s, warmup_steps=warm, max_steps=total, max_lr=3e-3, min_lr=3e-4) for s in range(1200)]
plt.plot(lrs); plt.axvline(warm, ls=":", c="grey"); plt.axvline(total, ls=":", c="grey")
plt.xlabel("step"); plt.ylabel("lr"); plt.title("linear warmup, cosine decay, then constant")
plt.show()
print("lr at steps 0, 99, 100, 550, 1000, 1100:", [round(lrs[s], 6) for s in (0, 99, 100, 550, 1000, 1100)])

# %% [markdown]
# ## Our AdamW against `torch.optim.AdamW`

# %%
g = torch.Generator().manual_seed(0)
A = torch.randn(20, 5, generator=g)
b = torch.randn(20, generator=g)
w_ours = torch.zeros(5, requires_grad=True)
w_ref = torch.zeros(5, requires_grad=True)
opt_ours = AdamW([w_ours], lr=0.05, weight_decay=0.01)
opt_ref = torch.optim.AdamW([w_ref], lr=0.05, weight_decay=0.01)

loss_hist, gap_hist = [], []
for step in range(STEPS):
    for w, opt in ((w_ours, opt_ours), (w_ref, opt_ref)):
        opt.zero_grad()
        loss = ((A @ w - b) ** 2).mean()
        loss.backward()
        opt.step()
    loss_hist.append(((A @ w_ours - b) ** 2).mean().item())
    gap_hist.append((w_ours - w_ref).abs().max().item())

fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
ax[0].plot(loss_hist); ax[0].set_title("least-squares loss (ours)"); ax[0].set_yscale("log")
ax[1].plot(gap_hist); ax[1].set_title("max |w_ours - w_torch|")
plt.show()
print(f"final loss {loss_hist[-1]:.4f}, largest gap to torch {max(gap_hist):.1e}")

# %% [markdown]
# ## Clipping

# %%
p = torch.zeros(3, requires_grad=True)
for scale in (0.1, 1.0, 10.0, 1000.0):
    p.grad = torch.tensor([1.0, 2.0, 2.0]) * scale  # norm 3·scale
    before = clip_grad_norm_([p], max_norm=1.0)
    print(f"norm before {before:8.1f}   after {p.grad.norm().item():.4f}")

# %% [markdown]
# **Question:** In the AdamW plot the first step moves every coordinate of w by almost
# exactly `lr`, no matter how large its gradient. Why? And what does that suggest about why
# a warmup helps at the start of training?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# At t = 1, bias correction gives m̂ = g and v̂ = g², so the update is
# lr·g/(|g| + ε) ≈ lr·sign(g): a full-size step in every coordinate based on a single noisy
# gradient, because v̂ is estimated from one sample. Early on the second-moment estimate is
# poor and the weights are random, so large steps are risky; a warmup keeps lr small until
# m and v average over many batches.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) at t = 1 bias correction gives m̂ = g and v̂ = g², so the step is lr·g/(|g| + ε)
# ≈ lr·sign(g), the same size in every coordinate whatever |g|; (2) v̂ comes from a single sample, so
# the normalisation is unreliable early on; (3) warmup keeps lr small while m and v average over many
# batches and while the random-init gradients are large and noisy. Numbers: the schedule prints 3e-05,
# 0.003, 0.003, 0.00165, 0.0003, 0.0003 at steps 0, 99, 100, 550, 1000, 1100; the AdamW run matches
# torch to about 1e-7; clipping leaves a norm of 0.3 untouched and scales 3, 30 and 3000 to 1.0.
# <!-- END RUBRIC -->
