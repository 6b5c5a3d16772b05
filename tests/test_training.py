"""Module 03b: AdamW, clip_grad_norm_, cosine_with_warmup.

Oracles: hand values for one step and for the schedule, then ``torch.optim.AdamW`` and
``torch.nn.utils.clip_grad_norm_`` on random problems.
Tolerance for AdamW over 50 steps: each step moves a parameter by at most ~lr = 1e-2 and
float32 rounding differences between two orderings of the same formula are ~1e-7 relative
per step, so after 50 steps the parameters agree to well under 1e-5; we use atol=rtol=1e-5.
"""

from __future__ import annotations

import math

import pytest
import torch

from g2c.training import AdamW, clip_grad_norm_, cosine_with_warmup

TOL = dict(atol=1e-5, rtol=1e-5)


def _param(*values: float) -> torch.Tensor:
    return torch.tensor(values, requires_grad=True)


# -- AdamW ---------------------------------------------------------------------------------
def test_adamw_rejects_bad_arguments():
    with pytest.raises(ValueError, match="empty parameter list"):
        AdamW([])
    with pytest.raises(ValueError, match="lr=-1"):
        AdamW([_param(1.0)], lr=-1)
    with pytest.raises(ValueError, match="weight_decay=-0.1"):
        AdamW([_param(1.0)], weight_decay=-0.1)
    with pytest.raises(ValueError, match=r"betas must be in \[0, 1\)"):
        AdamW([_param(1.0)], betas=(0.9, 1.0))


def test_adamw_first_step_by_hand():
    # At t=1 the bias-corrected m̂ = g and v̂ = g², so the Adam step is lr·g/(|g| + eps) ≈ lr·sign(g).
    p = _param(1.0, -2.0)
    opt = AdamW([p], lr=0.1, weight_decay=0.0, eps=0.0)
    p.grad = torch.tensor([3.0, -0.5])
    opt.step()
    torch.testing.assert_close(p.detach(), torch.tensor([0.9, -1.9]), **TOL)
    assert opt.state[0]["step"] == 1


def test_adamw_skips_none_grads():
    a, b = _param(1.0, 2.0), _param(5.0)
    opt = AdamW([a, b], lr=0.1, weight_decay=0.5)
    a.grad = torch.tensor([1.0, 1.0])
    opt.step()
    # b had no grad: not decayed, not moved, moments untouched, step counter not advanced
    assert torch.equal(b.detach(), torch.tensor([5.0]))
    assert opt.state[1]["step"] == 0
    assert torch.equal(opt.state[1]["m"], torch.zeros(1))
    assert opt.state[0]["step"] == 1


def test_adamw_zero_grad_sets_none():
    p = _param(1.0)
    opt = AdamW([p])
    p.grad = torch.ones(1)
    opt.zero_grad()
    assert p.grad is None


def test_adamw_zero_grad_only_decays():
    # g = 0: m = v = 0, so the Adam part is 0/(0 + eps) = 0; only the decay moves θ.
    p = _param(2.0)
    opt = AdamW([p], lr=0.1, weight_decay=0.5)
    p.grad = torch.zeros(1)
    opt.step()
    torch.testing.assert_close(p.detach(), torch.tensor([2.0 * (1 - 0.1 * 0.5)]), **TOL)


def test_adamw_decay_is_decoupled():
    # Decoupled: the decay term lr·λ·θ is NOT fed through m and v. With g = 1 and
    # eps = 0, the Adam part is exactly lr (whatever θ is), so
    #   θ1 = θ0·(1 − lr·λ) − lr.
    # L2-in-the-gradient (plain Adam + λθ in g) would instead still give a step of ≈ lr·sign(g + λθ).
    theta0, lr, lam = 10.0, 0.1, 0.5
    p = _param(theta0)
    opt = AdamW([p], lr=lr, weight_decay=lam, eps=0.0)
    p.grad = torch.ones(1)
    opt.step()
    torch.testing.assert_close(p.detach(), torch.tensor([theta0 * (1 - lr * lam) - lr]), **TOL)
    assert torch.equal(opt.state[0]["m"], torch.tensor([0.1]))  # (1 − β1)·g, no λθ inside


