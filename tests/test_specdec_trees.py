"""Beyond (specdec-trees): draft trees, tree attention, greedy and sampled tree verification.

Oracles: hand-built trees and logits for the mask and the walks; a plain causal forward over
context + root-to-node path for tree attention (every node, float32, 1e-4); the K/V rows of
a plain forward over the committed text for the KV commit; table-lookup LMs
(``tests/specdec_mocks.py``) whose greedy chain we follow by hand for the loop with every
builder; module 11's ``generate`` for tiny ``TransformerLM``s and the real ladder; the exact
target distribution (seeded generator, tolerance derived at each test) for sampled
verification, which must also reject a planted wrong variant; the lecture's 1.11 vs 1.40
for the tree formula.
"""

from __future__ import annotations

import math

import pytest
import torch
from specdec_mocks import SumModLM, TableLM, chain_table, follow_chain, random_next_of, refill_greedy, windowed_greedy

from g2c.kvcache import cached_generate
from g2c.specdec.trees import (
    DraftTree,
    build_dynamic_tree,
    build_static_tree,
    chain_choices,
    expected_tokens_per_pass,
    node_acceptance_probs,
    sample_children,
    sampled_acceptance_probs,
    static_choices,
    warp_probs,
)
from g2c.specdec.trees.attention import (
    cached_tree_forward,
    commit_tree_kv,
    tree_attention_mask,
    tree_forward,
    tree_logits,
)
from g2c.specdec.trees.verify import greedy_tree_verify, tree_speculative_generate, tree_speculative_verify
from g2c.transformer import TransformerLM

NEG = float("-inf")
# A 6-node tree:      root
#                    /    \
#                  n0      n1
#                 /  \       \
#               n2    n3      n5
#               |
#               n4
PARENTS = [-1, -1, 0, 0, 2, 1]
TOKENS = [1, 2, 3, 4, 5, 6]


def _tree(tokens=TOKENS, parents=PARENTS, q=None) -> DraftTree:
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), q)


def _tiny_lm(seed: int, *, max_seq_len: int = 32, vocab: int = 32) -> TransformerLM:
    g = torch.Generator().manual_seed(seed)
    model = TransformerLM(vocab, 16, 2, 2, max_seq_len, generator=g)
    with torch.no_grad():
        model.token_embed.weight.mul_(40.0)                                 # sharp logits, clear argmax gaps
    return model.eval()


def _onehot_rows(ids: list[int], vocab: int = 8) -> torch.Tensor:
    rows = torch.zeros(len(ids), vocab)
    rows[torch.arange(len(ids)), torch.tensor(ids)] = 3.0
    return rows


# -- representation and shapes (provided code) ----------------------------------------------
def test_draft_tree_depths_children_paths():
    t = _tree()
    assert t.depths.tolist() == [1, 1, 2, 2, 3, 2] and t.max_depth == 3 and t.num_nodes == 6
    assert t.children(-1) == [0, 1] and t.children(0) == [2, 3] and t.children(4) == []
    assert t.path(4) == [0, 2, 4] and t.path_tokens(5) == [2, 6] and t.path(-1) == []
    sub = t.truncate(1)
    assert sub.tokens.tolist() == [1, 2] and sub.parents.tolist() == [-1, -1]
    sub = t.subtree([1, 5])
    assert sub.parents.tolist() == [-1, 0] and sub.tokens.tolist() == [2, 6]


def test_draft_tree_rejects_bad_parents():
    with pytest.raises(ValueError, match="parents must be -1"):
        _tree(parents=[-1, 2, 0, 0, 2, 1])                                  # parent after child
    with pytest.raises(ValueError, match="parents must be -1"):
        _tree(parents=[0, -1, 0, 0, 2, 1])                                  # a node its own parent
    with pytest.raises(ValueError, match="one parent per node"):
        DraftTree(torch.tensor([1, 2]), torch.tensor([-1]))
    with pytest.raises(ValueError, match="proposal_probs"):
        _tree(q=torch.ones(5, 8))
    with pytest.raises(ValueError, match="kept without its parent"):
        _tree().subtree([2])


def test_static_choices_best_first_and_chain():
    assert chain_choices(3) == [(0,), (0, 0), (0, 0, 0)]
    # rank priors 0.6, 0.2, ...: (0,) .6, (0,0) .36, (0,0,0) .216, (1,) .2 are the best four
    assert static_choices(4) == [(0,), (1,), (0, 0), (0, 0, 0)]
    for n in (1, 4, 8, 16):
        c = static_choices(n)
        assert len(c) == n and all(x[:-1] in c for x in c if len(x) > 1)
    assert static_choices(5, rank_accept=(1.0,)) == chain_choices(5)
    with pytest.raises(ValueError, match="rank_accept"):
        static_choices(3, rank_accept=(1.5,))


def test_expected_tokens_per_pass_lecture_numbers():
    # The lecture's "1.11 vs 1.40 at the same 4-token budget", read as an entropic position
    # where each of the target's top candidates is accepted with probability 0.1.
    chain = DraftTree(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, 0, 1, 2]))
    fan = DraftTree(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, -1, -1, -1]))
    assert expected_tokens_per_pass(chain, torch.full((4,), 0.1)) == pytest.approx(1.1111)
    assert expected_tokens_per_pass(fan, torch.full((4,), 0.1)) == pytest.approx(1.40)
    alpha, k = 0.85, 4                                                      # the chain formula
    chain_tau = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert expected_tokens_per_pass(chain, torch.full((k,), alpha)) == pytest.approx(chain_tau)
    with pytest.raises(ValueError, match="accept_probs"):
        expected_tokens_per_pass(fan, torch.full((3,), 0.1))


