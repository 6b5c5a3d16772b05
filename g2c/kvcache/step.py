"""Module 16 (provided, no exercise): the fast path's step with the per-operation cost taken out.

At batch 1 a decode step of a small model is a few dozen weight products and a few hundred
small operations around them (LayerNorms, the attention of one row, GELU, residual adds, the
writes into the cache, the views between them). The products read the weights and cost what
the memory bus allows; every other operation costs its dispatch: a few microseconds of Python
and of torch's dispatcher each, whatever its size. Measured on one StoryLM-30M step of the
fast path before this file (``fast.py``'s lean loop, 1 thread, a 2-core Xeon): 306 dispatched
operations, the 37 products about 8 ms of an 11.2 ms float32 step and about 4 ms of a 9.3 ms
bfloat16 step (72 of its 342 operations were dtype conversions). The rest is a fixed cost per
step, and it is what kept the step well above its weight-read floor, and a 1M drafter's step
at 3x its products.

``FusedStep`` is the same pass written as few dispatches as the maths allows. It is a BACKEND
object of the fast path: ``fast_model(model)`` builds one and module 16's ``forward_rows``
hands it every validated call (``FastLM.forward_rows``), the same seam the lean loop used; the
teaching pass is untouched and stays the oracle. What it changes, each by measurement
(``bench/roofline.py`` prints the operations per step, ``dispatch_counts`` counts them):

* the stream is one (M, D) tensor (M = B * T rows) from the embedding to the final LayerNorm,
  so no reshapes between sub-layers; the weights, biases, LayerNorm parameters and packed
  kernels are read once into per-block tuples, so the step does no attribute walk or module
  call per leaf;
* each product calls its kernel directly, chosen per row count as ``PackedLinear`` chooses:
  float32 with one row ``addmm`` on a pre-transposed view (MKL's matrix-vector kernel, one
  dispatch instead of ``linear``'s two), float32 from ``PACKED_MIN_ROWS`` rows and bfloat16
  always oneDNN's packed weight; in float32 the MLP's GELU rides on the packed product as a
  oneDNN post-operation (one dispatch for both);
* keys and values are written into the cache with ``index_copy_`` at the new rows (one
  dispatch each; a slice copy off the CPU, where MPS lacks ``index_copy``), and the attention
  reads the visible rows through views, with torch's fused ``scaled_dot_product_attention``
  (no mask for one causal row, the causal mask with the cache offset for a chain, ``allowed``
  for a tree or a ragged batch);
* bfloat16 products over a float32 stream convert each product's input once and never its
  output: the residual add promotes the bfloat16 product to float32 exactly, the cache write
  converts the keys and values, GELU runs on the bfloat16 product. The numbers are the lean
  loop's, bit for bit (tested): the backend is an implementation, not another model.

``BlockStep`` is one block of it, and serves the draft heads too (EAGLE, EAGLE-2, EAGLE-3,
MTP, the block drafter): ``block_step(blk)`` returns the fused step of a block of a fast head
(``fast_model(head)``) and None for a teaching block, and ``block_rows`` runs a block either
way, so a head's code calls one function on both paths.

Backends (``fast_model(..., backend=...)``): ``"fused"`` (this file, the default; plain torch
calls, so it runs wherever torch runs: CPU, CUDA, MPS), ``"plain"`` (the lean loop of
``fast.py``, kept to measure against), ``"compiled"`` (this step under ``torch.compile``; on a
CPU Inductor needs a C++ compiler when it runs; where it cannot compile, ``"fused"`` runs and
``FastLM.backend_note`` says why in one line; measured slower than ``"fused"`` on this model,
see docs/performance.md). ``"auto"`` is ``"fused"``.

Equality: float32 within 1e-5 of the teaching path (the products sum in another order, oneDNN's
GELU is its own erf), greedy outputs identical; bfloat16 identical to the lean loop's bfloat16
model (tests/test_kvcache_step.py).

Source: the per-operation overhead of eager frameworks and what fusing removes: Chen et al.,
"TVM" (OSDI 2018), section 1; Ansel et al., "PyTorch 2" (ASPLOS 2024), section 1; the weight-read
floor of batch-1 decoding: Pope et al., "Efficiently Scaling Transformer Inference" (MLSys 2023),
section 2.

Shape letters: B batch, T new positions, M = B * T rows, S visible positions, D width, H heads,
d = D / H, V vocabulary, L kept layers.
"""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from g2c.sampling.model import check_token_ids

