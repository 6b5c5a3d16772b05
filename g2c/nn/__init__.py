"""Module 03: neural-network building blocks (``Module``, layers, devices)."""

from .device import resolve_device, synchronize
from .layers import GELU, Dropout, Embedding, LayerNorm, Linear
from .module import Module

__all__ = sorted(["Dropout", "Embedding", "GELU", "LayerNorm", "Linear", "Module", "resolve_device", "synchronize"])
