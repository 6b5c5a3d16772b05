"""Module 16, provided: ragged per-row lengths and the masked cached forward.

``KVCache`` keeps one committed ``length`` for every batch row. Batched speculative
decoding needs more: each row commits its own accepted prefix every round, so the rows'
lengths drift apart. ``RaggedKVCache`` is the extension its module docstring announces,
on the SAME buffers (per layer K and V of shape (B, H, T_max, d), allocated once):

- ``lengths`` is a (B,) int64 tensor, one committed length per row;
- ``append`` writes row b's T new keys/values at rows ``lengths[b] .. lengths[b] + T - 1``
  (an indexed write along T) and returns the buffers up to ``S = max(lengths) + T``;
- ``key_padding_mask(T)`` says which of those S keys query t of row b may read:
  ``j <= lengths[b] + t`` (causal inside the new block, and blind to the padding rows a
  shorter row has between its own length and S);
- ``advance`` and ``crop`` take an int (every row) or a (B,) tensor (per row); ``crop`` is
  still a pointer move, no copy.

New tokens of unequal count (ragged prompts, a drafter one token behind) are right-padded
to a common T: ``ragged_forward`` advances every row by T like ``cached_forward``, then the
caller ``crop``\\ s each row back to what it really committed, exactly module 16's
"append k + 1, then roll back by pointer", per row. Pad rows are left past the pointer,
invisible, and overwritten by the next write.

Module 07's ``scaled_dot_product_attention`` only knows a causal mask whose queries are the
last T of S keys (one shared length), so it cannot express a ragged or a tree mask. Module
16's trunk ``forward_rows`` (``forward.py``) takes explicit positions and a boolean mask
(``masked_attention``: softmax(q kᵀ / sqrt(d)) with disallowed scores set to -inf); on a
``RaggedKVCache`` its defaults are the per-row positions and the key-padding mask, so
``ragged_forward`` is one call of it. ``masked_hidden_states`` is the trunk with explicit
positions and mask (the draft tree's pass, ``g2c.specdec.trees.attention.cached_tree_forward``,
is another call of the same function).

Source: per-request lengths and key-padding masks as in Orca (Yu et al., OSDI 2022,
iteration-level scheduling) and vLLM (Kwon et al., SOSP 2023); the attention is Vaswani et
al. 2017, section 3.2.1.

Shape letters: B batch, H heads, T new positions per row, S visible key rows, d head width,
D width, V vocabulary, T_max = max_seq_len.
"""

from __future__ import annotations

import torch

from g2c.sampling.model import check_count, check_score_rows, check_token_ids

from .cache import KVCache
from .forward import forward_rows, masked_attention, masked_cached_attention, unembed

__all__ = ["RaggedKVCache", "masked_attention", "masked_cached_attention", "masked_hidden_states",
           "ragged_forward"]


