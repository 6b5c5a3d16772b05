"""Module 16: the KV cache and incremental decoding.

``KVCache`` keeps every layer's keys and values in preallocated buffers with a committed
``length`` pointer; ``cached_forward`` runs a module 09 ``TransformerLM`` on new tokens
only; ``cached_generate`` is module 11's loop with a cache. Every pass over a model's blocks
is one function, the trunk ``forward_rows`` (new rows at given positions, an optional
attention mask, the states of chosen layers; the cache's pointer does not move), and
``commit_rows`` keeps some of the rows it wrote (a pointer move for a chain's prefix, a gather
for a tree's path). ``RaggedKVCache`` (provided) gives every batch row its own committed
length on the same buffers. ``fast_model`` (``fast.py``) is the trunk's fast backend, an object
with the same ``forward_rows``; ``unwrap`` gives the teaching model behind it. Speculative
decoding on this cache (verify k drafts in one cached pass, then roll back by moving a
pointer) is the Beyond side's: ``g2c.specdec.sampling``.
"""

from .cache import KVCache
from .fast import fast_model, unwrap
from .forward import (
    cached_attention,
    cached_block,
    cached_forward,
    cached_hidden_states,
    commit_rows,
    forward_rows,
    masked_attention,
    masked_cached_attention,
    prefill,
    unembed,
)
from .generate import cached_generate
from .ragged import RaggedKVCache, masked_hidden_states, ragged_forward

__all__ = sorted(["KVCache", "RaggedKVCache", "cached_attention", "cached_block", "cached_forward", "cached_generate",
                  "cached_hidden_states", "commit_rows", "fast_model", "forward_rows", "masked_attention",
                  "masked_cached_attention", "masked_hidden_states", "prefill", "ragged_forward", "unembed",
                  "unwrap"])
