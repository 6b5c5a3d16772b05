"""Module 07: causal self-attention, one head.

Source: Vaswani et al., "Attention Is All You Need" (NeurIPS 2017), section 3.2.1
(scaled dot-product attention); the causal mask is the decoder's masking of section 3.2.3.

Shape letters: B batch, T time (queries), S time (keys), D width, d head width.
"""

from __future__ import annotations

import math

import torch

from g2c.nn import Linear, Module
from g2c.nn.module import check_int


def check_float_tensor(x, name: str, where: str) -> None:
    """``x`` must be a floating-point tensor. Provided (attention works on float activations).

    Raises:
        TypeError: not a tensor ("<where>: <name> must be a float tensor, got list").
        ValueError: an integer, bool or complex dtype ("... must be floating point, got dtype torch.int64").
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{where}: {name} must be a float tensor, got {type(x).__name__}")
    if not x.dtype.is_floating_point:
        raise ValueError(f"{where}: {name} must be floating point, got dtype {x.dtype}")

__all__ = ["CausalSelfAttention", "causal_mask", "scaled_dot_product_attention"]


def causal_mask(num_queries: int, num_keys: int | None = None, *, device=None) -> torch.Tensor:
    """Boolean mask of allowed attention: entry (i, j) is True when query i may see key j.

    Queries are the *last* ``num_queries`` positions of a sequence of ``num_keys``
    positions, so query i sits at absolute position ``i + num_keys - num_queries`` and may
    see every key at or before that position. With ``num_keys == num_queries`` (the
    default) this is the lower triangle including the diagonal.

    Args:
        num_queries: T >= 1.
        num_keys: S >= T (default T).
        device: where to build the mask.

    Returns:
        (T, S) bool.

    Raises:
        TypeError: T or S is not an int (a bool, a float, a tensor).
        ValueError: T < 1 or S < T.

    Steps:
        1. Compare a column of query positions with a row of key positions
           (``test_causal_mask_is_lower_triangular``).
    """
    num_queries = check_int(num_queries, "num_queries", minimum=None, where="causal_mask")   # the types; the
    num_keys = check_int(num_keys, "num_keys", minimum=None, none_ok=True, where="causal_mask")  # range below
    num_keys = num_queries if num_keys is None else num_keys
    if num_queries < 1 or num_keys < num_queries:
        raise ValueError(f"causal_mask needs 1 <= num_queries <= num_keys, got {num_queries}, {num_keys}")
    # BEGIN SOLUTION
    q_pos = torch.arange(num_keys - num_queries, num_keys, device=device).unsqueeze(1)  # (T, 1)
    k_pos = torch.arange(num_keys, device=device).unsqueeze(0)                         # (1, S)
    return k_pos <= q_pos                                                               # (T, S)
    # END SOLUTION


def scaled_dot_product_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
                                 causal: bool = True) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d) + mask) v.

    Args:
        q: (..., T, d) float queries.
        k: (..., S, d) float keys.
        v: (..., S, d_v) float values.
        causal: hide future keys (see ``causal_mask``); masked scores become -inf before
            the softmax, so they get exactly zero weight.

    Returns:
        (..., T, d_v), the dtype of q.

    Raises:
        TypeError: q, k or v is not a tensor.
        ValueError: q, k or v is not floating point; the last dimensions of q and k differ, or k
            and v have different S. (Leading dimensions broadcast, as in ``torch.matmul``.)

    Steps:
        1. Scores q @ kᵀ scaled by 1/sqrt(d): (..., T, S) (``test_sdpa_matches_torch_noncausal``).
        2. If causal, fill disallowed scores with -inf (``test_sdpa_matches_torch_causal``).
        3. Softmax over the keys (last dimension), then weight the values.
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float_tensor(t, name, "scaled_dot_product_attention")
        if t.dim() < 2:
            raise ValueError(f"scaled_dot_product_attention: {name} must be (..., T, d), got shape {tuple(t.shape)}")
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"attention shapes do not fit: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    # BEGIN SOLUTION
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])              # (..., T, S)
    if causal:
        mask = causal_mask(q.shape[-2], k.shape[-2], device=q.device)        # (T, S)
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)                                  # (..., T, S)
    return weights @ v                                                       # (..., T, d_v)
    # END SOLUTION


class CausalSelfAttention(Module):
    """Single-head causal self-attention with learned query/key/value/output maps.

    Args:
        dim: model width D (the head uses all of it).
        causal: mask future positions (default True).
        generator: optional ``torch.Generator`` for the initialisation.
    """

    def __init__(self, dim: int, *, causal: bool = True, generator: torch.Generator | None = None) -> None:
        super().__init__()
        dim = check_int(dim, "dim", where="CausalSelfAttention")
        self.causal = causal
        self.query = Linear(dim, dim, generator=generator)
        self.key = Linear(dim, dim, generator=generator)
        self.value = Linear(dim, dim, generator=generator)
        self.proj = Linear(dim, dim, generator=generator)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Attend over the sequence.

        Args:
            x: (B, T, D) float.

        Returns:
            (B, T, D).

        Steps:
            1. Project x to q, k, v: each (B, T, D).
            2. ``scaled_dot_product_attention`` with ``self.causal``, then ``proj``
               (``test_causal_self_attention_is_causal``).
        """
        # BEGIN SOLUTION
        q, k, v = self.query(x), self.key(x), self.value(x)                 # (B, T, D) each
        return self.proj(scaled_dot_product_attention(q, k, v, causal=self.causal))
        # END SOLUTION
