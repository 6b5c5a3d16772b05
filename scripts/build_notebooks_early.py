"""One-off generator for the clean notebooks of modules 03, 03b, 04, 05, 06."""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "notebooks" / "clean"


def md(s: str):
    return new_markdown_cell(s.strip("\n"))


def code(s: str):
    return new_code_cell(s.strip("\n"))


NB: dict[str, list] = {}

NB["03-nn"] = [
    md("""
# 03 · Neural-network building blocks

Lesson: `docs/modules/03-nn.md`. Your layers live in `g2c/nn/layers.py`; run this notebook
with `./notebook.sh 03` (add `--solutions` to use the reference).

We check our `LayerNorm` and `GELU` against torch's, look at the shape of GELU, and count
the parameters of a tiny two-layer network built from our own `Module`.
"""),
    code("""
import torch
import matplotlib.pyplot as plt
from g2c.nn import GELU, Dropout, LayerNorm, Linear, Module, resolve_device

torch.manual_seed(0)
print("device:", resolve_device("auto"))
"""),
    md("## LayerNorm against `torch.nn.LayerNorm`"),
    code("""
D = 16
x = torch.randn(4, 10, D) * 3 + 1
ours, ref = LayerNorm(D), torch.nn.LayerNorm(D)
diff = (ours(x) - ref(x)).abs().max().item()
print(f"max |ours - torch| = {diff:.2e}")
y = ours(x)
print("per-row mean ~0:", y.mean(-1).abs().max().item(), " per-row (biased) std ~1:", y.std(-1, unbiased=False).mean().item())
"""),
    md("## GELU, exact and tanh-approximated, next to ReLU"),
    code("""
z = torch.linspace(-4, 4, 401)
plt.plot(z, GELU()(z), label="GELU (erf, ours)")
plt.plot(z, torch.nn.GELU(approximate="tanh")(z), "--", label="GELU (tanh approx.)")
plt.plot(z, torch.relu(z), ":", label="ReLU")
plt.legend(); plt.grid(alpha=0.3); plt.title("activations")
plt.show()
gap = (GELU()(z) - torch.nn.GELU(approximate="tanh")(z)).abs().max().item()
print(f"largest gap between exact and tanh GELU on [-4, 4]: {gap:.1e}")
print("min of GELU:", GELU()(z).min().item())
"""),
    md("## A tiny network on our `Module`"),
    code("""
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
"""),
    md("""
**Question:** `LayerNorm` divides by the *biased* standard deviation (÷D). For a row of
width D = 2, what does LayerNorm output (ignoring ε, with γ = 1, β = 0), whatever the two
input values are? What does that tell you about very narrow LayerNorms?
"""),
    md("""
**Answer:** For x = (a, b) with a ≠ b, the mean is (a+b)/2 and the biased variance is
((a−b)/2)², so the output is (±1, ∓1): the row is reduced to a sign. LayerNorm removes two
degrees of freedom (the mean and the scale) from every row, which is negligible for
D = 128…512 but destroys almost all information for tiny D.
"""),
]

NB["03b-training"] = [
    md("""
# 03b · Training controls: AdamW, clipping, warmup + cosine

Lesson: `docs/modules/03b-training.md`. We plot the learning-rate schedule, run our AdamW
and torch's side by side on the same problem, and watch clipping at work.
"""),
    code("""
import os
import torch
import matplotlib.pyplot as plt
from g2c.training import AdamW, clip_grad_norm_, cosine_with_warmup

QUICK = os.environ.get("G2C_QUICK") == "1"
STEPS = 60 if QUICK else 300
"""),
    md("## The schedule"),
    code("""
warm, total = 100, 1000
lrs = [cosine_with_warmup(s, warmup_steps=warm, max_steps=total, max_lr=3e-3, min_lr=3e-4) for s in range(1200)]
plt.plot(lrs); plt.axvline(warm, ls=":", c="grey"); plt.axvline(total, ls=":", c="grey")
plt.xlabel("step"); plt.ylabel("lr"); plt.title("linear warmup, cosine decay, then constant")
plt.show()
print("lr at steps 0, 99, 100, 550, 1000, 1100:", [round(lrs[s], 6) for s in (0, 99, 100, 550, 1000, 1100)])
"""),
    md("## Our AdamW against `torch.optim.AdamW`"),
    code("""
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
"""),
    md("## Clipping"),
    code("""
p = torch.zeros(3, requires_grad=True)
for scale in (0.1, 1.0, 10.0, 1000.0):
    p.grad = torch.tensor([1.0, 2.0, 2.0]) * scale  # norm 3·scale
    before = clip_grad_norm_([p], max_norm=1.0)
    print(f"norm before {before:8.1f}   after {p.grad.norm().item():.4f}")
"""),
    md("""
**Question:** In the AdamW plot the first step moves every coordinate of w by almost
exactly `lr`, no matter how large its gradient. Why? And what does that suggest about why
a warmup helps at the start of training?
"""),
    md("""
**Answer:** At t = 1, bias correction gives m̂ = g and v̂ = g², so the update is
lr·g/(|g| + ε) ≈ lr·sign(g): a full-size step in every coordinate based on a single noisy
gradient, because v̂ is estimated from one sample. Early on the second-moment estimate is
poor and the weights are random, so large steps are risky; a warmup keeps lr small until
m and v average over many batches.
"""),
]

