"""Beyond (specdec): SpecStats, draft_greedy, verification, the speculative loop, MTP.

Oracles: hand-built logits for the verifiers; table-lookup LMs (``tests/specdec_mocks.py``)
whose greedy chain we follow by hand for the loop; torch-free bookkeeping for the counters;
module 11's ``generate`` as the reference for the integration test with real
``TransformerLM``s. The stochastic verifier is checked against the exact target
distribution with a fixed generator (tolerance derived at the test).
"""

from __future__ import annotations

import math

import pytest
import torch
from specdec_mocks import TableLM, chain_table, follow_chain

from g2c.specdec import (
    MTPHead,
    SpecStats,
    draft_greedy,
    greedy_verify,
    hidden_states,
    mtp_loss,
    mtp_propose,
    speculative_generate,
    speculative_verify,
)
from g2c.transformer import TransformerLM

V = 8
# The target's greedy successor of each token: 0 -> 1 -> 2 -> 3 -> 4 -> 5 -> 6 -> 7 -> 0.
TARGET_NEXT = [1, 2, 3, 4, 5, 6, 7, 0]
# An unrelated drafter: agrees with the target on 1 -> 2 and 4 -> 5 only.
DRAFTER_NEXT = [3, 2, 0, 6, 5, 1, 7, 4]


def _models(*, drafter_next=DRAFTER_NEXT, target_window: int = 64, drafter_window: int = 64):
    g = torch.Generator().manual_seed(0)
    target = TableLM(chain_table(TARGET_NEXT, generator=g), max_seq_len=target_window)
    drafter = TableLM(chain_table(drafter_next, generator=g), max_seq_len=drafter_window)
    return target, drafter


def _onehot_logits(ids: list[int], vocab: int = V) -> torch.Tensor:
    """(len(ids), V) logits whose row i has its argmax at ids[i]."""
    logits = torch.zeros(len(ids), vocab)
    logits[torch.arange(len(ids)), torch.tensor(ids)] = 3.0
    return logits


def _tiny_lm(seed: int, *, max_seq_len: int = 32, vocab: int = 32) -> TransformerLM:
    g = torch.Generator().manual_seed(seed)
    model = TransformerLM(vocab, 16, 2, 2, max_seq_len, generator=g)
    with torch.no_grad():
        # Random init gives near-uniform logits; sharpen them so argmax gaps dwarf the
        # float32 differences between a one-token step and a block pass.
        model.token_embed.weight.mul_(40.0)
    return model.eval()


# -- SpecStats and draft_greedy (provided) ------------------------------------------------
def test_spec_stats_record_accumulates():
    stats = SpecStats()
    stats.record(drafted=4, accepted=4, generated=5)   # full match + bonus
    stats.record(drafted=4, accepted=1, generated=2)   # rejected at position 1 + correction
    stats.record(drafted=2, accepted=2, generated=2)   # budget cut the bonus
    assert (stats.target_passes, stats.drafted, stats.accepted, stats.generated) == (3, 10, 7, 9)
    assert stats.acceptance_rate == pytest.approx(7 / 10)
    assert stats.tokens_per_pass == pytest.approx(9 / 3)
    text = repr(stats)
    assert "target_passes=3" in text and "acceptance_rate=0.700" in text and "tokens_per_pass=3.00" in text


def test_spec_stats_rates_are_zero_when_empty():
    stats = SpecStats()
    assert (stats.target_passes, stats.drafted, stats.accepted, stats.generated) == (0, 0, 0, 0)
    assert stats.acceptance_rate == 0.0 and stats.tokens_per_pass == 0.0


def test_draft_greedy_follows_argmax_chain():
    _, drafter = _models()
    draft = draft_greedy(drafter, torch.tensor([5, 0]), 4)
    assert draft.dtype == torch.long and draft.shape == (4,)
    assert draft.tolist() == follow_chain(DRAFTER_NEXT, 0, 4) == [3, 6, 7, 4]


def test_draft_greedy_crops_to_drafter_window():
    _, drafter = _models(drafter_window=3)
    ctx = [1, 2, 3, 4, 5]
    draft = draft_greedy(drafter, ctx, 4)
    assert len(drafter.calls) == 4
    seq = ctx + draft.tolist()
    for step, call in enumerate(drafter.calls):
        assert call.tolist() == [seq[len(ctx) + step - 3: len(ctx) + step]]   # the last 3 tokens


def test_mtp_head_parameters_exclude_base():
    base = _tiny_lm(0)
    head = MTPHead(base)
    base_ids = {id(p) for p in base.parameters()}
    head_params = head.parameters()
    assert head_params and not base_ids & {id(p) for p in head_params}
    d, v = base.embedding_dim, base.vocab_size
    block_params = sum(p.numel() for p in head.block.parameters())
    assert head.num_parameters() == (2 * d * d + d) + block_params + 2 * (2 * d) + v   # fuse, block, 2 LNs, bias
    assert not any(name.startswith("base") for name in head.state_dict())
    assert head.base is base


