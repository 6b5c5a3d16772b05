"""Beyond (specdec): the draft-then-verify generation loop, and its counters.

Module 11's ``generate`` calls the model once per token. Here a cheap drafter guesses k
tokens, the target scores context + draft in ONE pass (module 06's parallel scoring:
every row of a causal pass is a next-token prediction), and ``greedy_verify`` keeps the
agreeing prefix plus the target's own next token. Each target pass therefore emits between
1 and k+1 tokens, and the output is exactly the target's greedy chain.

Source: Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative
Decoding" (ICML 2023), sections 2-3; Chen et al., "Accelerating Large Language Model
Decoding with Speculative Sampling" (2023), section 2.

Vocabulary: draft/target, accepted prefix, correction token (target's token at the first
rejection), bonus token (target's token after a full match); emitted = accepted + 1 per
target pass, before the budget and end-of-sequence cuts.

Models follow ``g2c.sampling.LanguageModel`` (``vocab_size``, ``max_seq_len``, ``device``,
ids (1, T) -> logits (1, T, V); ``training``/``train`` optional). Devices: the context and
the output live on the CPU; each model gets its ids on its own ``device``; the draft and
the target's verification rows meet on the target's device.

Shape letters: T time, V vocabulary, k draft length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from g2c.sampling.generate import as_token_ids
from g2c.sampling.model import check_count, check_eos_id, check_language_model, check_whole, eval_mode

from .verify import greedy_verify

__all__ = ["SpecStats", "draft_greedy", "draft_room", "speculative_generate"]


@dataclass
class SpecStats:
    """Counters of one speculative run. Provided.

    Attributes:
        target_passes: forward passes of the target (one per ``record`` call).
        drafted: draft tokens proposed (and scored by the target).
        accepted: draft tokens the target agreed with AND that were emitted (a budget or
            end-of-sequence cut can drop accepted drafts; they are not counted).
        generated: tokens emitted (accepted drafts + correction/bonus tokens).

    Properties ``acceptance_rate`` = accepted / drafted and ``tokens_per_pass`` =
    generated / target_passes are 0.0 while their denominator is 0.
    """

    target_passes: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0

    def record(self, *, drafted: int, accepted: int, generated: int) -> None:
        """Add one target pass that scored ``drafted`` drafts, emitted ``accepted`` of them
        and ``generated`` tokens in all.

        Raises:
            ValueError: a count is negative, or accepted exceeds drafted or generated.
        """
        if min(drafted, accepted, generated) < 0:
            raise ValueError(f"SpecStats.record: counts must be >= 0, got drafted={drafted}, "
                             f"accepted={accepted}, generated={generated}")
        if accepted > drafted or accepted > generated:
            raise ValueError(f"SpecStats.record: accepted={accepted} must be <= drafted={drafted} and "
                             f"<= generated={generated} (only emitted drafts count as accepted)")
        self.target_passes += 1
        self.drafted += drafted
        self.accepted += accepted
        self.generated += generated

    def __add__(self, other: "SpecStats") -> "SpecStats":
        """Pool two runs' counters (e.g. over prompts): ``sum(runs, SpecStats())``.

        Raises:
            TypeError: ``other`` is not a ``SpecStats``.
        """
        if not isinstance(other, SpecStats):
            return NotImplemented
        return SpecStats(self.target_passes + other.target_passes, self.drafted + other.drafted,
                         self.accepted + other.accepted, self.generated + other.generated)

    @property
    def acceptance_rate(self) -> float:
        """accepted / drafted, 0.0 before any draft."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def tokens_per_pass(self) -> float:
        """generated / target_passes, 0.0 before any pass."""
        return self.generated / self.target_passes if self.target_passes else 0.0

    def __repr__(self) -> str:
        return (f"SpecStats(target_passes={self.target_passes}, drafted={self.drafted}, "
                f"accepted={self.accepted}, generated={self.generated}, "
                f"acceptance_rate={self.acceptance_rate:.3f}, tokens_per_pass={self.tokens_per_pass:.2f})")


