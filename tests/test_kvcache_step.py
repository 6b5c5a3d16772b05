"""Module 16 (provided): the fused step ``g2c.kvcache.step``, the fast path's default backend.

Oracles: the teaching path (module 16's ``forward_rows`` / ``cached_forward`` on the
``TransformerLM``, and ``cached_block`` / the masked block on a teaching ``Block``) in float32,
within 1e-5 (the products sum in another order, oneDNN's GELU is its own erf: a few ulps of
logits below 10); in bfloat16 the fast path's lean loop (``backend="plain"``), bit for bit:
the fused step changes how many operations are dispatched, not a single number. Operation
counts are deterministic for a call shape (``dispatch_counts``), so they are pinned exactly
where the kernel choice is fixed (a CPU with oneDNN), never a time.
"""

from __future__ import annotations

import pytest
import torch
from device_mocks import device_of
from test_kvcache_fast import SHAPES, _ids, _run_shape, _tiny_lm

from g2c.kvcache import KVCache, cached_forward, cached_generate, forward_rows, unembed
from g2c.kvcache import step as step_module
from g2c.kvcache.fast import FastLM, fast_model, packed_kernels_available
from g2c.kvcache.forward import cached_block, masked_cached_attention
from g2c.kvcache.step import (
    COPY_OPS,
    BlockStep,
    CompiledStep,
    FusedStep,
    block_rows,
    block_step,
    compile_problem,
    dispatch_counts,
)
from g2c.nn import Module
from g2c.transformer import Block


def test_fused_step_is_the_fast_paths_default_backend_and_the_lean_loop_stays_reachable():
    model = _tiny_lm()
    fast = fast_model(model)
    assert isinstance(fast.step, FusedStep) and fast.forward_rows is fast.step and fast.backend_note == ""
    assert fast_model(model, backend="fused").step is not None
    plain = fast_model(model, backend="plain")
    assert plain.step is None and plain.forward_rows == plain._fused_rows          # the lean loop it replaced
    assert fast_model(model, fused=False).forward_rows is None                      # the teaching pass on fast leaves
    assert fast_model(fast, backend="plain") is not fast and fast_model(fast, backend="auto") is fast
    with pytest.raises(ValueError, match="backend must be one of auto, fused, compiled, plain, got 'jit'"):
        fast_model(model, backend="jit")


