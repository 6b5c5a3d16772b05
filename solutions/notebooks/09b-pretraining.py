# %% [markdown]
# # 09b · The pretraining objective
#
# Lesson: `docs/modules/09b-pretraining.md`. We cut random windows out of a token stream, look at what the model is asked to predict, and check that the loss of an untrained model starts near ln V.

# %%
import math
import os

import numpy as np
import torch

from g2c.pretraining import get_lm_batch, lm_cross_entropy, split_stream

QUICK = os.environ.get("G2C_QUICK") == "1"

# The cached TinyStories stream (uint16 memmap) and the StoryTokenizer, when present;
# otherwise the bytes of a short text, so the notebook runs anywhere.
try:
    from g2c.assets.artifacts import load_tokenizer
    from g2c.assets.data import load_token_stream
    stream = load_token_stream("train")
    tok = load_tokenizer()
    decode, V = tok.decode, tok.vocab_size
except Exception as e:  # missing data or tokenizer
    print("falling back to a byte stream:", type(e).__name__)
    text = "Once upon a time, there was a little cat named Tom. Tom liked to play in the sun. " * 40
    stream = np.frombuffer(text.encode(), dtype=np.uint8).astype(np.uint16)
    decode, V = (lambda ids: bytes(int(i) for i in ids).decode(errors="replace")), 256
print(type(stream).__name__, stream.dtype, f"{len(stream):,} tokens, V = {V}")

# %% [markdown]
# ## One batch
#
# `x` is the input window, `y` the same window shifted by one: at every position the target is the next token.

# %%
g = torch.Generator().manual_seed(0)
x, y = get_lm_batch(stream, 4, 16, generator=g)
print(x.shape, x.dtype, y.shape)
for t in range(5):
    print(f"t={t}: input {decode([int(x[0, t])])!r:>14} -> target {decode([int(y[0, t])])!r}")
print("\nwindow:", repr(decode(x[0].tolist())))
assert torch.equal(x[:, 1:], y[:, :-1])

# %% [markdown]
# **Question:** A batch of shape (16, 256) is a single forward pass. How many next-token predictions does it train, and why does causal attention make that possible without the model seeing its own targets?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# 16 · 256 = 4096 predictions: every position of every window is one. Position t attends only to positions 0..t of x, and its target y[t] = x[t+1] lies strictly in its future, so no position can read its own answer even though all of them are scored at once.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) 16 · 256 = 4096 next-token predictions per pass, one per position; (2) position t
# attends only to x[0..t] and its target y[t] = x[t+1] lies strictly in its future, so no position
# reads its own answer even though all are scored at once (teacher forcing). Numbers from the
# notebook: a (4, 16) int64 batch; y is x shifted by one ("." -> " ", " " -> "O", ...); the untrained
# byte model's loss 5.59 vs ln 256 = 5.545 (with data/ prepared: the StoryTokenizer stream, ln 4096 =
# 8.32).
# <!-- END RUBRIC -->

# %% [markdown]
# ## Every window can be drawn
#
# On a tiny stream of 10 ids with T = 4 there are 10 - 4 = 6 valid starts (0..5). We count how often each is drawn.

# %%
tiny = torch.arange(10)
xs, _ = get_lm_batch(tiny, 6000, 4, generator=torch.Generator().manual_seed(1))
counts = torch.bincount(xs[:, 0], minlength=10)
print("start counts:", counts.tolist())   # starts 6..9 would run past the end

# %% [markdown]
# ## The loss of an untrained model
#
# A model that knows nothing spreads its bet evenly, so its loss is ln V. A freshly initialised StoryLM-sized model is close to that.

# %%
from g2c.transformer import TransformerLM

model = TransformerLM(V, 64, 2, 4, 64, generator=torch.Generator().manual_seed(0)).eval()
x, y = get_lm_batch(stream, 8, 64, generator=torch.Generator().manual_seed(2))
with torch.no_grad():
    loss = lm_cross_entropy(model(x), y)
print(f"untrained loss {loss.item():.3f}   ln V = {math.log(V):.3f}")
uniform = lm_cross_entropy(torch.zeros(8, 64, V), y)
print(f"uniform logits {uniform.item():.3f}")

# %% [markdown]
# ## A validation split for quick experiments
#
# `split_stream` keeps the tail of the stream for validation. (The ladder splits by story hash instead, before tokenising.)

# %%
train, val = split_stream(stream, val_fraction=0.05)
print(f"train {len(train):,}   val {len(val):,}")

# %% [markdown]
# **Question:** Why does the course split the ladder's data by a hash of each story rather than by cutting the token stream at 95%?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# A cut at 95% would put the last stories of the file (which may share a source or style) only in validation, and could cut a story in half across the two sets. Hashing each story's text assigns whole stories, spread evenly over the corpus, and the assignment stays the same when the corpus is re-read or re-tokenised.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) a cut at 95% could split a story across train and validation and puts whatever
# sits at the end of the file (one source, one style) only in validation; (2) hashing each story's
# text assigns whole stories, spread evenly over the corpus; (3) the assignment is deterministic and
# stable when the corpus is re-read, re-ordered or re-tokenised (recorded in
# data/tinystories/manifest.json). Numbers: about 5% validation (the notebook's fallback byte stream
# splits 3,116 / 164 tokens); the start-position histogram of the batch sampler is flat (about 1000
# per bin) over the allowed starts.
# <!-- END RUBRIC -->
