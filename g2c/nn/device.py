"""Module 03: choosing where tensors live."""

from __future__ import annotations

import torch

__all__ = ["resolve_device", "synchronize"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Turn a device request into a concrete ``torch.device``.

    ``"auto"`` picks CUDA if available, then Apple's MPS, then the CPU. An explicit
    request (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"``) is returned as a device if
    it is usable here.

    Args:
        device: ``"auto"``, a device string, or a ``torch.device``.

    Returns:
        torch.device.

    Raises:
        ValueError: the string is not a device name torch understands.
        RuntimeError: the requested device is not available on this machine; the
            message says which device was asked for and suggests ``"auto"`` or ``"cpu"``.

    Steps:
        1. For "auto", test CUDA then MPS availability, fall back to CPU
           (``test_resolve_device_auto_on_cpu_machine``).
        2. Otherwise parse with ``torch.device`` and check availability of CUDA/MPS
           (``test_resolve_device_rejects_unavailable``).
    """
    # TODO: implement this (module 03, see docs/modules/03-nn.md).
    raise NotImplementedError(
        "module 03: resolve_device in g2c/nn/device.py is not implemented yet. "
        "Write it, or run with G2C_APPLY_SOLUTIONS=03 to use the reference solution."
    )


def synchronize(device: str | torch.device) -> None:
    """Wait for queued work on ``device`` to finish (a no-op on CPU). Call before reading a clock."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()
