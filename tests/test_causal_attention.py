"""Module 07: the causal mask, scaled dot-product attention, single-head causal self-attention.

Oracles: a mask written out by hand, then ``torch.nn.functional.scaled_dot_product_attention``
(an independent implementation), then the causality invariant.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from g2c.attention import CausalSelfAttention, causal_mask, scaled_dot_product_attention


def _qkv(*shape_prefix: int, T: int = 6, S: int | None = None, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    S = T if S is None else S
    q = torch.randn(*shape_prefix, T, d, generator=g)
    k = torch.randn(*shape_prefix, S, d, generator=g)
    v = torch.randn(*shape_prefix, S, d, generator=g)
    return q, k, v


# -- causal_mask ---------------------------------------------------------------------------

def test_causal_mask_is_lower_triangular():
    expected = torch.tensor([[1, 0, 0, 0],
                             [1, 1, 0, 0],
                             [1, 1, 1, 0],
                             [1, 1, 1, 1]], dtype=torch.bool)
    mask = causal_mask(4)
    assert mask.dtype == torch.bool
    assert torch.equal(mask, expected)


def test_causal_mask_queries_are_the_last_positions():
    # 2 queries at absolute positions 3 and 4 of a 5-key sequence.
    expected = torch.tensor([[1, 1, 1, 1, 0],
                             [1, 1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(causal_mask(2, 5), expected)


@pytest.mark.parametrize("t, s", [(0, None), (3, 2)])
def test_causal_mask_rejects_bad_sizes(t, s):
    with pytest.raises(ValueError, match="num_queries <= num_keys"):
        causal_mask(t, s)


# -- scaled_dot_product_attention ----------------------------------------------------------

def test_sdpa_hand_computed_two_keys():
    # One query, two keys; d = 4 so the scale is 1/2. Scores [2, 0] / 2 = [1, 0].
    q = torch.tensor([[1.0, 1.0, 0.0, 0.0]])
    k = torch.tensor([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    v = torch.tensor([[1.0], [0.0]])
    w = math.e / (math.e + 1.0)
    out = scaled_dot_product_attention(q, k, v, causal=False)
    assert out.shape == (1, 1)
    assert out.item() == pytest.approx(w, rel=1e-6)


def test_sdpa_matches_torch_noncausal():
    q, k, v = _qkv(2, 3, T=5, S=7)
    ours = scaled_dot_product_attention(q, k, v, causal=False)
    ref = F.scaled_dot_product_attention(q, k, v)
    assert ours.shape == (2, 3, 5, 8)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_sdpa_matches_torch_causal():
    q, k, v = _qkv(2, 3, T=7)
    ours = scaled_dot_product_attention(q, k, v, causal=True)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)


def test_sdpa_causal_first_query_copies_first_value():
    # The first query may only see the first key, so its output is exactly v[0].
    q, k, v = _qkv(2, T=5)
    out = scaled_dot_product_attention(q, k, v, causal=True)
    torch.testing.assert_close(out[:, 0], v[:, 0])


def test_sdpa_causal_with_fewer_queries_than_keys():
    # Queries are the last T of S positions: same as the last rows of full causal attention.
    q, k, v = _qkv(2, T=7)
    full = scaled_dot_product_attention(q, k, v, causal=True)
    tail = scaled_dot_product_attention(q[:, -3:], k, v, causal=True)
    torch.testing.assert_close(tail, full[:, -3:], atol=1e-6, rtol=1e-6)


def test_sdpa_value_width_may_differ():
    q, k, _ = _qkv(2, T=4, d=8)
    v = torch.randn(2, 4, 3, generator=torch.Generator().manual_seed(1))
    out = scaled_dot_product_attention(q, k, v, causal=True)
    assert out.shape == (2, 4, 3)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               atol=1e-5, rtol=1e-5)


def test_sdpa_gradients_match_torch():
    q, k, v = (t.requires_grad_(True) for t in _qkv(2, T=5))
    scaled_dot_product_attention(q, k, v, causal=True).square().sum().backward()
    ours = [t.grad.clone() for t in (q, k, v)]
    q2, k2, v2 = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    F.scaled_dot_product_attention(q2, k2, v2, is_causal=True).square().sum().backward()
    for a, b in zip(ours, (q2.grad, k2.grad, v2.grad)):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_sdpa_rejects_mismatched_head_width():
    q, k, v = _qkv(2, T=4)
    with pytest.raises(ValueError, match="attention shapes do not fit"):
        scaled_dot_product_attention(q, k[..., :5], v)


def test_sdpa_rejects_mismatched_key_value_length():
    q, k, v = _qkv(2, T=4)
    with pytest.raises(ValueError, match="attention shapes do not fit"):
        scaled_dot_product_attention(q, k, v[:, :3])


# -- CausalSelfAttention -------------------------------------------------------------------

def _single_head(causal: bool = True) -> CausalSelfAttention:
    attn = CausalSelfAttention(16, causal=causal, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():  # non-zero biases, so a forgotten bias would show
        for lin in (attn.query, attn.key, attn.value, attn.proj):
            lin.bias.normal_(0.0, 0.1, generator=torch.Generator().manual_seed(7))
    return attn


def test_causal_self_attention_matches_torch_reference():
    attn = _single_head()
    x = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(1)).to(attn.device)

    def lin(layer, t):
        return F.linear(t, layer.weight, layer.bias)

    ref = F.scaled_dot_product_attention(lin(attn.query, x), lin(attn.key, x), lin(attn.value, x), is_causal=True)
    ref = lin(attn.proj, ref)
    out = attn(x)
    assert out.shape == (2, 6, 16)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)


def test_causal_self_attention_is_causal():
    attn = _single_head()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(1, 8, 16, generator=g).to(attn.device)
    base = attn(x)
    for t in range(8):
        x2 = x.clone()
        x2[:, t] = torch.randn(16, generator=g)
        out = attn(x2)
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=0, rtol=0)
        assert not torch.allclose(out[:, t:], base[:, t:])


def test_causal_self_attention_noncausal_sees_the_future():
    attn = _single_head(causal=False)
    x = torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(3)).to(attn.device)
    x2 = x.clone()
    x2[:, -1] += 1.0
    assert not torch.allclose(attn(x2)[:, 0], attn(x)[:, 0])
