"""Module 09: the pre-norm block, ``TransformerLM``, the ladder presets and the GPT-2 export.

Oracles: a reference block written here with ``torch.nn.functional`` ops, behavioural
invariants (pre-norm identity, causality, tying), parameter counts from the closed-form
formula, and Hugging Face's ``GPT2LMHeadModel`` as an independent implementation.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from g2c.transformer import LADDER, Block, StoryLMConfig, TransformerLM

V, D, L, H, S = 50, 32, 2, 4, 16   # vocabulary, width, layers, heads, context


def _perturb(module, *, seed: int, std: float = 0.1) -> None:
    """Add noise to every parameter (LayerNorm weights away from 1, biases away from 0),
    so a forgotten bias, gain or transpose cannot hide behind the default initialisation."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(torch.randn(p.shape, generator=g) * std)


def _model(*, seed: int = 0, hidden_dim: int | None = None, std: float = 0.1) -> TransformerLM:
    model = TransformerLM(V, D, L, H, S, hidden_dim=hidden_dim, generator=torch.Generator().manual_seed(seed))
    _perturb(model, seed=seed + 1, std=std)
    return model.eval()


def _ids(b: int = 2, t: int = S, *, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


def _reference_block(blk: Block, x: torch.Tensor) -> torch.Tensor:
    """GPT-2's pre-norm block from torch.nn.functional ops and the block's own tensors."""
    B, T, D_ = x.shape
    Hh = blk.attn.num_heads

    def ln(mod, t):
        return F.layer_norm(t, (D_,), mod.weight, mod.bias, eps=1e-5)

    q, k, v = F.linear(ln(blk.ln_1, x), blk.attn.qkv.weight, blk.attn.qkv.bias).split(D_, dim=-1)
    q, k, v = (t.reshape(B, T, Hh, D_ // Hh).permute(0, 2, 1, 3) for t in (q, k, v))
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(0, 2, 1, 3).reshape(B, T, D_)
    x = x + F.linear(y, blk.attn.proj.weight, blk.attn.proj.bias)
    h = F.gelu(F.linear(ln(blk.ln_2, x), blk.mlp.fc.weight, blk.mlp.fc.bias))   # exact erf GELU
    return x + F.linear(h, blk.mlp.proj.weight, blk.mlp.proj.bias)


def _block(seed: int = 0, hidden_dim: int = 4 * D) -> Block:
    blk = Block(D, H, hidden_dim=hidden_dim, generator=torch.Generator().manual_seed(seed))
    _perturb(blk, seed=seed + 1)
    return blk


# -- Block ---------------------------------------------------------------------------------

@pytest.mark.parametrize("hidden_dim", [4 * D, 48])
def test_block_matches_reference(hidden_dim):
    blk = _block(hidden_dim=hidden_dim)
    x = torch.randn(2, 9, D, generator=torch.Generator().manual_seed(2)).to(blk.device)
    out = blk(x)
    assert out.shape == (2, 9, D)
    torch.testing.assert_close(out, _reference_block(blk, x), atol=1e-5, rtol=1e-5)


def test_block_is_pre_norm():
    # With both sub-blocks' output projections zeroed, a pre-norm block is the identity on
    # the residual stream; a post-norm block would return LayerNorm(x) instead.
    blk = _block()
    with torch.no_grad():
        for lin in (blk.attn.proj, blk.mlp.proj):
            lin.weight.zero_()
            lin.bias.zero_()
    x = (3.0 + 5.0 * torch.randn(2, 6, D, generator=torch.Generator().manual_seed(3))).to(blk.device)
    torch.testing.assert_close(blk(x), x, atol=0, rtol=0)


def test_block_is_causal():
    blk = _block()
    x = torch.randn(1, 8, D, generator=torch.Generator().manual_seed(4)).to(blk.device)
    x2 = x.clone()
    x2[:, 5] += 1.0
    torch.testing.assert_close(blk(x2)[:, :5], blk(x)[:, :5], atol=0, rtol=0)


# -- TransformerLM -------------------------------------------------------------------------

def test_transformer_default_hidden_dim_is_four_times_width():
    model = TransformerLM(V, D, L, H, S)
    assert model.hidden_dim == 4 * D
    assert model.blocks[0].mlp.fc.weight.shape == (4 * D, D)


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocab_size=0), "vocab_size must be >= 1"),
    (dict(num_layers=0), "num_layers must be >= 1"),
    (dict(num_heads=5), "not divisible by num_heads 5"),
])
def test_transformer_rejects_bad_sizes(kwargs, match):
    args = dict(vocab_size=V, embedding_dim=D, num_layers=L, num_heads=H, max_seq_len=S) | kwargs
    with pytest.raises(ValueError, match=match):
        TransformerLM(**args)


