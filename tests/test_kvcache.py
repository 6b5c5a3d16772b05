"""Module 16: the KV cache, the cached forward pass, cached generation.

Oracles: the module 09 ``TransformerLM`` run over the whole sequence (the cached pass must
give the same logits, within 1e-4 in float32, for every split of a sequence into a cached
prefix and a new chunk); module 11's ``generate`` for the cached loop (token for token,
greedy and sampled with the same generator); hand-made tensors for the cache's bookkeeping.

Tolerance: a one-row step and a block pass add the same terms in a different order, so
float32 logits differ by a few ulps of their magnitude (|logits| < 50 here: ~1e-5); 1e-4
leaves room and still catches any wrong position or mask (those move logits by O(0.1)).
"""

from __future__ import annotations

import pytest
import torch

from g2c.kvcache import KVCache, cached_attention, cached_forward, cached_generate, prefill
from g2c.sampling import generate
from g2c.transformer import TransformerLM


def _tiny_lm(seed: int = 0, *, max_seq_len: int = 24, vocab: int = 32, dim: int = 16, layers: int = 2,
             heads: int = 2, sharpen: float = 1.0) -> TransformerLM:
    g = torch.Generator().manual_seed(seed)
    model = TransformerLM(vocab, dim, layers, heads, max_seq_len, generator=g)
    if sharpen != 1.0:
        with torch.no_grad():
            # Larger token and position embeddings: greedy chains that move from token to token
            # (a random init otherwise repeats one token) with argmax gaps > 1e-3, far above the
            # ~1e-6 float32 difference between a one-row step and a block pass.
            model.token_embed.weight.mul_(sharpen)
            model.pos_embed.weight.mul_(4 * sharpen)
    return model.eval()