# -- tree attention mask --------------------------------------------------------------------
def test_tree_attention_mask_by_hand():
    m = tree_attention_mask(2, torch.tensor([-1, -1, 0]))                  # C = 2, nodes n0, n1, n2 (child of n0)
    allowed = [[1, 0, 0, 0, 0],                                             # context row 0: causal
               [1, 1, 0, 0, 0],                                             # context row 1 (the root)
               [1, 1, 1, 0, 0],                                             # n0: context + itself
               [1, 1, 0, 1, 0],                                             # n1: context + itself, not its sibling
               [1, 1, 1, 0, 1]]                                             # n2: context + n0 + itself
    expected = torch.zeros(5, 5)
    expected[torch.tensor(allowed) == 0] = NEG
    assert m.dtype == torch.float32 and m.shape == (5, 5)
    assert torch.equal(m, expected)
    # The 6-node tree: n4 sees n0, n2 and itself only; n5 sees n1 and itself.
    m = tree_attention_mask(3, torch.tensor(PARENTS))
    sees = (m[3:, 3:] == 0).int()
    assert sees[4].tolist() == [1, 0, 1, 0, 1, 0] and sees[5].tolist() == [0, 1, 0, 0, 0, 1]
    assert (m[3:, :3] == 0).all() and (m[:3, 3:] == NEG).all()
    # An empty tree is the causal mask.
    assert torch.equal(tree_attention_mask(3, torch.tensor([], dtype=torch.long)) == 0,
                       torch.ones(3, 3, dtype=torch.bool).tril())


def test_tree_attention_mask_rejects_bad_input():
    with pytest.raises(ValueError, match="parents must be -1"):
        tree_attention_mask(2, torch.tensor([-1, 1]))
    with pytest.raises(ValueError, match="ctx_len"):
        tree_attention_mask(0, torch.tensor([-1]))
    with pytest.raises(ValueError, match="1-D integer"):
        tree_attention_mask(2, torch.tensor([[-1]]))


def test_tree_forward_matches_plain_forward_on_every_path():
    model = _tiny_lm(0)
    g = torch.Generator().manual_seed(5)
    for trial in range(3):
        ctx = torch.randint(0, 32, (4 + 3 * trial,), generator=g)
        n = 7
        parents = [-1] + [int(torch.randint(-1, i, (1,), generator=g)) for i in range(1, n)]
        tree = DraftTree(torch.randint(0, 32, (n,), generator=g), torch.tensor(parents))
        logits = tree_forward(model, ctx, tree)                             # (C + n, V)
        C = ctx.numel()
        assert logits.shape == (C + n, 32) and logits.dtype == torch.float32
        assert torch.allclose(logits[C - 1], model(ctx.unsqueeze(0))[0, -1], atol=1e-4)
        for i in range(n):
            path = torch.cat([ctx, torch.tensor(tree.path_tokens(i))])
            ref = model(path.unsqueeze(0))[0, -1]
            assert torch.allclose(logits[C + i], ref, atol=1e-4), (trial, i, (logits[C + i] - ref).abs().max())


def test_tree_forward_rejects_overlong_tree():
    model = _tiny_lm(0, max_seq_len=8)
    with pytest.raises(ValueError, match="max_seq_len"):
        tree_forward(model, torch.arange(6), DraftTree(torch.tensor([1, 2, 3]), torch.tensor([-1, 0, 1])))


def test_commit_tree_kv_matches_plain_cache():
    # The state transaction: after verification, the committed rows are exactly the K/V a
    # plain pass over context + accepted path builds, and only those rows survive.
    model = _tiny_lm(2)
    ctx = torch.tensor([3, 14, 15, 9, 2])
    C, tree = ctx.numel(), _tree()
    _, kv = tree_forward(model, ctx, tree, return_kv=True)
    path = [1, 5]                                                           # root -> n1 -> n5
    committed, moved = commit_tree_kv(kv, C, path)
    assert committed == C + 2
    H, d = 2, 8
    assert moved == model.num_layers * 2 * 2 * H * d * 4                    # L layers x (K, V) x 2 rows x H*d fp32
    plain_ids = torch.cat([ctx, torch.tensor(tree.path_tokens(5))])
    plain_logits, plain_kv = tree_forward(model, plain_ids, None, return_kv=True)
    assert torch.allclose(plain_logits, model(plain_ids.unsqueeze(0))[0], atol=1e-4)
    for (k, v), (pk, pv) in zip(kv, plain_kv):
        assert torch.allclose(k[:, :committed], pk, atol=1e-5)
        assert torch.allclose(v[:, :committed], pv, atol=1e-5)
    # The same gather on cache-shaped buffers (B, H, T_max, d) with spare capacity.
    _, kv = tree_forward(model, ctx, tree, return_kv=True)
    buffers = [(torch.cat([k, torch.zeros(H, 9, d)], dim=1).unsqueeze(0),
                torch.cat([v, torch.zeros(H, 9, d)], dim=1).unsqueeze(0)) for k, v in kv]
    assert commit_tree_kv(buffers, C, path) == (committed, moved)
    for (k, v), (pk, pv) in zip(buffers, plain_kv):
        assert torch.allclose(k[0, :, :committed], pk, atol=1e-5) and torch.allclose(v[0, :, :committed], pv, atol=1e-5)
    # A chain's accepted prefix already sits in place: committing moves no bytes.
    chain = DraftTree(torch.tensor([4, 5, 6]), torch.tensor([-1, 0, 1]))
    _, kv = tree_forward(model, ctx, chain, return_kv=True)
    assert commit_tree_kv(kv, C, [0, 1]) == (C + 2, 0)
    with pytest.raises(ValueError, match="strictly increasing"):
        commit_tree_kv(kv, C, [1, 0])


