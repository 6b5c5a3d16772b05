# %% [markdown]
# # The draft lineage: Medusa, EAGLE-2, EAGLE-3, block drafting
#
# The speed-up of speculative decoding is about tau / (1 + c): tau is the number of tokens one
# target pass writes, c is what drafting costs in units of a target pass. Each generation of
# drafter in the lecture repairs one weakness of the generation before it. Here all of them draft
# for the same StoryLM-30M, and every one reads the target's own hidden states:
#
# | section | drafter | what it changes |
# |---|---|---|
# | 1, 2 | Medusa heads | no second model; a candidate tree; typical acceptance |
# | 3 | EAGLE, EAGLE-2 | drafts features, not tokens; a dynamic tree |
# | 4 | EAGLE-3 | reads three depths of the target; trained on its own outputs |
# | 5 | block drafter | the whole draft in one pass, so c no longer grows with k |
#
# The exercises live in `g2c/specdec/lineage/` (`medusa_tree`, `typical_accept`, `fusion_layers`,
# `ttt_attention_mask`, `block_loss_weights`); this notebook calls them on the shipped heads.
# Lesson: `docs/beyond/specdec-lineage.md`.

# %%
import math
import os
import statistics
import textwrap
import time

import torch
from tqdm.auto import tqdm  # progress bars: a widget under Jupyter, text elsewhere

from g2c.assets import load_model
from g2c.assets.artifacts import verify_artifact
from g2c.kvcache import KVCache, cached_generate
from g2c.nn import resolve_device, synchronize
from g2c.specdec.lineage import (
    BlockDrafter,
    Eagle3Drafter,
    EagleTreeDrafter,
    MedusaDrafter,
    block_loss_weights,
    eagle3_loss,
    fusion_layers,
    lineage_generate,
    medusa_tree,
    target_layer_pass,
    ttt_attention_mask,
    typical_accept,
    typical_tree_verify,
)
from g2c.specdec.trees import DraftTree, static_choices, tree_speculative_verify

DEVICE = "auto"
QUICK = os.environ.get("G2C_QUICK") == "1"
device = resolve_device(DEVICE)

# Each head arrives with its own frozen StoryLM-30M as `head.base`: the model it was trained on.
# lineage_generate refuses any other target, so every run below verifies with `head.base`.
medusa, tok = load_model("StoryLM-30M-Medusa", device=device)
eagle, _ = load_model("StoryLM-30M-EAGLE", device=device)
eagle3, _ = load_model("StoryLM-30M-EAGLE3", device=device)
block, _ = load_model("StoryLM-30M-Block", device=device)

TEXTS = ["Once upon a time, there was a little girl named Lily. She",
         "Tom and his dog went to the park. They",
         "One day, a little bird found a shiny",
         "The sun was shining and the children"]
prompts = [torch.tensor(tok.encode(t)) for t in TEXTS[:1 if QUICK else 4]]
NEW_TOKENS = 24 if QUICK else 64
print(f"device {device}; {len(prompts)} prompt(s) x {NEW_TOKENS} new tokens; {torch.get_num_threads()} threads")


def states_of(model, ids, layers=()):
    """The target over ids (T,): (T, len(layers) + 1, D) states, the chosen blocks' outputs then the final state."""
    n = ids.numel()
    cache = KVCache.for_model(model)
    _, states = target_layer_pass(model, cache, ids, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril(),
                                  tuple(layers))
    return states


def say(text):
    """Print a long result line wrapped at word boundaries (an output cell would break it mid-word)."""
    print(textwrap.fill(text, 88, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False))


def show(name, stats, ids, want=None):
    same = "" if want is None else f"; same as plain greedy: {ids.tolist() == want.tolist()}"
    say(f"{name:<24} tau {stats.tokens_per_pass:.2f} tokens/pass; acceptance {stats.acceptance_rate:.3f} "
        f"({stats.accepted}/{stats.drafted} drafts); {stats.target_passes} target passes{same}")


