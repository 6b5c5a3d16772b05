"""Module 11: logit warpers — temperature, top-k, top-p (nucleus), repetition penalty.

Each warper maps logits (..., V) to logits (..., V); filtered tokens get -inf, so a
softmax gives them probability exactly 0. Shape letters: V vocabulary.
"""

from __future__ import annotations

import numbers

import torch

from g2c.nn.module import check_int

from .model import check_repetition_penalty, check_token_ids, check_top_p


def check_logits(logits, where: str) -> None:
    """``logits`` must be a floating-point tensor (..., V) with V >= 1. Provided; every warper and
    ``sample_from_logits`` call it where the logits enter.

    Raises:
        TypeError: not a tensor ("<where>: logits must be a float tensor (..., V), got list").
        ValueError: an integer, bool or complex dtype, or no token at all (V = 0 or no dimension).
    """
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{where}: logits must be a float tensor (..., V), got {type(logits).__name__}")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"{where}: logits must be a floating-point tensor (..., V), got dtype {logits.dtype}")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"{where}: logits must have at least one token, got shape {tuple(logits.shape)}")


def as_real(value, name: str, rule: str) -> float:
    """``value`` as a Python float: an int, a float, a NumPy real or a 0-d real tensor (the range is each
    caller's own check). Provided.

    Raises:
        TypeError: a bool, a string, None, a complex number or a tensor of several elements
            ("<name> must be a real number <rule>, got str '0.5'").
    """
    if isinstance(value, torch.Tensor) and value.dim() == 0 and value.dtype != torch.bool \
            and not value.dtype.is_complex:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number {rule}, got {type(value).__name__} "
                        f"{' '.join(repr(value).split())[:60]}")
    return float(value)

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
        TypeError: ``logits`` not a tensor; ``temperature`` not a real number (a bool, a string).
        ValueError: temperature <= 0, NaN or infinite ("temperature must be > 0 ..."); logits not
            floating point or with no token (``check_logits``).

    Steps:
        1. Upcast to float32 and divide (``test_temperature_scales_logits``,
           ``test_temperature_computes_in_float32``).
    """
    check_logits(logits, "apply_temperature")
    temperature = as_real(temperature, "temperature", "> 0")
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
        TypeError: ``logits`` not a tensor; ``k`` not an int (a bool, a float, a tensor of several elements).
        ValueError: k < 1; logits not floating point or with no token (``check_logits``).

    Steps:
        1. The k-th largest value per row (``torch.topk``), kept as (..., 1).
        2. Mask strictly smaller logits with -inf (``test_top_k_keeps_ties``).
    """
    check_logits(logits, "top_k_filter")
    k = check_int(k, "top_k", minimum=None)                    # the type; the range keeps its words:
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
        TypeError: ``logits`` not a tensor; ``p`` not a real number.
        ValueError: p outside (0, 1] or NaN, or so small that float32 rounds it to 0
            (``g2c.sampling.model.check_top_p``); logits not floating point or with no token.

    Steps:
        1. Sort probabilities descending and take the cumulative sum.
        2. A sorted token is removed when the mass *before* it already reaches p
           (so the crossing token stays: ``test_top_p_keeps_the_crossing_token``).
        3. Scatter the removal mask back to vocabulary order and fill with -inf.
    """
    check_logits(logits, "top_p_filter")
    p = check_top_p(as_real(p, "top_p", "in (0, 1]"))       # also refuses a p that is 0 in float32
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
        TypeError: ``logits`` or ``previous_ids`` not a tensor; ``penalty`` not a real number.
        ValueError: penalty <= 0, NaN or infinite; a previous id outside [0, V) or of a float dtype
            (``check_token_ids``); logits not floating point or with no token.

    Steps:
        1. Gather the logits of the previous ids.
        2. Divide positive / multiply negative ones, scatter them back into a copy
           (``test_repetition_penalty_moves_seen_tokens_down``).
    """
    check_logits(logits, "apply_repetition_penalty")
    penalty = check_repetition_penalty(as_real(penalty, "repetition_penalty", "> 0"))   # > 0 and finite
    check_token_ids(previous_ids, logits.shape[-1], "previous_ids")
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