def test_transformer_hidden_states_shape():
    model = _model()
    with torch.no_grad():
        model.ln_final.weight.fill_(1.0)
        model.ln_final.bias.zero_()
    hs = model.hidden_states(_ids(3, 11))
    assert hs.shape == (3, 11, D) and hs.dtype == torch.float32
    # The trunk ends with ln_final (unit gain, zero shift here): every row is normalised.
    torch.testing.assert_close(hs.mean(-1), torch.zeros(3, 11), atol=1e-5, rtol=0)
    torch.testing.assert_close(hs.var(-1, unbiased=False), torch.ones(3, 11), atol=1e-3, rtol=0)


def test_transformer_hidden_states_match_reference_stack():
    model = _model()
    ids = _ids(2, 10)
    x = model.token_embed.weight[ids] + model.pos_embed.weight[:10]
    for blk in model.blocks:
        x = _reference_block(blk, x)
    ref = F.layer_norm(x, (D,), model.ln_final.weight, model.ln_final.bias, eps=1e-5)
    torch.testing.assert_close(model.hidden_states(ids), ref, atol=1e-5, rtol=1e-5)


def test_transformer_unembed_is_the_tied_matmul_on_any_leading_shape():
    torch.manual_seed(0)
    model = TransformerLM(V, D, L, H, S)
    h = torch.randn(2, 3, 5, D).to(model.device)
    out = model.unembed(h)
    assert out.shape == (2, 3, 5, V)
    torch.testing.assert_close(out, torch.einsum("...d,vd->...v", h, model.token_embed.weight))


def test_transformer_unembedding_is_tied():
    model = _model()
    ids = _ids(2, 12)
    logits = model(ids)
    assert logits.shape == (2, 12, V) and logits.dtype == torch.float32
    torch.testing.assert_close(logits, model.hidden_states(ids) @ model.token_embed.weight.t(),
                               atol=1e-5, rtol=1e-5)
    # No separate output matrix: the only (V, D) parameter is the token embedding ...
    assert [n for n, p in model.named_parameters() if p.shape == (V, D)] == ["token_embed.weight"]
    # ... and it receives gradient through the unembedding even for tokens never input.
    unused = sorted(set(range(V)) - set(ids.flatten().tolist()))[0]
    logits.sum().backward()
    assert model.token_embed.weight.grad[unused].abs().sum() > 0


def test_transformer_is_causal():
    model = _model()
    ids = _ids(1, S, seed=5)
    with torch.no_grad():
        base = model(ids)
        for t in range(S):
            ids2 = ids.clone()
            ids2[0, t] = (ids[0, t] + 1) % V
            out = model(ids2)
            torch.testing.assert_close(out[:, :t], base[:, :t], atol=0, rtol=0)
            assert not torch.allclose(out[:, t], base[:, t])


def test_transformer_batch_rows_are_independent():
    model = _model()
    ids = _ids(3, 9)
    with torch.no_grad():
        torch.testing.assert_close(model(ids)[1:2], model(ids[1:2]), atol=1e-5, rtol=1e-5)


def test_transformer_rejects_too_long_sequence():
    with pytest.raises(ValueError, match=r"T=17 exceeds max_seq_len=16"):
        _model()(_ids(1, S + 1))


@pytest.mark.parametrize("ids", [torch.zeros(S, dtype=torch.long), torch.zeros(1, 2, 3, dtype=torch.long)])
def test_transformer_rejects_non_2d_ids(ids):
    with pytest.raises(ValueError, match=r"integer ids of shape \(B, T\)"):
        _model()(ids)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bool])
def test_transformer_rejects_non_integer_ids(dtype):
    with pytest.raises(ValueError, match=r"integer ids of shape \(B, T\)"):
        _model()(torch.zeros(1, 4, dtype=dtype))


def test_transformer_rejects_empty_sequence():
    with pytest.raises(ValueError, match=r"empty sequence"):
        _model()(torch.zeros(1, 0, dtype=torch.long))


def test_transformer_set_fused_attention_matches_course_path():
    model = _model()
    ids = _ids(2, S)
    with torch.no_grad():
        course = model(ids)
        assert model.set_fused_attention() is model
        assert all(blk.attn.fused for blk in model.blocks)
        fused = model(ids)
        model.set_fused_attention(False)
        assert not any(blk.attn.fused for blk in model.blocks)
    torch.testing.assert_close(fused, course, atol=1e-5, rtol=1e-5)


# -- StoryLMConfig and the ladder ----------------------------------------------------------