def test_cached_tree_forward_and_commit_on_kvcache():
    # The tree pass on module 16's KVCache reads the committed rows + the tree's own rows; the
    # commit gathers the accepted path into contiguous rows (a copy) and moves the pointer.
    from g2c.kvcache import KVCache, cached_forward

    model = _tiny_lm(2)
    ctx = torch.tensor([3, 14, 15, 9, 2])
    C, tree = ctx.numel(), _tree()
    cache = KVCache.for_model(model)
    cached_forward(model, ctx[:-1].unsqueeze(0), cache)                    # everything but the root
    logits = cached_tree_forward(model, cache, int(ctx[-1]), tree)          # (n+1, V)
    assert cache.length == C - 1                                            # written, not committed
    torch.testing.assert_close(logits, tree_forward(model, ctx, tree)[C - 1:], atol=1e-4, rtol=0)
    path = [1, 5]                                                           # root -> n1 -> n5
    committed, moved = commit_tree_kv(cache, C, path)
    assert committed == cache.length == C + 2
    assert moved == model.num_layers * 2 * 2 * 2 * 8 * 4                    # L x (K, V) x 2 rows x H*d fp32
    plain = KVCache.for_model(model)
    cached_forward(model, torch.cat([ctx, torch.tensor(tree.path_tokens(5))]).unsqueeze(0), plain)
    for layer in range(model.num_layers):
        torch.testing.assert_close(cache.keys(layer), plain.keys(layer), atol=1e-5, rtol=0)
        torch.testing.assert_close(cache.values(layer), plain.values(layer), atol=1e-5, rtol=0)
    # A pointer move alone (the chain's commit) would keep n0's and n1's rows: wrong state.
    cache.crop(C - 1)
    cached_tree_forward(model, cache, int(ctx[-1]), tree)
    cache.advance(1 + len(path))
    assert not torch.allclose(cache.keys(0), plain.keys(0), atol=1e-3)
    with pytest.raises(ValueError, match="past ctx_len"):
        commit_tree_kv(cache, C - 2, [0])


@pytest.mark.parametrize("kind", ["chain", "static", "dynamic"])
def test_cached_tree_loop_is_a_state_transaction(kind):
    # After every pass the target's committed cache rows equal plain cached decoding of the
    # emitted tokens (1e-5), and the output is the uncached loop's (the target's greedy text).
    import copy

    from g2c.kvcache import KVCache, cached_forward

    target = _tiny_lm(0, max_seq_len=40)
    drafter = copy.deepcopy(target)                                         # agrees often, not always
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for blk in drafter.blocks:
            blk.mlp.fc.weight.add_(0.3 * torch.randn(blk.mlp.fc.weight.shape, generator=g))
    prompt = [3, 14, 15, 9]
    seq = list(prompt)
    cache = KVCache.for_model(target)
    checked = []

    def committed_state_is_plain():
        plain = KVCache.for_model(target)
        cached_forward(target, torch.tensor([seq[:-1]]), plain)
        assert cache.length == len(seq) - 1
        for layer in range(target.num_layers):
            torch.testing.assert_close(cache.keys(layer), plain.keys(layer), atol=1e-5, rtol=0)
            torch.testing.assert_close(cache.values(layer), plain.values(layer), atol=1e-5, rtol=0)

    def check(emitted, num_accepted):
        # the engine calls on_pass after the cut, before the commits: the committed rows are still
        # those of the previous round's commit (the prefill's on the first), then this round's follow
        committed_state_is_plain()
        seq.extend(emitted)
        checked.append(num_accepted)

    out, stats = tree_speculative_generate(target, drafter, prompt, 24, tree=kind, num_nodes=6,
                                           target_cache=cache, on_pass=check)
    committed_state_is_plain()                                              # after the last commit
    ref, ref_stats = tree_speculative_generate(target, drafter, prompt, 24, tree=kind, num_nodes=6)
    assert out.tolist() == ref.tolist() == seq
    assert len(checked) == stats.target_passes == ref_stats.target_passes and stats.accepted > 0
    assert stats.kv_rows_dropped == stats.drafted - stats.accepted
    if kind == "chain":
        assert stats.kv_bytes_moved == 0                                    # accepted drafts already in place
    else:
        assert stats.kv_bytes_moved > 0                                     # off-first-branch paths were gathered
    # Past the window the cached tree loop re-prefills where module 16's cached_generate does.
    past, _ = tree_speculative_generate(target, drafter, prompt, 40, tree=kind, use_cache=True)
    assert past.tolist() == cached_generate(target, prompt, 40, temperature=0.0).tolist()


# -- greedy walk ----------------------------------------------------------------------------
def test_greedy_tree_verify_by_hand():
    t = _tree()
    # Rows are (root, n0, ..., n5). Root wants 1 (n0), n0 wants 4 (n3), n3 wants 7 (a leaf: bonus).
    logits = _onehot_rows([1, 4, 0, 0, 7, 0, 0])
    assert greedy_tree_verify(t, logits) == ([0, 3], 7)
    # Root wants 2: the second child n1; n1 wants 5 but its child holds 6: correction 5.
    logits = _onehot_rows([2, 0, 5, 0, 0, 0, 0])
    assert greedy_tree_verify(t, logits) == ([1], 5)
    # No child of the root matches: nothing accepted, the correction comes from row 0.
    assert greedy_tree_verify(t, _onehot_rows([7, 1, 1, 1, 1, 1, 1])) == ([], 7)


