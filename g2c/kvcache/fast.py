"""Module 16 (provided, no exercise): a fast path for the decode and verify passes.

At batch 1 a decode step multiplies one row by every weight matrix, so its cost is the
time to read the weights once; a verification pass over k + 1 rows reads the same weights,
so it should cost about the same ("verification is free"). On a CPU that only holds when the
matrix-multiply kernel treats 2-9 rows like 1: torch's default float32 product (MKL) switches
from a matrix-vector kernel (1 row) to a general kernel that re-packs the weight on every
call, so 5 rows cost 1.6-2x one row (``bench/roofline.py`` measures it on your machine).

``fast_model(model)`` returns a ``FastLM``: the same ``TransformerLM`` (module 09 weights,
read once at construction) whose leaves are swapped for fused ones. It is a BACKEND of module
16's one pass (``g2c.kvcache.forward_rows``), the way minitorch's fast ops are a backend
of its tensors: the ``FastLM`` has a ``forward_rows`` method with the trunk's signature
(positions, an attention mask, kept layers), and the trunk hands every validated call to it.
So every pass the course runs (a decode step, a k + 1 verification chain, a draft tree, a ragged
batch, a pass keeping layer states for a drafter) runs fused, and the teaching pass stays the
default and the oracle. Everything the course teaches still runs as written: module 16's
``cached_forward`` / ``cached_hidden_states``, the ``KVCache`` and its rollback, and the
speculative loops all read a ``FastLM`` like a ``TransformerLM`` (it has ``blocks``,
``token_embed``, ``pos_embed``, ``ln_final``, ``unembed``, ``hidden_states``, ``vocab_size``,
``max_seq_len``, ``device`` ...). ``unwrap(fast)`` (its ``source``) is the model it was built
from: identity checks ("was this drafter built on this target?") compare unwrapped models.

No shadow hierarchy: the ``FastLM``'s blocks are copies of the model's own blocks (same
classes) in which only the leaves are swapped: module 03's ``Linear`` -> ``PackedLinear``,
``LayerNorm`` -> torch's fused layer norm, ``GELU`` -> torch's fused (exact, erf) GELU,
``Embedding`` -> a table lookup, ``Dropout`` -> the identity (inference only). The same swap
makes ANY course ``Module`` fast: ``fast_model(head)`` on a drafter head (MTP, EAGLE, Medusa,
EAGLE-3, block) returns a copy of the head, of the same class, with swapped leaves; its
``base`` stays the teaching model it was built on. Only the per-position arithmetic changes:

* ``PackedLinear``: on a CPU with oneDNN (``torch.backends.mkldnn``), the weight is
  re-laid-out ONCE into oneDNN's blocked format for small-M products
  (``torch.ops.mkldnn._reorder_linear_weight``) and multiplied with
  ``torch.ops.mkldnn._linear_pointwise``: the cost of 1-9 rows stays close to one weight
  read. In float32 one row still goes through torch's own product (MKL's matrix-vector
  kernel is the faster one for a single row), from 2 rows on the packed weight is used
  (``PACKED_MIN_ROWS``; docs/performance.md, "Packed from two rows", measured end to end).
  Elsewhere (CUDA, MPS, a torch without oneDNN) it is ``torch.nn.functional.linear``.
* LayerNorm and GELU are torch's fused kernels (same maths: biased variance, eps 1e-5,
  exact erf GELU).
* The pass itself (``FastLM.forward_rows``, which module 16's ``forward_rows`` hands the work
  to) is a backend object, ``FastLM.step``: by default ``g2c.kvcache.step.FusedStep``, the same
  pass in as few dispatched operations as the maths allows (``step.py`` says how and how much);
  ``fast_model(..., backend="plain")`` keeps the lean loop below, ``_fused_rows``, which it
  replaced: one fused QKV product, keys/values written straight into the ``KVCache`` buffers,
  torch's fused ``scaled_dot_product_attention`` (no mask for one row; for a chain an
  explicit causal mask carrying the cache offset; for a tree or a ragged batch
  ``attn_mask=allowed``), kept layers collected on the way, no per-step validation beyond
  module 16's own. A decode step of a small model is ~100 tiny operations, so this matters
  most for drafters (``fused=False`` keeps the teaching pass and only swaps the leaves, to
  measure each part).
* ``dtype=torch.bfloat16`` is a different model, on purpose: the weight products run in
  bfloat16 (weights rounded once, inputs rounded per product; on CPUs with AVX512-BF16/AMX
  the packed bfloat16 product is both half the bytes and flat in the row count), while the
  residual stream, LayerNorm, attention, softmax and the KV cache stay float32. Its logits
  differ from float32 by bfloat16 rounding (about 1e-2 relative); greedy speculative
  decoding is lossless against IT (the target is the bfloat16 model).

Equality: in float32 a ``FastLM`` returns the teaching path's logits within 1e-5 (different
summation order inside the product kernels), and greedy outputs (plain cached decoding and
cached speculative decoding) are identical token for token
(tests/test_kvcache_fast.py, for every pass shape: prefill, one row, a k + 1 chain, a tree
mask, ragged rows, kept layers). The fast model is a snapshot: it copies/packs the weights
when built, so training the source model afterwards does not change it (build it again).

Source: the packed ("reordered") weight layout is oneDNN's inner-product primitive, the same
one torch's own CPU inference compiler (inductor, ``freezing``) uses for linear layers;
weight-stationary small-batch decoding and the memory-bound analysis: Pope et al.,
"Efficiently Scaling Transformer Inference" (MLSys 2023), section 2; the roofline model:
Williams, Waterman, Patterson (CACM 2009).

Shape letters: B batch, T new positions, D width, V vocabulary, M = B*T rows of a product.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F

from g2c.nn import GELU, Dropout, Embedding, LayerNorm, Linear, Module
from g2c.sampling.model import check_token_ids

from . import step as step_module
from .cache import KVCache
from .step import BACKENDS, CompiledStep, FusedStep

__all__ = ["FAST_DTYPES", "FastLM", "PackedLinear", "fast_model", "head_unembed", "packed_kernels_available",
           "swap_leaves", "unwrap"]

FAST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Rows from which the packed float32 weight is used (below: torch's own product, whose
# single-row matrix-vector kernel is faster on the CPUs measured; at 2-3 rows MKL's general
# kernel costs 1.5-2x one row there, the packed one about one row: docs/performance.md,
# "Packed from two rows"). bfloat16: always packed.
PACKED_MIN_ROWS = {torch.float32: 2, torch.bfloat16: 1}
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


class PackedLinear(Module):
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

    A course ``Module`` (a leaf: no parameters, nothing to train), so ``fast_model`` can put it
    where a ``Linear`` was.

    Raises:
        ValueError: weight not 2-D, bias not (out,), or dtype not one of ``FAST_DTYPES``.
    """

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, *, dtype: torch.dtype = torch.float32,
                 pack: bool = True) -> None:
        super().__init__()
        self.training = False
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

    forward = __call__

    def __repr__(self) -> str:
        return (f"PackedLinear({self.in_features}, {self.out_features}, {str(self.dtype).replace('torch.', '')}, "
                f"packed={self.packed is not None})")




