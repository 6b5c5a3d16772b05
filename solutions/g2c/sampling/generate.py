"""Module 11: the autoregressive sampling loop.

One token per model call: score the context, warp the last row of logits, pick a token,
append it, repeat. This serial loop is what speculative decoding (``g2c.specdec``) speeds up.
"""

from __future__ import annotations

import torch

from .model import (
    check_count,
    check_eos_id,
    check_generator,
    check_language_model,
    check_repetition_penalty,
    check_score_rows,
    check_temperature,
    check_token_ids,
    check_top_p,
    eval_mode,
)
from .warpers import apply_repetition_penalty, apply_temperature, check_logits, top_k_filter, top_p_filter

__all__ = ["as_token_ids", "check_generation_args", "generate", "next_token_logits", "sample_from_logits"]


def as_token_ids(ids, name: str = "prompt_ids", *, vocab_size: int | None = None) -> torch.Tensor:
    """Check a prompt and return it as a CPU LongTensor (N,). Provided.

    Accepts a list of ints or an integer tensor (on any device) and returns a copy (a loop that
    appends to, or a drafter that wrongly writes into, the ids it got never changes the caller's
    tensor; a few hundred ids cost under a microsecond). Floats and bools are refused
    rather than silently cast (``[1.7, 2.0]`` is not a prompt). With ``vocab_size`` = V, every
    id must lie in [0, V): a negative id would otherwise index from the end of a table.

    Raises:
        ValueError: text instead of ids ("encode it first"), not 1-D, empty, not integer token ids
            (a bool in a list too), a tensor on the meta device (no values to read), a negative id,
            or (with ``vocab_size``) an id outside ``[0, V)``; the message names ``name`` (and the
            range).
        TypeError: not a sequence torch can read as one tensor (None, a list holding None, ragged
            rows, an id too large for int64).
    """
    if isinstance(ids, (str, bytes)):
        raise ValueError(f"{name} must be token ids, got text {ids[:40]!r}: encode it first (tokenizer.encode(text))")
    if isinstance(ids, (list, tuple)) and any(isinstance(i, bool) for i in ids):   # torch reads [True, 1] as [1, 1]
        raise ValueError(f"{name} must hold integer token ids, got a bool in {ids!r:.40}")
    try:
        t = torch.as_tensor(ids)
    except (TypeError, ValueError, RuntimeError, OverflowError):                # None, [1, None], [[1], [2, 3]]
        raise TypeError(f"{name} must be a 1-D list or tensor of int token ids, got {type(ids).__name__} "
                        f"{ids!r:.40}") from None
    if t.dim() != 1 or t.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence of token ids, got shape {tuple(t.shape)}")
    if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {t.dtype}")
    if t.is_meta:
        raise ValueError(f"{name} is on the meta device (a shape without values): build it on a real device, "
                         "e.g. torch.tensor(ids)")
    t = t.to(device="cpu", dtype=torch.long, copy=True)       # the caller's tensor is never the loop's
    if vocab_size is not None:
        check_token_ids(t, vocab_size, name)
    elif int(t.min()) < 0:                                    # no vocabulary to check against, but never negative
        raise ValueError(f"{name} holds token id {int(t.min())}; token ids are >= 0")
    return t


@torch.no_grad()
def check_generation_args(*, temperature: float, top_k: int | None, top_p: float | None, max_new_tokens: int,
                          repetition_penalty: float = 1.0, generator: torch.Generator | None = None) -> None:
    """Validate the knobs every decoding loop shares (``generate``, module 16's ``cached_generate``). Provided.

    Built on ``g2c.sampling.model``'s shared checks (``check_count``, ``check_temperature``,
    ``check_generator``), the same ones the speculative loops call.

    Raises:
        TypeError: max_new_tokens or top_k not an int (``2.5``, ``None`` for max_new_tokens);
            temperature, top_p or repetition_penalty not a real number; generator not a
            ``torch.Generator``.
        ValueError: temperature < 0, infinite or NaN ("temperature must be >= 0 and finite"); top_k < 1;
            top_p outside (0, 1] or so small that float32 rounds it to 0; max_new_tokens < 0;
            repetition_penalty <= 0 or not finite. Each
            message names the value.
    """
    check_temperature(temperature)
    if top_k is not None and check_count(top_k, "top_k", minimum=None) < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {top_k}")
    check_top_p(top_p)
    if check_count(max_new_tokens, "max_new_tokens", minimum=None) < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    check_repetition_penalty(repetition_penalty)
    check_generator(generator)