from .cache import KVCache

__all__ = ["BACKENDS", "COPY_OPS", "BlockStep", "CompiledStep", "FusedStep", "Product", "block_rows", "block_step",
           "compile_problem", "dispatch_counts"]

BACKENDS = ("auto", "fused", "compiled", "plain")
_NEVER = 1 << 62                                   # "never packed": more rows than any pass has

# The dispatched operations that move data without arithmetic ("copies" in the op counts).
COPY_OPS = frozenset({"copy_", "_to_copy", "clone", "index_copy_", "index_copy", "cat", "stack", "index_put_",
                      "contiguous", "_unsafe_view"})


def _linear_kernel():
    """oneDNN's linear (packed weights, post-operations), or None on a torch built without it."""
    try:
        return torch.ops.mkldnn._linear_pointwise
    except (AttributeError, RuntimeError):
        return None


_PACKED = _linear_kernel()


class Product:
    """One weight product y = x Wᵀ + b of a ``PackedLinear``, its kernel chosen per row count. Provided.

    Reads the ``PackedLinear``'s prepared tensors (no copy): the plain weight as a transposed
    view for ``addmm`` (rows below the packed threshold, and every row off the CPU) and oneDNN's
    packed weight from ``PackedLinear.min_packed_rows`` rows on.

    Calling it: x (M, in) in the product's dtype (``dtype``) -> (M, out) in that dtype.
    ``gelu(x)`` is GELU(x Wᵀ + b) (exact, erf), fused into the packed kernel in float32.
    """

    __slots__ = ("wt", "bias", "packed", "min_packed", "fuse_gelu", "dtype", "in_features", "out_features")

    def __init__(self, lin) -> None:
        self.dtype = lin.dtype
        self.in_features, self.out_features = lin.in_features, lin.out_features
        self.bias = lin.bias
        self.wt = None if lin.weight is None else lin.weight.t()                    # (in, out) view
        self.packed = lin.packed if _PACKED is not None else None
        self.min_packed = lin.min_packed_rows if self.packed is not None else _NEVER
        # bfloat16 keeps GELU outside (on the rounded product, as the lean loop does): same numbers
        self.fuse_gelu = self.packed is not None and lin.dtype == torch.float32

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] >= self.min_packed:
            return _PACKED(x, self.packed, self.bias, "none", [], "")
        if self.bias is None:
            return torch.mm(x, self.wt)
        return torch.addmm(self.bias, x, self.wt)

    def gelu(self, x: torch.Tensor) -> torch.Tensor:
        if self.fuse_gelu and x.shape[0] >= self.min_packed:
            return _PACKED(x, self.packed, self.bias, "gelu", [], "none")
        return F.gelu(self(x))


def _norm(ln) -> tuple:
    """A fast LayerNorm's (normalized_shape, weight, bias, eps) for ``F.layer_norm``."""
    return (tuple(ln.weight.shape), ln.weight, ln.bias, ln.eps)