NB["04-tokenizer"] = [
    md("""
# 04 · Byte-level BPE and the StoryTokenizer

Lesson: `docs/modules/04-tokenizer.md`. We tokenize TinyStories-style sentences with the
shipped StoryTokenizer (vocab 4096), look at the pieces, and measure how many characters
one token covers.
"""),
    code("""
from g2c.tokenizer import BPETokenizer, load_story_tokenizer

tok = load_story_tokenizer()
print("vocab size:", tok.vocab_size, " eot id:", tok.eot_id, " merges:", len(tok.merges))
"""),
    code("""
text = "Once upon a time, there was a little girl named Lily. She loved to play with her red ball."
ids = tok.encode(text)
pieces = [tok.decode([i]) for i in ids]
print(len(text), "characters ->", len(ids), "tokens")
print(" | ".join(repr(p)[1:-1] for p in pieces))
assert tok.decode(ids) == text
assert ids == tok.encode_batch_fast([text])[0]  # same ids as the tokenizers library
"""),
    md("## Compression: characters per token"),
    code("""
samples = {
    "story": text,
    "rare words": "The quantum chromodynamics lecture bewildered the philharmonic orchestra.",
    "numbers": "In 2024, 3.14159 and 1,000,000 appeared 42 times.",
    "French": "Il était une fois une petite fille qui aimait jouer dans le jardin.",
    "emoji": "🐱🐶🦊 🎉",
}
for name, s in samples.items():
    n = len(tok.encode(s))
    print(f"{name:10s} {len(s):4d} chars {len(s.encode()):4d} bytes {n:4d} tokens  {len(s) / n:4.2f} chars/token")
"""),
    md("## Special tokens are never split"),
    code("""
two = "The end.<|endoftext|>Once upon a time"
print(tok.encode(two))
print([tok.decode([i]) for i in tok.encode(two)])
"""),
    md("## Train a tiny tokenizer yourself"),
    code("""
corpus = [text, "Lily and her dog played in the park all day.", "The little dog was happy."] * 20
small = BPETokenizer.train(corpus, vocab_size=300, show_progress=False)
print("first merges:", small.merges[:8])
print([small.decode([i]) for i in small.encode("Lily played with the little dog.")])
"""),
    md("""
**Question:** The StoryTokenizer gets well over 3 characters per token on a TinyStories
sentence but far fewer on the rare-word, French and emoji samples. Why? What does this
mean for a model trained with it when it sees such text?
"""),
    md("""
**Answer:** BPE merges the pairs that were frequent in its training corpus: simple English
story words (" the", " little", " Lily") became single tokens, while rare English words,
other languages and emoji were seen rarely or never, so they fall back to short pieces or
even single bytes (an emoji is 4 bytes, often 4 tokens). The model then spends more
positions of its 256-token context on such text and has seen those pieces in fewer
contexts, so it models them worse.
"""),
]

NB["05-embeddings"] = [
    md("""
# 05 · Token embeddings and learned positions

Lesson: `docs/modules/05-embeddings.md`. We build the GPT-2 input layer (token vector plus
position vector) and compare how similar position vectors are, at initialisation and,
when the ladder artifacts are installed, after training.
"""),
    code("""
from pathlib import Path

import torch
import matplotlib.pyplot as plt
from g2c.embeddings import embed_tokens_and_positions
from g2c.nn import Embedding

g = torch.Generator().manual_seed(0)
V, T_max, D = 4096, 64, 32
tok_emb = Embedding(V, D, generator=g)
pos_emb = Embedding(T_max, D, generator=g)
ids = torch.randint(0, V, (2, 10), generator=g)
x = embed_tokens_and_positions(ids, tok_emb, pos_emb)
print("ids", tuple(ids.shape), "-> vectors", tuple(x.shape))
"""),
    md("## Same token, different positions"),
    code("""
same = torch.full((1, 5), 7)  # token 7 five times
v = embed_tokens_and_positions(same, tok_emb, pos_emb)[0]
print("distinct vectors for the same token:", len({tuple(r.tolist()) for r in v}))
try:
    embed_tokens_and_positions(torch.zeros(1, T_max + 1, dtype=torch.long), tok_emb, pos_emb)
except ValueError as e:
    print("too long:", e)
"""),
    md("## Cosine similarity between position vectors"),
    code("""
def cos_sim(w):
    w = w / w.norm(dim=-1, keepdim=True)
    return w @ w.T

tables = {"random init": pos_emb.weight.detach()}
ckpt = Path("artifacts/models/StoryLM-1M/model.safetensors")
if ckpt.is_file():
    from g2c.artifacts import load_model
    model, _ = load_model("StoryLM-1M", device="cpu")
    tables["StoryLM-1M (trained)"] = model.pos_embed.weight.detach()[:T_max]
else:
    print("ladder not installed (./checkpoints.sh): showing the random table only")

fig, axes = plt.subplots(1, len(tables), figsize=(5 * len(tables), 4), squeeze=False)
for ax, (name, w) in zip(axes[0], tables.items()):
    im = ax.imshow(cos_sim(w), vmin=-1, vmax=1, cmap="RdBu_r")
    ax.set_title(name); ax.set_xlabel("position"); ax.set_ylabel("position")
fig.colorbar(im, ax=axes[0].tolist())
plt.show()
for name, w in tables.items():
    s = cos_sim(w)
    print(f"{name:22s} mean cos(neighbours) {s.diagonal(1).mean():.3f}   mean cos(10 apart) {s.diagonal(10).mean():.3f}")
"""),
    md("""
**Question:** At initialisation, neighbouring position vectors are nearly orthogonal
(cosine ≈ 0). After training they tend to be similar to their neighbours and less similar
to far-away positions. Why would training produce that structure, although nothing in the
architecture asks for it?
"""),
    md("""
**Answer:** Random Gaussian vectors in D dimensions have cosine ≈ 0 ± 1/√D. During training,
what the model needs from "position 37" is almost the same as what it needs from position
38 (text statistics change smoothly with distance), so the gradients pushing neighbouring
rows are similar and the rows drift together. The smooth band around the diagonal is the
model having learned a notion of distance from data alone.
"""),
]

