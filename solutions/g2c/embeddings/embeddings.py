"""Module 05: token embeddings plus learned absolute positions (the GPT-2 input layer).

Shape letters: B batch, T time, D width, V vocabulary.
"""

from __future__ import annotations

import torch

from g2c.nn import Embedding

__all__ = ["embed_tokens_and_positions"]


def embed_tokens_and_positions(ids: torch.Tensor, token_embed: Embedding, pos_embed: Embedding) -> torch.Tensor:
    """Input vectors of a GPT-2-style model: token vector plus position vector.

    Row ``t`` of the output for sequence ``b`` is ``token_embed.weight[ids[b, t]] +
    pos_embed.weight[t]``: the same position table is shared by every sequence in the batch.

    Args:
        ids: (B, T) int64 token ids in [0, V).
        token_embed: ``Embedding`` with V rows of width D.
        pos_embed: ``Embedding`` with max_seq_len rows of width D.

    Returns:
        (B, T, D) float32.

    Raises:
        TypeError: ``ids`` is not a tensor (checked before your code runs).
        ValueError: ``ids`` is not 2-D ("expected ids of shape (B, T), got (4,)"), or
            T > ``pos_embed.num_embeddings``, the context window ("sequence length T=5
            exceeds the context window max_seq_len=4", then the fix: crop to the window).

    Steps:
        1. Validate the shape and the length (``test_embed_rejects_long_sequences``).
        2. Look up the token vectors: (B, T, D).
        3. Look up positions 0..T-1 (built with ``torch.arange`` on ids' device): (T, D),
           and add them; broadcasting shares them across the batch
           (``test_embed_adds_positions``).
    """
    if not isinstance(ids, torch.Tensor):                  # provided: a list has no shape to check
        raise TypeError(f"embed_tokens_and_positions: ids must be an integer tensor (B, T), got {type(ids).__name__}")
    # BEGIN SOLUTION
    if ids.dim() != 2:
        raise ValueError(f"expected ids of shape (B, T), got {tuple(ids.shape)}")
    T = ids.shape[1]
    if T > pos_embed.num_embeddings:
        raise ValueError(f"sequence length T={T} exceeds the context window max_seq_len="
                         f"{pos_embed.num_embeddings}; crop the input to the last {pos_embed.num_embeddings} tokens")
    tok = token_embed(ids)                                                  # (B, T, D)
    pos = pos_embed(torch.arange(T, device=ids.device))                     # (T, D)
    return tok + pos                                                        # (B, T, D)
    # END SOLUTION
