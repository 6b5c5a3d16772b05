"""Module 16: incremental decoding, module 11's ``generate`` with a KV cache.

Module 11 re-scores the whole context for every new token: step n costs a pass over n
positions. With the cache, the prompt is scored once (the *prefill*) and every later step
feeds ONE token (the *decode* step), whose keys and values join the cache. Same logits,
same warpers, same ``torch.Generator`` draws, so the same tokens.

The window. Learned absolute positions stop at ``max_seq_len``: a full cache cannot slide
(every cached key was computed at its own position). When the cache is full and one more
token must be scored, we *re-prefill*: empty the cache and run the last ``refill_tokens``
tokens as a fresh prompt at positions 0.., then continue incrementally. With
``refill_tokens = max_seq_len`` every step past the window is a full re-prefill and the
output equals module 11's exactly (it crops to the last ``max_seq_len`` tokens every step);
the default, ``max_seq_len // 2``, re-prefills once per ``max_seq_len // 2`` tokens and the
context after a refill is shorter, so the output past the window may differ.

Source: incremental decoding as in GPT-2 (Radford et al. 2019); the refill policy is our
own (transformers raises past ``n_positions`` for GPT-2).

Shape letters: T time, V vocabulary.
"""

from __future__ import annotations

import torch

from g2c.sampling.generate import as_token_ids, check_generation_args, sample_from_logits
from g2c.sampling.model import check_eos_id, check_language_model, check_whole, eval_mode
from g2c.sampling.warpers import apply_repetition_penalty

from .cache import KVCache
from .forward import cached_forward

__all__ = ["cached_generate"]


@torch.no_grad()
def cached_generate(model, prompt_ids, max_new_tokens: int, *, temperature: float = 1.0, top_k: int | None = None,
                    top_p: float | None = None, repetition_penalty: float = 1.0, eos_id: int | None = None,
                    generator: torch.Generator | None = None, refill_tokens: int | None = None,
                    cache: KVCache | None = None) -> torch.Tensor:
    """Continue a prompt one token at a time, reusing keys and values.

    Args:
        model: a ``TransformerLM`` (module 09); in eval mode for the call (``eval_mode``), its
            mode restored afterwards, also when the loop raises.
        prompt_ids: 1-D int tensor or list of ints, length >= 1 (a longer prompt than
            ``max_seq_len`` is cropped to its last ``max_seq_len`` tokens, like module 11).
        max_new_tokens, temperature, top_k, top_p, repetition_penalty, eos_id, generator:
            exactly as ``g2c.sampling.generate`` (same validation, same errors).
        refill_tokens: tokens re-prefilled when the cache is full, 1 <= refill_tokens <=
            max_seq_len (default ``max_seq_len // 2``, at least 1). See the module docstring.
        cache: optional ``KVCache.for_model(model)`` to use (it is reset first); lets a caller
            inspect the final state.

    Returns:
        LongTensor (N,) on the CPU: the prompt followed by the new tokens. While
        prompt + output fit in ``max_seq_len`` it equals ``g2c.sampling.generate`` with the
        same arguments (and a generator in the same state) token for token.

    Raises:
        TypeError: ``model`` lacks ``vocab_size``, ``max_seq_len`` or ``device``.
        ValueError: as ``g2c.sampling.generate`` (including prompt ids outside [0, V));
            ``refill_tokens`` outside
            [1, max_seq_len] (message names "refill_tokens").

    Steps:
        1. (Provided.) Validate, prefill the (cropped) prompt, keep the last row's logits.
        2. Each step: repetition penalty over every token so far (if != 1.0), then
           ``sample_from_logits`` (module 11) with the generator; append the token; stop
           at ``eos_id`` or when the budget is spent, WITHOUT scoring the token just
           appended (``test_cached_generate_greedy_matches_generate``,
           ``test_cached_generate_sampled_matches_generate``).
        3. Score the new token: if the cache is full, ``reset`` it and ``cached_forward``
           the last ``refill_tokens`` tokens (``test_cached_generate_refills_past_window``);
           else ``cached_forward`` the one token. Keep the last row (V,) as float32.
    """
    check_language_model(model, "model")
    ids = as_token_ids(prompt_ids, "prompt_ids", vocab_size=model.vocab_size)
    eos_id = check_eos_id(eos_id, model.vocab_size)                # None, or an id the loop can emit
    check_generation_args(temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=max_new_tokens,
                          repetition_penalty=repetition_penalty, generator=generator)
    window = model.max_seq_len
    refill = max(1, window // 2) if refill_tokens is None else refill_tokens
    refill = check_whole(refill, f"refill_tokens must be an int in [1, max_seq_len={window}], got {refill_tokens!r}",
                         high=window)
    if max_new_tokens == 0:
        return ids
    with eval_mode(model):
        cache = KVCache.for_model(model) if cache is None else cache
        cache.reset()
        device = model.token_embed.weight.device
        logits = cached_forward(model, ids[-window:].unsqueeze(0).to(device), cache)[0, -1].float()  # (V,)
        # BEGIN SOLUTION
        for step in range(max_new_tokens):
            if repetition_penalty != 1.0:
                logits = apply_repetition_penalty(logits, ids, repetition_penalty)
            nxt = sample_from_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p,
                                     generator=generator)
            ids = torch.cat([ids, torch.tensor([nxt])])
            if (eos_id is not None and nxt == eos_id) or step == max_new_tokens - 1:
                break
            if cache.length == cache.max_seq_len:                            # full: re-prefill
                cache.reset()
                new = ids[-refill:]                                          # (refill,)
            else:
                new = ids[-1:]                                               # (1,)
            logits = cached_forward(model, new.unsqueeze(0).to(device), cache)[0, -1].float()  # (V,)
        # END SOLUTION
    return ids
