"""Beyond (specdec-sampling): choosing the draft length k round by round.

A controller tells the speculative loop how many tokens to draft next and learns from
each round. The interface (what ``speculative_sample`` calls):

``next_k() -> int``
    The draft length for the next round, >= 0: 0 turns drafting off for the round (a plain
    step, as at the window edge: a controller that finds no k pays, e.g. the serving module's
    ``LoadAwareK`` under load). The loop still caps it by the remaining budget and the
    target's window, and the drafter may propose fewer.

``update(*, drafted, accepted, draft_seconds, target_seconds) -> None``
    After each target pass: how many drafts were scored and accepted (before any budget or
    EOS cut), and the wall-clock seconds spent drafting and in the target pass (the loop
    synchronises the device before reading the clock).

Three controllers:

* ``StaticK(k)``: always k (what ``speculative_generate`` does).
* ``HeuristicK``: transformers' ``num_assistant_tokens_schedule="heuristic"``: +2 after
  a round whose drafts were all accepted, -1 after a rejection, within [k_min, k_max].
* ``CostModelK``: the speed-up law of Leviathan, Kalman, Matias (ICML 2023), §3.1 and
  §3.4: with per-token acceptance α and draft cost c (one drafter token, in units of one
  target pass), a round of k drafts emits (1 − α^{k+1}) / (1 − α) tokens for a cost of
  1 + k·c, so pick

      k* = argmax_{k_min <= k <= k_max}  (1 − α̂^{k+1}) / ((1 − α̂)(1 + k·ĉ))

  from running estimates α̂ and ĉ.

None of them changes *what* is emitted (verification is lossless for any draft), only how
many target passes it takes.
"""

from __future__ import annotations

import math
import operator

from g2c.sampling.model import check_count, check_whole

from ..theory import expected_tokens_per_pass, speedup_per_token

__all__ = ["CostModelK", "HeuristicK", "StaticK", "check_update", "expected_tokens_per_round", "optimal_k", "speedup"]


def _check_k(name: str, k) -> int:
    """``k`` as a Python int >= 1 (NumPy ints pass). Raises ValueError otherwise."""
    return check_whole(k, f"{name} must be an int >= 1, got {k!r}")


