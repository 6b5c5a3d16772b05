"""Module 03: neural-network building blocks (``Module``, layers, devices, timing)."""

from .device import resolve_device, synchronize
from .layers import GELU, Dropout, Embedding, LayerNorm, Linear
from .module import Module, eval_mode
from .timing import TimingResult, time_call

__all__ = sorted(["Dropout", "Embedding", "GELU", "LayerNorm", "Linear", "Module", "TimingResult", "eval_mode",
                  "resolve_device", "synchronize", "time_call"])
