"""Beyond (specdec-serving): k from load and acceptance. Provided.

The lecture: verification is free only while the batch leaves the hardware idle; once
B(k+1) rows make the pass compute-bound, every extra draft row costs real time, and "a static
k is a bug under drifting load". A serving engine therefore measures two things and decides
each round:

1. **The cost curve** of this machine: seconds of one cached target pass over B rows of T
   tokens each, t_T(B, T), and of one drafter step over B rows, t_D(B). ``measure_costs``
   times them on a grid (median of repeats) and ``PassCosts.load_or_measure`` caches the
   calibration as JSON under ``runs/`` (keyed by model, threads and device), so start-up pays
   it once.
2. **The running acceptance**: per-position acceptance alpha, estimated from the rounds
   (each round of k' drafts with m accepted adds m successes and, if m < k', one failure: the
   maximum-likelihood estimate under i.i.d. acceptance), decayed so it follows the traffic.

Then ``best_k`` maximises expected tokens per second for the whole batch,

    rate(k) = B * (1 - alpha^(k+1)) / (1 - alpha) / (t_T(B, k+1) + k * t_D(B)),   rate(0) = B / t_T(B, 1),

the standard law of expected tokens per round (Leviathan et al. 2023, eq. 1) over the measured
round time; k = 0 (plain decoding) wins when no draft length pays. ``break_even_batch`` is the
smallest B at which even the best k > 0 no longer beats plain decoding.

``LoadAwareK`` is the controller for the serving lab's batched loop (``controller=`` of
``g2c.specdec.lab.batched_speculative_generate``): ``next_k(B)`` and ``update(drafted, accepted)``.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from bisect import bisect_left
from dataclasses import dataclass, field
from pathlib import Path

import torch

from g2c.kvcache import ragged_forward
from g2c.nn import eval_mode, synchronize
from g2c.sampling.model import check_count, check_real

from ..lab.batched import RaggedKV

__all__ = ["LoadAwareK", "PassCosts", "StaticBatchK", "best_k", "break_even_batch", "expected_tokens",
           "measure_costs", "measure_round_costs"]


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per round per row with k drafts at per-position acceptance alpha:
    (1 - alpha^(k+1)) / (1 - alpha) (k + 1 at alpha = 1, 1 at k = 0).

    Raises:
        TypeError: alpha not a real number, k not an int.
        ValueError: alpha outside [0, 1] (or NaN) or k < 0.
    """
    k = check_count(k, "k")
    alpha = check_real(alpha, "alpha", low=0.0, high=1.0)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear y(x) through sorted points, extrapolated linearly past both ends."""
    if len(xs) == 1:
        return ys[0] * x / xs[0]
    i = min(max(bisect_left(xs, x), 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return max(y0 + (y1 - y0) * (x - x0) / (x1 - x0), 1e-9)


@dataclass
class PassCosts:
    """Measured pass times of this machine.

    Attributes:
        target: {B: {T: seconds}} for a cached target pass over B rows of T tokens.
        drafter: {B: seconds} for one drafter step over B rows (one token each).
        meta: what was measured (models, threads, device, context).

    ``target_s(B, T)`` and ``drafter_s(B)`` interpolate linearly between measured B (and T),
    extrapolating past the grid.
    """

    target: dict[int, dict[int, float]]
    drafter: dict[int, float]
    meta: dict = field(default_factory=dict)
    rounds: dict[int, dict[int, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Every grid non-empty, keyed by ints (B >= 1, T >= 1, k >= 0), every time a finite
        number of seconds >= 0."""
        def grid(table, name: str, inner: tuple[str, int] | None, empty_ok: bool = False):
            if not isinstance(table, dict) or (not table and not empty_ok):
                raise ValueError(f"PassCosts.{name} must be a non-empty dict {{B: ...}}, got {table!r:.60}")
            for b, v in table.items():
                check_count(b, f"PassCosts.{name} batch size", minimum=1)
                cells = v if inner is not None else {None: v}
                if inner is not None and (not isinstance(v, dict) or not v):
                    raise ValueError(f"PassCosts.{name}[{b}] must be a non-empty dict {{{inner[0]}: seconds}}, "
                                     f"got {v!r:.60}")
                for t, sec in cells.items():
                    if inner is not None:
                        check_count(t, f"PassCosts.{name}[{b}] {inner[0]}", minimum=inner[1])
                    check_real(sec, f"PassCosts.{name} seconds", low=0.0)

        grid(self.target, "target", ("T", 1))
        grid(self.drafter, "drafter", None)
        grid(self.rounds, "rounds", ("k", 0), empty_ok=True)
        if not isinstance(self.meta, dict):
            raise TypeError(f"PassCosts.meta must be a dict, got {type(self.meta).__name__}")

    def round_s(self, batch: int, k: int) -> float:
        """Seconds of one whole round at batch B with k drafts: the measured round times
        (``measure_round_costs``: everything the loop does, Python included) when there are any,
        else the pass model t_T(B, k+1) + k * t_D(B)."""
        if not self.rounds:
            return self.target_s(batch, k + 1) + k * self.drafter_s(batch)
        bs = sorted(self.rounds)
        per_b = []
        for b in bs:
            ks = sorted(self.rounds[b])
            per_b.append(_interp([float(x + 1) for x in ks], [self.rounds[b][x] for x in ks], float(k + 1)))
        return _interp([float(b) for b in bs], per_b, float(batch))

    def target_s(self, batch: int, tokens: int) -> float:
        bs = sorted(self.target)
        per_b = []
        for b in bs:
            ts = sorted(self.target[b])
            per_b.append(_interp([float(t) for t in ts], [self.target[b][t] for t in ts], float(tokens)))
        return _interp([float(b) for b in bs], per_b, float(batch))

    def drafter_s(self, batch: int) -> float:
        bs = sorted(self.drafter)
        return _interp([float(b) for b in bs], [self.drafter[b] for b in bs], float(batch))

    def to_json(self) -> str:
        return json.dumps({"target": {str(b): {str(t): s for t, s in v.items()} for b, v in self.target.items()},
                           "drafter": {str(b): s for b, s in self.drafter.items()}, "meta": self.meta,
                           "rounds": {str(b): {str(k): s for k, s in v.items()} for b, v in self.rounds.items()}},
                          indent=1)

    @classmethod
    def from_json(cls, text: str) -> "PassCosts":
        """The inverse of ``to_json``.

        Raises:
            TypeError: text not a str.
            ValueError: not JSON, or JSON that is not a calibration (missing "target" or
                "drafter", a key that is not a whole number, a time that is not a finite number
                of seconds); one line saying what is wrong.
        """
        if not isinstance(text, (str, bytes)):
            raise TypeError(f"text must be the str of PassCosts.to_json, got {type(text).__name__}")
        try:
            d = json.loads(text)
        except ValueError as e:          # json.JSONDecodeError, a UnicodeDecodeError of bytes
            raise ValueError(f"not a PassCosts calibration: not JSON ({str(e).splitlines()[0]})") from None
        if not isinstance(d, dict):
            raise ValueError(f"not a PassCosts calibration: JSON {type(d).__name__}, not an object with \"target\" "
                             "and \"drafter\"")
        try:
            return cls(target={int(b): {int(t): float(s) for t, s in v.items()} for b, v in d["target"].items()},
                       drafter={int(b): float(s) for b, s in d["drafter"].items()}, meta=d.get("meta", {}),
                       rounds={int(b): {int(k): float(s) for k, s in v.items()}
                               for b, v in d.get("rounds", {}).items()})
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            what = f"no {e} entry" if isinstance(e, KeyError) else str(e).splitlines()[0]
            raise ValueError(f"not a PassCosts calibration: {what}") from None

    @classmethod
    def load_or_measure(cls, target, drafter, *, path: str | os.PathLike | None = None, name: str = "model",
                        round_ks: tuple[int, ...] | None = None, **kw) -> "PassCosts":
        """Read the cached calibration at ``path`` (default ``runs/specdec_serving/calibration-
        <name>-<threads>t-<device>.json``) when it exists and matches ``kw``'s grid, else measure
        (``measure_costs(target, drafter, **kw)``; with ``round_ks`` also ``measure_round_costs``
        for those k) and write it there.

        A file written for another grid (or other ``round_ks``) is measured again and
        overwritten; a file that claims this grid but is not a calibration of it is refused.

        Raises:
            TypeError: path not a str or path.
            ValueError: the file at ``path`` is not a calibration (corrupted JSON, a missing or
                broken table) or does not hold the grid its meta claims: the message names the
                file and how to rebuild it (delete it and call again); as ``measure_costs``.
        """
        if path is not None and not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path must be a str or os.PathLike or None, got {type(path).__name__}")
        path = Path(path) if path is not None else Path("runs/specdec_serving") / \
            f"calibration-{name}-{torch.get_num_threads()}t-{target.device.type}.json"
        rebuild = (f"delete it (rm {path}) and call PassCosts.load_or_measure again (bench/specdec_serving.py: "
                   "rerun it) to measure a fresh one")
        if path.is_file():
            try:
                costs = cls.from_json(path.read_text())
            except (ValueError, TypeError) as e:
                raise ValueError(f"cached calibration {path} is broken ({e}): {rebuild}") from None
            grid = _grid_key(**kw)
            if costs.meta.get("grid") == grid and costs.meta.get("round_ks") == \
                    (list(round_ks) if round_ks else None):
                held = [sorted(costs.target), sorted({t for v in costs.target.values() for t in v})]
                if held != [sorted(set(grid[0])), sorted(set(grid[1]))] or sorted(costs.drafter) != held[0] or \
                        (round_ks and sorted({k for v in costs.rounds.values() for k in v}) != sorted(set(round_ks))):
                    raise ValueError(f"cached calibration {path} claims the grid batches={grid[0]}, "
                                     f"tokens={grid[1]} but holds batches={held[0]}, tokens={held[1]}: {rebuild}")
                return costs
        costs = measure_costs(target, drafter, **kw)
        if round_ks:
            costs.rounds = measure_round_costs(target, drafter, batches=kw.get("batches", (1, 2, 4, 8, 16, 32, 64)),
                                               ks=round_ks)
            costs.meta["round_ks"] = list(round_ks)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(costs.to_json())
        return costs