def _check_real(name: str, value, *, lo: float, hi: float = math.inf, lo_open: bool = False, fix: str = "") -> float:
    """``value`` as a float when it is a finite real in [lo, hi] (or (lo, hi] with lo_open)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}{fix}")
    value = float(value)
    if not math.isfinite(value) or value < lo or value > hi or (lo_open and value == lo):
        if math.isfinite(hi):
            interval = f"in {'(' if lo_open else '['}{lo:g}, {hi:g}]"
        else:
            interval = f"{'>' if lo_open else '>='} {lo:g}"
        raise ValueError(f"{name} must be a finite number {interval}, got {value!r}{fix}")
    return value


def check_update(drafted, accepted, draft_seconds, target_seconds) -> tuple[int, int, float, float]:
    """Validate one ``update`` report (shared by every controller, so a new one inherits it).

    Raises:
        TypeError: drafted/accepted not integers (0-d integer tensors are accepted), seconds not real.
        ValueError: drafted < 0, accepted outside [0, drafted], negative or non-finite seconds.
    """
    counts = []
    for name, value in (("drafted", drafted), ("accepted", accepted)):
        try:
            if isinstance(value, bool):
                raise TypeError
            counts.append(operator.index(value))
        except TypeError:
            raise TypeError(f"update: {name} must be an int (a count of draft tokens), got "
                            f"{type(value).__name__} {value!r}") from None
    drafted, accepted = counts
    if drafted < 0 or not 0 <= accepted <= drafted:
        raise ValueError(f"update: need 0 <= accepted <= drafted, got drafted={drafted}, accepted={accepted}; "
                         "report the drafts scored and how many of them the target accepted")
    return (drafted, accepted, _check_real("update: draft_seconds", draft_seconds, lo=0.0),
            _check_real("update: target_seconds", target_seconds, lo=0.0))


# The speed-up law lives once, in theory.py (module specdec-lab); the controllers use it under the
# names this module has always exported.
expected_tokens_per_round = expected_tokens_per_pass


def speedup(alpha: float, k: int, c: float) -> float:
    """Expected tokens per unit of cost, (1 − α^{k+1}) / ((1 − α)(1 + k·c)): ``theory.speedup_per_token``.

    Raises:
        ValueError: alpha outside [0, 1], k not an int >= 0, c < 0 (see ``theory``).
    """
    return speedup_per_token(alpha, k, c)


def optimal_k(alpha: float, c: float, *, k_min: int = 1, k_max: int = 16) -> int:
    """The k in [k_min, k_max] that maximises ``speedup(alpha, k, c)`` (smallest k on ties).

    Raises:
        TypeError: k_min or k_max not an int (``check_count``).
        ValueError: k_min < 1, k_max < k_min (an empty range has no best k), alpha outside
            [0, 1], c < 0 (``theory``).
    """
    k_min = check_count(k_min, "optimal_k: k_min", minimum=1)
    k_max = check_count(k_max, "optimal_k: k_max", minimum=1)
    if k_min > k_max:
        raise ValueError(f"optimal_k: need k_min <= k_max, got k_min={k_min}, k_max={k_max}")
    return max(range(k_min, k_max + 1), key=lambda k: (speedup_per_token(alpha, k, c), -k))


class StaticK:
    """Always draft k tokens.

    Raises:
        ValueError: k is not an int >= 1.
    """

    def __init__(self, k: int = 4) -> None:
        self.k = _check_k("k", k)

    def __repr__(self) -> str:
        return f"StaticK({self.k})"

    def next_k(self) -> int:
        return self.k

    def update(self, *, drafted: int, accepted: int, draft_seconds: float = 0.0, target_seconds: float = 0.0) -> None:
        check_update(drafted, accepted, draft_seconds, target_seconds)


class HeuristicK:
    """transformers' heuristic schedule: grow after a full match, shrink after a rejection.

    ``AssistedCandidateGenerator.update_candidate_strategy`` with
    ``num_assistant_tokens_schedule="heuristic"`` adds 2 when every drafted token was
    accepted and subtracts 1 otherwise (never below 1). We add an upper bound.

    Args:
        k_init: first draft length.
        k_min, k_max: bounds, 1 <= k_min <= k_init <= k_max.
        grow, shrink: steps after a full match / a rejection (defaults 2 and 1), ints >= 1
            (for a fixed k use ``StaticK``).

    Raises:
        ValueError: bounds out of order, or k_init/k_min/k_max/grow/shrink not ints >= 1.
    """

    def __init__(self, k_init: int = 4, *, k_min: int = 1, k_max: int = 16, grow: int = 2, shrink: int = 1) -> None:
        k_init, k_min, k_max = (_check_k(name, value) for name, value in
                                (("k_init", k_init), ("k_min", k_min), ("k_max", k_max)))
        grow, shrink = (check_whole(value, f"HeuristicK: {name} must be an int >= 1 (the step after a "
                                           f"{'full match' if name == 'grow' else 'rejection'}), got {value!r}; "
                                           "for a fixed draft length use StaticK(k)")
                        for name, value in (("grow", grow), ("shrink", shrink)))   # NumPy ints -> Python ints
        if not k_min <= k_init <= k_max:
            raise ValueError(f"need k_min <= k_init <= k_max (k_init is the first draft length), got k_min={k_min}, "
                             f"k_init={k_init}, k_max={k_max}")
        self.k, self.k_min, self.k_max, self.grow, self.shrink = k_init, k_min, k_max, grow, shrink

    def __repr__(self) -> str:
        return f"HeuristicK(k={self.k}, k_min={self.k_min}, k_max={self.k_max})"

    def next_k(self) -> int:
        return self.k

    def update(self, *, drafted: int, accepted: int, draft_seconds: float = 0.0, target_seconds: float = 0.0) -> None:
        drafted, accepted, _, _ = check_update(drafted, accepted, draft_seconds, target_seconds)
        if drafted == 0:
            return
        if accepted == drafted:
            self.k = min(self.k_max, self.k + self.grow)
        else:
            self.k = max(self.k_min, self.k - self.shrink)


class CostModelK:
    """Pick k by the speed-up law from running estimates of α and c.

    α̂: each round is a run of Bernoulli trials stopped at the first rejection, so it holds
    ``accepted`` successes and one failure if ``accepted < drafted``. The estimate is
    successes / trials over all rounds so far, started from ``prior_alpha`` worth
    ``prior_weight`` trials (so the first rounds do not swing k to an extreme). With
    ``decay`` < 1 older rounds count less (a drifting text).

    ĉ: drafting seconds per drafted token divided by target seconds per pass, summed over
    the rounds (a ratio of totals, robust to one slow round). Pass ``c`` to fix it instead
    (a known cost, or a test).

    Args:
        k_init: draft length before any estimate (also returned until the first update).
        k_min, k_max: the search range.
        c: fixed draft cost, or None to measure it.
        prior_alpha, prior_weight: the α̂ prior.
        decay: weight kept by the past at each update, in (0, 1].

    Raises:
        ValueError: bad bounds, c < 0 or not finite, prior_alpha outside [0, 1], prior_weight < 0
            or not finite, decay outside (0, 1].
        TypeError: c, prior_alpha, prior_weight or decay not a real number.
    """

    def __init__(self, k_init: int = 4, *, k_min: int = 1, k_max: int = 16, c: float | None = None,
                 prior_alpha: float = 0.5, prior_weight: float = 4.0, decay: float = 1.0) -> None:
        k_init, k_min, k_max = (_check_k(name, value) for name, value in
                                (("k_init", k_init), ("k_min", k_min), ("k_max", k_max)))
        if not k_min <= k_init <= k_max:
            raise ValueError(f"need k_min <= k_init <= k_max (k_init is the first draft length), got k_min={k_min}, "
                             f"k_init={k_init}, k_max={k_max}")
        if c is not None:
            c = _check_real("c", c, lo=0.0, fix=" (draft cost per token in target passes; None measures it)")
        prior_alpha = _check_real("prior_alpha", prior_alpha, lo=0.0, hi=1.0)
        prior_weight = _check_real("prior_weight", prior_weight, lo=0.0, fix=" (trials the prior counts for)")
        decay = _check_real("decay", decay, lo=0.0, hi=1.0, lo_open=True)
        self.k, self.k_min, self.k_max = k_init, k_min, k_max
        self.fixed_c = c
        self.decay = decay
        self._successes = prior_alpha * prior_weight
        self._trials = prior_weight
        self._draft_s_per_token = 0.0
        self._target_s = 0.0

    def __repr__(self) -> str:
        return f"CostModelK(k={self.k}, alpha={self.alpha:.3f}, c={self.c:.3f})"

    @property
    def alpha(self) -> float:
        """The running acceptance estimate α̂."""
        return self._successes / self._trials if self._trials > 0 else 0.0

    @property
    def c(self) -> float:
        """The draft cost ĉ (fixed, or measured; 0.0 before any timed round)."""
        if self.fixed_c is not None:
            return self.fixed_c
        return self._draft_s_per_token / self._target_s if self._target_s > 0 else 0.0

    def next_k(self) -> int:
        return self.k

    def update(self, *, drafted: int, accepted: int, draft_seconds: float = 0.0, target_seconds: float = 0.0) -> None:
        drafted, accepted, draft_seconds, target_seconds = check_update(drafted, accepted, draft_seconds,
                                                                        target_seconds)
        if drafted > 0:
            self._successes = self.decay * self._successes + accepted
            self._trials = self.decay * self._trials + accepted + (1 if accepted < drafted else 0)
            self._draft_s_per_token = self.decay * self._draft_s_per_token + draft_seconds / drafted
            self._target_s = self.decay * self._target_s + target_seconds
        self.k = optimal_k(min(1.0, max(0.0, self.alpha)), self.c, k_min=self.k_min, k_max=self.k_max)