def _ids(n: int, *, vocab: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


# ---- KVCache ----------------------------------------------------------------------------------

def test_kvcache_shapes_and_nbytes():
    cache = KVCache(3, 2, 4, 8, 16)
    assert len(cache.keys_buffer) == 3 and cache.keys_buffer[0].shape == (2, 4, 16, 8)
    assert cache.length == 0 and cache.keys(0).shape == (2, 4, 0, 8)
    assert cache.nbytes == 2 * 3 * 2 * 4 * 16 * 8 * 4          # K and V, L, B, H, T_max, d, float32
    assert KVCache(1, 1, 1, 1, 4, dtype=torch.bfloat16).nbytes == 2 * 4 * 2
    assert cache.lengths.tolist() == [0, 0]


def test_kvcache_rejects_bad_sizes():
    with pytest.raises(ValueError, match="max_seq_len"):
        KVCache(1, 1, 1, 1, 0)
    with pytest.raises(TypeError, match="num_heads"):         # a wrong type is a TypeError (the type rule)
        KVCache(1, 1, 1.5, 1, 4)


def test_kvcache_for_model_matches_model():
    model = _tiny_lm()
    cache = KVCache.for_model(model, batch_size=3)
    assert (cache.num_layers, cache.batch_size, cache.num_heads, cache.head_dim, cache.max_seq_len) == (2, 3, 2, 8, 24)
    with pytest.raises(ValueError, match="max_seq_len"):
        KVCache.for_model(model, max_seq_len=25)


def test_kvcache_append_writes_after_pointer():
    cache = KVCache(2, 1, 2, 3, 8)
    k1, v1 = torch.randn(1, 2, 3, 3), torch.randn(1, 2, 3, 3)
    cache.append(0, k1, v1)
    cache.append(1, k1 + 1, v1 + 1)
    cache.advance(3)
    k2, v2 = torch.randn(1, 2, 2, 3), torch.randn(1, 2, 2, 3)
    cache.append(0, k2, v2)
    assert torch.equal(cache.keys_buffer[0][:, :, :3], k1)
    assert torch.equal(cache.keys_buffer[0][:, :, 3:5], k2)
    assert torch.equal(cache.values_buffer[0][:, :, 3:5], v2)
    assert torch.equal(cache.keys_buffer[1][:, :, :3], k1 + 1)
    assert cache.length == 3                                   # append never moves the pointer


def test_kvcache_append_returns_visible_rows():
    cache = KVCache(1, 1, 1, 2, 8)
    a = torch.arange(6.0).view(1, 1, 3, 2)
    cache.append(0, a, -a)
    cache.advance(3)
    b = torch.full((1, 1, 1, 2), 9.0)
    keys, values = cache.append(0, b, -b)
    assert keys.shape == (1, 1, 4, 2) and values.shape == (1, 1, 4, 2)
    assert torch.equal(keys, torch.cat([a, b], dim=2)) and torch.equal(values, -torch.cat([a, b], dim=2))
    assert keys.data_ptr() == cache.keys_buffer[0].data_ptr()   # a view of the buffer, no copy


def test_kvcache_append_capacity_error_names_max_seq_len():
    cache = KVCache(1, 1, 1, 2, 4)
    cache.append(0, torch.zeros(1, 1, 3, 2), torch.zeros(1, 1, 3, 2))
    cache.advance(3)
    with pytest.raises(ValueError, match=r"max_seq_len=4"):
        cache.append(0, torch.zeros(1, 1, 2, 2), torch.zeros(1, 1, 2, 2))
    with pytest.raises(ValueError, match=r"\(B, H, T, d\)"):
        cache.append(0, torch.zeros(1, 2, 1, 2), torch.zeros(1, 2, 1, 2))


def test_kvcache_crop_is_pointer_rollback():
    cache = KVCache(1, 1, 1, 2, 8)
    rows = torch.arange(10.0).view(1, 1, 5, 2)
    cache.append(0, rows, rows)
    cache.advance(5)
    buffer_before = cache.keys_buffer[0].clone()
    ptr = cache.keys_buffer[0].data_ptr()
    assert cache.crop(2) == 0                                  # bytes moved
    assert cache.length == 2 and torch.equal(cache.keys(0), rows[:, :, :2])
    assert cache.keys_buffer[0].data_ptr() == ptr and torch.equal(cache.keys_buffer[0], buffer_before)
    new = torch.full((1, 1, 1, 2), -1.0)
    keys, _ = cache.append(0, new, new)                        # overwrites the stale row 2
    assert torch.equal(keys, torch.cat([rows[:, :, :2], new], dim=2))


def test_kvcache_crop_rejects_growth():
    cache = KVCache(1, 1, 1, 2, 8)
    with pytest.raises(ValueError, match="crop can only roll back"):
        cache.crop(1)
    with pytest.raises(ValueError, match="crop can only roll back"):
        cache.crop(-1)


# ---- cached attention and forward -------------------------------------------------------------

def test_cached_attention_matches_full_attention():
    model = _tiny_lm()
    attn = model.blocks[0].attn
    x = torch.randn(1, 7, 16, generator=torch.Generator().manual_seed(3)).to(model.device)   # --fake-device
    full = attn(x)                                             # (1, 7, D)
    cache = KVCache.for_model(model)
    out = [cached_attention(attn, x[:, :4], cache, 0)]
    cache.advance(4)
    for t in range(4, 7):
        out.append(cached_attention(attn, x[:, t:t + 1], cache, 0))
        cache.advance(1)
    torch.testing.assert_close(torch.cat(out, dim=1), full, atol=1e-5, rtol=0)


def test_cached_attention_chunk_is_causal_with_offset():
    # A 3-row chunk after 2 cached rows: query j must see keys 0..2+j only.
    model = _tiny_lm()
    attn = model.blocks[0].attn
    x = torch.randn(1, 5, 16, generator=torch.Generator().manual_seed(4)).to(model.device)
    cache = KVCache.for_model(model)
    cached_attention(attn, x[:, :2], cache, 0)
    cache.advance(2)
    chunk = cached_attention(attn, x[:, 2:], cache, 0)
    torch.testing.assert_close(chunk, attn(x)[:, 2:], atol=1e-5, rtol=0)


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 5])
def test_cached_forward_matches_full_recompute_every_split(chunk):
    model = _tiny_lm(sharpen=5.0)
    ids = _ids(14).unsqueeze(0)
    full = model(ids)                                          # (1, 14, V)
    for split in range(1, 14 - chunk + 1):
        cache = KVCache.for_model(model)
        cached_forward(model, ids[:, :split], cache)
        logits = cached_forward(model, ids[:, split:split + chunk], cache)
        assert cache.length == split + chunk
        torch.testing.assert_close(logits, full[:, split:split + chunk], atol=1e-4, rtol=0)


def test_cached_forward_batch_rows_are_independent():
    model = _tiny_lm()
    ids = torch.stack([_ids(9, seed=5), _ids(9, seed=6)])      # (2, 9)
    logits, cache = prefill(model, ids[:, :6])
    step = cached_forward(model, ids[:, 6:], cache)
    torch.testing.assert_close(step, model(ids)[:, 6:], atol=1e-4, rtol=0)


