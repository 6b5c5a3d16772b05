"""Module 16, provided: ``RaggedKVCache`` (per-row lengths) and the masked cached forward.

Oracles: hand-made tensors for the per-row bookkeeping (writes, key-padding mask, crop);
for the forward, every batch row run alone (the module 09 ``TransformerLM`` over the whole
row for the logits, and the same row alone in a one-row cache for the committed state).
Nothing here depends on module 16's exercises (``RaggedKVCache`` overrides ``append``/``crop``).

Tolerance: a batched masked pass and a one-row pass add the same terms in a different order
(float32, |logits| < 50 here: a few 1e-6); 1e-4 on logits and 1e-5 on keys/values leave
room and still catch a wrong position or an unmasked pad row (those move values by O(0.1)).
"""

from __future__ import annotations

import pytest
import torch

from g2c.kvcache import KVCache, RaggedKVCache, ragged_forward
from g2c.transformer import TransformerLM


def _tiny_lm(seed: int = 0, *, max_seq_len: int = 24, vocab: int = 32) -> TransformerLM:
    g = torch.Generator().manual_seed(seed)
    return TransformerLM(vocab, 16, 2, 2, max_seq_len, generator=g).eval()


def _pad(rows: list[list[int]]) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows])                 # (B, T)


def test_ragged_cache_writes_each_row_at_its_own_length():
    cache = RaggedKVCache(1, 3, 1, 2, 8)
    cache.lengths = torch.tensor([0, 2, 5])
    assert cache.length == 5 and cache.lengths.tolist() == [0, 2, 5]
    new = torch.arange(3 * 2 * 2, dtype=torch.float32).view(3, 1, 2, 2) + 1.0        # (B, H, T=2, d)
    keys, values = cache.append(0, new, -new)
    assert keys.shape == (3, 1, 7, 2)                                                 # S = max(lengths) + T
    for b, start in enumerate([0, 2, 5]):
        assert torch.equal(cache.keys_buffer[0][b, 0, start:start + 2], new[b, 0])
        assert torch.equal(cache.values_buffer[0][b, 0, start:start + 2], -new[b, 0])
        untouched = [r for r in range(8) if not start <= r < start + 2]
        assert cache.keys_buffer[0][b, 0, untouched].abs().sum() == 0
    assert cache.lengths.tolist() == [0, 2, 5]                                        # append does not commit
    with pytest.raises(ValueError, match="max_seq_len"):
        cache.append(0, torch.zeros(3, 1, 4, 2), torch.zeros(3, 1, 4, 2))


def test_ragged_cache_key_padding_mask_by_hand():
    cache = RaggedKVCache(1, 2, 1, 1, 8)
    cache.lengths = torch.tensor([1, 3])
    mask = cache.key_padding_mask(2)                                                  # (B, T, S = 5)
    expected = torch.tensor([[[1, 1, 0, 0, 0], [1, 1, 1, 0, 0]],
                             [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]], dtype=torch.bool)
    assert torch.equal(mask, expected)
    assert cache.positions(2).tolist() == [[1, 2], [3, 4]]


def test_ragged_cache_crop_advance_keep_per_row():
    cache = RaggedKVCache(2, 3, 1, 1, 8)
    cache.advance(torch.tensor([4, 2, 6]))
    assert cache.crop(torch.tensor([1, 2, 3])) == 0                                   # pointer rollback: no bytes
    assert cache.lengths.tolist() == [1, 2, 3]
    cache.advance(2)
    assert cache.lengths.tolist() == [3, 4, 5]
    with pytest.raises(ValueError, match="only roll back"):
        cache.crop(torch.tensor([3, 5, 0]))
    with pytest.raises(ValueError, match="max_seq_len"):
        cache.advance(torch.tensor([0, 0, 4]))
    with pytest.raises(ValueError, match="int tensor"):
        cache.crop(torch.tensor([1.0, 2.0, 3.0]))
    cache.keys_buffer[0][:, 0, 0, 0] = torch.tensor([10.0, 11.0, 12.0])
    cache.keep(torch.tensor([2, 0]))
    assert cache.batch_size == 2 and cache.lengths.tolist() == [5, 3]
    assert cache.keys_buffer[0][:, 0, 0, 0].tolist() == [12.0, 10.0]
    assert cache.keys(0, row=1).shape == (1, 3, 1)
    cache.reset()
    assert cache.lengths.tolist() == [0, 0]