class FastLayerNorm(Module):
    """Module 03's ``LayerNorm`` as torch's fused kernel (same maths: biased variance, eps). A leaf."""

    def __init__(self, ln) -> None:
        super().__init__()
        self.training = False
        self.weight, self.bias, self.eps = ln.weight.detach().clone(), ln.bias.detach().clone(), ln.eps
        self.shape = (ln.weight.shape[0],)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.shape, self.weight, self.bias, self.eps)

    forward = __call__


class FastGELU(Module):
    """Module 03's exact (erf) ``GELU`` as torch's fused kernel. A leaf."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)

    forward = __call__


class FastEmbedding(Module):
    """Module 03's ``Embedding`` as a table lookup; ids outside the vocabulary raise ValueError
    (``check_token_ids``), never a raw IndexError. A leaf."""

    def __init__(self, emb) -> None:
        super().__init__()
        self.training = False
        self.weight = emb.weight.detach().clone()
        self.num_embeddings, self.embedding_dim = self.weight.shape

    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        check_token_ids(ids, self.num_embeddings, "ids")             # as the teaching Embedding: no raw IndexError
        return F.embedding(ids, self.weight)

    forward = __call__


class _Identity(Module):
    """Dropout at inference. A leaf."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return x

    forward = __call__


def _fast_train(self, mode: bool = True):
    if mode:
        raise ValueError(f"a fast {type(self).__name__} is an inference snapshot and cannot be trained; train "
                         "the source module and call fast_model(...) again")
    return Module.train(self, False)


