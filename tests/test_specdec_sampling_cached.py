"""Beyond (specdec-sampling) with module 16's KV cache: ``speculative_sample(..., use_cache=True)``
and ``LMDrafter(model, use_cache=True)``.

Needs module 16 and specdec-sampling solved (``G2C_APPLY_SOLUTIONS=01-11,16,specdec,specdec-sampling``
or ``all``); the validation tests run on the provided code alone.

Oracles:
* greedy: module 16's ``speculative_generate_cached`` and the seed's ``speculative_generate``
  (same tokens, same ``SpecStats`` counters, same ``on_pass`` reports);
* sampled: the UNCACHED loop itself, draw for draw. Both loops consume the same
  ``torch.Generator`` in the same order (draft samples, uniforms, residual/bonus samples)
  and see the same p and q up to float rounding (~1e-6 on these logits), so with the same
  seed they must emit IDENTICAL sequences. That is stronger than any distribution test: the
  uncached loop's distribution is tested in tests/test_specdec_sampling.py, and equal
  sequences for every seed carry that over exactly. A cache bug that keeps the output's
  distribution but changes a draft (a drafter that forgets to roll back) is caught too,
  and ``test_wrong_rollbacks_are_rejected`` shows both classic rollback bugs fail the check;
* the committed state: ``assert_committed_state`` from tests/test_specdec_cached.py
  (after every round the target's committed rows equal plain cached decoding of the emitted
  tokens within 1e-5, and one more step equals a fresh forward within 1e-4).

Tiny random ``TransformerLM`` s (V = 32) keep every test to a fraction of a second.
"""

from __future__ import annotations

import pytest
import torch
from specdec_mocks import TableLM, chain_table
from test_specdec_cached import V, _lm, _prompt, assert_committed_state

import g2c.specdec.sampling.cached as kv_spec
from g2c.kvcache import prefill
from g2c.specdec import speculative_generate
from g2c.specdec.sampling import CachedScorer, speculative_generate_cached, summarize_rounds
from g2c.specdec.sampling.controllers import HeuristicK, StaticK
from g2c.specdec.sampling.drafters import Drafter, LMDrafter, NGramDrafter
from g2c.specdec.sampling.loop import speculative_sample
from g2c.transformer import TransformerLM


def _spread_lm(seed: int, *, dim: int, layers: int, max_seq_len: int) -> TransformerLM:
    """Embeddings x8 (tokens) and x2 (positions): next-token entropy about 3.0 nats of ln 32 = 3.47,
    so sampling has real choices, and two such models disagree often (acceptance about 0.3)."""
    model = TransformerLM(V, dim, layers, 2, max_seq_len, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        model.token_embed.weight.mul_(8.0)
        model.pos_embed.weight.mul_(2.0)
    return model.eval()


def _models(*, window: int = 48):
    """A target (2 layers, D = 16) and a smaller drafter (1 layer, D = 8) for sampled runs."""
    return (_spread_lm(2, dim=16, layers=2, max_seq_len=window),
            _spread_lm(3, dim=8, layers=1, max_seq_len=window))


def _run(target, drafter_model, *, use_cache, drafter_cache=None, sample=True, seed=0, n=24, **kw):
    drafter_cache = use_cache if drafter_cache is None else drafter_cache
    drafter = kw.pop("drafter", None) or LMDrafter(drafter_model, sample=sample, use_cache=drafter_cache)
    passes = []
    ids, stats = speculative_sample(target, drafter, kw.pop("prompt", _prompt()), n, use_cache=use_cache,
                                    generator=torch.Generator().manual_seed(seed),
                                    on_pass=lambda e, a: passes.append((list(e), a)), **kw)
    return ids.tolist(), (stats.target_passes, stats.drafted, stats.accepted, stats.generated), passes


# -- greedy: the three loops agree ------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 4])
def test_cached_greedy_equals_kvcache_and_specdec_loops(k):
    target, drafter = _lm(2), _lm(3, dim=8, layers=1)                 # peaked: varied greedy chains
    got, got_stats, got_passes = _run(target, drafter, use_cache=True, sample=False, n=30, k=k, temperature=0.0)
    want_passes = []
    ref, ref_stats = speculative_generate_cached(target, drafter, _prompt(), 30, k=k,
                                                 on_pass=lambda e, a: want_passes.append((list(e), a)))
    seed, seed_stats = speculative_generate(target, drafter, _prompt(), 30, k=k)
    assert got == ref.tolist() == seed.tolist()
    for s in (ref_stats, seed_stats):
        assert got_stats == (s.target_passes, s.drafted, s.accepted, s.generated)
    assert got_passes == want_passes
    assert got_stats[2] < got_stats[1]                                    # rejections happened


# -- sampled: the cached loop IS the uncached loop, draw for draw --------------------------------
SAMPLED_CASES = [dict(temperature=0.7), dict(temperature=1.0), dict(temperature=1.5),
                 dict(temperature=1.0, top_k=5), dict(temperature=1.0, top_p=0.8),
                 dict(temperature=0.8, sample=False),                     # greedy drafts, one-hot q
                 dict(temperature=1.0, controller="heuristic")]


@pytest.mark.parametrize("case", SAMPLED_CASES, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()))
def test_cached_sampled_loop_equals_uncached_for_every_seed(case):
    case = dict(case)
    target, drafter = _models()
    make_ctl = HeuristicK if case.pop("controller", None) == "heuristic" else StaticK
    rejected = 0
    for seed in range(4):
        runs = [_run(target, drafter, use_cache=c, seed=seed, controller=make_ctl(3), **case) for c in (False, True)]
        assert runs[1] == runs[0], f"seed {seed}: cached and uncached loops differ"
        rejected += runs[0][1][1] - runs[0][1][2]
    assert rejected > 0                                                   # the rollback path ran


