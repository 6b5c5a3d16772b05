# %% [markdown]
# # Draft trees: several guesses where the drafter is unsure
#
# A chain of k drafts bets everything on one guess per position. A **draft tree** keeps a
# few candidates where the drafter hesitates, and the target checks every branch in **one**
# forward pass thanks to a tree attention mask. Verification then walks down the tree and
# keeps the longest branch the target agrees with, plus one token of its own.
#
# In this notebook StoryLM-1M drafts trees for StoryLM-30M. You will look at a dynamic
# (EAGLE-2-style) tree, its mask, check the tree pass against plain passes, compute the
# lecture's tree formula for the expected tokens per pass, and compare chain, static and
# dynamic trees. Lesson: `docs/beyond/specdec-trees.md`.

# %%
import os

import torch

from g2c.assets import load_model
from g2c.nn import resolve_device
from g2c.sampling import generate
from g2c.specdec.trees.attention import tree_attention_mask, tree_forward, tree_logits
from g2c.specdec.trees.verify import greedy_tree_verify, tree_speculative_generate
from g2c.specdec.trees import (
    build_dynamic_tree,
    expected_tokens_per_pass,
    node_acceptance_probs,
)

DEVICE = "auto"
QUICK = os.environ.get("G2C_QUICK", "") == "1"
device = resolve_device(DEVICE)
target, tok = load_model("StoryLM-30M", device=device)
drafter, _ = load_model("StoryLM-1M", device=device)
prompt = tok.encode("Once upon a time, there was a little girl named Lily. She")
ctx = torch.tensor(prompt)
print(f"device {device}; prompt of {len(prompt)} tokens")

# %% [markdown]
# ## 1. A dynamic tree
#
# `build_dynamic_tree` expands, depth by depth, the `width` nodes whose **path probability**
# under the drafter (the product of its probabilities from the root) is highest, then keeps the
# n best nodes overall. Nodes are stored flattened, parents first; `parents[i] = -1` means
# "child of the root" (the root is the last context token).

# %%
tree, passes = build_dynamic_tree(drafter, ctx, 8, width=4)
print(f"{tree.num_nodes} nodes, depth {tree.max_depth}, {passes} drafter passes")
for i in range(tree.num_nodes):
    print(f"node {i}: parent {int(tree.parents[i]):>2}  depth {int(tree.depths[i])}  "
          f"path {tok.decode(tree.path_tokens(i))!r}")

# %% [markdown]
# ## 2. The mask
#
# Each node row sees the whole context, its ancestors and itself: `.` is allowed, `x` masked.
# Only the node columns are printed (every node sees every context column).

# %%
mask = tree_attention_mask(len(prompt), tree.parents)
C = len(prompt)
for i in range(tree.num_nodes):
    print(f"node {i}: " + "".join("." if v == 0 else "x" for v in mask[C + i, C:].tolist()))

# %% [markdown]
# The tree pass must give, at every node, what a plain causal pass over context + that
# node's path gives at its last row:

# %%
logits = tree_forward(target, ctx, tree)
worst = 0.0
with torch.no_grad():
    for i in range(tree.num_nodes):
        plain = target(torch.cat([ctx, torch.tensor(tree.path_tokens(i))]).unsqueeze(0).to(target.device))[0, -1]
        worst = max(worst, float((plain - logits[C + i]).abs().max()))
print(f"largest difference over {tree.num_nodes} nodes: {worst:.2e}")

# %% [markdown]
# ## 3. Your turn: the tree formula
#
# With a(v) the probability that node v is accepted given that its parent was, at most one
# node per depth can be accepted, so
#
# E[tokens per pass] = 1 + sum over nodes v of prod_{u on the path root..v} a(u).
#
# For deterministic drafts verified by sampling at temperature 1, a(v) = p_parent(token_v),
# the target's probability of v's token after v's parent. Compute E[tau] for the tree above
# from the target's probabilities, with a loop over the nodes in flattened order (parents
# first, so the parent's product is ready when you need it). Check it against
# `expected_tokens_per_pass`.

# %%
probs = torch.softmax(tree_logits(target, ctx, tree).cpu(), dim=-1)       # (n+1, V)
a = node_acceptance_probs(tree, probs)                                      # (n,)
# BEGIN SOLUTION
reach = []
for i in range(tree.num_nodes):
    parent = int(tree.parents[i])
    reach.append(float(a[i]) * (1.0 if parent < 0 else reach[parent]))
my_tau = 1.0 + sum(reach)
# END SOLUTION
print(f"E[tau] = {my_tau:.3f}; library: {expected_tokens_per_pass(tree, a):.3f}")
assert abs(my_tau - expected_tokens_per_pass(tree, a)) < 1e-6

# %% [markdown]
# ## 4. Greedy verification of one tree
#
# `greedy_tree_verify` walks from the root: is there a child holding the target's argmax?

