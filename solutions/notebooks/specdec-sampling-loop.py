# %% [markdown]
# # The sampled speculative loop, drafters and dynamic k
#
# One loop, `speculative_sample`, runs every drafter (a small LM, an MTP head, a model-free
# n-gram matcher) greedy or sampled, and a controller picks the draft length k round by round.
# This notebook checks on the StoryLM ladder that the sampled loop draws from the target's own
# distribution, compares the drafters on open-ended and copy-heavy prompts, and watches the
# cost-model controller choose k.
#
# Lesson: `docs/beyond/specdec-sampling.md`. Run your own module with the stack solved:
# `./notebook.sh specdec-sampling` (the answer key stands in for the modules it needs that you have
# not edited; `--solutions` opens the solved copy).
# `G2C_QUICK=1` shrinks every loop (CI uses it).

# %%
import os

import torch
from tqdm.auto import tqdm  # progress bars: a widget under Jupyter, text elsewhere

from g2c.assets import load_model
from g2c.specdec.sampling.controllers import CostModelK, optimal_k
from g2c.specdec.sampling.draft import Draft
from g2c.specdec.sampling.drafters import Drafter, LMDrafter, NGramDrafter, Sampler
from g2c.specdec.sampling.loop import speculative_sample

QUICK = os.environ.get("G2C_QUICK") == "1"
DEVICE = "auto"
THREADS = None  # torch's default; set 1 on a shared or busy CPU (section 3's controller times the drafter)
if THREADS:
    torch.set_num_threads(THREADS)
torch.manual_seed(0)

target, tok = load_model("StoryLM-5M" if QUICK else "StoryLM-30M", device=DEVICE)
small, _ = load_model("StoryLM-1M", device=DEVICE)
print(f"target {target.num_parameters():,} parameters on {target.device}; drafter {small.num_parameters():,}; "
      f"{torch.get_num_threads()} torch threads")

# %% [markdown]
# ## 1. The sampled loop draws from the target's distribution
#
# With a budget of one token the loop does one round: the drafter samples x ~ q, the target
# accepts it with probability min(1, p(x)/q(x)) or resamples from the residual. The emitted
# token must follow p, the target's warped distribution after the prompt, whatever q is.
# We compare the empirical distribution of many one-token runs with p itself (total variation).

# %%
prompt = tok.encode("Once upon a time, there was a little")
sampler = Sampler(1.0, top_k=20)
with torch.no_grad():
    p = sampler.probs(target(torch.tensor([prompt], device=target.device))[0, -1]).cpu()
    q = sampler.probs(small(torch.tensor([prompt], device=small.device))[0, -1]).cpu()
runs = 60 if QUICK else 400
g = torch.Generator().manual_seed(0)
counts = torch.zeros_like(p)
for _ in tqdm(range(runs), desc="one-token runs", unit="run"):
    out, _ = speculative_sample(target, LMDrafter(small, sample=True), prompt, 1, k=1, temperature=1.0, top_k=20,
                                generator=g)
    counts[out[-1]] += 1
tv = 0.5 * (counts / runs - p).abs().sum()
print(f"acceptance rate sum(min(p, q)) = {torch.minimum(p, q).sum():.3f}")
print(f"TV(empirical, p) = {tv:.3f} over {runs} runs; TV(q, p) = {0.5 * (q - p).abs().sum():.3f}")

# %% [markdown]
# **Question:** The empirical TV above is not zero. How large would you expect it to be if the
# loop is exactly right, and how would you tell "exactly right" from "resamples from p instead
# of the residual"? (Hint: the test file does this with a chi-square bound.)

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# With n samples and the 20 tokens top-k leaves, each empirical frequency has standard deviation
# sqrt(p(1 − p)/n), so E[TV] ≈ ½ Σ sqrt(2 p(x)/(π n)); for a spread-out p over 20 tokens and
# n = 400 that is about 0.1 (larger for n = 60), so a TV of that size is sampling noise, not a bug.
# To separate the right sampler from the resample-from-p bug, compute what the bug would produce:
# min(p, q) + (1 − Σ min(p, q)) · p. Its distance from p grows with the rejection rate, and a
# chi-square statistic over many runs (table-lookup models make them cheap) compares observed
# counts with n·p against a tail bound, as `test_wrong_verifiers_are_rejected` does.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# Full marks: (1) the sampling-noise scale of TV, of order sqrt(support/n) (about 0.1 at n = 400 here);
# (2) the wrong variant's distribution written out, min(p, q) + (1 − Σ min(p, q)) p;
# (3) a statistical test with a derived threshold (chi-square or TV bound), many runs, fixed seed.
# Expect TV(empirical, p) in 0.05–0.15 and acceptance Σ min(p, q) around 0.6–0.8 on the 30M/1M pair.
# <!-- END RUBRIC -->

