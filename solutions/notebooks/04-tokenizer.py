# %% [markdown]
# # 04 · Byte-level BPE and the StoryTokenizer
#
# Lesson: `docs/modules/04-tokenizer.md`. We tokenize TinyStories-style sentences with the
# shipped StoryTokenizer (vocab 4096), look at the pieces, and measure how many characters
# one token covers.

# %%
from g2c.assets import load_story_tokenizer
from g2c.tokenizer import BPETokenizer

tok = load_story_tokenizer()
print("vocab size:", tok.vocab_size, " eot id:", tok.eot_id, " merges:", len(tok.merges))

# %%
text = "Once upon a time, there was a little girl named Lily. She loved to play with her red ball."
ids = tok.encode(text)
pieces = [tok.decode([i]) for i in ids]
print(len(text), "characters ->", len(ids), "tokens")
print(" | ".join(repr(p)[1:-1] for p in pieces))
assert tok.decode(ids) == text
assert ids == tok.encode_batch_fast([text])[0]  # same ids as the tokenizers library

# %% [markdown]
# ## Compression: characters per token

# %%
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

# %% [markdown]
# ## Special tokens are never split

# %%
two = "The end.<|endoftext|>Once upon a time"
print(tok.encode(two))
print([tok.decode([i]) for i in tok.encode(two)])

# %% [markdown]
# ## Train a tiny tokenizer yourself

# %%
corpus = [text, "Lily and her dog played in the park all day.", "The little dog was happy."] * 20
small = BPETokenizer.train(corpus, vocab_size=300, show_progress=False)
print("first merges:", small.merges[:8])
print([small.decode([i]) for i in small.encode("Lily played with the little dog.")])

# %% [markdown]
# **Question:** The StoryTokenizer gets well over 3 characters per token on a TinyStories
# sentence but far fewer on the rare-word, French and emoji samples. Why? What does this
# mean for a model trained with it when it sees such text?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# BPE merges the pairs that were frequent in its training corpus: simple English
# story words (" the", " little", " Lily") became single tokens, while rare English words,
# other languages and emoji were seen rarely or never, so they fall back to short pieces or
# even single bytes (an emoji is 4 bytes, often 4 tokens). The model then spends more
# positions of its 256-token context on such text and has seen those pieces in fewer
# contexts, so it models them worse.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# A full answer: (1) BPE merges the pairs that were frequent in the training corpus, so common
# TinyStories words became single tokens; (2) rare words, numbers, other languages and emoji were rare
# or absent there, so they fall back to short pieces or single bytes (the emoji sample is 17 bytes and
# 17 tokens); (3) consequence for the model: more of the 256-token context is spent on such text and
# each piece was seen in fewer contexts, so it is modelled worse. Numbers (StoryTokenizer, vocab 4096,
# 3839 merges): story 90 chars -> 22 tokens (4.09 chars/token); rare words 2.28, numbers 1.58, French
# 2.09, emoji 0.29 chars/token.
# <!-- END RUBRIC -->
