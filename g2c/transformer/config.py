"""Module 09: model configurations and the StoryLM ladder presets (CONVENTIONS §4).

``LADDER`` is the one definition of the ladder: the artifact loader, the training recipes
(``g2c/assets/recipes/ladder.py``, keyed by these names) and the tests all read it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch

from g2c.nn.module import check_int, check_real

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
        hidden_dim: MLP width; None means 4·D (GPT-2's).

    Raises:
        TypeError: ``name`` not a string, a size not an int (a bool, a float, a string: the message
            names the field), ``dropout`` not a real number.
        ValueError: ``name`` empty, a size < 1, ``num_heads`` not dividing ``embedding_dim``,
            ``dropout`` outside [0, 1) or NaN.
    """

    name: str
    vocab_size: int = 4096
    embedding_dim: int = 128
    num_layers: int = 4
    num_heads: int = 4
    max_seq_len: int = 256
    dropout: float = 0.0
    hidden_dim: int | None = None

    def __post_init__(self) -> None:
        # Every field is checked here, where it enters, and normalised to a Python int/float (a NumPy
        # integer from a loaded array would not survive ``to_dict``'s JSON).
        w = "StoryLMConfig"
        if not isinstance(self.name, str):
            raise TypeError(f"{w}: name must be a string such as 'StoryLM-5M', got {type(self.name).__name__} "
                            f"{self.name!r:.60}")
        if not self.name.strip():
            raise ValueError(f"{w}: name must be a non-empty string such as 'StoryLM-5M', got {self.name!r}")
        for key in ("vocab_size", "embedding_dim", "num_layers", "num_heads", "max_seq_len"):
            object.__setattr__(self, key, check_int(getattr(self, key), key, where=w))
        object.__setattr__(self, "hidden_dim", check_int(self.hidden_dim, "hidden_dim", none_ok=True, where=w))
        object.__setattr__(self, "dropout", check_real(self.dropout, "dropout", low=0.0, high=1.0, high_open=True,
                                                       where=w))
        if self.embedding_dim % self.num_heads:
            raise ValueError(f"{w}: num_heads={self.num_heads} does not divide embedding_dim={self.embedding_dim}")

    def build(self, *, generator: torch.Generator | None = None, dropout: float | None = None) -> TransformerLM:
        """A freshly initialised ``TransformerLM`` of this shape (float32, CPU).

        Args:
            generator: seeds the initialisation.
            dropout: overrides ``self.dropout`` (e.g. a recipe's training dropout).
        """
        return TransformerLM(self.vocab_size, self.embedding_dim, self.num_layers, self.num_heads,
                             self.max_seq_len, hidden_dim=self.hidden_dim,
                             dropout=self.dropout if dropout is None else dropout, generator=generator)

    def to_dict(self) -> dict:
        """Every field as a JSON-ready dict, with ``hidden_dim`` resolved to its value (4·D by default);
        ``from_dict`` reads it back."""
        return {**asdict(self), "hidden_dim": self.hidden_dim or 4 * self.embedding_dim}

    @classmethod
    def from_dict(cls, d: dict) -> "StoryLMConfig":
        """The config stored in a ``config.json`` or written by ``to_dict``.

        Keys that are not fields (e.g. ``"tokenizer"`` in an artifact's config.json) are ignored.

        Raises:
            ValueError: ``name`` is missing, or a field has the wrong type (the message names it).
        """
        if "name" not in d:
            raise ValueError(f"StoryLMConfig.from_dict: no 'name' in {sorted(d)}")
        kwargs = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        for key in ("vocab_size", "embedding_dim", "num_layers", "num_heads", "max_seq_len"):
            if key in kwargs and (isinstance(kwargs[key], bool) or not isinstance(kwargs[key], int)):
                raise ValueError(f"StoryLMConfig.from_dict: {key} must be an int, got {kwargs[key]!r}")
        return cls(**kwargs)


LADDER: dict[str, StoryLMConfig] = {
    "StoryLM-1M": StoryLMConfig("StoryLM-1M", embedding_dim=128, num_layers=4, num_heads=4),
    "StoryLM-5M": StoryLMConfig("StoryLM-5M", embedding_dim=256, num_layers=6, num_heads=8),
    "StoryLM-30M": StoryLMConfig("StoryLM-30M", embedding_dim=512, num_layers=9, num_heads=8),
}
