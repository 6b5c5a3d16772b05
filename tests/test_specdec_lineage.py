"""Module specdec-lineage: Medusa, EAGLE-2 over the EAGLE drafter, EAGLE-3, the block drafter.

The exercises (``medusa_tree``, ``typical_accept``, ``fusion_layers``, ``ttt_attention_mask``,
``block_loss_weights``) are checked by hand-worked cases; the drafters behind ``lineage_generate``
by three oracles:

* losslessness: greedy output equals module 16's ``cached_generate`` token for token, for every
  drafter, tree budget, and past the window (re-prefill); sampled, the first emitted token follows
  the target's distribution (and typical acceptance, the classic non-lossless shortcut, does not);
* training matches inference: EAGLE-3's unrolled training-time-test step 2 gives the same logits
  as the drafter's cached tree row for the same tokens (a plain causal mask fails it);
* the cached feature drafter's state: after each commit, its next feature equals a from-scratch
  recomputation over every true state (a drafter that forgot to roll back its tree rows fails it).

Tiny random ``TransformerLM`` s (V = 32, four blocks) keep every test to a fraction of a second.
"""

from __future__ import annotations

import math

import pytest
import torch
from test_specdec_cached import _lm as _tiny_lm
from test_specdec_eagle import _trained_head  # a head that agrees with its target (60 steps, about a second)

from g2c.kvcache import cached_generate
from g2c.specdec.lineage import (
    BlockDrafter,
    BlockHead,
    Eagle3Drafter,
    Eagle3Head,
    EagleTreeDrafter,
    MedusaDrafter,
    MedusaHeads,
    TreeDrafter,
    block_loss,
    block_loss_weights,
    chain_tree,
    check_fusion_layers,
    eagle3_loss,
    fusion_layers,
    lineage_generate,
    masked_block,
    medusa_loss,
    medusa_tree,
    ttt_attention_mask,
    typical_accept,
    typical_tree_verify,
)
from g2c.specdec.sampling.eagle import EagleDrafter, FeatureDrafter
from g2c.specdec.sampling.loop import speculative_sample
from g2c.specdec.trees import DraftTree, tree_speculative_verify

V = 32


def _lm(seed: int = 2, *, layers: int = 4, **kw):
    """specdec-sampling's tiny peaked TransformerLM (V = 32), four blocks by default (EAGLE-3 fuses three)."""
    return _tiny_lm(seed, layers=layers, **kw)


