"""Module 03b: the learning-rate schedule, linear warmup then cosine decay.

Source: the warmup + cosine recipe of Loshchilov and Hutter, "SGDR" (ICLR 2017), as used
for GPT-style pretraining (e.g. Radford et al. 2019; Hoffmann et al. 2022).
"""

from __future__ import annotations

import math
import numbers
import operator

__all__ = ["cosine_with_warmup"]


# -- the argument checks of module 03b (provided; module 03's g2c.nn.module.check_int / check_real do the same
# for the layers, but module 03b needs no other module, so it keeps these two small ones)

def check_int_arg(value, name: str, where: str, *, minimum: int | None = 0) -> int:
    """An integer argument as a Python int (an int, a NumPy integer or a 0-d integer tensor; never a bool
    or a float, even ``2.0``).

    Raises:
        TypeError: not a whole number ("<where>: <name> must be an int >= 0, got float 2.5").
        ValueError: below ``minimum`` ("<where>: <name> must be >= 0, got -1").
    """
    number = None
    if not isinstance(value, bool) and "bool" not in str(getattr(value, "dtype", "")) \
            and getattr(value, "ndim", 0) == 0:                     # one value, not a bool
        try:
            number = operator.index(value)
        except TypeError:
            number = None
    if number is None:
        raise TypeError(f"{where}: {name} must be an int{'' if minimum is None else f' >= {minimum}'}, got "
                        f"{type(value).__name__} "
                        f"{' '.join(repr(value).split())[:60]}")
    if minimum is not None and number < minimum:
        raise ValueError(f"{where}: {name} must be >= {minimum}, got {number}")
    return number


def check_real_arg(value, name: str, where: str, *, low: float | None = 0.0, low_open: bool = False) -> float:
    """A real argument (a rate, a threshold) as a finite Python float >= ``low`` (> ``low`` when
    ``low_open``; ``low=None``: any finite number, the caller keeps its own range message): an int, a
    float, a NumPy real or a 0-d real tensor; never a bool, a string or None.

    Raises:
        TypeError: not a real number ("<where>: <name> must be a real number > 0, got str '1'").
        ValueError: NaN, infinite or below the bound ("<where>: <name> must be a finite number > 0, got nan").
    """
    rule = "(finite)" if low is None else f"{'>' if low_open else '>='} {low:g}"
    number = value
    if getattr(number, "ndim", None) == 0 and hasattr(number, "item") and not getattr(number, "is_complex",
                                                                                      lambda: False)():
        number = number.item()                              # a 0-d tensor or a NumPy scalar
    if isinstance(number, bool) or not isinstance(number, numbers.Real):
        raise TypeError(f"{where}: {name} must be a real number {rule}, got {type(value).__name__} "
                        f"{' '.join(repr(value).split())[:60]}")
    number = float(number)
    if not math.isfinite(number) or (low is not None and (number < low or (low_open and number == low))):
        raise ValueError(f"{where}: {name} must be a finite number {rule}, got {number!r}")
    return number


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
        TypeError: a step count that is not an int (a bool, a float, a tensor of several elements) or
            a rate that is not a real number; the message names the argument.
        ValueError: negative step, warmup_steps > max_steps, min_lr > max_lr, a negative rate, NaN
            or infinity.

    Steps:
        1. Warmup branch (``test_schedule_warmup_is_linear``).
        2. Cosine branch (``test_schedule_cosine_endpoints``).
        3. Constant min_lr after max_steps (``test_schedule_after_max_steps``).
    """
    w = "cosine_with_warmup"
    step, warmup_steps = check_int_arg(step, "step", w, minimum=None), check_int_arg(warmup_steps, "warmup_steps", w,
                                                                                       minimum=None)
    max_steps = check_int_arg(max_steps, "max_steps", w, minimum=None)
    max_lr, min_lr = check_real_arg(max_lr, "max_lr", w, low=None), check_real_arg(min_lr, "min_lr", w, low=None)
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
