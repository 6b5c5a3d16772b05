# %% [markdown]
# # 03 · Neural-network building blocks
#
# Lesson: `docs/modules/03-nn.md`. Your layers live in `g2c/nn/layers.py`; run this notebook
# with `./notebook.sh 03`; `./notebook.sh 03 --solutions` opens the worked version.
#
# We check our `LayerNorm` and `GELU` against torch's, look at the shape of GELU, and count
# the parameters of a tiny two-layer network built from our own `Module`.

# %%
import matplotlib.pyplot as plt
import torch

from g2c.nn import GELU, Dropout, LayerNorm, Linear, Module, resolve_device

torch.manual_seed(0)
print("device:", resolve_device("auto"))

# %% [markdown]
# ## LayerNorm against `torch.nn.LayerNorm`

# %%
D = 16
x = torch.randn(4, 10, D) * 3 + 1
ours, ref = LayerNorm(D), torch.nn.LayerNorm(D)
diff = (ours(x) - ref(x)).abs().max().item()
print(f"max |ours - torch| = {diff:.2e}")
y = ours(x)
print("largest |row mean| (should be ~0):", y.mean(-1).abs().max().item())
print("average biased row std (should be ~1):", y.std(-1, unbiased=False).mean().item())

# %% [markdown]
# ## GELU, exact and tanh-approximated, next to ReLU

# %%
z = torch.linspace(-4, 4, 401)
plt.plot(z, GELU()(z), label="GELU (erf, ours)")
plt.plot(z, torch.nn.GELU(approximate="tanh")(z), "--", label="GELU (tanh approx.)")
plt.plot(z, torch.relu(z), ":", label="ReLU")
plt.legend(); plt.grid(alpha=0.3); plt.title("activations")
plt.show()
gap = (GELU()(z) - torch.nn.GELU(approximate="tanh")(z)).abs().max().item()
print(f"largest gap between exact and tanh GELU on [-4, 4]: {gap:.1e}")
print("min of GELU:", GELU()(z).min().item())


# %% [markdown]
# ## A tiny network on our `Module`

# %%
class MLP(Module):
    def __init__(self, d, hidden, p=0.1):
        super().__init__()
        self.up = Linear(d, hidden)
        self.act = GELU()
        self.drop = Dropout(p, generator=torch.Generator().manual_seed(0))
        self.down = Linear(hidden, d)
        self.norm = LayerNorm(d)

    def forward(self, x):
        return self.norm(x + self.drop(self.down(self.act(self.up(x)))))

mlp = MLP(8, 32)
for name, p in mlp.named_parameters():
    print(f"{name:12s} {tuple(p.shape)}")
print("parameters:", mlp.num_parameters(), "= 8*32+32 + 32*8+8 + 8+8")
x = torch.randn(2, 8)
print("train mode twice equal?", torch.equal(mlp(x), mlp(x)))
mlp.eval()
print("eval mode twice equal? ", torch.equal(mlp(x), mlp(x)))

# %% [markdown]
# **Question:** `LayerNorm` divides by the *biased* standard deviation (÷D). For a row of
# width D = 2, what does LayerNorm output (ignoring ε, with γ = 1, β = 0), whatever the two
# input values are? What does that tell you about very narrow LayerNorms?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# For x = (a, b) with a ≠ b, the mean is (a+b)/2 and the biased variance is
# ((a−b)/2)², so the output is (±1, ∓1): the row is reduced to a sign. LayerNorm removes two
# degrees of freedom (the mean and the scale) from every row, which is negligible for
# D = 128…512 but destroys almost all information for tiny D.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) computes the output for x = (a, b), a ≠ b: mean (a+b)/2, biased variance
# ((a−b)/2)², so the output is (+1, −1) or (−1, +1) (and (0, 0) when a = b, where ε takes over); (2)
# says the row keeps only the sign of a − b; (3) concludes that LayerNorm removes two degrees of
# freedom (mean and scale) per row, negligible at the ladder's D = 128, 256, 512 but ruinous for very
# small D. Numbers from the notebook: max |ours − torch| about 5e-7, row means about 1e-7, biased row
# std 1.000 (0.99999...).
# <!-- END RUBRIC -->