_FAST_CLASSES: dict[type, type] = {}


def _fast_class(cls: type) -> type:
    """A subclass of ``cls`` (same name, so isinstance checks and messages hold) for swapped
    copies: ``device`` read from the copy's tensors, ``fast_source``, training refused."""
    if cls not in _FAST_CLASSES:
        _FAST_CLASSES[cls] = type(cls.__name__, (cls,), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__,
            "device": property(lambda self: self._fast["device"]),
            "fast_source": property(lambda self: self._fast["source"]),
            "train": _fast_train,
        })
    return _FAST_CLASSES[cls]


def swap_leaves(module, *, dtype: torch.dtype, pack: bool = True):
    """A copy of a course ``Module`` with its leaves swapped for fused ones. Provided.

    ``Linear`` -> ``PackedLinear`` (products in ``dtype``), ``LayerNorm`` -> ``FastLayerNorm``,
    ``GELU`` -> ``FastGELU``, ``Embedding`` -> ``FastEmbedding``, ``Dropout`` -> the identity.
    Every other module is copied (same class: its own ``forward`` and methods run on the
    swapped leaves), with its child modules swapped and its tensors cloned (tied tensors stay
    tied; nothing keeps ``requires_grad``). Attributes that are neither modules nor tensors are
    shared, not copied: a head keeps the very ``base`` it was built on (the heads hold it
    outside their children, in a dict). The copy is in eval mode, refuses ``train(True)``, and
    its ``fast_source`` is ``module``. A draft head on a teaching base (a ``_frozen["base"]`` with a
    ``token_embed``) also gets a packed copy of that base's tied unembedding, which
    ``head_unembed`` uses: a head's logits for 2 or more rows (a tree level, Medusa's heads, a
    block of slots) cost about one row, as the target's do in a ``FastLM``.

    Args:
        module: a course ``Module`` (``g2c.nn.Module``).
        dtype: the products' dtype (one of ``FAST_DTYPES``).
        pack: use oneDNN's packed weights where available.

    Returns:
        The swapped copy (a leaf's replacement when ``module`` is itself a leaf).

    Raises:
        TypeError: module is not a course ``Module``.
    """
    if not isinstance(module, Module):
        raise TypeError(f"swap_leaves needs a course Module (g2c.nn.Module), got {type(module).__name__}")
    memo: dict[int, object] = {}

    def tensor(t: torch.Tensor) -> torch.Tensor:
        if id(t) not in memo:
            memo[id(t)] = t.detach().clone()
        return memo[id(t)]

    def swap(mod):
        if id(mod) in memo:
            return memo[id(mod)]
        if isinstance(mod, Linear):
            new = PackedLinear(mod.weight, mod.bias, dtype=dtype, pack=pack)
        elif isinstance(mod, LayerNorm):
            new = FastLayerNorm(mod)
        elif isinstance(mod, GELU):
            new = FastGELU()
        elif isinstance(mod, Embedding):
            new = FastEmbedding(mod)
        elif isinstance(mod, Dropout):
            new = _Identity()
        elif isinstance(mod, (PackedLinear, FastLayerNorm, FastGELU, FastEmbedding, _Identity)):
            new = mod
        else:
            new = copy.copy(mod)
            new.__class__ = _fast_class(type(mod))
            memo[id(mod)] = new
            device = None
            for name, value in vars(mod).items():
                if isinstance(value, Module):
                    setattr(new, name, swap(value))
                elif isinstance(value, (list, tuple)) and any(isinstance(v, (Module, torch.Tensor)) for v in value):
                    items = [swap(v) if isinstance(v, Module) else tensor(v) if isinstance(v, torch.Tensor) else v
                             for v in value]
                    setattr(new, name, type(value)(items) if isinstance(value, tuple) else items)
                elif isinstance(value, torch.Tensor):
                    setattr(new, name, tensor(value))
                    device = device or value.device
            new._fast = {"source": mod, "device": device or _first_device(new)}
            new.training = False
        memo[id(mod)] = new
        return new

    out = swap(module)
    frozen = getattr(module, "_frozen", None)
    base = frozen.get("base") if isinstance(frozen, dict) else None
    weight = getattr(getattr(base, "token_embed", None), "weight", None)
    if isinstance(weight, torch.Tensor) and getattr(base, "fast_source", None) is None \
            and isinstance(getattr(out, "_fast", None), dict):
        out._fast["unembed"] = PackedLinear(weight, None, dtype=dtype, pack=pack)   # a snapshot, like the leaves
    return out


