"""Module 16: the cached forward pass of a ``TransformerLM`` (module 09 weights, unchanged).

Incremental decoding runs the model on the NEW tokens only. Everything that is per
position (embeddings, LayerNorms, the MLP, the projections) needs just those rows; the one
place where positions meet is attention, and there the new queries attend to the cached
keys/values of every earlier position plus their own. So a cached pass is the ordinary
pass with two changes:

1. positions are offset by the cache length: new token j sits at position ``length + j``;
2. each block's attention appends its new keys/values to the cache and attends over all
   visible rows, causally (new query j sees keys up to ``length + j``).

The functions read the weights of module 08/09 objects (``blk.attn.qkv``, ``blk.attn.proj``,
``blk.ln_1``, ``blk.mlp`` ...) and never change them, so any trained ``TransformerLM`` works.

Source: Vaswani et al. 2017, section 3.2.3 (the decoder's causal masking is what makes
cached keys valid forever); GPT-2's ``past_key_values`` (Radford et al. 2019).

Shape letters: B batch, T new positions, S = length + T visible positions, D width,
H heads, d = D / H, V vocabulary.
"""

from __future__ import annotations

import torch

from g2c.attention.causal import scaled_dot_product_attention
from g2c.attention.multihead import merge_heads, split_heads
from g2c.sampling.model import check_score_rows

from .cache import KVCache

__all__ = ["cached_attention", "cached_block", "cached_forward", "cached_hidden_states", "prefill", "unembed"]


def cached_attention(attn, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
    """One multi-head attention sub-layer on T new positions, with the cache.

    Args:
        attn: a module 08 ``MultiHeadAttention`` (``qkv``, ``proj``, ``num_heads``, ``dim``).
        x: (B, T, D) float, the normalised stream of the NEW positions only.
        cache: the ``KVCache``; rows ``0 : cache.length`` hold earlier positions.
        layer: which of the cache's layers belongs to this block.

    Returns:
        (B, T, D): equal (within float rounding) to the last T rows of ``attn`` run over the
        whole sequence. The cache's pointer does not move (``cached_forward`` advances it
        once, after every layer).

    Raises:
        ValueError: from ``cache.append`` when the window is full (names ``max_seq_len``).

    Steps:
        1. Project the new positions with ``attn.qkv``, split into q, k, v and into heads
           (B, H, T, d), as module 08 does.
        2. ``cache.append`` the new k and v; it returns every visible key and value
           (B, H, S, d) (``test_cached_attention_matches_full_attention``).
        3. Attend the T queries over the S keys with module 07's causal
           ``scaled_dot_product_attention``: its mask already treats the queries as the LAST
           T of S positions. (With T = 1 nothing is in the future: no mask is needed.)
        4. Merge the heads and apply ``attn.proj`` (dropout is off at inference).
    """
    # BEGIN SOLUTION
    q, k, v = attn.qkv(x).split(attn.dim, dim=-1)                            # (B, T, D) each
    q, k, v = (split_heads(t, attn.num_heads) for t in (q, k, v))             # (B, H, T, d)
    keys, values = cache.append(layer, k, v)                                 # (B, H, S, d)
    y = scaled_dot_product_attention(q, keys, values, causal=q.shape[-2] > 1)  # (B, H, T, d)
    return attn.proj(merge_heads(y))                                         # (B, T, D)
    # END SOLUTION


def cached_block(blk, x: torch.Tensor, cache: KVCache, layer: int) -> torch.Tensor:
    """A module 09 pre-norm ``Block`` on T new positions: x + attn(ln_1 x), then + mlp(ln_2 ·).
    Provided. (B, T, D) -> (B, T, D)."""
    x = x + cached_attention(blk.attn, blk.ln_1(x), cache, layer)
    return x + blk.mlp(blk.ln_2(x))


def unembed(model, h: torch.Tensor) -> torch.Tensor:
    """Tied unembedding (..., D) -> logits (..., V): ``model.unembed`` when the model has
    it, else ``h @ token_embed.weight.T``. Provided."""
    if hasattr(model, "unembed"):
        return model.unembed(h)
    return h @ model.token_embed.weight.t()


def _check_step(model, ids: torch.Tensor, cache: KVCache) -> None:
    bad_dtype = isinstance(ids, torch.Tensor) and (ids.dtype.is_floating_point or ids.dtype == torch.bool)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] < 1 or bad_dtype:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"cached_forward expects integer ids of shape (B, T) with T >= 1 (the NEW tokens); "
                         f"got {shape}")
    if not isinstance(cache, KVCache):
        raise TypeError(f"cached_forward needs a KVCache (KVCache.for_model(model)), got {type(cache).__name__}")
    if ids.shape[0] != cache.batch_size:
        raise ValueError(f"ids has batch size {ids.shape[0]} but the cache was built for B={cache.batch_size}")
    if cache.num_layers != model.num_layers:
        raise ValueError(f"the cache has {cache.num_layers} layers but the model {model.num_layers}; "
                         "build it with KVCache.for_model(model)")
    head_dim = model.embedding_dim // model.num_heads
    if (cache.num_heads, cache.head_dim) != (model.num_heads, head_dim):
        raise ValueError(f"the cache holds {cache.num_heads} heads of {cache.head_dim} but the model has "
                         f"{model.num_heads} of {head_dim}: it was built for another model; build it with "
                         "KVCache.for_model(model)")
    weight = model.token_embed.weight
    if cache.dtype != weight.dtype or cache.device != weight.device:
        raise ValueError(f"the cache is {cache.dtype} on {cache.device} but the model computes in {weight.dtype} on "
                         f"{weight.device} (keys would be rounded or moved silently); build it with "
                         "KVCache.for_model(model), or move the model")
    end = cache.length + ids.shape[1]
    if end > min(cache.max_seq_len, model.max_seq_len):
        raise ValueError(f"cached_forward: {cache.length} cached + {ids.shape[1]} new positions exceed "
                         f"max_seq_len={min(cache.max_seq_len, model.max_seq_len)} (learned positions end there); "
                         "crop the cache or re-prefill the last part of the window")


