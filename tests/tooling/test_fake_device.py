"""The fake accelerator (tests/device_mocks.py) and what it found (issue 22).

Each MPS limit the mock models is shown catching the wrong code and passing the right code;
``pytest --fake-device`` (tests/conftest.py) runs every module's test files under it, with every
model parameter on the fake device (``own_device`` tests, which check placement themselves, skipped).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))      # tests/: device_mocks, specdec_mocks

from device_mocks import (  # noqa: E402
    DeviceMismatch,
    FakeAccelerator,
    Float64OnDevice,
    SilentOnDevice,
    UnsupportedOnDevice,
    device_of,
    fake_device_active,
    to_accel,
)


def test_int64_scans_are_refused_on_the_device():
    # MPS refused int64 cumsum before macOS 13.3 (pytorch/pytorch#96610): scan in int32 or on the CPU.
    match = torch.tensor([True, True, False, True])
    with FakeAccelerator():
        with pytest.raises(UnsupportedOnDevice, match=r"cumprod of a torch\.int64 tensor on the accelerator"):
            to_accel(match).long().cumprod(dim=0)                          # the wrong code
        with pytest.raises(UnsupportedOnDevice, match=r"cumsum of a torch\.int64"):
            torch.cumsum(to_accel(match.long()), 0)
        assert to_accel(match).int().cumprod(dim=0).tolist() == [1, 1, 0, 0]          # int32 on the device
        assert int(torch.cumprod(to_accel(match).cpu().long(), 0).sum()) == 2          # int64 on the CPU


def test_ops_mps_lacks_are_refused_on_the_device():
    # 'aten::isin.Tensor_Tensor_out' / 'aten::index_copy.out' "not currently implemented for the
    # MPS device" (pytorch/pytorch#77764).
    a, b = torch.tensor([1, 2, 3]), torch.tensor([2])
    with FakeAccelerator():
        with pytest.raises(UnsupportedOnDevice, match=r"isin is not implemented for the MPS device"):
            torch.isin(to_accel(a), to_accel(b))
        with pytest.raises(UnsupportedOnDevice, match=r"index_copy"):
            to_accel(torch.zeros(3)).index_copy(0, to_accel(torch.tensor([1])), to_accel(torch.ones(1)))
        assert (to_accel(a).unsqueeze(-1) == to_accel(b)).any(-1).tolist() == [False, True, False]   # the MPS way


def test_fused_causal_attention_in_half_precision_takes_an_explicit_mask_on_the_device(monkeypatch):
    # torch's is_causal=True on MPS in float16/bfloat16 masked once per group of four queries in released
    # versions (pytorch/pytorch#195910, a silent correctness bug): the fake device refuses the call in half
    # precision, module 08's fused path passes an explicit mask there and keeps is_causal where it is trusted.
    from types import SimpleNamespace

    import torch.nn.functional as F

    import g2c.attention.multihead as mh
    from g2c.attention import MultiHeadAttention

    q = torch.randn(1, 2, 8, 4, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    with FakeAccelerator():
        with pytest.raises(SilentOnDevice, match=r"once per group of four queries .*pytorch/pytorch#195910"):
            F.scaled_dot_product_attention(to_accel(q), to_accel(q), to_accel(q), is_causal=True)   # the wrong code
        F.scaled_dot_product_attention(to_accel(q.float()), to_accel(q.float()), to_accel(q.float()), is_causal=True)
    cases = [("2.13.0", torch.float16, "mps", False), ("2.13.0", torch.bfloat16, "mps", False),
             ("2.14.0", torch.float16, "mps", True), ("2.13.0", torch.float32, "mps", True),
             ("2.13.0", torch.float16, "cuda", True), ("2.13.0", torch.float16, "cpu", True),
             ("2.14.0", torch.float16, "meta", False)]                   # meta: the fake device, never trusted
    for version, dtype, device, trusted in cases:
        monkeypatch.setattr(torch, "__version__", torch.torch_version.TorchVersion(version))
        assert mh.fused_causal_trusted(SimpleNamespace(dtype=dtype, device=torch.device(device))) is trusted
    monkeypatch.undo()
    attn = MultiHeadAttention(8, 2, generator=torch.Generator().manual_seed(1)).to(dtype=torch.bfloat16)
    x = torch.randn(2, 8, 8, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    want = attn(x)                                                       # the course kernel, on the CPU
    attn.fused = True
    with FakeAccelerator(params_on_device=True, library_only=(str(Path(mh.__file__).parents[1]),)):
        got = attn(to_accel(x))                                          # refused if is_causal reached the device
    torch.testing.assert_close(got.cpu().float(), want.float(), atol=2e-2, rtol=2e-2)    # bfloat16 round-off


def test_float64_and_mixing_are_still_caught():
    with FakeAccelerator():
        with pytest.raises(Float64OnDevice):
            to_accel(torch.ones(2)).double().cpu()                          # the old tree verifier's order
        assert to_accel(torch.ones(2)).cpu().double().dtype == torch.float64
        with pytest.raises(DeviceMismatch):
            to_accel(torch.ones(2)) + torch.ones(2)


def test_params_on_device_and_library_only_check_the_listed_code():
    # Parameters (leaf tensors with requires_grad) read as on the device; only code under
    # ``library_only`` is checked (here this very file, to show a wrong line being caught).
    w = torch.ones(3, requires_grad=True)
    with FakeAccelerator(params_on_device=True, library_only=(__file__,)):
        assert w.device.type == "meta"
        with pytest.raises(DeviceMismatch):
            w.detach() + torch.ones(3)                                      # CPU tensor meets a device parameter
        assert (w.detach() + torch.ones(3).to(w.device)).cpu().tolist() == [2.0, 2.0, 2.0]
    with FakeAccelerator(params_on_device=True, library_only=("/nowhere",)):
        assert (w.detach() + torch.ones(3)).tolist() == [2.0, 2.0, 2.0]     # not listed: not checked


def test_device_of_puts_a_test_input_beside_the_parameters():
    # Outside ``library_only`` a test's own .device reads say CPU; device_of says where the checked code sees
    # a module or tensor (checked code here: this file, as above).
    lin = torch.nn.Linear(3, 2)
    assert device_of(lin) == torch.device("cpu") and not fake_device_active()           # no mode: the real device
    with FakeAccelerator(params_on_device=True, library_only=("/nowhere",)):
        assert fake_device_active() and lin.weight.device == torch.device("cpu")      # the test's own read
        assert device_of(lin) == device_of(lin.weight) == device_of(to_accel(torch.ones(1))) == torch.device("meta")
        assert device_of(torch.ones(1)) == device_of(torch.nn.GELU()) == torch.device("cpu")
    with FakeAccelerator(params_on_device=True, library_only=(__file__,)):
        with pytest.raises(DeviceMismatch):
            torch.ones(1, 3) @ lin.weight.T                             # a CPU input meets device weights
        assert (torch.ones(1, 3).to(device_of(lin)) @ lin.weight.T).shape == (1, 2)
    assert not fake_device_active()


def test_a_saved_device_tensor_loads_weights_only(tmp_path):
    # torch.save of a tensor on the fake device writes a plain tensor, as a real device tensor loads
    # with map_location="cpu"; a pickled tensor subclass would be refused by weights_only=True.
    with FakeAccelerator():
        torch.save({"w": to_accel(torch.arange(3.0))}, tmp_path / "ckpt.pt")
    got = torch.load(tmp_path / "ckpt.pt", map_location="cpu", weights_only=True)["w"]
    assert type(got) is torch.Tensor and got.tolist() == [0.0, 1.0, 2.0]


def test_tree_speculative_verify_runs_on_the_device():
    # It converted with .double().cpu(): float64 on the device, which MPS lacks. Now .cpu().double().
    from g2c.specdec.trees import DraftTree, tree_speculative_verify

    p = torch.softmax(torch.randn(3, 5, generator=torch.Generator().manual_seed(0)), -1)
    q = torch.softmax(torch.randn(2, 5, generator=torch.Generator().manual_seed(1)), -1)
    expected = tree_speculative_verify(DraftTree(torch.tensor([1, 2]), torch.tensor([-1, 0]), proposal_probs=q), p,
                                       generator=torch.Generator().manual_seed(3))
    with FakeAccelerator():
        tree = DraftTree(to_accel(torch.tensor([1, 2])), to_accel(torch.tensor([-1, 0])), proposal_probs=to_accel(q))
        got = tree_speculative_verify(tree, to_accel(p), generator=torch.Generator().manual_seed(3))
    assert got == expected


def test_greedy_verify_takes_a_cpu_draft_with_device_rows():
    # The cached, MTP and recurrent loops hand greedy_verify a CPU draft and the target's rows on
    # its device; the provided first step moves the draft there (it used to mix devices).
    from g2c.specdec import greedy_verify

    logits = torch.tensor([[0.0, 5.0, 0.0], [5.0, 0.0, 0.0], [0.0, 0.0, 5.0]])
    with FakeAccelerator():
        assert greedy_verify(torch.tensor([1, 0]), to_accel(logits)) == (2, 2)


def test_the_lesson_lists_every_rule_the_fake_device_enforces():
    # issue 30: the lesson taught float64 and mixed devices but not the int64-scan rule a test enforces.
    import device_mocks

    lesson = (Path(__file__).resolve().parents[2] / "docs" / "beyond" / "specdec.md").read_text(encoding="utf-8")
    rules = lesson[lesson.index("## The device rules"):lesson.index("## Pitfalls")]
    for error in ("DeviceMismatch", "Float64OnDevice", "UnsupportedOnDevice", "SilentOnDevice"):
        assert f"`{error}`" in rules
    for func in device_mocks.NOT_ON_MPS | device_mocks._SCANS:
        assert func.__name__.rstrip("_") in rules, f"{func.__name__} is refused by the fake device, not in the lesson"
    for dtype in device_mocks._SCAN_DTYPES:
        assert str(dtype).removeprefix("torch.") in rules
    for word in ("float64", "complex128", "torch.Generator", ".numpy()", "0-dim", "x[i] = cpu_row", "is_causal=True",
                 "bfloat16"):
        assert word in rules
