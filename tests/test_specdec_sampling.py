"""Beyond (specdec-sampling): drafters, the sampled speculative loop, dynamic k.

Oracles:
* the n-gram matcher: hand-written contexts and their drafts;
* greedy: the seed's ``speculative_generate`` (same tokens, same ``SpecStats``);
* sampled: the EXACT joint distribution of the first emitted tokens under plain sampling
  (``g2c.sampling.generate`` samples token t from the warped row of the target's logits;
  table-lookup targets make that row a function of the previous token only, so the joint
  is a product we enumerate). The loop is sampled with a fixed ``torch.Generator`` and
  compared with a Pearson chi-square bound derived below;
* acceptance: the analytic rate Σ_x min(p(x), q(x)) per position;
* two classic wrong verifiers, written here as local functions, swapped into the loop:
  the tests assert that our checks REJECT them;
* controllers: the speed-up law on synthetic drafters with known α and c.

Chi-square bound, used by every distribution test. With n samples in m cells of expected
counts E_i = n·P_i (cells with E_i < 5 are merged into one), Pearson's
X² = Σ (O_i − E_i)² / E_i is approximately χ² with d = m − 1 degrees of freedom. The
Laurent–Massart tail bound P(χ²_d ≥ d + 2√(d·x) + 2x) ≤ e^{−x} with x = 9 gives a false
failure probability below 1.3e-4 per check, and the seeds are fixed, so the tests are
deterministic. A cell with P_i = 0 must stay empty (any count there fails at once). Power:
a wrong sampler whose output distribution W differs from P has E[X²] ≈ d + n·Σ (W_i − P_i)²
/ P_i; for the resample-from-p bug in ``test_wrong_verifiers_are_rejected`` the chi-square
divergence is ≈ 0.09, so with n = 1200 E[X²] ≈ 110 + d, far above the bound (≈ 48 at d = 15).
"""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch
from specdec_mocks import SumModLM, TableLM, chain_table, random_next_of, windowed_greedy

import g2c.specdec.sampling.loop as loop_mod
from g2c.specdec import MTPHead, SpecStats, draft_greedy, mtp_propose, speculative_generate
from g2c.specdec.sampling.controllers import (
    CostModelK,
    HeuristicK,
    StaticK,
    expected_tokens_per_round,
    optimal_k,
    speedup,
)
from g2c.specdec.sampling.draft import Draft
from g2c.specdec.sampling.drafters import Drafter, LMDrafter, NGramDrafter, Sampler, ngram_lookup
from g2c.specdec.sampling.eagle import MTPDrafter
from g2c.specdec.sampling.loop import speculative_sample, verify_round
from g2c.transformer import TransformerLM

V = 4
NEG = float("-inf")


# -- helpers -------------------------------------------------------------------------------
def _table(rows) -> TableLM:
    return TableLM(torch.tensor(rows, dtype=torch.float32))


def _unigram(logits) -> TableLM:
    """Every row the same: the next-token distribution ignores the context."""
    return TableLM(torch.tensor([logits] * len(logits), dtype=torch.float32))


def _exact_joint(target: TableLM, last: int, n: int, sampler: Sampler) -> dict[tuple[int, ...], float]:
    """P(first n tokens) under plain sampling from the warped target rows (what ``generate`` draws)."""
    rows = sampler.probs(target.table).double()                                 # (V, V)
    out = {}
    for seq in itertools.product(range(target.vocab_size), repeat=n):
        prob, prev = 1.0, last
        for tok in seq:
            prob *= float(rows[prev, tok])
            prev = tok
        out[seq] = prob
    return out


def _loop_samples(target, drafter, prompt, n, runs, *, seed, k=2, **kw) -> Counter:
    g = torch.Generator().manual_seed(seed)
    counts = Counter()
    for _ in range(runs):
        out, _ = speculative_sample(target, drafter, prompt, n, k=k, generator=g, **kw)
        counts[tuple(out[len(prompt):].tolist())] += 1
    return counts


def _chi_square_ok(counts: Counter, exact: dict, x: float = 9.0) -> tuple[bool, float, float]:
    """(passes, X², bound): Pearson X² with E < 5 cells merged; zero-probability cells must be empty."""
    n = sum(counts.values())
    if any(counts[c] for c, p in exact.items() if p == 0.0) or any(c not in exact for c in counts):
        return False, math.inf, 0.0
    stat, small_o, small_e, cells = 0.0, 0, 0.0, 0
    for cell, p in exact.items():
        if p == 0.0:
            continue
        e = n * p
        if e < 5:
            small_o, small_e = small_o + counts[cell], small_e + e
            continue
        stat += (counts[cell] - e) ** 2 / e
        cells += 1
    if small_e > 0:
        stat += (small_o - small_e) ** 2 / small_e
        cells += 1
    d = max(cells - 1, 1)
    bound = d + 2 * math.sqrt(d * x) + 2 * x
    return stat <= bound, stat, bound