# %% [markdown]
# ## 2. Drafters on open-ended and copy-heavy text
#
# The n-gram drafter costs nothing (no forward pass) but can only copy what the context already
# holds. Greedy decoding, k = 4, the same prompts for every drafter.

# %%
OPEN = ["Once upon a time", "One day, a boy named Tim went to", "The sun was shining and the birds"]
COPY = ['Lily said, "I love my mom. I love my dad. I love my dog." Then Lily said it again: "I love my mom.',
        "The dog said woof. The dog said woof. The dog said woof. The dog said woof. The dog",
        "Knock, knock. Who is there? It is Sam. Knock, knock. Who is there? It is Lily. Knock, knock. Who is there?"]
new_tokens = 16 if QUICK else 48


def tokens_per_pass(make_drafter, prompts, **kw):
    passes = generated = 0
    for text in tqdm(prompts, desc="prompts", unit="prompt", leave=False):
        _, stats = speculative_sample(target, make_drafter(), tok.encode(text), new_tokens, k=4, temperature=0.0,
                                      eos_id=tok.eot_id, **kw)
        passes, generated = passes + stats.target_passes, generated + stats.generated
    return generated / passes


for name, make in [("StoryLM-1M", lambda: LMDrafter(small)), ("n-gram", lambda: NGramDrafter())]:
    print(f"{name:>10}: open-ended {tokens_per_pass(make, OPEN):.2f} tokens/pass, "
          f"copy-heavy {tokens_per_pass(make, COPY):.2f} tokens/pass")

# %% [markdown]
# ### Exercise: the earliest-match rule
#
# Our `ngram_lookup` copies after the *most recent* earlier occurrence of the suffix.
# transformers' prompt lookup takes the *earliest* occurrence whose continuation is non-empty.
# Write that drafter (n from `max_n` down to 1, first occurrence scanning from the start) and
# compare its tokens per pass with `NGramDrafter` on the copy-heavy prompts.

# %%
class EarliestNGram(Drafter):
    """Prompt lookup with transformers' rule: the earliest earlier occurrence wins."""

    def __init__(self, max_n: int = 3) -> None:
        self.max_n = max_n
        self.vocab_size = None

    def propose(self, context_ids, k):
        # BEGIN SOLUTION
        seq = context_ids.tolist()
        for n in range(min(self.max_n, len(seq) - 1), 0, -1):
            suffix = seq[-n:]
            for i in range(len(seq) - n):
                if seq[i:i + n] == suffix:
                    return Draft(torch.tensor(seq[i + n:i + n + k], dtype=torch.long))
        return Draft.empty()
        # END SOLUTION


print(f"earliest match: copy-heavy {tokens_per_pass(EarliestNGram, COPY):.2f} tokens/pass; "
      f"most recent: {tokens_per_pass(NGramDrafter, COPY):.2f}")

# %% [markdown]
# ## 3. Choosing k as you go
#
# `CostModelK` estimates the per-token acceptance α̂ and the draft cost ĉ (seconds per draft token
# over seconds per target pass) and picks the k that maximises
# $\dfrac{1 - \hat\alpha^{k+1}}{(1 - \hat\alpha)(1 + k \hat c)}$.

# %%
ctl = CostModelK(4, k_max=8)
trace = []
speculative_sample(target, LMDrafter(small), tok.encode(OPEN[0]), new_tokens, temperature=0.0, controller=ctl,
                   on_pass=lambda emitted, n: trace.append(ctl.next_k()))
print("k per round:", trace)
print(f"alpha_hat = {ctl.alpha:.2f}, c_hat = {ctl.c:.3f} (measured on this machine, "
      f"{torch.get_num_threads()} threads), optimal k = {optimal_k(ctl.alpha, ctl.c, k_max=8)}")
