"""Module 09: model configurations and the StoryLM ladder presets (CONVENTIONS §4)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from .model import TransformerLM

__all__ = ["LADDER", "StoryLMConfig"]


@dataclass(frozen=True)
class StoryLMConfig:
    """Shape of a ``TransformerLM``.

    Attributes:
        name: e.g. ``"StoryLM-5M"``.
        vocab_size: V (the StoryTokenizer has 4096).
        embedding_dim: D.
        num_layers: number of blocks.
        num_heads: H.
        max_seq_len: context window in tokens.
        dropout: training-time dropout.
    """

    name: str
    vocab_size: int = 4096
    embedding_dim: int = 128
    num_layers: int = 4
    num_heads: int = 4
    max_seq_len: int = 256
    dropout: float = 0.0

    def build(self, *, generator: torch.Generator | None = None, dropout: float | None = None) -> TransformerLM:
        """A freshly initialised model of this shape."""
        return TransformerLM(self.vocab_size, self.embedding_dim, self.num_layers, self.num_heads,
                             self.max_seq_len, dropout=self.dropout if dropout is None else dropout,
                             generator=generator)

    def to_dict(self) -> dict:
        return asdict(self)


LADDER: dict[str, StoryLMConfig] = {
    "StoryLM-1M": StoryLMConfig("StoryLM-1M", embedding_dim=128, num_layers=4, num_heads=4),
    "StoryLM-5M": StoryLMConfig("StoryLM-5M", embedding_dim=256, num_layers=6, num_heads=8),
    "StoryLM-30M": StoryLMConfig("StoryLM-30M", embedding_dim=512, num_layers=9, num_heads=8),
}
