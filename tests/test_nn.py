"""Module 03: Module, Linear, Embedding, LayerNorm, GELU, Dropout, resolve_device.

Oracles: hand-computed values where small, then torch's own layers (``F.linear``,
``F.embedding``, ``nn.LayerNorm``, ``nn.GELU``), then invariants.
Tolerances: float32 forward passes that do the same arithmetic in a different order agree
to a few ulp of values O(1); we use atol=rtol=1e-5 (about 100 ulp at 1.0), and 1e-4 for
LayerNorm gradients, which go through a rsqrt and sums over D.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from g2c.nn import GELU, Dropout, Embedding, LayerNorm, Linear, Module, resolve_device, time_call

TOL = dict(atol=1e-5, rtol=1e-5)


# -- Module (provided code) ----------------------------------------------------------------
class _Leaf(Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.ones(2, 3, requires_grad=True)
        self.buf = torch.zeros(4)  # not trainable: not a parameter

    def forward(self, x):
        return x * 2


class _Tree(Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = _Leaf()
        self.blocks = [_Leaf(), _Leaf()]
        self.blocks[1].w = self.a.w  # tied: one tensor, two owners
        self.scale = torch.tensor(3.0, requires_grad=True)


def test_module_call_runs_forward():
    assert torch.equal(_Leaf()(torch.ones(2)), torch.full((2,), 2.0))


def test_module_forward_missing_raises():
    with pytest.raises(NotImplementedError, match="does not define forward"):
        Module()(1)


def test_module_parameters_is_explicit_list():
    tree = _Tree()
    params = tree.parameters()
    assert isinstance(params, list)
    assert all(p.requires_grad for p in params)


def test_module_named_parameters_dotted_names_in_order():
    names = [n for n, _ in _Tree().named_parameters()]
    assert names == ["scale", "a.w", "blocks.0.w"]


def test_module_tied_tensor_listed_once():
    tree = _Tree()
    ids = [id(p) for p in tree.parameters()]
    assert len(ids) == len(set(ids)) == 3
    assert tree.num_parameters() == 1 + 6 + 6


def test_module_train_eval_propagate():
    tree = _Tree()
    assert tree.eval() is tree
    assert all(not m.training for _, m in tree.named_modules())
    tree.train()
    assert all(m.training for _, m in tree.named_modules())


@pytest.mark.own_device  # asserts the tree lands on the CPU: --fake-device would move its parameters
def test_module_to_dtype_keeps_leaves_and_ties():
    tree = _Tree().to("cpu", dtype=torch.float64)
    assert tree.a.w.dtype == torch.float64 and tree.a.w.is_leaf and tree.a.w.requires_grad
    assert tree.blocks[1].w is tree.a.w
    assert tree.a.buf.dtype == torch.float64
    assert tree.device == torch.device("cpu")


def test_module_zero_grad_sets_none():
    tree = _Tree()
    (tree.scale * tree.a.w.sum()).backward()
    tree.zero_grad()
    assert all(p.grad is None for p in tree.parameters())


def test_module_state_dict_round_trip():
    src, dst = _Tree(), _Tree()
    with torch.no_grad():
        src.a.w.normal_()
        src.scale.fill_(-1.5)
    state = src.state_dict()
    assert set(state) == {"scale", "a.w", "blocks.0.w"}
    assert not any(t.requires_grad for t in state.values())
    dst.load_state_dict(state)
    for (n1, p1), (n2, p2) in zip(src.named_parameters(), dst.named_parameters()):
        assert n1 == n2 and torch.equal(p1, p2)
    # state_dict holds copies: changing the model later does not change it
    with torch.no_grad():
        src.scale.fill_(0.0)
    assert float(state["scale"]) == -1.5


def test_module_load_state_dict_missing_key():
    tree = _Tree()
    state = tree.state_dict()
    del state["a.w"]
    with pytest.raises(KeyError, match=r"missing keys \['a.w'\]"):
        tree.load_state_dict(state)


def test_module_load_state_dict_unexpected_key():
    tree = _Tree()
    state = tree.state_dict()
    state["ghost"] = torch.zeros(1)
    with pytest.raises(KeyError, match=r"unexpected keys \['ghost'\]"):
        tree.load_state_dict(state)


def test_module_load_state_dict_wrong_shape():
    tree = _Tree()
    state = tree.state_dict()
    state["a.w"] = torch.zeros(3, 2)
    with pytest.raises(ValueError, match=r"'a.w' has shape \(3, 2\)"):
        tree.load_state_dict(state)


# -- Linear --------------------------------------------------------------------------------
def test_linear_by_hand():
    lin = Linear(2, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor([[2.0, -1.0]]))
        lin.bias.fill_(0.5)
    assert torch.equal(lin(torch.tensor([[3.0, 4.0]]).to(lin.device)).cpu(), torch.tensor([[2.5]]))


def test_linear_matches_torch():
    g = torch.Generator().manual_seed(0)
    lin = Linear(5, 3, generator=g)
    with torch.no_grad():
        lin.bias.normal_(generator=g)
    x = torch.randn(2, 4, 5, generator=g, requires_grad=True)
    y = lin(x)
    assert y.shape == (2, 4, 3)
    ref = F.linear(x, lin.weight, lin.bias)
    torch.testing.assert_close(y, ref, **TOL)
    # gradients flow to input, weight and bias like torch's
    gy = torch.randn(2, 4, 3, generator=g)
    got = torch.autograd.grad(y, (x, lin.weight, lin.bias), gy)
    want = torch.autograd.grad(ref, (x, lin.weight, lin.bias), gy)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)


def test_linear_without_bias():
    g = torch.Generator().manual_seed(1)
    lin = Linear(4, 2, bias=False, generator=g)
    assert lin.bias is None
    assert [n for n, _ in lin.named_parameters()] == ["weight"]
    x = torch.randn(3, 4, generator=g).to(lin.device)
    torch.testing.assert_close(lin(x).cpu(), F.linear(x, lin.weight).cpu(), **TOL)


def test_linear_init_is_seeded():
    a = Linear(8, 8, generator=torch.Generator().manual_seed(3))
    b = Linear(8, 8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a.weight, b.weight)
    assert torch.equal(a.bias, torch.zeros(8))


# -- Embedding -----------------------------------------------------------------------------
def test_embedding_rejects_bad_ids():
    emb = Embedding(5, 2)
    with pytest.raises(TypeError, match="integer ids"):
        emb(torch.tensor([0.0, 1.0]))
    with pytest.raises(IndexError, match=r"\[0, 5\)"):
        emb(torch.tensor([0, 5]))
    with pytest.raises(IndexError, match=r"\[0, 5\)"):
        emb(torch.tensor([-1]))


def test_embedding_matches_torch():
    g = torch.Generator().manual_seed(2)
    emb = Embedding(7, 3, generator=g)
    ids = torch.tensor([[0, 6, 2], [2, 2, 1]])
    out = emb(ids)
    assert out.shape == (2, 3, 3)
    ref_w = emb.weight.detach().clone().requires_grad_(True)
    ref = F.embedding(ids, ref_w)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)  # a lookup is exact
    gy = torch.randn(2, 3, 3, generator=g)
    out.backward(gy)
    ref.backward(gy)
    torch.testing.assert_close(emb.weight.grad, ref_w.grad, **TOL)
    # rows never looked up get exactly zero gradient; row 2 (used 3 times) accumulates
    assert torch.equal(emb.weight.grad[[3, 4, 5]], torch.zeros(3, 3))
    torch.testing.assert_close(emb.weight.grad[2], gy[0, 2] + gy[1, 0] + gy[1, 1], **TOL)


def test_embedding_accepts_empty_ids():
    assert Embedding(3, 4)(torch.zeros(0, dtype=torch.long)).shape == (0, 4)


# -- LayerNorm -----------------------------------------------------------------------------
def test_layernorm_uses_biased_variance():
    # x = [1, 3]: mean 2, biased var 1 (unbiased would be 2) -> y = [-1, 1] / sqrt(1 + eps)
    ln = LayerNorm(2, eps=0.0)
    torch.testing.assert_close(ln(torch.tensor([[1.0, 3.0]]).to(ln.device)).cpu(), torch.tensor([[-1.0, 1.0]]), **TOL)


def test_layernorm_eps_inside_sqrt():
    # x = [0, 0]: var 0, so the output is exactly 0 (no division by zero) with eps > 0
    ln = LayerNorm(2, eps=1e-5)
    assert torch.equal(ln(torch.zeros(1, 2).to(ln.device)).cpu(), torch.zeros(1, 2))
    # x = [1, 3], eps = 3: (x - 2) / sqrt(1 + 3) = [-0.5, 0.5]
    ln3 = LayerNorm(2, eps=3.0)
    torch.testing.assert_close(ln3(torch.tensor([1.0, 3.0]).to(ln3.device)).cpu(), torch.tensor([-0.5, 0.5]), **TOL)


def test_layernorm_matches_torch():
    g = torch.Generator().manual_seed(4)
    D = 8
    ln = LayerNorm(D)
    ref = torch.nn.LayerNorm(D, eps=1e-5)
    with torch.no_grad():
        ln.weight.copy_(torch.randn(D, generator=g))
        ln.bias.copy_(torch.randn(D, generator=g))
        ref.weight.copy_(ln.weight)
        ref.bias.copy_(ln.bias)
    x = (torch.randn(2, 3, D, generator=g) * 5 + 2).requires_grad_(True)
    y, y_ref = ln(x), ref(x)
    torch.testing.assert_close(y, y_ref, **TOL)
    gy = torch.randn(2, 3, D, generator=g)
    got = torch.autograd.grad(y, (x, ln.weight, ln.bias), gy)
    want = torch.autograd.grad(y_ref, (x, ref.weight, ref.bias), gy)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)


# -- GELU ----------------------------------------------------------------------------------
def test_gelu_by_hand():
    # GELU(0) = 0; GELU(x) -> x for large x; GELU(-x) -> 0 for large x
    y = GELU()(torch.tensor([0.0, 10.0, -10.0]))
    torch.testing.assert_close(y, torch.tensor([0.0, 10.0, 0.0]), **TOL)


def test_gelu_matches_torch():
    x = torch.linspace(-6, 6, 101).requires_grad_(True)
    y, ref = GELU()(x), torch.nn.GELU()(x)  # nn.GELU default is the exact erf form
    torch.testing.assert_close(y, ref, **TOL)
    torch.testing.assert_close(torch.autograd.grad(y.sum(), x)[0], torch.autograd.grad(ref.sum(), x)[0], **TOL)
    # not the tanh approximation: they differ by > 1e-4 somewhere in [-6, 6]
    tanh = torch.nn.GELU(approximate="tanh")(x)
    assert (y - tanh).abs().max() > 1e-4


# -- Dropout -------------------------------------------------------------------------------
def test_dropout_rejects_bad_p():
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Dropout(1.0)
    with pytest.raises(ValueError, match=r"\[0, 1\)"):
        Dropout(-0.1)


def test_dropout_eval_is_identity():
    x = torch.randn(4, 5)
    drop = Dropout(0.5).eval()
    assert drop(x) is x
    assert Dropout(0.0)(x) is x  # p == 0 is the identity in training too


def test_dropout_with_a_cpu_generator_on_a_device():
    # A CPU generator cannot draw on CUDA/MPS: the mask is drawn on the generator's device and
    # moved, so the same seed gives the same mask everywhere (fake accelerator: tests/device_mocks.py).
    from device_mocks import FakeAccelerator, to_accel

    x = torch.ones(4, 8)
    expected = Dropout(0.5, generator=torch.Generator().manual_seed(0))(x)
    with FakeAccelerator():
        got = Dropout(0.5, generator=torch.Generator().manual_seed(0))(to_accel(x)).cpu()
    assert torch.equal(got, expected)


def test_dropout_keeps_expectation():
    p = 0.25
    drop = Dropout(p, generator=torch.Generator().manual_seed(0))
    n = 200_000
    y = drop(torch.ones(n))
    # survivors are scaled to exactly 1/(1-p); the rest are 0
    kept = y[y != 0]
    torch.testing.assert_close(kept, torch.full_like(kept, 1.0 / (1.0 - p)), **TOL)
    # mean of n Bernoulli(1-p) * 1/(1-p): std = sqrt(p/(1-p)/n) ~ 1.3e-3; allow 5 std
    assert abs(float(y.mean()) - 1.0) < 5 * (p / (1 - p) / n) ** 0.5
    # the dropped fraction is p, same 5-std rule: std = sqrt(p(1-p)/n) ~ 9.7e-4
    assert abs(float((y == 0).float().mean()) - p) < 5 * (p * (1 - p) / n) ** 0.5


def test_dropout_is_seeded():
    x = torch.ones(1000)
    a = Dropout(0.5, generator=torch.Generator().manual_seed(7))(x)
    b = Dropout(0.5, generator=torch.Generator().manual_seed(7))(x)
    assert torch.equal(a, b)


# -- resolve_device ------------------------------------------------------------------------
def test_resolve_device_auto_on_cpu_machine(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device(torch.device("cpu")) == torch.device("cpu")


def test_resolve_device_auto_prefers_cuda_then_mps(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("mps")


def test_resolve_device_rejects_unavailable(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA is not available.*'auto' or 'cpu'"):
        resolve_device("cuda")
    with pytest.raises(RuntimeError, match="MPS is not available"):
        resolve_device("mps")


def test_resolve_device_rejects_unknown_name():
    with pytest.raises(ValueError, match="unknown device 'gpu0'"):
        resolve_device("gpu0")


# -- time_call (provided) --------------------------------------------------------------------

def test_time_call_warms_up_synchronises_and_reports_the_median_and_threads(monkeypatch):
    import g2c.nn.timing as timing

    events = []
    clock = iter([0.0, 3.0, 10.0, 11.0, 20.0, 25.0])             # measured calls take 3, 1 and 5 s
    cpu_clock = iter([0.0, 0.5, 1.0, 1.25, 2.0, 4.0])            # and 0.5, 0.25 and 2 s of CPU
    monkeypatch.setattr(timing.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(timing.time, "process_time", lambda: next(cpu_clock))
    monkeypatch.setattr(timing, "synchronize", lambda device: events.append(("sync", str(device))))

    def fn():
        events.append("call")
        return len(events)

    result = time_call(fn, device="cpu", warmup=2, repeats=3)
    assert result.median_s == 3.0 and result.times_s == (3.0, 1.0, 5.0)
    assert result.cpu_times_s == (0.5, 0.25, 2.0) and result.median_cpu_s == 0.5
    assert result.warmup == 2 and result.repeats == 3
    assert result.num_threads == torch.get_num_threads() and result.device == "cpu"
    assert events[:2] == ["call", "call"]                        # warm-up, not timed
    # every measured call sits between two synchronisations
    measured = events[2:]
    assert measured.count("call") == 3
    for i, event in enumerate(measured):
        if event == "call":
            assert measured[i - 1] == ("sync", "cpu") and measured[i + 1] == ("sync", "cpu")
    assert result.result == len(events) - 1
    assert f"{torch.get_num_threads()} threads" in result.describe()


@pytest.mark.parametrize("kwargs, match", [({"repeats": 0}, "repeats must be an int >= 1"),
                                           ({"warmup": -1}, "warmup must be an int >= 0")])
def test_time_call_rejects_bad_counts(kwargs, match):
    with pytest.raises(ValueError, match=match):
        time_call(lambda: None, **kwargs)


def test_eval_mode_restores_each_mode_even_on_an_exception():
    from g2c.nn import eval_mode

    class Crash(Exception):
        pass

    a, b = Linear(2, 2), Linear(2, 2).eval()
    with pytest.raises(Crash):
        with eval_mode(a, b, object()):                                     # objects without modes are skipped
            assert not a.training and not b.training
            raise Crash
    assert a.training and not b.training