def test_ragged_forward_state_equals_each_row_alone():
    # Ragged prompts, right-padded: per-row logits equal the full model on that row, and after
    # crop(lengths) the committed rows of row b are exactly those of row b run alone (one row, no
    # pads; module 16's own KVCache is the student's exercise, so it is not the oracle here).
    model = _tiny_lm()
    prompts = [[3, 1, 4, 1, 5], [9, 2], [6, 5, 3, 5, 8, 9, 7]]
    cache = RaggedKVCache.for_model(model, 3)
    logits = ragged_forward(model, _pad(prompts), cache)                               # (3, 7, V)
    assert cache.lengths.tolist() == [7, 7, 7]                     # every row advanced by T, like cached_forward
    cache.crop(torch.tensor([len(p) for p in prompts]))
    # A second ragged step: 2, 1 and 3 new tokens.
    more = [[2, 7], [1], [4, 4, 0]]
    step = ragged_forward(model, _pad(more), cache)                                     # (3, 3, V)
    cache.crop(torch.tensor([len(p) + len(m) for p, m in zip(prompts, more)]))
    for b, (p, m) in enumerate(zip(prompts, more)):
        full = model(torch.tensor([p + m]))[0]                                          # (len, V)
        torch.testing.assert_close(logits[b, :len(p)], full[:len(p)], atol=1e-4, rtol=0)
        torch.testing.assert_close(step[b, :len(m)], full[len(p):], atol=1e-4, rtol=0)
        alone = RaggedKVCache.for_model(model, 1)                                        # one row, no padding
        ragged_forward(model, torch.tensor([p + m]), alone)
        for layer in range(model.num_layers):
            torch.testing.assert_close(cache.keys(layer, row=b), alone.keys(layer, row=0), atol=1e-5, rtol=0)
            torch.testing.assert_close(cache.values(layer, row=b), alone.values(layer, row=0), atol=1e-5, rtol=0)


def test_ragged_forward_pads_are_never_read():
    # The classic bug: attending over the padded rows. Different pad ids must not change a row.
    model = _tiny_lm(1)
    prompts = [[3, 1, 4, 1, 5], [9, 2]]
    outs = []
    for pad in (0, 17):
        cache = RaggedKVCache.for_model(model, 2)
        width = 5
        ids = torch.tensor([p + [pad] * (width - len(p)) for p in prompts])
        ragged_forward(model, ids, cache)
        cache.crop(torch.tensor([5, 2]))
        outs.append(ragged_forward(model, torch.tensor([[7], [7]]), cache))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=0)
    assert torch.allclose(outs[0][1, 0], model(torch.tensor([[9, 2, 7]]))[0, -1], atol=1e-4)


def test_ragged_forward_validates():
    model = _tiny_lm(max_seq_len=8)
    with pytest.raises(TypeError, match="RaggedKVCache"):
        ragged_forward(model, torch.zeros(1, 2, dtype=torch.long), KVCache.for_model(model))
    cache = RaggedKVCache.for_model(model, 2)
    with pytest.raises(ValueError, match="rows"):
        ragged_forward(model, torch.zeros(3, 2, dtype=torch.long), cache)
    with pytest.raises(ValueError, match="max_seq_len"):
        ragged_forward(model, torch.zeros(2, 9, dtype=torch.long), cache)


def test_forward_rows_on_a_ragged_cache_defaults_to_per_row_positions_and_mask():
    # The trunk's defaults on a RaggedKVCache are its per-row positions and key-padding mask:
    # the same states as passing them explicitly (masked_hidden_states), and as each row alone.
    from g2c.kvcache import forward_rows, masked_hidden_states

    model = _tiny_lm(2)
    prompts = [[3, 1, 4, 1, 5], [9, 2, 6]]
    more = _pad([[2, 7, 1], [8, 8, 3]])
    caches = []
    for _ in range(2):
        cache = RaggedKVCache.for_model(model, 2)
        ragged_forward(model, _pad(prompts), cache)
        cache.crop(torch.tensor([5, 3]))
        caches.append(cache)
    states, kept = forward_rows(model, more, caches[0])
    assert kept is None and caches[0].lengths.tolist() == [5, 3]             # the pointer does not move
    explicit = masked_hidden_states(model, more, caches[1], caches[1].positions(3),
                                    caches[1].key_padding_mask(3).unsqueeze(1))
    torch.testing.assert_close(states, explicit, atol=0, rtol=0)
    for b, p in enumerate(prompts):
        alone = model.hidden_states(torch.tensor([p + more[b].tolist()]))[0, len(p):]
        torch.testing.assert_close(states[b], alone, atol=1e-5, rtol=0)