def test_greedy_tree_verify_bonus_at_leaf():
    t = _tree()
    logits = _onehot_rows([1, 3, 0, 5, 0, 6, 0])                            # n0 -> n2 -> n4, leaf: bonus 6
    assert greedy_tree_verify(t, logits) == ([0, 2, 4], 6)
    assert greedy_tree_verify(DraftTree.empty(), _onehot_rows([3])) == ([], 3)


def test_greedy_tree_verify_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"target_logits must have shape \(n\+1, V\) = \(7, V\)"):
        greedy_tree_verify(_tree(), torch.zeros(6, 8))
    with pytest.raises(TypeError, match="DraftTree"):
        greedy_tree_verify([1, 2], torch.zeros(3, 8))


BUILDERS = [("chain", {}), ("static", {}), ("dynamic", {}), ("dynamic", {"width": 1}),
            ("static", {"choices": [(0,), (1,), (2,), (0, 0), (1, 0), (2, 0)]})]


def test_tree_generate_greedy_matches_argmax_chain_every_builder():
    # Property test: random target and drafter successor tables, every builder and budget;
    # the output is always the target's greedy chain.
    g = torch.Generator().manual_seed(11)
    V = 8
    for trial in range(4):
        target_next, drafter_next = random_next_of(V, g), random_next_of(V, g)
        if trial == 0:
            drafter_next = target_next                                      # a perfect drafter too
        target = TableLM(chain_table(target_next, generator=g))
        drafter = TableLM(chain_table(drafter_next, margin=0.3, generator=g))   # unsure: ranks matter
        start = int(torch.randint(0, V, (1,), generator=g))
        expected = [start] + follow_chain(target_next, start, 15)
        for kind, kw in BUILDERS:
            for n in (1, 4, 8):
                out, stats = tree_speculative_generate(target, drafter, [start], 15, tree=kind, num_nodes=n, **kw)
                assert out.tolist() == expected, (trial, kind, kw, n)
                assert stats.generated == 15 and stats.tokens_per_pass >= 1.0
                assert stats.accepted <= stats.drafted and stats.target_passes <= 15
                if trial == 0 and kind == "chain":
                    assert stats.target_passes == math.ceil(15 / (n + 1))


def test_tree_generate_equals_module_11_generate():
    from g2c.sampling import generate

    target, drafter = _tiny_lm(0), _tiny_lm(1, max_seq_len=12)
    prompt = torch.tensor([3, 14, 15, 9])
    expected = generate(target, prompt, 16, temperature=0.0).tolist()
    for kind in ("chain", "static", "dynamic"):
        out, stats = tree_speculative_generate(target, drafter, prompt, 16, tree=kind, num_nodes=6)
        assert out.tolist() == expected, kind
        assert stats.generated == 16


def test_tree_generate_respects_budget_and_eos():
    g = torch.Generator().manual_seed(0)
    nxt = [1, 2, 3, 4, 5, 6, 7, 0]
    target = TableLM(chain_table(nxt, generator=g))
    drafter = TableLM(target.table.clone())
    for n in (1, 2, 5):
        out, stats = tree_speculative_generate(target, drafter, [3], n, tree="dynamic", num_nodes=8)
        assert out.tolist() == [3] + follow_chain(nxt, 3, n) and stats.generated == n
    out, stats = tree_speculative_generate(target, drafter, [0], 10, tree="static", num_nodes=8, eos_id=3)
    assert out.tolist() == [0, 1, 2, 3] and stats.target_passes == 1 and stats.accepted == 3
    out, stats = tree_speculative_generate(target, drafter, [0], 0)
    assert out.tolist() == [0] and stats.target_passes == 0
    with pytest.raises(ValueError, match="num_nodes"):
        tree_speculative_generate(target, drafter, [0], 4, num_nodes=0)
    with pytest.raises(ValueError, match="tree must be"):
        tree_speculative_generate(target, drafter, [0], 4, tree="forest")
    for tree in ("dynamic", "chain"):                        # choices shape a static tree: never ignored
        with pytest.raises(ValueError, match="choices shape a static tree only"):
            tree_speculative_generate(target, drafter, [0], 4, tree=tree, choices=[(0,), (1,)])
    for empty in ([], (), iter([])):                         # an empty tree would decode plainly, in silence
        with pytest.raises(ValueError, match="choices is empty"):
            tree_speculative_generate(target, drafter, [0], 4, tree="static", choices=empty)
    with pytest.raises(ValueError, match="vocab_size"):
        tree_speculative_generate(target, TableLM(torch.zeros(3, 3)), [0], 4)


# -- sampled walk ---------------------------------------------------------------------------
def _wrong_verify_no_residual(tree: DraftTree, probs: torch.Tensor, generator) -> tuple[list[int], int]:
    """The planted wrong variant (depth-1 trees): every child is tried against the unchanged
    p, and the final sample comes from p instead of the residual."""
    p = probs[0].double()
    for child in tree.children(-1):
        x = int(tree.tokens[child])
        q = 1.0 if tree.proposal_probs is None else float(tree.proposal_probs[child, x])
        if float(torch.rand(1, generator=generator, dtype=torch.float64)) * q < float(p[x]):
            return [child], x
    return [], int(torch.multinomial(p, 1, generator=generator))