def test_cached_forward_validates():
    model = _tiny_lm(max_seq_len=8)
    cache = KVCache.for_model(model)
    cached_forward(model, _ids(6).unsqueeze(0), cache)
    with pytest.raises(ValueError, match="max_seq_len=8"):
        cached_forward(model, _ids(3).unsqueeze(0), cache)
    with pytest.raises(ValueError, match=r"\(B, T\)"):
        cached_forward(model, _ids(3), cache)
    with pytest.raises(ValueError, match="batch size 2"):
        cached_forward(model, torch.zeros(2, 1, dtype=torch.long), cache)
    with pytest.raises(TypeError, match="KVCache"):
        cached_forward(model, torch.zeros(1, 1, dtype=torch.long), None)


# ---- cached generation ------------------------------------------------------------------------

def test_cached_generate_greedy_matches_generate():
    model = _tiny_lm(seed=2, max_seq_len=32, sharpen=5.0)
    prompt = _ids(5, seed=7)
    want = generate(model, prompt, 20, temperature=0.0)
    got = cached_generate(model, prompt, 20, temperature=0.0)
    assert got.tolist() == want.tolist()
    assert len(set(got[5:].tolist())) > 5                      # a real chain, not a constant


def test_cached_generate_sampled_matches_generate():
    model = _tiny_lm(seed=3, max_seq_len=32)
    prompt = _ids(4, seed=8)
    kw = dict(temperature=0.9, top_k=10, top_p=0.9, repetition_penalty=1.3)
    want = generate(model, prompt, 25, generator=torch.Generator().manual_seed(11), **kw)
    got = cached_generate(model, prompt, 25, generator=torch.Generator().manual_seed(11), **kw)
    assert got.tolist() == want.tolist()
    other = cached_generate(model, prompt, 25, generator=torch.Generator().manual_seed(12), **kw)
    assert other.tolist() != got.tolist()                      # the generator is really used


def test_cached_generate_stops_at_eos_and_budget():
    model = _tiny_lm(seed=2, max_seq_len=32, sharpen=5.0)
    prompt = _ids(5, seed=7)
    chain = generate(model, prompt, 12, temperature=0.0).tolist()
    eos = chain[8]
    got = cached_generate(model, prompt, 12, temperature=0.0, eos_id=eos).tolist()
    assert got == chain[:chain.index(eos, 5) + 1]
    assert cached_generate(model, prompt, 0).tolist() == prompt.tolist()


def test_cached_generate_never_scores_the_token_it_stops_at():
    # The last emitted token (budget or eos) is never fed: its K/V would be work for a step that does not
    # happen. The cache then holds every emitted token but the last.
    model = _tiny_lm(seed=2, max_seq_len=32, sharpen=5.0)
    prompt = _ids(5, seed=7)
    for kwargs in ({}, {"eos_id": generate(model, prompt, 12, temperature=0.0)[9].item()}):
        cache = KVCache.for_model(model)
        out = cached_generate(model, prompt, 12, temperature=0.0, cache=cache, **kwargs)
        assert cache.length == len(out) - 1, (kwargs, cache.length, len(out))


def test_cached_generate_repetition_penalty_covers_tokens_outside_the_window():
    # Like module 11, the penalty covers every token so far, also those cropped out of the window. Token 27
    # is the model's greedy choice after the last 10 prompt tokens and appears only at position 0, outside
    # the window: the rule penalises it (the choice moves to 0); a penalty over the window alone keeps 27.
    model = _tiny_lm(seed=4, max_seq_len=10, sharpen=5.0)
    tail = _ids(13, seed=13).tolist()
    assert 27 not in tail and int(model(torch.tensor([tail[-10:]]))[0, -1].argmax()) == 27
    prompt = [27, *tail]
    got = cached_generate(model, prompt, 3, temperature=0.0, repetition_penalty=1e3, refill_tokens=10).tolist()
    assert got[len(prompt)] == 0
    assert got == generate(model, prompt, 3, temperature=0.0, repetition_penalty=1e3).tolist()


def test_cached_generate_full_refill_matches_generate_past_window():
    # refill_tokens = max_seq_len re-prefills the whole window each step past it: module 11 exactly.
    model = _tiny_lm(seed=4, max_seq_len=10, sharpen=5.0)
    prompt = _ids(4, seed=9)
    want = generate(model, prompt, 20, temperature=0.0)
    got = cached_generate(model, prompt, 20, temperature=0.0, refill_tokens=10)
    assert got.tolist() == want.tolist()