# -- greedy_verify --------------------------------------------------------------------------
def test_greedy_verify_full_match_returns_bonus():
    assert greedy_verify(torch.tensor([2, 5, 1]), _onehot_logits([2, 5, 1, 7])) == (3, 7)


def test_greedy_verify_rejects_first_position():
    assert greedy_verify(torch.tensor([2, 5, 1]), _onehot_logits([4, 5, 1, 7])) == (0, 4)


def test_greedy_verify_rejects_mid_block():
    # Position 2 disagrees; position 3 agrees again but comes after the rejection.
    assert greedy_verify(torch.tensor([2, 5, 1, 6]), _onehot_logits([2, 5, 3, 6, 0])) == (2, 3)


def test_greedy_verify_rejects_bad_shapes():
    with pytest.raises(ValueError, match="draft_ids"):
        greedy_verify(torch.tensor([], dtype=torch.long), _onehot_logits([1]))
    with pytest.raises(ValueError, match="draft_ids"):
        greedy_verify(torch.tensor([[1, 2]]), _onehot_logits([1, 2, 3]))
    with pytest.raises(ValueError, match=r"target_logits must have shape \(4, V\)"):
        greedy_verify(torch.tensor([1, 2, 3]), _onehot_logits([1, 2, 3]))      # k rows, not k+1
    with pytest.raises(ValueError, match="target_logits"):
        greedy_verify(torch.tensor([1]), torch.zeros(2, 3, V))


# -- speculative_verify ---------------------------------------------------------------------
def test_speculative_verify_identical_distributions_accept_all():
    # p == q makes min(1, p/q) = 1 wherever the drafter can sample: nothing is ever rejected.
    g = torch.Generator().manual_seed(1)
    probs = torch.softmax(torch.randn(4, V, generator=g), dim=-1)          # (k+1, V), k = 3
    for _ in range(200):
        draft = torch.multinomial(probs[:3], 1, generator=g).view(3)       # (k,) drawn from q
        num_accepted, token = speculative_verify(draft, probs, probs[:3].clone(), generator=g)
        assert num_accepted == 3 and 0 <= token < V


def test_speculative_verify_never_emits_zero_probability_draft():
    g = torch.Generator().manual_seed(2)
    p = torch.tensor([[0.0, 0.5, 0.5, 0.0], [0.25, 0.25, 0.25, 0.25]])      # target cannot emit 0
    for q in (torch.tensor([[0.7, 0.1, 0.1, 0.1]]),                          # drafter likes 0
              torch.tensor([[0.0, 0.0, 0.0, 1.0]])):                         # q(x) = 0 too
        for _ in range(200):
            num_accepted, token = speculative_verify(torch.tensor([0]), p, q, generator=g)
            assert num_accepted == 0 and token in (1, 2)


def test_speculative_verify_matches_target_distribution():
    # Target p and a deliberately different drafter q (Leviathan et al. 2023, Theorem 1: the
    # first emitted token is distributed as p, whatever q is). Two wrong verifiers this must
    # catch: "always accept" emits q; resampling from p instead of the residual emits
    # min(p, q) + (1 - sum min(p, q)) p = [0.35, 0.35, 0.30, 0], off by 0.15.
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.2, 0.3, 0.4])
    target_probs = torch.stack([p, torch.full((4,), 0.25)])                 # (k+1, V), k = 1
    draft_probs = q.view(1, 4)                                              # (k, V)
    # Tolerance: each frequency is a mean of N Bernoulli(p_v) draws, std <= 0.5/sqrt(N) =
    # 0.005 at N = 10,000. We allow 0.025 = 5 std: a correct verifier fails with probability
    # < 4 * 6e-7 (and never, with this fixed generator); the wrong ones miss by >= 0.15.
    n = 10_000
    g = torch.Generator().manual_seed(3)
    drafts = torch.multinomial(q, n, replacement=True, generator=g)         # (N,) x ~ q
    counts = torch.zeros(4)
    for x in drafts:
        num_accepted, token = speculative_verify(x.view(1), target_probs, draft_probs, generator=g)
        counts[int(x) if num_accepted == 1 else token] += 1
    assert torch.allclose(counts / n, p, atol=0.025), (counts / n).tolist()


# -- speculative_generate -------------------------------------------------------------------
def test_speculative_generate_matches_argmax_chain_with_any_drafter():
    target, drafter = _models()
    out, stats = speculative_generate(target, drafter, [6, 0], 20, k=3)
    assert out.dtype == torch.long
    assert out.tolist() == [6, 0] + follow_chain(TARGET_NEXT, 0, 20)
    assert stats.generated == 20 and stats.target_passes == len(target.calls)
    assert stats.tokens_per_pass >= 1.0 and 0 <= stats.accepted <= stats.generated
    assert stats.accepted < stats.drafted                                    # the drafter is often wrong


