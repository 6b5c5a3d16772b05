"""Beyond (specdec-serving): acceptance as the serving engines report it, and its alarm. Provided.

Engines (vLLM, SGLang) report speculation per request and per prompt set as:

- mean acceptance length = 1 + accepted / rounds: tokens a target pass yields when nothing is
  cut (the course's ``tokens_per_pass`` counts cuts by the budget and EOS as well);
- per-position acceptance rate: of the rounds that drafted a position i (0-based), the share
  that accepted it;
- the acceptance-length histogram: how many rounds emitted 1, 2, ..., k+1 tokens.

A number without its task distribution means little (the lecture: tau moved from 4.73 to 2.61
between coding and creative traffic), so the serving bench reports them per prompt set.

The engine's loop is not changed to get them: ``RoundLog.watch(controller)`` wraps the round's
controller, whose ``update(drafted=..., accepted=...)`` the loop calls after every target pass
(both ``speculative_sample`` and the serving lab's batched loop), and records each round.
``AcceptanceAlarm`` warns (``AcceptanceCollapse``, a ``UserWarning``) when the mean
acceptance length over the last ``window`` drafting rounds stays at or below ``threshold``:
the drafter no longer matches the traffic, a quality alarm for the deployment.
"""

from __future__ import annotations

import warnings
from collections import deque
from dataclasses import dataclass, field

from ..sampling.controllers import StaticK

__all__ = ["AcceptanceAlarm", "AcceptanceCollapse", "RoundLog", "acceptance_metrics"]


class AcceptanceCollapse(UserWarning):
    """Mean acceptance length stayed near 1 over the alarm's window."""


def _count(x, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
        raise ValueError(f"{name} must be an int >= 0, got {x!r}")
    return x


def acceptance_metrics(rounds) -> dict:
    """The serving metrics of a list of rounds.

    Args:
        rounds: iterable of (drafted, accepted) int pairs, one per target pass; rounds with
            drafted = 0 (plain steps) are left out of every metric.

    Returns:
        dict with ``rounds``, ``drafted``, ``accepted``, ``mean_acceptance_length`` (1 +
        accepted / rounds; 1.0 with no round), ``per_position`` (list, entry i = accepted at
        position i / rounds that drafted position i) and ``histogram`` (list, entry j = rounds
        whose acceptance length accepted + 1 equals j + 1).

    Raises:
        ValueError: an entry that is not a (drafted, accepted) pair ("must be a (drafted, accepted)
            pair"), a count negative or not an int, or accepted > drafted.
    """
    n = d = a = 0
    drafted_at: list[int] = []
    accepted_at: list[int] = []
    hist: list[int] = []
    for index, pair in enumerate(rounds):
        if isinstance(pair, (str, bytes)) or not hasattr(pair, "__len__") or len(pair) != 2:
            raise ValueError(f"rounds[{index}] must be a (drafted, accepted) pair, got {pair!r}")
        drafted, accepted = pair
        drafted, accepted = _count(drafted, "drafted"), _count(accepted, "accepted")
        if accepted > drafted:
            raise ValueError(f"accepted={accepted} exceeds drafted={drafted}")
        if drafted == 0:
            continue
        n, d, a = n + 1, d + drafted, a + accepted
        while len(drafted_at) < drafted:
            drafted_at.append(0)
            accepted_at.append(0)
        while len(hist) < drafted + 1:
            hist.append(0)
        for i in range(drafted):
            drafted_at[i] += 1
            accepted_at[i] += i < accepted
        hist[accepted] += 1
    return {"rounds": n, "drafted": d, "accepted": a, "mean_acceptance_length": 1.0 + a / n if n else 1.0,
            "per_position": [x / y for x, y in zip(accepted_at, drafted_at)], "histogram": hist}


@dataclass
class AcceptanceAlarm:
    """Warn when speculation stops paying for itself in acceptance.

    Args:
        window: drafting rounds the mean is taken over (int >= 1).
        threshold: warn when the window's mean acceptance length is <= this (>= 1.0; 1.0 means
            no draft was accepted at all).

    ``observe(drafted, accepted)`` after each round; the first time a full window's mean is at
    or below the threshold it warns once (``AcceptanceCollapse``) and counts it in ``alarms``;
    it re-arms when the mean recovers above the threshold.

    Raises:
        ValueError: window < 1 or threshold < 1.0 (in the constructor); in ``observe``, a count
            negative or not an int, or accepted > drafted ("exceeds drafted").
    """

    window: int = 32
    threshold: float = 1.2
    alarms: int = 0
    _recent: deque = field(default_factory=deque, repr=False)
    _armed: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be an int >= 1 rounds, got {self.window!r}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) or \
                not 1.0 <= self.threshold < float("inf"):
            raise ValueError(f"threshold must be a mean acceptance length >= 1.0, got {self.threshold!r}")
        self._recent = deque(maxlen=self.window)

    def observe(self, drafted: int, accepted: int) -> None:
        drafted, accepted = _count(drafted, "drafted"), _count(accepted, "accepted")
        if accepted > drafted:
            raise ValueError(f"accepted ({accepted}) exceeds drafted ({drafted}): a round accepts at most the drafts "
                             "it scored")
        if drafted == 0:
            return
        self._recent.append(accepted)
        if len(self._recent) < self.window:
            return
        mean = 1.0 + sum(self._recent) / len(self._recent)
        if mean <= self.threshold and self._armed:
            self.alarms += 1
            self._armed = False
            warnings.warn(f"speculation: mean acceptance length {mean:.2f} <= {self.threshold} over the last "
                          f"{self.window} rounds: the drafter no longer matches the traffic (check the prompt "
                          f"set, or turn speculation off)", AcceptanceCollapse, stacklevel=3)
        elif mean > self.threshold:
            self._armed = True


class RoundLog:
    """Records every round a loop reports to its controller, without changing the loop.

    ``log.watch(controller)`` returns a controller for ``speculative_sample(controller=...)``
    (None: ``StaticK(k)``) or the serving lab's loop that forwards ``next_k``/``update`` to
    it and appends (drafted, accepted) per round (per row in the batched lab: one entry per
    active row and round) to ``log.rounds``; with an ``alarm`` it also feeds the alarm.
    ``log.metrics()`` is ``acceptance_metrics(log.rounds)``.
    """

    def __init__(self, alarm: AcceptanceAlarm | None = None) -> None:
        if alarm is not None and not isinstance(alarm, AcceptanceAlarm):
            raise TypeError(f"alarm must be an AcceptanceAlarm or None, got {type(alarm).__name__}")
        self.rounds: list[tuple[int, int]] = []
        self.alarm = alarm

    def add(self, drafted: int, accepted) -> None:
        """One round: ``accepted`` an int, or a list (one per row of a batched round)."""
        for a in (accepted if isinstance(accepted, (list, tuple)) else [accepted]):
            self.rounds.append((_count(drafted, "drafted"), _count(int(a), "accepted")))
            if self.alarm is not None:
                self.alarm.observe(drafted, int(a))

    def watch(self, controller=None, *, k: int = 4):
        return _Watched(self, StaticK(k) if controller is None else controller)

    def metrics(self) -> dict:
        return acceptance_metrics(self.rounds)


class _Watched:
    def __init__(self, log: RoundLog, inner) -> None:
        self.log, self.inner = log, inner

    def next_k(self, *args):
        return self.inner.next_k(*args)

    def update(self, *, drafted: int, accepted, **kw) -> None:
        self.log.add(drafted, accepted)
        self.inner.update(drafted=drafted, accepted=accepted, **kw)