@torch.no_grad()
def cached_hidden_states(model, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The trunk on T new tokens with the cache: final-LayerNorm states (B, T, D). Provided.

    Appends the new positions' keys/values to every layer and advances ``cache.length`` by T.

    Args:
        model: a ``TransformerLM`` (module 09), in eval mode (no dropout).
        ids: (B, T) int64, the tokens at positions ``cache.length ... cache.length + T - 1``.
        cache: a ``KVCache`` built for this model (``KVCache.for_model``), same B.

    Returns:
        (B, T, D) in the model's dtype, on the model's device.

    Raises:
        ValueError: ids not (B, T) integers with T >= 1; B or the layer count differ from
            the cache's; ``cache.length + T`` exceeds ``max_seq_len``.
        TypeError: cache is not a ``KVCache``.

    A model may bring its own implementation of this pass as a ``cached_hidden_states(ids,
    cache)`` method with the same contract: the fast path ``g2c.kvcache.fast.FastLM`` does
    (packed weights, torch's fused attention); a ``TransformerLM`` has none and runs the code
    below.
    """
    _check_step(model, ids, cache)
    own = getattr(model, "cached_hidden_states", None)
    if own is not None:
        return own(ids, cache)
    ids = ids.to(model.token_embed.weight.device)
    T = ids.shape[1]
    positions = torch.arange(cache.length, cache.length + T, device=ids.device)   # (T,)
    x = model.token_embed(ids) + model.pos_embed(positions)                       # (B, T, D)
    for layer, blk in enumerate(model.blocks):
        x = cached_block(blk, x, cache, layer)                                    # (B, T, D)
    cache.advance(T)
    return model.ln_final(x)


@torch.no_grad()
def cached_forward(model, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """Logits (B, T, V) for T new tokens, reusing the cache. Provided.

    Row j scores the token after position ``cache.length + j`` (old length); equal within
    1e-4 (float32) to the last T rows of ``model`` run over the whole sequence. The cache
    grows by T (see ``cached_hidden_states`` for arguments and errors).

    Raises:
        ValueError: as ``cached_hidden_states``; the logits hold NaN or a row of only -inf
            (``g2c.sampling.model.check_score_rows``, naming the positions): a broken model
            must stop the loop, not become token 0.
    """
    start = cache.length if isinstance(cache, KVCache) else 0
    logits = unembed(model, cached_hidden_states(model, ids, cache))              # (B, T, V)
    check_score_rows(logits, "logits", where=f"positions {start}..{start + logits.shape[1] - 1} (cached_forward)")
    return logits


@torch.no_grad()
def prefill(model, ids, cache: KVCache | None = None) -> tuple[torch.Tensor, KVCache]:
    """Run a prompt into an empty cache; return (logits (B, T, V), cache). Provided.

    ``ids`` may be 1-D (one sequence) or (B, T). A new cache is built when none is given;
    a given one is reset first.
    """
    ids = torch.as_tensor(ids)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if cache is None:
        cache = KVCache.for_model(model, batch_size=ids.shape[0])
    cache.reset()
    return cached_forward(model, ids, cache), cache
