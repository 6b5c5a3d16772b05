"""A fake accelerator for catching device mistakes on a CPU-only machine.

Inside ``with FakeAccelerator():`` a tensor "on the accelerator" is an ``AccelTensor``: its
data sit on the CPU, but it reports ``device == FAKE_DEVICE`` (``meta``) and the mode checks
every torch call the way CUDA or MPS would:

* an op mixing an accelerator tensor with a CPU tensor of one or more dimensions raises
  ``DeviceMismatch`` (0-dim CPU tensors are scalars and may mix, as on a real GPU; a CPU
  index into an accelerator tensor is allowed, as CUDA allows it);
* a CPU ``torch.Generator`` used with accelerator tensors raises ``DeviceMismatch``;
* a float64 tensor created on the accelerator raises ``Float64OnDevice`` (MPS has no float64);
* ``.numpy()`` of an accelerator tensor raises ``DeviceMismatch``.

``.to(FAKE_DEVICE)`` / ``.to(other.device)`` / factories with ``device=FAKE_DEVICE`` put
tensors on the accelerator; ``.cpu()`` / ``.to("cpu")`` bring them back as plain tensors;
``.item()``, ``.tolist()`` and ``int()`` read values as on a real device.
``AccelTableLM`` is a ``TableLM`` living there: it refuses CPU input ids.
"""

from __future__ import annotations

import torch
from specdec_mocks import TableLM
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_map

FAKE_DEVICE = torch.device("meta")


class DeviceMismatch(RuntimeError):
    """An op would mix devices (or a CPU generator with device tensors) on a real accelerator."""


class Float64OnDevice(RuntimeError):
    """A float64 tensor was created on the (fake) accelerator; MPS has no float64."""


class AccelTensor(torch.Tensor):
    """A CPU tensor marked as living on the fake accelerator (see the module docstring)."""

    __torch_function__ = torch._C._disabled_torch_function_impl


def to_accel(t: torch.Tensor) -> AccelTensor:
    """Put a tensor "on the accelerator" (no copy)."""
    return t.as_subclass(AccelTensor) if not isinstance(t, AccelTensor) else t


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor) if isinstance(t, AccelTensor) else t


def _is_fake(device) -> bool:
    if isinstance(device, (str, torch.device)):
        return torch.device(device).type == FAKE_DEVICE.type
    return False


def _is_cpu(device) -> bool:
    return isinstance(device, (str, torch.device)) and torch.device(device).type == "cpu"


_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__, torch.Tensor.__float__,
                  torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.__len__, torch.Tensor.__repr__,
                  torch.Tensor.__format__, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.size}


class FakeAccelerator(TorchFunctionMode):
    """Run code as if ``AccelTensor`` lived on a GPU/MPS device; see the module docstring.

    Attributes:
        created: (func name, dtype) of every accelerator tensor produced, for reports.
    """

    def __init__(self) -> None:
        super().__init__()
        self.created: list[tuple[str, torch.dtype]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", repr(func))
        if func is torch.Tensor.as_subclass:
            return func(*args, **kwargs)
        flat, _ = tree_flatten((args, kwargs))
        tensors = [t for t in flat if isinstance(t, torch.Tensor)]
        accel = [t for t in tensors if isinstance(t, AccelTensor)]
        if getattr(func, "__self__", None) is torch.Tensor.device:          # the .device property
            return FAKE_DEVICE if accel else func(*args, **kwargs)
        if func is torch.Tensor.numpy and accel:
            raise DeviceMismatch("numpy() of a tensor on the accelerator: call .cpu() first")
        if func is torch.Tensor.cpu:
            return _plain(func(*args, **kwargs))
        if func in _READS or name == "__get__":
            out = func(*args, **kwargs)                       # values, sizes, dtype, shape, ...
            return to_accel(out) if accel and isinstance(out, torch.Tensor) else out
        if func is torch.Tensor.to:
            return self._to(name, args, kwargs)
        if kwargs.get("device") is not None:                  # a factory: torch.zeros(..., device=d)
            on_accel = _is_fake(kwargs["device"])
            if on_accel:
                kwargs["device"] = "cpu"
        else:
            on_accel = bool(accel)
            cpu = [t for t in tensors if not isinstance(t, AccelTensor) and t.dim() > 0]
            if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and isinstance(args[0], AccelTensor):
                # CPU index tensors into an accelerator tensor are fine (CUDA allows them);
                # a CPU value of >= 1 dimension written into it is not.
                value = args[2] if func is torch.Tensor.__setitem__ else None
                cpu = [t for t in cpu if t is value]
            if accel and cpu:
                raise DeviceMismatch(f"{name}: mixes tensors on the accelerator with CPU tensors of shapes "
                                     f"{[tuple(t.shape) for t in cpu]}; move them to one device first")
        gen = kwargs.get("generator")
        if isinstance(gen, torch.Generator) and gen.device.type == "cpu" and on_accel:
            raise DeviceMismatch(f"{name}: a CPU torch.Generator used with tensors on the accelerator")
        out = func(*args, **kwargs)
        return tree_map(lambda t: self._wrap(name, t, on_accel) if isinstance(t, torch.Tensor) else t, out)

    def _to(self, name, args, kwargs):
        """``t.to(device)``, ``t.to(other)``, ``t.to(dtype)``, ``t.to(device=..., dtype=...)``."""
        src, rest = args[0], list(args[1:])
        device = kwargs.pop("device", None)
        if rest and isinstance(rest[0], (str, torch.device)):
            device = rest.pop(0)
        elif rest and isinstance(rest[0], torch.Tensor):
            other = rest.pop(0)
            device = FAKE_DEVICE if isinstance(other, AccelTensor) else other.device
            rest.insert(0, other.dtype)
        on_accel = isinstance(src, AccelTensor) if device is None else _is_fake(device)
        out = _plain(src).to(*rest, **kwargs) if (rest or kwargs) else _plain(src)
        return self._wrap(name, out, on_accel)

    def _wrap(self, name: str, t: torch.Tensor, on_accel: bool) -> torch.Tensor:
        if not on_accel:
            return _plain(t)
        if t.dtype in (torch.float64, torch.complex128):
            raise Float64OnDevice(f"{name} created a {t.dtype} tensor on the accelerator; MPS has no float64 "
                                  f"(compute on the CPU: .cpu() first, then .double())")
        self.created.append((name, t.dtype))
        return to_accel(t)


class AccelTableLM(TableLM):
    """A ``TableLM`` on the fake accelerator: ids must arrive there, logits come back there."""

    def __init__(self, table: torch.Tensor, *, max_seq_len: int = 64) -> None:
        super().__init__(table, max_seq_len=max_seq_len)
        self.device = FAKE_DEVICE

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        if not isinstance(ids, AccelTensor):
            raise DeviceMismatch(f"model on {FAKE_DEVICE} called with ids on the CPU; move them to model.device")
        return to_accel(super().__call__(_plain(ids)))