def next_token_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """Logits (V,) float32 for the token after ``ids`` (1-D, CPU), with the context cropped
    to the model's last ``max_seq_len`` tokens. Provided.

    ``model`` is a ``g2c.sampling.LanguageModel``; the ids go to ``model.device`` and the
    logits stay there (float32).

    Raises:
        TypeError: ``model`` is not a ``LanguageModel`` (``check_language_model``); ``ids`` is not a tensor.
        ValueError: ``ids`` is not 1-D, or the model returned NaN or only -inf for this step
            (``check_score_rows``): the message names the position, so a broken model stops the
            loop instead of emitting token 0."""
    check_language_model(model)
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"next_token_logits: ids must be a 1-D tensor of token ids, got {type(ids).__name__}")
    if ids.dim() != 1:
        raise ValueError(f"next_token_logits: ids must be 1-D (one sequence), got shape {tuple(ids.shape)}")
    ctx = ids[-model.max_seq_len:].unsqueeze(0).to(model.device)            # (1, T)
    logits = model(ctx)[0, -1].float()                                      # (V,)
    check_score_rows(logits, "logits", where=f"the step scoring position {ids.numel()}")  # NaN / all -inf
    return logits


def sample_from_logits(logits: torch.Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                       top_p: float | None = None, generator: torch.Generator | None = None) -> int:
    """Pick one token id from logits (V,): argmax when temperature == 0, else warp and sample.

    Warpers run in the order temperature -> top-k -> top-p on float32 logits; sampling uses
    ``torch.multinomial`` on the CPU with ``generator`` (a CPU ``torch.Generator``), so a
    seed gives the same tokens whatever device produced the logits.

    Extreme temperatures (decided once for the course): the temperature divides float32
    logits (``apply_temperature`` upcasts float16/bfloat16 first, so float16 logits
    ``[10, 9, -100]`` at T = 1e-4 are fine). When the scaled logits still hold +inf or NaN,
    because T is so small that logit / T overflows float32 (T = 1e-40), the result is the
    argmax of the logits: the T -> 0 limit, the same token ``temperature=0.0`` gives, instead
    of a softmax of infinities. -inf entries (masked tokens) are normal and stay.

    Args:
        logits: (V,) float, any dtype and device.
        temperature: >= 0 (validated by ``generate``); 0 means greedy.
        top_k, top_p: optional filters (``g2c.sampling.warpers``).
        generator: CPU ``torch.Generator`` for the draw.

    Returns:
        int, a token id in [0, V).

    Raises:
        TypeError: ``logits`` not a tensor; ``temperature``/``top_p`` not a real number, ``top_k`` not
            an int or None, ``generator`` not a ``torch.Generator`` or None.
        ValueError: logits not floating point, empty, holding NaN or only -inf; temperature < 0, NaN
            or infinite; top_k < 1; top_p outside (0, 1]; a generator not on the CPU. Checked
            before your code runs (the same checks as ``generate``'s, for a direct call).

    Steps:
        1. temperature == 0: return the argmax (``test_generate_greedy_is_argmax_chain``).
        2. Scale with ``apply_temperature``; if any scaled logit is +inf or NaN, return the
           argmax of the unscaled logits (``test_sample_from_logits_tiny_temperature_is_the_argmax_limit``).
        3. Otherwise top-k, top-p, softmax on the CPU and sample
           (``test_generate_seeded_is_reproducible``).
    """
    check_logits(logits, "sample_from_logits")                   # provided: every value checked where it enters
    temperature = check_temperature(temperature)
    top_k = None if top_k is None else check_count(top_k, "top_k", minimum=1)
    top_p = check_top_p(top_p)
    check_generator(generator)
    check_score_rows(logits, "logits", where="sample_from_logits")
    # BEGIN SOLUTION
    if temperature == 0.0:
        return int(torch.argmax(logits))
    scaled = apply_temperature(logits, temperature)                         # (V,) float32
    if bool(torch.isnan(scaled).any() or torch.isposinf(scaled).any()):
        return int(torch.argmax(logits))                                    # the T -> 0 limit
    if top_k is not None:
        scaled = top_k_filter(scaled, top_k)
    if top_p is not None:
        scaled = top_p_filter(scaled, top_p)
    probs = torch.softmax(scaled.cpu(), dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator))
    # END SOLUTION


