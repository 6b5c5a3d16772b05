"""Module 16 (provided, no exercise): a fast path for the decode and verify passes.

At batch 1 a decode step multiplies one row by every weight matrix, so its cost is the
time to read the weights once; a verification pass over k + 1 rows reads the same weights,
so it should cost about the same ("verification is free"). On a CPU that only holds when the
matrix-multiply kernel treats 2-9 rows like 1: torch's default float32 product (MKL) switches
from a matrix-vector kernel (1 row) to a general kernel that re-packs the weight on every
call, so 5 rows cost 1.6-2x one row (``bench/roofline.py`` measures it on your machine).

``fast_model(model)`` returns a ``FastLM``: the same ``TransformerLM`` (module 09 weights,
read once at construction) whose linear layers are ``PackedLinear`` s. Everything the course
teaches still runs as written: module 16's ``cached_forward`` / ``cached_hidden_states``,
the ``KVCache`` and its rollback, module 07's attention and the speculative loops all read a
``FastLM`` exactly like a ``TransformerLM`` (it has ``blocks``, ``token_embed``,
``pos_embed``, ``ln_final``, ``unembed``, ``vocab_size``, ``max_seq_len``, ``device`` ...).
Only the per-position arithmetic changes:

* ``PackedLinear``: on a CPU with oneDNN (``torch.backends.mkldnn``), the weight is
  re-laid-out ONCE into oneDNN's blocked format for small-M products
  (``torch.ops.mkldnn._reorder_linear_weight``) and multiplied with
  ``torch.ops.mkldnn._linear_pointwise``: the cost of 1-9 rows stays close to one weight
  read. In float32 one row still goes through torch's own product (MKL's matrix-vector
  kernel is the faster one for a single row), from 4 rows on the packed weight is used.
  Elsewhere (CUDA, MPS, a torch without oneDNN) it is ``torch.nn.functional.linear``.
* LayerNorm and GELU are torch's fused kernels (same maths: biased variance, eps 1e-5,
  exact erf GELU).
* The pass itself (``FastLM.cached_hidden_states``, which module 16's
  ``cached_hidden_states`` hands the work to when a model has one): one fused QKV product,
  keys/values written straight into the ``KVCache`` buffers, torch's fused
  ``scaled_dot_product_attention`` with an explicit causal mask carrying the cache offset,
  no per-step validation beyond module 16's own. A decode step of a small model is ~100
  tiny operations, so this matters most for drafters (``fused=False`` keeps the teaching
  pass and only packs the products, to measure each part).
* ``dtype=torch.bfloat16`` is a different model, on purpose: the weight products run in
  bfloat16 (weights rounded once, inputs rounded per product; on CPUs with AVX512-BF16/AMX
  the packed bfloat16 product is both half the bytes and flat in the row count), while the
  residual stream, LayerNorm, attention, softmax and the KV cache stay float32. Its logits
  differ from float32 by bfloat16 rounding (about 1e-2 relative); greedy speculative
  decoding is lossless against IT (the target is the bfloat16 model).

Equality: in float32 a ``FastLM`` returns the teaching path's logits within 1e-5 (different
summation order inside the product kernels), and greedy outputs (plain cached decoding and
cached speculative decoding) are identical token for token
(tests/test_kvcache_fast.py). The fast model is a snapshot: it copies/packs the weights
when built, so training the source model afterwards does not change it (build it again).

Source: the packed ("reordered") weight layout is oneDNN's inner-product primitive, the same
one torch's own CPU inference compiler (inductor, ``freezing``) uses for linear layers;
weight-stationary small-batch decoding and the memory-bound analysis: Pope et al.,
"Efficiently Scaling Transformer Inference" (MLSys 2023), section 2; the roofline model:
Williams, Waterman, Patterson (CACM 2009).

Shape letters: B batch, T new positions, D width, V vocabulary, M = B*T rows of a product.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from g2c.sampling.model import check_token_ids

__all__ = ["FAST_DTYPES", "FastLM", "PackedLinear", "fast_model", "packed_kernels_available"]

FAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Rows from which the packed float32 weight is used (below: torch's own product, whose
# single-row matrix-vector kernel is faster on the CPUs measured). bfloat16: always packed.
PACKED_MIN_ROWS = {torch.float32: 4, torch.bfloat16: 1}
# The row count oneDNN is told to expect when it chooses the packed layout.
PACK_ROWS = 4


def _packing_works(dtype: torch.dtype) -> bool:
    """True when oneDNN's reorder + linear run for ``dtype`` here and agree with F.linear."""
    if not torch.backends.mkldnn.is_available() or dtype not in PACKED_MIN_ROWS:
        return False
    try:
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(16, 32, generator=gen).to(dtype)
        b = torch.randn(16, generator=gen).to(dtype)
        x = torch.randn(5, 32, generator=gen).to(dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
        ref = F.linear(x.float(), w.float(), b.float())
        return bool(torch.allclose(y.float(), ref, rtol=2e-2, atol=2e-2))
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


_PACKING: dict[torch.dtype, bool] = {}


def packed_kernels_available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether ``PackedLinear`` can use oneDNN's packed weights for ``dtype`` on this CPU
    (probed once per dtype with a tiny product; False on a torch built without oneDNN)."""
    if dtype not in _PACKING:
        _PACKING[dtype] = _packing_works(dtype)
    return _PACKING[dtype]


class PackedLinear:
    """y = x Wᵀ + b with W prepared once for small-M products. Provided.

    Args:
        weight: (out, in) float tensor (a module 03 ``Linear.weight`` or the tied
            embedding), copied/converted to ``dtype`` once.
        bias: (out,) or None.
        dtype: the product's dtype (float32, bfloat16 or float16).
        pack: use oneDNN's packed layout when the weight is on the CPU and
            ``packed_kernels_available(dtype)`` (default True).

    Calling it: x (..., in) in any float dtype -> (..., out) in x's dtype; inputs are
    rounded to ``dtype`` for the product when they differ.

    Raises:
        ValueError: weight not 2-D, bias not (out,), or dtype not one of ``FAST_DTYPES``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, dtype: torch.dtype = torch.float32,
                 pack: bool = True) -> None:
        if dtype not in FAST_DTYPES:
            raise ValueError(f"PackedLinear: dtype must be one of {FAST_DTYPES}, got {dtype!r}")
        if weight.dim() != 2 or (bias is not None and bias.shape != weight.shape[:1]):
            raise ValueError(f"PackedLinear: weight must be (out, in) and bias (out,); got {tuple(weight.shape)} "
                             f"and {None if bias is None else tuple(bias.shape)}")
        self.dtype = dtype
        self.out_features, self.in_features = weight.shape
        w = weight.detach().to(dtype).contiguous().clone()           # a snapshot, never a view of the model
        self.bias = None if bias is None else bias.detach().to(dtype).contiguous().clone()
        self.packed = None
        self.min_packed_rows = PACKED_MIN_ROWS.get(dtype, 1)
        if pack and w.device.type == "cpu" and packed_kernels_available(dtype):
            self.packed = torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)
        # The plain weight serves the rows the packed kernel does not (all of them off-CPU).
        self.weight = w if self.packed is None or self.min_packed_rows > 1 else None

    @property
    def nbytes(self) -> int:
        """Bytes one product reads from the weight and bias (the roofline's numerator)."""
        n = self.out_features * self.in_features + (self.out_features if self.bias is not None else 0)
        return n * torch.empty((), dtype=self.dtype).element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        lead = x.shape[:-1]
        xin = x.reshape(-1, self.in_features)                                   # (M, in)
        if xin.dtype != self.dtype:
            xin = xin.to(self.dtype)
        if self.packed is not None and xin.shape[0] >= self.min_packed_rows:
            y = torch.ops.mkldnn._linear_pointwise(xin, self.packed, self.bias, "none", [], "")
        else:
            y = F.linear(xin, self.weight, self.bias)                           # (M, out)
        return y.reshape(*lead, self.out_features).to(x.dtype)


