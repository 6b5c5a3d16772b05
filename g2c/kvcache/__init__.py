"""Module 16: the KV cache and incremental decoding.

``KVCache`` keeps every layer's keys and values in preallocated buffers with a committed
``length`` pointer; ``cached_forward`` runs a module 09 ``TransformerLM`` on new tokens
only; ``cached_generate`` is module 11's loop with a cache. ``RaggedKVCache`` (provided)
gives every batch row its own committed length on the same buffers, with the masked cached
forward that batched speculation and draft trees run on. Speculative decoding on this cache
(verify k drafts in one cached pass, then roll back by moving a pointer) is the Beyond side's:
``g2c.specdec.sampling.cached``.
"""

from .cache import KVCache
from .forward import cached_attention, cached_block, cached_forward, cached_hidden_states, prefill, unembed
from .generate import cached_generate
from .ragged import RaggedKVCache, masked_attention, masked_cached_attention, masked_hidden_states, ragged_forward

__all__ = sorted(["KVCache", "RaggedKVCache", "cached_attention", "cached_block", "cached_forward", "cached_generate",
                  "cached_hidden_states", "masked_attention", "masked_cached_attention", "masked_hidden_states",
                  "prefill", "ragged_forward", "unembed"])
