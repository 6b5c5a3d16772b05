# %% [markdown]
# # 06 · Cross-entropy and perplexity
#
# Lesson: `docs/modules/06-lm.md`. We score two very simple "language models" on the same
# stories: a uniform model and a unigram model that ignores context and predicts each token
# with its frequency.

# %%
import math
from collections import Counter

import torch

from g2c.assets import load_story_tokenizer
from g2c.lm import cross_entropy, log_softmax, perplexity

tok = load_story_tokenizer()
V = tok.vocab_size
train_text = [
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "One day, Lily saw a big dog in the park. The dog was happy and wagged its tail.",
    "Tom had a red ball. He liked to throw the ball to his friend Sam.",
    "The sun was hot, so Mom gave Lily a cold drink. Lily said, \"Thank you, Mom!\"",
    "The little bird sang a song. The cat listened and smiled.",
] * 4
held_out = "Once upon a time, there was a little boy named Tom. He loved to play with his dog in the park."
train_ids = [i for s in train_text for i in tok.encode(s) + [tok.eot_id]]
test_ids = torch.tensor(tok.encode(held_out))
print(len(train_ids), "training tokens,", len(test_ids), "held-out tokens, V =", V)

# %% [markdown]
# ## Stable log-softmax

# %%
z = torch.tensor([[1000.0, 999.0, 0.0]])
print("naive:", torch.log(torch.exp(z) / torch.exp(z).sum()))
print("ours: ", log_softmax(z))

# %% [markdown]
# ## Uniform versus unigram

# %%
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

# %% [markdown]
# **Question:** The unigram model beats the uniform one by a wide margin, yet it would
# generate gibberish. What does its perplexity measure, and what information does it still
# ignore that a transformer can use?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# Perplexity is exp of the average surprise per token on held-out text: the
# unigram model is, on average, as unsure as a fair choice among that many tokens, because it
# knows which tokens are common (" the", ".", " a"). It ignores all context, so it gives
# " the" the same probability after "Once upon a" as after "the"; a transformer conditions on
# the previous tokens and can drive the perplexity much lower. (On this tiny training set
# the unigram model also suffers from tokens it never saw, which smoothing only partly fixes.)
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) perplexity = exp(mean negative log-likelihood per held-out token), the effective
# number of equally likely choices; (2) the unigram model only knows how frequent each token is, so it
# beats uniform; (3) it ignores all context (word order, the previous tokens), which a transformer
# conditions on; mentions unseen tokens / smoothing as a bonus. Numbers: uniform loss 8.318 nats,
# perplexity 4096 (= V); unigram loss 5.164 nats, perplexity about 175 on 24 held-out tokens; the
# naive log-softmax gives nan/−inf where ours stays finite (−1000.3).
# <!-- END RUBRIC -->