def _prompt(n: int = 5, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


def _states(model, ids: torch.Tensor, layers) -> torch.Tensor:
    """(B, T, len(layers) + 1, D): the chosen blocks' outputs, then the final state (the recipe's layout)."""
    with torch.no_grad():
        h = model.token_embed.weight[ids] + model.pos_embed.weight[torch.arange(ids.shape[1])]
        kept = {}
        for i, blk in enumerate(model.blocks):
            h = blk(h)
            kept[i] = h
        return torch.stack([kept[i] for i in layers] + [model.ln_final(h)], dim=2)


def _drafter(kind: str, target, seed: int = 0, *, draft_mode: str = "top"):
    g = torch.Generator().manual_seed(seed)
    if kind == "medusa":
        heads = MedusaHeads(target, 3)
        with torch.no_grad():
            heads.weight.normal_(0, 0.3, generator=g)
        return MedusaDrafter(heads, draft_mode=draft_mode)
    if kind == "eagle-chain":
        return EagleTreeDrafter(FeatureDrafter(target, generator=g).eval(), draft_mode=draft_mode)
    if kind == "eagle2":
        return EagleTreeDrafter(FeatureDrafter(target, generator=g).eval(), width=3, draft_mode=draft_mode)
    if kind == "eagle-static":
        return EagleTreeDrafter(FeatureDrafter(target, generator=g).eval(), shape="static", draft_mode=draft_mode)
    if kind == "eagle3":
        return Eagle3Drafter(Eagle3Head(target, generator=g).eval(), width=2, draft_mode=draft_mode)
    if kind == "block":
        return BlockDrafter(BlockHead(target, block_size=4, generator=g).eval(), draft_mode=draft_mode)
    if kind == "block-kv":                      # DFlash's key/value injection (issue 29)
        return BlockDrafter(BlockHead(target, block_size=4, injection="kv", generator=g).eval(),
                            draft_mode=draft_mode)
    raise AssertionError(kind)


KINDS = ["medusa", "eagle-chain", "eagle2", "eagle-static", "eagle3", "block", "block-kv"]


# -- Medusa: the candidate tree ----------------------------------------------------------------
def test_medusa_tree_by_hand():
    probs = torch.zeros(2, 10)
    probs[0, [7, 3, 1]] = torch.tensor([0.5, 0.3, 0.2])
    probs[1, [5, 9, 2]] = torch.tensor([0.6, 0.3, 0.1])
    tree = medusa_tree(probs, [(0,), (1,), (0, 0), (0, 1), (1, 0)])
    assert tree.tokens.tolist() == [7, 3, 5, 9, 5]
    assert tree.parents.tolist() == [-1, -1, 0, 0, 1]


def test_medusa_tree_reads_a_generator_of_paths_once():
    # issue 31: validation consumed a generator, and the tree came out with 0 nodes
    probs = torch.zeros(2, 10)
    probs[0, [7, 3, 1]] = torch.tensor([0.5, 0.3, 0.2])
    probs[1, [5, 9, 2]] = torch.tensor([0.6, 0.3, 0.1])
    paths = [(0,), (1,), (0, 0), (0, 1), (1, 0)]
    tree = medusa_tree(probs, (c for c in paths))
    assert tree.tokens.tolist() == [7, 3, 5, 9, 5] and tree.parents.tolist() == [-1, -1, 0, 0, 1]
    with pytest.raises(ValueError, match=r"medusa_tree: head_probs must hold probabilities as a floating-point"):
        medusa_tree((probs * 10).long(), paths)                   # counts are refused, never ranked


def test_medusa_tree_ties_go_to_the_smaller_id():
    probs = torch.full((1, 6), 0.1)
    probs[0, 4] = 0.5
    tree = medusa_tree(probs, [(0,), (1,), (2,)])
    assert tree.tokens.tolist() == [4, 0, 1]


def test_medusa_tree_refuses_bad_paths():
    probs = torch.softmax(torch.randn(2, 8, generator=torch.Generator().manual_seed(0)), -1)
    with pytest.raises(ValueError, match="only 2 heads"):
        medusa_tree(probs, [(0,), (0, 0), (0, 0, 0)])
    with pytest.raises(ValueError, match="prefix"):
        medusa_tree(probs, [(0,), (1, 0)])
    with pytest.raises(ValueError, match="sorted"):
        medusa_tree(probs, [(1,), (0,)])
    with pytest.raises(ValueError, match="vocabulary"):
        medusa_tree(probs, [(8,)])


def test_medusa_heads_start_as_the_targets_next_token_head():
    target = _lm()
    heads = MedusaHeads(target, 3)
    h = _states(target, _prompt().view(1, -1), [])[0, :, -1]                         # (T, D)
    want = h @ target.token_embed.weight.t()
    for i in range(3):
        torch.testing.assert_close(heads.logits(h)[:, i], want)


def test_medusa_loss_trains_the_heads():
    target = _lm()
    heads = MedusaHeads(target, 2)
    states = _states(target, torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(1)), [])[:, :, -1]
    out = medusa_loss(heads, states)
    out["loss"].backward()
    assert float(heads.weight.grad.abs().sum()) > 0
    assert set(out) == {"loss", "agree_1", "agree_2"}
    with pytest.raises(ValueError, match="T > K"):
        medusa_loss(heads, states[:, :3])


# -- Medusa: typical acceptance ----------------------------------------------------------------
def test_typical_accept_by_hand():
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.97, 0.01, 0.01, 0.01]])
    # row 0: H = ln 2, delta * exp(-H) = 0.15 < epsilon: threshold 0.15.
    # row 1: H ~ 0.168, delta * exp(-H) ~ 0.254 > epsilon: threshold 0.09.
    assert typical_accept(probs, torch.tensor([0, 1])).tolist() == [True, False]
    assert typical_accept(probs, torch.tensor([2, 0])).tolist() == [False, True]
    assert typical_accept(probs, torch.tensor([1, 0]), epsilon=0.5, delta=1.0).tolist() == [False, True]


def test_typical_accept_zero_probabilities():
    probs = torch.tensor([[1.0, 0.0, 0.0]])                                            # H = 0, not NaN
    assert typical_accept(probs, torch.tensor([0])).tolist() == [True]
    assert typical_accept(probs, torch.tensor([1])).tolist() == [False]


