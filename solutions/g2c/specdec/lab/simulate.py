"""Beyond (specdec-lab): "Be the Verifier", simulated and measured speculative rounds.

The i.i.d. model of ``theory.py`` says each draft is accepted with probability alpha,
independently, until the first rejection; the target's pass then adds one token of its own
(the correction at the rejection, or the bonus after a full match). ``simulate_rounds``
plays that model with a seeded generator (the exercise); ``PassRecorder`` collects REAL
rounds from ``speculative_generate(..., on_pass=recorder)`` in the same shape, so measured
and simulated rounds can be drawn (``draw_rounds``) and compared side by side
(``per_position_acceptance``, ``fit_alpha``).

Source: Leviathan, Kalman, Matias, ICML 2023, section 3.1 (the i.i.d. acceptance model);
the lecture behind the specdec module, "Have Fun! Be the Verifier".

Shape letters: R rounds, k draft length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from g2c.sampling.model import check_generator, check_real, check_whole

from ..theory import expected_tokens_per_pass

__all__ = ["PassRecorder", "Rounds", "draw_rounds", "fit_alpha", "per_position_acceptance", "simulate_rounds"]


@dataclass
class Rounds:
    """A batch of speculative rounds (simulated or measured). Provided.

    Attributes:
        accepted: LongTensor (R,) on the CPU, accepted drafts per round, each in [0, k].
        emitted: LongTensor (R,) on the CPU, tokens emitted per round (accepted + 1 unless a
            budget or end-of-sequence cut shortened the round).
        k: draft length of every round.
        c: draft cost per draft token in target steps (the paper's c; see ``theory``).
        source: a label for plots ("simulated alpha=0.85" or "StoryLM-1M -> StoryLM-30M").

    Properties ``tau`` (mean emitted per round = tokens per target pass) and ``speedup``
    (tau / (1 + k c), the per-token convention of ``theory.speedup_per_token``).

    Raises:
        TypeError: k not an int, c not a real number, accepted or emitted not a tensor.
        ValueError: k < 1, c < 0 or not finite; accepted or emitted not 1-D integer tensors of one
            length; an accepted count outside [0, k]; an emitted count outside [1, accepted + 1].
    """

    accepted: torch.Tensor
    emitted: torch.Tensor
    k: int
    c: float = 0.0
    source: str = ""

    def __post_init__(self) -> None:
        """Refuse rounds no run could give (a ValueError naming the field), or the wrong types (TypeError)."""
        self.k = check_whole(self.k, f"Rounds: k must be an int >= 1 (the draft length), got {self.k!r}")
        self.c = check_real(self.c, "Rounds: c", low=0)
        for name in ("accepted", "emitted"):
            t = getattr(self, name)
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"Rounds: {name} must be a 1-D integer tensor, got {type(t).__name__}")
            if t.dim() != 1 or t.dtype.is_floating_point or t.dtype == torch.bool:
                raise ValueError(f"Rounds: {name} must be a 1-D integer tensor, got {t.dtype} of shape "
                                 f"{tuple(t.shape)}")
        acc, emi = self.accepted, self.emitted
        if acc.shape != emi.shape:
            raise ValueError(f"Rounds: accepted and emitted hold one count per round, got {acc.numel()} and "
                             f"{emi.numel()}")
        if acc.numel() and (int(acc.min()) < 0 or int(acc.max()) > self.k):
            raise ValueError(f"Rounds: accepted must lie in [0, k={self.k}], got {acc.tolist()[:8]}")
        if emi.numel() and (bool((emi < 1).any()) or bool((emi > acc + 1).any())):
            raise ValueError("Rounds: each round emits 1 to accepted + 1 tokens (fewer only when a budget or the "
                             f"end of a sequence cut it), got emitted {emi.tolist()[:8]} for accepted "
                             f"{acc.tolist()[:8]}")

    @property
    def num_rounds(self) -> int:
        return int(self.accepted.numel())

    @property
    def tau(self) -> float:
        """Empirical tokens per target pass (0.0 with no rounds)."""
        return float(self.emitted.float().mean()) if self.num_rounds else 0.0

    @property
    def speedup(self) -> float:
        """Empirical tau / (1 + k c)."""
        return self.tau / (1.0 + self.k * self.c)


def simulate_rounds(alpha: float, k: int, c: float, num_rounds: int, *, generator: torch.Generator) -> Rounds:
    """Play ``num_rounds`` speculative rounds of the i.i.d. acceptance model.

    Each round drafts k tokens; draft i is accepted with probability alpha, independently,
    and the round stops at the first rejection (the rest of the draft is thrown away
    unseen). The target's pass always adds one token: the correction at the rejected
    position, or the bonus after k accepted drafts. So a round emits accepted + 1 tokens,
    between 1 and k + 1, and the mean over many rounds tends to tau(alpha, k).

    Args:
        alpha: acceptance probability per draft token, in [0, 1].
        k: draft length, int >= 1.
        c: draft cost per draft token in target steps, >= 0 (only stored; used by
            ``Rounds.speedup``).
        num_rounds: R, int >= 1.
        generator: a CPU ``torch.Generator``; the result is a function of its state.

    Returns:
        ``Rounds`` with accepted, emitted LongTensors (R,) on the CPU and the given k, c.

    Raises:
        ValueError: alpha outside [0, 1] ("alpha"), k < 1 ("k"), c < 0 or not finite ("c"),
            num_rounds < 1 ("num_rounds"); a generator on another device than the CPU.
        TypeError: alpha or c not a real number, k or num_rounds not an int; generator is not a
            ``torch.Generator`` ("generator").

    Steps:
        1. Draw the k accept/reject outcomes of every round at once: uniforms (R, k) from
           ``generator``; a draft passes when its uniform is < alpha
           (``test_simulate_rounds_alpha_edges``).
        2. accepted = the length of the leading run of passes in each row: a pass after a
           rejection does not count (``test_simulate_rounds_rejects_counting_every_pass``).
        3. emitted = accepted + 1: never forget the target's own token
           (``test_simulate_rounds_mean_converges_to_tau``).
    """
    try:
        a = check_real(alpha, "alpha (a probability)")                       # a wrong type: TypeError
    except ValueError:
        a = math.nan                                                          # NaN or inf: the message below
    if not 0.0 <= a <= 1.0:
        raise ValueError(f"alpha must be a probability in [0, 1], got {alpha!r}")
    alpha = a
    k = check_whole(k, f"k must be an int >= 1 (draft tokens per round), got {k!r}")
    c = check_real(c, "c (draft cost per draft token, in target steps)", low=0)
    num_rounds = check_whole(num_rounds, f"num_rounds must be an int >= 1, got {num_rounds!r}")
    if generator is None:
        raise TypeError("generator must be a torch.Generator (seeded for reproducible rounds), got None")
    check_generator(generator)
    # BEGIN SOLUTION
    passes = torch.rand(num_rounds, k, generator=generator) < alpha   # (R, k) bool
    accepted = passes.long().cumprod(dim=1).sum(dim=1)                # (R,) leading run
    emitted = accepted + 1                                            # (R,) + correction/bonus
    # END SOLUTION
    return Rounds(accepted=accepted, emitted=emitted, k=k, c=float(c), source=f"simulated alpha={alpha:.2f}")


class PassRecorder:
    """An ``on_pass`` callback for ``speculative_generate`` that keeps every round. Provided.

        rec = PassRecorder()
        speculative_generate(target, drafter, prompt, 64, k=4, on_pass=rec)
        real = rec.rounds(k=4)

    Attributes:
        passes: list of (emitted ids, num_accepted), one per target pass, in order.
    """

    def __init__(self) -> None:
        self.passes: list[tuple[list[int], int]] = []
        self._run_ends: list[int] = []

    def __call__(self, emitted: list[int], num_accepted: int) -> None:
        self.passes.append((list(emitted), int(num_accepted)))

    def end_run(self) -> None:
        """Mark the end of one generation (its last pass may be cut by the budget)."""
        self._run_ends.append(len(self.passes))

    def rounds(self, k: int, *, c: float = 0.0, source: str = "measured") -> Rounds:
        """The recorded passes as ``Rounds``, leaving out passes that could be cut short.

        The last pass of each run (see ``end_run``; the last pass overall if never called)
        may have drafted fewer than k tokens or been cut by the budget or end-of-sequence,
        so it is dropped; so is any pass that emitted fewer than accepted + 1 tokens.

        Raises:
            ValueError: k not an int >= 1; a recorded pass accepted more than k drafts
                (the k does not match the run).
        """
        k = check_whole(k, f"k must be an int >= 1 (the run's draft length), got {k!r}")
        ends = set(self._run_ends or [len(self.passes)])
        acc, emi = [], []
        for i, (emitted, num_acc) in enumerate(self.passes):
            if num_acc > k:
                raise ValueError(f"pass {i} accepted {num_acc} drafts but k={k}; pass the k the run used")
            if (i + 1) in ends or len(emitted) != num_acc + 1:
                continue
            acc.append(num_acc)
            emi.append(len(emitted))
        return Rounds(accepted=torch.tensor(acc, dtype=torch.long), emitted=torch.tensor(emi, dtype=torch.long),
                      k=k, c=float(c), source=source)


def _check_rounds(rounds) -> None:
    if not isinstance(rounds, Rounds):
        raise TypeError(f"rounds must be a Rounds (simulate_rounds(...) or PassRecorder.rounds(k)), got "
                        f"{type(rounds).__name__}")


def per_position_acceptance(rounds: Rounds) -> tuple[torch.Tensor, torch.Tensor]:
    """Measured acceptance at each draft position, given that the position was reached. Provided.

    a_i = #(rounds with accepted >= i) / #(rounds with accepted >= i - 1), i = 1..k. Under
    the i.i.d. model every a_i equals alpha; real drafters are not i.i.d. (an accepted
    draft makes the next one likelier to be accepted: the two models agree on an "easy"
    stretch of text).

    Returns:
        (rates, reached): float32 (k,) and int64 (k,); rates[i] is NaN where no round
        reached position i + 1.
    """
    _check_rounds(rounds)
    acc = rounds.accepted
    reached = torch.stack([(acc >= i - 1).sum() for i in range(1, rounds.k + 1)])    # (k,)
    passed = torch.stack([(acc >= i).sum() for i in range(1, rounds.k + 1)])         # (k,)
    rates = torch.where(reached > 0, passed.float() / reached.clamp(min=1).float(),
                        torch.full((rounds.k,), float("nan")))
    return rates, reached


def fit_alpha(rounds: Rounds) -> float:
    """Maximum-likelihood alpha of the i.i.d. model from accepted counts. Provided.

    Each round is a run of Bernoulli(alpha) trials that stops at the first failure or after
    k successes: alpha_hat = sum(accepted) / sum(accepted + [accepted < k]) (successes over
    trials). This is NOT ``SpecStats.acceptance_rate`` (accepted / drafted), which also
    counts the aborted tail as drafted. Returns NaN with no trials.
    """
    _check_rounds(rounds)
    acc = rounds.accepted
    trials = (acc + (acc < rounds.k).long()).sum()
    return float(acc.sum()) / float(trials) if int(trials) else float("nan")


def draw_rounds(rounds: Rounds, ax=None, *, max_rounds: int = 24, alpha: float | None = None, legend: bool = True):
    """Draw rounds as rows: green bars accepted drafts, a red x each rejected or aborted
    draft, an amber star the target's own token (correction or bonus). Provided.

    Row 1 (the first round) is at the top. At a rejection the star sits just right of the
    red x of the rejected draft it replaces (so both stay visible); after a full match it sits
    in the "bonus" column. The title says how many of the rounds are drawn and gives tau over
    all of them.

    Args:
        rounds: what to draw (the first ``max_rounds`` rounds; tau counts every round).
        ax: a matplotlib Axes (a new figure if None).
        max_rounds: how many rounds (rows) to draw at most.
        alpha: if given, the title adds theory tau(alpha, k) next to the measured tau.
        legend: draw a legend for the three marks inside the Axes (upper right).

    Returns:
        the Axes.
    """
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 0.28 * min(max_rounds, max(rounds.num_rounds, 1)) + 1.6))
    k = rounds.k
    shown = rounds.accepted[:max_rounds].tolist()
    for row, acc in enumerate(shown):
        y = -row
        if acc:
            ax.barh([y] * acc, [0.8] * acc, left=[i + 0.1 for i in range(acc)], height=0.6, color="tab:green")
        tail = list(range(acc, k))
        if tail:
            ax.scatter([i + 0.5 for i in tail], [y] * len(tail), marker="x", color="tab:red", s=40, zorder=4)
        star_x = acc + (0.8 if acc < k else 0.5)  # beside the rejected draft's x, or centred on "bonus"
        ax.scatter([star_x], [y], marker="*", color="orange", s=110, edgecolors="darkorange", zorder=3)
    ax.set_xlim(0, k + 1)
    ax.set_ylim(-len(shown) + 0.4, 0.8 + (1.6 if legend else 0.0))  # headroom for the legend
    ax.set_xticks([i + 0.5 for i in range(k + 1)], [f"d{i + 1}" for i in range(k)] + ["bonus"])
    ax.set_xlabel("draft position")
    step = max(1, len(shown) // 10)
    ticks = list(range(0, len(shown), step))
    ax.set_yticks([-row for row in ticks], [str(row + 1) for row in ticks])
    ax.set_ylabel("round (first at the top)")
    if len(shown) == rounds.num_rounds:
        title = f"{rounds.source}, k={k}: {rounds.num_rounds} rounds\ntau={rounds.tau:.2f}"
    else:
        title = (f"{rounds.source}, k={k}: first {len(shown)} of {rounds.num_rounds} rounds drawn\n"
                 f"tau={rounds.tau:.2f} over all {rounds.num_rounds}")
    if alpha is not None:
        title += f" (theory {expected_tokens_per_pass(alpha, k):.2f} at alpha={alpha:.2f})"
    ax.set_title(title, fontsize=9)
    if legend:
        handles = [Patch(color="tab:green", label="accepted draft"),
                   Line2D([], [], marker="x", color="tab:red", ls="", label="rejected or aborted draft"),
                   Line2D([], [], marker="*", color="orange", markeredgecolor="darkorange", markersize=11, ls="",
                          label="target's token (correction / bonus)")]
        ax.legend(handles=handles, loc="upper right", fontsize=7, ncol=3, framealpha=0.9)
    return ax
