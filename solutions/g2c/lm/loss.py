"""Module 06: next-token prediction, scored by cross-entropy and perplexity.

Shape letters: N rows (positions), V vocabulary.
"""

from __future__ import annotations

import math
import numbers

import torch

__all__ = ["cross_entropy", "log_softmax", "perplexity"]


def check_scores(logits, where: str) -> None:
    """``logits`` must be a floating-point tensor (..., V) with V >= 1. Provided (module 06 needs no
    other module, so it keeps this small check of its own).

    Raises:
        TypeError: not a tensor ("<where>: logits must be a float tensor (..., V), got list").
        ValueError: an integer, bool or complex dtype, or V = 0 / no dimension.
    """
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"{where}: logits must be a float tensor (..., V), got {type(logits).__name__}")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"{where}: logits must be floating point, got dtype {logits.dtype}")
    if logits.dim() == 0 or logits.shape[-1] == 0:
        raise ValueError(f"{where}: logits must have a vocabulary dimension V >= 1, got shape {tuple(logits.shape)}")


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Numerically stable log-softmax over the last dimension.

    ``log_softmax(z)_i = z_i - logsumexp(z)``, computed after subtracting the row maximum
    so that exp never overflows.

    Args:
        logits: (..., V) float.

    Returns:
        (..., V), same dtype; each row's exp sums to 1.

    Raises:
        TypeError: ``logits`` is not a tensor.
        ValueError: ``logits`` is not floating point, or V = 0 (``check_scores``).

    Steps:
        1. Subtract the row max (keepdim) (``test_log_softmax_is_stable_for_large_logits``).
        2. Subtract the log of the summed exponentials (``test_log_softmax_matches_torch``).
    """
    check_scores(logits, "log_softmax")
    # BEGIN SOLUTION
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    return shifted - shifted.exp().sum(dim=-1, keepdim=True).log()
    # END SOLUTION


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the targets, in nats.

    Args:
        logits: (N, V) float, unnormalised scores.
        targets: (N,) int64 class ids in [0, V).

    Returns:
        scalar float tensor: mean over rows of ``-log_softmax(logits)[n, targets[n]]``.

    Raises:
        TypeError: ``logits`` or ``targets`` is not a tensor.
        ValueError: logits not 2-D or not floating point, targets not 1-D or not integer ids, row
            counts differ, no row at all (the mean of nothing is NaN), or a target outside [0, V).

    Steps:
        1. Validate shapes (``test_cross_entropy_rejects_bad_shapes``).
        2. log_softmax, pick each row's target column (``gather``), negate, average
           (``test_cross_entropy_matches_torch``).
    """
    check_scores(logits, "cross_entropy")
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"cross_entropy: targets must be a tensor of class ids (N,), got {type(targets).__name__}")
    if logits.dim() != 2 or targets.dim() != 1 or logits.shape[0] != targets.shape[0]:
        raise ValueError(f"cross_entropy expects logits (N, V) and targets (N,); got {tuple(logits.shape)} "
                         f"and {tuple(targets.shape)}")
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise ValueError(f"cross_entropy: targets must be integer class ids, got dtype {targets.dtype}")
    if targets.numel() == 0:
        raise ValueError("cross_entropy: no rows (N = 0): the mean loss of nothing is undefined")
    if bool(((targets < 0) | (targets >= logits.shape[-1])).any()):
        bad = int(targets[(targets < 0) | (targets >= logits.shape[-1])][0])
        raise ValueError(f"cross_entropy: target {bad} is outside [0, {logits.shape[-1]}) (V = logits.shape[-1])")
    # BEGIN SOLUTION
    logp = log_softmax(logits.float())                                      # (N, V)
    return -logp.gather(1, targets.long().unsqueeze(1)).squeeze(1).mean()
    # END SOLUTION


def perplexity(loss: float | torch.Tensor) -> float:
    """Perplexity exp(loss) of a mean cross-entropy measured in nats.

    A perplexity of P means the model is, on average, as unsure as a uniform choice
    among P tokens; a uniform model over V tokens has perplexity V.

    Args:
        loss: a mean cross-entropy in nats, >= 0: a Python or NumPy real, or a one-element float tensor.

    Raises:
        TypeError: ``loss`` is not a real number (a string, a bool, None, a tensor of several losses).
        ValueError: ``loss`` is negative, NaN or infinite (no cross-entropy is).

    Steps:
        1. Exponentiate (``test_perplexity_of_uniform_model_is_vocab_size``).
    """
    # Provided: the loss is checked where it enters (a string or a bool would exponentiate silently).
    if isinstance(loss, torch.Tensor) and loss.numel() == 1 and loss.dtype.is_floating_point:
        loss = float(loss)
    if isinstance(loss, bool) or not isinstance(loss, numbers.Real):
        raise TypeError(f"perplexity: loss must be a real number (a mean cross-entropy in nats, >= 0) or a "
                        f"one-element float tensor, got {type(loss).__name__} {' '.join(repr(loss).split())[:60]}")
    if not (math.isfinite(loss) and loss >= 0):
        raise ValueError(f"perplexity: loss must be a finite number >= 0 (a mean cross-entropy in nats), got {loss}")
    # BEGIN SOLUTION
    return math.exp(float(loss))
    # END SOLUTION