def test_typical_accept_refuses_bad_input():
    probs = torch.full((1, 4), 0.25)
    with pytest.raises(ValueError, match="epsilon"):
        typical_accept(probs, torch.tensor([0]), epsilon=0.0)
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        typical_accept(probs, torch.tensor([4]))
    with pytest.raises(ValueError, match="tokens"):
        typical_accept(probs, torch.tensor([0, 1]))


def test_typical_acceptance_shifts_the_distribution_exact_rule_does_not():
    """One draft, the target's top token x with p(x) = 0.4 (typical: passes). The exact rule emits
    x with probability 0.4; typical acceptance always takes it: a shift of 0.6 in that token."""
    p = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]])
    tree = DraftTree(torch.tensor([0]), torch.tensor([-1]))
    g = torch.Generator().manual_seed(0)
    n = 4000
    exact = sum(tree_speculative_verify(tree, p, generator=g)[0] == [0] for _ in range(n)) / n
    typical = sum(typical_tree_verify(tree, p, generator=g)[0] == [0] for _ in range(n)) / n
    assert abs(exact - 0.4) < 0.03            # 4 sd of a binomial(4000, 0.4) share is 0.031
    assert typical == 1.0


# -- EAGLE-3: fusion layers and training-time test --------------------------------------------
def test_fusion_layers_ladder():
    assert fusion_layers(4) == (1, 2, 3)      # StoryLM-1M
    assert fusion_layers(6) == (1, 3, 4)      # StoryLM-5M
    assert fusion_layers(9) == (2, 4, 6)      # StoryLM-30M


def test_fusion_layers_distinct_for_every_depth():
    for num_layers in range(3, 97):
        layers = fusion_layers(num_layers)
        assert len(set(layers)) == 3 and list(layers) == sorted(layers), num_layers
        assert 0 <= layers[0] and layers[-1] < num_layers


@pytest.mark.parametrize("bad", [2, 1, 0, -3])
def test_fusion_layers_refuses_shallow_models(bad):
    with pytest.raises(ValueError, match="at least 3 blocks"):
        fusion_layers(bad)


@pytest.mark.parametrize("bad", [True, 4.0, 9.0, "9", None])
def test_fusion_layers_refuses_a_non_int(bad):
    # issue 31: fusion_layers(9.0) said "needs at least 3 blocks"; a wrong type is a TypeError
    with pytest.raises(TypeError, match=r"fusion_layers: num_layers must be an int, got"):
        fusion_layers(bad)


def test_check_fusion_layers_refuses_a_duplicate_instead_of_dropping_it():
    with pytest.raises(ValueError, match="duplicate"):
        check_fusion_layers([1, 2, 2], 6)                          # the reference formula's 6-block choice
    with pytest.raises(ValueError, match="duplicate"):
        Eagle3Head(_lm(), [1, 1, 0])                               # ... and its 4-block choice
    with pytest.raises(ValueError, match=r"\[0, 4\)"):
        check_fusion_layers([0, 1, 4], 4)
    assert check_fusion_layers([3, 0, 1], 4) == (0, 1, 3)


def test_ttt_mask_by_hand():
    want = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool)
    assert torch.equal(ttt_attention_mask(2, 2), want)
    assert torch.equal(ttt_attention_mask(3, 1), torch.ones(3, 3, dtype=torch.bool).tril())


def test_ttt_mask_steps():
    n, s = 3, 3
    mask = ttt_attention_mask(n, s)
    assert mask.shape == (9, 9) and mask.dtype == torch.bool
    row = 2 * n + 1                                                  # step 3, position 1
    assert mask[row].nonzero().view(-1).tolist() == [0, 1, n + 1, 2 * n + 1]
    assert not mask[n:2 * n, 2 * n:].any()                           # step 2 never sees step 3
    with pytest.raises(ValueError, match="steps"):
        ttt_attention_mask(3, 0)


