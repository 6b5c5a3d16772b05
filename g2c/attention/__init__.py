"""Modules 07 and 08: causal self-attention and multi-head attention."""

from .causal import CausalSelfAttention, causal_mask, scaled_dot_product_attention
from .multihead import MultiHeadAttention, merge_heads, split_heads

__all__ = sorted(["CausalSelfAttention", "MultiHeadAttention", "causal_mask", "merge_heads",
                  "scaled_dot_product_attention", "split_heads"])
