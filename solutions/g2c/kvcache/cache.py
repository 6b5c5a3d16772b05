"""Module 16: the KV cache, preallocated per layer, with a committed-length pointer.

During decoding every new token attends to the keys and values of all earlier tokens.
Those never change once computed (a causal model never lets an old position see a new
one), so we keep them: each layer owns a K and a V buffer of shape (B, H, T_max, d),
allocated once at the model's context window T_max = ``max_seq_len``, and a pointer
``length`` says how many rows are committed. ``append`` writes new rows after the pointer,
``advance`` moves it, and ``crop(n)`` rolls it back: rollback is a pointer move, no copy.
Rows past the pointer are invisible (every read slices ``[:length]``) and are overwritten
by the next ``append``.

Source: the cache is the "incremental decoding" of Vaswani et al., "Attention Is All You
Need" (NeurIPS 2017) as implemented in GPT-2 (``past`` / ``present``); preallocated buffers
with a pointer as in Pope et al., "Efficiently Scaling Transformer Inference" (MLSys 2023),
section 2, and vLLM's block tables (Kwon et al., SOSP 2023) for the ragged extension.

Shape letters: B batch, H heads, T time (new rows), d = D / H head width, L layers,
T_max = max_seq_len (the capacity).

Ragged rows (the extension point): every row of the batch shares one ``length`` here.
``lengths`` already returns a (B,) tensor so callers can be written against per-row
lengths; a batched-speculation cache stores that tensor instead of the int, writes row b's
new keys at ``lengths[b]`` (``index_copy_`` / ``scatter_`` along T), and hands attention a
key-padding mask ``arange(T_max) < lengths[:, None] + T`` in place of the ``[:length]``
slice. ``crop`` then takes a (B,) tensor of per-row committed lengths. That cache is
provided beside this one: ``RaggedKVCache`` in ``ragged.py``.
"""

from __future__ import annotations

import torch

from g2c.sampling.model import check_count, check_whole

__all__ = ["KVCache"]


