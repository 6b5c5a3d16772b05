# %% [markdown]
# # 11 · Sampling
#
# Lesson: `docs/modules/11-sampling.md`. We look at what each warper does to a next-token distribution, then generate stories with different settings.

# %%
import os
from pathlib import Path

import matplotlib.pyplot as plt
import torch

from g2c.sampling import apply_repetition_penalty, apply_temperature, generate, top_k_filter, top_p_filter

QUICK = os.environ.get("G2C_QUICK") == "1"
# A made-up next-token distribution over 12 tokens, sorted for readability.
logits = torch.tensor([3.0, 2.5, 2.2, 1.5, 1.0, 0.8, 0.5, 0.2, 0.0, -0.5, -1.0, -2.0])
probs = lambda z: torch.softmax(z, dim=-1)

# %%
views = {
    "T = 0.5": probs(apply_temperature(logits, 0.5)),
    "T = 1": probs(logits),
    "T = 2": probs(apply_temperature(logits, 2.0)),
    "top-k = 3": probs(top_k_filter(logits, 3)),
    "top-p = 0.8": probs(top_p_filter(logits, 0.8)),
    "penalty 2 on {0, 1}": probs(apply_repetition_penalty(logits, torch.tensor([0, 1]), 2.0)),
}
fig, axes = plt.subplots(1, len(views), figsize=(16, 2.6), sharey=True)
for ax, (name, p) in zip(axes, views.items()):
    ax.bar(range(12), p.numpy()); ax.set_title(name, fontsize=9); ax.set_xticks([])
plt.tight_layout(); plt.show()
p = probs(logits)
print("sorted mass:", [round(v, 3) for v in p.cumsum(0)[:5].tolist()])
print("top-p 0.8 keeps", int(torch.isfinite(top_p_filter(logits, 0.8)).sum()), "tokens")

# %% [markdown]
# **Question:** The cumulative mass of the top 3 tokens is below 0.8 and that of the top 4 above. How many tokens does top-p = 0.8 keep, and why not 3?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# Four. Nucleus sampling keeps the smallest set whose mass *reaches* p, so the token that crosses 0.8 is included; with only three tokens the kept mass would be below p. The rule "drop a token when the mass before it is already >= p" gives exactly that.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) four tokens; (2) nucleus sampling keeps the smallest set whose cumulative mass
# reaches p, so the token whose mass crosses 0.8 is included; three tokens hold only 0.741 < 0.8; (3)
# equivalently: drop a token only when the mass before it is already ≥ p. Numbers: sorted cumulative
# mass 0.361, 0.579, 0.741, 0.822, 0.871; "top-p 0.8 keeps 4 tokens".
# <!-- END RUBRIC -->

# %% [markdown]
# ## Generating stories
#
# With the trained StoryLM-1M (from `./checkpoints.sh`) we generate from a prompt; without it, a random tiny model shows the mechanics (its output is noise).

# %%
if Path("artifacts/models/StoryLM-1M/manifest.json").is_file():
    from g2c.assets.artifacts import load_model
    model, tok = load_model("StoryLM-1M", device="cpu")
    encode, decode, eos = tok.encode, tok.decode, tok.eot_id
else:
    from g2c.transformer import TransformerLM
    print("StoryLM-1M not found: using a random byte-level model")
    model = TransformerLM(256, 32, 1, 2, 64, generator=torch.Generator().manual_seed(0))
    encode = lambda s: list(s.encode())
    decode = lambda ids: bytes(ids).decode(errors="replace")
    eos = None
prompt = encode("Once upon a time, there was a little")
N = 30 if QUICK else 80
settings = {
    "greedy": dict(temperature=0.0),
    "T=0.8, top-k 40": dict(temperature=0.8, top_k=40),
    "T=1.0, top-p 0.9": dict(temperature=1.0, top_p=0.9),
    "T=1.5 (no filter)": dict(temperature=1.5),
    "greedy + penalty 1.3": dict(temperature=0.0, repetition_penalty=1.3),
}
for name, kw in settings.items():
    out = generate(model, prompt, N, eos_id=eos, generator=torch.Generator().manual_seed(0), **kw)
    print(f"--- {name}\n{decode(out.tolist())}\n")

# %% [markdown]
# ## Same seed, same story
#
# A `torch.Generator` makes sampling reproducible: the draws happen on the CPU, so the same seed gives the same text on any device.

# %%
a = generate(model, prompt, 20, top_k=40, generator=torch.Generator().manual_seed(7))
b = generate(model, prompt, 20, top_k=40, generator=torch.Generator().manual_seed(7))
c = generate(model, prompt, 20, top_k=40, generator=torch.Generator().manual_seed(8))
print("seed 7 twice identical:", torch.equal(a, b), "  seed 8 differs:", not torch.equal(a, c))

# %% [markdown]
# **Question:** Greedy decoding of a small model often loops ("... and they played and they played ..."). Why does greedy loop, and which knob above breaks the loop without making the text random?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# Greedy is deterministic given the context: once a phrase repeats, the context looks like it did the last time and the argmax repeats the phrase again, a fixed point. A repetition penalty lowers the logits of tokens already used, so the argmax moves off the loop while decoding stays deterministic; temperature or top-p also break it, but by adding randomness.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) greedy is a deterministic function of the context; once a phrase repeats, the
# context looks as it did before and the argmax repeats it again (a fixed point); (2) a repetition
# penalty lowers the logits of tokens already in the context, moving the argmax off the loop while
# decoding stays deterministic; (3) temperature, top-k or top-p also break loops but by adding
# randomness. Numbers (StoryLM-30M, "Once upon a time"): plain greedy repeats "she was a big" / "She
# was very excited"; greedy with penalty 1.3 gives a different deterministic story; sampling with seed
# 7 twice is identical, seed 8 differs.
# <!-- END RUBRIC -->
