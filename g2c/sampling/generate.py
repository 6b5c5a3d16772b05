"""Module 11: the autoregressive sampling loop.

One token per model call: score the context, warp the last row of logits, pick a token,
append it, repeat. This serial loop is what speculative decoding (``g2c.specdec``) speeds up.
"""

from __future__ import annotations

import torch

from .warpers import apply_repetition_penalty, apply_temperature, top_k_filter, top_p_filter

__all__ = ["as_token_ids", "generate", "next_token_logits", "sample_from_logits"]


def as_token_ids(ids, name: str = "prompt_ids") -> torch.Tensor:
    """Check a prompt and return it as a CPU LongTensor (N,). Provided.

    Accepts a list of ints or an integer tensor. Floats and bools are refused rather than
    silently cast (``[1.7, 2.0]`` is not a prompt).

    Raises:
        ValueError: not 1-D, empty, or not integer token ids; the message names ``name``.
    """
    t = torch.as_tensor(ids)
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of token ids, got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {t.dtype}")
    return t.long().cpu()


@torch.no_grad()
def next_token_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits (V,) float32 for the token after ``ids`` (1-D), with the context cropped to
    the model's last ``max_seq_len`` tokens. Provided."""
    ctx = ids[-model.max_seq_len:].unsqueeze(0).to(model.device)            # (1, T)
    return model(ctx)[0, -1].float()


def sample_from_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                       top_p: float | None = None, generator: torch.Generator | None = None) -> int:
    """Pick one token id from logits (V,): argmax when temperature == 0, else warp and sample.

    Warpers run in the order temperature -> top-k -> top-p; sampling uses
    ``torch.multinomial`` with ``generator`` on the CPU (reproducible across devices).

    Steps:
        1. temperature == 0: return the argmax (``test_generate_greedy_is_argmax_chain``).
        2. Otherwise apply the warpers, softmax, sample (``test_generate_seeded_is_reproducible``).
    """
    # TODO: implement this (module 11, see docs/modules/11-sampling.md).
    raise NotImplementedError(
        "module 11: sample_from_logits in g2c/sampling/generate.py is not implemented yet. "
        "Write it, or run with G2C_APPLY_SOLUTIONS=11 to use the reference solution."
    )


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, repetition_penalty: float = 1.0, eos_id: int | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Continue a prompt one token at a time.

    Args:
        model: ids (1, T) -> logits (1, T, V), with ``max_seq_len`` and ``device``.
        prompt_ids: 1-D int tensor or list of ints, length >= 1.
        max_new_tokens: >= 0 tokens to add at most.
        temperature: 0.0 = greedy argmax; > 0 samples.
        top_k, top_p: optional filters (see ``g2c.sampling.warpers``).
        repetition_penalty: CTRL penalty over every token so far (1.0 = off).
        eos_id: stop right after emitting this id (it is included in the output).
        generator: ``torch.Generator`` for sampling (pass one for reproducible output).

    Returns:
        LongTensor (N,) on the CPU: the prompt followed by the new tokens,
        N <= len(prompt) + max_new_tokens.

    Raises:
        ValueError: empty, non-1-D or non-integer prompt, temperature < 0 or NaN, top_k < 1, top_p
            outside (0, 1], max_new_tokens < 0, repetition_penalty <= 0.

    Steps:
        1. Each step scores the last ``max_seq_len`` tokens (``next_token_logits``,
           provided; ``test_generate_crops_to_context_window``).
        2. Apply the repetition penalty, then ``sample_from_logits``.
        3. Append; stop at ``eos_id`` (``test_generate_stops_at_eos``) or after
           ``max_new_tokens``.
    """
    ids = as_token_ids(prompt_ids)
    if not temperature >= 0:  # also refuses NaN
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {repetition_penalty}")
    was_training = model.training
    model.eval()
    # TODO: implement this (module 11, see docs/modules/11-sampling.md).
    raise NotImplementedError(
        "module 11: generate in g2c/sampling/generate.py is not implemented yet. "
        "Write it, or run with G2C_APPLY_SOLUTIONS=11 to use the reference solution."
    )
    model.train(was_training)
    return ids
