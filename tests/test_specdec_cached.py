"""Module 16 (provided code): speculative decoding as a state transaction on KV caches.

Needs the specdec module's ``greedy_verify`` too, so run it with
``G2C_APPLY_SOLUTIONS=16,specdec`` (plus 01-11 while the stack is unfinished), or ``all``.

Oracles: the uncached ``g2c.specdec.speculative_generate`` and module 11's greedy
``generate`` for the emitted tokens; for the committed state, the cache that plain cached
decoding (``prefill`` of the same emitted tokens, and one-token steps) builds, and the
logits of a fresh full forward. Tolerance 1e-5 for cached K/V rows: the same float32
products summed in a different order (rows of a chunk vs one row) differ by ~1e-7 here.
"""

from __future__ import annotations

import pytest
import torch
from specdec_mocks import SumModLM, refill_greedy, windowed_greedy

from g2c.kvcache import KVCache, cached_forward, cached_generate, prefill
from g2c.kvcache.forward import cached_block
from g2c.sampling import generate
from g2c.specdec import MTPHead, SpecStats, mtp_propose, speculative_generate
from g2c.specdec.sampling import LMDrafter, mtp_generate_cached, speculative_generate_cached, summarize_rounds
from g2c.specdec.sampling.loop import speculative_sample
from g2c.transformer import TransformerLM

V = 32


def _lm(seed: int, *, max_seq_len: int = 48, dim: int = 16, layers: int = 2, sharpen: float = 5.0) -> TransformerLM:
    g = torch.Generator().manual_seed(seed)
    model = TransformerLM(V, dim, layers, 2, max_seq_len, generator=g)
    with torch.no_grad():
        # Peaked, position-dependent logits: varied greedy chains with argmax gaps >> float noise.
        model.token_embed.weight.mul_(sharpen)
        model.pos_embed.weight.mul_(4 * sharpen)
    return model.eval()


