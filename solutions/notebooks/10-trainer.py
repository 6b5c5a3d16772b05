# %% [markdown]
# # 10 · The trainer loop
#
# Lesson: `docs/modules/10-trainer.md`. We train a small byte-level model on a few kilobytes of stories, plot the loss and the learning-rate schedule, and check that a resumed run continues exactly where it stopped. With `G2C_QUICK=1` it takes seconds.

# %%
import os
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import torch

from g2c.pretraining import TrainConfig, Trainer, split_stream
from g2c.transformer import TransformerLM

QUICK = os.environ.get("G2C_QUICK") == "1"
torch.set_num_threads(min(4, os.cpu_count() or 1))

path = Path("data/tinystories/train.txt")
text = path.read_text()[:60_000] if path.is_file() else (
    "Once upon a time, there was a little dog named Max. Max liked to run in the park. " * 200)
ids = torch.tensor(list(text.encode()), dtype=torch.long)          # bytes: V = 256
train_ids, val_ids = split_stream(ids, val_fraction=0.1)
print(f"{len(train_ids):,} train bytes, {len(val_ids):,} validation bytes")

# %%
STEPS = 60 if QUICK else 600
cfg = TrainConfig(batch_size=16, context=64, max_steps=STEPS, warmup_steps=STEPS // 10,
                  max_lr=3e-3, min_lr=3e-4, eval_every=max(1, STEPS // 6), eval_batches=4, seed=0)

def new_model(seed=0):
    return TransformerLM(256, 64, 2, 4, 64, generator=torch.Generator().manual_seed(seed))

trainer = Trainer(new_model(), train_ids, val_ids, config=cfg)
hist = trainer.fit()
print(f"loss {hist[0]['loss']:.3f} -> {hist[-1]['loss']:.3f}   best val {trainer.best_val_loss:.3f}   ln 256 = {np.log(256):.3f}")

# %%
fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.2))
a.plot([r["step"] for r in hist], [r["loss"] for r in hist], label="train (one batch)")
ev = [r for r in hist if "val_loss" in r]
a.plot([r["step"] for r in ev], [r["val_loss"] for r in ev], "o-", label="validation")
a.set_xlabel("step"); a.set_ylabel("loss (nats)"); a.legend()
b.plot([r["step"] for r in hist], [r["lr"] for r in hist])
b.set_xlabel("step"); b.set_ylabel("learning rate"); b.set_title("warmup + cosine")
plt.tight_layout(); plt.show()

# %% [markdown]
# **Question:** The training curve is jagged while the validation curve is smooth. Why? And what would it mean if validation loss started rising while training loss kept falling?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# Each training point is the loss of one random batch of 16 × 64 bytes, so it carries sampling noise; validation averages several batches and uses the *same* batches every time, so only the model changes between points. Validation rising while training falls is overfitting: the model memorises this small text instead of learning what generalises (here likely with a few kilobytes and many steps), which is why `fit` keeps the best weights.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) each training point is the loss of one random batch (16 × 64 bytes) and carries
# sampling noise; validation averages several batches and reuses the same ones, so only the model
# changes between points; (2) validation rising while training falls is overfitting (memorising a few
# kilobytes), the reason `fit` keeps the best validation weights. Numbers (G2C_QUICK=1, 60 steps):
# loss 5.56 -> about 1.17, best validation about 1.15, ln 256 = 5.545; the full run (600 steps) goes
# lower.
# <!-- END RUBRIC -->

# %% [markdown]
# ## Gradient norms and clipping
#
# `grad_norm` is the global norm *before* clipping at `grad_clip = 1.0`.

# %%
norms = [r["grad_norm"] for r in hist]
clipped = sum(n > cfg.grad_clip for n in norms)
print(f"grad norm: first {norms[0]:.2f}, median {np.median(norms):.2f}; clipped on {clipped}/{len(norms)} steps")

# %% [markdown]
# ## Resume bit-identically
#
# Run half the steps, save, load into a model with *different* initial weights, and finish; compare with an uninterrupted run. The check runs on one CPU thread: with several, some kernels add partial sums in whatever order the threads finish, so even two uninterrupted runs can differ in the last bits.

# %%
threads = torch.get_num_threads()
torch.set_num_threads(1)  # multi-threaded CPU kernels may add in a different order on each run
short = TrainConfig(**{**cfg.__dict__, "max_steps": 10, "warmup_steps": 2, "eval_every": 5})
full = Trainer(new_model(), train_ids, val_ids, config=short)
full.fit(progress=False)

with tempfile.TemporaryDirectory() as d:
    first = Trainer(new_model(), train_ids, val_ids, config=short)
    first.fit(5, progress=False)
    first.save_checkpoint(Path(d) / "ckpt.pt")
    resumed = Trainer(new_model(seed=123), train_ids, val_ids, config=short)
    resumed.load_checkpoint(Path(d) / "ckpt.pt")
    resumed.fit(progress=False)

torch.set_num_threads(threads)
same = all(torch.equal(a, b) for a, b in zip(resumed.model.parameters(), full.model.parameters()))
print("weights identical:", same, "  histories identical:", resumed.history == full.history)
assert same and resumed.history == full.history, "the resumed run is not the uninterrupted run"

# %% [markdown]
# **Question:** Suppose `save_checkpoint` stored the weights and AdamW state but not the batch generator's state. Would the resumed run still train well? Would the test above pass?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# It would train about as well, since the batches are still random windows of the same stream, but it would not be the same run: after resuming the sampler would restart from its seed and draw the first windows again, so the losses, the weights and the history would differ from the uninterrupted run and the comparison would print False.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) it would still train about as well: the batches remain random windows of the same
# stream; (2) it would not be the same run: the resumed sampler restarts from its seed and re-draws
# the first windows, so losses, weights and history differ from the uninterrupted run; (3) the check
# above would print False (and its assert fail). Bonus: the same happens with multi-threaded CPU
# kernels that add in a different order, which is why the check runs on one thread. Numbers: with the
# generator state saved, weights identical True and histories identical True; gradient norms first
# about 4.1, median about 1.2, clipped on most of the 60 quick steps.
# <!-- END RUBRIC -->
