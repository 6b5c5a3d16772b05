"""Beyond (specdec-serving): structured output inside speculation.

A serving engine runs speculation with the user's constraints on: "answer yes or no", "a date",
"this JSON schema". The constraint is a state machine over tokens (``regex.TokenConstraint``);
plain constrained decoding masks every step's logits with the legal tokens of the current state
and advances the state with the sampled token (``constrained_generate``, the reference).

Inside a speculative round the target scores k'+1 rows in one pass, and row i is the
distribution of the token after the first i drafts. So row i must be masked with the state
reached *after drafts 0 .. i-1* (your exercise, ``mask_verify_rows``), never with the state at
the start of the round for every row. A rejected draft never advances the state: the
constraint's state lives with the committed text (``ConstrainedTarget`` re-walks only what was
committed), and the rows after a draft that left the language are never sampled from.

With every row masked, the target's p at each position is exactly the masked distribution
plain constrained decoding samples from, so the speculative loop's output has the law of plain
constrained decoding (greedy: the same tokens) whatever the drafter does (Leviathan, Kalman,
Matias, ICML 2023, section 2.3: the verifier only needs the draft's true q). The drafter side is
for speed only: ``ConstrainedDrafter`` proposes a *forced* run (states with exactly one legal
token, e.g. the literal parts of the pattern) without calling its drafter at all, and otherwise
cuts its drafter's proposal at the first illegal token, reporting q masked and renormalised
(the law of a draft that was kept, given that it was legal).

Shape letters: V vocabulary, k draft length.
"""

from __future__ import annotations

import torch

from g2c.nn import eval_mode
from g2c.sampling.generate import as_token_ids, next_token_logits
from g2c.sampling.model import check_count, check_eos_id, check_generator, check_language_model

from ..sampling.draft import Draft
from ..sampling.drafters import Drafter, Sampler, check_reads
from ..sampling.loop import speculative_sample
from ..sampling.target import RecomputeTarget, Target
from .regex import DEAD, DONE, TokenConstraint

__all__ = ["ConstrainedDrafter", "ConstrainedTarget", "constrained_generate", "constrained_speculative_sample",
           "mask_verify_rows"]


def _check_constraint(constraint, vocab_size: int | None = None) -> TokenConstraint:
    if not isinstance(constraint, TokenConstraint):
        raise TypeError(f"constraint must be a g2c.specdec.serving.TokenConstraint, got {type(constraint).__name__}")
    if vocab_size is not None and constraint.vocab_size != vocab_size:
        raise ValueError(f"the constraint's vocabulary has V={constraint.vocab_size} tokens but the model's has "
                         f"vocab_size={vocab_size}: build the constraint from the model's tokenizer")
    return constraint


def _check_state(state, constraint: TokenConstraint) -> int:
    state = check_count(state, "state", minimum=None)
    if state not in (DONE, DEAD) and not 0 <= state < len(constraint.dfa.accepting):
        raise ValueError(f"state {state} is not a state of the constraint (0..{len(constraint.dfa.accepting) - 1}, "
                         f"DONE={DONE} or DEAD={DEAD}): pass the state constraint.walk returns")
    return state


