"""Beyond (specdec-sampling): one speculative loop for every drafter, greedy and sampled.

``speculative_generate`` (module specdec) is greedy and hard-wires an LM drafter. This loop
takes any drafter behind the protocol of ``g2c.specdec.sampling.drafters`` and any of module 11's
sampling settings. Each round:

1. the controller picks k; the drafter proposes a ``Draft`` of k' <= k tokens (and their q
   rows, or None for a deterministic draft);
2. the target scores context + draft in ONE pass; its last k'+1 rows are warped by the
   same ``Sampler`` as the drafter's q (temperature -> top-k -> top-p), giving p;
3. ``verify_round`` accepts a prefix and adds one target token: at temperature 0 with
   ``greedy_verify``; otherwise with ``speculative_verify`` (accept x with probability
   min(1, p(x)/q(x)), resample a rejection from normalize(max(0, p − q)), sample the bonus
   from row k' after a full match);
4. the emitted tokens are cut by the budget and EOS, counted in ``SpecStats``, and
   committed: the drafter rolls back what was rejected, the controller learns.

The target's side is an object with the drafter's verbs (``start``/``visible``/``score``/
``commit``, ``g2c.specdec.sampling.target``): ``RecomputeTarget`` re-scores the cropped context
every round; ``CachedTarget`` (``use_cache=True``) keeps module 16's ``KVCache``, scores the
pending token + the draft in one cached pass (k'+1 rows) and rolls the rejected rows back by
pointer in ``commit``; ``g2c.recurrent.TransactionTarget`` commits a recurrent state. Pass
one of them as ``target`` and this loop is the engine every speculative preset of the house
calls (``speculative_generate_cached``, ``speculative_generate_stateful``). With
``LMDrafter(model, use_cache=True)`` both models cache, and the loop emits the same tokens
as uncached for the same generator seed (tests/test_specdec_sampling_cached.py).

Why the output is distributed exactly as ``g2c.sampling.generate`` with the same warpers:
every emitted token is either an accepted draft or a residual/bonus sample, and
Leviathan, Kalman, Matias (ICML 2023), §2.3 and Appendix A.1 (Chen et al. 2023, Theorem 1)
show that the token that leaves one position of ``speculative_verify`` has distribution p
at that position, given everything emitted before it. By induction over positions the
whole sequence follows the target's warped chain. At temperature 0 every step is an argmax
and the loop is ``speculative_generate`` token for token and counter for counter.

Shape letters: T time, D width, V vocabulary, k draft length.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from g2c.kvcache.fast import unwrap
from g2c.nn import synchronize
from g2c.sampling.generate import as_token_ids
from g2c.sampling.model import (
    check_count,
    check_eos_id,
    check_generator,
    check_head_on_base,
    check_language_model,
    check_same_vocab,
    check_whole,
    check_window,
    eval_mode,
)
from g2c.transformer import TransformerLM

from ..generate import SpecStats, draft_room
from ..verify import greedy_verify, speculative_verify
from .controllers import StaticK
from .controls import ControlledTarget, StopRule, check_logprobs, check_repetition_penalty
from .draft import Draft, check_draft
from .drafters import Sampler, check_reads
from .target import CachedTarget, FullContextTarget, RecomputeTarget, RoundRecord, Target

__all__ = ["CachedTarget", "FullContextTarget", "RecomputeTarget", "Target", "speculative_sample", "verify_round"]


def _check_parts(target, drafter, controller) -> None:
    """The engine's collaborators, checked before anything runs. Provided.

    Raises:
        TypeError: ``target`` is neither a ``Target`` nor a ``g2c.sampling.LanguageModel`` (a
            drafter passed as the target says so); ``drafter`` is a class, not an instance; it
            lacks ``start``/``propose``/``commit`` (a model passed as the drafter is told to wrap
            it: ``LMDrafter(model)``); its ``vocab_size`` is neither None nor an int;
            ``controller`` lacks ``next_k``/``update``.
    """
    if not isinstance(target, Target):
        if callable(getattr(target, "propose", None)):
            raise TypeError(f"target is a drafter ({type(target).__name__}): pass the target model (or a Target) "
                            "first and the drafter second")
        if getattr(target, "base", None) is not None and not hasattr(target, "max_seq_len"):
            raise TypeError(f"target is a draft head ({type(target).__name__}) on a model: pass its base "
                            "(head.base) as the target and the head wrapped as the drafter (EagleDrafter(head), "
                            "MTPDrafter(head))")
        check_language_model(target, "target")
    if isinstance(drafter, type):
        raise TypeError(f"drafter is the class {drafter.__name__}: pass an instance, e.g. {drafter.__name__}(head) "
                        "or LMDrafter(model)")
    missing = [name for name in ("start", "propose", "commit") if not callable(getattr(drafter, name, None))]
    if missing:
        hint = ("; wrap a model as LMDrafter(model) (g2c.specdec.sampling.drafters)"
                if hasattr(drafter, "vocab_size") and callable(drafter) else "")
        raise TypeError(f"drafter ({type(drafter).__name__}) does not satisfy the drafter protocol "
                        f"(g2c.specdec.sampling.drafters.Drafter): missing {', '.join(missing)}{hint}")
    vocab = getattr(drafter, "vocab_size", None)
    if vocab is not None and (isinstance(vocab, bool) or not isinstance(vocab, int)):
        raise TypeError(f"drafter vocab_size must be an int (or None for a drafter with no model), got "
                        f"{type(vocab).__name__} {vocab!r}")
    if controller is not None:
        missing = [name for name in ("next_k", "update") if not callable(getattr(controller, name, None))]
        if missing:
            raise TypeError(f"controller ({type(controller).__name__}) must have next_k() and update(...) "
                            f"(g2c.specdec.sampling.controllers: StaticK, HeuristicK, CostModelK); missing "
                            f"{', '.join(missing)}")


def _with_a_copy(on_pass):
    """``on_pass`` called with a copy of the round's tokens. Provided: a callback that drains or
    extends the list it is given (a streaming queue) cannot change what the loop commits."""
    def call(emitted, num_accepted):
        return on_pass(list(emitted), num_accepted)
    return call


def _check_target_rows(target_logits: torch.Tensor) -> None:
    """At T > 0 every target row must leave a distribution to sample from. Provided.

    Raises:
        ValueError: a row holds NaN ("the target's logits hold NaN": a broken model, a float16
            overflow), or a row is -inf everywhere ("every token excluded": e.g. a repetition
            penalty so large that every logit becomes -inf).
    """
    if bool(torch.isnan(target_logits).any()):
        raise ValueError("the target's logits hold NaN (a broken model, or a float16 overflow): there is no "
                         "distribution to verify the draft against; check the model")
    if bool(torch.isneginf(target_logits).all(dim=-1).any()):
        raise ValueError("a row of the target's logits is -inf for every token (every token excluded, e.g. by a "
                         "repetition penalty so large that every logit became -inf): nothing can be sampled")


def verify_round(draft_ids: torch.Tensor, draft_probs: torch.Tensor | None, target_logits: torch.Tensor, *,
                 sampler: Sampler, generator: torch.Generator | None = None) -> tuple[int, int]:
    """Verify one round: the accepted prefix length and the target's own token after it.

    Args:
        draft_ids: (k',) int64 on the CPU, 0 <= k'. k' = 0 is a round with no draft.
        draft_probs: (k', V) float32, the warped q rows the drafts were sampled from, or
            None for a deterministic draft (q_i one-hot at draft_ids[i]). Ignored when
            ``sampler.greedy``.
        target_logits: (k'+1, V) float32 raw (unwarped) target logits, row i for draft
            position i, row k' for the position after the draft.
        sampler: the warpers, the same object the drafter warped q with.
        generator: CPU ``torch.Generator`` for the uniforms and resampling.

    Returns:
        (num_accepted, token): 0 <= num_accepted <= k'; token is the correction token (at
        the first rejection) or the bonus token (after a full match, from row k').

    Raises:
        TypeError: sampler not a ``Sampler``; draft_ids not a tensor (provided).
        ValueError: as ``greedy_verify`` / ``speculative_verify`` for mismatched shapes; at T > 0
            a target row holding NaN or -inf for every token (``_check_target_rows``, provided).

    Steps:
        1. k' = 0: no draft to verify; the token is the target's own choice from row 0
           (argmax when greedy, else a sample from the warped p)
           (``test_verify_round_empty_draft_samples_from_p``).
        2. Greedy: ``greedy_verify`` on the raw logits
           (``test_speculative_sample_greedy_matches_speculative_generate``).
        3. Sampled: warp ALL k'+1 rows with ``sampler.probs`` (p, same warpers as q);
           q = draft_probs, or one-hot rows at the drafts when None; then
           ``speculative_verify`` does accept / residual resample / bonus
           (``test_loop_distribution_matches_generate``, ``test_deterministic_drafter_is_lossless``).

    The engine hands it to ``Draft.accept`` (``g2c.specdec.sampling.draft``): a chain's walk is this
    function; a tree (``g2c.specdec.trees.DraftTree``) walks with the tree verifiers instead.
    """
    if not isinstance(sampler, Sampler):                   # the warpers object, not a temperature
        raise TypeError(f"sampler must be a g2c.specdec.sampling.Sampler (e.g. Sampler(temperature)), got "
                        f"{type(sampler).__name__} {sampler!r:.40}")
    if not isinstance(draft_ids, torch.Tensor):
        raise TypeError(f"draft_ids must be a 1-D int64 tensor (a tree walks itself: DraftTree.accept), got "
                        f"{type(draft_ids).__name__}")
    if not sampler.greedy:                                 # a row with nothing to sample: named, not torch's error
        _check_target_rows(target_logits)
    # BEGIN SOLUTION
    k = draft_ids.numel()
    if k == 0:
        token, _ = sampler.choose(target_logits[0], generator)
        return 0, token
    if sampler.greedy:
        return greedy_verify(draft_ids, target_logits)
    p = sampler.probs(target_logits).cpu()                                    # (k'+1, V)
    if draft_probs is None:
        q = torch.zeros(k, p.shape[1])                                        # (k', V) one-hot
        q[torch.arange(k), draft_ids] = 1.0
    else:
        q = draft_probs
    return speculative_verify(draft_ids, p, q, generator=generator)
    # END SOLUTION


def _setup(target, drafter, prompt_ids, max_new_tokens, *, k, temperature, top_k, top_p, generator, eos_id,
           controller, on_pass, use_cache, on_round, repetition_penalty, stop_ids, stop_strings, decode, logprobs):
    """Every check of ``speculative_sample``'s arguments, once, and the objects its round uses. Provided.

    Returns:
        (ids (T,) int64 CPU, the ``Target`` the round scores with (built from a model: a
        ``RecomputeTarget``, or a ``CachedTarget`` with ``use_cache``; wrapped in a ``ControlledTarget``
        for a repetition penalty or logprobs), the ``Sampler``, the ``StopRule``, the controller
        (``StaticK(k)`` by default), ``on_pass`` (called with a copy of the tokens) or None, the
        ``logprobs`` flag).
    Raises:
        as ``speculative_sample`` (the messages listed there).
    """
    _check_parts(target, drafter, controller)
    ids = as_token_ids(prompt_ids, "prompt_ids", vocab_size=target.vocab_size)
    target_state = target if isinstance(target, Target) else None
    if target_state is not None and (use_cache or on_round is not None):
        raise ValueError("a Target keeps its own state and callbacks: build it with them (CachedTarget(model, "
                         "on_round=...)) and leave use_cache and on_round at their defaults")
    k = check_whole(k, f"k must be >= 1 draft tokens per target pass (an int), got {k!r}")   # NumPy ints pass
    max_new_tokens = check_count(max_new_tokens, "max_new_tokens")
    if not isinstance(use_cache, bool):
        raise TypeError(f"use_cache must be True or False, got {type(use_cache).__name__} {use_cache!r}")
    check_generator(generator)
    for hook, hook_name in ((on_pass, "on_pass"), (on_round, "on_round")):
        if hook is not None and not callable(hook):
            raise TypeError(f"{hook_name} must be a callable or None, got {type(hook).__name__}")
    sampler = Sampler(temperature, top_k, top_p)
    eos_id = check_eos_id(eos_id, getattr(target, "vocab_size", None))                # None, or an id the loop can emit
    repetition_penalty = check_repetition_penalty(repetition_penalty)
    logprobs = check_logprobs(logprobs)
    stop = StopRule(eos_id=eos_id, stop_ids=stop_ids, stop_strings=stop_strings, decode=decode,
                    prompt_len=ids.numel(), vocab_size=getattr(target, "vocab_size", None))
    check_same_vocab(getattr(drafter, "vocab_size", None), target.vocab_size)
    check_window(target.max_seq_len)               # the one window precondition: context token + a draft
    head_base = getattr(getattr(drafter, "head", None), "base", None)
    base = target.model if target_state is not None else target
    if head_base is not None and hasattr(base, "token_embed") and \
            tuple(head_base.token_embed.weight.shape) != tuple(base.token_embed.weight.shape):
        raise ValueError(f"{type(drafter).__name__}'s head drafts from the states of a base with (V, D) = "
                         f"{tuple(head_base.token_embed.weight.shape)}, but the target has "
                         f"{tuple(base.token_embed.weight.shape)}; pass the head's own base (head.base) as "
                         "the target")
    if head_base is not None and isinstance(unwrap(base), TransformerLM):   # the same model, in the same dtype
        check_head_on_base(drafter.head, base, name=f"{type(drafter).__name__}'s head")
    controller = StaticK(k) if controller is None else controller
    want_hidden = check_reads(drafter) == ("final_state",)        # the engine hands it the target's states
    if on_round is not None and not use_cache:
        raise ValueError("on_round reports KV-cache rows: pass use_cache=True with it")
    if want_hidden and target_state is not None and getattr(target_state, "want_hidden", None) is False:
        raise ValueError(f"{type(drafter).__name__} drafts from the target's states, but this "
                         f"{type(target_state).__name__} was built without them (it would never draft): build it "
                         f"with want_hidden=True, e.g. {type(target_state).__name__}(model, want_hidden=True)")
    if on_pass is not None:              # the callback gets its own copy: it cannot change what is committed
        on_pass = _with_a_copy(on_pass)
    if target_state is None:
        target_state = (CachedTarget(target, drafter=drafter, on_round=on_round, want_hidden=want_hidden)
                        if use_cache
                        else RecomputeTarget(target, want_hidden=want_hidden))
    if repetition_penalty != 1.0 or logprobs:        # the row controls, only when asked for
        target_state = ControlledTarget(target_state, repetition_penalty=repetition_penalty, logprobs=logprobs)
    return ids, target_state, sampler, stop, controller, on_pass, logprobs


@torch.no_grad()
def speculative_sample(target, drafter, prompt_ids, max_new_tokens: int, *, k: int = 4, temperature: float = 1.0,
                       top_k: int | None = None, top_p: float | None = None,
                       generator: torch.Generator | None = None, eos_id: int | None = None,
                       controller=None, on_pass: Callable[[list[int], int], None] | None = None,
                       use_cache: bool = False,
                       on_round: Callable[[RoundRecord], None] | None = None, repetition_penalty: float = 1.0,
                       stop_ids=None, stop_strings=None, decode: Callable[[list[int]], str] | None = None,
                       logprobs: bool = False) -> tuple[torch.Tensor, SpecStats]:
    """Speculative decoding with any drafter: the target's sampling distribution, fewer target passes.

    Args:
        target: ids (1, T) -> logits (1, T, V), with ``max_seq_len``, ``device``,
            ``vocab_size``, ``training``/``train``/``eval``; a ``TransformerLM`` when the
            drafter reads ``("final_state",)`` (its ``hidden_states`` are shared). Or a
            ``Target`` (``g2c.specdec.sampling.target``: ``RecomputeTarget``,
            ``CachedTarget``, ``g2c.recurrent.TransactionTarget``), used as it is: then
            ``use_cache`` and ``on_round`` belong to the ``Target`` and must stay at their
            defaults.
        drafter: any object following the drafter protocol (``g2c.specdec.sampling.drafters``):
            ``LMDrafter``, ``MTPDrafter``, ``NGramDrafter``, or your own. ``propose`` returns a
            ``Draft`` (``g2c.specdec.sampling.draft``: a chain; a tree drafter's is its subclass
            ``g2c.specdec.trees.DraftTree``, scored by a tree target: the Medusa, EAGLE-2, EAGLE-3
            and block drafters of ``lineage_generate``); your round runs unchanged:
            ``draft.numel()`` nodes, ``draft.accept(logits, verify_round, ...)`` its walk, ``draft.accepted(m)`` the
            accepted tokens.
        prompt_ids: 1-D int tensor or list, length >= 1.
        max_new_tokens: budget, >= 0; never exceeded.
        k: draft length per round when ``controller`` is None (``StaticK(k)``), >= 1.
        temperature, top_k, top_p: module 11's warpers, applied identically to the target's
            p and the drafter's q. temperature = 0 is greedy.
        generator: CPU ``torch.Generator`` for every random draw (drafting, the uniforms,
            resampling): the same seed gives the same output.
        eos_id: stop right after emitting this id (included in the output).
            None, or an id in [0, V) (``check_eos_id``: ValueError outside it, TypeError for a non-int).
        controller: chooses k per round (``g2c.specdec.sampling.controllers``: ``StaticK``,
            ``HeuristicK``, ``CostModelK``); None means ``StaticK(k)``. It never changes
            the distribution of the output, only the number of passes.
        on_pass: ``on_pass(emitted, num_accepted)`` after each target pass, as in
            ``speculative_generate``; ``emitted`` is a copy of the round's new tokens (a callback
            that empties or extends it changes nothing).
        use_cache: False (default) scores the whole cropped context every round
            (``RecomputeTarget``). True keeps the target's keys/values in a module 16
            ``KVCache`` (``CachedTarget``): each round is ONE cached pass over the pending
            token + the k' drafts, and the rejected rows are rolled back by pointer after
            verification. Needs a ``TransformerLM`` target; a drafter reading
            ``("final_state",)`` (``EagleDrafter``, ``MTPDrafter``) gets the states of the rows each
            pass committed. Pair
            it with ``LMDrafter(model, use_cache=True)`` so the
            drafter caches too. Same tokens and counters as uncached while prompt + output
            <= max_seq_len + 1 (same generator draws: the logits agree to float rounding);
            past the window the cache re-prefills its last max_seq_len // 2 tokens (module
            16's ``cached_generate`` policy) where the uncached target slides, so the output
            there differs from the uncached loop's.
        on_round: with ``use_cache`` only: ``on_round(record)`` after each round's rollback,
            a ``g2c.kvcache.RoundRecord`` (KV rows reserved / rolled back, the live caches:
            read them during the call, do not keep them).
        repetition_penalty: module 11's CTRL penalty (1.0 = off, else > 0) on the target's rows:
            row i of the block is penalised with every committed token (the prompt and tokens past
            the window included) and the drafts before row i (``controls.ControlledTarget``), as
            ``g2c.sampling.generate(..., repetition_penalty=...)`` penalises each step. Lossless
            for every drafter; a drafter that ignores it only loses acceptances.
        stop_ids: more ids that end the run like ``eos_id`` (kept in the output), each in [0, V).
        stop_strings: strings that end the run: it stops right after the first token that makes
            ``decode(new tokens)`` contain one (that token kept), exactly where plain decoding
            checking after every token would stop (``controls.StopRule``). Needs ``decode``.
        decode: the tokenizer's ``decode`` (list of ids -> str), for ``stop_strings``.
        logprobs: True also returns ``stats.logprobs``: per new token, its log-probability under
            the target's raw distribution (log_softmax of the logits; no temperature, filter or
            penalty), a list of floats as long as the new tokens (None when False). They are the
            logits the target scored: uncached, its sliding window; with ``use_cache`` past the
            window, the re-prefilled cache's (module 16's policy), so there they differ from a
            full forward pass over the last max_seq_len tokens.

    Returns:
        (ids, stats): LongTensor (N,) on the CPU, the prompt then the new tokens; a
        ``SpecStats`` with one ``record`` per target pass (and ``logprobs`` when asked). Uncached, ids is distributed as
        ``g2c.sampling.generate(target, prompt_ids, max_new_tokens, temperature=..., top_k=...,
        top_p=..., eos_id=eos_id)`` at any length (at temperature 0: equal token for token);
        with ``LMDrafter(drafter_model)`` at temperature 0 it equals
        ``speculative_generate(target, drafter_model, ...)`` exactly, stats included. With
        ``use_cache`` the window follows module 16's ``cached_generate`` instead (greedy:
        equal to it token for token, and to ``g2c.specdec.sampling.speculative_generate_cached``),
        which is the uncached output while prompt + output <= max_seq_len + 1.

    The window edge: each round drafts at most what fits,
    k' = ``g2c.specdec.draft_room(min(k, budget), target_state.visible(ids), max_seq_len)``;
    at k' = 0 the drafter is not asked and the round is a plain step (the rule every loop
    shares; ``docs/beyond/specdec.md``, "Contracts the loops share").

    Raises:
        ValueError: prompt_ids empty, not 1-D or holding ids outside [0, V) ("prompt_ids"); k or a controller's k
            not an int >= 1 ("k must be"); max_new_tokens < 0 ("max_new_tokens");
            bad warper values (as ``Sampler``); the drafter's vocab_size differs from the
            target's ("vocab_size"); target ``max_seq_len`` < 2 ("max_seq_len"); a
            drafter returns a malformed proposal (names the drafter and the contract);
            a drafter's ``reads`` none of the protocol's forms (``check_reads``: "reads");
            ``on_round`` without ``use_cache`` ("use_cache"); ``use_cache`` or ``on_round`` with a ``Target``
            ("Target"); a drafter that reads the target's states with a ``Target`` built without
            them ("want_hidden=True"); repetition_penalty <= 0 or not finite ("repetition_penalty"); a stop id
            outside [0, V) ("stop_ids"); an empty stop string, or stop strings without decode
            ("stop_strings"); a drafter's head (``drafter.head``: MTP, EAGLE) built on another
            model than the target ("built on another model", "(V, D)") or left in another dtype
            (``check_head_on_base``); a generator on another device than the CPU ("generator is on").
        TypeError: a drafter class passed instead of an instance ("an instance"); a target,
            drafter or controller that does not meet its protocol (``_check_parts``: e.g. a model
            passed as the drafter); ``use_cache`` with a target that is not a
            ``TransformerLM``; a repetition
            penalty, stop id, stop string, decode or ``logprobs`` of the wrong type (``logprobs``
            must be a bool, and so must ``use_cache``); a ``decode`` that returns anything but a str.

    Steps:
        1. Provided: ``_setup`` (every check, once; the ids, the round's ``Target``, the
           ``Sampler``, the ``StopRule``, the controller), models in eval mode (``eval_mode``),
           ``target_state.start``. Yours: ``drafter.start(ids, sampler=...,
           generator=...)`` and a ``SpecStats``.
        2. Each round: k_round = ``draft_room(min(controller.next_k(), remaining budget),
           target_state.visible(ids), target.max_seq_len)`` (provided; the cached target
           re-prefills here when past the window); time ``drafter.propose(ids, k_round)`` and
           check it with ``check_draft(proposal, drafter, k=..., vocab_size=...)`` (provided:
           returns the ``Draft``). At k_round = 0 skip ``propose``: the draft is
           ``Draft.empty()``, and the round is a plain step
           (``test_speculative_sample_equals_generate_at_the_window_edge``).
        3. Time ``target_state.score(ids, draft)`` (provided: one pass over the context cropped
           to max_seq_len - k' tokens + the draft, or one cached pass): k'+1 logits rows, and
           the scored block's states (T, D) or None.
        4. ``num_accepted, token = draft.accept(logits, verify_round, sampler=...,
           generator=...)`` (a chain walks with your ``verify_round``, a tree with its own
           verifiers); emitted = ``draft.accepted(num_accepted)`` + the
           target's token, cut to the
           budget, then ``stop.cut(ids, emitted)`` (provided: after the first ``eos_id``, stop id
           or stop string; ``test_speculative_sample_respects_budget_and_eos``).
        5. ``stats.record(drafted=k', accepted=<drafts emitted>, generated=len(emitted))``,
           ``on_pass``; ``controller.update(drafted=k', accepted=num_accepted, ...)``;
           append; ``drafter.commit(ids, <drafts emitted>, target_hidden=...)`` with the
           states of every committed block position but the newest
           (``test_mtp_drafter_uses_target_states``); then ``target_state.commit(ids,
           <drafts emitted>)`` (the cached target rolls back here); stop after a stop.
        6. Leave the loop with ``ids`` and ``stats``: the provided last line returns them.
    """
    ids, target_state, sampler, stop, controller, on_pass, logprobs = _setup(   # provided: every check, once
        target, drafter, prompt_ids, max_new_tokens, k=k, temperature=temperature, top_k=top_k, top_p=top_p,
        generator=generator, eos_id=eos_id, controller=controller, on_pass=on_pass, use_cache=use_cache,
        on_round=on_round, repetition_penalty=repetition_penalty, stop_ids=stop_ids, stop_strings=stop_strings,
        decode=decode, logprobs=logprobs)
    with eval_mode(target_state.model, getattr(drafter, "model", None), getattr(drafter, "head", None)):
        target_state.start(ids)           # the cached target prefills every prompt token but the last
        # BEGIN SOLUTION
        drafter.start(ids, sampler=sampler, generator=generator)
        stats = SpecStats()
        window = target.max_seq_len
        device = target.device                   # read once: a Module's device walks its parameters
        num_new = 0
        while num_new < max_new_tokens:
            remaining = max_new_tokens - num_new
            k_next = controller.next_k()
            k_next = check_whole(k_next, f"k must be an int >= 0 (0: a plain step); controller {controller!r} returned "
                                          f"{k_next!r}", low=0)
            k_round = draft_room(min(k_next, remaining), target_state.visible(ids), window)
            synchronize(device)
            t0 = time.perf_counter()
            if k_round == 0:                     # the context fills the window: a plain step
                draft = Draft.empty()
            else:
                draft = check_draft(drafter.propose(ids, k_round), drafter, k=k_round, vocab_size=target.vocab_size)
            k_draft = draft.numel()
            synchronize(device)
            t1 = time.perf_counter()
            logits, hidden = target_state.score(ids, draft)                       # (k'+1, V), (T, D) | None
            synchronize(device)
            t2 = time.perf_counter()
            num_accepted, token = draft.accept(logits, verify_round, sampler=sampler, generator=generator)
            emitted = draft.accepted(num_accepted) + [token]
            emitted, stopped = stop.cut(ids, emitted[:remaining])              # EOS, stop ids, stop strings
            num_emitted_drafts = min(num_accepted, len(emitted))
            stats.record(drafted=k_draft, accepted=num_emitted_drafts, generated=len(emitted))
            if on_pass is not None:
                on_pass(emitted, num_emitted_drafts)
            controller.update(drafted=k_draft, accepted=num_accepted, draft_seconds=t1 - t0,
                              target_seconds=t2 - t1)
            ids = torch.cat([ids, torch.tensor(emitted, dtype=torch.long)])
            num_new += len(emitted)
            committed_states = None
            if hidden is not None:
                # block positions whose history is committed, all but the newest token
                committed_states = hidden[:hidden.shape[0] - k_draft + len(emitted) - 1]  # (L, D)
            drafter.commit(ids, num_emitted_drafts, target_hidden=committed_states)
            target_state.commit(ids, num_emitted_drafts)
            if stopped:
                break
        # END SOLUTION
        stats.logprobs = target_state.logprobs if logprobs else None     # one float per new token, when asked
        return ids, stats