def test_either_side_can_cache_alone():
    target, drafter = _models()
    for seed in range(3):
        runs = [_run(target, drafter, use_cache=t, drafter_cache=d, seed=seed, temperature=1.0)
                for t, d in [(False, False), (True, False), (False, True)]]
        assert runs[1] == runs[0] and runs[2] == runs[0]


def test_cached_target_with_ngram_drafter_equals_uncached():
    target, _ = _models()
    prompt = torch.tensor([5, 1, 2, 3, 9, 1, 2, 3, 9, 1, 2])               # something to copy
    for seed in range(4):
        runs = [_run(target, None, use_cache=c, drafter=NGramDrafter(), prompt=prompt, seed=seed, k=3,
                     temperature=1.0) for c in (False, True)]
        assert runs[0] == runs[1]


def test_cached_sampled_loop_past_the_drafters_window():
    # The drafter's window (12) is smaller than the target's (48): its cache re-prefills while
    # the uncached drafter slides, so drafts differ, but verification keeps the target's output:
    # greedy still equals the uncached loop (greedy speculative output is the target's greedy chain).
    target, drafter = _lm(2), _lm(3, dim=8, layers=1, max_seq_len=12)
    cached, _, _ = _run(target, drafter, use_cache=True, sample=False, n=30, k=4, temperature=0.0)
    plain, _, _ = _run(target, drafter, use_cache=False, sample=False, n=30, k=4, temperature=0.0)
    assert cached == plain and len(cached) == 35


# -- the state transaction ----------------------------------------------------------------------
def test_cached_sampled_state_transaction_every_round():
    """After every sampled round the target's committed rows are those of plain cached decoding
    of the emitted tokens (1e-5), decoding on is exact, and the accounting is the lecture's:
    k'+1 rows reserved, k' - accepted rolled back, 0 bytes moved."""
    target, drafter = _models()
    records = []

    def check(rec):
        assert_committed_state(target, rec)
        records.append(rec)

    _, stats, _ = _run(target, drafter, use_cache=True, n=30, k=4, temperature=1.0, on_round=check)
    assert len(records) == stats[0] >= 8
    for r in records[:-1]:                                    # the last round may be cut by the budget
        assert r.kv_rows_reserved == len(r.draft) + 1
        assert r.kv_rows_rolled_back == len(r.draft) - r.accepted
        assert r.rollback_bytes_moved == 0
    assert any(r.accepted < len(r.draft) for r in records)   # rejections were rolled back
    assert summarize_rounds(records)["rollback_bytes_moved"] == 0


def test_rejected_rows_are_never_read_in_the_sampled_loop():
    """NaN in every row past both pointers after each round: a read of a rejected draft's keys
    or values would put NaN into p or q and change (or break) the sampled output."""
    target, drafter = _models()

    def poison(rec):
        for cache in (rec.target_cache, rec.drafter_cache):
            for buf in cache.keys_buffer + cache.values_buffer:
                buf[:, :, cache.length:] = float("nan")

    clean = _run(target, drafter, use_cache=True, n=30, k=4, temperature=1.0, seed=3)
    poisoned = _run(target, drafter, use_cache=True, n=30, k=4, temperature=1.0, seed=3, on_round=poison)
    assert poisoned == clean