def mask_verify_rows(logits: torch.Tensor, constraint: TokenConstraint, state: int,
                     draft_ids: torch.Tensor) -> torch.Tensor:
    """Mask the k'+1 verify rows of one speculative round with the constraint.

    Args:
        logits: (k'+1, V) float target logits on any device; row i scores the token after
            the committed context and the first i drafts.
        constraint: the ``TokenConstraint`` (its ``vocab_size`` equals V).
        state: the constraint's state after the committed context (an int from the
            constraint: a DFA state, ``DONE`` or ``DEAD``).
        draft_ids: (k',) int64 on the CPU, the round's drafts (k' may be 0).

    Returns:
        (k'+1, V), logits' dtype and device: row i keeps the logits of the tokens legal in the
        state after ``draft_ids[:i]`` and holds -inf everywhere else. A row after a draft that
        the constraint refuses (state ``DEAD``) or after EOS (``DONE``) allows EOS only: the
        loop never samples from it, but it must not be -inf everywhere. ``logits`` itself is
        left unchanged.

    Raises:
        TypeError: constraint is not a ``TokenConstraint``; state not an int.
        ValueError: logits not a floating-point 2-D tensor with k'+1 rows of V columns ("logits"),
            draft_ids not a 1-D integer tensor of ids in [0, V), state not one of the constraint's
            (a DFA state, ``DONE`` or ``DEAD``).

    Steps:
        1. Walk the drafts: states[0] = state, states[i+1] = ``constraint.step(states[i],
           draft_ids[i])`` (``test_mask_verify_rows_advances_the_state_row_by_row``).
        2. Stack ``constraint.mask(s)`` for the k'+1 states into a (k'+1, V) bool tensor on the
           logits' device and fill the rest with -inf (``Tensor.masked_fill``;
           ``test_mask_verify_rows_matches_plain_masks``).
    """
    constraint = _check_constraint(constraint)
    if not isinstance(draft_ids, torch.Tensor) or draft_ids.dim() != 1:
        raise ValueError(f"draft_ids must be a 1-D tensor of ids, got {draft_ids!r:.60}")
    if draft_ids.dtype.is_floating_point or draft_ids.dtype.is_complex or draft_ids.dtype == torch.bool:
        raise ValueError(f"draft_ids must hold integer token ids, got dtype {draft_ids.dtype}")
    if draft_ids.numel() and not (0 <= int(draft_ids.min()) and int(draft_ids.max()) < constraint.vocab_size):
        bad = next(t for t in draft_ids.tolist() if not 0 <= t < constraint.vocab_size)
        raise ValueError(f"draft_ids holds token id {bad}, outside the constraint's vocabulary "
                         f"[0, {constraint.vocab_size})")
    state = _check_state(state, constraint)
    k = draft_ids.numel()
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.shape != (k + 1, constraint.vocab_size):
        shape = tuple(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        raise ValueError(f"logits must be (k'+1, V) = ({k + 1}, {constraint.vocab_size}) for {k} drafts, got {shape}")
    if not logits.dtype.is_floating_point:
        raise ValueError(f"logits must be floating point (the masked entries become -inf), got dtype {logits.dtype}")
    # BEGIN SOLUTION
    states = [state]
    for t in draft_ids.tolist():
        states.append(constraint.step(states[-1], t))
    legal = torch.stack([constraint.mask(s) for s in states]).to(logits.device)       # (k'+1, V) bool
    return logits.masked_fill(~legal, float("-inf"))
    # END SOLUTION


class ConstrainedTarget(Target):
    """The target's side of a round under a constraint: every verify row masked. Provided.

    Wraps any target of the engine (a model, or a ``Target``: ``RecomputeTarget``,
    ``CachedTarget``) and passes its passes through ``mask_verify_rows`` with the state of the
    committed context. The state is re-walked from the committed tokens only (``commit`` and
    ``score`` catch up on what the loop appended), so a rejected draft never moves it.

    Args:
        target: a language model (then ``RecomputeTarget(target)``) or a ``Target``.
        constraint: a ``TokenConstraint`` over the target's vocabulary.

    Raises:
        TypeError: target neither a language model nor a ``Target``; constraint of the wrong type.
        ValueError: the constraint's vocabulary size differs from the target's.
    """

    def __init__(self, target, constraint: TokenConstraint) -> None:
        if not isinstance(target, Target):
            check_language_model(target, "ConstrainedTarget's target")
            target = RecomputeTarget(target)
        self.inner = target
        self.model = target.model
        self.constraint = _check_constraint(constraint, target.vocab_size)
        self.want_hidden = getattr(target, "want_hidden", False)
        self.state, self._seen = constraint.start, 0

    def _catch_up(self, context_ids: torch.Tensor) -> int:
        if len(context_ids) > self._seen:
            self.state = self.constraint.walk(self.state, context_ids[self._seen:])
            self._seen = len(context_ids)
        return self.state

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.inner.start(prompt_ids)
        self.state, self._seen = self.constraint.start, len(prompt_ids)     # the constraint covers new tokens

    def visible(self, context_ids: torch.Tensor) -> int:
        return self.inner.visible(context_ids)

    def score(self, context_ids: torch.Tensor, draft: Draft):
        state = self._catch_up(context_ids)
        logits, hidden = self.inner.score(context_ids, draft)
        return mask_verify_rows(logits, self.constraint, state, draft.tokens), hidden

    def commit(self, context_ids: torch.Tensor, num_accepted: int) -> None:
        self.inner.commit(context_ids, num_accepted)
        self._catch_up(context_ids)


class ConstrainedDrafter(Drafter):
    """A drafter that knows the constraint: forced runs for free, illegal drafts cut. Provided.

    Each ``propose``: if the committed state has a forced token (exactly one legal
    continuation), the draft is the forced run (up to k tokens, each forced in the state the
    previous one leads to), deterministic (q None), and the wrapped drafter is not called: a
    draft at no drafting cost. Otherwise the wrapped drafter proposes; the draft is cut before
    its first illegal token, and a sampled draft's q rows are masked with the state before each
    draft and renormalised (the law of a draft that was kept). Neither changes the output's law:
    the target's rows are masked either way; both raise acceptance.

    Args:
        drafter: any chain drafter of the engine (``LMDrafter``, ``NGramDrafter``, ...), or None
            for forced runs only.
        constraint: the same ``TokenConstraint`` as the target's.
        forced: False turns forced-run drafting off (the ablation of the lesson).

    Attributes:
        forced_tokens: forced tokens proposed so far; ``drafter_calls``: calls to the wrapped drafter.

    Raises:
        TypeError: drafter without ``propose``/``commit``, or one that reads the target's states
            (its ``reads`` is not ``("tokens",)``); forced not a bool; constraint of the wrong type.
        ValueError: the drafter's vocabulary differs from the constraint's.
    """

    def __init__(self, drafter, constraint: TokenConstraint, *, forced: bool = True) -> None:
        if drafter is not None and (isinstance(drafter, type) or not callable(getattr(drafter, "propose", None))
                                    or not callable(getattr(drafter, "commit", None))):
            raise TypeError(f"drafter must be a drafter instance (propose/commit), got {drafter!r:.60}")
        if drafter is not None and check_reads(drafter) != ("tokens",):
            raise TypeError("ConstrainedDrafter wraps drafters that read tokens only, not the target's states")
        if not isinstance(forced, bool):
            raise TypeError(f"forced must be True or False, got {type(forced).__name__}")
        self.constraint = _check_constraint(constraint, getattr(drafter, "vocab_size", None))
        self.inner, self.forced = drafter, forced
        self.vocab_size = constraint.vocab_size
        self.forced_tokens = self.drafter_calls = 0
        self.state, self._seen = constraint.start, 0

    def __repr__(self) -> str:
        return f"ConstrainedDrafter({self.inner!r}, forced={self.forced})"

    def _catch_up(self, context_ids: torch.Tensor) -> int:
        if len(context_ids) > self._seen:
            self.state = self.constraint.walk(self.state, context_ids[self._seen:])
            self._seen = len(context_ids)
        return self.state

    def start(self, prompt_ids: torch.Tensor, *, sampler: Sampler, generator: torch.Generator | None) -> None:
        super().start(prompt_ids, sampler=sampler, generator=generator)
        if self.inner is not None:
            self.inner.start(prompt_ids, sampler=sampler, generator=generator)
        self.state, self._seen = self.constraint.start, len(prompt_ids)

    def propose(self, context_ids: torch.Tensor, k: int) -> Draft:
        state = self._catch_up(context_ids)
        if self.forced:
            run = []
            s = state
            while len(run) < k:
                f = self.constraint.forced(s)
                if f is None:
                    break
                run.append(f)
                s = self.constraint.step(s, f)
                if s == DONE:
                    break
            if run:
                self.forced_tokens += len(run)
                return Draft(torch.tensor(run, dtype=torch.long))
        if self.inner is None or state in (DONE, DEAD):
            return Draft.empty()
        self.drafter_calls += 1
        proposal = self.inner.propose(context_ids, k)
        draft, q = proposal.tokens, proposal.proposal_probs
        keep, s, rows = 0, state, []
        for t in draft.tolist():
            legal = self.constraint.mask(s)
            if not bool(legal[t]):
                break
            if q is not None:
                row = q[keep].masked_fill(~legal, 0.0)
                rows.append(row / row.sum())
            keep += 1
            s = self.constraint.step(s, t)
        if q is None or keep == 0:
            return Draft(draft[:keep].clone())
        return Draft(draft[:keep].clone(), torch.stack(rows))

    def commit(self, context_ids: torch.Tensor, num_accepted: int, *, target_hidden=None) -> None:
        if self.inner is not None:
            self.inner.commit(context_ids, num_accepted)
        self._catch_up(context_ids)


@torch.no_grad()
def constrained_generate(model, prompt_ids, max_new_tokens: int, constraint: TokenConstraint, *,
                         temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                         generator: torch.Generator | None = None) -> torch.Tensor:
    """Plain constrained decoding, the reference: one model pass per token. Provided.

    Each step: the last position's logits (the context cropped to ``max_seq_len``), masked
    with the legal tokens of the state, warped by ``Sampler(temperature, top_k, top_p)`` and
    sampled (argmax at temperature 0); the state advances with the token. Stops after EOS
    (``constraint.eos_id``, kept) or the budget.

    Args:
        model: ids (1, T) -> logits (1, T, V) (a course language model).
        prompt_ids: 1-D ids, length >= 1 (the constraint covers the new tokens only).
        max_new_tokens: >= 0.
        constraint: a ``TokenConstraint`` over the model's vocabulary.
        temperature, top_k, top_p: module 11's warpers (``Sampler``).
        generator: CPU ``torch.Generator`` for the draws.

    Returns:
        LongTensor (N,) on the CPU: the prompt then the new tokens.

    Raises:
        TypeError / ValueError: as ``Sampler``, ``check_language_model``, a bad prompt or budget,
            a constraint of the wrong type or over another vocabulary; a model that returns NaN
            (``next_token_logits`` names the position).
    """
    check_language_model(model, "model")
    constraint = _check_constraint(constraint, model.vocab_size)
    ids = as_token_ids(prompt_ids, "prompt_ids", vocab_size=model.vocab_size).tolist()
    max_new_tokens = check_count(max_new_tokens, "max_new_tokens")
    check_generator(generator)
    sampler = Sampler(temperature, top_k, top_p)
    state = constraint.start
    with eval_mode(model):
        for _ in range(max_new_tokens):
            row = next_token_logits(model, torch.tensor(ids, dtype=torch.long))    # cropped; NaN named
            row = row.masked_fill(~constraint.mask(state).to(row.device), float("-inf"))
            if sampler.greedy:
                token = int(row.argmax())
            else:
                token = int(torch.multinomial(sampler.probs(row).cpu(), 1, generator=generator))
            ids.append(token)
            state = constraint.step(state, token)
            if token == constraint.eos_id:
                break
    return torch.tensor(ids, dtype=torch.long)


def constrained_speculative_sample(target, drafter, prompt_ids, max_new_tokens: int, constraint: TokenConstraint,
                                   *, forced: bool = True, **kwargs):
    """``speculative_sample`` under a constraint: the target wrapped in ``ConstrainedTarget``,
    the drafter in ``ConstrainedDrafter`` (``drafter`` None drafts forced runs only), EOS the
    constraint's. Provided. ``target`` is a model or a ``Target`` (e.g. ``CachedTarget(model)``
    for the cached engine); ``kwargs`` go to ``speculative_sample`` (k, temperature,
    generator, controller, on_pass, ...). Returns its (ids, stats); ``stats.drafter`` is the
    ``ConstrainedDrafter`` (forced-token and drafter-call counters).

    Raises:
        TypeError: constraint not a ``TokenConstraint``; ``eos_id`` in kwargs not an int.
        ValueError: ``eos_id`` in kwargs outside the vocabulary or different from the
            constraint's; a constraint over another vocabulary than the target's or the drafter's;
            as ``speculative_sample``.
    """
    constraint = _check_constraint(constraint)
    if "eos_id" in kwargs and check_eos_id(kwargs["eos_id"], constraint.vocab_size) != constraint.eos_id:
        raise ValueError(f"eos_id={kwargs['eos_id']} differs from the constraint's eos_id={constraint.eos_id}: "
                         "leave eos_id out (the constraint's is used)")
    kwargs["eos_id"] = constraint.eos_id
    wrapped = ConstrainedDrafter(drafter, constraint, forced=forced)
    ids, stats = speculative_sample(ConstrainedTarget(target, constraint), wrapped, prompt_ids, max_new_tokens,
                                    **kwargs)
    stats.drafter = wrapped
    return ids, stats
