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

The trunk (provided). Every pass the course runs over a model's blocks is ONE function,
``forward_rows``: the cached pass of this module (``cached_hidden_states`` = ``forward_rows``
+ ``cache.advance``), the ragged batch (``ragged.py``), a draft tree and the passes that keep
layer states for a drafter (the Beyond modules). They differ in three optional arguments:
``positions`` (None: ``length, length + 1, ...``), ``allowed`` (None: causal, no mask tensor,
your ``cached_attention`` runs; else a boolean mask and the provided ``masked_cached_attention``)
and ``keep_layers`` (block outputs to return beside the final states). The pointer never moves
inside it; ``commit_rows`` keeps what the caller accepts (a pointer move for a chain's prefix,
a gather for a tree's path). A model with its own ``forward_rows`` method (the fast path,
``fast.py``'s ``fast_model``) gets the validated call handed over, with the same arguments:
the fast path is a backend of this one pass, and the teaching pass is the default and the oracle.

Source: Vaswani et al. 2017, section 3.2.3 (the decoder's causal masking is what makes
cached keys valid forever); GPT-2's ``past_key_values`` (Radford et al. 2019); tree attention
as one masked pass (Miao et al., "SpecInfer", ASPLOS 2024, section 4.2; Cai et al., "Medusa",
ICML 2024, section 2.1.2); per-request positions and key masks (Yu et al., "Orca", OSDI 2022;
Kwon et al., "vLLM", SOSP 2023).

Shape letters: B batch, T new positions, S = length + T visible positions, D width,
H heads, d = D / H, L kept layers, V vocabulary.
"""

from __future__ import annotations

import math

import torch

from g2c.attention.causal import scaled_dot_product_attention
from g2c.attention.multihead import merge_heads, split_heads
from g2c.sampling.generate import as_token_ids
from g2c.sampling.model import check_score_rows

from .cache import KVCache

__all__ = ["cached_attention", "cached_block", "cached_forward", "cached_hidden_states", "commit_rows", "forward_rows",
           "masked_attention", "masked_cached_attention", "prefill", "unembed"]


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


# ---- the masked sub-layer (the teaching path's attention when a mask is given) -------------
def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / sqrt(d), disallowed scores -inf) v, for any boolean mask.

    Args:
        q: (..., T, d); k: (..., S, d); v: (..., S, d_v).
        allowed: bool, broadcastable to (..., T, S); every query row needs >= 1 True.

    Returns:
        (..., T, d_v) in q's dtype.
    """
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])                           # (..., T, S)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return scores.softmax(dim=-1) @ v


def masked_cached_attention(attn, x: torch.Tensor, cache: KVCache, layer: int, allowed: torch.Tensor) -> torch.Tensor:
    """Module 16's ``cached_attention`` with an explicit mask. (B, T, D) -> (B, T, D).

    ``cache.append`` writes the new keys/values (per row for a ``RaggedKVCache``) and returns
    S visible rows; ``allowed`` (broadcastable to (B, H, T, S), bool) picks what each query
    reads. The pointer does not move.
    """
    q, k, v = attn.qkv(x).split(attn.dim, dim=-1)                                        # (B, T, D) each
    q, k, v = (split_heads(t, attn.num_heads) for t in (q, k, v))                         # (B, H, T, d)
    keys, values = cache.append(layer, k, v)                                             # (B, H, S, d)
    return attn.proj(merge_heads(masked_attention(q, keys, values, allowed)))            # (B, T, D)