def _grid(values, name: str, minimum: int) -> list[int]:
    """A grid argument (a list or tuple of ints >= minimum, at least one) sorted, repeats dropped."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple, range, set, frozenset)):
        raise TypeError(f"{name} must be a list of ints, got {type(values).__name__} {values!r:.60}")
    if not values:
        raise ValueError(f"{name} must hold at least one value, got an empty {type(values).__name__}")
    return sorted({check_count(v, f"{name} entry", minimum=minimum) for v in values})


def _grid_key(batches=(1, 2, 4, 8, 16, 32, 64), tokens=(1, 2, 3, 5), context: int = 48, repeats: int = 5) -> list:
    return [list(batches), list(tokens), context, repeats]


@torch.no_grad()
def measure_costs(target, drafter, *, batches=(1, 2, 4, 8, 16, 32, 64), tokens=(1, 2, 3, 5), context: int = 48,
                  repeats: int = 5) -> PassCosts:
    """Time cached passes of ``target`` over (B, T) blocks and of ``drafter`` over (B, 1).

    Each B: a ragged cache (``g2c.specdec.lab.RaggedKV``) prefilled with ``context`` random
    tokens per row, then per T one warm-up and ``repeats`` timed ``ragged_forward`` passes
    (the pointer rolled back after each), median kept, made non-decreasing in T (noise on a shared
    machine must not make a bigger block look cheaper). The clock: process CPU time on the CPU (with
    one thread, robust when other processes share the cores), wall clock after a device synchronise
    elsewhere.

    Args:
        target, drafter: ``TransformerLM`` models (drafter may be None: no drafter costs).
        batches, tokens: the grid (ints >= 1); context + max(tokens) must fit max_seq_len.

    Raises:
        TypeError: a grid that is not a list of ints; context or repeats not an int.
        ValueError: an empty grid, a value < 1 (batches, tokens, context, repeats), or
            context + max(tokens) > max_seq_len.
    """
    batches, tokens = _grid(batches, "batches", 1), _grid(tokens, "tokens", 1)
    context, repeats = check_count(context, "context", minimum=1), check_count(repeats, "repeats", minimum=1)
    if context + max(tokens) > target.max_seq_len:
        raise ValueError(f"context {context} + {max(tokens)} tokens exceed max_seq_len={target.max_seq_len}")
    g = torch.Generator().manual_seed(0)
    clock = time.process_time if target.device.type == "cpu" else time.perf_counter

    def timed(model, b: int, ts: list[int]) -> dict[int, float]:
        cache = RaggedKV(model, b)
        ragged_forward(model, torch.randint(model.vocab_size, (b, context), generator=g).to(model.device), cache)
        out = {}
        for t in ts:
            block = torch.randint(model.vocab_size, (b, t), generator=g).to(model.device)
            samples = []
            for r in range(repeats + 1):
                synchronize(model.device)
                t0 = clock()
                ragged_forward(model, block, cache)
                synchronize(model.device)
                if r:
                    samples.append(clock() - t0)
                cache.crop(cache.lengths - t)
            out[t] = max(statistics.median(samples), max(out.values(), default=0.0))   # more rows never cost less
        return out

    with eval_mode(*(m for m in (target, drafter) if m is not None)):
        tgt = {b: timed(target, b, tokens) for b in batches}
        dft = {b: timed(drafter, b, [1])[1] for b in batches} if drafter is not None else {b: 0.0 for b in batches}
    return PassCosts(tgt, dft, meta={"grid": _grid_key(batches, tokens, context, repeats),
                                      "threads": torch.get_num_threads(), "device": str(target.device)})


def measure_round_costs(target, drafter, *, batches=(1, 2, 4, 8, 16, 32, 64), ks=(0, 1, 2, 4), prompt_len: int = 24,
                        rounds: int = 8) -> dict[int, dict[int, float]]:
    """Seconds per round of the serving lab's loop itself, {B: {k: seconds}}: B random prompts of
    ``prompt_len`` tokens, a budget of ``rounds`` tokens per row at a static k (``StaticBatchK``;
    random prompts are rarely matched, so about that many rounds), one warm-up per B; CPU time on
    the CPU, the prefill
    (timed alone, budget 0) subtracted. It includes what the pass model leaves out: the drafter's
    catch-up, argmax, the ragged commit and the Python of the round.

    Raises:
        TypeError: a grid that is not a list of ints; rounds or prompt_len not an int.
        ValueError: an empty grid or a value < 0 (k) / < 1 (B, rounds, prompt_len); prompt_len + budget
            past the window.
    """
    from ..lab.batched import batched_speculative_generate

    batches, ks = _grid(batches, "batches", 1), _grid(ks, "ks", 0)
    rounds, prompt_len = check_count(rounds, "rounds", minimum=1), check_count(prompt_len, "prompt_len", minimum=1)
    window = min(target.max_seq_len, drafter.max_seq_len)
    clock = time.process_time if target.device.type == "cpu" else time.perf_counter
    g = torch.Generator().manual_seed(0)
    out: dict[int, dict[int, float]] = {}
    for b in batches:
        prompts = [torch.randint(target.vocab_size, (prompt_len,), generator=g).tolist() for _ in range(b)]
        out[b] = {}
        for i, k in enumerate(ks):
            if prompt_len + rounds > window + 1:
                raise ValueError(f"prompt_len {prompt_len} + {rounds} new tokens exceed the window {window}")
            for r in range(2 if i == 0 else 1):              # one warm-up per batch size
                synchronize(target.device)
                t0 = clock()
                batched_speculative_generate(target, drafter, prompts, 0, controller=StaticBatchK(k))
                t1 = clock()
                res = batched_speculative_generate(target, drafter, prompts, rounds, controller=StaticBatchK(k))
                synchronize(target.device)
                t2 = clock()
            out[b][k] = max((t2 - t1) - (t1 - t0), 1e-9) / max(res.target_passes, 1)
        for k in ks[1:]:                                      # a round with more drafts never costs less
            out[b][k] = max(out[b][k], out[b][ks[ks.index(k) - 1]])
    return out


def best_k(alpha: float, batch: int, costs: PassCosts, *, k_max: int = 8, correction=None) -> int:
    """The k in [0, k_max] with the most expected tokens per second for a batch of ``batch`` rows
    at acceptance ``alpha`` (the law in the module docstring); ties go to the smaller k.
    ``correction(k)`` (optional) multiplies the calibrated round time of k: what the running
    controller has measured of its own rounds.

    Raises:
        TypeError: batch or k_max not an int; alpha not a real number; costs not a ``PassCosts``.
        ValueError: batch < 1, k_max < 0, alpha outside [0, 1].
    """
    batch = check_count(batch, "batch", minimum=1)
    k_max = check_count(k_max, "k_max")
    alpha = check_real(alpha, "alpha", low=0.0, high=1.0)
    if not isinstance(costs, PassCosts):
        raise TypeError(f"costs must be a PassCosts, got {type(costs).__name__}")
    best, best_rate = 0, -1.0
    for k in range(k_max + 1):
        seconds = costs.round_s(batch, k) * (1.0 if correction is None else correction(k))
        rate = batch * expected_tokens(alpha, k) / seconds
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = k, rate
    return best


def break_even_batch(alpha: float, costs: PassCosts, *, k_max: int = 8, max_batch: int = 256) -> int | None:
    """The smallest B in [1, max_batch] at which ``best_k`` is 0 (speculation no longer pays), or
    None when it pays up to ``max_batch``.

    Raises:
        TypeError / ValueError: as ``best_k``; max_batch not an int >= 1.
    """
    max_batch = check_count(max_batch, "max_batch", minimum=1)
    for b in range(1, max_batch + 1):
        if best_k(alpha, b, costs, k_max=k_max) == 0:
            return b
    return None


class StaticBatchK:
    """The serving lab's static k through the controller hook (``k`` may be 0: plain rounds)."""

    def __init__(self, k: int) -> None:
        self.k = check_count(k, "k")

    def next_k(self, batch: int = 1) -> int:
        return self.k

    def update(self, *, drafted: int, accepted, **kw) -> None:
        return None


