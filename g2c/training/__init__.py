"""Module 03b: training controls (AdamW, gradient clipping, learning-rate schedule)."""

from .adamw import AdamW
from .clip import clip_grad_norm_
from .schedule import cosine_with_warmup

__all__ = sorted(["AdamW", "clip_grad_norm_", "cosine_with_warmup"])
