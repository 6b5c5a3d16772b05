"""Module 05: token embeddings plus learned absolute positions.

Oracle: hand-built tables (values chosen so every sum is exact in float32), then
autograd invariants (only looked-up rows receive gradient).
"""

from __future__ import annotations

import pytest
import torch

from g2c.embeddings import embed_tokens_and_positions
from g2c.nn import Embedding


def _tables(V: int = 6, T: int = 4, D: int = 3) -> tuple[Embedding, Embedding]:
    tok, pos = Embedding(V, D), Embedding(T, D)
    with torch.no_grad():
        # token v's row is v in every coordinate; position t's row is 100·t: sums are exact
        tok.weight.copy_(torch.arange(V, dtype=torch.float32)[:, None].expand(V, D))
        pos.weight.copy_(100 * torch.arange(T, dtype=torch.float32)[:, None].expand(T, D))
    return tok, pos


def test_embed_rejects_non_2d_ids():
    tok, pos = _tables()
    with pytest.raises(ValueError, match=r"expected ids of shape \(B, T\), got \(4,\)"):
        embed_tokens_and_positions(torch.tensor([0, 1, 2, 3]), tok, pos)


def test_embed_rejects_long_sequences():
    tok, pos = _tables(T=4)
    with pytest.raises(ValueError, match="T=5 exceeds the context window max_seq_len=4"):
        embed_tokens_and_positions(torch.zeros(1, 5, dtype=torch.long), tok, pos)
    # exactly the window is fine
    assert embed_tokens_and_positions(torch.zeros(1, 4, dtype=torch.long), tok, pos).shape == (1, 4, 3)


def test_embed_shape_and_dtype():
    g = torch.Generator().manual_seed(0)
    tok, pos = Embedding(11, 5, generator=g), Embedding(8, 5, generator=g)
    ids = torch.randint(0, 11, (3, 7), generator=g)
    out = embed_tokens_and_positions(ids, tok, pos)
    assert out.shape == (3, 7, 5) and out.dtype == torch.float32


def test_embed_adds_positions():
    tok, pos = _tables()
    ids = torch.tensor([[5, 0, 2], [1, 1, 4]])
    out = embed_tokens_and_positions(ids, tok, pos)
    # out[b, t, :] = ids[b, t] + 100·t
    want = (ids.float() + 100 * torch.arange(3).float())[:, :, None].expand(2, 3, 3)
    assert torch.equal(out, want)
    # the same token at different positions gets different vectors; same position, shared table
    assert not torch.equal(out[1, 0], out[1, 1])


def test_embed_matches_manual_lookup():
    g = torch.Generator().manual_seed(1)
    tok, pos = Embedding(9, 4, generator=g), Embedding(6, 4, generator=g)
    ids = torch.randint(0, 9, (2, 5), generator=g)
    want = tok.weight[ids] + pos.weight[:5]
    torch.testing.assert_close(embed_tokens_and_positions(ids, tok, pos), want, atol=0, rtol=0)


def test_embed_gradient_reaches_used_rows_only():
    tok, pos = _tables(V=6, T=4)
    ids = torch.tensor([[1, 3], [3, 3]])
    embed_tokens_and_positions(ids, tok, pos).sum().backward()
    # d(sum)/d(row) = number of times the row was used, in every coordinate
    counts_tok = torch.tensor([0, 1, 0, 3, 0, 0], dtype=torch.float32)[:, None].expand(6, 3)
    counts_pos = torch.tensor([2, 2, 0, 0], dtype=torch.float32)[:, None].expand(4, 3)
    assert torch.equal(tok.weight.grad, counts_tok)
    assert torch.equal(pos.weight.grad, counts_pos)