@torch.no_grad()
def draft_greedy(drafter, ctx_ids, k: int) -> torch.Tensor:
    """Let the drafter guess the next k tokens greedily. Provided.

    Args:
        drafter: a ``g2c.sampling.LanguageModel``; it runs in eval mode here and gets its
            mode back afterwards (``eval_mode``, also on an exception).
        ctx_ids: 1-D int tensor or list, the context (length >= 1), ids in [0, V).
        k: number of tokens to draft, >= 1.

    Returns:
        LongTensor (k,) on the CPU: the drafter's argmax chain after ``ctx_ids``. Each step
        scores only the last ``drafter.max_seq_len`` tokens (the drafter's window). The
        caller moves the draft to the target's device before verifying it.

    Raises:
        TypeError: the drafter lacks ``vocab_size``, ``max_seq_len`` or ``device``; k not an int.
        ValueError: empty or non-1-D context ("ctx_ids"), an id outside [0, V), or k < 1.
    """
    check_language_model(drafter, "drafter")
    ids = as_token_ids(ctx_ids, "ctx_ids", vocab_size=drafter.vocab_size)
    k = check_whole(k, f"k must be >= 1 draft tokens, got {k!r}")
    with eval_mode(drafter):
        for _ in range(k):
            window = ids[-drafter.max_seq_len:].unsqueeze(0).to(drafter.device)  # (1, T)
            nxt = drafter(window)[0, -1].argmax().cpu().view(1)                  # (1,)
            ids = torch.cat([ids, nxt])
    return ids[-k:]


def draft_room(k: int, context_len: int, window: int) -> int:
    """The window-edge rule every speculative loop shares: how many drafts fit this pass. Provided.

    A verification pass scores the visible context plus k' drafts as ONE block of at most
    ``window`` (the target's ``max_seq_len``) positions. For the pass to be lossless, every
    row must see exactly the context plain decoding would see for that token; that holds when
    the whole visible context and the drafts fit the window, so

        k' = min(k, window - context_len), and 0 when the context already fills the window.

    k' = 0 makes the pass a *plain step*: no draft, the target's own next token from the
    same visible context its plain counterpart uses (uncached loops: the last ``window``
    tokens, as module 11's ``generate``; cached loops: the cache's context, re-prefilled
    like module 16's ``cached_generate`` first when it is past the window). So speculation
    pauses at the window edge, every loop equals its plain counterpart token for token at any
    length, and an uncached loop stays on plain steps past the window (its plain counterpart
    slides the window one token at a time, which one block cannot reproduce) while a cached
    loop drafts again after each re-prefill. ``docs/beyond/specdec.md`` ("Contracts the
    loops share") states the rule once; each loop's docstring points here.

    Args:
        k: drafts wanted this pass (already cut to the budget), an int >= 0.
        context_len: tokens the target sees before the drafts (the whole context for an
            uncached loop, the cache's visible context for a cached one).
        window: the target's ``max_seq_len``, >= 1.

    Returns:
        int in [0, k].

    Raises:
        TypeError: an argument that is not an int (a float, a bool, a string; ``check_count``).
        ValueError: k or context_len below 0, window below 1.
    """
    k, context_len = check_count(k, "draft_room: k"), check_count(context_len, "draft_room: context_len")
    window = check_count(window, "draft_room: window", minimum=1)
    return max(0, min(k, window - context_len))