@pytest.mark.parametrize("shape", SHAPES)
def test_fused_step_equals_the_teaching_pass_every_shape_fp32(shape):
    model = _tiny_lm(seed=6)
    slow_logits, slow_kept, slow_keys = _run_shape(model, shape)
    quick_logits, quick_kept, quick_keys = _run_shape(fast_model(model, backend="fused"), shape)
    torch.testing.assert_close(quick_logits, slow_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(quick_keys, slow_keys, rtol=1e-5, atol=1e-5)
    assert (slow_kept is None) == (quick_kept is None)
    if slow_kept is not None:
        torch.testing.assert_close(quick_kept, slow_kept, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape", SHAPES)
def test_fused_bfloat16_equals_the_lean_loop_bit_for_bit(shape):
    # products in bfloat16 over a float32 stream: the fused step converts each product's input once
    # and lets the residual add promote its output; the numbers must not move at all
    model = _tiny_lm(seed=6)
    fused = _run_shape(fast_model(model, dtype="bf16"), shape)
    plain = _run_shape(fast_model(model, dtype="bf16", backend="plain"), shape)
    assert fused[0].dtype == torch.float32
    for a, b in zip(fused, plain):
        assert (a is None) == (b is None)
        assert a is None or torch.equal(a, b)


def test_fused_step_on_a_bfloat16_model_equals_the_lean_loop_bit_for_bit():
    # a model loaded in bfloat16 (load_model(..., dtype="bfloat16")): stream, cache and products bf16
    model = _tiny_lm(seed=3).to(dtype=torch.bfloat16)
    for shape in ("prefill", "chain", "tree"):
        fused, plain = _run_shape(fast_model(model), shape), _run_shape(fast_model(model, backend="plain"), shape)
        assert fused[0].dtype == torch.bfloat16 and torch.equal(fused[0], plain[0]) and torch.equal(fused[2], plain[2])


def test_fused_greedy_generation_is_identical_to_the_teaching_path_and_bf16_to_the_lean_loop():
    model = _tiny_lm(seed=2)
    fused, half, half_plain = fast_model(model), fast_model(model, dtype="bf16"), \
        fast_model(model, dtype="bf16", backend="plain")
    for seed in range(2):
        prompt = _ids(5, seed=seed)
        assert torch.equal(cached_generate(fused, prompt, 30, temperature=0.0),
                           cached_generate(model, prompt, 30, temperature=0.0))
        assert torch.equal(cached_generate(half, prompt, 30, temperature=0.0),
                           cached_generate(half_plain, prompt, 30, temperature=0.0))
    long = cached_generate(model, _ids(30), 40, temperature=0.0)         # past the window: the re-prefill
    assert torch.equal(cached_generate(fused, _ids(30), 40, temperature=0.0), long)


def test_fused_step_refuses_ids_outside_the_vocabulary_and_leaves_the_pointer():
    fast = fast_model(_tiny_lm())
    cache = KVCache.for_model(fast)
    with pytest.raises(ValueError, match=r"ids holds token id 48, outside the vocabulary \[0, 48\)"):
        forward_rows(fast, torch.tensor([[3, 48]]), cache)
    assert cache.length == 0



def test_fused_step_reads_non_contiguous_ids_as_the_teaching_path_does():
    # a column slice of a (B, T) batch is not contiguous: the fast check must read it as it is
    model = _tiny_lm()
    fast = fast_model(model)
    ids = torch.tensor([[27, 20, 16, 8, 5], [20, 17, 17, 29, 3]])[:, :4]
    assert not ids.is_contiguous()
    want = forward_rows(model, ids.contiguous(), KVCache.for_model(model, batch_size=2))
    got = forward_rows(fast, ids, KVCache.for_model(fast, batch_size=2))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)

# ---- operation counts (deterministic; a CPU with oneDNN fixes the kernel choice) --------------------
def _counts(model, rows: int):
    cache = KVCache.for_model(model)
    cached_forward(model, _ids(8).unsqueeze(0), cache)
    ids = _ids(rows, seed=2).unsqueeze(0)

    def step():
        cache.crop(8)
        cached_forward(model, ids, cache)
    return dispatch_counts(step)


@pytest.mark.own_device
@pytest.mark.skipif(not packed_kernels_available(torch.float32), reason="the counts pin oneDNN's kernel choice; "
                    "this torch has no oneDNN (the equality tests above still run)")
def test_fused_step_dispatches_fewer_operations_and_no_dtype_round_trips():
    for layers in (1, 3):
        model = _tiny_lm(layers=layers)
        for rows in (1, 5):
            fused, plain = _counts(fast_model(model), rows), _counts(fast_model(model, backend="plain"), rows)
            assert fused == _counts(fast_model(model), rows)                            # deterministic
            assert sum(fused.values()) < sum(plain.values())
            products = fused["addmm"] + fused["mm"] + fused["_linear_pointwise"]
            assert products == 4 * layers + 1                                          # one call per product
            assert fused["index_copy_"] == 2 * layers and fused["_to_copy"] == 0 and fused["copy_"] == 0
            assert fused["native_layer_norm"] == 2 * layers + 1
            assert fused["gelu"] == (layers if rows == 1 else 0)                      # fused into the packed fc
            half, half_plain = _counts(fast_model(model, dtype="bf16"), rows), \
                _counts(fast_model(model, dtype="bf16", backend="plain"), rows)
            # bfloat16 products over a float32 stream: 4 input conversions per block + the unembedding's
            # in and out, where the lean loop converted every product's input and output (8 per block + 2)
            assert half["_to_copy"] == 4 * layers + 2 and half_plain["_to_copy"] == 8 * layers + 2
    def per_block(backend: str) -> float:
        one, three = (_counts(fast_model(_tiny_lm(layers=n), backend=backend), 1) for n in (1, 3))
        return (sum(three.values()) - sum(one.values())) / 2
    # one row: LN, qkv, 2 views (view, unbind), 2 writes, 2 reads, attention, 1 view, proj, add, LN, fc, GELU,
    # proj, add
    assert per_block("fused") == 17 and per_block("plain") >= 30
    assert {name for name in _counts(fast_model(_tiny_lm()), 1) if name in COPY_OPS} == {"index_copy_"}


# ---- the compiled backend and the fallback ------------------------------------------------------
def test_compiled_backend_falls_back_to_the_fused_step_with_one_line_of_why(monkeypatch):
    model = _tiny_lm()
    monkeypatch.setattr(step_module, "compile_problem", lambda device: "no C++ compiler on PATH (test)")
    fast = fast_model(model, backend="compiled")
    assert isinstance(fast.step, FusedStep) and not isinstance(fast.step, CompiledStep)
    assert fast.backend_note == ("backend 'compiled' unavailable (no C++ compiler on PATH (test)): the fused "
                                 "eager step runs")
    assert "\n" not in fast.backend_note
    ids = _ids(12).unsqueeze(0)
    torch.testing.assert_close(fast(ids), model(ids), rtol=1e-5, atol=1e-5)


def test_compile_problem_names_what_is_missing(monkeypatch):
    monkeypatch.setattr(step_module.shutil, "which", lambda name: None)
    assert compile_problem(torch.device("cpu")) == ("no C++ compiler on PATH (torch.compile's Inductor builds C++ "
                                                    "for the CPU at run time)")
    assert "does not target mps" in compile_problem(torch.device("mps"))
    monkeypatch.setattr(step_module.shutil, "which", lambda name: "/usr/bin/" + name)
    assert compile_problem(torch.device("cpu")) is None


def test_compiled_step_runs_eagerly_when_compiling_fails_and_says_so_once(monkeypatch, capsys):
    model = _tiny_lm()
    monkeypatch.setattr(step_module, "compile_problem", lambda device: None)
    fast = fast_model(model, backend="compiled")
    assert isinstance(fast.step, CompiledStep) and fast.pack is True and fast.packed is False   # unpacked products

    def broken(*args):
        raise RuntimeError("InductorError: C++ compile error\nmore lines")
    monkeypatch.setattr(fast.step, "_graph", broken)
    ids = _ids(12).unsqueeze(0)
    torch.testing.assert_close(fast(ids), model(ids), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fast(ids), model(ids), rtol=1e-5, atol=1e-5)
    assert fast.step.note.startswith("backend 'compiled' failed (RuntimeError: InductorError: C++ compile error")
    assert capsys.readouterr().err.count("backend 'compiled' failed") == 1


def test_compiled_steps_graph_function_equals_the_fused_step_run_eagerly(monkeypatch):
    # what torch.compile traces (CompiledStep._rows), run without compiling: the same rows and cache writes
    model = _tiny_lm(seed=5)
    monkeypatch.setattr(step_module, "compile_problem", lambda device: None)
    fast = fast_model(model, backend="compiled")
    cache, ref_cache = KVCache.for_model(fast), KVCache.for_model(model)
    ids = _ids(20, seed=4).unsqueeze(0)
    start = 0
    for rows in (9, 1, 5):
        block = ids[:, start:start + rows]
        states = fast.step._rows(block.to(device_of(model)), cache.keys_buffer, cache.values_buffer, cache.length)
        cache.advance(rows)
        want = cached_forward(model, block, ref_cache)
        torch.testing.assert_close(unembed(fast, states), want, rtol=1e-5, atol=1e-5)
        start += rows
    torch.testing.assert_close(cache.keys_buffer[1][:, :, :start], ref_cache.keys_buffer[1][:, :, :start],
                               rtol=1e-5, atol=1e-5)


# ---- a head's block: block_step / block_rows -------------------------------------------------------
class _Head(Module):
    """A draft head's shape: one block, the base held outside its children."""

    def __init__(self, base, seed: int = 0) -> None:
        super().__init__()
        self._frozen = {"base": base}
        self.block = Block(base.embedding_dim, 4, hidden_dim=2 * base.embedding_dim,
                           generator=torch.Generator().manual_seed(seed))

    @property
    def base(self):
        return self._frozen["base"]


def _head_rows(blk, mode: str, dev):
    """Run the block in one of the heads' call shapes; (outputs, cache keys written)."""
    x = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(3)).to(dev)
    if mode == "no cache":
        allowed = torch.ones(9, 9, dtype=torch.bool).tril()
        return block_rows(blk, x, allowed=allowed), None
    if mode == "past":
        k, v = torch.randn(2, 1, 4, 3, 8, generator=torch.Generator().manual_seed(4)).to(dev)
        return block_rows(blk, x[:, :2], allowed=torch.ones(2, 5, dtype=torch.bool), past=(k, v)), None
    cache = KVCache(1, 1, 4, 8, 16, device=dev)
    first = block_rows(blk, x[:, :6], cache, 0)                      # causal, the cache empty
    cache.advance(6)
    if mode == "one row":
        out = block_rows(blk, x[:, 6:7], cache, 0)
    else:                                                            # a tree level: each row its ancestors
        allowed = torch.tensor([[1, 1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 1, 0, 1, 0],
                                [1, 1, 1, 1, 1, 1, 0, 0, 1]], dtype=torch.bool)
        out = block_rows(blk, x[:, 6:9], cache, 0, allowed=allowed)
    assert cache.length == 6                                         # the pointer never moves
    return torch.cat([first, out], dim=1), cache.keys_buffer[0][:, :, :6 + out.shape[1]]