@torch.no_grad()
def generate(model, prompt_ids, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
             top_p: float | None = None, repetition_penalty: float = 1.0, eos_id: int | None = None,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Continue a prompt one token at a time.

    Args:
        model: a ``g2c.sampling.LanguageModel`` (``vocab_size``, ``max_seq_len``, ``device``,
            ids (1, T) -> logits (1, T, V); ``training``/``train`` optional). It runs in eval
            mode inside the loop and gets its own mode back afterwards, also when the loop
            raises (``eval_mode``).
        prompt_ids: 1-D int tensor or list of ints, length >= 1, each id in [0, V).
        max_new_tokens: >= 0 tokens to add at most.
        temperature: 0.0 = greedy argmax; > 0 (finite) samples. A temperature so small that
            the scaled logits overflow gives the argmax (see ``sample_from_logits``).
        top_k, top_p: optional filters (see ``g2c.sampling.warpers``).
        repetition_penalty: CTRL penalty over every token so far (1.0 = off).
        eos_id: stop right after emitting this id (it is included in the output).
            None, or an id in [0, V) (``check_eos_id``: ValueError outside it, TypeError for a non-int).
        generator: ``torch.Generator`` for sampling (pass one for reproducible output).

    Returns:
        LongTensor (N,) on the CPU: the prompt followed by the new tokens,
        N <= len(prompt) + max_new_tokens.

    Raises:
        TypeError: ``model`` lacks ``vocab_size``, ``max_seq_len`` or ``device`` (the message
            names what is missing).
        ValueError: empty, non-1-D or non-integer prompt, a prompt id outside [0, V)
            ("prompt_ids ... outside the vocabulary [0, V)"), temperature < 0, NaN or infinite,
            top_k < 1, top_p outside (0, 1], max_new_tokens < 0, repetition_penalty <= 0, a
            ``generator`` on another device than the CPU (``check_generator``).

    Steps:
        1. Each step scores the last ``max_seq_len`` tokens (``next_token_logits``,
           provided; ``test_generate_crops_to_context_window``).
        2. Apply the repetition penalty, then ``sample_from_logits``.
        3. Append; stop at ``eos_id`` (``test_generate_stops_at_eos``) or after
           ``max_new_tokens``.
    """
    check_language_model(model, "model")
    ids = as_token_ids(prompt_ids, "prompt_ids", vocab_size=model.vocab_size)
    eos_id = check_eos_id(eos_id, model.vocab_size)                # None, or an id the loop can emit
    check_generation_args(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens,
                          repetition_penalty=repetition_penalty, generator=generator)
    with eval_mode(model):
        # BEGIN SOLUTION
        for _ in range(max_new_tokens):
            logits = next_token_logits(model, ids)                          # (V,)
            if repetition_penalty != 1.0:
                logits = apply_repetition_penalty(logits, ids, repetition_penalty)
            nxt = sample_from_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                     generator=generator)
            ids = torch.cat([ids, torch.tensor([nxt])])
            if eos_id is not None and nxt == eos_id:
                break
        # END SOLUTION
    return ids