def continuation(ctx, ids):
    """The prompt and the text generated after it, cut at the first end of story (<|endoftext|>)."""
    new = ids[len(ctx):].tolist()
    if tok.eot_id is not None and tok.eot_id in new:
        new = new[:new.index(tok.eot_id)]
    say(f"prompt: {tok.decode(ctx.tolist())!r}")
    say(f"its continuation: {tok.decode(new).lstrip()!r}" + (" (the story ends there)" if len(new) < len(ids) - len(ctx)
                                                             else ""))


# %% [markdown]
# The four heads were trained at ONE budget: each saw the same number of target tokens, EAGLE's
# 5,734,400, so the differences below are the methods', not the training budgets'. Each manifest
# records its budget and its validation agreement with the target (per head, slot or draft step).
# The block drafter learned from the target's own greedy text (self-distillation: each window's
# first 32 corpus tokens, then what the target wrote), so its agreement is on that text, the others'
# on the corpus:

# %%
for name in ("StoryLM-30M-Medusa", "StoryLM-30M-EAGLE", "StoryLM-30M-EAGLE3", "StoryLM-30M-Block"):
    m = verify_artifact(name)
    agree = [f"{v:.2f}" for k, v in sorted(m["val"].items()) if k.startswith("val_agree")]
    text = "the target's own text" if m["recipe"].get("text") == "greedy" else "the corpus"
    say(f"{name:<20} {m['tokens_seen']:>10,} target tokens seen, {m['epochs']} epochs; validation agreement "
        + "/".join(agree) + f" (on {text})")


# %% [markdown]
# ## 1. Medusa: K heads on one hidden state
#
# A Medusa head is one residual SiLU layer on the target's final state h_t, followed by the
# target's own unembedding. Head i guesses the token i places after the one the target itself is
# about to predict from h_t. Every head reads the same h_t and none of them sees what the others
# chose. Below, the target's top 3 for the next token and each head's top 3 for the tokens that
# follow it:

# %%
K = medusa.num_heads
ctx = prompts[0]
h = states_of(medusa.base, ctx)[-1, -1].to(device)                        # (D,) final state at the last position
with torch.no_grad():
    next_probs = torch.softmax(medusa.base.unembed(h).float(), -1)        # (V,) the target's next token
    head_probs = torch.softmax(medusa.logits(h).float(), -1)              # (K, V) head i: token i + 1 further


def top3(p):
    v, i = p.topk(3)
    return "  ".join(f"{tok.decode([int(t)])!r} {float(q):.2f}" for q, t in zip(v, i))


print(f"prompt: {tok.decode(ctx.tolist())!r}")
print(f"target, next token : {top3(next_probs)}")
for i in range(K):
    print(f"head {i + 1}, +{i + 1} further : {top3(head_probs[i])}")

# %% [markdown]
# Medusa does not bet on one combination. A tree of **rank paths** hedges: the path (0, 1) means
# "head 1's top token, then head 2's second-best". `static_choices(n)` keeps the n paths that a
# fixed per-rank acceptance prior rates highest. Your `medusa_tree` turns the paths and the heads'
# distributions into a `DraftTree` (the root is the target's next token, assumed accepted here):

# %%
choices = [c for c in static_choices(10) if len(c) <= K]
tree = medusa_tree(head_probs, choices)
root = int(next_probs.argmax())
print(f"root (target's argmax): {tok.decode([root])!r}")
for j, c in enumerate(choices):
    print(f"node {j:>2} ranks {str(c):<13} parent {int(tree.parents[j]):>2}  "
          f"path {tok.decode([root] + tree.path_tokens(j))!r}")

# %% [markdown]
# `MedusaDrafter` does this every round (with 16 nodes by default here) and `lineage_generate`
# verifies the whole tree in one cached target pass. Greedy verification is lossless, so the text
# must equal plain greedy decoding:

# %%
for ctx in prompts:
    want = cached_generate(medusa.base, ctx, NEW_TOKENS, temperature=0.0)
    ids, stats = lineage_generate(medusa.base, MedusaDrafter(medusa), ctx, NEW_TOKENS, num_nodes=16)
    show("Medusa, 16 nodes", stats, ids, want)
