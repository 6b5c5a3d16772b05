"""Module 16 (provided): the fast path ``g2c.kvcache.fast`` against the teaching path.

Oracles: the teaching ``TransformerLM`` run through module 16's ``cached_forward`` (logits)
and module 16's ``cached_generate`` (greedy tokens). The speculative check runs a minimal
greedy draft-verify loop written here on module 16's pieces only (a k + 1-row cached pass,
``KVCache.crop`` rollback), so the test needs no Beyond module; bench/specdec.py ``--fast``
runs the course's speculative loops on the fast path on the ladder.

Tolerance (float32): the packed product sums the same terms in another order, so logits move
by a few ulps of their magnitude (|logits| < 10 here: ~1e-6); 1e-5 is the issue's bound and
still catches a wrong weight, bias or transpose (those move logits by O(0.1)). bfloat16 is
its own model: its logits differ from float32 by the rounding of 8-bit mantissas (~1e-2),
and it is checked for losslessness against itself.
"""

from __future__ import annotations

import pytest
import torch

from g2c.kvcache import KVCache, cached_forward, cached_generate
from g2c.kvcache.fast import FastLM, PackedLinear, fast_model, packed_kernels_available
from g2c.transformer import TransformerLM


def _tiny_lm(seed: int = 0, *, vocab: int = 48, dim: int = 32, layers: int = 2, heads: int = 4,
             max_seq_len: int = 48) -> TransformerLM:
    g = torch.Generator().manual_seed(seed)
    model = TransformerLM(vocab, dim, layers, heads, max_seq_len, generator=g)
    with torch.no_grad():            # greedy chains that move from token to token, clear argmax gaps
        model.token_embed.weight.mul_(3.0)
        model.pos_embed.weight.mul_(12.0)
    return model.eval()