class LoadAwareK:
    """Pick each round's k from the batch size and the running acceptance.

    Args:
        costs: the machine's ``PassCosts``.
        k_max: the largest k considered (int >= 1).
        prior_alpha: the acceptance assumed before any round (in [0, 1]).
        prior_weight: pseudo-rounds the prior counts for (>= 0).
        decay: weight kept per round by old evidence (in (0, 1]; 1 = never forget).
        probe_every: after this many plain rounds in a row, draft one round at k = 1 so the
            acceptance estimate keeps learning while speculation is off (int >= 1; None = never).
        clock: seconds now (default ``time.process_time``: CPU time, robust with one thread on
            a shared machine); None turns the online correction off.

    Online correction: the calibration is timed on random prompts, not on the live traffic. The
    controller times its own rounds (from one ``next_k`` to the next), and keeps per k the
    running ratio measured / calibrated round time (``ratio``, a decayed mean; a gap outside
    [0.2, 5] of the calibration, e.g. a pause between runs, is ignored); ``best_k`` multiplies each
    calibrated round time by its k's ratio (a drafting k not yet run borrows the nearest drafting
    k's ratio; k = 0 not yet run keeps 1).

    ``alpha`` = (prior successes + decayed successes) / (prior trials + decayed trials) with the
    per-round MLE counts of the module docstring; ``next_k(B) = best_k(alpha, B, costs)``.
    ``history`` keeps (B, k) per round.

    Raises:
        TypeError: costs is not a ``PassCosts``; a count that is not an int, a rate that is not a
            real number, a clock that is not callable; in ``next_k``, a batch that is not an int;
            in ``update``, counts that are not ints.
        ValueError: a parameter out of range; in ``next_k``, batch < 1; in ``update``, drafted < 0
            or an accepted count outside [0, drafted].
    """

    def __init__(self, costs: PassCosts, *, k_max: int = 8, prior_alpha: float = 0.7, prior_weight: float = 2.0,
                 decay: float = 0.95, probe_every: int | None = 8, clock=time.process_time) -> None:
        if not isinstance(costs, PassCosts):
            raise TypeError(f"costs must be a PassCosts, got {type(costs).__name__}")
        k_max = check_count(k_max, "k_max", minimum=1)
        prior_alpha = check_real(prior_alpha, "prior_alpha", low=0.0, high=1.0)
        prior_weight = check_real(prior_weight, "prior_weight", low=0.0)
        decay = check_real(decay, "decay", low=0.0, high=1.0, low_open=True)
        if probe_every is not None:
            probe_every = check_count(probe_every, "probe_every", minimum=1)
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds, or None, got {type(clock).__name__}")
        self.costs, self.k_max, self.decay, self.probe_every = costs, k_max, decay, probe_every
        self._plain_run = 0
        self.clock = clock
        self.ratio: dict[int, float] = {}
        self._last: tuple[int, int, float] | None = None
        self._prior = (prior_alpha * prior_weight, prior_weight)
        self._succ = self._trials = 0.0
        self.history: list[tuple[int, int]] = []

    def __repr__(self) -> str:
        return f"LoadAwareK(k_max={self.k_max}, alpha={self.alpha:.2f})"

    @property
    def alpha(self) -> float:
        s, n = self._prior[0] + self._succ, self._prior[1] + self._trials
        return min(max(s / n, 0.0), 1.0) if n > 0 else 0.0

    def _observe_round(self, now: float) -> None:
        if self._last is None:
            return
        b, k, t0 = self._last
        r = (now - t0) / self.costs.round_s(b, k)
        if 0.2 <= r <= 5.0:
            self.ratio[k] = r if k not in self.ratio else 0.5 * self.ratio[k] + 0.5 * r

    def new_run(self) -> None:
        """Call between runs of a long-lived controller (a server's, kept across requests): the
        acceptance and cost estimates carry over, the round clock restarts."""
        self._last, self._plain_run = None, 0

    def _correction(self, k: int) -> float:
        """The measured ratio of k; a drafting k not yet run borrows the nearest drafting k's."""
        if k in self.ratio:
            return self.ratio[k]
        near = [j for j in self.ratio if j > 0] if k > 0 else []
        return self.ratio[min(near, key=lambda j: abs(j - k))] if near else 1.0

    def next_k(self, batch: int = 1) -> int:
        batch = check_count(batch, "batch", minimum=1)
        now = None if self.clock is None else self.clock()
        if now is not None:
            self._observe_round(now)
        k = best_k(self.alpha, batch, self.costs, k_max=self.k_max, correction=self._correction)
        self._plain_run = self._plain_run + 1 if k == 0 else 0
        if k == 0 and self.probe_every is not None and self._plain_run > self.probe_every:
            k, self._plain_run = 1, 0                   # a probe: one cheap drafting round
        self.history.append((batch, k))
        if now is not None:
            self._last = (batch, k, self.clock())       # the round starts now (after our own choice)
        return k

    def update(self, *, drafted: int, accepted, **kw) -> None:
        drafted = check_count(drafted, "drafted")
        counts = [check_count(a, "accepted") for a in (accepted if isinstance(accepted, (list, tuple)) else [accepted])]
        if any(a > drafted for a in counts):
            raise ValueError(f"accepted must be in [0, drafted={drafted}], got {max(counts)}")
        if drafted == 0:
            return
        for a in counts:
            self._succ = self._succ * self.decay + a
            self._trials = self._trials * self.decay + a + (1 if a < drafted else 0)
