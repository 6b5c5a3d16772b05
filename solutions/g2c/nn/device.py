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
        TypeError: ``device`` is neither a string nor a ``torch.device`` (None, an int): checked
            before your code runs.
        ValueError: the string is not a device name torch understands:
            "unknown device 'gpu0': use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'".
        RuntimeError: the requested device is not available on this machine; the message
            names the request and suggests ``"auto"`` or ``"cpu"``: "device 'cuda' requested
            but CUDA is not available here; use 'auto' or 'cpu'" (for MPS: "MPS is not
            available"); a CUDA index beyond the devices present, or a device type the
            course does not support, says so likewise.

    Steps:
        1. For "auto", test CUDA then MPS availability, fall back to CPU
           (``test_resolve_device_auto_on_cpu_machine``).
        2. Otherwise parse with ``torch.device`` and check availability of CUDA/MPS
           (``test_resolve_device_rejects_unavailable``).
    """
    if not isinstance(device, (str, torch.device)):       # provided: the type, where the value enters
        raise TypeError(f"resolve_device: device must be a string ('auto', 'cpu', 'cuda', 'cuda:N', 'mps') or a "
                        f"torch.device, got {type(device).__name__} {device!r:.60}")
    # BEGIN SOLUTION
    if isinstance(device, str) and device.strip().lower() == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"unknown device {device!r}: use 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'") from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError(f"device {device!r} requested but CUDA is not available here; use 'auto' or 'cpu'")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise RuntimeError(f"device {device!r} requested but only {torch.cuda.device_count()} CUDA devices exist")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise RuntimeError(f"device {device!r} requested but MPS is not available here; use 'auto' or 'cpu'")
    elif dev.type not in ("cpu", "cuda", "mps"):
        raise RuntimeError(f"device {device!r} is not supported by the course; use 'auto', 'cpu', 'cuda' or 'mps'")
    return dev
    # END SOLUTION


def synchronize(device: str | torch.device) -> None:
    """Wait for queued work on ``device`` to finish (a no-op on CPU). Call before reading a clock."""
    dev = torch.device(device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()
