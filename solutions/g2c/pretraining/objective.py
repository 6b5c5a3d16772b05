"""Module 09b: the pretraining objective — random windows of a token stream, shifted by one.

A corpus is one long stream of token ids (stories joined by ``<|endoftext|>``). A training
example is any window of ``context + 1`` consecutive ids: the first ``context`` are the
input, the last ``context`` the targets. Every position is a prediction, so one window
trains ``context`` next-token predictions in parallel (module 06's parallel scoring).

Shape letters: B batch, T time (= context), V vocabulary, N stream length.
"""

from __future__ import annotations

import numpy as np
import torch

from g2c.lm import cross_entropy
from g2c.lm.loss import check_scores
from g2c.nn.module import check_int, check_real

__all__ = ["get_lm_batch", "lm_cross_entropy", "split_stream"]


def check_stream(ids, where: str) -> None:
    """``ids`` must be a token stream: a tensor or a NumPy array (a ``uint16`` memmap too) of integer ids.
    Provided; the one check ``get_lm_batch``, ``split_stream`` and ``stream_loss`` share (the shape is
    each caller's own rule: a 2-D stream is a ValueError there).

    Raises:
        TypeError: a list, a string, None or any other object ("<where>: ids must be a tensor or a NumPy
            array of token ids, got str"), or a float, bool or complex dtype ("... integer token ids,
            got dtype float32").
    """
    if isinstance(ids, torch.Tensor):
        bad = ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool
    elif isinstance(ids, np.ndarray):
        bad = not np.issubdtype(ids.dtype, np.integer)
    else:
        raise TypeError(f"{where}: ids must be a tensor or a NumPy array of token ids, got {type(ids).__name__}")
    if bad:
        raise TypeError(f"{where}: ids must hold integer token ids, got dtype {ids.dtype}")


def split_stream(ids, val_fraction: float = 0.05):
    """Split a stream into a leading train part and a trailing validation part.

    (The ladder uses a split by story hash instead, done before tokenisation; this helper
    is for quick experiments on any stream.)

    Args:
        ids: 1-D sequence (tensor or numpy array) of N token ids.
        val_fraction: share of the stream kept for validation, in (0, 1).

    Returns:
        (train, val): views of ``ids``; ``len(train) + len(val) == N``.

    Raises:
        TypeError: ``ids`` not a tensor or NumPy array of integer ids; ``val_fraction`` not a real number.
        ValueError: val_fraction outside (0, 1) or NaN, or a part would hold fewer than 2 ids.
    """
    check_stream(ids, "split_stream")
    val_fraction = check_real(val_fraction, "val_fraction", low=0.0, high=1.0, low_open=True, high_open=True)
    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in (0, 1), got {val_fraction}")
    n_val = int(round(len(ids) * val_fraction))
    if n_val < 2 or len(ids) - n_val < 2:
        raise ValueError(f"stream of {len(ids)} ids is too short to split with val_fraction={val_fraction}")
    return ids[: len(ids) - n_val], ids[len(ids) - n_val:]


def get_lm_batch(ids, batch_size: int, context: int, *,
                 generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``batch_size`` random windows from a token stream.

    Args:
        ids: 1-D int tensor or numpy array (e.g. a ``uint16`` memmap) of N >= context + 1 ids.
        batch_size: B >= 1.
        context: T >= 1, the window length.
        generator: ``torch.Generator`` that draws the window starts (pass one for
            reproducible batches).

    Returns:
        (x, y): both (B, T) int64 on the CPU, with ``y[b, t] == x[b, t + 1]`` for t < T-1
        and y the continuation of x by one position.

    Raises:
        TypeError: ``ids`` not a tensor or NumPy array of integer ids; B or T not an int (a bool, a
            float); ``generator`` not a ``torch.Generator`` or None.
        ValueError: B or T < 1, ids not 1-D, the stream is shorter than T + 1, or the generator is
            not on the CPU (the window starts are drawn there).

    Steps:
        1. Validate (``test_get_lm_batch_rejects_short_stream``).
        2. Draw B start offsets uniformly from [0, N - T - 1] with ``torch.randint`` and the
           generator (every valid window can be drawn; ``test_get_lm_batch_covers_the_end``).
        3. Gather x = ids[s : s + T] and y = ids[s + 1 : s + T + 1] for each start, as int64
           (``test_get_lm_batch_targets_are_shifted``).
    """
    check_stream(ids, "get_lm_batch")
    batch_size = check_int(batch_size, "batch_size", where="get_lm_batch")
    context = check_int(context, "context", where="get_lm_batch")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"get_lm_batch: generator must be a torch.Generator or None, got {type(generator).__name__} "
                        f"{' '.join(repr(generator).split())[:60]}; use torch.Generator().manual_seed(seed)")
    if generator is not None and generator.device.type != "cpu":
        raise ValueError(f"get_lm_batch: generator is on {generator.device}; the window starts are drawn on the CPU: "
                         "use torch.Generator().manual_seed(seed)")
    n = len(ids)
    if getattr(ids, "ndim", 1) != 1:
        raise ValueError(f"ids must be a 1-D stream, got shape {tuple(ids.shape)}")
    if n < context + 1:
        raise ValueError(f"stream of {n} ids is too short for windows of context={context} (needs {context + 1})")
    # BEGIN SOLUTION
    starts = torch.randint(0, n - context, (batch_size,), generator=generator)        # (B,)
    offsets = torch.arange(context + 1)                                               # (T+1,)
    index = starts.unsqueeze(1) + offsets                                             # (B, T+1)
    if isinstance(ids, torch.Tensor):
        windows = ids[index].long()
    else:
        windows = torch.from_numpy(np.asarray(ids)[index.numpy()].astype(np.int64))
    return windows[:, :-1], windows[:, 1:]
    # END SOLUTION


def lm_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (nats) over every position of every sequence.

    Args:
        logits: (B, T, V) float.
        targets: (B, T) int64.

    Returns:
        scalar float32 tensor.

    Raises:
        TypeError: ``logits`` or ``targets`` is not a tensor.
        ValueError: logits not 3-D or not floating point, or the (B, T) shapes differ; through
            ``cross_entropy``: targets not integer ids or outside [0, V).

    Steps:
        1. Validate (``test_lm_cross_entropy_rejects_mismatched_shapes``).
        2. Flatten to (B·T, V) and (B·T,) and reuse module 06's ``cross_entropy``
           (``test_lm_cross_entropy_matches_torch``).
    """
    check_scores(logits, "lm_cross_entropy")
    if not isinstance(targets, torch.Tensor):
        raise TypeError(f"lm_cross_entropy: targets must be a tensor of token ids (B, T), got {type(targets).__name__}")
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(targets.shape):
        raise ValueError(f"lm_cross_entropy expects logits (B, T, V) and targets (B, T); "
                         f"got {tuple(logits.shape)} and {tuple(targets.shape)}")
    # BEGIN SOLUTION
    B, T, V = logits.shape
    return cross_entropy(logits.reshape(B * T, V), targets.reshape(B * T))
    # END SOLUTION