continuation(ctx, ids)   # the last prompt's text (the target may end the story and start the next: cut there)

# %% [markdown]
# ## 2. Typical acceptance is not lossless
#
# At T > 0 Medusa offers **typical acceptance**: keep a candidate x when the target's p(x) exceeds
# min(epsilon, delta * exp(-H(p))), H the entropy of p. No ratio p/q, no residual. First the
# shift on a distribution small enough to reason about: p = (0.4, 0.3, 0.2, 0.1) and a one-node
# tree that always proposes token 1 (a top-rank draft is deterministic, q one-hot on it).
#
# **Your turn.** Predict how often the first emitted token is token 1 under each rule: set
# `predicted_exact` and `predicted_typical` (floats), using your `typical_accept` for the
# threshold test. The exact rule must reproduce the target's p(1). Under typical acceptance a
# passing candidate is always taken; a failing one leaves the token to a sample from p. The
# simulation below checks your numbers.

# %%
p = torch.tensor([0.4, 0.3, 0.2, 0.1])
x = 1
eps, delta = 0.09, 0.3
H = float(-(p * p.log()).sum())
say(f"H(p) = {H:.3f} nats; threshold min(eps, delta e^-H) = {min(eps, delta * math.exp(-H)):.4f}; "
    f"p(x) = {p[x]:.2f}")
# BEGIN SOLUTION
passes = bool(typical_accept(p.view(1, -1), torch.tensor([x]), epsilon=eps, delta=delta)[0])
predicted_exact = float(p[x])
predicted_typical = 1.0 if passes else float(p[x])
# END SOLUTION
one_node = DraftTree(torch.tensor([x]), torch.tensor([-1]))
rows = torch.stack([p, torch.full((4,), 0.25)])                          # row 0 at the root, row 1 after the node
g = torch.Generator().manual_seed(0)
n = 2000


def first_token(verify):
    path, token = verify(one_node, rows, generator=g)
    return x if path else token


exact = sum(first_token(tree_speculative_verify) == x for _ in range(n)) / n
typical = sum(first_token(typical_tree_verify) == x for _ in range(n)) / n
say(f"share of token {x} over {n} rounds: exact rule {exact:.3f} (you predicted {predicted_exact:.3f}), "
    f"typical acceptance {typical:.3f} (you predicted {predicted_typical:.3f}); target p(x) = {p[x]:.2f}")

# %% [markdown]
# Now the same comparison on StoryLM-30M at T = 0.9, vLLM's epsilon = 0.09 and delta = 0.3. The
# exact rule accepts a top-rank draft x with probability p(x) and resamples from the residual;
# typical acceptance takes any x above the threshold. Compare the acceptance rate and tau (and
# remember which of the two texts still follows the target's distribution):

# %%
for acceptance in ("exact", "typical"):
    for i, ctx in enumerate(prompts):
        ids, stats = lineage_generate(medusa.base, MedusaDrafter(medusa), ctx, NEW_TOKENS, num_nodes=16,
                                      temperature=0.9, generator=torch.Generator().manual_seed(i),
                                      acceptance=acceptance)
        show(f"Medusa T=0.9, {acceptance}", stats, ids)

# %% [markdown]
# ## 3. EAGLE chain vs EAGLE-2 tree at the same budget
#
# The EAGLE drafter runs one small block autoregressively over the target's **features**: it
# predicts the next feature and feeds it back. As a chain (width 1) it spends the whole budget on
# its single best guess per position. EAGLE-2 keeps the same drafter and grows a dynamic tree: at
# each depth, expand the nodes with the highest path probability, then keep the best n overall.
# Same node budget n = 8 for both:

