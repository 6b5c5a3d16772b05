"""Module 03b: gradient clipping by global norm.

Source: Pascanu, Mikolov, Bengio, "On the difficulty of training recurrent neural
networks" (ICML 2013), section 3.2.
"""

from __future__ import annotations

import torch

__all__ = ["clip_grad_norm_"]


@torch.no_grad()
def clip_grad_norm_(params, max_norm: float, *, eps: float = 1e-6) -> float:
    """Rescale gradients in place so their global L2 norm is at most ``max_norm``.

    The global norm is sqrt(sum over parameters of ||g||²); parameters with a None
    grad are ignored. If the norm exceeds ``max_norm`` every gradient is multiplied by
    ``max_norm / (norm + eps)``; otherwise nothing changes.

    Args:
        params: iterable of tensors (their ``.grad`` is read and modified).
        max_norm: the threshold, > 0.
        eps: guards the division.

    Returns:
        float: the global norm measured *before* clipping (0.0 if no parameter has a grad).

    Raises:
        ValueError: ``max_norm`` <= 0.

    Steps:
        1. Collect the grads that are not None (``test_clip_ignores_none_grads``).
        2. Global norm over all of them together (``test_clip_matches_torch``).
        3. Scale in place only when the norm is above max_norm (``test_clip_leaves_small_grads``).
    """
    if max_norm <= 0:
        raise ValueError(f"clip_grad_norm_: max_norm must be > 0, got {max_norm}")
    # TODO: implement this (module 03b, see docs/modules/03b-training.md).
    raise NotImplementedError(
        "module 03b: clip_grad_norm_ in g2c/training/clip.py is not implemented yet. "
        "Write it, or run with G2C_APPLY_SOLUTIONS=03b to use the reference solution."
    )