def _first_token_freqs(verify, make_tree, probs: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(probs.shape[1])
    for _ in range(n):
        tree = make_tree(g)
        path, token = verify(tree, probs, generator=g)
        counts[int(tree.tokens[path[0]]) if path else token] += 1
    return counts / n


def test_tree_speculative_verify_matches_target_distribution():
    # SpecInfer, Theorem 4.2: the first emitted token follows p whatever the children are.
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    # Tolerance: each frequency is a mean of N Bernoulli(p_v) draws, std <= 0.5/sqrt(N) =
    # 0.01 at N = 2,500; we allow 0.05 (5 std, per-token failure probability < 6e-7).
    n, tol = 2500, 0.05
    fixed = _tree(tokens=[2, 3, 1], parents=[-1, -1, -1])                   # deterministic top-rank children

    def fixed_tree(g):
        return fixed

    def iid_tree(g):                                                        # two children drawn i.i.d. from q
        kids = torch.multinomial(q, 2, replacement=True, generator=g)
        return DraftTree(kids, torch.tensor([-1, -1]), q.expand(2, 4).clone())

    def wor_tree(g):                                                        # drawn without replacement
        a = int(torch.multinomial(q, 1, generator=g))
        q2 = q.clone()
        q2[a] = 0.0
        q2 /= q2.sum()
        b = int(torch.multinomial(q2, 1, generator=g))
        return DraftTree(torch.tensor([a, b]), torch.tensor([-1, -1]), torch.stack([q, q2]))

    probs = torch.stack([p, *[torch.full((4,), 0.25)] * 3])                 # (n+1, V) for 3 nodes
    for make in (fixed_tree, iid_tree, wor_tree):
        rows = probs[:make(torch.Generator().manual_seed(0)).num_nodes + 1]
        freqs = _first_token_freqs(tree_speculative_verify, make, rows, n, seed=3)
        assert torch.allclose(freqs, p, atol=tol), (make.__name__, freqs.tolist())
    # The planted wrong variant on the fixed tree [2, 3, 1]: child 2 accepted with p(2) = 0.2,
    # 3 never, 1 with 0.8 * 0.3 = 0.24, else (0.56) a sample of p: it emits
    # [0.28, 0.408, 0.312, 0], off by 0.22 at token 0 (more than 3x the tolerance).
    freqs = _first_token_freqs(_wrong_verify_no_residual, fixed_tree, probs, n, seed=3)
    assert (freqs - p).abs().max() > 3 * tol, freqs.tolist()



def _one_hot_q_verify(tree: DraftTree, probs: torch.Tensor, generator) -> tuple[list[int], int]:
    """The planted wrong variant: ignore ``proposal_probs`` and treat every q as one-hot at
    its child's token. Its output is still distributed as p (it is the rule for deterministic
    drafts), so only the acceptance rate shows the mistake."""
    return tree_speculative_verify(DraftTree(tree.tokens, tree.parents), probs, generator=generator)


def test_tree_speculative_verify_uses_the_proposal_probs():
    """Acceptance, not just the distribution: with children drawn from q, SpecInfer's rule
    accepts x with min(1, p(x)/q(x)). Two i.i.d. children of q = [0.1, 0.2, 0.3, 0.4] under
    p = [0.5, 0.3, 0.2, 0]: the first is accepted with sum min(p, q) = 0.5; after a rejection
    p' = normalize(max(0, p - q)) = [0.8, 0.2, 0, 0] and the second with sum min(p', q) = 0.3,
    so a child is accepted with 0.5 + 0.5 * 0.3 = 0.65. Treating q as one-hot accepts x with
    p(x) only: about 0.30 (0.17 for the first child). Tolerance: the rate is a mean of N = 4,000
    Bernoulli(0.65) draws, std 0.0075; we allow 0.04 (over 5 std), and the wrong variant sits
    0.35 away (more than 8x the tolerance)."""
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    probs = torch.stack([p, torch.full((4,), 0.25), torch.full((4,), 0.25)])   # (n+1, V), 2 children
    n, tol, want = 4000, 0.04, 0.65

    def rate(verify) -> float:
        g = torch.Generator().manual_seed(11)
        accepted = 0
        for _ in range(n):
            kids = torch.multinomial(q, 2, replacement=True, generator=g)
            path, _ = verify(DraftTree(kids, torch.tensor([-1, -1]), q.expand(2, 4).clone()), probs, generator=g)
            accepted += bool(path)
        return accepted / n

    assert abs(rate(tree_speculative_verify) - want) < tol
    assert rate(_one_hot_q_verify) < want - 8 * tol                          # the planted wrong variant: ~0.30


def test_tree_speculative_verify_bonus_at_leaf():
    # p == one-hot at the drafted token: always accepted, then the bonus comes from the leaf's row.
    t = DraftTree(torch.tensor([2]), torch.tensor([-1]))
    probs = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        assert tree_speculative_verify(t, probs, generator=g) == ([0], 3)
    # p(x) = 0: never accepted, never emitted.
    probs = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0]])
    for _ in range(20):
        path, tok = tree_speculative_verify(t, probs, generator=g)
        assert path == [] and tok in (0, 1)
    with pytest.raises(ValueError, match="target_probs must have shape"):
        tree_speculative_verify(t, torch.ones(3, 4) / 4)


