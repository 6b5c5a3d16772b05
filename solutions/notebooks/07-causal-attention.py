# %% [markdown]
# # 07 · Causal self-attention
#
# Lesson: `docs/modules/07-causal-attention.md`. Run it on your own code; `./notebook.sh 07 --solutions` opens the worked version (reference code and answers).
#
# We look inside one attention layer: the mask, the weights it produces, and why the scores are divided by sqrt(d).

# %%
import math

import matplotlib.pyplot as plt
import torch

from g2c.attention import CausalSelfAttention, causal_mask, scaled_dot_product_attention

torch.manual_seed(0)
print(causal_mask(5).int())

# %% [markdown]
# ## Attention weights as a heatmap
#
# `scaled_dot_product_attention` returns only the weighted values. To *see* the weights, feed it the identity matrix as values: row t of the output is then the weight vector of query t.

# %%
T, D = 10, 16
attn = CausalSelfAttention(D, generator=torch.Generator().manual_seed(0))
with torch.no_grad():  # sharper patterns than the small default initialisation
    for lin in (attn.query, attn.key):
        lin.weight.mul_(25)
x = torch.randn(1, T, D, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    q, k = attn.query(x), attn.key(x)
    eye = torch.eye(T).unsqueeze(0)                      # values = one-hot positions
    weights = scaled_dot_product_attention(q, k, eye)[0]  # (T, T)

print('rows sum to 1:', torch.allclose(weights.sum(-1), torch.ones(T)))
print('upper triangle is exactly 0:', bool((weights.triu(1) == 0).all()))
plt.imshow(weights, cmap='viridis')
plt.xlabel('key position s')
plt.ylabel('query position t')
plt.colorbar(label='weight')
plt.title('causal attention weights')
plt.show()

# %% [markdown]
# **Question:** Why is the first row of the heatmap a single 1 followed by zeros, whatever the input? What does that say about the first position's output?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# Query 0 may only see key 0; every other score is -inf, so after the softmax its one allowed weight is exp(s)/exp(s) = 1. The output at position 0 is just the (projected) value of token 0: the first prediction of a sequence is made from the first token alone.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) query 0 may attend only to key 0; every other score is −inf, so after the softmax
# its single weight is exactly 1; (2) the output at position 0 is the projected value of token 0
# alone, whatever the other tokens are. Numbers: every row sums to 1 and the upper triangle is exactly
# 0 (both printed True).
# <!-- END RUBRIC -->

# %% [markdown]
# ## Why divide by sqrt(d)
#
# For random unit-variance q and k, the dot product has variance d. Without the scale, wide heads saturate the softmax. We measure the largest weight per row (1.0 = one-hot).

# %%
for d in (4, 16, 64, 256):
    q = torch.randn(1000, 8, d)
    k = torch.randn(1000, 8, d)
    scores = q @ k.transpose(-2, -1)
    raw = torch.softmax(scores, -1).amax(-1).mean().item()
    scaled = torch.softmax(scores / math.sqrt(d), -1).amax(-1).mean().item()
    print(f'd={d:4d}  score std {scores.std():6.2f}   max weight: unscaled {raw:.2f}  scaled {scaled:.2f}')

# %% [markdown]
# **Question:** The scaled column stays roughly constant as d grows; the unscaled one tends to 1. Why is a near-one-hot softmax bad for training?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# The softmax gradient is p_i (δ_ij - p_j); when one p is close to 1 and the rest close to 0, every entry is close to 0, so the queries and keys barely learn. Scaling keeps the scores at unit variance, independent of the head width.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) the softmax Jacobian is p_i(δ_ij − p_j); with one p near 1 and the rest near 0
# every entry is near 0, so almost no gradient reaches queries and keys; (2) unscaled dot products of
# d-dimensional unit-variance vectors have std √d, so softmaxes saturate as d grows; scaling by 1/√d
# keeps the scores at unit variance. Numbers: score std 2, 4, 8, 16 for d = 4, 16, 64, 256; max weight
# unscaled 0.53, 0.75, 0.87, 0.94 vs scaled about 0.34-0.36.
# <!-- END RUBRIC -->
