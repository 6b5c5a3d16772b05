"""Module 06: log-softmax, cross-entropy and perplexity.

Oracles: hand values (uniform logits), then ``torch.log_softmax`` / ``F.cross_entropy``
including gradients. Tolerance atol=rtol=1e-5: the same float32 formula in a different
order, on values O(10), agrees to a few ulp.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from device_mocks import device_of

from g2c.lm import cross_entropy, log_softmax, perplexity

TOL = dict(atol=1e-5, rtol=1e-5)


# -- log_softmax ---------------------------------------------------------------------------
def test_log_softmax_uniform_by_hand():
    out = log_softmax(torch.zeros(2, 4))
    torch.testing.assert_close(out, torch.full((2, 4), -math.log(4)), **TOL)


def test_log_softmax_is_stable_for_large_logits():
    # exp(1000) overflows float32; the shifted form gives [-log(1 + e^-1) ..., ] exactly
    z = torch.tensor([[1000.0, 999.0], [-1000.0, -1000.0]])
    out = log_softmax(z)
    assert torch.isfinite(out).all()
    a = -math.log(1 + math.exp(-1))
    torch.testing.assert_close(out, torch.tensor([[a, a - 1], [-math.log(2)] * 2]), **TOL)


def test_log_softmax_matches_torch():
    g = torch.Generator().manual_seed(0)
    z = (torch.randn(2, 3, 7, generator=g) * 10).requires_grad_(True)
    out, ref = log_softmax(z), torch.log_softmax(z, dim=-1)
    assert out.shape == z.shape and out.dtype == z.dtype
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(out.exp().sum(-1), torch.ones(2, 3), **TOL)
    gy = torch.randn(2, 3, 7, generator=g)
    torch.testing.assert_close(torch.autograd.grad(out, z, gy)[0], torch.autograd.grad(ref, z, gy)[0], **TOL)


# -- cross_entropy -------------------------------------------------------------------------
def test_cross_entropy_rejects_bad_shapes():
    with pytest.raises(ValueError, match=r"logits \(N, V\) and targets \(N,\); got \(2, 3, 4\)"):
        cross_entropy(torch.zeros(2, 3, 4), torch.zeros(6, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got \(2, 4\) and \(2, 1\)"):
        cross_entropy(torch.zeros(2, 4), torch.zeros(2, 1, dtype=torch.long))
    with pytest.raises(ValueError, match=r"got \(2, 4\) and \(3,\)"):
        cross_entropy(torch.zeros(2, 4), torch.zeros(3, dtype=torch.long))


def test_cross_entropy_by_hand():
    # one row, logits [0, ln 3] -> p = [1/4, 3/4]; target 1 -> loss = -ln(3/4)
    loss = cross_entropy(torch.tensor([[0.0, math.log(3)]]), torch.tensor([1]))
    assert loss.dim() == 0
    assert float(loss) == pytest.approx(-math.log(0.75), rel=1e-6)


def test_cross_entropy_matches_torch():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(12, 9, generator=g) * 4).requires_grad_(True)
    targets = torch.randint(0, 9, (12,), generator=g).to(device_of(logits))  # beside the logits
    loss, ref = cross_entropy(logits, targets), F.cross_entropy(logits, targets)
    torch.testing.assert_close(loss, ref, **TOL)
    torch.testing.assert_close(torch.autograd.grad(loss, logits)[0], torch.autograd.grad(ref, logits)[0], **TOL)


def test_cross_entropy_gradient_is_softmax_minus_onehot():
    # d loss / d z = (softmax(z) - onehot(y)) / N
    g = torch.Generator().manual_seed(2)
    z = torch.randn(5, 6, generator=g, requires_grad=True)
    y = torch.randint(0, 6, (5,), generator=g).to(device_of(z))
    cross_entropy(z, y).backward()
    want = (torch.softmax(z.detach(), -1) - F.one_hot(y, 6).float()) / 5
    torch.testing.assert_close(z.grad, want, **TOL)


def test_cross_entropy_large_logits_are_finite():
    z = torch.tensor([[1e4, 0.0, -1e4]], requires_grad=True)
    loss = cross_entropy(z, torch.tensor([2]).to(device_of(z)))
    assert float(loss.detach()) == pytest.approx(2e4, rel=1e-6)
    loss.backward()
    assert torch.isfinite(z.grad).all()


# -- perplexity ----------------------------------------------------------------------------
def test_perplexity_of_uniform_model_is_vocab_size():
    V = 50
    loss = cross_entropy(torch.zeros(8, V), torch.arange(8))
    assert perplexity(loss) == pytest.approx(V, rel=1e-5)
    assert perplexity(0.0) == 1.0  # a certain model
    assert isinstance(perplexity(torch.tensor(1.0)), float)