class _Table:
    """An embedding table snapshot: ``weight`` (N, D) and a lookup."""

    def __init__(self, emb) -> None:
        self.weight = emb.weight.detach().clone()

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.weight.shape[0], "ids")                      # the teaching Embedding's check
        return F.embedding(ids, self.weight)


class _FastLayerNorm:
    def __init__(self, ln) -> None:
        self.weight, self.bias, self.eps = ln.weight.detach().clone(), ln.bias.detach().clone(), ln.eps
        self.shape = (ln.weight.shape[0],)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)


class _FastMLP:
    def __init__(self, mlp, dtype: torch.dtype, pack: bool) -> None:
        self.fc = PackedLinear(mlp.fc.weight, mlp.fc.bias, dtype=dtype, pack=pack)
        self.proj = PackedLinear(mlp.proj.weight, mlp.proj.bias, dtype=dtype, pack=pack)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))                                    # exact (erf) GELU


class _FastAttention:
    """What module 16's ``cached_attention`` reads: ``qkv``, ``proj``, ``num_heads``, ``dim``."""

    def __init__(self, attn, dtype: torch.dtype, pack: bool) -> None:
        self.qkv = PackedLinear(attn.qkv.weight, attn.qkv.bias, dtype=dtype, pack=pack)   # fused Q, K, V
        self.proj = PackedLinear(attn.proj.weight, attn.proj.bias, dtype=dtype, pack=pack)
        self.num_heads, self.dim = attn.num_heads, attn.dim