def test_eagle3_training_step_two_equals_the_drafters_tree_row():
    """Train/inference agreement: the unrolled step 2 at position t (mask from ttt_attention_mask)
    must give the logits the cached drafter computes for a one-node tree holding token t+2."""
    target = _lm(3)
    head = Eagle3Head(target, generator=torch.Generator().manual_seed(4)).eval()
    ids = torch.randint(0, V, (1, 12), generator=torch.Generator().manual_seed(5))
    states = _states(target, ids, head.layers)                          # (1, 12, 4, D)
    n, t = 12 - 2, 6
    mask = ttt_attention_mask(n, 2)
    with torch.no_grad():
        feats = head.true_features(states[:, :n])
        x1 = head.embed_next(feats, ids[:, 1:1 + n])
        a1 = masked_block(head.block, x1, mask[:n, :n])
        x2 = head.embed_next(a1, ids[:, 2:2 + n])
        a2 = masked_block(head.block, torch.cat([x1, x2], 1), mask)[:, n:]
        want = torch.softmax(head.logits(a2[0, t]).float(), -1)
    drafter = Eagle3Drafter(head)
    context = ids[0, :t + 2]                                             # committed ... x_{t+1}; states up to t
    drafter.read_prefill(context, states[0, :t + 1])
    got = drafter.tree_probs(context, chain_tree([int(ids[0, t + 2])]))[1]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_eagle3_loss_unrolls_and_trains():
    target = _lm()
    head = Eagle3Head(target, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, V, (2, 16), generator=torch.Generator().manual_seed(1))
    out = eagle3_loss(head, _states(target, ids, head.layers), ids, steps=3)
    out["loss"].backward()
    assert {"ce_1", "ce_2", "ce_3", "agree_3"} <= set(out)
    assert float(head.fc.weight.grad.abs().sum()) > 0


# -- the block drafter ----------------------------------------------------------------------------
def test_block_loss_weights_by_hand():
    torch.testing.assert_close(block_loss_weights(3, 1.0),
                               torch.tensor([1.0, math.exp(-1), math.exp(-2)]) / (1 + math.exp(-1) + math.exp(-2)))
    torch.testing.assert_close(block_loss_weights(1, 0.5), torch.tensor([1.0]))


def test_block_loss_weights_sum_to_one():
    for b, gamma in [(8, 4.0), (16, 0.3), (5, 1e6)]:
        w = block_loss_weights(b, gamma)
        assert w.dtype == torch.float32 and w.shape == (b,)
        assert abs(float(w.sum()) - 1) < 1e-6 and bool((w[1:] <= w[:-1]).all()) and bool((w > 0).all())
    with pytest.raises(ValueError, match="gamma"):
        block_loss_weights(4, 0.0)
    with pytest.raises(ValueError, match="gamma"):
        block_loss_weights(4, float("nan"))
    with pytest.raises(ValueError, match="block_size"):
        block_loss_weights(0, 1.0)


def test_block_drafter_shorter_block_gives_the_same_first_tokens():
    target = _lm()
    head = BlockHead(target, block_size=6, generator=torch.Generator().manual_seed(2)).eval()
    ids = _prompt(20)
    states = _states(target, ids.view(1, -1), head.layers)[0, :-1]
    with torch.no_grad():
        full = head(states.unsqueeze(0), ids[-1:], 6)[0]
        short = head(states.unsqueeze(0), ids[-1:], 2)[0]
    torch.testing.assert_close(short, full[:2])
    with pytest.raises(ValueError, match="block_size"):
        head(states.unsqueeze(0), ids[-1:], 7)


def test_block_loss_trains_with_random_anchors():
    target = _lm()
    head = BlockHead(target, block_size=4, context_rows=4, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, V, (2, 20), generator=torch.Generator().manual_seed(1))
    out = block_loss(head, _states(target, ids, head.layers), ids, generator=torch.Generator().manual_seed(2))
    out["loss"].backward()
    assert set(out) == {"loss", "agree_1", "agree_2", "agree_3", "agree_4"}
    assert float(head.mask_embed.grad.abs().sum()) > 0


# -- the loop: lossless for every drafter ------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("num_nodes", [1, 4, 8])
def test_greedy_output_equals_cached_generate(kind, num_nodes):
    target = _lm()
    prompt = _prompt()
    want = cached_generate(target, prompt, 70, temperature=0.0)            # past the 48-token window
    ids, stats = lineage_generate(target, _drafter(kind, target), prompt, 70, num_nodes=num_nodes)
    assert ids.tolist() == want.tolist()
    assert stats.generated == 70 and stats.drafted >= stats.accepted
    assert stats.target_passes < 70 or stats.accepted == 0


