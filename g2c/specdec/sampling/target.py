"""Beyond (specdec-sampling, provided): the target's side of a speculative round, one seam.

The engine (``speculative_sample``) never touches the target's model directly: it asks a
``Target`` four things, with the drafter's verbs.

* ``start(prompt_ids)``: get ready (a cache prefills every prompt token but the pending last).
* ``visible(ids) -> int``: tokens the next pass sees before the drafts, for the window-edge
  rule ``g2c.specdec.draft_room``. A cached target re-prefills here when the committed context
  has outgrown the window: the one re-prefill past the window on the target side.
* ``score(ids, draft_ids) -> (logits (k'+1, V), states (T, D) | None)``: ONE pass over the
  pending token(s) and the k' drafts.
* ``commit(ids, num_accepted)``: keep what was emitted, drop the rest (nothing to do when
  recomputing; a pointer move for a KV cache; ``StateTransaction.commit`` for a recurrent state).

Three implementations: ``RecomputeTarget`` (re-scores the cropped context, module 11's window),
``CachedTarget`` (module 16's ``KVCache`` through ``CachedScorer``, module 16's re-prefill rule)
and ``g2c.recurrent.TransactionTarget`` (a recurrent target's ``StateTransaction``, specdec-state). A new way
of holding the target's state is a new ``Target``, never a new loop (``docs/CONTRIBUTING.md``).

Every target exposes ``model`` (put in eval mode by the engine), ``vocab_size``,
``max_seq_len`` (the window ``draft_room`` uses) and ``device``.

Shape letters: T time, D width, V vocabulary, k' drafts this round.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from .cached import CachedScorer, RoundRecord

__all__ = ["CachedTarget", "FullContextTarget", "RecomputeTarget", "Target"]


class Target:
    """Base class of the target seam (see the module docstring). Provided.

    Attributes: ``model``, ``vocab_size``, ``max_seq_len``, ``device``.
    """

    model = None

    @property
    def vocab_size(self) -> int:
        return self.model.vocab_size

    @property
    def max_seq_len(self) -> int:
        return self.model.max_seq_len

    @property
    def device(self) -> torch.device:
        return self.model.device

    def start(self, prompt_ids: torch.Tensor) -> None:
        return None

    def visible(self, context_ids: torch.Tensor) -> int:
        return len(context_ids)

    def score(self, context_ids: torch.Tensor, draft_ids: torch.Tensor):
        raise NotImplementedError

    def commit(self, context_ids: torch.Tensor, num_accepted: int) -> None:
        return None


@torch.no_grad()
def _target_pass(target, block: torch.Tensor, num_rows: int, *, want_hidden: bool):
    """One target pass over ``block`` (T,): its last ``num_rows`` logits rows (num_rows, V)
    and, if asked, every final state (T, D) (for drafters inside the target)."""
    x = block.unsqueeze(0).to(target.device)                                  # (1, T)
    if not want_hidden:
        return target(x)[0, -num_rows:], None                                 # (k'+1, V)
    hidden = target.hidden_states(x)[0]                                       # (T, D)
    rows = hidden[-num_rows:]
    if hasattr(target, "unembed"):
        logits = target.unembed(rows)
    else:
        logits = rows @ target.token_embed.weight.t()                         # tied unembedding
    return logits, hidden


class RecomputeTarget(Target):
    """The target's side of a round without a cache. Provided.

    ``start`` has nothing to do; ``score`` runs one pass over the context cropped to
    ``max_seq_len - k'`` tokens + the draft; ``commit`` has nothing to roll back (the next
    pass recomputes everything); ``visible`` is the whole context (``draft_room`` keeps the
    drafts to what fits; with none, ``score`` crops to the last ``max_seq_len``: module 11's
    sliding window).

    Args:
        target: ids (1, T) -> logits (1, T, V) with ``max_seq_len``, ``device``, ``vocab_size``.
        want_hidden: also return the scored block's final states (``target.hidden_states``).
    """

    def __init__(self, target, *, want_hidden: bool = False) -> None:
        self.target = self.model = target
        self.want_hidden = want_hidden

    def score(self, context_ids: torch.Tensor, draft_ids: torch.Tensor):
        """(logits (k'+1, V), states (T, D) of the whole scored block or None)."""
        k_draft = draft_ids.numel()
        block = torch.cat([context_ids[-(self.target.max_seq_len - k_draft):], draft_ids])   # (T + k',)
        return _target_pass(self.target, block, k_draft + 1, want_hidden=self.want_hidden)


FullContextTarget = RecomputeTarget          # the name the specdec-sampling lesson first used


class CachedTarget(Target):
    """The target's side of a round with module 16's KV cache (``use_cache=True``). Provided.

    ``start`` prefills every prompt token but the last; ``visible`` re-prefills the last
    ``refill_tokens`` tokens once the committed context has outgrown the window (module 16's
    ``cached_generate`` rule: the one target-side re-prefill of the engine); ``score`` runs ONE
    cached pass over the pending token(s) + the k' drafts (k'+1 rows reserved); ``commit``
    crops the cache to the committed context, rolling back the rejected rows by moving the
    pointer, and reports the round to ``on_round`` as a ``RoundRecord``. With ``want_hidden``
    (a drafter with ``incremental_hidden``, e.g. ``EagleDrafter``) ``score`` also returns the
    final states of the rows this pass computed, the prompt's prefill rows prepended on the
    first pass: exactly the committed positions the drafter has not seen.

    Args:
        target: a ``TransformerLM``.
        drafter: the round's drafter (its ``cache``, if any, goes into the ``RoundRecord``).
        on_round: ``on_round(record)`` after each round's rollback.
        want_hidden: see above.
        refill_tokens: context kept by a re-prefill, in [1, max_seq_len] (default
            ``max_seq_len // 2``).

    Raises:
        TypeError: a target that is not a ``TransformerLM`` (from ``CachedScorer``).
        ValueError: ``refill_tokens`` out of range ("refill_tokens").
    """

    def __init__(self, target, *, drafter=None, on_round: Callable[[RoundRecord], None] | None = None,
                 want_hidden: bool = False, refill_tokens: int | None = None) -> None:
        self.scorer = CachedScorer(target, refill_tokens=refill_tokens)
        self.model = target
        self.drafter = drafter
        self.on_round = on_round
        self.want_hidden = want_hidden
        self._prefill_states = None
        self._draft: list[int] = []
        self._length = 0

    def start(self, prompt_ids: torch.Tensor) -> None:
        self._prefill_states = self.scorer.prefill(prompt_ids)

    def visible(self, context_ids: torch.Tensor) -> int:
        """Tokens the next pass sees before the drafts: the cache's context. When the committed
        context has outgrown the window, re-prefill first (``CachedScorer.refill``: the last
        ``refill_tokens`` tokens, module 16's ``cached_generate`` rule)."""
        if self.scorer.room(context_ids) < 0:
            self.scorer.refill(context_ids)
        return len(context_ids) - self.scorer.start

    def score(self, context_ids: torch.Tensor, draft_ids: torch.Tensor):
        self._draft, self._length = draft_ids.tolist(), len(context_ids)
        logits = self.scorer.extend(context_ids, self._draft, num_rows=len(self._draft) + 1)   # (k'+1, V)
        if not self.want_hidden:
            return logits, None
        states = self.scorer.last_states                                           # (T, D) of the scored block
        if self._prefill_states is not None:
            if self.scorer.cache.length - self.scorer.reserved == self._prefill_states.shape[0]:  # no re-prefill
                states = torch.cat([self._prefill_states, states])
            self._prefill_states = None
        return logits, states

    def commit(self, context_ids: torch.Tensor, num_accepted: int) -> None:
        cache = self.scorer.cache
        before = cache.length
        moved = self.scorer.commit(context_ids)
        if self.on_round is not None:
            emitted = context_ids[self._length:].tolist()
            self.on_round(RoundRecord(
                draft=self._draft, accepted=num_accepted, emitted=emitted, kv_rows_reserved=self.scorer.reserved,
                kv_rows_rolled_back=before - cache.length, rollback_bytes_moved=moved,
                committed_length=cache.length, ids=context_ids.clone(), target_cache=cache,
                drafter_cache=getattr(self.drafter, "cache", None), target_start=self.scorer.start))