NB["06-lm"] = [
    md("""
# 06 · Cross-entropy and perplexity

Lesson: `docs/modules/06-lm.md`. We score two very simple "language models" on the same
stories: a uniform model and a unigram model that ignores context and predicts each token
with its frequency.
"""),
    code("""
import math
from collections import Counter

import torch
from g2c.lm import cross_entropy, log_softmax, perplexity
from g2c.tokenizer import load_story_tokenizer

tok = load_story_tokenizer()
V = tok.vocab_size
train_text = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "One day, Lily saw a big dog in the park. The dog was happy and wagged its tail.",
    "Tom had a red ball. He liked to throw the ball to his friend Sam.",
    "The sun was hot, so Mom gave Lily a cold drink. Lily said, \\"Thank you, Mom!\\"",
    "The little bird sang a song. The cat listened and smiled.",
] * 4
held_out = "Once upon a time, there was a little boy named Tom. He loved to play with his dog in the park."
train_ids = [i for s in train_text for i in tok.encode(s) + [tok.eot_id]]
test_ids = torch.tensor(tok.encode(held_out))
print(len(train_ids), "training tokens,", len(test_ids), "held-out tokens, V =", V)
"""),
    md("## Stable log-softmax"),
    code("""
z = torch.tensor([[1000.0, 999.0, 0.0]])
print("naive:", torch.log(torch.exp(z) / torch.exp(z).sum()))
print("ours: ", log_softmax(z))
"""),
    md("## Uniform versus unigram"),
    code("""
N = len(test_ids)
uniform_logits = torch.zeros(N, V)
loss_u = cross_entropy(uniform_logits, test_ids)

counts = Counter(train_ids)
alpha = 0.1  # add-alpha smoothing: unseen tokens keep a little probability
probs = torch.tensor([counts.get(i, 0) + alpha for i in range(V)], dtype=torch.float32)
probs /= probs.sum()
unigram_logits = probs.log().expand(N, V)   # the same prediction at every position
loss_g = cross_entropy(unigram_logits, test_ids)

print(f"uniform : loss {loss_u.item():.3f} nats  perplexity {perplexity(loss_u):8.1f}  (log V = {math.log(V):.3f})")
print(f"unigram : loss {loss_g.item():.3f} nats  perplexity {perplexity(loss_g):8.1f}")
top = probs.topk(8).indices.tolist()
print("most likely unigram tokens:", [tok.decode([i]) for i in top])
"""),
    md("""
**Question:** The unigram model beats the uniform one by a wide margin, yet it would
generate gibberish. What does its perplexity measure, and what information does it still
ignore that a transformer can use?
"""),
    md("""
**Answer:** Perplexity is exp of the average surprise per token on held-out text: the
unigram model is, on average, as unsure as a fair choice among that many tokens, because it
knows which tokens are common (" the", ".", " a"). It ignores all context, so it gives
" the" the same probability after "Once upon a" as after "the"; a transformer conditions on
the previous tokens and can drive the perplexity much lower. (On this tiny training set
the unigram model also suffers from tokens it never saw, which smoothing only partly fixes.)
"""),
]


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, cells in NB.items():
        nb = new_notebook(cells=cells, metadata={
            "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
            "language_info": {"name": "python"},
        })
        nbformat.validate(nb)
        path = OUT / f"{name}.ipynb"
        nbformat.write(nb, path)
        print("wrote", path.relative_to(ROOT))


if __name__ == "__main__":
    main()