# %%
for width, name in ((1, "EAGLE chain, n=8"), (4, "EAGLE-2 tree, n=8")):
    pooled_passes, pooled_tokens, draft_s = 0, 0, 0.0
    for ctx in prompts:
        want = cached_generate(eagle.base, ctx, NEW_TOKENS, temperature=0.0)
        ids, stats = lineage_generate(eagle.base, EagleTreeDrafter(eagle, width=width), ctx, NEW_TOKENS,
                                      num_nodes=8)
        show(name, stats, ids, want)
        pooled_passes, pooled_tokens = pooled_passes + stats.target_passes, pooled_tokens + stats.generated
        draft_s += stats.draft_seconds
    say(f"{name:<24} pooled: {pooled_tokens / pooled_passes:.2f} tokens per target pass, "
        f"{1000 * draft_s / pooled_passes:.1f} ms of drafting per pass")

# %% [markdown]
# Both outputs equal plain greedy decoding; what differs is how the same 8 verified rows are
# spent. Where the drafter is confident and right, a chain is already the best tree and the
# dynamic tree's siblings are wasted rows; where it hesitates, the siblings catch the target's
# choice. Which effect wins depends on the text: the lesson's benchmark pools many prompts.

# %% [markdown]
# ## 4. EAGLE-3: three depths and training-time test
#
# EAGLE-3 feeds the drafter the target's residual stream after a low, a middle and a high block.
# Your `fusion_layers` picks them by quarters of the depth. Next to it, the reference default
# (2, L // 2, L - 3), which counts the input of a layer, translated to our block outputs
# (1, L // 2 - 1, L - 4): on shallow models it repeats a layer.

