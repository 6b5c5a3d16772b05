"""Module 09: ``TransformerLM``, a GPT-2-shaped decoder-only language model.

Architecture (CONVENTIONS §4): token + learned absolute position embeddings, N pre-norm
blocks, a final LayerNorm, and an unembedding tied to the token embedding (no output
bias). Source: Radford et al. 2019 (GPT-2), section 2.3; weight tying from Press and
Wolf, "Using the Output Embedding to Improve Language Models" (EACL 2017).

Shape letters: B batch, T time, D width, V vocabulary.
"""

from __future__ import annotations

import math

import torch

from g2c.embeddings import embed_tokens_and_positions
from g2c.nn import Dropout, Embedding, LayerNorm, Module
from g2c.nn.module import check_int, check_real

from .block import Block

__all__ = ["TransformerLM"]


class TransformerLM(Module):
    """Decoder-only transformer language model.

    Args:
        vocab_size: V.
        embedding_dim: D.
        num_layers: number of blocks.
        num_heads: H, divides D.
        max_seq_len: context window (rows of the position table).
        hidden_dim: MLP width (default 4·D).
        dropout: embedding and residual dropout (0 at inference).
        generator: optional ``torch.Generator`` for the initialisation (GPT-2's: N(0, 0.02),
            residual output projections scaled by 1/sqrt(2·num_layers)).

    Attributes:
        token_embed: ``Embedding(V, D)``; also the unembedding (tied).
        pos_embed: ``Embedding(max_seq_len, D)``.
        blocks: list of ``Block``.
        ln_final: ``LayerNorm(D)``.
        vocab_size, embedding_dim, num_layers, num_heads, hidden_dim, max_seq_len.

    Raises:
        TypeError: a size that is not an int (a bool, a float, a tensor), ``dropout`` not a real
            number; the message names the argument.
        ValueError: a size is not positive (``hidden_dim`` may be None), D is not divisible by H,
            ``dropout`` outside [0, 1) or NaN.
    """

    def __init__(self, vocab_size: int, embedding_dim: int, num_layers: int, num_heads: int,
                 max_seq_len: int, *, hidden_dim: int | None = None, dropout: float = 0.0,
                 generator: torch.Generator | None = None) -> None:
        super().__init__()
        w = "TransformerLM"
        vocab_size, embedding_dim, num_layers, num_heads, max_seq_len = (
            check_int(value, name, where=w) for name, value in
            [("vocab_size", vocab_size), ("embedding_dim", embedding_dim), ("num_layers", num_layers),
             ("num_heads", num_heads), ("max_seq_len", max_seq_len)])
        hidden_dim = check_int(hidden_dim, "hidden_dim", none_ok=True, where=w)
        dropout = check_real(dropout, "dropout", low=0.0, high=1.0, high_open=True, where=w)
        if embedding_dim % num_heads:
            raise ValueError(f"TransformerLM: embedding_dim {embedding_dim} is not divisible by num_heads {num_heads}")
        self.vocab_size = vocab_size
        self.embedding_dim = embedding_dim
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.hidden_dim = hidden_dim or 4 * embedding_dim
        self.max_seq_len = max_seq_len
        self.token_embed = Embedding(vocab_size, embedding_dim, generator=generator)
        self.pos_embed = Embedding(max_seq_len, embedding_dim, init_std=0.01, generator=generator)
        self.drop = Dropout(dropout)
        self.blocks = [Block(embedding_dim, num_heads, hidden_dim=self.hidden_dim, dropout=dropout,
                             generator=generator) for _ in range(num_layers)]
        self.ln_final = LayerNorm(embedding_dim)
        with torch.no_grad():
            for blk in self.blocks:
                blk.attn.proj.weight.mul_(1.0 / math.sqrt(2 * num_layers))
                blk.mlp.proj.weight.mul_(1.0 / math.sqrt(2 * num_layers))

    def set_fused_attention(self, enabled: bool = True) -> "TransformerLM":
        """Switch every block to torch's fused attention kernel (or back); returns self.

        Same maths as the course attention (a test checks equality); used to train the
        ladder faster. Off by default.
        """
        for blk in self.blocks:
            blk.attn.fused = enabled
        return self

    def _check_ids(self, ids: torch.Tensor) -> None:
        bad_dtype = isinstance(ids, torch.Tensor) and (ids.dtype.is_floating_point or ids.dtype == torch.bool)
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"TransformerLM expects integer ids of shape (B, T) as a tensor; got {type(ids).__name__}")
        if ids.dim() != 2 or bad_dtype:
            shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
            raise ValueError(f"TransformerLM expects integer ids of shape (B, T); got {shape}")
        if ids.shape[1] < 1:
            raise ValueError("TransformerLM got an empty sequence (T = 0)")
        if ids.shape[1] > self.max_seq_len:
            raise ValueError(f"sequence length T={ids.shape[1]} exceeds max_seq_len={self.max_seq_len}; "
                             f"crop to the last {self.max_seq_len} tokens")

    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """The trunk: embeddings, every block, then the final LayerNorm.

        Args:
            ids: (B, T) int64, T <= max_seq_len.

        Returns:
            (B, T, D) float32.

        Raises:
            TypeError: ids is not a tensor.
            ValueError: ids not 2-D integers, T = 0, or T > max_seq_len.

        Steps:
            1. Validate (``self._check_ids``, provided).
            2. Token + position embeddings (module 05), dropout.
            3. Each block in order, then ``ln_final`` (``test_transformer_hidden_states_shape``).
        """
        self._check_ids(ids)
        # BEGIN SOLUTION
        x = self.drop(embed_tokens_and_positions(ids, self.token_embed, self.pos_embed))   # (B, T, D)
        for blk in self.blocks:
            x = blk(x)
        return self.ln_final(x)
        # END SOLUTION

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        """Logits from hidden states through the tied unembedding (no bias). Provided.

        Args:
            h: (..., D) float, e.g. the (B, T, D) output of ``hidden_states``.

        Returns:
            logits (..., V) in h's dtype, on h's device.
        """
        return h @ self.token_embed.weight.t()                                              # (..., V)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Next-token logits at every position.

        Args:
            ids: (B, T) int64.

        Returns:
            logits (B, T, V) float32: row t scores the token at position t+1.

        Raises:
            ValueError: as ``hidden_states``.

        Steps:
            1. ``hidden_states`` (B, T, D).
            2. Multiply by the transposed token embedding (tied unembedding, no bias):
               ``self.unembed`` does it (``test_transformer_unembedding_is_tied``).
        """
        # BEGIN SOLUTION
        return self.unembed(self.hidden_states(ids))                                       # (B, T, V)
        # END SOLUTION
