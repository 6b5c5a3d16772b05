"""Module 16 (provided): the fast path ``g2c.kvcache.fast`` against the teaching path.

Oracles: the teaching ``TransformerLM`` run through module 16's ``cached_forward`` (logits)
and module 16's ``cached_generate`` (greedy tokens); for every pass shape of the trunk
(prefill, one row, a k + 1 chain, a tree mask, ragged rows, kept layers) the teaching
``forward_rows`` (the fast model is a backend of that one pass: same call, same results).
The speculative check runs a minimal greedy draft-verify loop written here on module 16's
pieces only (a k + 1-row cached pass, ``KVCache.crop`` rollback), so the test needs no Beyond
module; bench/specdec.py ``--fast`` runs the course's speculative loops on the fast path on
the ladder.

Tolerance (float32): the packed product sums the same terms in another order, so logits move
by a few ulps of their magnitude (|logits| < 10 here: ~1e-6); 1e-5 is the issue's bound and
still catches a wrong weight, bias or transpose (those move logits by O(0.1)). bfloat16 is
its own model: its logits differ from float32 by the rounding of 8-bit mantissas (~1e-2),
and it is checked for losslessness against itself.
"""

from __future__ import annotations

import pytest
import torch

from g2c.kvcache import (
    KVCache,
    RaggedKVCache,
    cached_forward,
    cached_generate,
    cached_hidden_states,
    forward_rows,
    unembed,
    unwrap,
)
from g2c.kvcache.fast import FastLM, PackedLinear, fast_model, head_unembed, packed_kernels_available
from g2c.nn import LayerNorm, Linear, Module
from g2c.transformer import Block, TransformerLM


def _tiny_lm(seed: int = 0, *, vocab: int = 48, dim: int = 32, layers: int = 2, heads: int = 4,
             max_seq_len: int = 48) -> TransformerLM:
    g = torch.Generator().manual_seed(seed)
    model = TransformerLM(vocab, dim, layers, heads, max_seq_len, generator=g)
    with torch.no_grad():            # greedy chains that move from token to token, clear argmax gaps
        model.token_embed.weight.mul_(3.0)
        model.pos_embed.weight.mul_(12.0)
    return model.eval()