def test_some_drafts_are_accepted():
    target = _lm()
    _, stats = lineage_generate(target, _drafter("medusa", target), _prompt(), 40, num_nodes=8)
    assert stats.accepted > 0 and stats.tokens_per_pass > 1.0 and stats.cost_ratio > 0


class _GreedyOracle(TreeDrafter):
    """Drafts the target's own greedy next token (a perfect greedy drafter)."""

    def __init__(self, target) -> None:
        self.target, self.base, self.vocab_size = target, target, target.vocab_size

    def draft(self, context_ids, *, max_nodes, max_depth):
        return chain_tree(cached_generate(self.target, context_ids, 1, temperature=0.0)[-1:])


def test_sampled_first_token_follows_the_target_and_typical_does_not():
    """At T = 1 the first emitted token must follow the target's p although the draft is always its
    argmax x. Tolerance: 3x the expected total-variation distance of N draws,
    0.5 * sum_i sqrt(2 p_i (1 - p_i) / (pi N)). Typical acceptance takes x whenever it passes the
    threshold, so its first token is x far more often than p(x): it lands at TV >= 0.5 (p(x) < 0.5)."""
    target = _lm(sharpen=1.5)
    prompt = _prompt()
    with torch.no_grad():
        p = torch.softmax(target(prompt.view(1, -1))[0, -1].float(), -1)
    assert float(p.max()) < 0.5
    drafter = _GreedyOracle(target)
    g = torch.Generator().manual_seed(0)

    def tv(acceptance, n):
        counts = torch.zeros(V)
        for _ in range(n):
            ids, _ = lineage_generate(target, drafter, prompt, 2, num_nodes=1, temperature=1.0, generator=g,
                                      acceptance=acceptance)
            counts[ids[len(prompt)]] += 1
        return 0.5 * float((counts / n - p).abs().sum())

    n = 300
    expected = 0.5 * float(torch.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())
    assert tv("exact", n) < 3 * expected
    assert tv("typical", 60) > 1 - float(p.max()) - 0.1


@pytest.mark.parametrize("preset", ["lineage", "trees"])
def test_top_k_and_top_p_reach_the_tree_presets(preset):
    """Sampling controls once, for every drafter: the tree presets take the engine's top-k/top-p, and
    the first token follows the WARPED target distribution (top-3 of softmax(logits), renormalised;
    then top-p 0.5 on it). Tolerance: 3x the expected TV of N draws. The classic mistake, warping q
    but verifying against the raw p (or not warping at all), puts mass outside the top 3: the test
    checks that mass is exactly 0 and that the raw p has at least 0.2 of it."""
    from g2c.sampling.warpers import top_k_filter, top_p_filter
    from g2c.specdec.trees import tree_speculative_generate

    target = _lm(sharpen=1.5)
    prompt = _prompt()
    with torch.no_grad():
        logits = target(prompt.view(1, -1))[0, -1].float()
    p_raw = torch.softmax(logits, -1)
    top3 = torch.topk(logits, 3).indices
    assert 1.0 - float(p_raw[top3].sum()) > 0.2                   # a warper ignored would show
    g = torch.Generator().manual_seed(3)
    for top_k, top_p in ((3, None), (None, 0.5)) if preset == "lineage" else ((3, None),):
        warped = logits.clone()
        if top_k is not None:
            warped = top_k_filter(warped, top_k)
        if top_p is not None:
            warped = top_p_filter(warped, top_p)
        p = torch.softmax(warped, -1)
        counts = torch.zeros(V)
        n = 100
        for _ in range(n):
            if preset == "lineage":
                ids, _ = lineage_generate(target, _GreedyOracle(target), prompt, 2, num_nodes=2, temperature=1.0,
                                          generator=g, top_k=top_k, top_p=top_p)
            else:
                ids, _ = tree_speculative_generate(target, _lm(seed=5), prompt, 2, tree="static", num_nodes=3,
                                                   temperature=1.0, generator=g, top_k=top_k, top_p=top_p)
            counts[ids[len(prompt)]] += 1
        assert float(counts[p == 0].sum()) == 0.0, (top_k, top_p)       # nothing outside the warped support
        expected = 0.5 * float(torch.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())
        assert 0.5 * float((counts / n - p).abs().sum()) < 3 * expected, (top_k, top_p)


