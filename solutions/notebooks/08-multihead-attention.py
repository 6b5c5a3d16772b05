# %% [markdown]
# # 08 · Multi-head attention
#
# Lesson: `docs/modules/08-multihead-attention.md`. We check the head layout on a tensor we can read, then look at what each head attends to.

# %%
import matplotlib.pyplot as plt
import torch

from g2c.attention import MultiHeadAttention, merge_heads, scaled_dot_product_attention, split_heads

B, T, D, H = 1, 3, 8, 2
x = torch.arange(B * T * D).view(B, T, D)
print(x[0])

# %% [markdown]
# Each row is one time step. After `split_heads`, head h should hold columns h·d to (h+1)·d of *every* time step.

# %%
s = split_heads(x, H)
print('split_heads, head 0:\n', s[0, 0])
print('split_heads, head 1:\n', s[0, 1])
print('plain view(B, H, T, d), "head 0":\n', x.view(B, H, T, D // H)[0, 0])
print('merge inverts split:', torch.equal(merge_heads(s), x))

# %% [markdown]
# **Question:** The plain `view(B, H, T, d)` has the right shape. What went wrong in its "head 0"?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# `view` only re-reads memory in order, so its head 0 is the first T·d numbers: all of time step 0 and part of time step 1, cut into rows. Time steps get mixed into the head dimension. Viewing as (B, T, H, d) first and then swapping T and H keeps each time step intact.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) `view` re-reads memory in order, so the plain "head 0" is the first T·d numbers:
# time step 0 and part of time step 1 (rows 0-3, 4-7, 8-11 of the example), mixing time into the head
# dimension; (2) the fix views as (B, T, H, d) first and then swaps T and H, so head 0 holds columns
# 0-3 of every time step (0-3, 8-11, 16-19). Numbers: merge inverts split prints True.
# <!-- END RUBRIC -->

# %% [markdown]
# ## One pattern per head
#
# We reproduce the module's forward pass step by step to get each head's weights (identity values again), then draw them side by side.

# %%
B, T, D, H = 1, 12, 32, 4
mha = MultiHeadAttention(D, H, generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    mha.qkv.weight.mul_(20)  # sharper patterns
x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(1))
with torch.no_grad():
    q, k, _ = mha.qkv(x).split(D, dim=-1)
    q, k = split_heads(q, H), split_heads(k, H)                   # (B, H, T, d)
    eye = torch.eye(T).expand(B, H, T, T)
    weights = scaled_dot_product_attention(q, k, eye)[0]          # (H, T, T)
fig, axes = plt.subplots(1, H, figsize=(3 * H, 3))
for h, ax in enumerate(axes):
    ax.imshow(weights[h], cmap='viridis')
    ax.set_title(f'head {h}')
    ax.set_xlabel('key')
axes[0].set_ylabel('query')
plt.tight_layout()
plt.show()

# %% [markdown]
# ## The fused path
#
# `mha.fused = True` swaps in `torch.nn.functional.scaled_dot_product_attention`. It should be the same function of x, up to float round-off.

# %%
with torch.no_grad():
    course = mha(x)
    mha.fused = True
    fused = mha(x)
    mha.fused = False
print('max abs difference:', (course - fused).abs().max().item())
print('parameters:', mha.num_parameters(), '= 4 D^2 + 4 D =', 4 * D * D + 4 * D)

# %% [markdown]
# **Question:** Going from 1 head to 4 heads at the same D, how does the parameter count change?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# Not at all: the projections are still D x 3D and D x D. Heads only change how the query, key and value columns are grouped into separate softmaxes (and each head's scale becomes 1/sqrt(D/H)).
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) unchanged: the projections are still D × 3D (plus 3D bias) and D × D (plus D
# bias), 4D² + 4D parameters; (2) heads only regroup the columns into H separate softmaxes of width
# D/H, and change the scale to 1/√(D/H). Numbers: 4224 = 4·32² + 4·32 parameters for D = 32; our
# attention matches torch's to about 1e-7.
# <!-- END RUBRIC -->
