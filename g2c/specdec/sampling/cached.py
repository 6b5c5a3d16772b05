"""Beyond (specdec-sampling, provided): speculative decoding that commits state like a serving stack.

The specdec module's ``speculative_generate`` re-scores the whole context on every pass.
Here both models keep a ``KVCache`` and a round is a small state transaction:

1. **Draft.** The drafter feeds its pending tokens (normally the last committed token; two
   after a full match) and then each draft into ITS cache: k cheap one-row passes.
2. **Verify.** The target feeds its pending token plus the k drafts in ONE cached pass: it
   reserves k+1 rows of its cache, and its k+1 logit rows go to ``greedy_verify``.
3. **Commit / roll back.** The emitted tokens (accepted drafts + correction/bonus token)
   join the committed ids. Both caches are cropped to the committed boundary by moving
   their pointer: the target drops k - accepted rows, nothing is copied. The rows of
   rejected drafts stay in memory but can never be read again (every read slices
   ``[:length]`` and the next append overwrites them).

Invariant after every round: each cache holds the keys/values of every committed token
except the last one, which is *pending* (it was produced by the last logit row, so its own
keys/values have not been computed yet); the next pass feeds it first. So the committed
rows equal what plain cached decoding of the same tokens builds, and one more step from the
rolled-back cache gives the logits of a fresh prefill (tests/test_specdec_cached.py).

The target's side of the transaction is ``CachedTarget`` (``target.py``: one trunk pass over the
pending token + the drafts, commit = pointer rollback, re-prefill past the window); the LM drafter's
is ``CachedScorer`` (``drafters.py``: prefill, cached passes, draft row by row, the same rollback and re-prefill).
``speculative_generate_cached`` is a preset of the engine: ``CachedTarget`` +
``LMDrafter(use_cache=True)`` through ``speculative_sample`` (the same round as
``speculative_sample(..., use_cache=True)``, greedy).

Source: Leviathan, Kalman, Matias (ICML 2023) and Chen et al. (2023) for draft-then-verify;
the cache rollback is what serving systems do (vLLM, Kwon et al., SOSP 2023; transformers'
``DynamicCache.crop`` in assisted generation). MTP self-speculation: Gloeckle et al.
(ICML 2024), section 3.2.

Shape letters: T time, V vocabulary, k draft length.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from g2c.specdec.generate import SpecStats

from .drafters import CachedScorer, LMDrafter
from .eagle import MTPDrafter
from .loop import speculative_sample
from .target import CachedTarget, RoundRecord, summarize_rounds

__all__ = ["CachedScorer", "RoundRecord", "mtp_generate_cached", "speculative_generate_cached", "summarize_rounds"]


@torch.no_grad()
def speculative_generate_cached(target, drafter, prompt_ids, max_new_tokens: int, *, k: int = 4,
                                eos_id: int | None = None,
                                on_pass: Callable[[list[int], int], None] | None = None,
                                on_round: Callable[[RoundRecord], None] | None = None,
                                refill_tokens: int | None = None) -> tuple[torch.Tensor, SpecStats]:
    """Greedy speculative decoding with a KV cache on both models and pointer rollback.

    A preset of the engine (no round here): ``speculative_sample(CachedTarget(target),
    LMDrafter(drafter, use_cache=True), ..., temperature=0.0)``.

    Args:
        target, drafter: ``TransformerLM`` s with the same ``vocab_size`` (put in eval mode for
            the call, modes restored).
        prompt_ids: 1-D int tensor or list, length >= 1 (cropped to the target's window).
        max_new_tokens: budget, >= 0; never exceeded.
        k: drafts per target pass, >= 1 (fewer near the end of the budget or the window:
            ``g2c.specdec.draft_room``).
        eos_id: stop right after emitting this id (included).
            None, or an id in [0, V) (``check_eos_id``: ValueError outside it, TypeError for a non-int).
        on_pass: ``on_pass(emitted, num_accepted)`` after each target pass, as in
            ``g2c.specdec.speculative_generate``.
        on_round: ``on_round(record)`` with a ``RoundRecord`` after each target pass, after
            the rollback (the caches in it are live: read, do not keep).
        refill_tokens: tokens re-prefilled into an empty cache when a model's context has
            outgrown its window, in [1, max_seq_len] (default ``max_seq_len // 2``, at least
            1, as ``cached_generate``), for each model.

    Returns:
        (ids, stats): LongTensor (N,) on the CPU, prompt + new tokens; a ``SpecStats`` with one
        ``record`` per target pass. ids equals the target's greedy ``cached_generate(target,
        prompt_ids, max_new_tokens, temperature=0.0, eos_id=eos_id, refill_tokens=refill_tokens)``
        token for token at any length, for every k; while prompt + output <= max_seq_len + 1
        that is also ``g2c.specdec.speculative_generate(target, drafter, prompt_ids,
        max_new_tokens, k=k, eos_id=eos_id)[0]`` and the greedy ``generate``.

    The window edge (``g2c.specdec.draft_room``, the rule every loop shares): a pass drafts
    k' = min(k, budget, max_seq_len - visible context) tokens. At k' = 0 (the context fills
    the window) it is a plain step: the pending token alone, the target's own next token.
    When the committed context has outgrown the window, the target first re-prefills its last
    ``refill_tokens`` tokens, exactly where ``cached_generate`` does, and drafting resumes.

    Raises:
        ValueError: prompt_ids empty or not 1-D ("prompt_ids"); k not an int >= 1 ("k must be
            >= 1"); max_new_tokens < 0 ("max_new_tokens"); vocab sizes differ ("vocab_size");
            target window < 2 ("max_seq_len", ``check_window``); refill_tokens out of range ("refill_tokens").
    """
    lm_drafter = LMDrafter(drafter, use_cache=True, refill_tokens=refill_tokens)    # the engine checks the rest
    return speculative_sample(CachedTarget(target, drafter=lm_drafter, on_round=on_round, refill_tokens=refill_tokens),
                              lm_drafter, prompt_ids, max_new_tokens, k=k, temperature=0.0, eos_id=eos_id,
                              on_pass=on_pass)


@torch.no_grad()
def mtp_generate_cached(base, head, prompt_ids, max_new_tokens: int, *, eos_id: int | None = None,
                        on_pass: Callable[[list[int], int], None] | None = None,
                        on_round: Callable[[RoundRecord], None] | None = None,
                        refill_tokens: int | None = None) -> tuple[torch.Tensor, SpecStats]:
    """MTP self-speculation (k = 1) with caches: one trunk pass per round.

    A preset of the engine (no round here): ``speculative_sample(CachedTarget(base,
    want_hidden=True), MTPDrafter(head), k=1, temperature=0.0)``. A round feeds [pending
    token, the head's guess] (2 rows) through the base's cached trunk. From that ONE pass: row
    0's argmax verifies the guess, the emitted tokens are the accepted guess + the base's
    correction/bonus token, the head (``MTPDrafter``, its own one-layer cache over the
    same positions) reads the committed rows' states and guesses the token after the last
    emitted one; rejected rows are cropped from both caches. The first pass has no guess yet
    (the head has seen no state): it emits the base's next token with no draft. A pass whose
    guess does not fit the window (``g2c.specdec.draft_room``) is a plain step. Past the window
    the base re-prefills its last ``refill_tokens`` tokens where ``cached_generate`` does, and
    the head keeps drafting from its own states (before the engine, this loop dropped the guess
    at a re-prefill and spent that pass undrafted: same tokens, one draft fewer).

    Args:
        base: the frozen ``TransformerLM``; head: an ``MTPHead`` on it (``g2c.specdec.mtp``).
        prompt_ids, max_new_tokens, eos_id, on_pass, on_round, refill_tokens: as
            ``speculative_generate_cached`` (the record's ``drafter_cache`` is the head's).

    Returns:
        (ids, stats): ids equals the base's greedy ``cached_generate`` (same
        ``refill_tokens``) token for token at any length, hence its greedy ``generate`` while
        prompt + output <= max_seq_len + 1; stats has one record per trunk pass (prefill
        passes record drafted=0).

    Raises:
        ValueError: as ``speculative_generate_cached`` (bad prompt, budget, refill_tokens,
            window < 2); a head built on another model or left in another dtype
            (``check_head_on_base``).
        TypeError: head is not a draft head (no ``base``).
    """
    drafter = MTPDrafter(head)                                                      # the engine checks the rest
    return speculative_sample(CachedTarget(base, drafter=drafter, on_round=on_round, want_hidden=True,
                                           refill_tokens=refill_tokens),
                              drafter, prompt_ids, max_new_tokens, k=1, temperature=0.0, eos_id=eos_id, on_pass=on_pass)