@pytest.mark.parametrize("kind", ["medusa", "eagle2", "block", "block-kv"])   # EAGLE's static tree: the same fill
def test_sampled_drafts_carry_q_and_keep_the_target_distribution(kind):
    """draft_mode="sample" (issue 29): at T = 0.8 the drafter draws its nodes from its own q (siblings
    distinct) and the tree carries those rows; the first emitted token still follows the target's
    softmax(logits / T) (an accepted node or a residual sample). Tolerance as above: 3x the expected
    total-variation distance of N draws. (The rule's exactness against planted mistakes is
    ``tests/test_specdec_trees.py``'s.)"""
    T = 0.8
    target = _lm(sharpen=1.5)
    prompt = _prompt()
    drafter = _drafter(kind, target, draft_mode="sample")
    g = torch.Generator().manual_seed(1)
    n = 200
    counts = torch.zeros(V)
    for _ in range(n):
        ids, _ = lineage_generate(target, drafter, prompt, 2, num_nodes=6, temperature=T, generator=g)
        counts[ids[len(prompt)]] += 1
    with torch.no_grad():
        p = torch.softmax(target(prompt.view(1, -1))[0, -1].float() / T, -1)
    expected = 0.5 * float(torch.sqrt(2 * p * (1 - p) / (math.pi * n)).sum())
    assert 0.5 * float((counts / n - p).abs().sum()) < 3 * expected, kind
    # the tree it drafts at T > 0 carries one q row per node, the token drawn from it
    drafter.set_sampling(T, torch.Generator().manual_seed(2))
    tree = drafter.draft(ids[:-1], max_nodes=6, max_depth=4)
    assert tree.num_nodes > 0 and tree.proposal_probs is not None and tree.proposal_probs.shape == (tree.num_nodes, V)
    assert bool((tree.proposal_probs[torch.arange(tree.num_nodes), tree.tokens] > 0).all())
    for parent in [-1, *range(tree.num_nodes)]:                             # siblings are distinct draws
        kids = [int(tree.tokens[c]) for c in tree.children(parent)]
        assert len(kids) == len(set(kids))
    drafter.set_sampling(0.0, None)                                         # T = 0: top ranks, no rows
    assert drafter.draft(ids[:-1], max_nodes=6, max_depth=4).proposal_probs is None
    with pytest.raises(ValueError, match="draft_mode"):
        _drafter(kind, target, draft_mode="beam")


def test_feature_drafter_state_matches_a_recomputation_after_every_commit():
    """After each pass the drafter's next feature must equal FeatureDrafter run from scratch over
    every true state of the committed context: a forgotten rollback of tree rows breaks it."""
    target = _lm()
    head = FeatureDrafter(target, generator=torch.Generator().manual_seed(0)).eval()
    drafter = EagleTreeDrafter(head, width=3)
    prompt = _prompt(8)

    commit = drafter.read_commit
    checked = []

    def check(context_ids, states_rows):        # the engine calls on_pass before the commits: check after
        commit(context_ids, states_rows)
        ids = context_ids                                                            # no re-prefill here
        states = _states(target, ids[:-1].view(1, -1), [])[:, :, -1]                # (1, T-1, D)
        with torch.no_grad():
            want = head(states, ids[1:].view(1, -1))[0, -1]
        torch.testing.assert_close(drafter._out, want, atol=1e-5, rtol=1e-4)
        checked.append(len(ids))

    drafter.read_commit = check
    out, stats = lineage_generate(target, drafter, prompt, 30, num_nodes=6)
    assert len(checked) >= stats.target_passes and checked[-1] == len(out)     # (start commits the prompt too)


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_eagle_chain_and_the_width_one_tree_draft_the_same_tokens(k):
    """The course has two EAGLE chain drafters: specdec-sampling's ``EagleDrafter`` (the engine's chain
    protocol, its own one-layer cache) and this module's ``EagleTreeDrafter(width=1)`` (a tree of
    width 1, a ``TreeDrafter``). Same head, same committed context: the same draft, token
    for token, in every round both reach, inside the window. The one drift, pinned here and named in
    the lesson ("One EAGLE drafter, two faces"): in round 1 the chain has no target states yet and
    drafts nothing, while the tree starts from the prefill's states and drafts k tokens. A chain that
    read a state one position off, or forgot to roll back its draft rows, fails the comparison."""
    target = _tiny_lm(2)                                   # window 48; 5 + 40 tokens stay inside it
    head = _trained_head(target)
    drafts = {"chain": {}, "tree": {}}

    class Chain(EagleDrafter):
        def propose(self, ids, k_round):
            draft = super().propose(ids, k_round)
            drafts["chain"][len(ids)] = draft.tokens.tolist()
            return draft

    class Tree(EagleTreeDrafter):
        def draft(self, ids, *, max_nodes, max_depth):
            tree = super().draft(ids, max_nodes=max_nodes, max_depth=max_depth)
            assert all(tree.parents[i] == i - 1 for i in range(tree.num_nodes))        # width 1: a chain
            drafts["tree"][len(ids)] = tree.tokens.tolist()
            return tree

    n = 40
    chain_ids, chain_stats = speculative_sample(target, Chain(head), _prompt(), n, k=k, temperature=0.0,
                                                use_cache=True)
    tree_ids, tree_stats = lineage_generate(target, Tree(head, width=1), _prompt(), n, num_nodes=k)
    assert chain_ids.tolist() == tree_ids.tolist() == cached_generate(target, _prompt(), n, temperature=0.0).tolist()
    first = len(_prompt())
    assert drafts["chain"][first] == [] and len(drafts["tree"][first]) == k          # the round-1 drift
    common = sorted(set(drafts["chain"]) & set(drafts["tree"]) - {first})
    assert len(common) >= 3                                                          # enough rounds to compare
    for length in common:
        a, b = drafts["chain"][length], drafts["tree"][length]
        m = min(len(a), len(b))                                                      # each loop's own budget cap
        assert m >= 1 and a[:m] == b[:m], (length, a, b)
    assert chain_stats.generated == tree_stats.generated == n