def test_tree_speculative_generate_joint_first_two_tokens():
    # End to end: the joint law of the first two emitted tokens equals plain sampling,
    # p(x1 | 0) p(x2 | x1), for the static and dynamic trees.
    V, T = 4, 1.0
    g = torch.Generator().manual_seed(21)
    target = TableLM(torch.randn(V, V, generator=g) * 1.5)
    drafter = TableLM(torch.randn(V, V, generator=g) * 1.5)
    p = torch.softmax(target.table / T, dim=-1)                             # (V, V): row = previous token
    exact = p[0].view(V, 1) * p                                             # (x1, x2)
    # Tolerance: cell (x1, x2) is a mean of N Bernoulli(pi) draws, std sqrt(pi(1-pi)/N) <= 0.5/sqrt(N)
    # = 0.0144 at N = 1,200; 0.07 is 4.8 std (per cell < 2e-6, 16 cells x 2 trees < 1e-4).
    # (The chain is a static shape: the static tree covers its code path.)
    # draft_mode="sample" (issue 29): children drawn without replacement from the drafter's q and
    # verified with those rows; the dynamic shape is chosen from top ranks, then filled by sampling
    # with the static builder's sampled path (so one sampled run covers both builders' code).
    n = 1200
    for kind, mode in (("static", "top"), ("dynamic", "top"), ("dynamic", "sample")):
        gen = torch.Generator().manual_seed(4)
        counts = torch.zeros(V, V)
        for _ in range(n):
            out, _ = tree_speculative_generate(target, drafter, [0], 2, tree=kind, num_nodes=3,
                                               temperature=T, generator=gen, draft_mode=mode)
            counts[out[1], out[2]] += 1
        assert torch.allclose(counts / n, exact, atol=0.07), (kind, mode, (counts / n - exact).abs().max())


# -- sampled drafting (issue 29) -------------------------------------------------------------
class _RowDrafter:
    """A drafter answering the builders' ``tree_probs`` hook with one row per depth."""

    def __init__(self, rows: torch.Tensor) -> None:
        self.rows, self.vocab_size = rows, rows.shape[1]

    def tree_probs(self, ctx_ids, tree: DraftTree) -> torch.Tensor:
        depth = torch.cat([torch.zeros(1, dtype=torch.long), tree.depths]).clamp(max=self.rows.shape[0] - 1)
        return self.rows[depth]                                             # (n+1, V)


def _sampled_first_token_freqs(make_tree, p: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(p.numel())
    for _ in range(n):
        tree = make_tree(g)
        probs = torch.cat([p.view(1, -1), torch.full((tree.num_nodes, p.numel()), 1.0 / p.numel())])
        path, token = tree_speculative_verify(tree, probs, generator=g)
        counts[int(tree.tokens[path[0]]) if path else token] += 1
    return counts / n


def test_sampled_siblings_follow_the_target_and_the_classic_mistakes_do_not():
    """Two siblings drawn WITHOUT replacement from q = [0.05, 0.85, 0.10] (``build_static_tree(...,
    sample=True)``), verified by the multi-draft rule under p = [0.5, 0.1, 0.4]: the first emitted
    token follows p. Two planted mistakes, each with its exact law (computed by enumerating the
    draws and the rule's branches):

    * siblings drawn without replacement but every one verified against the unmodified q (the
      residual q of the second draw not renormalised): [0.3, 0.1, 0.6], off by 0.2;
    * siblings drawn WITH replacement but verified with the without-replacement rows:
      [0.755, 0.1, 0.145], off by 0.255. (Drawn with replacement AND verified against q each
      time is SpecInfer's original rule, exact but wasteful: a repeated token is never accepted.)

    Tolerance: each frequency is a mean of N = 2,000 Bernoulli draws, std <= 0.5/sqrt(N) = 0.0112;
    we allow 0.05 (4.5 std, per-token failure probability < 7e-6), and both mistakes sit at least
    4x the tolerance away (we require 3x)."""
    p = torch.tensor([0.5, 0.1, 0.4])
    q = torch.tensor([0.05, 0.85, 0.10])
    drafter = _RowDrafter(q.view(1, 3))
    ctx = torch.tensor([0])
    n, tol = 2000, 0.05

    def right(g):
        tree, passes = build_static_tree(drafter, ctx, [(0,), (1,)], sample=True, generator=g)
        assert passes == 1 and tree.tokens[0] != tree.tokens[1]          # distinct siblings
        return tree

    def q_not_renormalised(g):
        tree = right(g)
        return DraftTree(tree.tokens, tree.parents, q.expand(2, 3).clone())

    def with_replacement(g):
        kids = torch.multinomial(q, 2, replacement=True, generator=g)
        rest = q.clone()
        rest[kids[0]] = 0.0
        return DraftTree(kids, torch.tensor([-1, -1]), torch.stack([q, rest / rest.sum()]))

    freqs = _sampled_first_token_freqs(right, p, n, seed=5)
    assert torch.allclose(freqs, p, atol=tol), freqs.tolist()
    for wrong, law in ((q_not_renormalised, [0.3, 0.1, 0.6]), (with_replacement, [0.755, 0.1, 0.145])):
        freqs = _sampled_first_token_freqs(wrong, p, n, seed=5)
        assert (freqs - p).abs().max() > 3 * tol, (wrong.__name__, freqs.tolist())
        assert torch.allclose(freqs, torch.tensor(law), atol=tol), (wrong.__name__, freqs.tolist())


def test_sample_children_rows_and_sampled_builders():
    q = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.0])
    tokens, rows = sample_children(q, 6, generator=torch.Generator().manual_seed(0))
    assert sorted(tokens) == [0, 1, 2, 3]                                   # distinct, never the 0-prob token
    rest = q.clone()
    for x, row in zip(tokens, rows):                                        # row j = q without earlier draws
        torch.testing.assert_close(row, rest / rest.sum())
        rest[x] = 0.0
    # Static: slots past what q can give are dropped with their subtrees; the tree carries its rows.
    drafter = _RowDrafter(torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]))
    tree, _ = build_static_tree(drafter, torch.tensor([0]), [(0,), (1,), (2,), (0, 0), (2, 0)], sample=True,
                                generator=torch.Generator().manual_seed(1))
    assert tree.num_nodes == 3 and tree.parents.tolist() == [-1, -1, 0]
    assert tree.proposal_probs.shape == (3, 3) and sorted(tree.tokens[:2].tolist()) == [0, 1]
    # Dynamic: the shape (rank paths) is the deterministic search's, valued with the warped q at T;
    # sampling fills it.
    g = torch.Generator().manual_seed(2)
    model = TableLM(torch.randn(6, 6, generator=g))

    class Warped:                                                           # the same LM's q at T = 0.8
        vocab_size = 6

        def tree_probs(self, ctx_ids, tree):
            return warp_probs(torch.softmax(tree_logits(model, ctx_ids, tree).float(), dim=-1), 0.8)

    top, _ = build_dynamic_tree(Warped(), torch.tensor([0, 1]), 6, width=2)
    drawn, passes = build_dynamic_tree(model, torch.tensor([0, 1]), 6, width=2, sample=True, temperature=0.8,
                                       generator=g)
    assert drawn.parents.tolist() == top.parents.tolist() and drawn.proposal_probs.shape == (6, 6)
    # Where warping changes the values, it changes the shape: q = [0.6, 0.38, 0.02] at every node keeps a
    # sibling over the chain's second node at T = 1 (0.38 > 0.36), a chain at T = 0.5 (0.29 < 0.51).
    flat = _RowDrafter(torch.tensor([[0.6, 0.38, 0.02]]))
    assert build_dynamic_tree(flat, torch.tensor([0]), 2, width=2)[0].parents.tolist() == [-1, -1]
    chain, _ = build_dynamic_tree(flat, torch.tensor([0]), 2, width=2, sample=True, temperature=0.5,
                                  generator=torch.Generator().manual_seed(3))
    assert chain.parents.tolist() == [-1, 0]
    assert top.proposal_probs is None and passes > 0
    for i in range(drawn.num_nodes):                                        # each token drawn from its row
        assert float(drawn.proposal_probs[i, drawn.tokens[i]]) > 0.0
    with pytest.raises(ValueError, match="temperature > 0"):
        build_static_tree(drafter, torch.tensor([0]), [(0,)], sample=True, temperature=0.0)
    with pytest.raises(ValueError, match="draft_mode"):
        tree_speculative_generate(model, model, [0], 2, draft_mode="beam")


