"""A fake accelerator for catching device mistakes on a CPU-only machine.

Inside ``with FakeAccelerator():`` a tensor "on the accelerator" is an ``AccelTensor``: its
data sit on the CPU, but it reports ``device == FAKE_DEVICE`` (``meta``) and the mode checks
every torch call the way CUDA or MPS would:

* an op mixing an accelerator tensor with a CPU tensor of one or more dimensions raises
  ``DeviceMismatch`` (0-dim CPU tensors are scalars and may mix, as on a real GPU; a CPU
  index into an accelerator tensor is allowed, as CUDA allows it);
* a CPU ``torch.Generator`` used with accelerator tensors raises ``DeviceMismatch``;
* a float64 tensor created on the accelerator raises ``Float64OnDevice`` (MPS has no float64:
  "Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64",
  pytorch/pytorch#122602, closed as a known limitation);
* ``.numpy()`` of an accelerator tensor raises ``DeviceMismatch``;
* ``cumsum``/``cumprod`` of an int64 (or bool/int8/int16) tensor on the accelerator raises
  ``UnsupportedOnDevice``: MPS refused int64 scans before macOS 13.3 ("MPS does not support
  cumsum op with int64 input", pytorch/pytorch#96610) and gave wrong int8/int16 results
  (pytorch/pytorch#90635); scan in int32 or on the CPU;
* ops that the MPS backend has not implemented in the torch versions the course supports
  (``NOT_ON_MPS``: ``isin``, ``index_copy``; "The operator 'aten::isin.Tensor_Tensor_out' is
  not currently implemented for the MPS device", pytorch/pytorch#77764) raise
  ``UnsupportedOnDevice``;
* ``scaled_dot_product_attention(..., is_causal=True)`` in float16/bfloat16 raises
  ``SilentOnDevice``: MPS in released torch applied that causal mask once per group of four
  queries, with no error (pytorch/pytorch#195910, "correctness (silent)"); code that runs there
  passes an explicit mask (``g2c.attention.multihead.fused_causal_trusted``).

Two switches serve ``pytest --fake-device`` (tests/conftest.py), which runs whole test files
under the mode: ``params_on_device=True`` treats every parameter (a leaf tensor with
``requires_grad``) as living on the accelerator, so a model built on the CPU behaves as if
``model.to("mps")`` had run (its ``device`` reads ``FAKE_DEVICE``); ``library_only=(paths)``
applies the checks only to torch calls made from files under those paths (the course's code),
and lets the test's own assertions compare results freely (everything reads as CPU there).

``device_of(module_or_tensor)`` says where the course's code sees a module or tensor (the test's
own ``.device`` reads say CPU); ``.to(device_of(layer))`` puts a test's input beside the layer.
``.to(FAKE_DEVICE)`` / ``.to(other.device)`` / factories with ``device=FAKE_DEVICE`` put
tensors on the accelerator; ``.cpu()`` / ``.to("cpu")`` bring them back as plain tensors;
``.item()``, ``.tolist()`` and ``int()`` read values as on a real device.
``AccelTableLM`` is a ``TableLM`` living there: it refuses CPU input ids.
"""

from __future__ import annotations

import os
import sys

import torch
from specdec_mocks import TableLM
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

FAKE_DEVICE = torch.device("meta")


class DeviceMismatch(RuntimeError):
    """An op would mix devices (or a CPU generator with device tensors) on a real accelerator."""


class Float64OnDevice(RuntimeError):
    """A float64 tensor was created on the (fake) accelerator; MPS has no float64."""


class UnsupportedOnDevice(RuntimeError):
    """An op or dtype the MPS backend does not support (an int64 scan, an unimplemented op)."""


class SilentOnDevice(RuntimeError):
    """A call that MPS answers without an error but wrongly (a known silent correctness bug of released torch)."""


NOT_ON_MPS = {torch.isin, torch.Tensor.index_copy, torch.Tensor.index_copy_, torch.index_copy}
_SCANS = {torch.cumsum, torch.cumprod, torch.Tensor.cumsum, torch.Tensor.cumprod, torch.Tensor.cumsum_,
          torch.Tensor.cumprod_}
_SCAN_DTYPES = (torch.int64, torch.int16, torch.int8, torch.uint8, torch.bool)
_TORCH_DIR = os.path.dirname(torch.__file__)
_ACTIVE: list[FakeAccelerator] = []                   # the modes entered and not yet left (innermost last)


class AccelTensor(torch.Tensor):
    """A CPU tensor marked as living on the fake accelerator (see the module docstring)."""

    __torch_function__ = torch._C._disabled_torch_function_impl


def to_accel(t: torch.Tensor) -> AccelTensor:
    """Put a tensor "on the accelerator" (no copy)."""
    return t.as_subclass(AccelTensor) if not isinstance(t, AccelTensor) else t