class _FastBlock:
    def __init__(self, blk, dtype: torch.dtype, pack: bool) -> None:
        self.attn = _FastAttention(blk.attn, dtype, pack)
        self.ln_1, self.ln_2 = _FastLayerNorm(blk.ln_1), _FastLayerNorm(blk.ln_2)
        self.mlp = _FastMLP(blk.mlp, dtype, pack)


class FastLM:
    """A ``TransformerLM`` snapshot with packed weight products, for inference. Provided.

    Build it with ``fast_model(model, dtype=...)``. Every module 16 function and every
    cached loop that takes a ``TransformerLM`` takes a ``FastLM`` (``cached_forward``,
    ``cached_generate``, ``KVCache.for_model``, the Beyond side's ``CachedScorer`` and cached speculative
    loops); calling it on (B, T) ids returns (B, T, V) logits like the model (run through
    module 16's cached path on a fresh cache).

    Attributes:
        source: the ``TransformerLM`` it was built from (every tensor is copied from it).
        pack, fused: the ``fast_model`` switches it was built with.
        dtype: the weight products' dtype; ``stream_dtype`` the residual stream's (the
            source's parameter dtype; the KV cache uses it).
        vocab_size, embedding_dim, num_layers, num_heads, hidden_dim, max_seq_len, device,
        token_embed, pos_embed, blocks, ln_final, training (always False: inference only).
        weight_bytes: bytes one decode step reads from the weight products (roofline).

    Raises:
        TypeError: from ``fast_model``.
    """

    def __init__(self, model, dtype: torch.dtype, pack: bool = True, fused: bool = True) -> None:
        self.source = model
        self.pack, self.fused = pack, fused
        self.dtype = dtype
        self.stream_dtype = model.token_embed.weight.dtype
        for name in ("vocab_size", "embedding_dim", "num_layers", "num_heads", "max_seq_len"):
            setattr(self, name, getattr(model, name))
        self.hidden_dim = getattr(model, "hidden_dim", 4 * model.embedding_dim)
        self.token_embed, self.pos_embed = _Table(model.token_embed), _Table(model.pos_embed)
        self.blocks = [_FastBlock(blk, dtype, pack) for blk in model.blocks]
        self.ln_final = _FastLayerNorm(model.ln_final)
        self._unembed = PackedLinear(model.token_embed.weight, None, dtype=dtype, pack=pack)   # tied, no bias
        self.training = False

    @property
    def device(self) -> torch.device:
        return self.token_embed.weight.device

    @property
    def packed(self) -> bool:
        """True when the weight products use oneDNN's packed layout."""
        return self._unembed.packed is not None

    @property
    def weight_bytes(self) -> int:
        linears = [self._unembed] + [lin for b in self.blocks for lin in (b.attn.qkv, b.attn.proj, b.mlp.fc,
                                                                          b.mlp.proj)]
        return sum(lin.nbytes for lin in linears)

    @property
    def cached_hidden_states(self):
        """Module 16's ``cached_hidden_states`` calls this when present: the lean pass
        ``_fused_pass`` (None when built with ``fused=False``: the teaching pass then runs
        on the packed products)."""
        return self._fused_pass if self.fused else None

    @torch.no_grad()
    def _fused_pass(self, ids: torch.Tensor, cache) -> torch.Tensor:
        """Final states (B, T, D) of T new tokens; appends their keys/values and advances the
        cache by T. Same maths as module 16's pass (the caller validated ids and cache):
        embeddings at positions ``length ...``; per block LayerNorm, one fused QKV product,
        keys/values written into the cache's buffers in place, attention over the visible
        rows with torch's fused kernel (an explicit causal mask with the cache offset when
        T > 1), output projection, LayerNorm, MLP; final LayerNorm."""
        ids = ids.to(self.device)
        check_token_ids(ids, self.vocab_size, "ids")                           # as the teaching path: no raw IndexError
        B, T = ids.shape
        start, end = cache.length, cache.length + T
        H, D = self.num_heads, self.embedding_dim
        x = F.embedding(ids, self.token_embed.weight) + self.pos_embed.weight[start:end]      # (B, T, D)
        mask = None
        if T > 1:      # query i (position start + i) sees keys 0 .. start + i
            mask = torch.ones(T, end, dtype=torch.bool, device=x.device).tril(diagonal=start)
        for layer, blk in enumerate(self.blocks):
            h = blk.ln_1(x)
            q, k, v = blk.attn.qkv(h).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)         # (B, H, T, d) each
            keys, values = cache.keys_buffer[layer], cache.values_buffer[layer]
            keys[:, :, start:end] = k
            values[:, :, start:end] = v
            y = F.scaled_dot_product_attention(q, keys[:, :, :end], values[:, :, :end], attn_mask=mask)
            x = x + blk.attn.proj(y.transpose(1, 2).reshape(B, T, D))
            x = x + blk.mlp(blk.ln_2(x))
        cache.advance(T)
        return self.ln_final(x)

    def train(self, mode: bool = True) -> "FastLM":
        """Inference only: ``train(False)`` is accepted (the loops' ``eval_mode``), True is refused.

        Raises:
            ValueError: mode is True (a FastLM cannot be trained; train the source model and
                build a new one).
        """
        if mode:
            raise ValueError("a FastLM is an inference snapshot and cannot be trained; train the source "
                             "TransformerLM and call fast_model(model) again")
        return self

    def eval(self) -> "FastLM":
        return self

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        """Tied unembedding (..., D) -> logits (..., V) in h's dtype (packed product, no bias)."""
        return self._unembed(h)

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) for ids (B, T), T <= max_seq_len, via module 16's cached path on a
        fresh cache (raises what ``cached_forward`` raises for bad ids)."""
        from .cache import KVCache
        from .forward import cached_forward

        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise ValueError(f"FastLM expects integer ids of shape (B, T); got "
                             f"{tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__}")
        cache = KVCache.for_model(self, batch_size=ids.shape[0], max_seq_len=max(1, min(self.max_seq_len,
                                                                                          ids.shape[1])))
        return cached_forward(self, ids, cache)

    def __repr__(self) -> str:
        return (f"FastLM({type(self.source).__name__}, products={str(self.dtype).replace('torch.', '')}, "
                f"stream={str(self.stream_dtype).replace('torch.', '')}, packed={self.packed}, "
                f"{self.weight_bytes / 1e6:.1f} MB per step)")


def fast_model(model, *, dtype: torch.dtype | str | None = None, pack: bool = True, fused: bool = True) -> FastLM:
    """The fast path of a ``TransformerLM``: a ``FastLM`` with the same interface. Provided.

    Args:
        model: a module 09 ``TransformerLM`` (anything with ``blocks`` of pre-norm blocks,
            ``token_embed``, ``pos_embed``, ``ln_final``, ``num_layers``, ``num_heads``,
            ``embedding_dim``, ``vocab_size``, ``max_seq_len``), on any device, in eval mode
            for inference. A ``FastLM`` is returned unchanged when its dtype matches.
        dtype: dtype of the weight products: None (the model's own), ``torch.float32``
            (equal to the teaching path within 1e-5), ``torch.bfloat16`` (its own model,
            see the module docstring) or ``torch.float16``; or their names as strings
            ("float32", "bfloat16", "float16", also "fp32", "bf16", "fp16").
        pack: False keeps torch's plain product (for measuring what the packing buys).
        fused: True (default): module 16's ``cached_hidden_states`` hands the pass to the
            FastLM's own lean loop (torch's fused attention, keys/values written in place);
            False: the teaching pass runs, only its products are packed.

    Returns:
        A ``FastLM`` on the model's device. The weights are copied (and packed) now: later
        changes to ``model`` do not reach it.

    Raises:
        TypeError: ``model`` lacks the ``TransformerLM`` attributes (names them).
        ValueError: an unknown dtype (lists the accepted ones).
    """
    names = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
             "float16": torch.float16, "fp16": torch.float16}
    if isinstance(dtype, str):
        if dtype.lower() not in names:
            raise ValueError(f"fast_model: unknown dtype {dtype!r}; use one of {', '.join(names)}")
        dtype = names[dtype.lower()]
    if isinstance(model, FastLM):
        if dtype in (None, model.dtype) and pack == model.pack and fused == model.fused:
            return model
        model = model.source
    needed = ("blocks", "token_embed", "pos_embed", "ln_final", "num_layers", "num_heads", "embedding_dim",
              "vocab_size", "max_seq_len")
    missing = [name for name in needed if not hasattr(model, name)]
    if missing:
        raise TypeError(f"fast_model needs a TransformerLM; {type(model).__name__} lacks {', '.join(missing)}")
    dtype = model.token_embed.weight.dtype if dtype is None else dtype
    if dtype not in FAST_DTYPES:
        raise ValueError(f"fast_model: dtype must be one of {', '.join(str(d) for d in FAST_DTYPES)}, got {dtype!r}")
    return FastLM(model, dtype, pack, fused)