# The question below assumes the 1M drafter settles below the cap of 8: check it on YOUR numbers.
settles = optimal_k(ctl.alpha, ctl.c, k_max=8) < 8
print(f"StoryLM-1M settles below the cap: {settles}" + ("" if settles else
      " (c_hat is a timing: a busy machine or a GPU measures another c; set THREADS = 1 on a busy CPU and re-run)"))
for c in (0.0, 0.05, 0.2, 0.5):
    print(f"  c = {c:4.2f}: optimal k at alpha 0.5 / 0.7 / 0.9 = "
          f"{[optimal_k(a, c, k_max=8) for a in (0.5, 0.7, 0.9)]}")

# %% [markdown]
# **Question:** Why does the rule push k to its cap for the n-gram drafter on copy-heavy text,
# while for StoryLM-1M it settles on a small k? And why can the trace above (k chosen in the
# `on_pass` callback, before the controller's update) lag one round behind?

# %% [markdown]
# **Answer:**
#
# <!-- BEGIN ANSWER -->
# The n-gram drafter's cost is a scan of the context, so ĉ ≈ 0 and the objective becomes
# $(1 - \alpha^{k+1})/(1 - \alpha)$, which only grows with k: every extra draft is free and the target
# verifies k+1 rows for about the price of one on an uncached model. StoryLM-1M costs about a
# tenth of a 30M pass per token on a CPU, and its acceptance on open-ended text is around 0.6–0.7,
# so the numerator saturates at 1/(1 − α) while the denominator 1 + k c keeps growing: the optimum
# sits at k ≈ 3–5. The trace lags because `on_pass` runs before `controller.update` in a round,
# so it prints the k chosen for the round that just ran, not the next one.
# <!-- END ANSWER -->
#
# <!-- BEGIN RUBRIC -->
# Full marks: c ≈ 0 makes the objective increasing in k (to the cap); a drafter with c ≈ 0.1
# trades the saturating numerator against 1 + k c (optimum 3–5 for α 0.6–0.7); the ordering of
# `on_pass` and `update` in the loop. Expect α̂ ≈ 0.6–0.7 and ĉ ≈ 0.05–0.3 on a CPU (it depends on
# load), optimal k 3–6 for the 1M drafter.
# <!-- END RUBRIC -->

# %% [markdown]
# ## 4. The greedy loop on the KV cache: speculation as a state transaction
#
# `speculative_generate_cached` (provided, `g2c/specdec/sampling/cached.py`) drafts with the
# drafter's module 16 cache, verifies k drafts in one cached target pass (k+1 rows), then crops
# both caches to the committed boundary. `on_round` sees each round's accounting.

# %%
from g2c.specdec.sampling.cached import speculative_generate_cached, summarize_rounds

records = []
out, stats = speculative_generate_cached(target, small, torch.tensor(prompt), 16 if QUICK else 48, k=4,
                                         on_round=records.append)
print(tok.decode(out.tolist()))
print(stats)
for r in records[:6]:
    print(f"draft {r.draft} accepted {r.accepted}: reserved {r.kv_rows_reserved} rows, "
          f"rolled back {r.kv_rows_rolled_back}, bytes moved {r.rollback_bytes_moved}, length {r.committed_length}")
print(summarize_rounds(records))

# %% [markdown]
# **Question:** After a round, the target's cache holds every committed token but the last.
# Why not the last one too? And why can the rows of rejected drafts, still sitting in the
# buffer, never leak into a later step?

# %% [markdown]
# **Answer:**
# <!-- BEGIN ANSWER -->
# The last committed token is the correction or bonus token: the target produced it from the
# logits of the previous row, so its own keys and values have never been computed. It is
# *pending*: the next verification pass feeds it first, followed by the new drafts, which is
# why every pass reserves k+1 rows. The rejected rows are past the pointer after `crop`:
# every read slices `[:length]` (plus the rows being written by the current append), and the
# next `append` writes exactly at the pointer, overwriting them before anything could attend to
# them. The test `test_rejected_rows_can_never_be_read` fills those rows with NaN after every
# round and still gets the exact greedy output.
# <!-- END ANSWER -->
# <!-- BEGIN RUBRIC -->
# Full marks: pending token argument (its K/V need a pass that has not happened); reads bounded
# by the pointer; next append overwrites from the pointer; rollback copies 0 bytes. Mentions
# that the committed rows equal plain cached decoding (the state half of losslessness).
# <!-- END RUBRIC -->
