"""Module 16: the KV cache and incremental decoding.

``KVCache`` keeps every layer's keys and values in preallocated buffers with a committed
``length`` pointer; ``cached_forward`` runs a module 09 ``TransformerLM`` on new tokens
only; ``cached_generate`` is module 11's loop with a cache. ``speculative_generate_cached``
and ``mtp_generate_cached`` make speculative decoding commit state like a serving stack:
verify k drafts in one cached pass, then roll both caches back to the committed boundary
by moving a pointer. ``RaggedKVCache`` (provided) gives every batch row its own committed
length on the same buffers, with the masked cached forward that batched speculation and
draft trees run on.
"""

from .cache import KVCache
from .forward import cached_attention, cached_block, cached_forward, cached_hidden_states, prefill, unembed
from .generate import cached_generate
from .ragged import RaggedKVCache, masked_attention, masked_cached_attention, masked_hidden_states, ragged_forward
from .speculative import CachedScorer, RoundRecord, mtp_generate_cached, speculative_generate_cached, summarize_rounds

__all__ = sorted(["CachedScorer", "KVCache", "RaggedKVCache", "RoundRecord", "masked_attention",
                  "masked_cached_attention", "masked_hidden_states", "ragged_forward", "cached_attention",
                  "cached_block", "cached_forward",
                  "cached_generate", "cached_hidden_states", "mtp_generate_cached", "prefill",
                  "speculative_generate_cached", "summarize_rounds", "unembed"])