class _Recorder(Drafter):
    """Wraps a drafter and records every proposal (for tests that look inside the loop)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.vocab_size = inner.vocab_size
        self.reads = inner.reads
        self.proposals: list[list[int]] = []
        self.commits: list[tuple[int, int]] = []

    def start(self, prompt_ids, *, sampler, generator):
        self.inner.start(prompt_ids, sampler=sampler, generator=generator)

    def propose(self, context_ids, k):
        draft = self.inner.propose(context_ids, k)
        self.proposals.append(draft.tokens.tolist())
        return draft

    def commit(self, context_ids, num_accepted, *, target_hidden=None):
        self.commits.append((len(context_ids), num_accepted))
        self.inner.commit(context_ids, num_accepted, target_hidden=target_hidden)


# Target and drafter tables used by several distribution tests (V = 4). Rows depend on
# the previous token, so the first two tokens' joint is not a product of marginals.
TARGET_ROWS = [[2.0, 1.0, 0.0, -1.0],
               [0.0, 2.0, 1.5, 0.5],
               [1.0, 0.0, 2.0, 1.0],
               [0.5, 1.5, 0.0, 2.0]]
DRAFT_ROWS = [[0.0, 1.0, 2.0, 1.0],
              [2.0, 0.0, 1.0, 0.0],
              [0.0, 2.0, 0.0, 2.0],
              [1.0, 0.0, 1.0, 0.0]]


# -- Sampler and the provided drafters -------------------------------------------------------
def test_sampler_matches_module_11_warpers():
    from g2c.sampling.warpers import apply_temperature, top_k_filter, top_p_filter
    logits = torch.tensor([[2.0, 1.0, 0.5, -1.0], [0.0, 3.0, 3.0, 1.0]])
    s = Sampler(0.7, top_k=3, top_p=0.9)
    ref = torch.softmax(top_p_filter(top_k_filter(apply_temperature(logits, 0.7), 3), 0.9), dim=-1)
    assert torch.allclose(s.probs(logits), ref)
    assert Sampler(0.0).greedy and not s.greedy
    assert Sampler(0.0).choose(logits[0], None) == (0, None)


def test_sampler_rejects_bad_settings():
    with pytest.raises(ValueError, match="temperature"):
        Sampler(-0.5)
    with pytest.raises(ValueError, match="temperature"):
        Sampler(float("nan"))
    with pytest.raises(ValueError, match="top_k"):
        Sampler(1.0, top_k=0)
    with pytest.raises(ValueError, match="top_p"):
        Sampler(1.0, top_p=1.5)
    with pytest.raises(ValueError, match="temperature > 0"):
        Sampler(0.0).probs(torch.zeros(3))


def test_a_chain_is_a_width_one_draft():
    """The one draft value: a chain's node i has parent i - 1 and sits at length + i + 1, reads causally
    (allowed None), walks with the verifier it is given, and commits the root plus the accepted nodes
    whose successors were emitted."""
    from g2c.specdec.sampling.draft import check_draft

    d = Draft(torch.tensor([1, 2, 3]))
    assert d.parents.tolist() == [-1, 0, 1] and d.depths.tolist() == [1, 2, 3] and d.numel() == len(d) == 3
    assert d.positions(4).tolist() == [4, 5, 6, 7] and d.allowed(4) is None
    assert d.committed_rows(1) == [0]                         # not walked yet: the root alone
    logits = torch.full((4, V), -5.0)
    logits[0, 1] = logits[1, 2] = logits[2, 0] = logits[3, 3] = 5.0   # accepts 1, 2; corrects 3 -> 0
    assert d.accept(logits, verify_round, sampler=Sampler(0.0)) == (2, 0)
    assert d.accepted_nodes == [0, 1] and d.accepted(2) == [1, 2] and d.accepted(1) == [1]
    assert d.committed_rows(3) == [0, 1, 2] and d.committed_rows(2) == [0, 1]   # a budget cut keeps fewer
    assert Draft.empty().numel() == 0 and Draft([]).tokens.dtype == torch.long
    with pytest.raises(TypeError, match=r"Tuple\.propose must return a Draft .*got tuple: return Draft"):
        check_draft((torch.tensor([1]), None), type("Tuple", (), {})(), k=2, vocab_size=V)
    with pytest.raises(ValueError, match=r"at most k=2 tokens, got 3"):
        check_draft(d, NGramDrafter(), k=2, vocab_size=V)


def test_lm_drafter_greedy_is_draft_greedy():
    g = torch.Generator().manual_seed(0)
    model = TableLM(chain_table(random_next_of(8, g), generator=g))
    drafter = LMDrafter(model)
    drafter.start(torch.tensor([1]), sampler=Sampler(1.0), generator=g)
    proposal = drafter.propose(torch.tensor([3, 5]), 4)
    draft, q = proposal.tokens, proposal.proposal_probs
    assert q is None and draft.tolist() == draft_greedy(model, [3, 5], 4).tolist()


def test_lm_drafter_sampling_returns_warped_q_rows():
    model = _table(DRAFT_ROWS)
    drafter = LMDrafter(model, sample=True)
    drafter.start(torch.tensor([0]), sampler=Sampler(1.0, top_k=2), generator=torch.Generator().manual_seed(1))
    ctx = torch.tensor([2, 1])
    proposal = drafter.propose(ctx, 3)
    draft, q = proposal.tokens, proposal.proposal_probs
    assert draft.shape == (3,) and q.shape == (3, V) and q.dtype == torch.float32
    prev = [1] + draft.tolist()[:-1]
    for i in range(3):    # row i is the warped drafter row after the token before draft i
        assert torch.allclose(q[i], Sampler(1.0, top_k=2).probs(model.table[prev[i]]))
        assert q[i, draft[i]] > 0
    assert int((q > 0).sum(dim=1).max()) <= 3    # top-2 (ties kept) per row


def test_ngram_drafter_rejects_bad_lengths():
    with pytest.raises(ValueError, match="prompt_lookup_min"):
        NGramDrafter(prompt_lookup_max=2, prompt_lookup_min=3)
    with pytest.raises(ValueError, match="min_n"):
        ngram_lookup([1, 2, 3], 2, min_n=0, max_n=2)
    with pytest.raises(ValueError, match="k must be"):
        ngram_lookup([1, 2, 3], 0)


# -- controllers (provided) ---------------------------------------------------------------
def test_expected_tokens_per_round_is_the_geometric_sum():
    assert expected_tokens_per_round(0.5, 3) == pytest.approx((1 - 0.5 ** 4) / (1 - 0.5))
    assert expected_tokens_per_round(1.0, 4) == 5.0
    assert expected_tokens_per_round(0.0, 4) == 1.0
    assert speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8 ** 5) / (0.2 * 1.4))
    # the lesson's worked numbers: c = 0 grows k to the cap, an expensive drafter wants small k
    assert optimal_k(0.9, 0.0, k_max=8) == 8
    assert optimal_k(0.6, 0.5) == 1
    assert optimal_k(0.7, 0.1) == 4      # 1.9808 at k = 4 vs 1.9485 (k = 3) and 1.9608 (k = 5)


def test_static_and_heuristic_controllers():
    s = StaticK(3)
    s.update(drafted=3, accepted=0)
    assert s.next_k() == 3
    h = HeuristicK(4, k_min=1, k_max=7)
    h.update(drafted=4, accepted=4)          # full match: +2
    assert h.next_k() == 6
    h.update(drafted=6, accepted=6)          # capped at k_max
    assert h.next_k() == 7
    h.update(drafted=7, accepted=2)          # rejection: -1
    assert h.next_k() == 6
    for _ in range(10):
        h.update(drafted=h.next_k(), accepted=0)
    assert h.next_k() == 1
    h.update(drafted=0, accepted=0)          # an empty draft teaches nothing
    assert h.next_k() == 1
    with pytest.raises(ValueError, match="k must be"):
        StaticK(0)
    with pytest.raises(ValueError, match="k_min <= k_init <= k_max"):
        HeuristicK(9, k_max=8)
    with pytest.raises(ValueError, match="c must be"):
        CostModelK(c=-1.0)


@pytest.mark.parametrize("alpha,c", [(0.9, 0.05), (0.7, 0.1), (0.5, 0.3), (0.95, 0.0), (0.3, 0.02)])
def test_cost_model_converges_to_optimal_k(alpha, c):
    """A synthetic drafter: each draft accepted independently with probability α, drafting
    costs c target passes per token. After 2000 rounds α̂ has standard error
    ≤ sqrt(α(1−α)/2000) ≈ 0.011, and the chosen k must be the argmax of the speed-up law."""
    g = torch.Generator().manual_seed(7)
    ctl = CostModelK(4, k_min=1, k_max=12)
    target_s = 0.01
    for _ in range(2000):
        k = ctl.next_k()
        u = torch.rand(k, generator=g)
        accepted = int(torch.cumprod((u < alpha).long(), 0).sum())
        ctl.update(drafted=k, accepted=accepted, draft_seconds=c * k * target_s, target_seconds=target_s)
    assert abs(ctl.alpha - alpha) < 0.05
    assert ctl.c == pytest.approx(c, abs=1e-9)
    best = optimal_k(alpha, c, k_min=1, k_max=12)
    # near-flat optima: accept a k whose speed-up is within 1% of the best
    assert ctl.next_k() == best or speedup(alpha, ctl.next_k(), c) >= 0.99 * speedup(alpha, best, c)


# -- the n-gram matcher (exercise) --------------------------------------------------------
def test_ngram_lookup_basic_match():
    assert ngram_lookup([5, 1, 2, 3, 9, 1, 2], 3, max_n=2).tolist() == [3, 9, 1]


def test_ngram_lookup_no_match():
    draft = ngram_lookup([1, 2, 3, 4], 3, min_n=1, max_n=3)
    assert draft.dtype == torch.long and draft.shape == (0,)


def test_ngram_lookup_match_at_the_very_end():
    # the only earlier occurrence of [7, 8] ends right before the suffix: its continuation
    # runs into the suffix and stops at the end of the context (k' = 2 < k)
    assert ngram_lookup([7, 8, 7, 8], 4, min_n=2, max_n=2).tolist() == [7, 8]
    # an occurrence whose continuation is the last token only
    assert ngram_lookup([4, 9, 4], 3, min_n=1, max_n=1).tolist() == [9, 4]


def test_ngram_lookup_overlapping_match():
    # [1, 1] occurs at 0, 1 and 2 (the suffix itself is 3); the most recent earlier one (2)
    # overlaps the suffix and leaves a single token to copy
    assert ngram_lookup([1, 1, 1, 1, 1], 4, min_n=2, max_n=2).tolist() == [1]


def test_ngram_lookup_prefers_most_recent():
    assert ngram_lookup([3, 4, 3, 6, 3], 1, min_n=1, max_n=1).tolist() == [6]


def test_ngram_lookup_prefers_longest_n():
    # n = 2 ([2, 3]) matches at 0 and proposes 5; n = 1 ([3]) would match later at 4 -> 8
    assert ngram_lookup([2, 3, 5, 9, 3, 8, 2, 3], 1, min_n=1, max_n=2).tolist() == [5]
    # with max_n = 1 only the unigram [3] is tried: its most recent occurrence is at 4
    assert ngram_lookup([2, 3, 5, 9, 3, 8, 2, 3], 1, min_n=1, max_n=1).tolist() == [8]


def test_ngram_lookup_n_larger_than_context():
    assert ngram_lookup([6], 3, min_n=1, max_n=4).tolist() == []
    assert ngram_lookup([6, 6], 3, min_n=1, max_n=5).tolist() == [6]      # only n = 1 fits
    assert ngram_lookup([6, 7], 3, min_n=3, max_n=5).tolist() == []       # every n too long


# -- verify_round (exercise) --------------------------------------------------------------
def test_verify_round_empty_draft_samples_from_p():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0]])
    empty = torch.zeros(0, dtype=torch.long)
    assert verify_round(empty, None, logits, sampler=Sampler(0.0)) == (0, 1)
    # k' = 0 still warps: with top-k = 1 only token 1 is left. A verify that forgets the warpers there draws
    # token 1 with p = softmax(logits)[1] = 0.64, so 40 seeded draws catch it (0.64 ** 40 < 1e-7)
    g = torch.Generator().manual_seed(0)
    drawn = [verify_round(empty, None, logits, sampler=Sampler(1.0, top_k=1), generator=g) for _ in range(40)]
    assert drawn == [(0, 1)] * 40, f"k' = 0 must sample from the warped target (top-k = 1 keeps token 1 only): " \
                                   f"got {sorted(set(drawn))}"
    # sampled: 4000 draws against p = softmax(logits); X² bound as in the module docstring
    g = torch.Generator().manual_seed(3)
    counts = Counter(verify_round(empty, None, logits, sampler=Sampler(1.0), generator=g)[1] for _ in range(4000))
    exact = {(t,): float(p) for t, p in enumerate(torch.softmax(logits[0], -1))}
    ok, stat, bound = _chi_square_ok(Counter({(t,): n for t, n in counts.items()}), exact)
    assert ok, (stat, bound)


def test_verify_round_greedy_uses_argmax():
    logits = torch.zeros(3, V)
    logits[0, 2] = logits[1, 0] = logits[2, 3] = 5.0
    assert verify_round(torch.tensor([2, 0]), None, logits, sampler=Sampler(0.0)) == (2, 3)
    assert verify_round(torch.tensor([2, 1]), None, logits, sampler=Sampler(0.0)) == (1, 0)


def test_verify_round_deterministic_draft_never_accepts_a_filtered_token():
    # top-k = 1 leaves p one-hot at token 1: a deterministic draft of 2 must be rejected and
    # the correction must be 1, whatever the uniforms
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [0.0, 3.0, 1.0, 2.0]])
    g = torch.Generator().manual_seed(0)
    for _ in range(50):
        assert verify_round(torch.tensor([2]), None, logits, sampler=Sampler(1.0, top_k=1), generator=g) == (0, 1)


# -- the loop (exercise): greedy -------------------------------------------------------------
@pytest.mark.parametrize("seed", range(6))
def test_speculative_sample_greedy_matches_speculative_generate(seed):
    g = torch.Generator().manual_seed(seed)
    vocab = 9
    target = TableLM(chain_table(random_next_of(vocab, g), generator=g), max_seq_len=12)
    drafter_model = TableLM(chain_table(random_next_of(vocab, g), generator=g), max_seq_len=8)
    k = 1 + seed % 4
    n = 5 + 2 * seed
    eos = None if seed % 2 else 3
    prompt = torch.randint(0, vocab, (1 + seed,), generator=g).tolist()
    ref, ref_stats = speculative_generate(target, drafter_model, prompt, n, k=k, eos_id=eos)
    passes_ref, passes = [], []
    speculative_generate(target, drafter_model, prompt, n, k=k, eos_id=eos,
                         on_pass=lambda e, a: passes_ref.append((e, a)))
    out, stats = speculative_sample(target, LMDrafter(drafter_model), prompt, n, k=k, temperature=0.0, eos_id=eos,
                                    on_pass=lambda e, a: passes.append((e, a)))
    assert out.tolist() == ref.tolist()
    assert (stats.target_passes, stats.drafted, stats.accepted, stats.generated) == \
        (ref_stats.target_passes, ref_stats.drafted, ref_stats.accepted, ref_stats.generated)
    assert passes == passes_ref


def test_speculative_sample_respects_budget_and_eos():
    target = _table(TARGET_ROWS)
    for n in range(0, 7):
        out, stats = speculative_sample(target, NGramDrafter(), [0, 1, 2, 0, 1], n, k=3, temperature=1.0,
                                        generator=torch.Generator().manual_seed(n))
        assert len(out) == 5 + n and stats.generated == n
        assert stats.accepted <= stats.drafted and stats.accepted <= stats.generated
    g = torch.Generator().manual_seed(5)
    for _ in range(20):
        out, stats = speculative_sample(target, LMDrafter(_table(DRAFT_ROWS), sample=True), [0], 30, k=3,
                                        temperature=1.0, generator=g, eos_id=3)
        new = out[1:].tolist()
        assert 3 not in new[:-1] and (new[-1] == 3 or len(new) == 30)
        assert stats.generated == len(new)


def test_speculative_sample_validates_inputs():
    target, drafter = _table(TARGET_ROWS), LMDrafter(_table(DRAFT_ROWS))
    with pytest.raises(ValueError, match="prompt_ids"):
        speculative_sample(target, drafter, [], 3)
    with pytest.raises(ValueError, match="k must be"):
        speculative_sample(target, drafter, [1], 3, k=0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_sample(target, drafter, [1], -1)
    with pytest.raises(ValueError, match="temperature"):
        speculative_sample(target, drafter, [1], 3, temperature=-1.0)
    with pytest.raises(ValueError, match="vocab_size"):
        speculative_sample(target, LMDrafter(TableLM(torch.zeros(5, 5))), [1], 3)

    class TooLong(Drafter):
        def propose(self, context_ids, k):
            return Draft(torch.zeros(k + 1, dtype=torch.long))

    with pytest.raises(ValueError, match=r"TooLong.propose must return a draft of at most k="):
        speculative_sample(target, TooLong(), [1], 3, temperature=0.0)

    class BadProbs(Drafter):
        def propose(self, context_ids, k):
            return Draft(torch.zeros(k, dtype=torch.long), torch.ones(k, V + 1))

    with pytest.raises(ValueError, match=r"BadProbs.propose: draft.proposal_probs has V=5 but the target has V=4"):
        speculative_sample(target, BadProbs(), [1], 3)

    class BadController(StaticK):
        def next_k(self):
            return -1                        # 0 is a plain step (drafting off for a round); below 0 is refused

    with pytest.raises(ValueError, match="k must be"):
        speculative_sample(target, drafter, [1], 3, controller=BadController(2))


def test_speculative_sample_restores_modes_and_is_reproducible():
    target, model = _table(TARGET_ROWS), _table(DRAFT_ROWS)
    target.train(True)
    model.train(False)
    outs = [speculative_sample(target, LMDrafter(model, sample=True), [0], 12, temperature=1.0,
                               generator=torch.Generator().manual_seed(11))[0].tolist() for _ in range(2)]
    assert outs[0] == outs[1]
    assert target.training is True and model.training is False


def test_output_never_changes_with_the_controller():
    g = torch.Generator().manual_seed(4)
    vocab = 10
    target = TableLM(chain_table(random_next_of(vocab, g), generator=g), max_seq_len=40)
    model = TableLM(chain_table(random_next_of(vocab, g), generator=g))
    ref = None
    for ctl in (StaticK(1), StaticK(5), HeuristicK(2, k_max=6), CostModelK(3, k_max=8),
                CostModelK(2, k_max=8, c=0.0)):
        for drafter in (LMDrafter(model), NGramDrafter(prompt_lookup_max=2)):
            out, stats = speculative_sample(target, drafter, [1, 2, 1], 30, temperature=0.0, controller=ctl)
            ref = out.tolist() if ref is None else ref
            assert out.tolist() == ref, (ctl, drafter)


def test_ngram_drafter_drafts_fewer_than_k_and_nothing_without_a_match():
    target = _table(TARGET_ROWS)
    rec = _Recorder(NGramDrafter(prompt_lookup_max=2))
    out, stats = speculative_sample(target, rec, [0, 1, 2, 3], 6, k=4, temperature=0.0)
    assert rec.proposals[0] == []                 # [3] and [2, 3] never occurred before
    assert stats.drafted == sum(len(p) for p in rec.proposals)
    assert stats.target_passes == len(rec.proposals)


# -- the loop: the sampled distribution ------------------------------------------------------
def _models(name):
    """(target, drafter, sampler) for each distribution case."""
    target = _table(TARGET_ROWS)
    if name in ("T0.7", "T1.0", "T1.5"):
        return target, LMDrafter(_table(DRAFT_ROWS), sample=True), Sampler(float(name[1:]))
    if name == "top_k":
        return target, LMDrafter(_table(DRAFT_ROWS), sample=True), Sampler(1.0, top_k=2)
    if name == "top_p":
        return target, LMDrafter(_table(DRAFT_ROWS), sample=True), Sampler(0.9, top_p=0.7)
    if name == "disjoint":
        # the target only emits {0, 1}, the drafter only {2, 3}: every draft is rejected
        t = _table([[1.0, 0.0, NEG, NEG], [0.0, 1.0, NEG, NEG]] + [[0.5, 0.0, NEG, NEG]] * 2)
        d = _table([[NEG, NEG, 1.0, 0.0]] * 4)
        return t, LMDrafter(d, sample=True), Sampler(1.0)
    if name == "q_zero":
        # the drafter never proposes token 3, which the target emits often
        d = _table([[r[0], r[1], r[2], NEG] for r in DRAFT_ROWS])
        return target, LMDrafter(d, sample=True), Sampler(1.0)
    if name == "greedy_drafter":
        return target, LMDrafter(_table(DRAFT_ROWS)), Sampler(1.0)
    raise KeyError(name)


DIST_CASES = ["T0.7", "T1.0", "T1.5", "top_k", "top_p", "disjoint", "q_zero", "greedy_drafter"]


@pytest.mark.parametrize("case", DIST_CASES)
def test_loop_distribution_matches_generate(case):
    """First two tokens (k = 1: accept + bonus, or correction then a second round) over
    1200 seeded runs vs the exact joint of plain sampling; bound derived in the module
    docstring."""
    target, drafter, sampler = _models(case)
    prompt = [2, 0]
    counts = _loop_samples(target, drafter, prompt, 2, 1200, seed=DIST_CASES.index(case), k=1,
                           temperature=sampler.temperature, top_k=sampler.top_k, top_p=sampler.top_p)
    ok, stat, bound = _chi_square_ok(counts, _exact_joint(target, prompt[-1], 2, sampler))
    assert ok, f"{case}: X²={stat:.1f} > {bound:.1f}"


def test_loop_distribution_three_tokens_k2():
    """First three tokens with k = 2: a full match emits two drafts and the bonus, a
    rejection emits a correction and starts a second round. 64 cells, 1500 runs."""
    target, drafter, sampler = _models("T1.0")
    counts = _loop_samples(target, drafter, [1], 3, 1500, seed=21, k=2)
    ok, stat, bound = _chi_square_ok(counts, _exact_joint(target, 1, 3, sampler))
    assert ok, f"X²={stat:.1f} > {bound:.1f}"


def test_deterministic_drafter_is_lossless():
    """The n-gram drafter (q one-hot) under sampling at T = 1.2 with top-p: a prompt full of
    repeats makes it draft every round."""
    target = _table(TARGET_ROWS)
    sampler = Sampler(1.2, top_p=0.95)
    prompt = [3, 1, 2, 3, 1, 2, 3]
    rec = _Recorder(NGramDrafter(prompt_lookup_max=2))
    counts = _loop_samples(target, rec, prompt, 2, 1200, seed=5, k=2, temperature=1.2, top_p=0.95)
    assert sum(len(p) > 0 for p in rec.proposals) > 1000
    ok, stat, bound = _chi_square_ok(counts, _exact_joint(target, prompt[-1], 2, sampler))
    assert ok, f"X²={stat:.1f} > {bound:.1f}"


def test_acceptance_rate_is_sum_of_min_p_q():
    """Context-free target and drafter rows: every position is accepted with probability
    α = Σ_x min(p(x), q(x)) independently, so the per-position MLE accepted / trials
    (each round: `accepted` successes, plus one failure if it stopped early) estimates α.
    About 2600 trials: standard error sqrt(α(1−α)/2600) ≈ 0.0095; tolerance 4 SE = 0.04."""
    target = _unigram([1.5, 0.5, 0.0, -0.5])
    drafter = LMDrafter(_unigram([0.0, 0.5, 1.0, 0.0]), sample=True)
    sampler = Sampler(1.0)
    p, q = sampler.probs(target.table[0]), sampler.probs(drafter.model.table[0])
    alpha = float(torch.minimum(p, q).sum())
    rounds = []
    g = torch.Generator().manual_seed(9)
    for _ in range(40):
        speculative_sample(target, drafter, [0], 64, k=3, generator=g,
                           on_pass=lambda e, a: rounds.append((len(e), a)))
    full = [(n, a) for n, a in rounds if n == a + 1]         # rounds not cut by the budget
    successes = sum(a for _, a in full)
    trials = successes + sum(1 for _, a in full if a < 3)
    assert abs(successes / trials - alpha) < 0.04, (successes / trials, alpha)
    # and the mean tokens per round is the geometric sum (1 - α^{k+1}) / (1 - α); SE ≈ 0.03
    mean_tokens = sum(n for n, _ in full) / len(full)
    assert abs(mean_tokens - expected_tokens_per_round(alpha, 3)) < 0.12


def test_perfect_drafter_emits_k_plus_one_per_pass():
    """q == p: min(1, p/q) = 1, every draft is accepted and every pass ends with the bonus."""
    target = _table(TARGET_ROWS)
    stats_all = SpecStats()
    g = torch.Generator().manual_seed(2)
    for _ in range(10):
        _, stats = speculative_sample(target, LMDrafter(_table(TARGET_ROWS), sample=True), [0], 20, k=3,
                                      temperature=0.8, generator=g)
        assert stats.target_passes == 5 and stats.accepted == 15 and stats.generated == 20
        stats_all.drafted += stats.drafted
    assert stats_all.drafted == 10 * 5 * 3     # every round drafts k = 3 (the last has 4 tokens left)


# -- the two classic wrong verifiers: the checks above must reject them -----------------------
def _resample_from_p(draft_ids, target_probs, draft_probs, *, generator=None):
    """WRONG: on rejection, sample from p instead of the residual max(0, p - q)."""
    k = draft_ids.numel()
    for i in range(k):
        x = int(draft_ids[i])
        if float(torch.rand(1, generator=generator)) * float(draft_probs[i, x]) < float(target_probs[i, x]):
            continue
        return i, int(torch.multinomial(target_probs[i].double(), 1, generator=generator))
    return k, int(torch.multinomial(target_probs[k].double(), 1, generator=generator))


def _forget_bonus(draft_ids, target_probs, draft_probs, *, generator=None):
    """WRONG: after a full match, end the round on the last draft (no bonus token)."""
    k = draft_ids.numel()
    for i in range(k):
        x = int(draft_ids[i])
        if float(torch.rand(1, generator=generator)) * float(draft_probs[i, x]) < float(target_probs[i, x]):
            continue
        residual = (target_probs[i] - draft_probs[i]).clamp(min=0).double()
        return i, int(torch.multinomial(residual, 1, generator=generator))
    return k - 1, int(draft_ids[k - 1])


def test_wrong_verifiers_are_rejected(monkeypatch):
    target, drafter, sampler = _models("T1.0")
    exact = _exact_joint(target, 0, 2, sampler)
    monkeypatch.setattr(loop_mod, "speculative_verify", _resample_from_p)
    counts = _loop_samples(target, drafter, [2, 0], 2, 1200, seed=1, k=1)
    ok, stat, bound = _chi_square_ok(counts, exact)
    assert not ok, f"resample-from-p passed the distribution check (X²={stat:.1f} <= {bound:.1f})"

    # forgetting the bonus keeps the distribution but loses the free token: the q == p
    # counter check catches it (a full round emits k, not k + 1, tokens)
    monkeypatch.setattr(loop_mod, "speculative_verify", _forget_bonus)
    _, stats = speculative_sample(target, LMDrafter(_table(TARGET_ROWS), sample=True), [0], 20, k=3,
                                  temperature=0.8, generator=torch.Generator().manual_seed(2))
    assert not (stats.target_passes == 5 and stats.generated == 20 and stats.accepted == 15)
    assert stats.tokens_per_pass < 3.5


# -- MTP self-speculation through the same loop -----------------------------------------------
def _tiny_lm(seed: int) -> TransformerLM:
    g = torch.Generator().manual_seed(seed)
    model = TransformerLM(32, 16, 2, 2, 32, generator=g)
    with torch.no_grad():
        model.token_embed.weight.mul_(40.0)
    return model.eval()


def test_mtp_drafter_uses_target_states():
    from g2c.sampling import generate
    base = _tiny_lm(0)
    head = MTPHead(base, generator=torch.Generator().manual_seed(1)).eval()
    rec = _Recorder(MTPDrafter(head))
    prompt = [3, 7, 1]
    out, stats = speculative_sample(base, rec, prompt, 12, k=4, temperature=0.0)
    assert out.tolist() == generate(base, prompt, 12, temperature=0.0).tolist()
    assert rec.proposals[0] == [] and all(len(p) == 1 for p in rec.proposals[1:])
    assert stats.drafted == stats.target_passes - 1
    # each guess is the head's argmax given the states of the committed context, the same
    # guess mtp_propose makes from the context before the newest token
    ctx = list(prompt)
    for (length, _), guess in zip(rec.commits, rec.proposals[1:]):
        ctx = out[:length].tolist()
        assert guess == [mtp_propose(base, head, ctx[:-1])[1]]


# -- the command line ------------------------------------------------------------------------
@pytest.mark.ladder
@pytest.mark.parametrize("drafter", ["ngram", "StoryLM-1M"])
def test_cli_runs_every_drafter_sampled(drafter, capsys):
    from g2c.specdec.__main__ import main
    argv = ["Once upon a time", "--target", "StoryLM-5M", "--drafter", drafter, "--temperature", "0.8",
            "--seed", "0", "--max-new-tokens", "8", "--device", "cpu", "--color", "never"]
    assert main(argv) == 0
    first = capsys.readouterr().out
    assert main(argv) == 0
    assert capsys.readouterr().out == first          # same seed, same text and counters
    assert "temperature=0.8, seed=0" in first and "generated=" in first


@pytest.mark.parametrize("k", range(1, 7))
def test_speculative_sample_equals_generate_at_the_window_edge(k):
    """The shared window-edge rule (``g2c.specdec.draft_room``): each round drafts at most
    what fits the target's window, and at none the drafter is not asked (a plain step). With
    a model whose next token depends on every visible id (``SumModLM``: sum mod 7, window 8,
    prompt [1, 2]) the uncached loop at temperature 0 is plain greedy decoding with module
    11's crop, for every k, every drafter and a controller, up to the edge and past it.
    Before, the loop cropped the context to make room for k drafts (k = 3 gave
    [..., 3, 5, 3, 6] for [..., 3, 6, 5, 3])."""
    target = SumModLM(max_seq_len=8)
    drafters = {"LM": lambda: LMDrafter(SumModLM(max_seq_len=8)),
                "LM, window 3": lambda: LMDrafter(SumModLM(max_seq_len=3)),
                "n-gram": lambda: NGramDrafter()}
    for name, make in drafters.items():
        for n in (7, 15):
            for controller in (None, HeuristicK(k)):
                out, stats = speculative_sample(target, make(), [1, 2], n, k=k, temperature=0.0,
                                                controller=controller)
                assert out.tolist() == windowed_greedy(target, [1, 2], n), f"{name} drafter, {n} tokens"
                assert stats.generated == n
    # A perfect drafter is never rejected: every row sees the context plain decoding sees.
    _, stats = speculative_sample(target, LMDrafter(SumModLM(max_seq_len=8)), [1, 2], 15, k=k, temperature=0.0)
    drafted, length = 0, 2
    while length < 2 + 15:                                # draft_room(min(k, budget), length, 8), all accepted
        d = max(0, min(k, 17 - length, 8 - length))
        drafted, length = drafted + d, length + min(d + 1, 17 - length)
    assert stats.acceptance_rate == 1.0 and stats.drafted == drafted


@pytest.mark.parametrize("build, error, match", [
    (lambda: HeuristicK(grow=-1), ValueError, r"grow must be an int >= 1 .*got -1; for a fixed draft length use"),
    (lambda: HeuristicK(shrink=0), ValueError, r"shrink must be an int >= 1 .*got 0"),
    (lambda: HeuristicK(grow=1.5), TypeError, r"grow must be an int >= 1 .*got 1\.5"),
    (lambda: CostModelK(c=float("nan")), ValueError, r"c must be a finite number >= 0, got nan"),
    (lambda: CostModelK(c="0.1"), TypeError, r"c must be a real number, got str"),
    (lambda: CostModelK(prior_weight=-2.0), ValueError, r"prior_weight must be a finite number >= 0, got -2\.0"),
    (lambda: CostModelK(decay=0.0), ValueError, r"decay must be a finite number in \(0, 1\], got 0\.0"),
])
def test_controllers_refuse_meaningless_parameters(build, error, match):
    """Family 8: HeuristicK(grow=-1) used to return k = -1 after a full match."""
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize("ctl", [StaticK(3), HeuristicK(3), CostModelK(3)], ids=repr)
@pytest.mark.parametrize("report, error, match", [
    (dict(drafted=3, accepted=4), ValueError, r"need 0 <= accepted <= drafted, got drafted=3, accepted=4"),
    (dict(drafted=-1, accepted=0), ValueError, r"need 0 <= accepted <= drafted, got drafted=-1"),
    (dict(drafted=2.5, accepted=1), TypeError, r"drafted must be an int .*got float 2\.5"),
    (dict(drafted=3, accepted=1, draft_seconds=float("nan")), ValueError, r"draft_seconds must be a finite number"),
    (dict(drafted=3, accepted=1, target_seconds=-1.0), ValueError, r"target_seconds must be a finite number >= 0"),
])
def test_controller_update_refuses_impossible_reports(ctl, report, error, match):
    k = ctl.next_k()
    with pytest.raises(error, match=match):
        ctl.update(**report)
    assert ctl.next_k() == k
    ctl.update(drafted=torch.tensor(3), accepted=torch.tensor(2))  # 0-d integer tensors are counts
