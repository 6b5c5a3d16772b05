"""Module 08: splitting and merging heads, causal multi-head attention.

Oracles: the head layout written out by index, then a reference multi-head attention built
per head from ``torch.nn.functional`` ops (an independent loop over heads), then
``torch.nn.functional.scaled_dot_product_attention`` and the causality invariant.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from g2c.attention import MultiHeadAttention, merge_heads, split_heads

B, T, D, H = 2, 7, 24, 4
d = D // H


def _x(seed: int = 0, *, b: int = B, t: int = T) -> torch.Tensor:
    return torch.randn(b, t, D, generator=torch.Generator().manual_seed(seed))


def _mha(*, causal: bool = True, seed: int = 0) -> MultiHeadAttention:
    attn = MultiHeadAttention(D, H, causal=causal, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():  # non-zero biases, so a forgotten bias would show
        g = torch.Generator().manual_seed(seed + 100)
        attn.qkv.bias.normal_(0.0, 0.1, generator=g)
        attn.proj.bias.normal_(0.0, 0.1, generator=g)
    return attn


def _reference_mha(attn: MultiHeadAttention, x: torch.Tensor, *, causal: bool = True) -> torch.Tensor:
    """Head by head with explicit column slices: no split_heads, no view tricks."""
    qkv = F.linear(x, attn.qkv.weight, attn.qkv.bias)                  # (B, T, 3D)
    q, k, v = qkv[..., :D], qkv[..., D:2 * D], qkv[..., 2 * D:]
    outs = []
    for h in range(H):
        cols = slice(h * d, (h + 1) * d)
        scores = q[..., cols] @ k[..., cols].transpose(-2, -1) / d ** 0.5     # (B, T, T)
        if causal:
            future = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)
            scores = scores.masked_fill(future, float("-inf"))
        outs.append(torch.softmax(scores, dim=-1) @ v[..., cols])           # (B, T, d)
    return F.linear(torch.cat(outs, dim=-1), attn.proj.weight, attn.proj.bias)


# -- split_heads / merge_heads -------------------------------------------------------------

def test_split_heads_layout():
    x = _x()
    s = split_heads(x, H)
    assert s.shape == (B, H, T, d)
    for h in range(H):
        torch.testing.assert_close(s[:, h], x[..., h * d:(h + 1) * d], atol=0, rtol=0)


def test_split_heads_is_not_a_plain_reshape():
    # x.view(B, H, T, d) has the right shape but mixes time steps into heads.
    x = torch.arange(B * T * D, dtype=torch.float32).view(B, T, D)
    assert not torch.equal(split_heads(x, H), x.view(B, H, T, d))


def test_split_heads_rejects_indivisible_width():
    with pytest.raises(ValueError, match="divisible by H=5"):
        split_heads(_x(), 5)


def test_split_heads_rejects_non_3d_input():
    with pytest.raises(ValueError, match=r"needs \(B, T, D\)"):
        split_heads(torch.zeros(T, D), H)


def test_merge_heads_inverts_split():
    x = _x()
    merged = merge_heads(split_heads(x, H))
    assert merged.shape == (B, T, D)
    assert merged.is_contiguous()
    torch.testing.assert_close(merged, x, atol=0, rtol=0)


def test_merge_heads_layout():
    y = torch.randn(B, H, T, d, generator=torch.Generator().manual_seed(1))
    merged = merge_heads(y)
    for h in range(H):
        torch.testing.assert_close(merged[..., h * d:(h + 1) * d], y[:, h], atol=0, rtol=0)


# -- MultiHeadAttention --------------------------------------------------------------------

def test_mha_rejects_indivisible_width():
    with pytest.raises(ValueError, match="not divisible by num_heads"):
        MultiHeadAttention(10, 3)


def test_mha_matches_torch_reference():
    attn = _mha()
    x = _x(2).to(attn.device)
    out = attn(x)
    assert out.shape == (B, T, D)
    torch.testing.assert_close(out, _reference_mha(attn, x), atol=1e-5, rtol=1e-5)


def test_mha_noncausal_matches_torch_reference():
    attn = _mha(causal=False)
    x = _x(3).to(attn.device)
    torch.testing.assert_close(attn(x), _reference_mha(attn, x, causal=False), atol=1e-5, rtol=1e-5)


def test_mha_matches_torch_sdpa_causal():
    # Same maths through torch's own kernel: split with torch ops, is_causal=True.
    attn = _mha()
    x = _x(4).to(attn.device)
    q, k, v = F.linear(x, attn.qkv.weight, attn.qkv.bias).split(D, dim=-1)
    q, k, v = (t.reshape(B, T, H, d).permute(0, 2, 1, 3) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(0, 2, 1, 3).reshape(B, T, D)
    ref = F.linear(y, attn.proj.weight, attn.proj.bias)
    torch.testing.assert_close(attn(x), ref, atol=1e-5, rtol=1e-5)


def test_mha_is_causal():
    attn = _mha()
    x = _x(5, b=1, t=8).to(attn.device)
    base = attn(x)
    g = torch.Generator().manual_seed(6)
    for t in range(8):
        x2 = x.clone()
        x2[:, t] = torch.randn(D, generator=g)
        out = attn(x2)
        torch.testing.assert_close(out[:, :t], base[:, :t], atol=0, rtol=0)
        assert not torch.allclose(out[:, t], base[:, t])


def test_mha_fused_path_matches_course_path():
    attn = _mha()
    x = _x(7).requires_grad_(True)
    course = attn(x)
    (gx_course,) = torch.autograd.grad(course.sum(), x)
    attn.fused = True
    fused = attn(x)
    (gx_fused,) = torch.autograd.grad(fused.sum(), x)
    torch.testing.assert_close(fused, course, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx_fused, gx_course, atol=1e-5, rtol=1e-5)


def test_mha_fused_path_matches_course_path_noncausal():
    attn = _mha(causal=False)
    x = _x(8).to(attn.device)
    course = attn(x)
    attn.fused = True
    torch.testing.assert_close(attn(x), course, atol=1e-5, rtol=1e-5)


def test_mha_gradients_reach_every_parameter():
    attn = _mha()
    attn(_x(9).to(attn.device)).square().sum().backward()
    for name, p in attn.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name
