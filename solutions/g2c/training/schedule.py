"""Module 03b: the learning-rate schedule, linear warmup then cosine decay.

Source: the warmup + cosine recipe of Loshchilov and Hutter, "SGDR" (ICLR 2017), as used
for GPT-style pretraining (e.g. Radford et al. 2019; Hoffmann et al. 2022).
"""

from __future__ import annotations

import math

__all__ = ["cosine_with_warmup"]


def cosine_with_warmup(step: int, *, warmup_steps: int, max_steps: int, max_lr: float,
                       min_lr: float = 0.0) -> float:
    """Learning rate at ``step`` (0-based).

    - warmup: for step < warmup_steps, lr = max_lr · (step + 1) / warmup_steps
      (so step 0 already trains, and step warmup_steps−1 reaches max_lr);
    - decay: for warmup_steps <= step <= max_steps, cosine from max_lr down to min_lr:
      progress = (step − warmup_steps) / max(1, max_steps − warmup_steps),
      lr = min_lr + 0.5·(max_lr − min_lr)·(1 + cos(π·progress));
    - after: for step > max_steps, lr = min_lr.

    Args:
        step: the optimizer step about to be taken, >= 0.
        warmup_steps: >= 0.
        max_steps: >= warmup_steps (equal means no decay phase).
        max_lr, min_lr: 0 <= min_lr <= max_lr.

    Returns:
        float learning rate.

    Raises:
        ValueError: negative step, warmup_steps > max_steps, or min_lr > max_lr.

    Steps:
        1. Warmup branch (``test_schedule_warmup_is_linear``).
        2. Cosine branch (``test_schedule_cosine_endpoints``).
        3. Constant min_lr after max_steps (``test_schedule_after_max_steps``).
    """
    if step < 0 or warmup_steps < 0 or warmup_steps > max_steps or min_lr > max_lr or min_lr < 0:
        raise ValueError(f"cosine_with_warmup: need step >= 0, 0 <= warmup_steps <= max_steps and "
                         f"0 <= min_lr <= max_lr; got step={step}, warmup_steps={warmup_steps}, "
                         f"max_steps={max_steps}, min_lr={min_lr}, max_lr={max_lr}")
    # BEGIN SOLUTION
    if step < warmup_steps:
        return max_lr * (step + 1) / warmup_steps
    if step > max_steps:
        return min_lr
    progress = (step - warmup_steps) / max(1, max_steps - warmup_steps)
    return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + math.cos(math.pi * progress))
    # END SOLUTION