def test_speculative_generate_perfect_drafter_accepts_everything():
    target, _ = _models()
    drafter = TableLM(target.table.clone())
    n, k = 12, 4
    out, stats = speculative_generate(target, drafter, [0], n, k=k)
    assert out.tolist() == [0] + follow_chain(TARGET_NEXT, 0, n)
    assert stats.acceptance_rate == 1.0
    assert stats.target_passes == math.ceil(n / (k + 1)) == 3                # 5 + 5 + 2 tokens
    assert (stats.drafted, stats.accepted, stats.generated) == (10, 10, 12)


def test_speculative_generate_respects_budget():
    for n in (1, 2, 5, 7):
        for drafter_next in (DRAFTER_NEXT, TARGET_NEXT):                     # bad and perfect drafter
            target, drafter = _models(drafter_next=drafter_next)
            out, stats = speculative_generate(target, drafter, [3], n, k=4)
            assert out.tolist() == [3] + follow_chain(TARGET_NEXT, 3, n), (n, drafter_next)
            assert stats.generated == n and stats.accepted <= stats.generated
    target, drafter = _models()
    out, stats = speculative_generate(target, drafter, [3], 0, k=4)
    assert out.tolist() == [3] and stats.target_passes == 0


def test_speculative_generate_stops_at_eos():
    # Perfect drafter: EOS (3) sits inside the accepted block [1, 2, 3, 4] + bonus 5, so the
    # cut drops two tokens and the accepted count is only the drafts actually emitted.
    target, _ = _models()
    out, stats = speculative_generate(target, TableLM(target.table.clone()), [0], 10, k=4, eos_id=3)
    assert out.tolist() == [0, 1, 2, 3]
    assert (stats.target_passes, stats.drafted, stats.accepted, stats.generated) == (1, 4, 3, 3)
    # Unrelated drafter: EOS arrives as a correction token.
    target, drafter = _models()
    out, stats = speculative_generate(target, drafter, [0], 10, k=2, eos_id=3)
    assert out.tolist() == [0, 1, 2, 3] and stats.generated == 3 and stats.accepted <= 3


def test_speculative_generate_validates_inputs():
    target, drafter = _models()
    with pytest.raises(ValueError, match="prompt_ids"):
        speculative_generate(target, drafter, [], 5)
    with pytest.raises(ValueError, match="prompt_ids"):
        speculative_generate(target, drafter, [[1, 2]], 5)
    with pytest.raises(ValueError, match="k must be >= 1"):
        speculative_generate(target, drafter, [1], 5, k=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate(target, drafter, [1], -1)
    small = TableLM(torch.zeros(V - 1, V - 1))
    with pytest.raises(ValueError, match="vocab_size"):
        speculative_generate(target, small, [1], 5)


# -- MTP ------------------------------------------------------------------------------------
def test_mtp_loss_alignment():
    ids = torch.tensor([[1, 4, 2, 7, 0, 5]])                                # (B, T), neighbours differ
    t = ids.shape[1]
    aligned = torch.full((1, t - 1, V), -50.0)                              # (B, T-1, V)
    shifted = torch.full((1, t - 1, V), -50.0)
    for row in range(t - 1):
        aligned[0, row, ids[0, min(row + 2, t - 1)]] = 50.0                 # row t -> token t+2
        shifted[0, row, ids[0, row + 1]] = 50.0                             # row t -> token t+1 (wrong)
    aligned[0, t - 2] = 0.0
    aligned[0, t - 2, 3] = 50.0                                             # the last row has no target
    assert float(mtp_loss(aligned, ids)) < 1e-3
    assert float(mtp_loss(shifted, ids)) > 50.0


def test_mtp_head_forward_shape():
    base = _tiny_lm(0)
    head = MTPHead(base, generator=torch.Generator().manual_seed(1))
    ids = torch.randint(0, base.vocab_size, (2, 6), generator=torch.Generator().manual_seed(2))
    logits = head(hidden_states(base, ids)[:, :-1], ids[:, 1:])
    assert logits.shape == (2, 5, base.vocab_size) and torch.isfinite(logits).all()
    loss = mtp_loss(logits, ids)
    loss.backward()
    assert all(p.grad is None for p in base.parameters())                   # the base stays frozen
    assert head.bias.grad is not None
    next_token, guess = mtp_propose(base, head, ids[0])
    assert next_token == int(base(ids[:1])[0, -1].argmax()) and 0 <= guess < base.vocab_size


def test_speculative_generate_equals_module_11_generate():
    from g2c.sampling import generate

    target, drafter = _tiny_lm(0), _tiny_lm(1, max_seq_len=8)              # drafter has a short window
    prompt = torch.tensor([3, 14, 15, 9])
    expected = generate(target, prompt, 20, temperature=0.0)
    out, stats = speculative_generate(target, drafter, prompt, 20, k=3)
    assert out.tolist() == expected.tolist()
    assert stats.generated == 20 and stats.target_passes <= 20
