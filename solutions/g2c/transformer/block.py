"""Module 09: the pre-LayerNorm transformer block (GPT-2 layout).

Source: Radford et al., "Language Models are Unsupervised Multitask Learners" (2019),
section 2.3 (LayerNorm moved to the input of each sub-block); Xiong et al., "On Layer
Normalization in the Transformer Architecture" (ICML 2020) for why pre-norm trains stably.

Shape letters: B batch, T time, D width.
"""

from __future__ import annotations

import torch

from g2c.attention import MultiHeadAttention
from g2c.nn import GELU, Dropout, LayerNorm, Linear, Module
from g2c.nn.module import check_int, check_real

__all__ = ["MLP", "Block"]


class MLP(Module):
    """Position-wise feed-forward network: Linear(D, hidden) -> GELU -> Linear(hidden, D) -> dropout."""

    def __init__(self, dim: int, hidden_dim: int, *, dropout: float = 0.0,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        dim = check_int(dim, "dim", where="MLP")
        hidden_dim = check_int(hidden_dim, "hidden_dim", where="MLP")
        dropout = check_real(dropout, "dropout", low=0.0, high=1.0, high_open=True, where="MLP")
        self.fc = Linear(dim, hidden_dim, generator=generator)
        self.act = GELU()
        self.proj = Linear(hidden_dim, dim, generator=generator)
        self.dropout = Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, T, D) -> (B, T, D)."""
        return self.dropout(self.proj(self.act(self.fc(x))))


class Block(Module):
    """One pre-norm transformer block: x + attn(ln_1(x)), then + mlp(ln_2(·)).

    Args:
        dim: width D.
        num_heads: H, divides D.
        hidden_dim: MLP width (GPT-2 uses 4·D).
        causal: causal attention (default True).
        dropout: residual dropout inside attention and MLP.
        generator: optional ``torch.Generator`` for the initialisation.

    Raises:
        TypeError: a size that is not an int, ``dropout`` not a real number (the message names it).
        ValueError: a size < 1, H not dividing D, ``dropout`` outside [0, 1) or NaN.

    Attributes:
        ln_1, attn, ln_2, mlp: the four sub-layers, named as in GPT-2.
    """

    def __init__(self, dim: int, num_heads: int, *, hidden_dim: int, causal: bool = True,
                 dropout: float = 0.0, generator: torch.Generator | None = None) -> None:
        super().__init__()
        dim = check_int(dim, "dim", where="Block")
        num_heads = check_int(num_heads, "num_heads", where="Block")
        hidden_dim = check_int(hidden_dim, "hidden_dim", where="Block")
        dropout = check_real(dropout, "dropout", low=0.0, high=1.0, high_open=True, where="Block")
        if dim % num_heads:
            raise ValueError(f"Block: num_heads={num_heads} does not divide dim={dim}")
        self.ln_1 = LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, num_heads, causal=causal, dropout=dropout, generator=generator)
        self.ln_2 = LayerNorm(dim)
        self.mlp = MLP(dim, hidden_dim, dropout=dropout, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the block.

        Args:
            x: (B, T, D) float, the residual stream.

        Returns:
            (B, T, D).

        Steps:
            1. Attention sub-block on the normalised stream, added back to the stream.
            2. MLP sub-block the same way (``test_block_matches_reference``).
            Never normalise the stream itself: only the sub-block inputs
            (``test_block_is_pre_norm``).
        """
        # BEGIN SOLUTION
        x = x + self.attn(self.ln_1(x))                                      # (B, T, D)
        x = x + self.mlp(self.ln_2(x))                                       # (B, T, D)
        return x
        # END SOLUTION
