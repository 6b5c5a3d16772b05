"""Module 11: logit warpers — temperature, top-k, top-p (nucleus), repetition penalty.

Each warper maps logits (..., V) to logits (..., V); filtered tokens get -inf, so a
softmax gives them probability exactly 0. Shape letters: V vocabulary.
"""

from __future__ import annotations

import torch

__all__ = ["apply_repetition_penalty", "apply_temperature", "top_k_filter", "top_p_filter"]


def apply_temperature(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Divide logits by the temperature (> 0). T < 1 sharpens, T > 1 flattens.

    (Temperature 0, greedy decoding, is handled by ``generate`` as an argmax.)

    Args:
        logits: (..., V) float, any float dtype.
        temperature: > 0 and finite.

    Returns:
        (..., V) float32: the division happens in float32, so float16 logits ``[10, 9, -100]``
        at T = 1e-4 give ``[1e5, 9e4, -1e6]`` instead of overflowing float16 (max 65504).
        A temperature that still overflows float32 (1e-40) yields +inf; ``sample_from_logits``
        turns that into the argmax (the T -> 0 limit).

    Raises:
        ValueError: temperature <= 0, NaN or infinite ("temperature must be > 0 ...").

    Steps:
        1. Upcast to float32 and divide (``test_temperature_scales_logits``,
           ``test_temperature_computes_in_float32``).
    """
    if not 0 < temperature < float("inf"):
        raise ValueError(f"temperature must be > 0 and finite here (use temperature=0.0 in generate for "
                         f"greedy), got {temperature}")
    # BEGIN SOLUTION
    return logits.float() / temperature
    # END SOLUTION


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the k highest logits per row, set the rest to -inf.

    Ties: every token whose logit equals the k-th largest value is kept, so a row may keep
    more than k tokens (the rule never has to break a tie arbitrarily).

    Args:
        logits: (..., V) float.
        k: >= 1; k >= V keeps everything.

    Raises:
        ValueError: k < 1.

    Steps:
        1. The k-th largest value per row (``torch.topk``), kept as (..., 1).
        2. Mask strictly smaller logits with -inf (``test_top_k_keeps_ties``).
    """
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    # BEGIN SOLUTION
    if k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]                    # (..., 1)
    return logits.masked_fill(logits < kth, float("-inf"))
    # END SOLUTION


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering (Holtzman et al., "The Curious Case of Neural Text Degeneration",
    ICLR 2020, section 3.1): keep the smallest set of most-likely tokens whose probability
    mass reaches p, including the token that crosses p; the rest get -inf.

    Args:
        logits: (..., V) float.
        p: in (0, 1]; p = 1 keeps everything; the top token is always kept.

    Raises:
        ValueError: p outside (0, 1].

    Steps:
        1. Sort probabilities descending and take the cumulative sum.
        2. A sorted token is removed when the mass *before* it already reaches p
           (so the crossing token stays: ``test_top_p_keeps_the_crossing_token``).
        3. Scatter the removal mask back to vocabulary order and fill with -inf.
    """
    if not 0.0 < p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    # BEGIN SOLUTION
    if p == 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)      # (..., V)
    probs = torch.softmax(sorted_logits.float(), dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs                              # (..., V)
    remove_sorted = mass_before >= p
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))
    # END SOLUTION


def apply_repetition_penalty(logits: torch.Tensor, previous_ids: torch.Tensor, penalty: float) -> torch.Tensor:
    """Discourage tokens that already occurred (Keskar et al., "CTRL", 2019, section 4.1).

    For every token id present in ``previous_ids``: a positive logit is divided by the
    penalty, a negative one multiplied by it (so both move toward "less likely").
    penalty = 1 changes nothing.

    Args:
        logits: (V,) float.
        previous_ids: (N,) int64, the tokens so far (repeats count once).
        penalty: > 0; above 1 penalises repeats, below 1 encourages them.

    Returns:
        new (V,) tensor (the input is not modified).

    Raises:
        ValueError: penalty <= 0.

    Steps:
        1. Gather the logits of the previous ids.
        2. Divide positive / multiply negative ones, scatter them back into a copy
           (``test_repetition_penalty_moves_seen_tokens_down``).
    """
    if penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {penalty}")
    # BEGIN SOLUTION
    if penalty == 1.0 or previous_ids.numel() == 0:
        return logits
    ids = previous_ids.unique().to(logits.device)
    seen = logits[ids]
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    out = logits.clone()
    out[ids] = seen
    return out
    # END SOLUTION
