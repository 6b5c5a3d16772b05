"""Module 03: the course's own ``Module`` base class.

A ``Module`` owns parameters (``torch.Tensor`` with ``requires_grad=True``) and child
modules, discovered from its attributes. It is deliberately small: ``parameters()``
returns an explicit list, so an optimizer sees exactly what you see.

Shape letters used across the course: B batch, T time, D width, H heads, V vocabulary.
"""

from __future__ import annotations

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