def test_adamw_no_decay_list():
    w, b = _param(1.0), _param(1.0)
    opt = AdamW([w, b], lr=0.1, weight_decay=0.5, eps=0.0, no_decay=[b])
    w.grad, b.grad = torch.ones(1), torch.ones(1)
    opt.step()
    torch.testing.assert_close(w.detach(), torch.tensor([1.0 * 0.95 - 0.1]), **TOL)
    torch.testing.assert_close(b.detach(), torch.tensor([1.0 - 0.1]), **TOL)


def test_adamw_matches_torch_over_many_steps():
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 3), (3,), (2, 2, 2), (1,)]
    ours = [torch.randn(s, generator=g).requires_grad_(True) for s in shapes]
    ref = [p.detach().clone().requires_grad_(True) for p in ours]
    hp = dict(lr=1e-2, betas=(0.8, 0.95), eps=1e-8, weight_decay=0.1)
    opt = AdamW(ours, **hp)
    opt_ref = torch.optim.AdamW(ref, **hp)
    targets = [torch.randn(s, generator=g) for s in shapes]
    for step in range(50):
        for params, o in ((ours, opt), (ref, opt_ref)):
            o.zero_grad()
            loss = sum(((p - t) ** 2 * (1 + step % 3)).sum() for p, t in zip(params, targets))
            loss.backward()
            if step % 7 == 3:  # sometimes a parameter gets no gradient at all
                params[3].grad = None
            o.step()
    for a, b in zip(ours, ref):
        torch.testing.assert_close(a.detach(), b.detach(), **TOL)


def test_adamw_lr_can_change_between_steps():
    p, q = _param(1.0), _param(1.0)
    opt = AdamW([p], lr=0.1, weight_decay=0.0)
    ref = torch.optim.AdamW([q], lr=0.1, weight_decay=0.0)
    for lr in (0.1, 0.05, 0.2):
        opt.lr = lr
        ref.param_groups[0]["lr"] = lr
        p.grad, q.grad = torch.ones(1), torch.ones(1)
        opt.step()
        ref.step()
    torch.testing.assert_close(p.detach(), q.detach(), **TOL)


def test_adamw_state_dict_round_trip():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(3, generator=g).requires_grad_(True)
    b = a.detach().clone().requires_grad_(True)
    grads = [torch.randn(3, generator=g) for _ in range(6)]
    opt_a = AdamW([a], lr=0.05)
    for gr in grads:  # uninterrupted run
        a.grad = gr.clone()
        opt_a.step()
    opt_b = AdamW([b], lr=0.05)
    for gr in grads[:3]:
        b.grad = gr.clone()
        opt_b.step()
    saved = opt_b.state_dict()
    opt_c = AdamW([b], lr=999.0)  # fresh optimizer, wrong lr: load must restore it
    opt_c.load_state_dict(saved)
    assert opt_c.lr == 0.05 and opt_c.state[0]["step"] == 3
    for gr in grads[3:]:
        b.grad = gr.clone()
        opt_c.step()
    assert torch.equal(a.detach(), b.detach())  # bit-identical resume


def test_adamw_state_dict_is_a_copy():
    p = _param(1.0)
    opt = AdamW([p])
    p.grad = torch.ones(1)
    opt.step()
    saved = opt.state_dict()
    opt.step()
    assert saved["state"][0]["step"] == 1
    assert not torch.equal(saved["state"][0]["m"], opt.state[0]["m"])


def test_adamw_load_state_dict_rejects_mismatch():
    saved = AdamW([_param(1.0), _param(2.0)]).state_dict()
    with pytest.raises(ValueError, match="2 parameter states for 1 parameters"):
        AdamW([_param(1.0)]).load_state_dict(saved)
    with pytest.raises(ValueError, match=r"moment shape \(1,\) != parameter shape \(2,\)"):
        AdamW([_param(1.0, 2.0), _param(1.0)]).load_state_dict(saved)


# -- clip_grad_norm_ -----------------------------------------------------------------------
def test_clip_rejects_bad_max_norm():
    with pytest.raises(ValueError, match="max_norm must be > 0, got 0"):
        clip_grad_norm_([_param(1.0)], 0)


def test_clip_by_hand():
    # grads (3, 4): global norm 5; clip to 1 -> (0.6, 0.8)
    a, b = _param(0.0), _param(0.0)
    a.grad, b.grad = torch.tensor([3.0]), torch.tensor([4.0])
    assert clip_grad_norm_([a, b], 1.0) == pytest.approx(5.0)
    torch.testing.assert_close(torch.cat([a.grad, b.grad]), torch.tensor([0.6, 0.8]), **TOL)