def _prompt(n: int = 5, seed: int = 7) -> torch.Tensor:
    return torch.randint(0, V, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("k", [1, 2, 4])
def test_cached_speculative_matches_uncached_and_greedy(k):
    target, drafter = _lm(2), _lm(3, dim=8, layers=1)
    prompt = _prompt()
    want = generate(target, prompt, 30, temperature=0.0)
    ids, stats = speculative_generate_cached(target, drafter, prompt, 30, k=k)
    ref, ref_stats = speculative_generate(target, drafter, prompt, 30, k=k)
    assert ids.tolist() == want.tolist() == ref.tolist()
    assert isinstance(stats, SpecStats) and stats.generated == 30
    assert (stats.target_passes, stats.accepted) == (ref_stats.target_passes, ref_stats.accepted)


def test_cached_speculative_perfect_drafter_accepts_everything():
    target = _lm(2)
    ids, stats = speculative_generate_cached(target, target, _prompt(), 20, k=4)
    assert ids.tolist() == generate(target, _prompt(), 20, temperature=0.0).tolist()
    assert stats.acceptance_rate == 1.0 and stats.target_passes == 4     # 5 + 5 + 5 + 5 tokens


def assert_committed_state(target, rec) -> None:
    """The state-transaction check after one round (``rec`` a ``RoundRecord``, no re-prefill
    yet): the committed target rows equal plain cached decoding of the same tokens (one
    prefill, and one token at a time) within 1e-5, one more step from the rolled-back cache
    gives the logits of a fresh full forward (1e-4), and the drafter's cache is committed too.
    Shared with tests/test_specdec_sampling_cached.py."""
    ids = rec.ids
    cache = rec.target_cache
    assert cache.length == len(ids) - 1                 # all committed tokens but the pending one
    _, plain = prefill(target, ids[:-1])                 # plain cached decoding, one prefill
    steps = KVCache.for_model(target)                    # ... and one token at a time
    for t in range(len(ids) - 1):
        cached_forward(target, ids[t:t + 1].unsqueeze(0), steps)
    for layer in range(target.num_layers):
        for ref in (plain, steps):
            torch.testing.assert_close(cache.keys(layer), ref.keys(layer), atol=1e-5, rtol=0)
            torch.testing.assert_close(cache.values(layer), ref.values(layer), atol=1e-5, rtol=0)
    # Next-token logits from the rolled-back cache = a fresh full forward; then roll back again.
    nxt = cached_forward(target, ids[-1:].unsqueeze(0), cache)[0, -1]
    cache.crop(cache.length - 1)
    torch.testing.assert_close(nxt, target(ids.unsqueeze(0))[0, -1], atol=1e-4, rtol=0)
    # The drafter's cache is committed too (a prefix of the committed ids).
    assert rec.drafter_cache.length <= len(ids) - 1


def test_cached_speculative_state_transaction_every_round():
    """The second half of losslessness: after every round the committed target state is what
    plain cached decoding of the same tokens builds, and decoding on from it is exact."""
    target, drafter = _lm(2), _lm(3, dim=8, layers=1)
    checked = []

    def check(rec):
        assert_committed_state(target, rec)
        checked.append(rec)

    speculative_generate_cached(target, drafter, _prompt(), 30, k=4, on_round=check)
    assert len(checked) >= 8 and any(r.accepted < len(r.draft) for r in checked)   # rejections happened


def test_cached_speculative_round_accounting():
    target, drafter = _lm(2), _lm(3, dim=8, layers=1)
    records = []
    _, stats = speculative_generate_cached(target, drafter, _prompt(), 30, k=4, on_round=records.append)
    for r in records[:-1]:                                    # the last round may be cut by the budget
        assert r.kv_rows_reserved == len(r.draft) + 1
        assert r.kv_rows_rolled_back == len(r.draft) - r.accepted
        assert r.rollback_bytes_moved == 0
    s = summarize_rounds(records)
    assert s["rounds"] == stats.target_passes and s["rollback_bytes_moved"] == 0
    assert s["kv_rows_rolled_back"] == sum(len(r.draft) - r.accepted for r in records[:-1]) + \
        records[-1].kv_rows_rolled_back


def test_rejected_rows_can_never_be_read():
    """Poison every row past the committed pointer with NaN after each round: if any later read
    touched a rejected draft's keys/values, NaN would reach the logits and the output."""
    target, drafter = _lm(2), _lm(3, dim=8, layers=1)

    def poison(rec):
        for cache in (rec.target_cache, rec.drafter_cache):
            for buf in cache.keys_buffer + cache.values_buffer:
                buf[:, :, cache.length:] = float("nan")

    ids, _ = speculative_generate_cached(target, drafter, _prompt(), 30, k=4, on_round=poison)
    assert ids.tolist() == generate(target, _prompt(), 30, temperature=0.0).tolist()


def test_cached_speculative_eos_and_budget():
    target, drafter = _lm(2), _lm(3, dim=8, layers=1)
    chain = generate(target, _prompt(), 20, temperature=0.0).tolist()
    eos = chain[12]
    ids, stats = speculative_generate_cached(target, drafter, _prompt(), 20, k=4, eos_id=eos)
    assert ids.tolist() == chain[:chain.index(eos, 5) + 1]
    ids, stats = speculative_generate_cached(target, drafter, _prompt(), 7, k=4)
    assert len(ids) == 12 and stats.generated == 7


def test_cached_speculative_past_window_refills():
    # Window 16: the target re-prefills its last 8 tokens when full; tokens inside the window
    # equal greedy decoding; the output keeps the budget and the caches stay within capacity.
    target, drafter = _lm(2, max_seq_len=16), _lm(3, dim=8, layers=1, max_seq_len=16)
    records = []
    ids, stats = speculative_generate_cached(target, drafter, _prompt(), 30, k=4, on_round=records.append)
    greedy = generate(target, _prompt(), 11, temperature=0.0).tolist()
    assert ids.tolist()[:16] == greedy and len(ids) == 35
    assert any(r.target_start > 0 for r in records)
    assert all(r.target_cache.length <= 16 for r in records)


def test_cached_speculative_validates():
    target, drafter = _lm(2), _lm(3, dim=8, layers=1)
    with pytest.raises(ValueError, match="k must be >= 1"):
        speculative_generate_cached(target, drafter, _prompt(), 3, k=0)
    with pytest.raises(ValueError, match="prompt_ids"):
        speculative_generate_cached(target, drafter, [], 3)
    with pytest.raises(ValueError, match="max_new_tokens"):
        speculative_generate_cached(target, drafter, _prompt(), -1)
    other = TransformerLM(V + 1, 8, 1, 2, 48)
    with pytest.raises(ValueError, match="vocab_size"):
        speculative_generate_cached(target, other, _prompt(), 3)
    with pytest.raises(ValueError, match="target max_seq_len=1 leaves no room for a draft; need >= 2"):
        speculative_generate_cached(_lm(2, max_seq_len=1), drafter, _prompt(2), 3, k=4)
    # a window below k + 2 runs: draft_room shrinks the drafts to fit (no second window precondition)


def test_cached_speculative_on_pass_like_uncached():
    target, drafter = _lm(2), _lm(3, dim=8, layers=1)
    got, want = [], []
    speculative_generate_cached(target, drafter, _prompt(), 20, k=3, on_pass=lambda e, n: got.append((e, n)))
    speculative_generate(target, drafter, _prompt(), 20, k=3, on_pass=lambda e, n: want.append((e, n)))
    assert got == want


# ---- MTP self-speculation -----------------------------------------------------------------

def _mtp_head(base, seed=5):
    head = MTPHead(base, generator=torch.Generator().manual_seed(seed))
    return head.eval()


def test_mtp_cached_matches_greedy_and_mtp_propose():
    base = _lm(2)
    head = _mtp_head(base)
    records = []
    ids, stats = mtp_generate_cached(base, head, _prompt(), 25, on_round=records.append)
    assert ids.tolist() == generate(base, _prompt(), 25, temperature=0.0).tolist()
    # Every verified guess is exactly the uncached head's guess from the same context.
    for rec in records[1:]:
        ctx = rec.ids[:len(rec.ids) - len(rec.emitted) - 1]          # context before the pending token
        nxt, guess = mtp_propose(base, head, ctx)
        assert rec.draft == [guess] and rec.ids[len(ctx)].item() == nxt
    assert stats.target_passes == len(records) and stats.generated == 25


def _head_logits(head, base, hidden: torch.Tensor, following: list[int], cache: KVCache) -> torch.Tensor:
    """The ``MTPHead`` forward on T new positions with its own one-layer cache: the oracle for the
    head cache of ``mtp_generate_cached`` (whose drafter is ``MTPDrafter``).

    hidden (1, T, D), following: token t+1 for each new position t -> logits (1, T, V) for t+2.
    Same maths as ``MTPHead.forward`` (a test checks it), with the block cached.
    """
    table = base.token_embed.weight                                                # (V, D)
    emb = head.ln_embed(table[torch.tensor([following], device=table.device)])     # (1, T, D)
    x = head.fuse(torch.cat([hidden, emb], dim=-1))                                # (1, T, D)
    y = head.ln_final(cached_block(head.block, x, cache, 0))                       # (1, T, D)
    cache.advance(x.shape[1])
    return y @ table.t() + head.bias                                               # (1, T, V)


def test_mtp_cached_head_matches_uncached_head():
    """With a head that is the base itself in disguise (perfect guesses are impossible to build
    by hand), check the cached head cache state: after each round its rows equal a fresh head pass."""
    base = _lm(2)
    head = _mtp_head(base)

    def check(rec):
        ids = rec.ids
        h = base.hidden_states(ids[:-1].unsqueeze(0))                 # (1, N-1, D)
        hcache = KVCache(1, 1, base.num_heads, base.embedding_dim // base.num_heads, base.max_seq_len,
                         device=base.device)
        _head_logits(head, base, h, ids[1:].tolist(), hcache)
        assert rec.drafter_cache.length == hcache.length
        torch.testing.assert_close(rec.drafter_cache.keys(0), hcache.keys(0), atol=1e-5, rtol=0)

    mtp_generate_cached(base, head, _prompt(), 20, on_round=check)


def test_mtp_cached_accepts_when_head_is_right():
    base = _lm(2)
    head = _mtp_head(base)
    ids, stats = mtp_generate_cached(base, head, _prompt(), 25)
    # A random head is mostly wrong: one token per pass then (acceptance near 0).
    assert 0 <= stats.acceptance_rate <= 1
    assert stats.tokens_per_pass == pytest.approx(stats.generated / stats.target_passes)


@pytest.mark.cpu_mock
@pytest.mark.parametrize("k", range(1, 7))
def test_every_cached_loop_equals_cached_generate_at_the_window_edge(k):
    """The shared window-edge rule (``g2c.specdec.draft_room``) on a model whose next token
    depends on every visible id (``SumModLM``: sum mod 7, window 8, prompt [1, 2]).

    Up to prompt + output = window + 1 every cached loop is plain greedy decoding; past it the
    cached loops re-prefill exactly where module 16's ``cached_generate`` does (its last
    ``refill_tokens`` tokens), so each equals ``cached_generate`` token for token, and the
    cached sampled loop at temperature 0 equals ``speculative_generate_cached`` (the lesson's
    claim). Before the rule, k = 3 gave [..., 3, 6, 5, 3] for the issue's example only by luck
    of k: k = 1 gave [..., 6, 5, 5] (a re-prefill one token early) and the sampled cached loop
    [..., 3, 3, 6, 5]. The oracle ``refill_greedy`` uses the rule alone."""
    target, drafter = SumModLM(max_seq_len=8), SumModLM(max_seq_len=8)
    short = SumModLM(max_seq_len=3)                                       # a drafter that re-prefills often
    head = MTPHead(target, generator=torch.Generator().manual_seed(0))
    prompt = [1, 2]
    for n in (7, 15):
        want = refill_greedy(target, prompt, n)
        assert cached_generate(target, prompt, n, temperature=0.0).tolist() == want        # the mock, cached
        if n == 7:
            assert want == windowed_greedy(target, prompt, n) == [1, 2, 3, 6, 5, 3, 6, 5, 3]
        for d in (drafter, short):
            ids, stats = speculative_generate_cached(target, d, prompt, n, k=k)
            assert ids.tolist() == want, f"speculative_generate_cached, {n} tokens, drafter window {d.max_seq_len}"
            sampled, s_stats = speculative_sample(target, LMDrafter(d, use_cache=True), prompt, n, k=k,
                                                  temperature=0.0, use_cache=True)
            assert sampled.tolist() == want, f"speculative_sample(use_cache=True), {n} tokens"
            assert (s_stats.target_passes, s_stats.drafted, s_stats.accepted) == \
                (stats.target_passes, stats.drafted, stats.accepted)            # counter for counter
        assert stats.generated == n
        for refill in (1, 3, 8):                                          # every refill_tokens in [1, window]
            ids, _ = speculative_generate_cached(target, drafter, prompt, n, k=k, refill_tokens=refill)
            assert ids.tolist() == refill_greedy(target, prompt, n, refill) == \
                cached_generate(target, prompt, n, temperature=0.0, refill_tokens=refill).tolist()
        ids, _ = mtp_generate_cached(target, head, prompt, n, refill_tokens=min(k, 8))
        assert ids.tolist() == refill_greedy(target, prompt, n, min(k, 8)), f"mtp_generate_cached, {n} tokens"
    long_prompt = [3, 1, 4, 1, 5, 2, 6, 5, 3, 5]                          # longer than the window
    ids, stats = speculative_generate_cached(target, drafter, long_prompt, 6, k=k)
    assert ids.tolist() == refill_greedy(target, long_prompt, 6)