def test_warp_probs_is_softmax_of_logits_over_t_even_at_a_tiny_t():
    """warp_probs(softmax(z), T) = softmax(z / T); at T = 1e-3 p ** (1 / T) underflows to 0 / 0, the
    log-domain form gives the one-hot row, and zero entries stay zero at every T."""
    z = torch.tensor([2.0, 1.0, -0.5, 0.3])
    for t in (0.5, 0.8, 2.0):
        torch.testing.assert_close(warp_probs(torch.softmax(z, -1), t), torch.softmax(z / t, -1))
    tiny = warp_probs(torch.tensor([[0.5, 0.3, 0.2, 0.0]]), 1e-3)
    assert torch.isfinite(tiny).all() and tiny.tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert warp_probs(torch.tensor([0.0, 0.6, 0.4]), 3.0)[0] == 0.0
    tokens, _ = sample_children(tiny[0], 2, generator=torch.Generator().manual_seed(0))
    assert tokens == [0]                                                    # one token q can give
    for bad_t in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="finite number > 0"):
            warp_probs(torch.tensor([0.0, 0.5, 0.5]), bad_t)
    for q, k in ((torch.ones(2, 3) / 3, 1), (torch.ones(3) / 3, -1)):
        with pytest.raises(ValueError, match=r"q must be one row \(V,\) and k an int >= 0"):
            sample_children(q, k)


def test_sampled_acceptance_probs_matches_the_rule():
    # One-hot rows: the deterministic formula. With rows: p = [0.5, 0.3, 0.2, 0], q = [0.1, 0.2, 0.3,
    # 0.4] for two i.i.d. children [2, 0]: a = min(1, 0.2/0.3) = 2/3, then p' = [0.8, 0.2, 0, 0]
    # and a = (1/3) * min(1, 0.8/0.1) = 1/3.
    tree = _tree()
    probs = torch.softmax(torch.randn(7, 8, generator=torch.Generator().manual_seed(3)), dim=-1)
    torch.testing.assert_close(sampled_acceptance_probs(tree, probs), node_acceptance_probs(tree, probs))
    p, q = torch.tensor([0.5, 0.3, 0.2, 0.0]), torch.tensor([0.1, 0.2, 0.3, 0.4])
    sampled = DraftTree(torch.tensor([2, 0]), torch.tensor([-1, -1]), q.expand(2, 4).clone())
    a = sampled_acceptance_probs(sampled, torch.stack([p, p, p]))
    torch.testing.assert_close(a, torch.tensor([2 / 3, 1 / 3]))


def test_tree_formula_matches_simulation():
    # The lecture's reading: the target is uniform over 10 tokens (each of them accepted with
    # probability 0.1). Chain of 4 -> E[tau] = 1.1111; four siblings -> 1.40.
    V = 10
    chain = DraftTree(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, 0, 1, 2]))
    fan = DraftTree(torch.tensor([1, 2, 3, 4]), torch.tensor([-1, -1, -1, -1]))
    probs = torch.full((5, V), 1.0 / V)
    # Tolerance: tau - 1 is at most 4 with variance <= 0.24 (fan: Bernoulli(0.4)), so the
    # mean of N = 2,000 has std <= 0.011; 0.05 is 4.5 std.
    g = torch.Generator().manual_seed(8)
    for tree, expected in ((chain, 1.1111), (fan, 1.40)):
        tau = [len(tree_speculative_verify(tree, probs, generator=g)[0]) + 1 for _ in range(2000)]
        assert abs(sum(tau) / len(tau) - expected) < 0.05
        assert expected_tokens_per_pass(tree, torch.full((4,), 0.1)) == pytest.approx(expected, abs=1e-4)