class KVCache:
    """Per-layer key/value buffers (B, H, T_max, d) and a committed ``length`` pointer.

    Args:
        num_layers: L, one K and one V buffer per layer (>= 1).
        batch_size: B (>= 1).
        num_heads: H (>= 1).
        head_dim: d = D / H (>= 1).
        max_seq_len: T_max, the capacity in positions (the model's context window, >= 1).
        dtype: buffer dtype (default float32; use the model's parameter dtype).
        device: buffer device (default CPU).

    Attributes:
        keys_buffer, values_buffer: lists of L tensors (B, H, T_max, d). Provided for
            inspection and tests; read committed rows through ``keys(layer)``/``values(layer)``.
        length: int, committed rows (the same for every batch row).
        max_seq_len, num_layers, batch_size, num_heads, head_dim.

    Raises:
        TypeError: a size that is not an int (a float, a bool); dtype not a ``torch.dtype``.
        ValueError: a size is < 1 (the message names it); dtype not floating point; a device
            this machine cannot allocate on (an unknown name, CUDA or MPS missing).
    """

    def __init__(self, num_layers: int, batch_size: int, num_heads: int, head_dim: int, max_seq_len: int, *,
                 dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu") -> None:
        for name, value in [("num_layers", num_layers), ("batch_size", batch_size), ("num_heads", num_heads),
                            ("head_dim", head_dim), ("max_seq_len", max_seq_len)]:
            check_count(value, f"KVCache: {name}", minimum=1)
        num_layers, batch_size, num_heads, head_dim, max_seq_len = (
            int(v) for v in (num_layers, batch_size, num_heads, head_dim, max_seq_len))
        if not isinstance(dtype, torch.dtype):
            raise TypeError(f"KVCache: dtype must be a torch.dtype such as torch.float32, got {type(dtype).__name__} "
                            f"{dtype!r}")
        if not dtype.is_floating_point:
            raise ValueError(f"KVCache: dtype must be floating point (keys and values), got {dtype}")
        try:
            torch.empty(0, dtype=dtype, device=device)       # an unknown or missing device: named here, not by torch
        except (RuntimeError, AssertionError, TypeError, ValueError) as exc:
            raise ValueError(f"KVCache: cannot allocate on device {device!r} ({str(exc).splitlines()[0][:120]}); use "
                             "the model's device (KVCache.for_model(model)) or 'cpu'") from None
        self.num_layers = num_layers
        self.batch_size = batch_size
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        shape = (batch_size, num_heads, max_seq_len, head_dim)
        self.keys_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values_buffer = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.length = 0

    @classmethod
    def for_model(cls, model, batch_size: int = 1, *, max_seq_len: int | None = None,
                  dtype: torch.dtype | None = None) -> "KVCache":
        """An empty cache shaped for a ``TransformerLM`` (or anything with ``num_layers``,
        ``num_heads``, ``embedding_dim``, ``max_seq_len``), on the model's device, in the
        dtype of its token embedding unless ``dtype`` is given. ``max_seq_len`` defaults to
        the model's window and may not exceed it (learned positions stop there)."""
        window = model.max_seq_len if max_seq_len is None else max_seq_len
        if window > model.max_seq_len:
            raise ValueError(f"KVCache.for_model: max_seq_len={window} exceeds the model's window "
                             f"max_seq_len={model.max_seq_len}; learned positions end there")
        weight = model.token_embed.weight
        return cls(model.num_layers, batch_size, model.num_heads, model.embedding_dim // model.num_heads, window,
                   dtype=dtype or weight.dtype, device=weight.device)

    # ---- reading -------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.keys_buffer[0].dtype

    @property
    def device(self) -> torch.device:
        return self.keys_buffer[0].device

    @property
    def lengths(self) -> torch.Tensor:
        """(B,) int64 on the CPU: committed rows per batch row (all equal here; the ragged
        extension point, see the module docstring)."""
        return torch.full((self.batch_size,), self.length, dtype=torch.long)

    @property
    def free(self) -> int:
        """Positions still free: ``max_seq_len - length``."""
        return self.max_seq_len - self.length

    def keys(self, layer: int) -> torch.Tensor:
        """Committed keys of ``layer``: a view (B, H, length, d), no copy."""
        return self.keys_buffer[layer][:, :, :self.length]

    def values(self, layer: int) -> torch.Tensor:
        """Committed values of ``layer``: a view (B, H, length, d), no copy."""
        return self.values_buffer[layer][:, :, :self.length]

    @property
    def nbytes(self) -> int:
        """Bytes allocated by every K and V buffer: 2 · L · B · H · T_max · d · itemsize."""
        return sum(t.numel() * t.element_size() for t in self.keys_buffer + self.values_buffer)

    @property
    def bytes_per_position(self) -> int:
        """Bytes one position (one row of every layer's K and V, all batch rows) takes."""
        return self.nbytes // self.max_seq_len

    # ---- writing -------------------------------------------------------------------------
    def append(self, layer: int, k_new: torch.Tensor, v_new: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write T new rows of ``layer`` after the pointer; return every visible row.

        The pointer does not move: a forward pass appends to every layer, then calls
        ``advance(T)`` once (so all layers agree on ``length``).

        Args:
            layer: 0 <= layer < L.
            k_new, v_new: (B, H, T, d), the new positions' keys and values (cast to the
                cache dtype).

        Returns:
            (keys, values): views (B, H, length + T, d) of the buffers, the committed rows
            followed by the new ones, no copy.

        Raises:
            ValueError: shapes differ from (B, H, T, d) with this cache's B, H, d; or
                ``length + T`` exceeds ``max_seq_len`` (the message names ``max_seq_len``
                and the fix: crop the context / re-prefill the last part of the window).

        Steps:
            1. Write k_new and v_new into rows ``length : length + T`` of this layer's
               buffers (``test_kvcache_append_writes_after_pointer``).
            2. Return the views of rows ``0 : length + T`` (``test_kvcache_append_returns_visible_rows``).
        """
        T = self._check_append(k_new, v_new, layer)
        # BEGIN SOLUTION
        end = self.length + T
        self.keys_buffer[layer][:, :, self.length:end] = k_new
        self.values_buffer[layer][:, :, self.length:end] = v_new
        return self.keys_buffer[layer][:, :, :end], self.values_buffer[layer][:, :, :end]   # (B, H, end, d)
        # END SOLUTION

    def _check_append(self, k_new: torch.Tensor, v_new: torch.Tensor, layer: int | None = None) -> int:
        """``append``'s validation (layer index, shapes, capacity); returns T. Provided."""
        name = type(self).__name__
        if layer is not None:
            layer = check_whole(layer, f"{name}.append: layer must be an int in [0, {self.num_layers}), got {layer!r}",
                                low=0, high=self.num_layers - 1)
        expected = (self.batch_size, self.num_heads, self.head_dim)
        if (k_new.dim() != 4 or k_new.shape != v_new.shape
                or (k_new.shape[0], k_new.shape[1], k_new.shape[3]) != expected):
            raise ValueError(f"{name}.append: keys/values must be (B, H, T, d) = ({expected[0]}, {expected[1]}, "
                             f"T, {expected[2]}); got {tuple(k_new.shape)} and {tuple(v_new.shape)}")
        T = k_new.shape[2]
        if self.length + T > self.max_seq_len:
            raise ValueError(f"{name} is full: {self.length} committed + {T} new positions exceed "
                             f"max_seq_len={self.max_seq_len}; learned positions cannot go further. "
                             "Crop the cache or re-prefill the last part of the window into an empty cache")
        return T

    def advance(self, num_new: int) -> None:
        """Commit ``num_new`` rows that ``append`` wrote to every layer. Provided.

        Raises:
            TypeError: num_new is not an int (``2.5``, ``None``).
            ValueError: num_new < 0 or the pointer would pass ``max_seq_len``.
        """
        num_new = check_count(num_new, "KVCache.advance: num_new", minimum=None)
        if num_new < 0 or self.length + num_new > self.max_seq_len:
            raise ValueError(f"KVCache.advance: cannot move length {self.length} by {num_new} "
                             f"(0 <= length <= max_seq_len={self.max_seq_len})")
        self.length += num_new

    def crop(self, n: int) -> int:
        """Roll back to the first ``n`` rows by moving the pointer. No data moves.

        Rows ``n : old length`` stay in memory but are invisible: ``keys``/``values`` and
        ``append`` only ever read rows before the pointer (plus the rows being written),
        and the next ``append`` overwrites them.

        Args:
            n: 0 <= n <= length.

        Returns:
            The number of bytes copied: always 0 (a pointer rollback). Speculative decoding
            records it per round.

        Raises:
            ValueError: n < 0 or n > length ("crop can only roll back").

        Steps:
            1. (Validation is provided.) Move the pointer; copy nothing
               (``test_kvcache_crop_is_pointer_rollback``).
        """
        n = check_whole(n, f"KVCache.crop: n must be an int in [0, length={self.length}] (crop can only roll back), "
                           f"got {n!r}", low=0, high=self.length)
        # BEGIN SOLUTION
        self.length = n
        return 0
        # END SOLUTION

    def reset(self) -> None:
        """Forget every row (``crop(0)`` without the check). Provided."""
        self.length = 0

    def __repr__(self) -> str:
        return (f"KVCache(layers={self.num_layers}, B={self.batch_size}, H={self.num_heads}, d={self.head_dim}, "
                f"length={self.length}/{self.max_seq_len}, {self.dtype}, {self.device}, "
                f"{self.nbytes / 2**20:.2f} MiB)")