# -- bad input ---------------------------------------------------------------------------------------
def test_lineage_generate_refuses_bad_input():
    target = _lm()
    drafter = _drafter("medusa", target)
    with pytest.raises(ValueError, match="another model"):
        lineage_generate(_lm(5), drafter, _prompt(), 4)
    with pytest.raises(ValueError, match="num_nodes"):
        lineage_generate(target, drafter, _prompt(), 4, num_nodes=0)
    with pytest.raises(ValueError, match="acceptance"):
        lineage_generate(target, drafter, _prompt(), 4, acceptance="greedy")
    with pytest.raises(ValueError, match="epsilon"):
        lineage_generate(target, drafter, _prompt(), 4, acceptance="typical", epsilon=2.0)
    with pytest.raises(ValueError):
        lineage_generate(target, drafter, torch.tensor([V]), 4)
    with pytest.raises(ValueError):
        lineage_generate(target, drafter, torch.tensor([], dtype=torch.long), 4)
    with pytest.raises(TypeError, match="TransformerLM"):
        lineage_generate(object(), drafter, _prompt(), 4)


def test_drafters_refuse_the_wrong_head():
    target = _lm()
    with pytest.raises(TypeError, match="MedusaHeads"):
        MedusaDrafter(FeatureDrafter(target))
    with pytest.raises(TypeError, match="FeatureDrafter"):
        EagleTreeDrafter(MedusaHeads(target))
    with pytest.raises(TypeError, match="Eagle3Head"):
        Eagle3Drafter(FeatureDrafter(target))
    with pytest.raises(ValueError, match="block_size"):
        BlockDrafter(BlockHead(target, block_size=4), block_size=5)
    with pytest.raises(ValueError, match="width"):
        EagleTreeDrafter(FeatureDrafter(target), width=0)
    with pytest.raises(ValueError, match="shape must be 'dynamic'"):
        EagleTreeDrafter(FeatureDrafter(target), shape="bush")
    with pytest.raises(ValueError, match="only 3 heads"):
        MedusaDrafter(MedusaHeads(target, 3), [(0,), (0, 0), (0, 0, 0), (0, 0, 0, 0)])