def test_clip_ignores_none_grads():
    a, b = _param(0.0), _param(0.0)
    a.grad = torch.tensor([2.0])
    assert clip_grad_norm_([a, b], 1.0) == pytest.approx(2.0)
    assert b.grad is None
    assert clip_grad_norm_([_param(1.0)], 1.0) == 0.0  # no grads at all


def test_clip_zero_grads():
    a = _param(0.0, 0.0)
    a.grad = torch.zeros(2)
    assert clip_grad_norm_([a], 1.0) == 0.0
    assert torch.equal(a.grad, torch.zeros(2))


def test_clip_matches_torch():
    g = torch.Generator().manual_seed(2)
    shapes = [(5, 4), (4,), (3, 3)]
    ours = [torch.zeros(s, requires_grad=True) for s in shapes]
    ref = [torch.zeros(s, requires_grad=True) for s in shapes]
    for p, q in zip(ours, ref):
        p.grad = torch.randn(p.shape, generator=g) * 3
        q.grad = p.grad.clone()
    norm = clip_grad_norm_(ours, 1.5)
    norm_ref = torch.nn.utils.clip_grad_norm_(ref, 1.5)
    assert norm == pytest.approx(float(norm_ref), rel=1e-6)
    for p, q in zip(ours, ref):
        torch.testing.assert_close(p.grad, q.grad, **TOL)
    after = math.sqrt(sum(float((p.grad ** 2).sum()) for p in ours))
    assert after == pytest.approx(1.5, rel=1e-5)  # eps = 1e-6 shrinks it by < 1e-6 relative


def test_clip_leaves_small_grads():
    a = _param(0.0, 0.0)
    a.grad = torch.tensor([0.3, 0.4])
    before = a.grad.clone()
    assert clip_grad_norm_([a], 1.0) == pytest.approx(0.5)
    assert torch.equal(a.grad, before)


# -- cosine_with_warmup --------------------------------------------------------------------
def _lr(step, **kw):
    base = dict(warmup_steps=10, max_steps=110, max_lr=1.0, min_lr=0.1)
    base.update(kw)
    return cosine_with_warmup(step, **base)


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError, match="step=-1"):
        _lr(-1)
    with pytest.raises(ValueError, match="warmup_steps=20, max_steps=10"):
        _lr(0, warmup_steps=20, max_steps=10)
    with pytest.raises(ValueError, match="min_lr=2.0, max_lr=1.0"):
        _lr(0, min_lr=2.0)


def test_schedule_warmup_is_linear():
    assert _lr(0) == pytest.approx(0.1)  # step 0 already trains: max_lr·1/10
    assert _lr(4) == pytest.approx(0.5)
    assert _lr(9) == pytest.approx(1.0)  # last warmup step reaches max_lr
    diffs = [_lr(s + 1) - _lr(s) for s in range(9)]
    assert all(d == pytest.approx(0.1) for d in diffs)


def test_schedule_warmup_boundary():
    # step == warmup_steps is the first cosine step, progress 0 -> max_lr
    assert _lr(10) == pytest.approx(1.0)
    assert _lr(11) < 1.0


def test_schedule_cosine_endpoints():
    assert _lr(10) == pytest.approx(1.0)
    assert _lr(60) == pytest.approx(0.1 + 0.5 * 0.9)  # halfway: cos(π/2) = 0
    assert _lr(110) == pytest.approx(0.1)
    lrs = [_lr(s) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))  # monotone decay


def test_schedule_after_max_steps():
    assert _lr(111) == 0.1
    assert _lr(10_000) == 0.1


def test_schedule_without_warmup_or_decay():
    assert cosine_with_warmup(0, warmup_steps=0, max_steps=100, max_lr=2.0) == pytest.approx(2.0)
    # warmup_steps == max_steps: warmup then straight to min_lr
    assert cosine_with_warmup(9, warmup_steps=10, max_steps=10, max_lr=1.0, min_lr=0.0) == pytest.approx(1.0)
    assert cosine_with_warmup(11, warmup_steps=10, max_steps=10, max_lr=1.0, min_lr=0.0) == 0.0