@torch.no_grad()
def speculative_generate(target, drafter, prompt_ids, max_new_tokens: int, *, k: int = 4,
                         eos_id: int | None = None,
                         on_pass: Callable[[list[int], int], None] | None = None) -> tuple[torch.Tensor, SpecStats]:
    """Greedy speculative decoding: the target's greedy output, in fewer target passes.

    Args:
        target: the model whose output we want, a ``g2c.sampling.LanguageModel``
            (``vocab_size``, ``max_seq_len``, ``device``, ids (1, T) -> logits (1, T, V);
            ``training``/``train`` optional).
        drafter: a cheaper ``LanguageModel`` with the same ``vocab_size``.
        prompt_ids: 1-D int tensor or list, length >= 1, ids in [0, V).
        max_new_tokens: budget, >= 0; never exceeded.
        k: draft length per target pass, >= 1.
        eos_id: stop right after emitting this id (included in the output).
            None, or an id in [0, V) (``check_eos_id``: ValueError outside it, TypeError for a non-int).
        on_pass: optional callback ``on_pass(emitted, num_accepted)`` called after each
            target pass with the list of emitted ids and how many of them (a prefix) are
            accepted drafts; ``python -m g2c.specdec`` uses it to colour the drafts.

    Returns:
        (ids, stats): LongTensor (N,) on the CPU, the prompt followed by the new tokens;
        and a ``SpecStats`` with one ``record`` per target pass. ids equals
        ``g2c.sampling.generate(target, prompt_ids, max_new_tokens, temperature=0.0, eos_id=eos_id)``
        token for token at any length: a pass drafts only what fits the target's window
        (``draft_room``), and once the context fills the window every pass is a plain step.

    Raises:
        TypeError: target or drafter lacks ``vocab_size``, ``max_seq_len`` or ``device``
            (``check_language_model(model, "target")``: "target (...) does not satisfy
            g2c.sampling.LanguageModel: missing max_seq_len"); k not an int ("k must be >= 1").
        ValueError: prompt_ids empty, not 1-D, not integer ("integer token ids") or with an
            id outside [0, V) (``as_token_ids`` with ``vocab_size``; every message names
            "prompt_ids"); k < 1 ("k must be >= 1"); max_new_tokens < 0
            ("max_new_tokens"); the drafter's vocab_size differs from the target's
            ("vocab_size"); a target window ``max_seq_len`` < 2 cannot score even one draft
            ("max_seq_len").

    Steps:
        1. Validate the inputs (``test_speculative_generate_validates_inputs``):
           ``check_language_model`` for both models, ``as_token_ids(prompt_ids, "prompt_ids",
           vocab_size=target.vocab_size)``, then k, max_new_tokens, the vocabularies and the
           window. Run the loop inside ``with eval_mode(target, drafter):`` (the context manager
           is imported at the top of this file from ``g2c.sampling.model``; the ``with`` block is
           yours to write), which restores both modes even when a model raises
           (``test_speculative_generate_restores_modes_when_a_model_raises``). Start a ``SpecStats``.
        2. Loop while the budget is not used up. k_step = ``draft_room(min(k, remaining
           budget), len(context), target.max_seq_len)`` (provided: the window-edge rule every
           loop shares); draft k_step tokens with ``draft_greedy`` (provided; CPU ids).
        3. One target pass over the context followed by the draft: (1, T + k_step), on
           ``target.device`` (it fits the window by step 2, so no row loses context). Its
           last k_step + 1 rows are the verification rows for ``greedy_verify``; hand it the
           draft on the same device as those rows
           (``test_speculative_generate_hands_the_verifier_one_device``). When k_step is 0
           the context fills the window: take a plain step instead, one pass over the last
           max_seq_len tokens whose argmax is the token, with no draft and no verification
           (``test_speculative_generate_equals_generate_at_the_window_edge``).
        4. Emitted = accepted drafts + correction/bonus token; cut it to the remaining
           budget (``test_speculative_generate_respects_budget``) and after the first
           ``eos_id`` (``test_speculative_generate_stops_at_eos``).
        5. ``stats.record(drafted=k_step, accepted=<drafts actually emitted>,
           generated=len(emitted))``; call ``on_pass`` if given; append; stop after EOS
           (``test_speculative_generate_matches_argmax_chain_with_any_drafter``,
           ``test_speculative_generate_perfect_drafter_accepts_everything``).
    """
    check_count(max_new_tokens, "max_new_tokens", minimum=None)  # provided: 2.5 or None is a TypeError here
    eos_id = check_eos_id(eos_id, getattr(target, "vocab_size", None))                # None, or an id the loop can emit
    # BEGIN SOLUTION
    check_language_model(target, "target")
    check_language_model(drafter, "drafter")
    ids = as_token_ids(prompt_ids, "prompt_ids", vocab_size=target.vocab_size)
    k = check_whole(k, f"k must be >= 1 draft tokens per target pass (an int), got {k!r}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(f"drafter vocab_size {drafter.vocab_size} differs from target vocab_size "
                         f"{target.vocab_size}; both must use the same tokenizer")
    if target.max_seq_len < 2:
        raise ValueError(f"target max_seq_len={target.max_seq_len} leaves no room for a draft; need >= 2")
    stats = SpecStats()
    num_new = 0
    with eval_mode(target, drafter):
        while num_new < max_new_tokens:
            remaining = max_new_tokens - num_new
            k_step = draft_room(min(k, remaining), len(ids), target.max_seq_len)
            if k_step == 0:                                                 # window full: a plain step
                window = ids[-target.max_seq_len:].unsqueeze(0).to(target.device)   # (1, T)
                draft, num_accepted, token = ids[:0], 0, int(target(window)[0, -1].argmax())
            else:
                draft = draft_greedy(drafter, ids, k_step)                  # (k,) CPU
                block = torch.cat([ids, draft]).to(target.device)           # (T + k,), fits the window
                logits = target(block.unsqueeze(0))[0, -(k_step + 1):]      # (k+1, V) on target.device
                num_accepted, token = greedy_verify(block[-k_step:], logits)  # draft and rows on one device
            emitted = draft[:num_accepted].tolist() + [token]
            emitted = emitted[:remaining]
            hit_eos = eos_id is not None and eos_id in emitted
            if hit_eos:
                emitted = emitted[:emitted.index(eos_id) + 1]
            num_emitted_drafts = min(num_accepted, len(emitted))
            stats.record(drafted=k_step, accepted=num_emitted_drafts, generated=len(emitted))
            if on_pass is not None:
                on_pass(emitted, num_emitted_drafts)
            ids = torch.cat([ids, torch.tensor(emitted, dtype=torch.long)])
            num_new += len(emitted)
            if hit_eos:
                break
    return ids, stats
    # END SOLUTION