class _Rows:
    """Where one call's new rows go: the cache write and the visible keys/values, per layer."""

    __slots__ = ("cache", "start", "end", "index", "direct")

    def __init__(self, cache, start: int, end: int, device: torch.device) -> None:
        self.cache, self.start, self.end = cache, start, end
        self.direct = type(cache) is KVCache            # one shared length: write straight into its buffers
        # index_copy_ is one dispatch per write on the CPU; MPS lacks it (a slice copy there)
        self.index = torch.arange(start, end, device=device) if self.direct and device.type == "cpu" else None

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, H, T, d) at rows start..end-1 of ``layer``; return the visible (B, H, end, d)."""
        if not self.direct:
            return self.cache.append(layer, k, v)                                   # a RaggedKVCache
        keys, values = self.cache.keys_buffer[layer], self.cache.values_buffer[layer]
        if self.index is not None:
            keys.index_copy_(2, self.index, k)
            values.index_copy_(2, self.index, v)
        else:
            keys[:, :, self.start:self.end] = k
            values[:, :, self.start:self.end] = v
        return keys[:, :, :self.end], values[:, :, :self.end]


class BlockStep:
    """A module 09 pre-norm block of a fast model or head, fused: (M, D) -> (M, D). Provided.

    Built from a block whose leaves ``fast_model`` swapped (``PackedLinear``, fused LayerNorm):
    reads their tensors, copies nothing. Same maths as ``cached_block`` / ``masked_block``:
    x + proj(attention(LN₁ x)), then + MLP(LN₂ ·).

    Args:
        blk: the swapped block (``blk.attn.qkv`` a ``PackedLinear`` ...).
        stream_dtype: the residual stream's dtype (the products' dtype is the leaves').
    """

    def __init__(self, blk, *, stream_dtype: torch.dtype) -> None:
        attn, mlp = blk.attn, blk.mlp
        self.ln_1, self.ln_2 = _norm(blk.ln_1), _norm(blk.ln_2)
        self.qkv, self.proj, self.fc, self.mlp_proj = Product(attn.qkv), Product(attn.proj), Product(mlp.fc), \
            Product(mlp.proj)
        self.num_heads, self.dim = attn.num_heads, attn.dim
        self.dtype, self.stream_dtype = attn.qkv.dtype, stream_dtype
        self.low = self.dtype != stream_dtype              # products in another dtype than the stream

    def __call__(self, x: torch.Tensor, B: int, T: int, rows, layer: int, mask: torch.Tensor | None,
                 past: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x (M, D) stream -> (M, D). ``rows``: a ``_Rows`` (cache writes) or None (attend among
        the new rows, after ``past`` keys/values (B, H, P, d) when given); ``mask``: bool
        broadcastable to (B, H, T, S) or None (no mask: one row, or causal handled by the caller)."""
        H, D = self.num_heads, self.dim
        h = F.layer_norm(x, *self.ln_1)
        if self.low:
            h = h.to(self.dtype)
        qkv = self.qkv(h)                                                            # (M, 3D)
        if self.low:
            qkv = qkv.to(self.stream_dtype)
        if B * T == 1:                     # one row: (3, H, d) in memory is already (3, B, H, T, d)
            q, k, v = qkv.view(3, 1, H, 1, D // H).unbind(0)                        # (1, H, 1, d) each
        else:
            q, k, v = qkv.view(B, T, 3, H, D // H).permute(2, 0, 3, 1, 4).unbind(0)    # (B, H, T, d) each
        if rows is not None:
            k, v = rows.write(layer, k, v)                                          # (B, H, S, d)
        elif past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)                 # (B, H, T, d)
        y = y.view(1, D) if B * T == 1 else y.transpose(1, 2).reshape(B * T, D)    # (M, D)
        if self.low:
            y = y.to(self.dtype)
        x = x + self.proj(y)                    # a bfloat16 product promotes to the stream exactly
        h = F.layer_norm(x, *self.ln_2)
        if self.low:
            h = h.to(self.dtype)
        return x + self.mlp_proj(self.fc.gelu(h))


def _check_ids(ids: torch.Tensor, vocab_size: int) -> None:
    """``check_token_ids`` (its message), read on the CPU without a dispatch for a few ids there."""
    if ids.device.type == "cpu" and ids.numel() <= 64 and not ids.dtype.is_floating_point \
            and ids.dtype != torch.bool:
        values = ids.reshape(-1).tolist()
        if min(values) >= 0 and max(values) < vocab_size:
            return
    check_token_ids(ids, vocab_size, "ids")


def _causal_mask(T: int, start: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """None for one row; else the additive mask (T, start + T): 0 where query i sees key j
    (j <= start + i), -inf elsewhere."""
    if T == 1:
        return None
    return torch.full((T, start + T), float("-inf"), dtype=dtype, device=device).triu_(diagonal=start + 1)


def _additive(allowed: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A bool mask as the additive one torch's attention makes of it (0 allowed, -inf not), once
    per call instead of once per block (the kernel converts a bool mask on every call)."""
    allowed = allowed.to(device)
    return torch.zeros(allowed.shape, dtype=dtype, device=device).masked_fill_(allowed.logical_not(), float("-inf"))


def block_step(blk) -> BlockStep | None:
    """The fused step of a fast block (a block inside ``fast_model(head)``), built once and
    kept with it; None for a teaching block or a head built with ``backend="plain"``. Provided."""
    fast = getattr(blk, "_fast", None)
    if not isinstance(fast, dict) or not all(hasattr(blk, n) for n in ("attn", "mlp", "ln_1", "ln_2")):
        return None
    step = fast.get("step")
    if step is None:
        leaves = (blk.attn.qkv, blk.attn.proj, blk.mlp.fc, blk.mlp.proj)
        if fast.get("backend", "fused") == "plain" or not all(hasattr(x, "min_packed_rows") for x in leaves):
            fast["step"] = False
            return None
        step = fast["step"] = BlockStep(blk, stream_dtype=blk.ln_1.weight.dtype)
    return step or None


def block_rows(blk, x: torch.Tensor, cache: KVCache | None = None, layer: int = 0, *,
               allowed: torch.Tensor | None = None,
               past: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One block over T new rows, on the fused step of a fast block, else on the teaching path. Provided.

    The draft heads' block step (EAGLE's chain and trees, MTP, EAGLE-3, the block drafter): one
    call on both paths.

    Args:
        blk: a module 09 ``Block`` (teaching) or a block of ``fast_model(head)``.
        x: (B, T, D) new rows in the stream's dtype, on the block's device.
        cache: a ``KVCache`` whose ``layer`` holds the block's earlier rows: the new keys/values
            are written at rows ``length ..`` (the pointer does not move). None: the rows attend
            among themselves (after ``past``).
        layer: the cache layer of this block.
        allowed: bool broadcastable to (B, H, T, S), S = visible rows (``length + T`` with a cache,
            P + T without): True where row t may read key s. None with a cache: causal with the
            cache offset (no mask for one row).
        past: without a cache, (keys, values) (B, H, P, d) of earlier rows the new rows also read.

    Returns:
        (B, T, D) in x's dtype on x's device. The fused step runs without gradients (inference);
        the teaching path keeps them (the heads train through it).

    Raises:
        ValueError: the rows do not fit in the cache (``KVCache``'s "is full" message).
    """
    step = block_step(blk)
    if step is None:                                        # the teaching path, as the heads wrote it
        from .forward import cached_block, masked_cached_attention

        if cache is None:
            from g2c.attention.multihead import merge_heads, split_heads

            attn = blk.attn
            q, k, v = (split_heads(t, attn.num_heads) for t in attn.qkv(blk.ln_1(x)).split(attn.dim, dim=-1))
            if past is not None:
                k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
            mask = None if allowed is None else allowed.to(x.device)
            x = x + attn.proj(merge_heads(F.scaled_dot_product_attention(q, k, v, attn_mask=mask)))
            return x + blk.mlp(blk.ln_2(x))
        if allowed is None:
            return cached_block(blk, x, cache, layer)
        x = x + masked_cached_attention(blk.attn, blk.ln_1(x), cache, layer, allowed.to(x.device))
        return x + blk.mlp(blk.ln_2(x))
    with torch.no_grad():
        return _fused_block_rows(step, x, cache, layer, allowed, past)


def _fused_block_rows(step: BlockStep, x, cache, layer, allowed, past) -> torch.Tensor:
    B, T, D = x.shape
    rows = None
    if cache is not None:
        start = cache.length
        if type(cache) is KVCache and start + T > cache.max_seq_len:
            cache._check_append(x.new_empty(B, cache.num_heads, T, cache.head_dim),
                                x.new_empty(B, cache.num_heads, T, cache.head_dim))   # its "is full" error
        rows = _Rows(cache, start, start + T, x.device)
        mask = _causal_mask(T, start, x.dtype, x.device) if allowed is None else _additive(allowed, x.dtype, x.device)
    else:
        mask = None if allowed is None else _additive(allowed, x.dtype, x.device)
    return step(x.reshape(B * T, D), B, T, rows, layer, mask, past).view(B, T, D)


class FusedStep:
    """The fast path's ``forward_rows``, fused: the backend object a ``FastLM`` hands its calls. Provided.

    Build it from a ``FastLM`` (``FusedStep(fast)``; ``fast_model`` does); it reads the fast
    model's tensors and copies nothing. Calling it has the trunk's signature and contract
    (module 16's ``forward_rows`` validated the call and runs it under ``torch.no_grad``):
    ``(ids (B, T), cache, *, positions, allowed, keep_layers) -> (states (B, T, D), kept (B, T, L,
    D) | None)``, keys/values written after the pointer, the pointer never moved.

    Attributes:
        name: "fused".
        blocks: one ``BlockStep`` per block.
    """

    name = "fused"

    def __init__(self, fast) -> None:
        self.vocab_size, self.dim = fast.vocab_size, fast.embedding_dim
        self.token_weight, self.pos_weight = fast.token_embed.weight, fast.pos_embed.weight
        self.ln_final = _norm(fast.ln_final)
        self.blocks = [BlockStep(blk, stream_dtype=fast.stream_dtype) for blk in fast.blocks]
        self.head = Product(fast._unembed)
        self.low = fast.dtype != fast.stream_dtype

    @property
    def device(self) -> torch.device:
        return self.token_weight.device

    def __call__(self, ids: torch.Tensor, cache, *, positions: torch.Tensor | None = None,
                 allowed: torch.Tensor | None = None,
                 keep_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        dev = self.token_weight.device
        _check_ids(ids, self.vocab_size)                             # as the teaching path: no raw IndexError
        ids = ids.to(dev)
        B, T = ids.shape
        start = cache.length
        end = start + T
        if positions is None:
            x = F.embedding(ids, self.token_weight) + self.pos_weight[start:end]                 # (B, T, D)
        else:
            x = F.embedding(ids, self.token_weight) + F.embedding(positions.to(dev), self.pos_weight)
        x = x.view(B * T, self.dim)                                                            # (M, D)
        dtype = self.token_weight.dtype
        mask = _causal_mask(T, start, dtype, dev) if allowed is None else _additive(allowed, dtype, dev)
        rows = _Rows(cache, start, end, dev)
        kept = []
        for layer, blk in enumerate(self.blocks):
            x = blk(x, B, T, rows, layer, mask)
            if keep_layers and layer in keep_layers:
                kept.append(layer)
                kept.append(x)
        states = F.layer_norm(x, *self.ln_final).view(B, T, self.dim)
        if not keep_layers:
            return states, None
        saved = dict(zip(kept[::2], kept[1::2]))
        return states, torch.stack([saved[i].view(B, T, self.dim) for i in keep_layers], dim=2)

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        """Tied unembedding (..., D) -> logits (..., V) in h's dtype (one product, no bias)."""
        lead = h.shape[:-1]
        x = h.reshape(-1, self.dim)
        if x.dtype != self.head.dtype:
            x = x.to(self.head.dtype)
        y = self.head(x)
        if y.dtype != h.dtype:
            y = y.to(h.dtype)
        return y.view(*lead, self.head.out_features)


# ---- the compiled variant --------------------------------------------------------------------
def compile_problem(device: torch.device) -> str | None:
    """Why ``torch.compile`` cannot build the step here (one line), or None when it can. Provided.

    A CPU needs a C++ compiler at run time (Inductor writes and builds C++); MPS is not a
    supported Inductor target in the torch versions the course supports; CUDA needs Triton.
    """
    if not hasattr(torch, "compile"):
        return f"torch {torch.__version__} has no torch.compile"
    if sys.platform == "win32":
        return "torch.compile's Inductor backend needs Linux or macOS here"
    if device.type == "cpu":
        if not any(shutil.which(cc) for cc in ("c++", "g++", "clang++", "cc", "gcc", "clang")):
            return "no C++ compiler on PATH (torch.compile's Inductor builds C++ for the CPU at run time)"
        return None
    if device.type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed (torch.compile's Inductor needs it on CUDA)"
        return None
    return f"torch.compile's Inductor backend does not target {device.type} in torch {torch.__version__}"


class _Buffers:
    """A stand-in for a plain ``KVCache`` inside the compiled graph: its buffer lists only."""

    __slots__ = ("keys_buffer", "values_buffer")

    def __init__(self, keys_buffer, values_buffer) -> None:
        self.keys_buffer, self.values_buffer = keys_buffer, values_buffer


class CompiledStep:
    """``FusedStep`` under ``torch.compile`` (Inductor): the backend ``"compiled"``. Provided.

    One graph per call shape (the row count; the cache offset is symbolic), compiled on first use
    (tens of seconds per shape). The plain cache's buffers are graph inputs written in place; a
    tree, a ragged batch or kept layers run the eager ``FusedStep``. The products are plain
    ``addmm`` (Inductor cannot lower oneDNN's packed op on a weight it does not own), so the fast
    model is built unpacked. If compiling or the compiled graph fails at run time, the eager step
    runs from then on and ``note`` says why in one line (printed once on stderr).
    """

    name = "compiled"

    def __init__(self, fused: FusedStep) -> None:
        self.fused = fused
        self.note = ""
        self._graph = torch.compile(self._rows, fullgraph=True, dynamic=True)

    def unembed(self, h: torch.Tensor) -> torch.Tensor:
        return self.fused.unembed(h)

    def _rows(self, ids, keys_buffer, values_buffer, start: int):
        f = self.fused
        B, T = ids.shape
        x = (F.embedding(ids, f.token_weight) + f.pos_weight[start:start + T]).view(B * T, f.dim)
        mask = _causal_mask(T, start, f.token_weight.dtype, ids.device)
        rows = _Rows(_Buffers(keys_buffer, values_buffer), start, start + T, ids.device)
        rows.direct = True
        for layer, blk in enumerate(f.blocks):
            x = blk(x, B, T, rows, layer, mask)
        return F.layer_norm(x, *f.ln_final).view(B, T, f.dim)

    def __call__(self, ids: torch.Tensor, cache, *, positions: torch.Tensor | None = None,
                 allowed: torch.Tensor | None = None,
                 keep_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.note or type(cache) is not KVCache or positions is not None or allowed is not None or keep_layers:
            return self.fused(ids, cache, positions=positions, allowed=allowed, keep_layers=keep_layers)
        ids = ids.to(self.fused.device)
        check_token_ids(ids, self.fused.vocab_size, "ids")
        try:
            return self._graph(ids, cache.keys_buffer, cache.values_buffer, cache.length), None
        except Exception as exc:           # a compiler missing or failing at run time: say so once, run eager
            first = str(exc).strip()[:2000]
            self.note = f"backend 'compiled' failed ({type(exc).__name__}: {first}): the fused eager step runs"
            print(f"g2c: {self.note}", file=sys.stderr)
            return self.fused(ids, cache)


# ---- counting dispatches -----------------------------------------------------------------------
class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.counts[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def dispatch_counts(fn: Callable[[], object]) -> Counter:
    """Run ``fn()`` once and count the operations torch's dispatcher ran, by name. Provided.

    The count is what the eager step pays a dispatch for (views included: each costs one); the
    copies among them are the names in ``COPY_OPS``. Deterministic for a given call shape.
    """
    with _Count() as mode:
        fn()
    return mode.counts