def _gpt2_param_count(V_: int, D_: int, L_: int, S_: int, hidden: int) -> int:
    """Closed form: embeddings + L blocks + final LayerNorm; the unembedding is tied (free)."""
    ln = 2 * D_
    attn = (D_ * 3 * D_ + 3 * D_) + (D_ * D_ + D_)
    mlp = (D_ * hidden + hidden) + (hidden * D_ + D_)
    return V_ * D_ + S_ * D_ + L_ * (2 * ln + attn + mlp) + ln


def test_storylm_config_builds_its_shape():
    cfg = StoryLMConfig("tiny", vocab_size=V, embedding_dim=D, num_layers=L, num_heads=H, max_seq_len=S)
    model = cfg.build(generator=torch.Generator().manual_seed(0))
    assert (model.vocab_size, model.embedding_dim, len(model.blocks), model.num_heads, model.max_seq_len) == (
        V, D, L, H, S)
    assert cfg.to_dict()["embedding_dim"] == D


@pytest.mark.parametrize("name, approx_millions", [("StoryLM-1M", 1.35), ("StoryLM-5M", 5.85),
                                                   ("StoryLM-30M", 30.6)])
def test_storylm_ladder_parameter_counts(name, approx_millions):
    cfg = LADDER[name]
    expected = _gpt2_param_count(cfg.vocab_size, cfg.embedding_dim, cfg.num_layers, cfg.max_seq_len,
                                 4 * cfg.embedding_dim)
    assert cfg.build().num_parameters() == expected
    assert expected / 1e6 == pytest.approx(approx_millions, abs=0.01)   # the name on the tin


def test_storylm_ladder_shapes_follow_conventions():
    shapes = {n: (c.vocab_size, c.max_seq_len, c.embedding_dim, c.num_layers, c.num_heads) for n, c in LADDER.items()}
    assert shapes == {"StoryLM-1M": (4096, 256, 128, 4, 4), "StoryLM-5M": (4096, 256, 256, 6, 8),
                      "StoryLM-30M": (4096, 256, 512, 9, 8)}


# -- export to GPT-2 -----------------------------------------------------------------------

@pytest.mark.parametrize("hidden_dim", [None, 48])
def test_export_logits_match_gpt2(hidden_dim):
    pytest.importorskip("transformers")
    from g2c.transformer.export import to_hf_gpt2

    model = _model(hidden_dim=hidden_dim)
    hf = to_hf_gpt2(model)
    assert not hf.training and hf.dtype == torch.float32
    assert hf.lm_head.weight.data_ptr() == hf.transformer.wte.weight.data_ptr()   # tied
    ids = _ids(2, S, seed=6)
    with torch.no_grad():
        ours = model(ids)
        theirs = hf(ids).logits
    assert (theirs - ours).abs().max().item() <= 1e-4


def test_export_greedy_generate_matches_gpt2():
    pytest.importorskip("transformers")
    from g2c.transformer.export import to_hf_gpt2

    # Larger weights (std 0.5) make the logits peaked and the greedy path varied; the margin
    # check below makes sure no step is a near-tie that float round-off (~1e-6) could flip.
    model = _model(seed=3, std=0.5)
    hf = to_hf_gpt2(model)
    prompt = torch.tensor([1, 7, 3, 9])
    n = S - len(prompt)                                   # stay inside GPT-2's n_positions
    ours = prompt.clone()
    with torch.no_grad():       # greedy by argmax over the whole context (module 11's generate comes later)
        for _ in range(n):
            ours = torch.cat([ours, model(ours[None])[0, -1].argmax().view(1)])
    theirs = hf.generate(prompt[None], max_new_tokens=n, do_sample=False, pad_token_id=0)[0]
    assert ours.tolist() == theirs.tolist()
    assert len(set(ours[len(prompt):].tolist())) > 1      # not a degenerate constant chain
    with torch.no_grad():
        top2 = model(ours[None, :-1])[0, len(prompt) - 1:].topk(2, dim=-1).values
    assert (top2[:, 0] - top2[:, 1]).min().item() > 1e-4


def test_export_rejects_non_transformer():
    pytest.importorskip("transformers")
    from g2c.transformer.export import to_hf_gpt2

    with pytest.raises(TypeError, match="expects a g2c.transformer.TransformerLM"):
        to_hf_gpt2(Block(D, H, hidden_dim=4 * D))


def test_export_without_transformers_names_the_fix(monkeypatch):
    from g2c.transformer.export import to_hf_gpt2

    monkeypatch.setitem(sys.modules, "transformers", None)    # makes `import transformers` fail
    with pytest.raises(ImportError, match="pip install transformers"):
        to_hf_gpt2(TransformerLM(V, D, L, H, S))