def head_unembed(head, h: torch.Tensor) -> torch.Tensor:
    """A draft head's logits through its base's tied unembedding: (..., D) -> (..., V). Provided.

    On a ``fast_model`` copy of the head, the packed snapshot of the base's embedding table that
    ``swap_leaves`` made (products in the fast copy's dtype, returned in h's dtype); on a teaching
    head, module 16's ``unembed(head.base, h)``. The heads' ``logits`` methods call it, so the same
    head code runs on both paths (float32: equal within 1e-5).
    """
    fast = getattr(head, "_fast", None)
    packed = fast.get("unembed") if isinstance(fast, dict) else None
    if packed is not None:
        return packed(h)
    from .forward import unembed

    return unembed(head.base, h)


def _first_device(module) -> torch.device:
    """The device of the first tensor found in a swapped copy (CPU when it holds none)."""
    for _, mod in module.named_modules():
        for value in vars(mod).values():
            if isinstance(value, torch.Tensor):
                return value.device
    return torch.device("cpu")


def unwrap(model):
    """The teaching model behind a fast one: ``FastLM.source`` or a swapped copy's source; any
    other object is returned as it is. Provided.

    Identity checks ("was this drafter built on this target?") compare ``unwrap(a) is
    unwrap(b)``, so a fast target never refuses a drafter built on its source.
    """
    source = getattr(model, "fast_source", None)
    return model if source is None else source