@pytest.mark.parametrize("mode", ["one row", "tree level", "no cache", "past"])
def test_block_rows_of_a_fast_head_equals_the_teaching_block(mode):
    head = _Head(_tiny_lm()).eval()
    fast = fast_model(head)
    assert block_step(head.block) is None and isinstance(block_step(fast.block), BlockStep)
    assert block_step(fast.block) is block_step(fast.block)                          # built once, kept
    assert block_step(fast_model(head, backend="plain").block) is None
    dev = device_of(head)
    want, want_keys = _head_rows(head.block, mode, dev)
    got, got_keys = _head_rows(fast.block, mode, dev)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    if want_keys is not None:
        torch.testing.assert_close(got_keys, want_keys, rtol=1e-5, atol=1e-5)


def test_block_rows_on_the_teaching_path_is_cached_block_and_the_masked_block():
    head = _Head(_tiny_lm()).eval()
    dev = device_of(head)
    x = torch.randn(1, 3, 32, generator=torch.Generator().manual_seed(0)).to(dev)
    a, b = KVCache(1, 1, 4, 8, 8, device=dev), KVCache(1, 1, 4, 8, 8, device=dev)
    assert torch.equal(block_rows(head.block, x, a, 0), cached_block(head.block, x, b, 0))
    allowed = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool).to(dev)
    y = x + masked_cached_attention(head.block.attn, head.block.ln_1(x), b, 0, allowed)
    assert torch.equal(block_rows(head.block, x, a, 0, allowed=allowed), y + head.block.mlp(head.block.ln_2(y)))


def test_block_rows_of_a_bfloat16_head_equals_its_lean_leaves_bit_for_bit_and_refuses_a_full_cache():
    head = _Head(_tiny_lm()).eval()
    fused, plain = fast_model(head, dtype="bf16"), fast_model(head, dtype="bf16", backend="plain")
    dev = device_of(head)
    for mode in ("one row", "tree level", "no cache"):
        a, b = _head_rows(fused.block, mode, dev), _head_rows(plain.block, mode, dev)
        assert torch.equal(a[0], b[0]) and (a[1] is None or torch.equal(a[1], b[1]))
    cache = KVCache(1, 1, 4, 8, 4, device=dev)
    cache.advance(3)
    with pytest.raises(ValueError, match=r"KVCache is full: 3 committed \+ 2 new positions exceed max_seq_len=4"):
        block_rows(fused.block, torch.zeros(1, 2, 32).to(dev), cache, 0)


def test_a_fastlm_built_unfused_keeps_the_teaching_pass_and_is_still_a_fastlm():
    fast = fast_model(_tiny_lm(), fused=False)
    assert isinstance(fast, FastLM) and fast.step is None and fast.forward_rows is None
