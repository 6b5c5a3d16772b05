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
``CachedTarget`` (module 16's ``KVCache``: one trunk pass, ``forward_rows``, over the pending token
and the draft, a chain or a tree, and module 16's re-prefill rule) and
``g2c.recurrent.TransactionTarget`` (a recurrent target's ``StateTransaction``, specdec-state). A new
way of holding the target's state is a new ``Target``, never a new loop (``docs/CONTRIBUTING.md``).

Every target exposes ``model`` (put in eval mode by the engine), ``vocab_size``,
``max_seq_len`` (the window ``draft_room`` uses) and ``device``.

Shape letters: T time, D width, V vocabulary, k' drafts this round.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from g2c.kvcache.cache import KVCache
from g2c.kvcache.forward import commit_rows, forward_rows, unembed
from g2c.nn import synchronize
from g2c.sampling.model import check_flag, check_language_model, check_whole

__all__ = ["CachedTarget", "FullContextTarget", "RecomputeTarget", "RoundRecord", "Target",
           "chain_only", "summarize_rounds"]


@dataclass
class RoundRecord:
    """What one verification round did to the caches (the lecture's accounting).

    Attributes:
        draft: the drafted token ids (k_step of them; one for MTP, none for a prefill pass).
        accepted: drafts emitted this round.
        emitted: emitted token ids (accepted drafts + correction/bonus, after budget/EOS cuts).
        kv_rows_reserved: rows the target's verification pass appended to its cache (k_step + 1,
            more after a re-prefill).
        kv_rows_rolled_back: target rows cropped after verification (k_step - accepted inside
            the budget).
        rollback_bytes_moved: bytes copied by the rollbacks (0: pointer moves).
        committed_length: the target cache's ``length`` after the rollback.
        ids: the committed ids after the round, CPU LongTensor (N,).
        target_cache, drafter_cache: the live caches (valid during the callback only; the
            drafter cache is the MTP head's cache in ``mtp_generate_cached``).
        target_start: position in ``ids`` of the target cache's row 0 (> 0 after a re-prefill).
    """

    draft: list[int]
    accepted: int
    emitted: list[int]
    kv_rows_reserved: int
    kv_rows_rolled_back: int
    rollback_bytes_moved: int
    committed_length: int
    ids: torch.Tensor = field(repr=False)
    target_cache: KVCache = field(repr=False)
    drafter_cache: KVCache | None = field(repr=False)
    target_start: int = 0


def summarize_rounds(records: list[RoundRecord]) -> dict[str, float]:
    """Totals and means over rounds: rounds, kv_rows_reserved, kv_rows_rolled_back,
    rollback_bytes_moved (totals), mean_rows_reserved, mean_rows_rolled_back."""
    n = len(records)
    reserved = sum(r.kv_rows_reserved for r in records)
    rolled = sum(r.kv_rows_rolled_back for r in records)
    return {"rounds": n, "kv_rows_reserved": reserved, "kv_rows_rolled_back": rolled,
            "rollback_bytes_moved": sum(r.rollback_bytes_moved for r in records),
            "mean_rows_reserved": reserved / n if n else 0.0, "mean_rows_rolled_back": rolled / n if n else 0.0}


def chain_only(draft, target) -> torch.Tensor:
    """The (k',) int64 tokens of a chain ``Draft``, for a target that scores chains; a tree is
    refused by name. Provided."""
    if not getattr(draft, "chain", False):
        raise TypeError(f"{type(target).__name__} scores chains (a g2c.specdec.sampling.Draft), got a "
                        f"{type(draft).__name__}: a tree drafter needs a target that scores trees (g2c.specdec."
                        "sampling.CachedTarget or RecomputeTarget; the presets tree_speculative_generate and "
                        "lineage_generate build one)")
    return draft.tokens


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

    def score(self, context_ids: torch.Tensor, draft):
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
    """The target's side of a round without a cache, for any ``Draft``. Provided.

    ``start`` has nothing to do; ``score`` runs one pass over the context cropped to
    ``max_seq_len - depth`` tokens + the draft (``Draft.rows``: one causal pass for a chain, tree
    attention or path-by-path passes for a ``DraftTree``); ``commit`` has nothing to roll back (the
    next pass recomputes everything); ``visible`` is the whole context (``draft_room`` keeps the
    drafts to what fits; with none, ``score`` crops to the last ``max_seq_len``: module 11's
    sliding window).

    Args:
        target: ids (1, T) -> logits (1, T, V) with ``max_seq_len``, ``device``, ``vocab_size``.
        want_hidden: also return the scored block's final states (``target.hidden_states``; a chain).

    Attributes: ``start_pos`` (0: nothing is cached), ``window`` (``max_seq_len``), ``last_draft``.
    Raises:
        TypeError: ``target`` is not a language model (``check_language_model``: a name, a drafter,
            a head); ``want_hidden`` is not a bool.
        ValueError: at ``score``, a draft deeper than ``max_seq_len - 1`` (no row left for the context).
    """

    start_pos = 0

    def __init__(self, target, *, want_hidden: bool = False) -> None:
        check_language_model(target, "RecomputeTarget's target")
        self.target = self.model = target
        self.want_hidden = check_flag(want_hidden, "want_hidden")
        self.window = target.max_seq_len
        self.last_draft = None

    def score(self, context_ids: torch.Tensor, draft):
        """(logits (1 + n, V), states (T, D) of the whole scored block or None) for a ``Draft``."""
        if draft.max_depth > self.window - 1:
            raise ValueError(f"RecomputeTarget: a draft of depth {draft.max_depth} does not fit the window after "
                             f"the context (room for {self.window - 1}); a drafter keeps its drafts within "
                             "g2c.specdec.draft_room(k, visible context, max_seq_len)")
        self.last_draft = draft
        return draft.rows(self.target, context_ids, want_hidden=self.want_hidden)


FullContextTarget = RecomputeTarget          # the name the specdec-sampling lesson first used


def _check_layers(layers, num_layers: int) -> tuple[int, ...]:
    """``layers`` as a tuple of block indices in [0, num_layers) (a float or a bool is refused, never
    truncated to a block)."""
    message = f"layers must be None or a sequence of block indices in [0, {num_layers - 1}], got {layers!r}"
    if isinstance(layers, (str, bytes)):
        raise TypeError(message)
    try:
        items = list(layers)
    except TypeError:
        raise TypeError(message) from None
    return tuple(check_whole(i, message, low=0, high=num_layers - 1) for i in items)


class CachedTarget(Target):
    """The target's side of a round with module 16's KV cache, for any ``Draft``. Provided.

    A chain is a tree of width 1: every pass is ONE call of module 16's trunk ``forward_rows``
    (fused on a ``fast_model`` target) over the pending token (the root) and the draft's nodes, at
    ``draft.positions(length)`` and reading ``draft.allowed(length)`` (None for a chain: the causal
    fast case, no mask built; a ``DraftTree``'s tree attention mask), and committing is module 16's
    ``commit_rows`` of ``draft.committed_rows(e)`` (a pointer move for a chain, a gather of the
    accepted path for a tree).

    * ``start(prompt_ids)`` prefills every prompt token but the last (the last ``max_seq_len``
      tokens of a longer prompt), causal.
    * ``visible(ids)``: past the window (more than ``max_seq_len`` committed tokens since
      ``start_pos``) re-prefill the last ``refill_tokens`` (module 16's ``cached_generate`` rule:
      the one target-side re-prefill of the engine; ``generation`` counts the prefills, so a
      drafter that reads the target's states knows to restart).
    * ``score(ids, draft)``: (logits (1 + n, V) float32 on the model's device, states or None):
      with ``want_hidden`` (a drafter that reads ``("final_state",)``, e.g. ``EagleDrafter``) the
      final states (T, D) of the rows the drafter has not been handed yet (the last prefill's, then
      the block's), else None. With ``layers`` the block's states (1 + n, len(layers) + 1, D)
      float32 on the CPU stay in ``last_states`` for a drafter that reads layers (``TreeDrafter``).
    * ``commit(ids, num_accepted)``: keep the root and the accepted path's emitted rows, drop the
      rest, and report the round to ``on_round`` as a ``RoundRecord``.

    Args:
        target: a ``TransformerLM`` (or its ``fast_model``).
        drafter: the round's drafter (its ``cache``, if any, goes into the ``RoundRecord``).
        on_round: ``on_round(record)`` after each round's rollback.
        want_hidden: see above.
        layers: block indices whose outputs a state-reading drafter reads besides the final state
            (their outputs, then the final state, are kept in ``prefill_states`` / ``last_states``);
            None (default) keeps no states.
        refill_tokens: context kept by a re-prefill, in [1, max_seq_len] (default
            ``max_seq_len // 2``, at least 1).
        cache: a ``KVCache.for_model(target)`` to use (reset now), or None for a new one.

    Attributes:
        cache, start_pos, generation, prefill_states, last_states, last_draft; ``seconds`` (time in
        its prefills, passes and commits, synchronised); ``kv_bytes_moved`` (bytes the path gathers
        copied) and ``kv_rows_dropped`` (rows written, not committed).

    Raises:
        TypeError: a target that is not a language model (``check_language_model``) or not a
            ``TransformerLM`` (the cache reads its blocks); ``on_round`` not callable; ``want_hidden``
            not a bool; ``cache`` not a ``KVCache``; ``layers`` not a sequence of whole numbers ("layers");
            refill_tokens not a whole number; at ``score``, a draft that is not a ``Draft``.
        ValueError: ``refill_tokens`` out of range ("refill_tokens"); a ``layers`` index outside the
            model's blocks; a ``cache`` not shaped as ``KVCache.for_model(target)`` (batch 1, the model's
            layers and window); at ``score``, a draft of more nodes than the window holds after the context.
        RuntimeError: ``commit`` before any ``score``.

    Source: the rollback is transformers' ``DynamicCache.crop`` in assisted generation and vLLM's
    rejected-slot freeing (Kwon et al., SOSP 2023); the tree pass and gather are SpecInfer's (Miao
    et al., ASPLOS 2024, section 4); the re-prefill is module 16's.
    """

    def __init__(self, target, *, drafter=None, on_round: Callable[[RoundRecord], None] | None = None,
                 want_hidden: bool = False, layers: tuple[int, ...] | None = None,
                 refill_tokens: int | None = None, cache: KVCache | None = None) -> None:
        check_language_model(target, "CachedTarget's target")
        if not all(hasattr(target, name) for name in ("blocks", "token_embed", "pos_embed")):
            raise TypeError(f"CachedTarget needs a TransformerLM (module 16's cached forward reads its blocks, "
                            f"token_embed and pos_embed); got {type(target).__name__}")
        if on_round is not None and not callable(on_round):
            raise TypeError(f"on_round must be a callable or None, got {type(on_round).__name__} {on_round!r}")
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"target_cache must be a g2c.kvcache.KVCache (KVCache.for_model(target)) or None, got "
                            f"{type(cache).__name__}")
        if cache is not None and (cache.batch_size != 1 or cache.num_layers != len(target.blocks)
                                  or cache.max_seq_len < target.max_seq_len):
            raise ValueError(f"cache is shaped B={cache.batch_size}, {cache.num_layers} layers, max_seq_len="
                             f"{cache.max_seq_len}; the target needs B=1, {len(target.blocks)} layers, max_seq_len >= "
                             f"{target.max_seq_len} (it would fail mid-generation): pass KVCache.for_model(target)")
        self.model = target
        self.window = target.max_seq_len
        refill = max(1, self.window // 2) if refill_tokens is None else refill_tokens
        self.refill_tokens = check_whole(refill, f"refill_tokens must be an int in [1, max_seq_len={self.window}], "
                                                 f"got {refill_tokens!r}", high=self.window)
        self.drafter, self.on_round = drafter, on_round
        self.want_hidden = check_flag(want_hidden, "want_hidden")
        self.layers = None if layers is None else _check_layers(layers, len(target.blocks))
        self.cache = KVCache.for_model(target) if cache is None else cache
        self.cache.reset()
        self._device = target.token_embed.weight.device
        self.start_pos, self.generation = 0, 0
        self.prefill_states = self.last_states = self.last_draft = None
        self._fresh = None              # final states (T, D) of prefilled rows not yet handed to the drafter
        self._length = self._refilled = self._written = self._reserved = 0
        self.seconds = 0.0
        self.kv_bytes_moved = self.kv_rows_dropped = 0

    def __repr__(self) -> str:
        return f"CachedTarget({type(self.model).__name__}, start_pos={self.start_pos}, {self.cache!r})"

    @property
    def device(self) -> torch.device:
        return self._device

    def _clock(self, t0: float) -> None:
        synchronize(self._device)
        self.seconds += time.perf_counter() - t0

    def _pass(self, ids: torch.Tensor, positions: torch.Tensor | None, allowed: torch.Tensor | None):
        """ONE trunk call over new rows (written after the pointer, not committed): final states
        (T, D) in the model's dtype on its device; the kept states (T, L + 1, D) go to
        ``last_states`` when ``layers`` were asked for."""
        h, kept = forward_rows(self.model, ids.view(1, -1).to(self._device), self.cache, positions=positions,
                               allowed=allowed, keep_layers=self.layers or ())
        h = h[0]                                                                   # (T, D)
        if self.layers is not None:
            rows = h.unsqueeze(1) if kept is None else torch.cat([kept[0], h.unsqueeze(1)], dim=1)  # (T, L+1, D)
            self.last_states = rows.float().cpu()
        return h

    def _prefill(self, ids: torch.Tensor, first: int) -> None:
        """Empty the cache and prefill ``ids[first:-1]`` (every visible token but the pending last)."""
        t0 = time.perf_counter()
        ctx = ids[first:]
        self.cache.reset()
        self.start_pos, self._fresh, self._refilled = first, None, max(0, ctx.numel() - 1)
        self.last_states = None
        if ctx.numel() > 1:
            self._fresh = self._pass(ctx[:-1], None, None)
            self.cache.advance(ctx.numel() - 1)
        if self.layers is not None:
            self.prefill_states = (self.last_states if self.last_states is not None
                                   else torch.zeros(0, len(self.layers) + 1, self.model.embedding_dim))
        self.generation += 1
        self._clock(t0)

    def start(self, prompt_ids: torch.Tensor) -> None:
        self._prefill(prompt_ids, max(0, prompt_ids.numel() - self.window))
        self._refilled = 0                       # a round's record counts the re-prefills only

    def visible(self, context_ids: torch.Tensor) -> int:
        """Tokens the next pass sees before the drafts: the cache's context. When the committed
        context has outgrown the window, re-prefill first (the last ``refill_tokens`` tokens,
        module 16's ``cached_generate`` rule)."""
        if context_ids.numel() - self.start_pos > self.window:                      # past the window
            self._prefill(context_ids, context_ids.numel() - self.refill_tokens)
        return context_ids.numel() - self.start_pos

    def score(self, context_ids: torch.Tensor, draft):
        if not all(hasattr(draft, a) for a in ("tokens", "num_nodes", "allowed", "positions", "committed_rows")):
            raise TypeError(f"CachedTarget.score takes a Draft (g2c.specdec.sampling.Draft, or a DraftTree), got "
                            f"{type(draft).__name__}: wrap token ids as Draft(ids)")
        t0 = time.perf_counter()
        length, n = self.cache.length, draft.num_nodes
        if n > self.window - length - 1:
            raise ValueError(f"CachedTarget: a {draft.noun} of {n} nodes does not fit the window after the context "
                             f"(room for {max(self.window - length - 1, 0)}); a drafter keeps its drafts within "
                             "g2c.specdec.draft_room(k, visible context, max_seq_len)")
        allowed = draft.allowed(length)                            # None: a chain, causal (positions default)
        block = torch.cat([context_ids[-1:], draft.tokens])                             # (1 + n,) root + nodes
        h = self._pass(block, None if allowed is None else draft.positions(length), allowed)
        logits = unembed(self.model, h).float()                                         # (1 + n, V)
        self.last_draft, self._length, self._written = draft, context_ids.numel(), length + 1 + n
        self._reserved = self._refilled + 1 + n                 # rows written since the last commit
        self._refilled = 0
        states = None
        if self.want_hidden:
            states = h if self._fresh is None else torch.cat([self._fresh, h])
            self._fresh = None
        self._clock(t0)
        return logits, states

    def committed_rows(self, context_ids: torch.Tensor) -> list[int]:
        """Block rows the committed ``context_ids`` keep (the root, then the emitted accepted nodes)."""
        return self.last_draft.committed_rows(context_ids.numel() - self._length)

    def commit(self, context_ids: torch.Tensor, num_accepted: int) -> None:
        if self.last_draft is None:
            raise RuntimeError("CachedTarget.commit before score: a round is start/visible, score, then commit")
        t0 = time.perf_counter()
        kept = [r - 1 for r in self.committed_rows(context_ids)[1:]]                  # accepted nodes kept
        moved = commit_rows(self.cache, self.cache.length + 1, kept)                  # the root stays as written
        self.kv_bytes_moved += moved
        self.kv_rows_dropped += self.last_draft.num_nodes - len(kept)
        self._clock(t0)
        if self.on_round is not None:
            cache = self.cache
            self.on_round(RoundRecord(
                draft=self.last_draft.tokens.tolist(), accepted=num_accepted,
                emitted=context_ids[self._length:].tolist(),
                kv_rows_reserved=self._reserved,
                kv_rows_rolled_back=self._written - cache.length, rollback_bytes_moved=moved,
                committed_length=cache.length, ids=context_ids.clone(), target_cache=cache,
                drafter_cache=getattr(self.drafter, "cache", None), target_start=self.start_pos))