class FastLM:
    """A ``TransformerLM`` snapshot with fused leaves and the fused trunk, for inference. Provided.

    Build it with ``fast_model(model, dtype=...)``. Every module 16 function and every
    cached loop that takes a ``TransformerLM`` takes a ``FastLM`` (``cached_forward``,
    ``cached_generate``, ``forward_rows``, ``KVCache.for_model``, the Beyond side's targets and
    cached speculative loops); calling it on (B, T) ids returns (B, T, V) logits like the model
    (run through module 16's cached path on a fresh cache).

    Attributes:
        source: the ``TransformerLM`` it was built from (every tensor is copied from it);
            ``fast_source`` is the same (what ``unwrap`` reads).
        pack, fused: the ``fast_model`` switches it was built with; ``backend_asked`` its backend.
        step: the backend object module 16's ``forward_rows`` hands its calls to
            (``g2c.kvcache.step.FusedStep`` by default, a ``CompiledStep`` for ``backend="compiled"``),
            None for ``backend="plain"`` (the lean loop ``_fused_rows``) or ``fused=False``.
        backend_note: "" when the asked backend runs; else one line saying why it does not and
            what runs instead (``backend="compiled"`` without a C++ compiler: the fused step).
        dtype: the weight products' dtype; ``stream_dtype`` the residual stream's (the
            source's parameter dtype; the KV cache uses it).
        vocab_size, embedding_dim, num_layers, num_heads, hidden_dim, max_seq_len, device,
        token_embed, pos_embed, blocks, ln_final (the source's own classes with swapped
        leaves, see ``swap_leaves``), training (always False: inference only).
        weight_bytes: bytes one decode step reads from the weight products (roofline).

    Raises:
        TypeError: from ``fast_model``.
    """

    def __init__(self, model, dtype: torch.dtype, pack: bool = True, fused: bool = True,
                 backend: str = "auto") -> None:
        self.source = model
        self.pack, self.fused = pack, fused
        self.dtype = dtype
        self.stream_dtype = model.token_embed.weight.dtype
        for name in ("vocab_size", "embedding_dim", "num_layers", "num_heads", "max_seq_len"):
            setattr(self, name, getattr(model, name))
        self.hidden_dim = getattr(model, "hidden_dim", 4 * model.embedding_dim)
        if backend == "compiled":           # Inductor lowers plain products only (step.CompiledStep)
            pack = False
        parts = swap_leaves(_Parts(model), dtype=dtype, pack=pack)     # one swap: tied tensors stay tied
        self.token_embed, self.pos_embed, self.ln_final = parts.token_embed, parts.pos_embed, parts.ln_final
        self.blocks = list(parts.blocks)
        self._unembed = PackedLinear(model.token_embed.weight, None, dtype=dtype, pack=pack)   # tied, no bias
        self.training = False
        self.backend_asked = backend
        self.step, self.backend_note = _build_backend(self, backend)

    @property
    def fast_source(self):
        return self.source

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
    def forward_rows(self):
        """Module 16's ``forward_rows`` hands every validated call to this when present: the
        backend object ``step`` (the fused step by default), or the lean loop ``_fused_rows`` with
        ``backend="plain"`` (None when built with ``fused=False``: the teaching pass then runs on
        the swapped leaves)."""
        if not self.fused:
            return None
        return self._fused_rows if self.step is None else self.step

    def _fused_rows(self, ids: torch.Tensor, cache, *, positions: torch.Tensor | None = None,
                    allowed: torch.Tensor | None = None,
                    keep_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``forward_rows`` fused: (states (B, T, D), kept (B, T, L, D) | None). The caller
        (module 16's ``forward_rows``) validated everything and runs it under ``torch.no_grad``.
        Writes the new rows' keys/values after the pointer (straight into a plain ``KVCache``'s
        buffers; through ``append`` for a ``RaggedKVCache``), never moves it. Same maths as the
        teaching pass: embeddings at ``positions`` (default ``length ...``); per block
        LayerNorm, one fused QKV product, attention over the visible rows with torch's fused
        kernel (no mask for one causal row, the causal mask with the cache offset for a chain,
        ``allowed`` when given), output projection, LayerNorm, MLP; final LayerNorm."""
        dev = self.device
        ids = ids.to(dev)
        check_token_ids(ids, self.vocab_size, "ids")                           # as the teaching path: no raw IndexError
        B, T = ids.shape
        start, end = cache.length, cache.length + T
        H, D = self.num_heads, self.embedding_dim
        if positions is None:
            x = F.embedding(ids, self.token_embed.weight) + self.pos_embed.weight[start:end]    # (B, T, D)
        else:
            x = F.embedding(ids, self.token_embed.weight) + F.embedding(positions.to(dev), self.pos_embed.weight)
        if allowed is not None:
            mask = allowed.to(dev)                                      # (..., T, S) bool
        elif T > 1:            # query i (position start + i) sees keys 0 .. start + i
            mask = torch.ones(T, end, dtype=torch.bool, device=dev).tril(diagonal=start)
        else:
            mask = None
        direct = type(cache) is KVCache                                 # one shared length: write in place
        saved = {}
        for layer, blk in enumerate(self.blocks):
            attn, mlp = blk.attn, blk.mlp
            q, k, v = attn.qkv(blk.ln_1(x)).view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4)  # (B, H, T, d) each
            if direct:
                keys, values = cache.keys_buffer[layer], cache.values_buffer[layer]
                keys[:, :, start:end] = k
                values[:, :, start:end] = v
                keys, values = keys[:, :, :end], values[:, :, :end]
            else:
                keys, values = cache.append(layer, k, v)
            y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
            x = x + attn.proj(y.transpose(1, 2).reshape(B, T, D))
            x = x + mlp.proj(F.gelu(mlp.fc(blk.ln_2(x))))
            if keep_layers and layer in keep_layers:
                saved[layer] = x
        kept = torch.stack([saved[i] for i in keep_layers], dim=2) if keep_layers else None
        return self.ln_final(x), kept

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
        if self.step is not None:
            return self.step.unembed(h)
        return self._unembed(h)

    @torch.no_grad()
    def hidden_states(self, ids: torch.Tensor) -> torch.Tensor:
        """Final states (B, T, D) for ids (B, T), T <= max_seq_len, like
        ``TransformerLM.hidden_states``: module 16's trunk on a fresh cache (raises what
        ``forward_rows`` raises for bad ids)."""
        from .forward import forward_rows

        if not isinstance(ids, torch.Tensor) or ids.dim() != 2:
            raise ValueError(f"FastLM expects integer ids of shape (B, T); got "
                             f"{tuple(ids.shape) if isinstance(ids, torch.Tensor) else type(ids).__name__}")
        cache = KVCache.for_model(self, batch_size=ids.shape[0], max_seq_len=max(1, min(self.max_seq_len,
                                                                                          ids.shape[1])))
        return forward_rows(self, ids, cache)[0]

    @torch.no_grad()
    def __call__(self, ids: torch.Tensor) -> torch.Tensor:
        """Logits (B, T, V) for ids (B, T), T <= max_seq_len, via module 16's cached path on a
        fresh cache (raises what ``cached_forward`` raises for bad ids)."""
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


def _build_backend(fast: "FastLM", backend: str):
    """(the step object the trunk hands its calls to, or None for the lean loop; one line saying why
    the asked backend does not run, or "")."""
    if backend not in BACKENDS:
        raise ValueError(f"fast_model: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if not fast.fused or backend == "plain":
        return None, ""
    step = FusedStep(fast)
    if backend != "compiled":
        return step, ""
    problem = step_module.compile_problem(fast.device)
    if problem is not None:
        return step, f"backend 'compiled' unavailable ({problem}): the fused eager step runs"
    return CompiledStep(step), ""


class _Parts(Module):
    """The four parts of a ``TransformerLM`` the trunk reads, swapped together by one ``swap_leaves``."""

    def __init__(self, model) -> None:
        super().__init__()
        self.token_embed, self.pos_embed, self.ln_final = model.token_embed, model.pos_embed, model.ln_final
        self.blocks = list(model.blocks)


_LM_NEEDS = ("blocks", "token_embed", "pos_embed", "ln_final", "num_layers", "num_heads", "embedding_dim",
             "vocab_size", "max_seq_len")
_DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
                "float16": torch.float16, "fp16": torch.float16}


def fast_model(model, *, dtype: torch.dtype | str | None = None, pack: bool = True, fused: bool = True,
               backend: str = "auto"):
    """The fast path of a ``TransformerLM`` (a ``FastLM``) or of any course ``Module``. Provided.

    Args:
        model: a module 09 ``TransformerLM`` (anything with ``blocks`` of pre-norm blocks,
            ``token_embed``, ``pos_embed``, ``ln_final``, ``num_layers``, ``num_heads``,
            ``embedding_dim``, ``vocab_size``, ``max_seq_len``), on any device, in eval mode
            for inference: returns a ``FastLM``. Any other course ``Module`` (a drafter head:
            ``MTPHead``, EAGLE's ``FeatureDrafter``, ``MedusaHeads``, the EAGLE-3 and block
            heads): returns its ``swap_leaves`` copy (same class, fused leaves, same ``base``).
            A fast model is returned unchanged when its switches match (else rebuilt from its
            source).
        dtype: dtype of the weight products: None (the model's own), ``torch.float32``
            (equal to the teaching path within 1e-5), ``torch.bfloat16`` (its own model,
            see the module docstring) or ``torch.float16``; or their names as strings
            ("float32", "bfloat16", "float16", also "fp32", "bf16", "fp16").
        pack: False keeps torch's plain product (for measuring what the packing buys).
        backend: which pass the trunk hands over to (``fused=True``): ``"auto"`` / ``"fused"``
            (default: ``g2c.kvcache.step.FusedStep``, the pass in few dispatches), ``"plain"`` (the
            lean loop it replaced, kept to measure against), ``"compiled"`` (the fused step under
            ``torch.compile``; products unpacked; where it cannot compile, the fused step runs and
            ``backend_note`` says why). On a head: whether its blocks run on the fused block step
            (``g2c.kvcache.step.block_step``; ``"plain"``: the teaching block on fast leaves).
        fused: True (default): module 16's ``forward_rows`` hands the pass to the FastLM's own
            lean loop (torch's fused attention, keys/values written in place); False: the
            teaching pass runs, only on the swapped leaves. (Heads have no trunk: ignored.)

    Returns:
        A ``FastLM`` (or a swapped copy) on the model's device. The weights are copied (and
        packed) now: later changes to ``model`` do not reach it.

    Raises:
        TypeError: ``model`` is neither a ``TransformerLM`` nor a course ``Module`` (names
            the ``TransformerLM`` attributes it lacks).
        TypeError: ``dtype`` neither a ``torch.dtype``, a string nor None ("dtype must be a torch.dtype").
        ValueError: an unknown dtype (lists the accepted ones); an unknown backend ("backend must
            be one of auto, fused, compiled, plain").
    """
    if dtype is not None and not isinstance(dtype, (str, torch.dtype)):
        raise TypeError(f"fast_model: dtype must be a torch.dtype, a name such as 'bfloat16' or None, "
                        f"got {type(dtype).__name__} {dtype!r}")
    if isinstance(dtype, str):
        if dtype.lower() not in _DTYPE_NAMES:
            raise ValueError(f"fast_model: unknown dtype {dtype!r}; use one of {', '.join(_DTYPE_NAMES)}")
        dtype = _DTYPE_NAMES[dtype.lower()]
    if isinstance(model, FastLM):
        if dtype in (None, model.dtype) and pack == model.pack and fused == model.fused \
                and backend == model.backend_asked:
            return model
        model = model.source
    elif getattr(model, "fast_source", None) is not None:               # a swapped head
        if dtype in (None, model._fast.get("dtype")) and pack == model._fast.get("pack", True) \
                and backend == model._fast.get("backend", "auto"):
            return model
        model = model.fast_source
    missing = [name for name in _LM_NEEDS if not hasattr(model, name)]
    if missing and not isinstance(model, Module):
        raise TypeError(f"fast_model needs a TransformerLM or a course Module (a drafter head); "
                        f"{type(model).__name__} lacks {', '.join(missing)}")
    if dtype is None:
        dtype = model.token_embed.weight.dtype if not missing else _first_float_dtype(model)
    if dtype not in FAST_DTYPES:
        raise ValueError(f"fast_model: dtype must be one of {', '.join(str(d) for d in FAST_DTYPES)}, got {dtype!r}")
    if not missing:
        return FastLM(model, dtype, pack, fused, backend)
    if backend not in BACKENDS:
        raise ValueError(f"fast_model: backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    fast = swap_leaves(model, dtype=dtype, pack=pack)
    for _, mod in fast.named_modules():                # every swapped block reads the head's backend
        if isinstance(getattr(mod, "_fast", None), dict):
            mod._fast["backend"] = backend
    if hasattr(fast, "_fast"):
        fast._fast.update(dtype=dtype, pack=pack)
    return fast


def _first_float_dtype(module) -> torch.dtype:
    for _, mod in module.named_modules():
        for value in vars(mod).values():
            if isinstance(value, torch.Tensor) and value.is_floating_point():
                return value.dtype
    return torch.float32