def test_cached_generate_refills_past_window():
    # Default refill_tokens = max_seq_len // 2 = 5: when the cache is full the last 5 tokens are
    # re-prefilled at positions 0..4, and decoding continues incrementally from there.
    model = _tiny_lm(seed=4, max_seq_len=10, sharpen=5.0)
    prompt = _ids(4, seed=9).tolist()
    ids, ctx_start = list(prompt), 0
    for _ in range(20):                                        # the rule, written out by hand
        if len(ids) - ctx_start > 10:
            ctx_start = len(ids) - 5
        ctx = torch.tensor(ids[ctx_start:]).unsqueeze(0)
        ids.append(int(model(ctx)[0, -1].argmax()))
    got = cached_generate(model, prompt, 20, temperature=0.0)
    assert got.tolist() == ids
    cache = KVCache.for_model(model)
    cached_generate(model, prompt, 20, temperature=0.0, cache=cache)
    assert cache.length <= 10


def test_cached_generate_long_prompt_is_cropped_like_generate():
    model = _tiny_lm(seed=5, max_seq_len=8, sharpen=5.0)
    prompt = _ids(12, seed=10)
    want = generate(model, prompt, 1, temperature=0.0)
    assert cached_generate(model, prompt, 1, temperature=0.0).tolist() == want.tolist()