def _ids(n: int, *, vocab: int = 48, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("pack,fused", [(True, True), (False, True), (True, False)])
def test_fast_logits_equal_teaching_path_fp32(pack, fused):
    model = _tiny_lm()
    fast = fast_model(model, pack=pack, fused=fused)
    assert (fast.forward_rows is not None) == fused
    # oneDNN packing is a CPU kernel: on an accelerator (the fake one under --fake-device) nothing is packed
    from device_mocks import device_of

    assert fast.packed == (pack and packed_kernels_available(torch.float32) and device_of(model).type == "cpu")
    ids = _ids(40).unsqueeze(0)
    slow_cache, fast_cache = KVCache.for_model(model), KVCache.for_model(fast)
    start = 0
    for rows in (12, 1, 2, 3, 5, 9, 1, 5):     # prefill, decode steps, verification blocks of k + 1 rows
        block = ids[:, start:start + rows]
        slow = cached_forward(model, block, slow_cache)
        quick = cached_forward(fast, block, fast_cache)
        assert quick.shape == slow.shape == (1, rows, model.vocab_size) and quick.dtype == torch.float32
        torch.testing.assert_close(quick, slow, rtol=1e-5, atol=1e-5)
        start += rows
    assert fast_cache.length == slow_cache.length == start
    torch.testing.assert_close(fast(ids), model(ids), rtol=1e-5, atol=1e-5)


def test_fast_greedy_generation_is_identical():
    model = _tiny_lm(seed=2)
    fast = fast_model(model)
    for seed in range(3):
        prompt = _ids(5, seed=seed)
        want = cached_generate(model, prompt, 30, temperature=0.0)
        assert torch.equal(cached_generate(fast, prompt, 30, temperature=0.0), want)
    # past the window: the re-prefill path sees the same tokens
    long = cached_generate(model, _ids(30), 40, temperature=0.0)
    assert torch.equal(cached_generate(fast, _ids(30), 40, temperature=0.0), long)


def test_fast_bfloat16_is_its_own_model():
    target = _tiny_lm(seed=4)
    fast32, fast16 = fast_model(target), fast_model(target, dtype="bf16")
    assert fast16.dtype == torch.bfloat16 and fast16.stream_dtype == torch.float32
    assert fast16.weight_bytes * 2 == fast32.weight_bytes            # half the bytes per step
    ids = _ids(20).unsqueeze(0)
    l32, l16 = fast32(ids), fast16(ids)
    assert l16.dtype == torch.float32
    diff = (l16 - l32).abs().max().item()
    assert 0 < diff < 0.05 * l32.abs().max().item()                  # rounded, not wrong
    # speculative decoding on it (lossless against itself): every cached entry point of the engine,
    # tests/test_specdec_engine.py::test_bfloat16_fast_target_is_lossless_against_itself


def test_fast_model_is_a_snapshot_and_validates():
    model = _tiny_lm()
    fast = fast_model(model)
    assert fast_model(fast) is fast and isinstance(fast_model(fast, dtype="bf16"), FastLM)
    assert fast_model(fast, fused=False) is not fast and fast_model(fast, fused=False).source is model
    ids = _ids(8).unsqueeze(0)
    before, one = fast(ids), fast(ids[:, :1])                        # 8 rows: packed; 1 row: plain weights
    with torch.no_grad():
        model.blocks[0].mlp.fc.weight.add_(1.0)
        model.blocks[0].ln_1.weight.add_(1.0)
        model.token_embed.weight.add_(1.0)
    torch.testing.assert_close(fast(ids), before)                    # copied at construction
    torch.testing.assert_close(fast(ids[:, :1]), one)
    assert fast.train(False) is fast and fast.eval() is fast and fast.training is False
    with pytest.raises(ValueError, match="cannot be trained"):
        fast.train(True)
    with pytest.raises(TypeError, match="fast_model needs a TransformerLM.*blocks"):
        fast_model(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="unknown dtype 'int4'"):
        fast_model(model, dtype="int4")
    with pytest.raises(ValueError, match="dtype must be one of"):
        fast_model(model, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"weight must be \(out, in\)"):
        PackedLinear(torch.zeros(3), None)
    with pytest.raises(ValueError, match=r"integer ids of shape \(B, T\)"):
        fast(torch.zeros(3, dtype=torch.long))


def test_packed_linear_matches_linear_every_row_count():
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(24, 40, generator=g), torch.randn(24, generator=g)
    lin = PackedLinear(w, b)
    assert lin.nbytes == (24 * 40 + 24) * 4
    for rows in (1, 2, 3, 4, 5, 9, 17, 33):
        x = torch.randn(rows, 40, generator=g)
        torch.testing.assert_close(lin(x), x @ w.t() + b, rtol=1e-5, atol=1e-5)
    x3 = torch.randn(2, 3, 40, generator=g)                          # leading dimensions kept
    torch.testing.assert_close(lin(x3), x3 @ w.t() + b, rtol=1e-5, atol=1e-5)


# ---- the fast backend of the trunk, every pass shape -------------------------------------------
PARENTS = [-1, -1, 0, 0, 1, 2, 5]                  # a 7-node tree: two branches off the root, depth 3
TOKENS = [4, 9, 1, 30, 7, 7, 12]
SHAPES = ["prefill", "one row", "chain", "tree", "ragged", "kept layers"]


def _tree_block(parents: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(depths (1 + n,) with the root at 0, allowed (1 + n, 1 + n) root + ancestor-or-self)."""
    n = len(parents)
    depths, allowed = [0], torch.zeros(1 + n, 1 + n, dtype=torch.bool)
    allowed[:, 0] = True
    for i, p in enumerate(parents):
        depths.append(1 if p < 0 else depths[1 + p] + 1)
        if p >= 0:
            allowed[1 + i] = allowed[1 + p]
        allowed[1 + i, 1 + i] = True
    return torch.tensor(depths), allowed


def _run_shape(model, shape: str):
    """One call of the trunk in the given shape after the same history; returns (logits of the
    new rows, kept layers or None, every key row the cache holds of layer 0)."""
    ids = _ids(24, seed=3)
    if shape == "ragged":
        cache = RaggedKVCache.for_model(model, 2)
        prompts = torch.stack([ids[:9], torch.cat([ids[9:14], torch.zeros(4, dtype=torch.long)])])    # 9 and 5 rows
        forward_rows(model, prompts, cache)
        cache.advance(9)
        cache.crop(torch.tensor([9, 5]))
        new, kwargs = torch.stack([ids[14:17], ids[17:20]]), {}
    else:
        cache = KVCache.for_model(model)
        if shape != "prefill":
            cached_hidden_states(model, ids[:12].unsqueeze(0), cache)
        kwargs = {}
        if shape == "prefill":
            new = ids[:12].unsqueeze(0)
        elif shape == "one row":
            new = ids[12:13].unsqueeze(0)
        elif shape == "chain":
            new = ids[12:17].unsqueeze(0)                                    # k + 1 = 5 rows
        elif shape == "kept layers":
            new, kwargs = ids[12:17].unsqueeze(0), {"keep_layers": (1, 0)}
        else:
            depths, block = _tree_block(PARENTS)
            allowed = torch.cat([torch.ones(1 + len(PARENTS), cache.length, dtype=torch.bool), block], dim=1)
            new = torch.cat([ids[12:13], torch.tensor(TOKENS)]).unsqueeze(0)
            kwargs = {"positions": cache.length + depths, "allowed": allowed, "keep_layers": (0,)}
    states, kept = forward_rows(model, new, cache, **kwargs)
    return unembed(model, states), kept, cache.keys_buffer[0][:, :, :cache.length + new.shape[1]]


@pytest.mark.parametrize("shape", SHAPES)
def test_fast_forward_rows_equals_teaching_every_pass_shape_fp32(shape):
    model = _tiny_lm(seed=6)
    slow_logits, slow_kept, slow_keys = _run_shape(model, shape)
    quick_logits, quick_kept, quick_keys = _run_shape(fast_model(model), shape)
    assert quick_logits.shape == slow_logits.shape and quick_logits.dtype == torch.float32
    torch.testing.assert_close(quick_logits, slow_logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(quick_keys, slow_keys, rtol=1e-5, atol=1e-5)
    assert (slow_kept is None) == (quick_kept is None) == (shape not in ("tree", "kept layers"))
    if slow_kept is not None:
        torch.testing.assert_close(quick_kept, slow_kept, rtol=1e-5, atol=1e-5)


def test_fast_bfloat16_tree_pass_is_consistent_with_its_own_chain_passes():
    # The bfloat16 model is its own model: its tree rows must equal ITS plain passes over each
    # root-to-node path (rounding of the bf16 inputs may differ by a few ulps between the two
    # layouts: 2% of the logits' range; a wrong mask or position moves them by O(1)).
    fast16 = fast_model(_tiny_lm(seed=7), dtype="bf16")
    ctx = _ids(8, seed=9)
    cache = KVCache.for_model(fast16)
    cached_forward(fast16, ctx[:-1].unsqueeze(0), cache)
    depths, block = _tree_block(PARENTS)
    allowed = torch.cat([torch.ones(1 + len(PARENTS), cache.length, dtype=torch.bool), block], dim=1)
    states, _ = forward_rows(fast16, torch.cat([ctx[-1:], torch.tensor(TOKENS)]).unsqueeze(0), cache,
                             positions=cache.length + depths, allowed=allowed)
    rows = unembed(fast16, states)[0]                                         # (1 + n, V)
    scale = rows.abs().max().item()
    for i in range(-1, len(PARENTS)):
        path, j = [], i
        while j >= 0:
            path.insert(0, TOKENS[j])
            j = PARENTS[j]
        plain = fast16(torch.cat([ctx, torch.tensor(path, dtype=torch.long)]).unsqueeze(0))[0, -1]
        torch.testing.assert_close(rows[1 + i], plain, rtol=0, atol=0.02 * scale)
        assert int(rows[1 + i].argmax()) == int(plain.argmax())


class _Head(Module):
    """The shape of a drafter head: a block, a linear, a norm, and the base it reads held outside
    its children (in a dict, as the course's heads hold it)."""

    def __init__(self, base, seed: int = 0) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self._frozen = {"base": base}
        self.block = Block(base.embedding_dim, 4, hidden_dim=2 * base.embedding_dim, generator=g)
        self.fc = Linear(base.embedding_dim, base.embedding_dim, generator=g)
        self.ln = LayerNorm(base.embedding_dim)

    @property
    def base(self):
        return self._frozen["base"]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return unembed(self.base, self.ln(self.fc(self.block(hidden))))


def test_fast_model_of_any_course_module_swaps_leaves_and_keeps_its_base():
    from device_mocks import device_of

    model = _tiny_lm(seed=8)
    head = _Head(model).eval()
    fast = fast_model(head)
    assert isinstance(fast, _Head) and type(fast).__name__ == "_Head"          # same class: its own forward runs
    assert isinstance(fast.fc, PackedLinear) and isinstance(fast.block.attn.qkv, PackedLinear)
    assert fast.base is model and unwrap(fast) is head and unwrap(head) is head   # the base is not copied
    assert fast.parameters() == [] and fast.device == device_of(head) and fast.training is False
    assert fast_model(fast) is fast and unwrap(fast_model(model)) is model
    hidden = torch.randn(1, 6, model.embedding_dim, generator=torch.Generator().manual_seed(0)).to(device_of(head))
    want = head(hidden)
    torch.testing.assert_close(fast(hidden), want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        head.fc.weight.add_(1.0)                                              # a snapshot, like FastLM
    torch.testing.assert_close(fast(hidden), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="cannot be trained"):
        fast.train(True)
    half = fast_model(head, dtype="bf16")
    assert half.fc.dtype == torch.bfloat16 and unwrap(half) is head


def test_head_unembed_packs_the_bases_table_on_a_fast_head_and_matches_the_teaching_product():
    """A fast head's logits (``head_unembed``) use a packed snapshot of its base's tied table, so a
    tree level or a block of slots costs about one row; the values equal the teaching product."""
    from device_mocks import device_of

    model = _tiny_lm(seed=9)
    head = _Head(model).eval()
    fast = fast_model(head)
    packed = fast._fast["unembed"]
    assert isinstance(packed, PackedLinear) and (packed.out_features, packed.in_features) == (48, 32)
    assert "unembed" not in getattr(head, "_fast", {})                        # the teaching head: base's product
    for rows in (1, 2, 5):
        h = torch.randn(rows, model.embedding_dim, generator=torch.Generator().manual_seed(rows)).to(device_of(head))
        want = h @ model.token_embed.weight.detach().t()
        assert torch.equal(head_unembed(head, h), unembed(model, h))
        got = head_unembed(fast, h)
        assert got.shape == (rows, 48) and got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        model.token_embed.weight.add_(1.0)                                    # a snapshot, like the leaves
    torch.testing.assert_close(head_unembed(fast, h), want, rtol=1e-5, atol=1e-5)
    half = fast_model(head, dtype="bf16")
    assert half._fast["unembed"].dtype == torch.bfloat16 and head_unembed(half, h).dtype == torch.float32
    on_fast_base = _Head(fast_model(_tiny_lm(seed=9))).eval()                 # a FastLM base packs its own
    assert "unembed" not in fast_model(on_fast_base)._fast