def _ids(n: int, *, vocab: int = 48, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("pack,fused", [(True, True), (False, True), (True, False)])
def test_fast_logits_equal_teaching_path_fp32(pack, fused):
    model = _tiny_lm()
    fast = fast_model(model, pack=pack, fused=fused)
    assert (fast.cached_hidden_states is not None) == fused
    # oneDNN packing is a CPU kernel: on an accelerator (the fake one under --fake-device) nothing is packed
    from device_mocks import device_of

    assert fast.packed == (pack and packed_kernels_available(torch.float32) and device_of(model).type == "cpu")
    ids = _ids(40).unsqueeze(0)
    slow_cache, fast_cache = KVCache.for_model(model), KVCache.for_model(fast)
    start = 0
    for rows in (12, 1, 2, 3, 5, 9, 1, 5):     # prefill, decode steps, verification blocks of k + 1 rows
        block = ids[:, start:start + rows]
        slow = cached_forward(model, block, slow_cache)
        quick = cached_forward(fast, block, fast_cache)
        assert quick.shape == slow.shape == (1, rows, model.vocab_size) and quick.dtype == torch.float32
        torch.testing.assert_close(quick, slow, rtol=1e-5, atol=1e-5)
        start += rows
    assert fast_cache.length == slow_cache.length == start
    torch.testing.assert_close(fast(ids), model(ids), rtol=1e-5, atol=1e-5)


def test_fast_greedy_generation_is_identical():
    model = _tiny_lm(seed=2)
    fast = fast_model(model)
    for seed in range(3):
        prompt = _ids(5, seed=seed)
        want = cached_generate(model, prompt, 30, temperature=0.0)
        assert torch.equal(cached_generate(fast, prompt, 30, temperature=0.0), want)
    # past the window: the re-prefill path sees the same tokens
    long = cached_generate(model, _ids(30), 40, temperature=0.0)
    assert torch.equal(cached_generate(fast, _ids(30), 40, temperature=0.0), long)


def _greedy_speculative(target, drafter, prompt: list[int], new_tokens: int, k: int) -> tuple[list[int], int]:
    """Greedy draft-verify on module 16's pieces: the drafter decodes k rows one at a time,
    the target verifies pending + k drafts in one cached pass, both caches roll back by
    ``crop``. Returns (tokens, target passes). Stays inside the window (the test keeps it so)."""
    tc, dc = KVCache.for_model(target), KVCache.for_model(drafter)
    cached_forward(target, torch.tensor([prompt[:-1]]), tc)
    cached_forward(drafter, torch.tensor([prompt[:-1]]), dc)
    ids, passes = list(prompt), 0
    while len(ids) - len(prompt) < new_tokens:
        draft, pending = [], [ids[-1]]
        for _ in range(k):
            row = cached_forward(drafter, torch.tensor([pending]), dc)[0, -1]
            pending = [int(row.argmax())]
            draft.append(pending[0])
        logits = cached_forward(target, torch.tensor([[ids[-1]] + draft]), tc)[0]   # (k + 1, V), one pass
        passes += 1
        best = logits.argmax(dim=-1).tolist()
        accepted = 0
        while accepted < k and draft[accepted] == best[accepted]:
            accepted += 1
        ids += draft[:accepted] + [best[accepted]]
        tc.crop(len(ids) - 1)
        dc.crop(min(dc.length, len(ids) - 1))
    return ids[:len(prompt) + new_tokens], passes


def test_fast_speculative_greedy_is_identical_and_lossless():
    target, drafter = _tiny_lm(seed=3), _tiny_lm(seed=3, dim=16, layers=1, heads=2)
    with torch.no_grad():   # a drafter that agrees often: the target's embeddings, sliced
        drafter.token_embed.weight.copy_(target.token_embed.weight[:, :16])
    ftarget, fdrafter = fast_model(target), fast_model(drafter)
    for seed in range(3):
        prompt = _ids(6, seed=10 + seed).tolist()
        slow, slow_passes = _greedy_speculative(target, drafter, prompt, 24, k=4)
        quick, quick_passes = _greedy_speculative(ftarget, fdrafter, prompt, 24, k=4)
        assert quick == slow and quick_passes == slow_passes < 24      # some drafts accepted, some rolled back
        plain = cached_generate(ftarget, torch.tensor(prompt), 24, temperature=0.0).tolist()
        assert quick == plain


def test_fast_bfloat16_is_its_own_model_and_lossless_against_itself():
    target, drafter = _tiny_lm(seed=4), _tiny_lm(seed=5, dim=16, layers=1, heads=2)
    fast32, fast16 = fast_model(target), fast_model(target, dtype="bf16")
    assert fast16.dtype == torch.bfloat16 and fast16.stream_dtype == torch.float32
    assert fast16.weight_bytes * 2 == fast32.weight_bytes            # half the bytes per step
    ids = _ids(20).unsqueeze(0)
    l32, l16 = fast32(ids), fast16(ids)
    assert l16.dtype == torch.float32
    diff = (l16 - l32).abs().max().item()
    assert 0 < diff < 0.05 * l32.abs().max().item()                  # rounded, not wrong
    prompt = _ids(6, seed=7).tolist()
    spec, _ = _greedy_speculative(fast16, fast_model(drafter, dtype="bf16"), prompt, 20, k=3)
    assert spec == cached_generate(fast16, torch.tensor(prompt), 20, temperature=0.0).tolist()


def test_fast_model_is_a_snapshot_and_validates():
    model = _tiny_lm()
    fast = fast_model(model)
    assert fast_model(fast) is fast and isinstance(fast_model(fast, dtype="bf16"), FastLM)
    assert fast_model(fast, fused=False) is not fast and fast_model(fast, fused=False).source is model
    ids = _ids(8).unsqueeze(0)
    before, one = fast(ids), fast(ids[:, :1])                        # 8 rows: packed; 1 row: plain weights
    with torch.no_grad():
        model.blocks[0].mlp.fc.weight.add_(1.0)
        model.blocks[0].ln_1.weight.add_(1.0)
        model.token_embed.weight.add_(1.0)
    torch.testing.assert_close(fast(ids), before)                    # copied at construction
    torch.testing.assert_close(fast(ids[:, :1]), one)
    assert fast.train(False) is fast and fast.eval() is fast and fast.training is False
    with pytest.raises(ValueError, match="cannot be trained"):
        fast.train(True)
    with pytest.raises(TypeError, match="fast_model needs a TransformerLM.*blocks"):
        fast_model(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        fast_model(model, dtype="int4")
    with pytest.raises(ValueError, match="dtype must be one of"):
        fast_model(model, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"weight must be \(out, in\)"):
        PackedLinear(torch.zeros(3), None)
    with pytest.raises(ValueError, match=r"integer ids of shape \(B, T\)"):
        fast(torch.zeros(3, dtype=torch.long))


def test_packed_linear_matches_linear_every_row_count():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(24, 40, generator=g), torch.randn(24, generator=g)
    lin = PackedLinear(w, b)
    assert lin.nbytes == (24 * 40 + 24) * 4
    for rows in (1, 2, 3, 4, 5, 9, 17, 33):
        x = torch.randn(rows, 40, generator=g)
        torch.testing.assert_close(lin(x), x @ w.t() + b, rtol=1e-5, atol=1e-5)
    x3 = torch.randn(2, 3, 40, generator=g)                          # leading dimensions kept
    torch.testing.assert_close(lin(x3), x3 @ w.t() + b, rtol=1e-5, atol=1e-5)