def test_cached_sampled_loop_past_the_targets_window_refills():
    # Window 16, k = 4: rounds that start with len(ids) <= 12 fit, so the first 13 tokens equal
    # the uncached loop's (same draws); later the cache re-prefills its last min(8, 16 - k')
    # tokens (module 16's policy) while the uncached target slides, so the tails may differ.
    target, drafter = _models(window=16)
    records = []
    cached, stats, _ = _run(target, drafter, use_cache=True, n=30, k=4, temperature=1.0, on_round=records.append,
                            seed=1)
    plain, _, _ = _run(target, drafter, use_cache=False, n=30, k=4, temperature=1.0, seed=1)
    assert cached[:13] == plain[:13] and len(cached) == 35 and stats[3] == 30
    assert any(r.target_start > 0 for r in records)
    assert all(r.target_cache.length <= 16 for r in records)


def test_cached_refill_state_is_a_fresh_prefill():
    # After a re-prefill the committed rows are a fresh prefill of ids[start:-1] at positions 0..
    target, drafter = _models(window=16)

    def check(rec):
        start = rec.target_start
        _, fresh = prefill(target, rec.ids[start:-1])
        assert rec.target_cache.length == fresh.length
        torch.testing.assert_close(rec.target_cache.keys(0), fresh.keys(0), atol=1e-5, rtol=0)

    _run(target, drafter, use_cache=True, n=30, k=4, temperature=1.0, on_round=check)


def _keep_rejected_rows(scorer, ids) -> int:
    """The classic bug, planted: no rollback. The rejected drafts' rows stay in the cache as if
    they were history and the newest token is fed after them (at the wrong position)."""
    scorer.start = len(ids) - 1 - scorer.cache.length
    return 0


def _target_keeps_rejected_rows(target, ids, num_accepted) -> None:
    """The same bug on ``CachedTarget``: every row the pass wrote stays, the pointer past them."""
    target.cache.advance(target._written - target.cache.length)
    target.start_pos = len(ids) - 1 - target.cache.length


def test_wrong_rollbacks_are_rejected(monkeypatch):
    """The draw-for-draw check must catch a missing rollback, on the target's side (its p then
    reads rejected keys/values) and on the drafter's side alone (the output distribution stays
    exact, because verification is lossless for any q, but the drafts and so the draws change)."""
    target, drafter = _models()
    want = [_run(target, drafter, use_cache=False, seed=s, n=30, temperature=1.0) for s in range(4)]

    def differs():
        return any(_run(target, drafter, use_cache=True, seed=s, n=30, temperature=1.0) != want[s]
                   for s in range(4))

    with monkeypatch.context() as m:
        m.setattr(kv_spec.CachedScorer, "commit", _keep_rejected_rows)          # both sides
        m.setattr(kv_spec.CachedTarget, "commit", _target_keeps_rejected_rows)
        assert differs()
    with monkeypatch.context() as m:
        m.setattr(kv_spec.CachedTarget, "commit", _target_keeps_rejected_rows)   # the target's side alone
        assert differs()
    with monkeypatch.context() as m:
        m.setattr(LMDrafter, "commit", lambda self, ids, n, target_hidden=None: _keep_rejected_rows(self._scorer, ids))
        assert differs()
    assert not differs()                                                       # the real rollback passes


# -- validation (provided code) -----------------------------------------------------------------
def test_use_cache_validates():
    target, drafter = _models()
    table = TableLM(chain_table(list(range(1, V)) + [0], generator=torch.Generator().manual_seed(0)))
    with pytest.raises(TypeError, match="TransformerLM"):
        speculative_sample(table, NGramDrafter(), [1, 2], 3, use_cache=True)
    with pytest.raises(TypeError, match="TransformerLM"):
        LMDrafter(table, use_cache=True)
    whole_window = type("WholeWindow", (Drafter,), {"reads": ("whole_window",)})   # not a form the engine serves
    with pytest.raises(ValueError, match=r"WholeWindow\.reads must be \('tokens',\), \('final_state',\) or"):
        speculative_sample(target, whole_window(), [1, 2], 3, use_cache=True)
    with pytest.raises(ValueError, match="use_cache"):
        speculative_sample(target, LMDrafter(drafter), [1, 2], 3, on_round=print)
    with pytest.raises(ValueError, match="refill_tokens"):
        CachedScorer(target, refill_tokens=0)
    assert LMDrafter(drafter).cache is None and LMDrafter(drafter, use_cache=True).cache.length == 0