# %%
path, token = greedy_tree_verify(tree, tree_logits(target, ctx, tree).cpu())
accepted = tok.decode([int(tree.tokens[i]) for i in path])
print(f"accepted: {accepted!r}, then the target's {tok.decode([token])!r}")

# %% [markdown]
# ## 5. Chain, static tree, dynamic tree
#
# Same node budget n, greedy: the output is identical to plain greedy decoding every time;
# what changes is how many tokens each target pass writes and how many drafter passes it costs.

# %%
new_tokens = 16 if QUICK else 48
reference = generate(target, prompt, new_tokens, temperature=0.0).tolist()
for n in ([4] if QUICK else [4, 8, 16]):
    for kind in ("chain", "static", "dynamic"):
        out, stats = tree_speculative_generate(target, drafter, prompt, new_tokens, tree=kind, num_nodes=n)
        print(f"n={n:>2} {kind:>7}: same as greedy {out.tolist() == reference}; "
              f"tokens/pass {stats.tokens_per_pass:.2f}; drafter passes/pass "
              f"{stats.drafter_passes / stats.target_passes:.1f}")

# %% [markdown]
# **Question:** Medusa's "typical acceptance" accepts a drafted token whenever the target gives
# it enough probability (above min(epsilon, delta * exp(-entropy))). Why does that change the
# distribution of the text, while `tree_speculative_verify` does not?

# %% [markdown]
# **Answer:**
# <!-- BEGIN ANSWER -->
# Typical acceptance decides from p(x) alone and never corrects for how often x was proposed.
# Take p = (0.6, 0.4) and a drafter that always proposes the second token: with a threshold of
# 0.3 it is accepted every time, so it is emitted with probability 1 instead of 0.4. Speculative
# sampling accepts x with probability min(1, p(x)/q(x)), which caps every token's emission
# through the draft at min(p, q), and after a rejection samples from the residual
# max(0, p - q) normalised, which supplies exactly the missing mass p - min(p, q). SpecInfer's
# multi-step version hands that residual to the next sibling instead of sampling it at once;
# each step keeps the invariant "the token finally emitted follows the current residual", so
# the first emitted token follows p for any drafter and any tree (Theorem 4.2).
# <!-- END ANSWER -->
# <!-- BEGIN RUBRIC -->
# Full answer: (1) typical acceptance ignores q and has no residual step, so proposed tokens are
# over-emitted (a concrete counterexample such as the one above); (2) speculative sampling's
# min(1, p/q) plus the residual max(0, p - q) reconstructs p exactly; (3) the tree version
# updates the residual after each rejected sibling. Bonus: typical acceptance trades
# exactness for a higher acceptance rate, which is why Medusa presents it as a quality-preserving,
# not a distribution-preserving, option.
# <!-- END RUBRIC -->

# %% [markdown]
# **Question:** From the table in the lesson (or your own run of section 5), when does the
# dynamic tree beat the chain at the same node budget, and when does the budget stop paying?

# %% [markdown]
# **Answer:**
# <!-- BEGIN ANSWER -->
# A tree pays where the drafter is unsure: there a second or third candidate often holds the
# target's token, so a few siblings buy more accepted tokens than extra depth, whose
# acceptance probability is the product of every node above it. The chain at n = 16 drafts
# deep branches that are almost never reached and pays one drafter pass per draft. The
# dynamic tree puts its budget where the drafter's path probability is high (deep when it is
# confident, wide when it is not) and stops drafting once no deeper node can enter the top n,
# so it needs fewer drafter passes and reaches the highest tokens per pass. The budget stops
# paying when the target's extra verified rows and the drafter's extra passes cost more than
# the extra accepted tokens bring: the chain's tokens per pass barely move from n = 4 to 16
# (2.37 to 2.56) while its drafter passes triple, so it gets slower; the static tree gains
# tokens but not speed beyond n = 8; with sampling, where every acceptance is lower, the
# budget stops paying sooner. On a GPU batch the n + 1 verified rows per request also eat into
# the compute the batch needs.
# <!-- END ANSWER -->
# <!-- BEGIN RUBRIC -->
# Full answer names: entropic positions (several plausible tokens) as where trees win; the
# product structure of deep acceptance (a^depth) as why depth saturates; the drafting cost
# (a chain needs n sequential drafter passes, a static tree its depth, the dynamic tree fewer);
# the verification cost of n + 1 rows versus k + 1. Numbers to expect on the shipped ladder
# (bench/specdec_trees.py, 1 thread, greedy, 48 tokens): tokens per pass 2.37 / 2.49 / 2.56 for
# the chain at n = 4 / 8 / 16 against 2.49 / 2.87 / 3.43 for the dynamic tree; drafter passes per
# target pass 12.2 (chain) vs 4.4 (dynamic) at n = 16; speed-up in CPU time 1.11x (chain, n = 16)
# vs 2.18x (dynamic, n = 16).
# <!-- END RUBRIC -->