def test_cached_generate_validates():
    model = _tiny_lm()
    with pytest.raises(ValueError, match="refill_tokens"):
        cached_generate(model, [1, 2], 3, refill_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        cached_generate(model, [1, 2], 3, temperature=-1.0)
    with pytest.raises(ValueError, match="prompt_ids"):
        cached_generate(model, [], 3)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        cached_generate(model, [1, 99], 3)


def test_cached_generate_restores_training_mode():
    model = _tiny_lm().train()
    cached_generate(model, [1, 2], 2, temperature=0.0)
    assert model.training


@pytest.mark.ladder
def test_cached_generate_matches_generate_on_ladder():
    from g2c.assets import load_model

    model, tok = load_model("StoryLM-1M", device="cpu")
    prompt = tok.encode("Once upon a time, there was a little")
    want = generate(model, prompt, 24, temperature=0.0)
    assert cached_generate(model, prompt, 24, temperature=0.0).tolist() == want.tolist()
    # bfloat16 weights and cache: the cached loop still equals the uncached loop at that dtype
    # (same roundings, both score the same rows); the cache takes half the bytes.
    half, _ = load_model("StoryLM-1M", device="cpu", dtype="bfloat16")
    assert half.token_embed.weight.dtype == torch.bfloat16
    want_half = generate(half, prompt, 24, temperature=0.0)
    assert cached_generate(half, prompt, 24, temperature=0.0).tolist() == want_half.tolist()
    assert KVCache.for_model(half).nbytes * 2 == KVCache.for_model(model).nbytes


def test_load_model_rejects_unsupported_dtype():
    from g2c.assets import load_model

    with pytest.raises(ValueError, match="bfloat16"):
        load_model("StoryLM-1M", device="cpu", dtype=torch.float64)


@pytest.mark.parametrize("layer, error", [(-1, ValueError), (2, ValueError), (1.0, TypeError), (True, TypeError)])
def test_kvcache_append_refuses_a_layer_outside_the_cache(layer, error):
    cache = KVCache(2, 1, 2, 4, 8)
    kv = torch.zeros(1, 2, 1, 4)
    with pytest.raises(error, match=r"layer must be an int in \[0, 2\)"):     # a wrong type: TypeError
        cache.append(layer, kv, kv)


# ---- the trunk: forward_rows and commit_rows --------------------------------------------------
# The oracle is the block loop the course ran before it had one trunk (tree_forward's, the lineage
# pass's and the masked pass's, all the same loop): the whole sequence, every row, one explicit
# boolean mask, no cache. Float32, dim 16: the trunk adds the same terms in another order, so
# states differ by ~1e-7; 1e-5 still catches a wrong position, mask row or layer (O(0.1)).

def _reference_rows(model, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor, keep=()):
    """Final states (T, D) and the kept layers' outputs (T, L, D) of one sequence (T,) with
    positions (T,) and mask (T, T): the pre-trunk block loop, from the module 09 weights."""
    from device_mocks import device_of

    from g2c.kvcache import masked_attention

    dev = device_of(model)                                    # the model's device (also under --fake-device)
    ids, positions, allowed = ids.to(dev), positions.to(dev), allowed.to(dev)
    x = (model.token_embed.weight[ids] + model.pos_embed.weight[positions]).unsqueeze(0)    # (1, T, D)
    T, kept = ids.numel(), {}
    for i, blk in enumerate(model.blocks):
        D, H = blk.attn.dim, blk.attn.num_heads
        q, k, v = blk.attn.qkv(blk.ln_1(x)).split(D, dim=-1)
        q, k, v = (t.view(1, T, H, D // H).transpose(1, 2) for t in (q, k, v))              # (1, H, T, d)
        y = masked_attention(q, k, v, allowed)
        x = x + blk.attn.proj(y.transpose(1, 2).reshape(1, T, D))
        x = x + blk.mlp(blk.ln_2(x))
        kept[i] = x[0]
    states = model.ln_final(x)[0]
    return states, (torch.stack([kept[i] for i in keep], dim=1) if keep else None)


def _tree_allowed(ctx_len: int, parents: list[int]) -> torch.Tensor:
    """(C + n, C + n) bool: the context causal, node i reads the context, its ancestors, itself."""
    n = len(parents)
    allowed = torch.zeros(ctx_len + n, ctx_len + n, dtype=torch.bool)
    allowed[:ctx_len, :ctx_len] = torch.ones(ctx_len, ctx_len, dtype=torch.bool).tril()
    allowed[ctx_len:, :ctx_len] = True
    for i, p in enumerate(parents):
        if p >= 0:
            allowed[ctx_len + i, ctx_len:] = allowed[ctx_len + p, ctx_len:]
        allowed[ctx_len + i, ctx_len + i] = True
    return allowed


PARENTS = [-1, -1, 0, 0, 1, 2, 5]                            # a root with two branches, depth up to 3
TOKENS = [4, 9, 1, 30, 7, 7, 12]


def _depths(parents: list[int]) -> list[int]:
    depth = []
    for p in parents:
        depth.append(1 if p < 0 else depth[p] + 1)
    return depth


@pytest.mark.parametrize("rows", [10, 1, 5])                 # prefill, one decode row, a k + 1 chain
def test_forward_rows_chain_matches_the_reference_pass(rows):
    from g2c.kvcache import cached_hidden_states, forward_rows

    model = _tiny_lm(3)
    ids = _ids(16, seed=4)
    cache = KVCache.for_model(model)
    cached_hidden_states(model, ids[:16 - rows].unsqueeze(0), cache)
    before = cache.length
    states, kept = forward_rows(model, ids[before:].unsqueeze(0), cache)
    assert cache.length == before and kept is None            # written, not committed
    assert states.shape == (1, rows, 16)
    ref, _ = _reference_rows(model, ids, torch.arange(16), torch.ones(16, 16, dtype=torch.bool).tril())
    torch.testing.assert_close(states[0], ref[before:], atol=1e-5, rtol=0)
    # cached_hidden_states is forward_rows + advance: same states, pointer moved by T
    again = cached_hidden_states(model, ids[before:].unsqueeze(0), cache)
    assert cache.length == 16
    torch.testing.assert_close(again, states, atol=0, rtol=0)


def test_forward_rows_tree_mask_and_kept_layers_match_the_reference_pass():
    from g2c.kvcache import forward_rows, unembed

    model = _tiny_lm(5, layers=3)
    ctx = _ids(6, seed=6)
    C, n = ctx.numel(), len(PARENTS)
    cache = KVCache.for_model(model)
    cached_forward(model, ctx[:-1].unsqueeze(0), cache)                      # all but the root
    depths = torch.tensor([0] + _depths(PARENTS))
    block = _tree_allowed(1, PARENTS)                                        # root + nodes (1 + n, 1 + n)
    allowed = torch.cat([torch.ones(1 + n, C - 1, dtype=torch.bool), block], dim=1)
    new = torch.cat([ctx[-1:], torch.tensor(TOKENS)]).unsqueeze(0)          # (1, 1 + n)
    states, kept = forward_rows(model, new, cache, positions=C - 1 + depths, allowed=allowed, keep_layers=(2, 0))
    assert cache.length == C - 1 and kept.shape == (1, 1 + n, 2, 16)
    full_ids = torch.cat([ctx, torch.tensor(TOKENS)])
    ref, ref_kept = _reference_rows(model, full_ids, torch.cat([torch.arange(C), C - 1 + depths[1:]]),
                                    _tree_allowed(C, PARENTS), keep=(2, 0))
    torch.testing.assert_close(states[0], ref[C - 1:], atol=1e-5, rtol=0)
    torch.testing.assert_close(kept[0], ref_kept[C - 1:], atol=1e-5, rtol=0)
    # and each node's row is the plain model over context + its root-to-node path
    for i in range(n):
        path, j = [], i
        while j >= 0:
            path.insert(0, TOKENS[j])
            j = PARENTS[j]
        plain = model(torch.cat([ctx, torch.tensor(path)]).unsqueeze(0))[0, -1]
        torch.testing.assert_close(unembed(model, states[0, 1 + i]), plain, atol=1e-4, rtol=0)


def test_commit_rows_moves_a_pointer_for_a_chain_and_gathers_a_tree_path():
    from g2c.kvcache import commit_rows, forward_rows

    model = _tiny_lm(2)
    ctx = _ids(5, seed=8)
    C, n = ctx.numel(), len(PARENTS)
    cache = KVCache.for_model(model)
    cached_forward(model, ctx[:-1].unsqueeze(0), cache)
    depths = torch.tensor([0] + _depths(PARENTS))
    allowed = torch.cat([torch.ones(1 + n, C - 1, dtype=torch.bool), _tree_allowed(1, PARENTS)], dim=1)
    forward_rows(model, torch.cat([ctx[-1:], torch.tensor(TOKENS)]).unsqueeze(0), cache,
                 positions=C - 1 + depths, allowed=allowed)
    path = [0, 2, 5]                                                          # n0 -> n2 -> n5
    moved = commit_rows(cache, C, path)                                       # the root (row C - 1) commits as written
    assert cache.length == C + 3
    assert moved == model.num_layers * 2 * 2 * 2 * 8 * 4                      # L x (K, V) x 2 moved rows x H*d fp32
    plain = KVCache.for_model(model)
    cached_forward(model, torch.cat([ctx, torch.tensor([TOKENS[i] for i in path])]).unsqueeze(0), plain)
    for layer in range(model.num_layers):
        torch.testing.assert_close(cache.keys(layer), plain.keys(layer), atol=1e-5, rtol=0)
        torch.testing.assert_close(cache.values(layer), plain.values(layer), atol=1e-5, rtol=0)
    # a chain keeps a prefix that already sits in place: a pointer move, nothing copied
    chain = KVCache.for_model(model)
    cached_forward(model, ctx[:-1].unsqueeze(0), chain)
    forward_rows(model, torch.tensor([[int(ctx[-1]), 3, 4, 5]]), chain)
    assert commit_rows(chain, C - 1, [0, 1, 2]) == 0 and chain.length == C + 2
    with pytest.raises(ValueError, match="strictly increasing"):
        commit_rows(chain, chain.length, [1, 0])
    with pytest.raises(ValueError, match="past ctx_len"):
        commit_rows(chain, chain.length - 1, [0])


def test_forward_rows_validates():
    from g2c.kvcache import forward_rows

    model = _tiny_lm(max_seq_len=8)
    cache = KVCache.for_model(model)
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match=r"positions must be integers of shape \(T,\)"):
        forward_rows(model, ids, cache, positions=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=r"positions must be in \[0, max_seq_len=8\)"):
        forward_rows(model, ids, cache, positions=torch.tensor([0, 1, 8]))
    with pytest.raises(ValueError, match=r"allowed must be a bool mask \(\.\.\., T, S\) = \(\.\.\., 3, 3\)"):
        forward_rows(model, ids, cache, allowed=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="allowed must be a bool mask"):
        forward_rows(model, ids, cache, allowed=torch.zeros(3, 3))              # an additive float mask
    with pytest.raises(ValueError, match=r"keep_layers \(2,\) name blocks outside 0\.\.1"):
        forward_rows(model, ids, cache, allowed=torch.ones(3, 3, dtype=torch.bool).tril(), keep_layers=(2,))
    with pytest.raises(ValueError, match="keep_layers must be a tuple"):
        forward_rows(model, ids, cache, allowed=torch.ones(3, 3, dtype=torch.bool).tril(), keep_layers=1)
    with pytest.raises(ValueError, match="max_seq_len=8"):
        forward_rows(model, torch.zeros(1, 9, dtype=torch.long), cache)
    with pytest.raises(TypeError, match="KVCache"):
        forward_rows(model, ids, None)
    assert cache.length == 0