# -- the shipped drafters --------------------------------------------------------------------------
@pytest.mark.ladder
def test_shipped_lineage_drafters_are_lossless_on_storylm_30m():
    """Each trained drafter loads on its own StoryLM-30M, drafts something the target accepts, and the
    greedy output equals plain cached decoding token for token."""
    from g2c.assets import load_model

    target, tok = load_model("StoryLM-30M", device="cpu")
    prompt = tok.encode("Once upon a time, there was a little dog named Max. Max liked to")
    want = cached_generate(target, prompt, 16, temperature=0.0).tolist()
    medusa, _ = load_model("StoryLM-30M-Medusa", device="cpu")
    eagle3, _ = load_model("StoryLM-30M-EAGLE3", device="cpu")
    block, _ = load_model("StoryLM-30M-Block", device="cpu")
    eagle, _ = load_model("StoryLM-30M-EAGLE", device="cpu")
    assert isinstance(medusa, MedusaHeads) and medusa.num_heads == 4
    assert eagle3.layers == fusion_layers(9) == block.layers
    drafters = {"medusa": MedusaDrafter(medusa), "eagle2": EagleTreeDrafter(eagle, width=4),
                "eagle3": Eagle3Drafter(eagle3), "block": BlockDrafter(block)}
    for name, drafter in drafters.items():
        out, stats = lineage_generate(drafter.base, drafter, prompt, 16, num_nodes=8)
        assert out.tolist() == want, name
        assert stats.accepted > 0, name


# -- the command line ------------------------------------------------------------------------------
def _cli(capsys, *argv):
    from g2c.specdec.__main__ import main

    rc = main(["--color", "never", "--device", "cpu", *argv])
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_width_needs_an_eagle_drafter(capsys):
    rc, _, err = _cli(capsys, "Once", "--drafter", "StoryLM-30M-Medusa", "--width", "4")
    assert rc == 1 and "--width 4 grows an EAGLE-2 tree" in err
    rc, _, err = _cli(capsys, "Once", "--drafter", "StoryLM-30M-EAGLE", "--width", "0")
    assert rc == 1 and "--width 0" in err


@pytest.mark.ladder
@pytest.mark.parametrize("argv", [["--drafter", "StoryLM-30M-Medusa"],
                                  ["--drafter", "StoryLM-30M-EAGLE", "--width", "4"],
                                  ["--drafter", "StoryLM-30M-Block", "--temperature", "0.8"]])
def test_cli_runs_the_lineage_drafters(capsys, argv):
    rc, out, err = _cli(capsys, "Once upon a time", "-k", "8", "--max-new-tokens", "10", *argv)
    assert rc == 0, err
    assert out.startswith("Once upon a time") and "target_passes" in out
    # one route: the engine's controls and its fast target reach the tree drafters too
    rc, fast, err = _cli(capsys, "Once upon a time", "-k", "8", "--max-new-tokens", "10", "--fast", *argv)
    assert rc == 0, err
    assert fast == out                                   # float32 fast path: the same tokens, passes and counters
    rc, _, err = _cli(capsys, "Once", "-k", "8", "--top-k", "5", "--temperature", "0.8", *argv)
    assert rc == 0, err
    rc, _, err = _cli(capsys, "Once", "-k", "8", "--controller", "heuristic", *argv)
    assert rc == 1 and "drop --controller/--no-cache" in err and err.count("\n") == 1


def test_bad_drafters_and_choices_are_refused_in_one_line():
    target = _lm()
    heads = MedusaHeads(target, 2)
    with pytest.raises(TypeError, match="wrap a head in its drafter"):
        lineage_generate(target, heads, _prompt(), 4)
    with pytest.raises(ValueError, match="encode it first"):
        lineage_generate(target, MedusaDrafter(heads), "Once upon", 4)
    with pytest.raises(ValueError, match=r"width must be an int in \[1, 32\]"):
        EagleTreeDrafter(FeatureDrafter(target), width=1000)
    for bad, error, match in (([0, 1], TypeError, "rank paths"), ([], ValueError, "empty"),
                              ([(V,)], ValueError, "vocabulary size")):      # ints, not paths: a wrong type
        with pytest.raises(error, match=match):
            MedusaDrafter(heads, bad)
    with pytest.raises(TypeError, match="ints"):
        MedusaDrafter(heads, [(0.7,)])
    with pytest.raises(ValueError, match="duplicate"):
        check_fusion_layers((0, 0, 1), 2)
    with pytest.raises(TypeError, match="ints"):
        check_fusion_layers((2.7, 4, 6), 9)
    assert check_fusion_layers((i for i in (6, 2, 4)), 9) == (2, 4, 6)     # a generator is read once
    with pytest.raises(ValueError, match="must hold probabilities"):
        typical_accept(torch.tensor([[float("nan"), 1.0]]), torch.tensor([0]))
    with pytest.raises(ValueError, match="must hold probabilities"):
        typical_accept(torch.tensor([[5.0, 1.0, 1.0, 1.0]]), torch.tensor([0]))