def _plain(t: torch.Tensor) -> torch.Tensor:
    return t.as_subclass(torch.Tensor) if isinstance(t, AccelTensor) else t


def _tensors(items) -> list[torch.Tensor]:
    """The tensors among ``items``, looking into lists, tuples and dicts (a fast tree_flatten)."""
    found = []
    for x in items:
        if isinstance(x, torch.Tensor):
            found.append(x)
        elif isinstance(x, (list, tuple)):
            found += _tensors(x)
        elif isinstance(x, dict):
            found += _tensors(tuple(x.values()))
    return found


def _plain_all(out):
    """``out`` with every AccelTensor made plain (the common case returns it untouched)."""
    if isinstance(out, AccelTensor):
        return _plain(out)
    if isinstance(out, (list, tuple)) and any(isinstance(t, AccelTensor) for t in out):
        items = [_plain(t) if isinstance(t, AccelTensor) else t for t in out]
        return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
    return out


def _is_fake(device) -> bool:
    if isinstance(device, (str, torch.device)):
        return torch.device(device).type == FAKE_DEVICE.type
    return False


def _is_cpu(device) -> bool:
    return isinstance(device, (str, torch.device)) and torch.device(device).type == "cpu"


_READS = {torch.Tensor.item, torch.Tensor.tolist, torch.Tensor.__int__, torch.Tensor.__float__,
                  torch.Tensor.__bool__, torch.Tensor.__index__, torch.Tensor.__len__, torch.Tensor.__repr__,
                  torch.Tensor.__format__, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.size}


def device_of(x) -> torch.device:
    """Where ``x`` lives as the course's code sees it: ``FAKE_DEVICE`` when an active ``FakeAccelerator``
    holds it on the accelerator, else its real device.

    ``x`` is a tensor or a module (a ``g2c.nn.Module`` or a ``torch.nn.Module``: its first parameter
    decides; CPU without parameters). Tests put their inputs beside a layer's parameters with
    ``x.to(device_of(layer))``: a no-op on a plain CPU run, a move to the fake accelerator under
    ``pytest --fake-device`` (where the test's own ``.device`` reads would say CPU).
    """
    if not isinstance(x, torch.Tensor):
        params = list(x.parameters())
        if not params:
            return torch.device("cpu")
        x = params[0]
    if any(mode._on_device(x) for mode in _ACTIVE):
        return FAKE_DEVICE
    return _plain(x).device


def fake_device_active() -> bool:
    """Whether a ``FakeAccelerator(params_on_device=True)`` is on (``pytest --fake-device``)."""
    return any(mode.params_on_device for mode in _ACTIVE)


