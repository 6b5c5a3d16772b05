"""Module 09: export a ``TransformerLM`` to Hugging Face's ``GPT2LMHeadModel``.

The course model is GPT-2-shaped (CONVENTIONS §4), so every tensor has a GPT-2 twin.
The only layout difference: GPT-2's ``Conv1D`` layers store their weight as
(in_features, out_features), the transpose of the course ``Linear`` weight (out, in).

    from g2c.transformer.export import to_hf_gpt2
    hf = to_hf_gpt2(model)           # GPT2LMHeadModel, eval mode, float32
    hf(ids).logits                   # equals model(ids) to float32 round-off

``transformers`` is imported lazily: the course runs without it (it is in the ``dev``
extra, used as a reference implementation).

Shape letters: D width, V vocabulary.
"""

from __future__ import annotations

import torch

__all__ = ["to_hf_gpt2"]


def _copy(dst: torch.Tensor, src: torch.Tensor, name: str) -> None:
    if tuple(dst.shape) != tuple(src.shape):
        raise ValueError(f"to_hf_gpt2: {name} has shape {tuple(src.shape)} in the course model "
                         f"but GPT-2 expects {tuple(dst.shape)}")
    dst.copy_(src.detach().to(device=dst.device, dtype=dst.dtype))


def to_hf_gpt2(model):
    """A ``transformers.GPT2LMHeadModel`` holding the same weights as ``model``.

    Args:
        model: a ``g2c.transformer.TransformerLM``.

    Returns:
        ``GPT2LMHeadModel`` in eval mode, float32, on CPU, with exact (erf) GELU,
        LayerNorm eps 1e-5, no dropout, and ``lm_head`` tied to ``wte``.

    Raises:
        ImportError: ``transformers`` is not installed.
        TypeError: ``model`` is not a ``TransformerLM``.
    """
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("g2c.transformer.export.to_hf_gpt2 needs the transformers library: "
                          "pip install transformers (it is in the dev extra)") from e
    from g2c.transformer import TransformerLM

    if not isinstance(model, TransformerLM):
        raise TypeError(f"to_hf_gpt2 expects a g2c.transformer.TransformerLM, got {type(model).__name__}")

    config = transformers.GPT2Config(
        vocab_size=model.vocab_size,
        n_positions=model.max_seq_len,
        n_embd=model.embedding_dim,
        n_layer=len(model.blocks),
        n_head=model.num_heads,
        n_inner=model.hidden_dim,
        activation_function="gelu",        # exact erf GELU, like g2c.nn.GELU
        layer_norm_epsilon=model.ln_final.eps,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=None, eos_token_id=None, pad_token_id=None,  # no special ids: never stop early
        tie_word_embeddings=True,
    )
    hf = transformers.GPT2LMHeadModel(config).to(torch.float32)
    t = hf.transformer
    with torch.no_grad():
        _copy(t.wte.weight, model.token_embed.weight, "token_embed.weight")
        _copy(t.wpe.weight, model.pos_embed.weight, "pos_embed.weight")
        for i, (blk, h) in enumerate(zip(model.blocks, t.h)):
            pairs = [
                (h.ln_1.weight, blk.ln_1.weight), (h.ln_1.bias, blk.ln_1.bias),
                (h.attn.c_attn.weight, blk.attn.qkv.weight.t()), (h.attn.c_attn.bias, blk.attn.qkv.bias),
                (h.attn.c_proj.weight, blk.attn.proj.weight.t()), (h.attn.c_proj.bias, blk.attn.proj.bias),
                (h.ln_2.weight, blk.ln_2.weight), (h.ln_2.bias, blk.ln_2.bias),
                (h.mlp.c_fc.weight, blk.mlp.fc.weight.t()), (h.mlp.c_fc.bias, blk.mlp.fc.bias),
                (h.mlp.c_proj.weight, blk.mlp.proj.weight.t()), (h.mlp.c_proj.bias, blk.mlp.proj.bias),
            ]
            for j, (dst, src) in enumerate(pairs):
                _copy(dst, src, f"blocks.{i} tensor {j}")
        _copy(t.ln_f.weight, model.ln_final.weight, "ln_final.weight")
        _copy(t.ln_f.bias, model.ln_final.bias, "ln_final.bias")
    hf.tie_weights()
    if hf.lm_head.weight.data_ptr() != t.wte.weight.data_ptr():  # defensive: keep the head tied
        hf.lm_head.weight = t.wte.weight
    return hf.eval()