# ---- validation ---------------------------------------------------------------------------
def _check_rows(model, ids, cache, positions, allowed, keep_layers) -> tuple[int, ...]:
    """Validate a ``forward_rows`` call (one-line errors); return keep_layers as a tuple of ints."""
    bad_dtype = isinstance(ids, torch.Tensor) and (ids.dtype.is_floating_point or ids.dtype == torch.bool)
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] < 1 or bad_dtype:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"forward_rows expects integer ids of shape (B, T) with T >= 1 (the NEW tokens); "
                         f"got {shape}")
    if not isinstance(cache, KVCache):
        raise TypeError(f"forward_rows needs a KVCache (KVCache.for_model(model)), got {type(cache).__name__}")
    B, T = ids.shape
    if B != cache.batch_size:
        raise ValueError(f"ids has batch size {B} but the cache was built for B={cache.batch_size}")
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
    end = cache.length + T
    if positions is None:
        if end > min(cache.max_seq_len, model.max_seq_len):
            raise ValueError(f"forward_rows: {cache.length} cached + {T} new positions exceed "
                             f"max_seq_len={min(cache.max_seq_len, model.max_seq_len)} (learned positions end "
                             "there); crop the cache or re-prefill the last part of the window")
    else:
        if (not isinstance(positions, torch.Tensor) or positions.dtype.is_floating_point
                or positions.dtype == torch.bool or positions.shape not in ((T,), (B, T))):
            shape = tuple(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
            raise ValueError(f"forward_rows: positions must be integers of shape (T,) = ({T},) or (B, T) = "
                             f"({B}, {T}); got {shape}")
        if positions.numel() and not 0 <= int(positions.min()) <= int(positions.max()) < model.max_seq_len:
            raise ValueError(f"forward_rows: positions must be in [0, max_seq_len={model.max_seq_len}) (learned "
                             f"positions end there); got {int(positions.min())}..{int(positions.max())}")
        if end > cache.max_seq_len:
            raise ValueError(f"forward_rows: {cache.length} cached + {T} new rows exceed the cache's "
                             f"max_seq_len={cache.max_seq_len}; crop the cache or shrink the block")
    if allowed is not None:
        if not isinstance(allowed, torch.Tensor) or allowed.dtype != torch.bool or allowed.dim() < 2 \
                or allowed.shape[-2:] != (T, end):
            shape = tuple(allowed.shape) if isinstance(allowed, torch.Tensor) else type(allowed).__name__
            dtype = f" {allowed.dtype}" if isinstance(allowed, torch.Tensor) else ""
            raise ValueError(f"forward_rows: allowed must be a bool mask (..., T, S) = (..., {T}, {end}) "
                             f"(S = cached + new rows); got {shape}{dtype}")
    if not keep_layers:
        return ()
    if isinstance(keep_layers, int) or not all(isinstance(i, int) and not isinstance(i, bool) for i in keep_layers):
        raise ValueError(f"forward_rows: keep_layers must be a tuple of block indices, got {keep_layers!r}")
    keep = tuple(keep_layers)
    bad = [i for i in keep if not 0 <= i < model.num_layers]
    if bad:
        raise ValueError(f"forward_rows: keep_layers {keep} name blocks outside 0..{model.num_layers - 1}")
    return keep


# ---- the trunk ------------------------------------------------------------------------------
@torch.no_grad()
def forward_rows(model, ids: torch.Tensor, cache: KVCache, *, positions: torch.Tensor | None = None,
                 allowed: torch.Tensor | None = None,
                 keep_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The one pass over the blocks: T new rows over the cache's committed rows. Provided.

    The new rows' keys/values are written at rows ``cache.length .. cache.length + T - 1`` (per
    row for a ``RaggedKVCache``) of every layer; ``cache.length`` does NOT move (advance or
    ``commit_rows`` afterwards).

    Args:
        model: a ``TransformerLM`` (module 09) in eval mode, or a fast model
            (``g2c.kvcache.fast_model``): a model with its own ``forward_rows(ids, cache, *,
            positions, allowed, keep_layers)`` method runs that instead of the teaching pass.
        ids: (B, T) int64, T >= 1, the new tokens.
        cache: a ``KVCache`` built for this model (``KVCache.for_model``), same B.
        positions: None (default): row t sits at position ``length + t`` (per row
            ``lengths[b] + t`` on a ``RaggedKVCache``). Else (T,) or (B, T) ints in
            [0, max_seq_len): a tree's rows sit at ``length + depth``.
        allowed: None (default): causal, the new rows are the next T of the sequence (row t
            reads keys ``0 .. length + t``; on a ``RaggedKVCache`` its key-padding mask). No
            mask tensor is built for a plain cache: the student's ``cached_attention`` runs.
            Else a bool mask broadcastable to (B, H, T, S), S = ``length + T``: True where
            row t may read key j (``masked_attention``); every row needs one True.
        keep_layers: block indices whose outputs (residual stream after the block, before the
            final LayerNorm) to return, in the order given.

    Returns:
        (states, kept): states (B, T, D) after the final LayerNorm, in the model's stream dtype
        on its device (``unembed(model, states)`` gives the logits); kept (B, T, L, D) with
        L = len(keep_layers), or None when keep_layers is empty.

    Raises:
        ValueError: ids not (B, T) integers with T >= 1; B, the layer count, heads, dtype or
            device differ from the cache's ("built for another model"); with default positions
            ``length + T`` past ``max_seq_len``; positions not (T,)/(B, T) integers in
            [0, max_seq_len); more rows than the cache holds; ``allowed`` not a bool mask
            (..., T, S); keep_layers outside the model's blocks.
        TypeError: cache is not a ``KVCache``.
    """
    keep = _check_rows(model, ids, cache, positions, allowed, keep_layers)
    if allowed is None and type(cache) is not KVCache and hasattr(cache, "key_padding_mask"):   # per-row lengths
        T = ids.shape[1]
        allowed = cache.key_padding_mask(T).unsqueeze(1)                                  # (B, 1, T, S)
        positions = cache.positions(T) if positions is None else positions                # (B, T)
    own = getattr(model, "forward_rows", None)
    if own is not None:                                                                   # a fast backend
        return own(ids, cache, positions=positions, allowed=allowed, keep_layers=keep)
    dev = model.token_embed.weight.device
    ids = ids.to(dev)
    T = ids.shape[1]
    if positions is None:
        positions = torch.arange(cache.length, cache.length + T, device=dev)             # (T,)
    x = model.token_embed(ids) + model.pos_embed(positions.to(dev))                       # (B, T, D)
    if allowed is not None:
        allowed = allowed.to(dev)
    saved = {}
    for layer, blk in enumerate(model.blocks):
        if allowed is None:
            x = cached_block(blk, x, cache, layer)                                        # the student's attention
        else:
            x = x + masked_cached_attention(blk.attn, blk.ln_1(x), cache, layer, allowed)
            x = x + blk.mlp(blk.ln_2(x))
        if keep and layer in keep:
            saved[layer] = x
    kept = torch.stack([saved[i] for i in keep], dim=2) if keep else None                 # (B, T, L, D)
    return model.ln_final(x), kept


def commit_rows(kv, start: int, rows) -> int:
    """Commit new rows: keep rows ``start + rows[j]`` as rows ``start + j``, drop the rest. Provided.

    After ``forward_rows`` wrote T new rows after the pointer, the caller keeps some of them.
    A chain keeps a prefix: ``rows = [0, 1, ..., m - 1]`` is already in place, so committing
    is a pointer move and copies nothing (module 16's rollback). A draft tree keeps one
    root-to-node path whose rows are scattered over the flattened tree: each is copied down
    to its slot (a gather; ``rows`` strictly increasing makes ``rows[j] >= j``, so the rows
    moved are exactly those from the first j with ``rows[j] != j`` on, copied at once).

    Args:
        kv: a ``KVCache`` (its buffers are gathered in place and ``length`` moves to
            ``start + len(rows)``; rows ``length .. start - 1`` are committed as written,
            e.g. a tree's root), or a list of L pairs (K, V), each (..., T, d) tensors, gathered
            along the row dimension -2.
        start: the first row of the block being committed; for a ``KVCache``,
            ``cache.length <= start``.
        rows: strictly increasing offsets (ints >= 0) of the rows to keep, relative to ``start``.

    Returns:
        The bytes copied (0 for a chain's prefix).

    Raises:
        ValueError: rows not strictly increasing non-negative ints ("strictly increasing"); a
            row past the tensors; a ``KVCache`` whose length is already past ``start``
            ("past ctx_len").
    """
    rows = [int(i) for i in rows]
    if any(b <= a for a, b in zip(rows, rows[1:])) or (rows and rows[0] < 0):
        raise ValueError(f"commit_rows: rows must be strictly increasing node indices, got {rows}")
    cache = kv if isinstance(kv, KVCache) else None
    if cache is not None:
        if not cache.length <= start:
            raise ValueError(f"commit_rows: the cache already holds {cache.length} rows, past ctx_len={start}")
        kv = list(zip(cache.keys_buffer, cache.values_buffer))
    first = next((j for j, r in enumerate(rows) if r != j), len(rows))    # rows before it sit in place
    moved = 0
    for k, v in kv:
        if rows and start + rows[-1] >= k.shape[-2]:
            raise ValueError(f"commit_rows: node {rows[-1]} is beyond the {k.shape[-2] - start} tree rows")
        if first < len(rows):
            src = torch.tensor(rows[first:], device=k.device) + start
            k[..., start + first:start + len(rows), :] = k.index_select(-2, src)
            v[..., start + first:start + len(rows), :] = v.index_select(-2, src)
            n = len(rows) - first
            moved += n * (k[..., 0, :].numel() * k.element_size() + v[..., 0, :].numel() * v.element_size())
    if cache is not None:
        cache.advance(start + len(rows) - cache.length)
    return moved


@torch.no_grad()
def cached_hidden_states(model, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
    """The trunk on T new tokens with the cache: final-LayerNorm states (B, T, D). Provided.

    Appends the new positions' keys/values to every layer and advances ``cache.length`` by T.
    It is module 16's one pass over the blocks, ``forward_rows`` (below), in its
    default (causal) form, followed by ``cache.advance(T)``: per block the student's
    ``cached_attention`` (through ``cached_block``), then the MLP; the final LayerNorm.

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

    A model may bring its own implementation of the pass as a ``forward_rows(ids, cache, *,
    positions, allowed, keep_layers)`` method with the same contract: the fast path
    (``g2c.kvcache.fast.fast_model``: packed weights, torch's fused attention) does; a
    ``TransformerLM`` has none and runs the teaching pass.
    """
    states, _ = forward_rows(model, ids, cache)
    cache.advance(ids.shape[1])
    return states


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

    Raises:
        TypeError: ids not readable as token ids (None, an object).
        ValueError: a 1-D prompt that ``as_token_ids`` refuses (empty, floats, bools, ids outside
            the vocabulary); (B, T) ids as ``cached_forward`` checks them.
    """
    if not isinstance(ids, torch.Tensor) or ids.dim() <= 1:
        nested = isinstance(ids, (list, tuple)) and bool(ids) and isinstance(ids[0], (list, tuple, torch.Tensor))
        ids = torch.as_tensor(ids) if nested else as_token_ids(ids, "ids", vocab_size=model.vocab_size)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if cache is None:
        cache = KVCache.for_model(model, batch_size=ids.shape[0])
    cache.reset()
    return cached_forward(model, ids, cache), cache