class RaggedKVCache(KVCache):
    """A ``KVCache`` whose batch rows each have their own committed length.

    Same constructor, ``for_model``, buffers (``keys_buffer``/``values_buffer``, L tensors
    (B, H, T_max, d)), ``nbytes`` and ``reset`` as ``KVCache``.

    Attributes:
        lengths: (B,) int64 on the CPU, committed rows per batch row.
        length: int, ``max(lengths)``: the buffer rows any batch row uses (reads slice
            ``[:length]``; rows of a shorter row past its own length are padding, hidden by
            ``key_padding_mask``). Assigning an int sets every row to it.
    """

    # ---- per-row lengths ---------------------------------------------------------------
    @property
    def lengths(self) -> torch.Tensor:
        return self._lengths

    @lengths.setter
    def lengths(self, value) -> None:
        value = torch.as_tensor(value, dtype=torch.long).cpu().reshape(-1).clone()
        if value.numel() != self.batch_size or bool((value < 0).any()) or bool((value > self.max_seq_len).any()):
            raise ValueError(f"RaggedKVCache: lengths must be {self.batch_size} ints in [0, max_seq_len="
                             f"{self.max_seq_len}], got {value.tolist()}")
        self._lengths = value

    @property
    def length(self) -> int:
        return int(self._lengths.max()) if self.batch_size else 0

    @length.setter
    def length(self, value: int) -> None:
        self._lengths = torch.full((self.batch_size,), int(value), dtype=torch.long)

    def _per_row(self, n, name: str) -> torch.Tensor:
        """An int or (B,) ints -> (B,) int64 CPU tensor; ValueError naming ``name`` otherwise."""
        if isinstance(n, bool) or not isinstance(n, (int, torch.Tensor)):
            raise ValueError(f"RaggedKVCache.{name}: expected an int or a (B,) = ({self.batch_size},) int tensor, "
                             f"got {type(n).__name__}")
        t = torch.as_tensor(n).cpu()
        if t.dtype.is_floating_point or t.dtype == torch.bool or t.dim() > 1 or t.numel() not in (1, self.batch_size):
            raise ValueError(f"RaggedKVCache.{name}: expected an int or a (B,) = ({self.batch_size},) int tensor, "
                             f"got shape {tuple(t.shape)} dtype {t.dtype}")
        return t.long().reshape(-1).expand(self.batch_size).clone()

    def _row(self, row, name: str) -> int:
        """A batch row index as an int in [0, B); TypeError/ValueError naming ``name`` otherwise."""
        row = check_count(row, f"RaggedKVCache.{name}: row", minimum=None)
        if not 0 <= row < self.batch_size:
            raise ValueError(f"RaggedKVCache.{name}: row {row} is outside the batch [0, {self.batch_size})")
        return row

    def positions(self, num_new: int) -> torch.Tensor:
        """(B, T) int64 CPU: the positions of T new tokens per row, ``lengths[b] + t``."""
        return self._lengths.view(-1, 1) + torch.arange(num_new).view(1, -1)

    def key_padding_mask(self, num_new: int) -> torch.Tensor:
        """(B, T, S) bool with S = ``length + T``: True where query t of row b may read key j,
        i.e. ``j <= lengths[b] + t``. On the cache's device."""
        limit = self.positions(num_new).to(self.device)                                   # (B, T)
        cols = torch.arange(self.length + num_new, device=self.device)                    # (S,)
        return cols.view(1, 1, -1) <= limit.unsqueeze(-1)                                 # (B, T, S)

    def keys(self, layer: int, row: int | None = None) -> torch.Tensor:
        """Committed keys: (B, H, length, d) (shorter rows padded), or (H, lengths[row], d)."""
        if row is None:
            return super().keys(layer)
        row = self._row(row, "keys")
        return self.keys_buffer[layer][row, :, :int(self._lengths[row])]

    def values(self, layer: int, row: int | None = None) -> torch.Tensor:
        """Committed values: (B, H, length, d) (shorter rows padded), or (H, lengths[row], d)."""
        if row is None:
            return super().values(layer)
        row = self._row(row, "values")
        return self.values_buffer[layer][row, :, :int(self._lengths[row])]

    # ---- writing -----------------------------------------------------------------------
    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write row b's T new rows at ``lengths[b] ..``; return rows ``0 : length + T`` (views).

        Raises:
            ValueError: shapes not (B, H, T, d) of this cache, or ``length + T`` exceeds
                ``max_seq_len`` (``KVCache.append``'s checks and messages).
        """
        T = self._check_append(k_new, v_new, layer)
        pos = self.positions(T).to(self.device)                                           # (B, T)
        rows = torch.arange(self.batch_size, device=self.device).view(-1, 1)              # (B, 1)
        kb, vb = self.keys_buffer[layer], self.values_buffer[layer]
        kb[rows, :, pos] = k_new.transpose(1, 2).to(kb.dtype)                             # (B, T, H, d) rows
        vb[rows, :, pos] = v_new.transpose(1, 2).to(vb.dtype)
        end = self.length + T
        return kb[:, :, :end], vb[:, :, :end]                                             # (B, H, S, d)

    def advance(self, num_new) -> None:
        """Commit ``num_new`` (int, or (B,) per row) rows that ``append`` wrote.

        Raises:
            ValueError: a count < 0, or a row would pass ``max_seq_len``.
        """
        n = self._per_row(num_new, "advance")
        new = self._lengths + n
        if bool((n < 0).any()) or bool((new > self.max_seq_len).any()):
            raise ValueError(f"RaggedKVCache.advance: cannot move lengths {self._lengths.tolist()} by {n.tolist()} "
                             f"(0 <= lengths <= max_seq_len={self.max_seq_len})")
        self._lengths = new

    def crop(self, n) -> int:
        """Roll every row (int) or row b (``n[b]`` of a (B,) tensor) back to its first rows.
        A pointer move: returns 0 bytes copied.

        Raises:
            ValueError: a target length < 0 or above the row's length ("crop can only roll back").
        """
        n = self._per_row(n, "crop")
        if bool((n < 0).any()) or bool((n > self._lengths).any()):
            raise ValueError(f"RaggedKVCache.crop: per-row lengths must be in [0, lengths={self._lengths.tolist()}] "
                             f"(crop can only roll back), got {n.tolist()}")
        self._lengths = n
        return 0

    def keep(self, rows: torch.Tensor) -> int:
        """Keep only batch rows ``rows`` (int indices), in that order; finished requests
        leave the batch. Copies the buffers (index_select); returns the bytes copied.

        Raises:
            ValueError: ``rows`` not integer indices in [0, B) (a float, a bool mask, a row index
                out of range), or not 1-D; nothing is changed then.
        """
        rows = torch.as_tensor(rows).cpu()
        if rows.numel() == 0:
            rows = rows.long().reshape(0)                                    # [] (every row finished) reads as float
        if rows.dim() != 1 or rows.dtype.is_floating_point or rows.dtype.is_complex or rows.dtype == torch.bool:
            raise ValueError(f"RaggedKVCache.keep: rows must be a 1-D list of int row indices in [0, "
                             f"{self.batch_size}), got shape {tuple(rows.shape)} dtype {rows.dtype}")
        outside = [int(r) for r in rows if not 0 <= int(r) < self.batch_size]
        if outside:
            raise ValueError(f"RaggedKVCache.keep: row {outside[0]} is outside the batch [0, {self.batch_size})")
        rows = rows.long()
        idx = rows.to(self.device)
        self.keys_buffer = [t.index_select(0, idx) for t in self.keys_buffer]
        self.values_buffer = [t.index_select(0, idx) for t in self.values_buffer]
        self._lengths = self._lengths.index_select(0, rows)
        self.batch_size = int(rows.numel())
        return self.nbytes

    def __repr__(self) -> str:
        return (f"RaggedKVCache(layers={self.num_layers}, B={self.batch_size}, H={self.num_heads}, "
                f"d={self.head_dim}, lengths={self._lengths.tolist()}/{self.max_seq_len}, {self.dtype}, "
                f"{self.device}, {self.nbytes / 2**20:.2f} MiB)")


# ---- the masked cached forward ------------------------------------------------------------
# ``masked_attention`` and ``masked_cached_attention`` live with the trunk (``forward.py``'s
# ``forward_rows``) and are re-exported here, where the ragged batch first needed them.

@torch.no_grad()
def masked_hidden_states(model, ids: torch.Tensor, cache: KVCache, positions: torch.Tensor,
                         allowed: torch.Tensor) -> torch.Tensor:
    """The trunk on T new tokens with explicit positions and attention mask. No advance.

    A call of module 16's one pass, ``forward_rows(model, ids, cache, positions=positions,
    allowed=allowed)``, returning its final states.

    Args:
        model: a ``TransformerLM`` (module 09) in eval mode.
        ids: (B, T) int64 new tokens.
        cache: a ``KVCache`` (rows written at ``length ..``) or ``RaggedKVCache`` (per row).
        positions: (T,) or (B, T) int64 learned positions of the new tokens (< max_seq_len).
        allowed: bool broadcastable to (B, H, T, S), S = ``cache.length + T``.

    Returns:
        (B, T, D) final-LayerNorm states, on the model's device.

    Raises:
        ValueError: as ``forward_rows`` (bad ids, positions or mask; a cache for another
            model; more rows than the cache holds, naming ``max_seq_len``).
    """
    states, _ = forward_rows(model, ids, cache, positions=positions, allowed=allowed)
    return states


@torch.no_grad()
def ragged_forward(model, ids: torch.Tensor, cache: RaggedKVCache) -> torch.Tensor:
    """Logits (B, T, V) for T new tokens per row after each row's committed rows.

    Row b's token t sits at position ``lengths[b] + t`` and reads keys
    ``0 .. lengths[b] + t`` (``key_padding_mask``). Every row then advances by T, like
    ``cached_forward``; a right-padded row is rolled back with ``cache.crop(lengths)``.

    Args:
        model: a ``TransformerLM`` in eval mode.
        ids: (B, T) int64, right-padded where rows have fewer new tokens.
        cache: a ``RaggedKVCache`` built for this model with the same B.

    Returns:
        logits (B, T, V) on the model's device.

    Raises:
        TypeError: cache is not a ``RaggedKVCache``.
        ValueError: ids not (B, T) with T >= 1; B differs from the cache's; or
            ``max(lengths) + T`` passes ``max_seq_len`` (no sliding window: shorten the
            prompt or max_new_tokens); the logits hold NaN or a row of only -inf
            (``check_score_rows``: a broken model stops the batched loops).
    """
    if not isinstance(cache, RaggedKVCache):
        raise TypeError(f"ragged_forward needs a RaggedKVCache (RaggedKVCache.for_model(model, B)), "
                        f"got {type(cache).__name__}")
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] < 1:
        shape = tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise ValueError(f"ragged_forward: ids must be (B, T) with T >= 1, got {shape}")
    check_token_ids(ids, model.vocab_size, "ragged_forward: ids")
    B, T = ids.shape
    if B != cache.batch_size:
        raise ValueError(f"ragged_forward: ids has {B} rows but the cache {cache.batch_size}")
    if cache.length + T > min(cache.max_seq_len, model.max_seq_len):
        raise ValueError(f"ragged_forward: {cache.length} cached + {T} new positions exceed "
                         f"max_seq_len={min(cache.max_seq_len, model.max_seq_len)}; shorten the prompt or "
                         "max_new_tokens")
    h, _ = forward_rows(model, ids, cache)          # positions lengths[b] + t, the key-padding mask
    cache.advance(T)
    logits = unembed(model, h)                                                            # (B, T, V)
    check_score_rows(logits, "logits", where=f"ragged_forward ({ids.shape[1]} new tokens per row, rows now "
                                             f"{cache.lengths.tolist()} long)")
    return logits