# %%
for name, depth in (("StoryLM-1M", 4), ("StoryLM-5M", 6), ("StoryLM-30M", 9)):
    ref = (1, depth // 2 - 1, depth - 4)
    say(f"{name:<12} L={depth}: fusion_layers -> {fusion_layers(depth)}; reference default -> {ref}"
        f"{'  (duplicate!)' if len(set(ref)) < 3 else ''}")
print(f"the shipped EAGLE-3 head reads blocks {eagle3.layers}")

# %% [markdown]
# At inference, draft step 2 reads the drafter's own step-1 output, not a true target feature.
# Training-time test unrolls S steps in one pass and masks attention so that each step sees what it
# would see at inference. Your `ttt_attention_mask(4, 3)`: rows and columns are (step, position);
# `#` = may attend.

# %%
N, S = 4, 3
mask = ttt_attention_mask(N, S)
labels = [f"{s},{t}" for s in range(1, S + 1) for t in range(N)]            # step s, position t
print(f"{'row/col':<11}" + "".join(lab.rjust(5) for lab in labels))
for r, lab in enumerate(labels):
    print(f"{lab:<10} " + "".join(("#" if v else ".").rjust(5) for v in mask[r].tolist()))

# %% [markdown]
# Step 1 (rows (1, t)) is plain causal attention over true features. Row (2, t) reads the step-1
# rows up to t (the committed context) and itself; row (3, t) adds (2, t): the draft that
# preceded it in the same round.
#
# What the unrolled training buys is measured in the lesson ("The paper designs and the ablations"):
# at one budget, a head trained on ONE step agrees with the target 0.71 at step 1 and 0.38 from
# step 2 on (it never saw its own outputs as inputs); trained on 3 steps it holds 0.72 to step 3
# and 0.68 at step 7; on 7 steps, 0.72 to step 7. Here is the shipped head (3 steps), unrolled
# 5 steps with `eagle3_loss`'s protocol, teacher-forced on the target's own greedy continuation of
# each prompt (so "agrees" means: the drafter's argmax is the token the target picked):

# %%
STEPS = 5
agree = [0.0] * STEPS
with torch.no_grad():
    for ctx in prompts:
        text = cached_generate(eagle3.base, ctx, NEW_TOKENS, temperature=0.0)
        states = states_of(eagle3.base, text, eagle3.layers).to(device)
        out = eagle3_loss(eagle3, states.unsqueeze(0), text.view(1, -1).to(device), steps=STEPS)
        for s in range(STEPS):
            agree[s] += float(out[f"agree_{s + 1}"]) / len(prompts)
say("shipped EAGLE-3, agreement per draft step: " + ", ".join(f"step {s + 1} {a:.2f}" for s, a in enumerate(agree))
    + " (trained on 3 steps)")

# %% [markdown]
# Now the EAGLE-3 drafter as a chain of 4 behind `lineage_generate`:

# %%
for ctx in prompts:
    want = cached_generate(eagle3.base, ctx, NEW_TOKENS, temperature=0.0)
    ids, stats = lineage_generate(eagle3.base, Eagle3Drafter(eagle3, width=1), ctx, NEW_TOKENS, num_nodes=4)
    show("EAGLE-3 chain, k=4", stats, ids, want)

# %% [markdown]
# ## 5. The block drafter: one pass for the whole draft
#
# Every drafter so far needs one sequential step per depth. The block drafter (in the spirit of
# DFlash) reads W = 8 rows of fused target features, the anchor (the last committed token) and B
# mask slots, and fills all B slots in one forward pass. It is trained with slot weights from
# your `block_loss_weights`: early slots count more, since a late slot only matters when every
# earlier one was accepted.

# %%
print(f"block_loss_weights(8, gamma=4.0) = {[round(w, 3) for w in block_loss_weights(8, 4.0).tolist()]}")

# %% [markdown]
# Time `drafter.draft(...)` for B = 1, 2, 4, 8 against the EAGLE chain drafting k = B tokens (median
# of a few repeats, after a warm-up, device synchronised). One caveat: the EAGLE drafter computes
# its first prediction in `commit` (when it appends the true states), so its `draft` with k = 1 is
# only an unembedding; a whole round costs about one drafter step more than the time shown.
# Timings on a shared or busy CPU move by tens of percent between runs: the table shows each
# median with the spread of its repeats (quartiles), and the growth ratios below it are what to read.

# %%
ctx = prompts[0]
repeats = 5 if QUICK else 20


def draft_ms(drafter, head, size):
    """(median, first quartile, third quartile) of `repeats` timed drafts, in ms."""
    drafter.read_prefill(ctx, states_of(head.base, ctx[:-1], drafter.target_layers))
    drafter.draft(ctx, max_nodes=size, max_depth=size)                     # warm-up
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        drafter.draft(ctx, max_nodes=size, max_depth=size)
        synchronize(device)
        times.append(1000 * (time.perf_counter() - t0))
    q1, med, q3 = statistics.quantiles(times, n=4)
    return med, q1, q3


SIZES = [1, 2, 4, 8]
timed = {}
for size in tqdm(SIZES, desc="draft timing", leave=False):   # the bar goes away before the table prints
    timed[size] = (draft_ms(EagleTreeDrafter(eagle, width=1), eagle, size),
                   draft_ms(BlockDrafter(block, block_size=size), block, size))
print(f"{'B or k':>6} | {'EAGLE chain ms (q1-q3)':>24} | {'block ms (q1-q3)':>20}")
for size, ((c, c1, c3), (b, b1, b3)) in timed.items():
    print(f"{size:>6} | {c:>8.2f} ({c1:6.2f}-{c3:6.2f}) | {b:>6.2f} ({b1:5.2f}-{b3:5.2f})")
chain_growth, block_growth = timed[8][0][0] / timed[2][0][0], timed[8][1][0] / timed[2][1][0]
lo, hi = timed[8][1][1] / timed[2][1][2], timed[8][1][2] / timed[2][1][1]   # quartile bounds of the ratio
say(f"from 2 to 8 drafts: the chain's time x{chain_growth:.2f}, the block's x{block_growth:.2f} "
    f"(between x{lo:.2f} and x{hi:.2f} from the quartiles; its rows grow x{17 / 11:.2f}, 11 -> 17)")
drafter = BlockDrafter(block)
drafter.read_prefill(ctx, states_of(block.base, ctx[:-1], drafter.target_layers))
guess = drafter.draft(ctx, max_nodes=8, max_depth=8)
say(f"the block of 8 after {tok.decode(ctx[-6:].tolist())!r}: {tok.decode(guess.tokens.tolist())!r}")

# %% [markdown]
# And its tau, drafting blocks of 8:

# %%
for ctx in prompts:
    want = cached_generate(block.base, ctx, NEW_TOKENS, temperature=0.0)
    ids, stats = lineage_generate(block.base, BlockDrafter(block), ctx, NEW_TOKENS, num_nodes=8)
    show("Block, B=8", stats, ids, want)

# %% [markdown]
# ## 6. Sampled drafts for trees
#
# At T > 0 a tree of the drafter's *top ranks* is a deterministic proposal: the exact rule can
# keep a node x only with probability p(x), however sure the drafter was. With
# `draft_mode="sample"` the drafter draws each node's children from its own q (without
# replacement among siblings) and the tree carries those q rows, so the verifier can accept x with
# min(1, p(x) / q(x)) and the output still follows the target's distribution. The same static
# tree of 16 nodes, greedy and at T = 0.8 both ways; one sampled generation per prompt is noisy,
# so the sampled rows pool two draws per prompt:

# %%
DRAWS = 2
for label, temperature, mode, draws in (("greedy", 0.0, "top", 1), ("T=0.8, top ranks", 0.8, "top", DRAWS),
                                        ("T=0.8, sampled drafts", 0.8, "sample", DRAWS)):
    tokens, passes = 0, 0
    for draw in range(draws):
        for i, ctx in enumerate(prompts):
            drafter = EagleTreeDrafter(eagle, shape="static", draft_mode=mode)
            ids, stats = lineage_generate(eagle.base, drafter, ctx, NEW_TOKENS, num_nodes=16, temperature=temperature,
                                          generator=torch.Generator().manual_seed(1000 * draw + i))
            tokens, passes = tokens + stats.generated, passes + stats.target_passes
    say(f"EAGLE static tree, 16 nodes, {label:<22} tau {tokens / passes:.2f} "
        f"({draws * len(prompts)} generations pooled)")

# %% [markdown]
# Sampled drafts win back most of what the top ranks lose at T = 0.8. What stays lost is the
# distance between the drafter's q and the target's p: a sampled first child is kept with
# probability sum_x min(p(x), q(x)), which a greedy round never asks of the drafter's tails.
# The lesson's table (`bench/lineage.py --sampled-drafts-only`) pools 8 prompts x 3 draws.

# %% [markdown]
# **Question:** In sections 1 and 3, Medusa verified a tree of 16 candidates per pass and EAGLE a
# chain of 8. Both read the final states of the same target. Compare their tau: why do Medusa's
# heads write fewer tokens per pass, and why does the gap grow with the depth of the draft?

# %% [markdown]
# **Answer:**
# <!-- BEGIN ANSWER -->
# Medusa's heads all read the one state h_t and guess their positions independently: head 2 does
# not know which token head 1 drafted, so its guess is a marginal over every continuation of
# position 1, not the continuation of the drafted token. When the text can go two ways, head 1
# may pick one way and head 2 the other, and the pair is incoherent. The tree hedges by trying
# several ranks per head, which buys back some of the lost coordination with verification rows.
# EAGLE conditions every step on its own previous feature and on the token it drafted, so draft
# j + 1 continues draft j; its guesses stay coherent along the chain. The gap grows with depth
# because each Medusa head sits further from h_t and its marginal spreads over more
# continuations, and a deep node is only accepted when every node above it was, so the
# incoherence compounds.
# <!-- END ANSWER -->
# <!-- BEGIN RUBRIC -->
# Full answer: (1) Medusa heads are conditionally independent given h_t (no head sees the tokens
# drafted before it); (2) EAGLE is autoregressive at the feature level and takes the drafted
# token as input, so its drafts are a coherent sequence; (3) the tree trades verification rows
# for that missing coordination; (4) depth: acceptance of a deep node is a product over its
# path, and later heads are less accurate (their training agreement with the target falls with
# i). Numbers to expect: the lesson's "Measured on StoryLM-30M" table (Medusa's tau with 16 nodes
# against EAGLE's with a chain); on Vicuna 7B-33B, Spec-Bench measured about 2.3 tokens per step
# for Medusa.
# <!-- END RUBRIC -->

# %% [markdown]
# **Question:** EAGLE-3's reference picks the fused layers with (2, L // 2, L - 3). What goes wrong
# on a 6-block model, and why does the course's `check_fusion_layers` raise an error instead of
# quietly removing the duplicate?

# %% [markdown]
# **Answer:**
# <!-- BEGIN ANSWER -->
# The reference counts the input of a layer, so its three picks are the outputs of blocks
# (1, L // 2 - 1, L - 4): for L = 6 that is (1, 2, 2), for L = 4 (1, 1, 0). The drafter then fuses
# one layer twice and only two distinct depths: the "high" feature is missing (and on 4 blocks
# the order is even reversed), so the drafter gets less of what later tokens need while paying
# for a 3D input. Dropping the duplicate silently would change the input width (2D instead of 3D)
# or the meaning of the slots without anyone noticing, and a head trained on one set of layers is
# useless on another. An error names the bad choice and the fix (`fusion_layers(L)`, quarters of
# the depth: (1, 3, 4) for 6 blocks, (2, 4, 6) for StoryLM-30M), which is distinct for every
# L >= 3.
# <!-- END ANSWER -->
# <!-- BEGIN RUBRIC -->
# Full answer: (1) the translation from "input of layer i" to "output of block i - 1" and the
# resulting (1, 2, 2) for L = 6 and (1, 1, 0) for L = 4; (2) the cost: a repeated feature carries
# no new information, the high layer is lost; (3) why refuse: silent deduplication changes the
# head's input contract and hides a mismatch between training and inference layers; an explicit
# error names the fix. Bonus: the quarters rule (L // 4, L // 2, 3L // 4) gives (1, 2, 3) for 4
# blocks and (2, 4, 6) for 9.
# <!-- END RUBRIC -->

# %% [markdown]
# **Question:** From section 5, how does the block drafter's cost per round grow with B, compared
# with the EAGLE chain's? Using tau / (1 + c), explain when a longer block still pays and what
# limits it.

# %% [markdown]
# **Answer:**
# <!-- BEGIN ANSWER -->
# The EAGLE chain runs one drafter step per draft token after the first (which `commit` already
# computed), so its time per round grows about linearly with k. The block drafter runs one pass
# over W + 1 + B rows whatever B is: the rows grow from 10 to 17 between B = 1 and B = 8, the number
# of passes stays 1, and a pass this small costs mostly reading the weights and launching the
# kernels, so its time is nearly flat in B. In tau / (1 + c), a longer block
# therefore raises tau without raising c, unlike an autoregressive drafter whose c grows with k.
# A longer block still pays as long as its extra slots are accepted often enough: slot j counts
# only if slots 1..j - 1 were all accepted, and the later slots are guessed with less context (the
# slots before them are mask tokens, not drafted tokens), so their accuracy falls with j; tau
# saturates. The other limit is verification: the target scores B + 1 rows per pass, free at
# batch 1 on a memory-bound pass but not in a large served batch.
# <!-- END ANSWER -->
# <!-- BEGIN RUBRIC -->
# Full answer: (1) chain cost linear in k (one step per token), block cost flat in B (one pass);
# measured in section 5 (expect the chain's time to grow several-fold from k = 2 to 8 while the
# block's grows by less than its row count, 17 / 11 = 1.55; `bench/lineage.py` measured a whole
# round's c(B=8) / c(B=2) = 1.14 with 4 threads and 1.29 with 2 on a quiet machine
# (docs/performance.md), and this notebook's draft-only timing gave 1.37-1.40 on a shared 2-core
# machine: the ratio moves with the load, so grade the comparison with the chain's growth and the
# row count, read against the printed quartile range, not a fixed threshold);
# (2) so c stops limiting the block length, and tau becomes the limit: later slots are less
# accurate and only count after every earlier slot is accepted; (3) verification of B + 1 rows
# costs compute under load. Bonus: the block drafter's tau depends on training (slot weights
# exp(-(j - 1) / gamma)), which is why DFlash's reported gains come with a trained multi-layer
# conditioning.
# <!-- END RUBRIC -->