class FakeAccelerator(TorchFunctionMode):
    """Run code as if ``AccelTensor`` lived on a GPU/MPS device; see the module docstring.

    Attributes:
        created: (func name, dtype) of every accelerator tensor produced, for reports.
    """

    def __init__(self, *, params_on_device: bool = False, library_only: tuple[str, ...] | None = None) -> None:
        super().__init__()
        self.created: list[tuple[str, torch.dtype]] = []
        self.params_on_device = params_on_device
        self.library_only = tuple(os.path.abspath(p) for p in library_only) if library_only else None
        self._verdicts: dict = {}

    def __enter__(self):
        _ACTIVE.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        return super().__exit__(*exc)

    def _on_device(self, t) -> bool:
        return isinstance(t, AccelTensor) or (self.params_on_device and isinstance(t, torch.Tensor)
                                               and t.requires_grad and t.is_leaf)

    def _from_library(self) -> bool:
        """Whether the torch call comes from the checked code: the nearest frame outside torch,
        this file, the standard library and site-packages decides (cached per code object)."""
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            verdict = self._verdicts.get(code)
            if verdict is None:
                path = code.co_filename
                if path.startswith(_TORCH_DIR) or path == __file__ or path.startswith("<") \
                        or "site-packages" in path or path.startswith(sys.base_prefix):
                    verdict = "skip"
                else:
                    verdict = "library" if path.startswith(self.library_only) else "test"
                self._verdicts[code] = verdict
            if verdict != "skip":
                return verdict == "library"
            frame = frame.f_back
        return False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", repr(func))
        if func is torch.Tensor.as_subclass:
            return func(*args, **kwargs)
        if func is torch.Tensor.__reduce_ex__:
            # torch.save of a device tensor: pickled as a plain tensor (a weights-only torch.load
            # refuses tensor subclasses; a real device tensor loads with map_location="cpu")
            return _plain(args[0]).__reduce_ex__(*args[1:], **kwargs)
        tensors = _tensors(args) + _tensors(tuple(kwargs.values()))
        accel = [t for t in tensors if self._on_device(t)]
        if not accel and func is not torch.Tensor.to and not _is_fake(kwargs.get("device")):
            return _plain_all(func(*args, **kwargs))          # nothing on the accelerator: a CPU op
        # Outside the checked code (the test's own assertions) nothing raises; tensors keep their device.
        strict = self.library_only is None or self._from_library()
        if getattr(func, "__self__", None) is torch.Tensor.device:          # the .device property
            # the test's own code (torch.testing.assert_close) reads the data's real device: a meta
            # device would make assert_close skip comparing the values
            return FAKE_DEVICE if accel and strict else func(*args, **kwargs)
        if func is torch.Tensor.numpy and accel:
            if strict:
                raise DeviceMismatch("numpy() of a tensor on the accelerator: call .cpu() first")
            return _plain(args[0]).numpy(*args[1:], **kwargs)
        if accel and strict and func in NOT_ON_MPS:
            raise UnsupportedOnDevice(f"{name} is not implemented for the MPS device (pytorch/pytorch#77764); "
                                      "compute it on the CPU or with other ops")
        if accel and strict and func is torch.nn.functional.scaled_dot_product_attention and kwargs.get("is_causal") \
                and any(t.dtype in (torch.float16, torch.bfloat16) for t in accel):
            raise SilentOnDevice("scaled_dot_product_attention(is_causal=True) in float16/bfloat16 on MPS applied the "
                                 "causal mask once per group of four queries in released torch "
                                 "(pytorch/pytorch#195910, no error: future keys leak); pass an explicit causal "
                                 "attn_mask there")
        if accel and strict and func in _SCANS:
            dtype = kwargs.get("dtype") or args[0].dtype
            if dtype in _SCAN_DTYPES:
                raise UnsupportedOnDevice(f"{name} of a {dtype} tensor on the accelerator: MPS scans int64 only "
                                          "from macOS 13.3 (pytorch/pytorch#96610); use int32 (.int()) or the CPU")
        if func is torch.Tensor.cpu:
            return _plain(func(*args, **kwargs))
        if func in _READS or name == "__get__":
            out = func(*args, **kwargs)                       # values, sizes, dtype, shape, ...
            return to_accel(out) if accel and isinstance(out, torch.Tensor) else out
        if func is torch.Tensor.to:
            return self._to(name, args, kwargs, strict)
        if kwargs.get("device") is not None:                  # a factory: torch.zeros(..., device=d)
            on_accel = _is_fake(kwargs["device"])
            if on_accel:
                kwargs["device"] = "cpu"
        else:
            on_accel = bool(accel)
            cpu = [t for t in tensors if not self._on_device(t) and t.dim() > 0]
            if func is torch.Tensor.copy_:
                cpu = []                                      # copy_ crosses devices in torch (a transfer)
            if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and self._on_device(args[0]):
                # CPU index tensors into an accelerator tensor are fine (CUDA allows them);
                # a CPU value of >= 1 dimension written into it is not.
                value = args[2] if func is torch.Tensor.__setitem__ else None
                cpu = [t for t in cpu if t is value]
            if accel and cpu and strict:
                raise DeviceMismatch(f"{name}: mixes tensors on the accelerator with CPU tensors of shapes "
                                     f"{[tuple(t.shape) for t in cpu]}; move them to one device first")
        gen = kwargs.get("generator")
        if isinstance(gen, torch.Generator) and gen.device.type == "cpu" and on_accel and strict:
            raise DeviceMismatch(f"{name}: a CPU torch.Generator used with tensors on the accelerator")
        out = func(*args, **kwargs)
        if not on_accel:
            return _plain_all(out)
        return tree_map(lambda t: self._wrap(name, t, on_accel, strict) if isinstance(t, torch.Tensor) else t, out)

    def _to(self, name, args, kwargs, strict: bool = True):
        """``t.to(device)``, ``t.to(other)``, ``t.to(dtype)``, ``t.to(device=..., dtype=...)``."""
        src, rest = args[0], list(args[1:])
        device = kwargs.pop("device", None)
        if rest and isinstance(rest[0], (str, torch.device)):
            device = rest.pop(0)
        elif rest and isinstance(rest[0], torch.Tensor):
            other = rest.pop(0)
            device = FAKE_DEVICE if isinstance(other, AccelTensor) else other.device
            rest.insert(0, other.dtype)
        on_accel = self._on_device(src) if device is None else _is_fake(device)
        if on_accel and self._on_device(src) and not rest and not kwargs:
            return src                                        # already there: .to is a no-op, as in torch
        out = _plain(src).to(*rest, **kwargs) if (rest or kwargs) else _plain(src)
        return self._wrap(name, out, on_accel, strict)

    def _wrap(self, name: str, t: torch.Tensor, on_accel: bool, strict: bool = True) -> torch.Tensor:
        if not on_accel:
            return _plain(t)
        if t.dtype in (torch.float64, torch.complex128) and strict:
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
