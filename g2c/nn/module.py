"""Module 03: the course's own ``Module`` base class.

A ``Module`` owns parameters (``torch.Tensor`` with ``requires_grad=True``) and child
modules, discovered from its attributes. It is deliberately small: ``parameters()``
returns an explicit list, so an optimizer sees exactly what you see.

Shape letters used across the course: B batch, T time, D width, H heads, V vocabulary.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class Module:
    """Base class of every course layer and model.

    Subclasses assign parameters (tensors with ``requires_grad=True``), child
    ``Module`` objects, or lists of modules as attributes, and implement ``forward``.

    Attributes:
        training: True in training mode (dropout active), False after ``eval()``.
    """

    def __init__(self) -> None:
        self.training = True

    # -- calling -------------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        """Compute the module's output. Subclasses override this."""
        raise NotImplementedError(f"{type(self).__name__} does not define forward()")

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    # -- traversal -----------------------------------------------------------------------
    def _children(self) -> Iterator[tuple[str, "Module"]]:
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif isinstance(value, (list, tuple)):
                for i, item in enumerate(value):
                    if isinstance(item, Module):
                        yield f"{name}.{i}", item

    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        """Yield ``(dotted name, module)`` for this module and every descendant."""
        yield prefix, self
        for name, child in self._children():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self) -> list[tuple[str, torch.Tensor]]:
        """Every trainable tensor with its dotted name, in a fixed order, without duplicates.

        A tensor shared by two modules (a tied embedding) is listed once, under the
        first name it is found at.
        """
        seen: set[int] = set()
        out: list[tuple[str, torch.Tensor]] = []
        for mod_name, mod in self.named_modules():
            for name, value in vars(mod).items():
                if isinstance(value, torch.Tensor) and value.requires_grad and id(value) not in seen:
                    seen.add(id(value))
                    out.append((f"{mod_name}.{name}" if mod_name else name, value))
        return out

    def parameters(self) -> list[torch.Tensor]:
        """The trainable tensors, as an explicit list (same order as ``named_parameters``)."""
        return [p for _, p in self.named_parameters()]

    def num_parameters(self) -> int:
        """Total number of trainable scalars."""
        return sum(p.numel() for p in self.parameters())

    # -- modes ---------------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        """Set training mode on this module and every descendant; returns self."""
        for _, mod in self.named_modules():
            mod.training = mode
        return self

    def eval(self) -> "Module":
        """Evaluation mode (dropout off); returns self."""
        return self.train(False)

    def zero_grad(self) -> None:
        """Drop the gradients of every parameter (sets ``.grad`` to None)."""
        for p in self.parameters():
            p.grad = None

    # -- devices and dtypes --------------------------------------------------------------
    def _apply(self, fn) -> "Module":
        """Replace every tensor attribute ``t`` by ``fn(t)``, keeping tied tensors tied."""
        memo: dict[int, torch.Tensor] = {}
        for _, mod in self.named_modules():
            for name, value in list(vars(mod).items()):
                if isinstance(value, torch.Tensor):
                    if id(value) not in memo:
                        with torch.no_grad():
                            new = fn(value)
                        if value.requires_grad and not new.requires_grad:
                            new = new.detach().requires_grad_(True)
                        memo[id(value)] = new
                    setattr(mod, name, memo[id(value)])
        return self

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> "Module":
        """Move every tensor to ``device`` (and float tensors to ``dtype``); returns self.

        Parameters stay leaf tensors with ``requires_grad=True``; tied tensors stay tied.
        """
        def fn(t: torch.Tensor) -> torch.Tensor:
            if dtype is not None and t.is_floating_point() and t.dtype != dtype:   # same dtype: a plain move
                return t.to(device=device, dtype=dtype)
            return t.to(device=device)
        return self._apply(fn)

    @property
    def device(self) -> torch.device:
        """Device of the first parameter (CPU for a module without parameters)."""
        params = self.parameters()
        return params[0].device if params else torch.device("cpu")

    # -- state dicts ---------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        """Detached copies of every parameter, keyed by dotted name."""
        return {name: p.detach().clone() for name, p in self.named_parameters()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Copy tensors from ``state`` into the parameters, in place.

        Raises:
            KeyError: keys are missing from ``state`` or unexpected; the message lists them.
            ValueError: a tensor's shape differs from the parameter's; the message names it.
        """
        params = dict(self.named_parameters())
        missing = sorted(set(params) - set(state))
        unexpected = sorted(set(state) - set(params))
        if missing or unexpected:
            raise KeyError(f"{type(self).__name__}.load_state_dict: missing keys {missing}, "
                           f"unexpected keys {unexpected}")
        for name, p in params.items():
            src = state[name]
            if tuple(src.shape) != tuple(p.shape):
                raise ValueError(f"{type(self).__name__}.load_state_dict: {name!r} has shape "
                                 f"{tuple(src.shape)} in the state dict but {tuple(p.shape)} in the model")
            with torch.no_grad():
                p.copy_(src.to(dtype=p.dtype, device=p.device))

    def __repr__(self) -> str:
        children = list(self._children())
        if not children:
            return f"{type(self).__name__}()"
        body = "\n".join(f"  ({n}): " + repr(c).replace("\n", "\n  ") for n, c in children)
        return f"{type(self).__name__}(\n{body}\n)"


@contextmanager
def eval_mode(*models) -> Iterator[None]:
    """Put models in eval mode inside a ``with`` block; restore each one's mode in ``finally``.

    Works for any object with ``training`` and ``train(mode)`` (a ``Module``, a torch
    ``nn.Module``); one without them is left alone (mode methods are optional in
    ``g2c.sampling.LanguageModel``). Passing the same model twice is fine: modes are saved before any
    switch and restored in reverse order.

        with eval_mode(target, drafter):
            ...   # both in eval mode; their modes come back even if this raises
    """
    saved = [(m, m.training) for m in models if hasattr(m, "training") and callable(getattr(m, "train", None))]
    try:
        for model, _ in saved:
            model.train(False)
        yield
    finally:
        for model, mode in reversed(saved):
            model.train(mode)


# -- argument checks shared by the building blocks (provided; later modules call them where a value enters) --

def _show(value) -> str:
    """A value for an error message: one line, at most 60 characters."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def check_features(x, size: int, name: str, where: str) -> None:
    """``x`` must be a floating-point tensor (..., size): the input of a layer with a fixed width.

    Raises:
        TypeError: not a tensor ("<where>: <name> must be a float tensor (..., 4), got list").
        ValueError: not floating point, or a last dimension other than ``size`` (the message names both).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a float tensor (..., {size}), got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"{where}: {name} must be floating point, got dtype {x.dtype}")
    if x.dim() == 0 or x.shape[-1] != size:
        raise ValueError(f"{where}: {name} must be (..., {size}), got shape {tuple(x.shape)}")


def check_int(value, name: str, *, minimum: int | None = 1, maximum: int | None = None,
              none_ok: bool = False, where: str | None = None) -> int | None:
    """An integer argument (a size, a count, a step) as a Python int.

    A Python int, a NumPy integer or a 0-d integer tensor passes; a bool (``True`` is not a size), a
    float (even ``2.0``), a string, a list, a tensor of another shape or dtype does not, nor None
    unless ``none_ok``.

    Args:
        value: the argument as given.
        name: its name in the caller's signature (the message names it).
        minimum, maximum: the accepted range, inclusive (None: no bound).
        none_ok: None is accepted (and returned).
        where: the caller (``"TransformerLM"``), put in front of the message.

    Returns:
        The value as a Python int (or None).

    Raises:
        TypeError: not a whole number ("<where>: <name> must be an int >= 1, got float 2.5").
        ValueError: a whole number outside the range ("<where>: <name> must be >= 1, got 0").
    """
    if value is None and none_ok:
        return None
    rule = "an int" + (f" >= {minimum}" if minimum is not None else "") + \
        (f" and <= {maximum}" if maximum is not None else "") + (" or None" if none_ok else "")
    prefix = f"{where}: " if where else ""
    number = None
    if not isinstance(value, bool) and not (isinstance(value, torch.Tensor)
                                            and (value.dim() != 0 or value.dtype == torch.bool)):
        try:
            number = operator.index(value)
        except TypeError:
            number = None
    if number is None:
        raise TypeError(f"{prefix}{name} must be {rule}, got {type(value).__name__} {_show(value)}")
    if (minimum is not None and number < minimum) or (maximum is not None and number > maximum):
        span = " and ".join(([f">= {minimum}"] if minimum is not None else []) +
                            ([f"<= {maximum}"] if maximum is not None else []))
        raise ValueError(f"{prefix}{name} must be {span}, got {number}")
    return number


def check_real(value, name: str, *, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = False, none_ok: bool = False,
               where: str | None = None) -> float | None:
    """A real-number argument (a rate, a probability, an epsilon) as a finite Python float.

    A Python int or float, a NumPy real scalar or a 0-d real tensor passes; a bool, a string, a
    complex number, a list or a tensor with several elements does not, nor None unless ``none_ok``.
    NaN and infinities are refused: no building block has a use for them.

    Args:
        value, name, none_ok, where: as in ``check_int``.
        low, high: the accepted range (None: no bound); ``low_open``/``high_open`` exclude the bound.

    Returns:
        The value as a Python float (or None).

    Raises:
        TypeError: not a real number ("<where>: <name> must be a real number in [0, 1), got str '0.5'").
        ValueError: NaN, infinite or outside the range ("... must be a finite number in [0, 1), got 1.0").
    """
    if value is None and none_ok:
        return None
    lo = "-inf" if low is None else f"{low:g}"
    hi = "inf" if high is None else f"{high:g}"
    span = f"{'(' if low_open or low is None else '['}{lo}, {hi}{')' if high_open or high is None else ']'}"
    prefix = f"{where}: " if where else ""
    number = value
    if isinstance(number, torch.Tensor) and number.dim() == 0 and number.dtype != torch.bool \
            and not number.dtype.is_complex:
        number = number.item()
    elif getattr(number, "ndim", None) == 0 and hasattr(number, "item") and not isinstance(number, torch.Tensor):
        number = number.item()                                                       # a NumPy scalar
    if isinstance(number, bool) or not isinstance(number, (int, float)):
        raise TypeError(f"{prefix}{name} must be a real number in {span}{' or None' if none_ok else ''}, "
                        f"got {type(value).__name__} {_show(value)}")
    number = float(number)
    if not math.isfinite(number) or (low is not None and (number < low or (low_open and number == low))) \
            or (high is not None and (number > high or (high_open and number == high))):
        raise ValueError(f"{prefix}{name} must be a finite number in {span}, got {number!r}")
    return number