# -- the ladder -----------------------------------------------------------------------------
@pytest.mark.ladder
def test_tree_greedy_equals_plain_greedy_on_ladder():
    from g2c.assets import load_model
    from g2c.sampling import generate

    target, tok = load_model("StoryLM-30M", device="cpu")
    drafter, _ = load_model("StoryLM-1M", device="cpu")
    prompt = tok.encode("Once upon a time, there was a little dog named")
    expected = generate(target, prompt, 12, temperature=0.0).tolist()
    for kind in ("static", "dynamic"):
        out, stats = tree_speculative_generate(target, drafter, prompt, 12, tree=kind, num_nodes=8)
        assert out.tolist() == expected, kind
        assert stats.tokens_per_pass > 1.0                                  # the 1M drafter helps the 30M
        cached, _ = tree_speculative_generate(target, drafter, prompt, 12, tree=kind, num_nodes=8, use_cache=True)
        assert cached.tolist() == expected, kind                            # the target's KVCache path
    tree, _ = build_dynamic_tree(drafter, torch.tensor(prompt), 8)
    assert tree.num_nodes == 8
    static, passes = build_static_tree(drafter, torch.tensor(prompt), static_choices(8))
    assert static.num_nodes == 8 and passes == static.max_depth


@pytest.mark.parametrize("num_nodes", range(1, 7))
def test_tree_loop_equals_plain_decoding_at_the_window_edge(num_nodes):
    """The shared window-edge rule (``g2c.specdec.draft_room``) for trees: a pass holds at most
    min(num_nodes, window - visible context) nodes, so no node's row loses context. With a
    model whose next token depends on every visible id (``SumModLM``: sum mod 7, window 8,
    prompt [1, 2]) the greedy tree loop is module 11's plain greedy decoding uncached, and
    module 16's ``cached_generate`` (re-prefill at the same points) cached, for every tree
    kind and node budget, up to the window edge and past it. Before, an uncached tree cropped
    the context by its depth and the cached loop refused to run past the window."""
    target, drafter = SumModLM(max_seq_len=8), SumModLM(max_seq_len=8)
    for n in (7, 15):
        for kind in ("chain", "static", "dynamic"):
            for use_cache in (False, True):
                out, stats = tree_speculative_generate(target, drafter, [1, 2], n, tree=kind, num_nodes=num_nodes,
                                                       width=2 if kind == "dynamic" else None,
                                                       use_cache=use_cache)
                want = (refill_greedy if use_cache else windowed_greedy)(target, [1, 2], n)
                assert out.tolist() == want, f"{kind}, use_cache={use_cache}, {n} tokens"
                assert stats.generated == n


@pytest.mark.parametrize("window", [2, 3, 5])
@pytest.mark.parametrize("kind", ["chain", "static", "dynamic"])
def test_cached_tree_target_at_tiny_windows_equals_recompute(window, kind):
    """CachedTarget scoring trees at windows smaller than the tree: greedy is cached_generate (past the
    window too), and a seeded sampled run inside the window is the recompute run token for token."""
    target, drafter = _tiny_lm(1, max_seq_len=window), _tiny_lm(2, max_seq_len=window)
    width = {"dynamic": 3}.get(kind)
    for plen in (1, window):
        prompt = list(range(3, 3 + plen))
        got, _ = tree_speculative_generate(target, drafter, prompt, 2 * window + 3, tree=kind, num_nodes=8,
                                           width=width, use_cache=True)
        assert got.tolist() == cached_generate(target, prompt, 2 * window + 3, temperature=0.0).tolist()
        room = window + 1 - plen
        runs = [tree_speculative_generate(target, drafter, prompt, room, tree=kind, num_nodes=8, width=width,
                                          temperature=0.9, draft_mode="sample", use_cache=cached,
                                          generator=torch.Generator().manual_seed(4))[0].tolist()
                for cached in (False, True)]
        assert runs[0] == runs[1]


def test_cached_target_refuses_bad_arguments_at_the_door():
    from g2c.kvcache import KVCache
    from g2c.specdec.sampling.target import CachedTarget

    target = _tiny_lm(1, max_seq_len=6)
    for bad in (1, "ab", [1.7], [True]):                     # a float or a bool was truncated to a block
        with pytest.raises(TypeError, match="layers must be None or a sequence of block indices"):
            CachedTarget(target, layers=bad)
    with pytest.raises(ValueError, match="layers must be None"):
        CachedTarget(target, layers=[target.num_layers])
    with pytest.raises(ValueError, match="max_seq_len >= 6"):
        CachedTarget(target, cache=KVCache.for_model(target, max_seq_len=4))      # used to overflow mid-run
    with pytest.raises(ValueError, match="B=2"):
        CachedTarget(target, cache=KVCache.for_model(target, batch_size=2))
    state = CachedTarget(target)
    with pytest.raises(RuntimeError, match="commit before score"):
        state.commit(torch.tensor([1, 2]), 0)
    state.start(torch.tensor([1, 2, 3]))
    with pytest.raises(TypeError, match="takes a Draft"):
        state.score(torch.tensor([1, 2, 3]), [4, 5])
    with pytest.raises(ValueError, match="does not fit the window"):          # 4 nodes, room for 3
        state.score(torch.tensor([1, 2, 3]), DraftTree(torch.tensor([4, 5, 6, 7]), torch.tensor([-1, -1, 0, 0])))
