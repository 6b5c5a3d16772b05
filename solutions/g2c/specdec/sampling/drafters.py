"""Beyond (specdec-sampling): one drafter interface, and the drafters behind it.

Every drafter answers one question: "given the committed context, what might come next?"
The speculative loop (``g2c.specdec.sampling.loop.speculative_sample``) never needs to know more, so
a small LM and a prompt-lookup n-gram matcher (this file) and the heads that live on the
target's states (``MTPDrafter`` and ``EagleDrafter``, in ``eagle.py``) all run through the same loop.

The protocol (documented once, here)
------------------------------------
A drafter is any object with these members; ``Drafter`` is a base class with the no-op
hooks filled in.

``vocab_size: int | None``
    The vocabulary the drafter proposes from; must equal the target's. ``None`` means
    "any vocabulary" (the n-gram drafter copies ids from the context).

``start(prompt_ids, *, sampler, generator) -> None``
    Called once before the first round. ``prompt_ids`` (T,) int64 on the CPU;
    ``sampler`` is the loop's ``Sampler`` (the warpers that are applied identically to the
    target's p and to the drafter's q); ``generator`` the loop's ``torch.Generator``.
    A drafter resets any per-sequence state here.

``propose(context_ids, k) -> Draft``
    ``context_ids`` (T,) int64 on the CPU is everything committed so far (prompt + output).
    It is the loop's own tensor, not a copy (a copy per round would cost every drafter): read
    it, never write into it (``context_ids.clone()`` first), or the committed text changes;
    ``k >= 1`` is the most it may draft. Returns a ``Draft(draft_ids, draft_probs)``
    (``g2c.specdec.sampling.draft``): ``draft_ids`` (k',) int64 with 0 <= k' <= k, and either
    ``draft_probs`` (k', V) float32, row i the warped distribution q_i that ``draft_ids[i]``
    was sampled from, or ``None`` when the draft is a deterministic function of the context
    (greedy LM, n-gram): the loop then treats q_i as one-hot at ``draft_ids[i]``, which is
    exactly the distribution it was drawn from. An empty draft (k' = 0) is allowed: the target
    pass then emits one token of its own. A tree drafter returns the subclass
    ``g2c.specdec.trees.DraftTree``; the round is the same (see ``speculative_sample``).

``commit(context_ids, num_accepted, *, target_hidden=None) -> None``
    Called after every target pass. ``context_ids`` is the new committed context (read-only,
    as in ``propose``; it ends
    with the target's correction or bonus token, or a budget/EOS cut); the first
    ``num_accepted`` drafts of the last proposal became history and the rest are rolled
    back. An uncached drafter has nothing to do. A cached LM drafter
    (``LMDrafter(model, use_cache=True)``, module 16's ``KVCache``) crops its cache to the
    committed context here (rollback = moving a pointer; every committed token but the
    newest, which it feeds on its next ``propose``).
    ``target_hidden`` (L, D) float32 is given only to drafters whose ``reads`` is
    ``("final_state",)``: the target's final states at the last L committed positions *except
    the newest token* (row j belongs to ``context_ids[-(L + 1) + j]``), from the verification
    pass that was just run, so a drafter that lives inside the target (MTP, EAGLE) drafts
    without a pass of its own. Such a drafter keeps its own record of the states and appends
    only the rows it has not seen (a cached target hands just the rows that pass committed,
    the prompt's prefill rows prepended on the first pass; a recomputing one the window's).

``reads: tuple`` (default ``("tokens",)``)
    What the drafter reads of the target; the engine hands it exactly that (``check_reads``):
    ``("tokens",)`` (small LMs, n-gram lookup, an LM building trees), ``("final_state",)``
    (MTP, EAGLE: ``commit`` gets ``target_hidden``), or ``("layers", (i, j, ...))`` (Medusa,
    EAGLE-2/3 and the block drafter, subclasses of ``g2c.specdec.lineage.TreeDrafter``: chosen
    blocks' outputs and the final state, read from the tree target they are bound to).

Sources: the draft/verify split follows Leviathan, Kalman, Matias (ICML 2023) §2;
transformers' ``CandidateGenerator`` (``get_candidates`` / ``update_candidate_strategy``)
and vLLM's proposers use the same split. Prompt lookup: Saxena, "Prompt Lookup Decoding"
(2023), as shipped in transformers (``prompt_lookup_num_tokens``) and vLLM
(``method="ngram"``, ``prompt_lookup_max`` / ``prompt_lookup_min``). MTP: Gloeckle et al.
(ICML 2024) §3.2.

Shape letters: T time, D width, V vocabulary, k draft length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from g2c.kvcache.cache import KVCache
from g2c.kvcache.forward import cached_hidden_states, unembed
from g2c.sampling.generate import as_token_ids
from g2c.sampling.model import (
    check_count,
    check_flag,
    check_language_model,
    check_temperature,
    check_top_p,
    check_whole,
)
from g2c.sampling.warpers import apply_temperature, top_k_filter, top_p_filter

from ..generate import draft_greedy
from .draft import Draft

__all__ = ["CachedScorer", "Drafter", "LMDrafter", "NGramDrafter", "Sampler", "check_reads", "ngram_lookup"]


def check_reads(drafter) -> tuple:
    """What ``drafter`` reads of the target (its ``reads``, default ``("tokens",)``), checked once. Provided.

    Raises:
        ValueError: ``reads`` is none of ``("tokens",)``, ``("final_state",)``, ``("layers", (i, ...))``
            (names the drafter and the three forms).
    """
    reads = tuple(getattr(drafter, "reads", ("tokens",)))
    layers_ok = (len(reads) == 2 and reads[0] == "layers" and isinstance(reads[1], (tuple, list))
                 and all(isinstance(i, int) and not isinstance(i, bool) for i in reads[1]))
    if reads not in (("tokens",), ("final_state",)) and not layers_ok:
        raise ValueError(f"{type(drafter).__name__}.reads must be ('tokens',), ('final_state',) or "
                         f"('layers', (i, j, ...)): what it reads of the target, which the engine hands it; got "
                         f"{reads!r:.60}")
    return reads


@dataclass(frozen=True)
class Sampler:
    """Module 11's warpers as one object, so p and q are warped identically. Provided.

    Attributes:
        temperature: 0.0 = greedy (argmax); > 0 divides the logits.
        top_k: keep the k largest logits (ties kept), or None.
        top_p: nucleus mass in (0, 1], or None.

    The order is module 11's ``sample_from_logits``: temperature -> top-k -> top-p ->
    softmax.

    Raises:
        ValueError: temperature < 0 or NaN, top_k < 1, top_p outside (0, 1] or rounding to 0
            in float32 (the message names the value and the valid range).
        TypeError: top_k not an int (2.5, "3", True), top_p not a real number (module 11's rule).
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        check_temperature(self.temperature)  # a real >= 0, finite (NaN and inf refused)
        # module 11's rules (``g2c.sampling.generate``): a wrong type is a TypeError, a value out of range
        # a ValueError, each message naming the value
        if self.top_k is not None and check_count(self.top_k, "top_k", minimum=None) < 1:
            raise ValueError(f"top_k must be an int >= 1 or None, got {self.top_k!r}")
        check_top_p(self.top_p)   # also: a top_p that float32 rounds to 0 (it would keep no token)

    @property
    def greedy(self) -> bool:
        """True at temperature 0: every choice is an argmax."""
        return self.temperature == 0.0

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """Warped probabilities (..., V) float32 on the logits' device, from logits (..., V).

        A row whose scaled logits overflow (+inf or NaN: a temperature such as 1e-40, or a
        repetition penalty such as 1e-40 that divides a logit into +inf) is one-hot at the argmax
        of its logits: module 11's T -> 0 limit (``sample_from_logits``), so p is the distribution
        ``generate`` draws from there too. A row that holds NaN before scaling (a broken model)
        stays NaN, so the verifier's check names it.

        Raises:
            ValueError: called on a greedy sampler (temperature 0 has no distribution to warp).
        """
        if self.greedy:
            raise ValueError("Sampler.probs needs temperature > 0; at temperature 0 take the argmax")
        x = apply_temperature(logits.float(), self.temperature)
        over = ((torch.isnan(x) | torch.isposinf(x)).any(dim=-1, keepdim=True)           # (..., 1) overflowed,
                & ~torch.isnan(logits).any(dim=-1, keepdim=True))                           # not a NaN model
        x = torch.where(over, torch.zeros_like(x), x)
        if self.top_k is not None:
            x = top_k_filter(x, self.top_k)
        if self.top_p is not None:
            x = top_p_filter(x, self.top_p)
        p = torch.softmax(x, dim=-1)
        if bool(over.any()):                                  # module 11's rule: the argmax, one-hot
            argmax = torch.nn.functional.one_hot(logits.float().argmax(dim=-1), x.shape[-1]).to(p.dtype)
            p = torch.where(over, argmax, p)
        return p

    def choose(self, logits: torch.Tensor, generator: torch.Generator | None, *,
               source: str = "the model's logits") -> tuple[int, torch.Tensor | None]:
        """One token from logits (V,): (argmax, None) when greedy, else (sample, q (V,) on the CPU).

        Raises:
            ValueError: at T > 0, a row with no distribution to draw from: ``source`` (e.g.
                "LMDrafter's logits") holds NaN (a broken model, a float16 overflow), or every
                logit is -inf (nothing survives, e.g. a huge repetition penalty on negative
                logits). Without this check torch.multinomial raises a bare RuntimeError.
        """
        if self.greedy:
            return int(logits.argmax()), None
        q = self.probs(logits).cpu()                                             # (V,)
        if not bool(torch.isfinite(q).all()) or not float(q.sum()) > 0.0:
            what = ("holds NaN (a broken model, or a float16 overflow)" if bool(torch.isnan(logits).any())
                    else "leaves no token to sample (every logit is -inf after the penalty and warpers)")
            raise ValueError(f"{source} {what}: no distribution to sample from at temperature {self.temperature}")
        return int(torch.multinomial(q, 1, generator=generator)), q


class Drafter:
    """Base class of the drafter protocol (see the module docstring). Provided.

    Subclasses implement ``propose``; ``start`` stores the loop's sampler and generator,
    ``commit`` does nothing (an uncached drafter has no state to roll back).
    """

    vocab_size: int | None = None
    reads: tuple = ("tokens",)

    def start(self, prompt_ids: torch.Tensor, *, sampler: Sampler, generator: torch.Generator | None) -> None:
        self.sampler = sampler
        self.generator = generator

    def propose(self, context_ids: torch.Tensor, k: int) -> Draft:
        raise NotImplementedError(f"{type(self).__name__} must implement propose(context_ids, k)")

    def _choose(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """(token, q row or None) from the drafter's logits (V,): the argmax unless the drafter
        samples (``self.sample``) at a temperature > 0."""
        if not getattr(self, "sample", False) or self.sampler.greedy:
            return int(logits.argmax()), None
        return self.sampler.choose(logits, self.generator, source=f"{type(self).__name__}'s logits")

    def commit(self, context_ids: torch.Tensor, num_accepted: int, *,
               target_hidden: torch.Tensor | None = None) -> None:
        return None


def _row(ids: list[int], device) -> torch.Tensor:
    return torch.tensor([ids], dtype=torch.long, device=device)                  # (1, T)


def _as_list(ids) -> list[int]:
    return ids.tolist() if isinstance(ids, torch.Tensor) else [int(t) for t in ids]


def _argmax(row: torch.Tensor) -> tuple[int, None]:
    return int(row.argmax()), None


class CachedScorer:
    """One model and its own ``KVCache`` over a growing committed context: ``LMDrafter``'s cache. Provided.

    The LM drafter ``draft`` s one cached row at a time and ``commit`` s (the target's side is
    ``CachedTarget``, ``target.py``: one trunk pass per round). ``extend`` feeds the pending token(s)
    plus extra tokens in ONE cached pass. ``commit`` is the rollback: a pointer move
    (``KVCache.crop``), nothing is copied.

    State: the cache holds the keys/values of ``ids[start : start + cache.length]`` (``start``
    > 0 only after a re-prefill). After ``prefill`` and after every ``commit`` it holds every
    committed token but the last, the *pending* one (it came out of the last logit row, so its
    own keys/values are not computed yet); the next ``extend`` feeds it first.

    The window: learned positions end at ``max_seq_len``. When the uncached tail plus the
    extra tokens do not fit, ``extend`` re-prefills like ``cached_generate``: it empties the
    cache and runs the last min(refill_tokens, max_seq_len - len(extra)) committed tokens as
    a fresh context at positions 0.. (``refill``).

    Args:
        model: a ``TransformerLM`` (module 09 weights; anything ``cached_forward`` runs).
        refill_tokens: context kept by a re-prefill, in [1, max_seq_len] (default
            ``max_seq_len // 2``, at least 1).

    Attributes:
        model, cache (``KVCache.for_model(model)``), start, refill_tokens,
        reserved: rows the last ``extend`` appended (its block length),
        last_states: the final states (T, D) of the block the last ``extend`` fed.

    Raises:
        TypeError: the model has no ``blocks`` / ``token_embed`` / ``pos_embed`` (not a
            ``TransformerLM``: module 16's cached forward reads them).
        ValueError: ``refill_tokens`` outside [1, max_seq_len] (names "refill_tokens").

    Source: the rollback is transformers' ``DynamicCache.crop`` in assisted generation and
    vLLM's rejected-slot freeing (Kwon et al., SOSP 2023); the re-prefill is module 16's.
    """

    def __init__(self, model, *, refill_tokens: int | None = None) -> None:
        if not all(hasattr(model, name) for name in ("blocks", "token_embed", "pos_embed")):
            raise TypeError(f"CachedScorer needs a TransformerLM (module 16's cached forward reads its blocks, "
                            f"token_embed and pos_embed); got {type(model).__name__}")
        window = model.max_seq_len
        refill = max(1, window // 2) if refill_tokens is None else refill_tokens
        refill = check_whole(refill, f"refill_tokens must be an int in [1, max_seq_len={window}], "
                                     f"got {refill_tokens!r}", high=window)
        self.model = model
        self.cache = KVCache.for_model(model)
        self.start = 0
        self.refill_tokens = refill
        self.reserved = 0
        self.last_states = None
        self.device = model.token_embed.weight.device

    def __repr__(self) -> str:
        return f"CachedScorer({type(self.model).__name__}, start={self.start}, {self.cache!r})"

    @property
    def window(self) -> int:
        """The cache capacity, ``model.max_seq_len``."""
        return self.cache.max_seq_len

    def room(self, ids) -> int:
        """Extra tokens that fit after the pending ones of ``ids`` without a re-prefill."""
        return self.window - self.cache.length - (len(ids) - self.start - self.cache.length)

    def prefill(self, ids) -> torch.Tensor | None:
        """Cache every token of ``ids`` (1-D, list or tensor) but the last, cropped to the window.
        Returns the final states (T', D) of the cached tokens (None when there were none): a
        drafter that lives on the target's states (``EagleDrafter``) starts from them."""
        ids = _as_list(ids)
        self.cache.reset()
        self.start = max(0, len(ids) - self.window)
        if len(ids) - 1 > self.start:
            return cached_hidden_states(self.model, _row(ids[self.start:-1], self.device), self.cache)[0]
        return None

    def refill(self, ids, num_extra: int = 0) -> None:
        """Empty the cache; keep the last min(refill_tokens, max_seq_len - num_extra) tokens of
        ``ids`` as the context the next ``extend`` feeds from position 0."""
        self.cache.reset()
        self.start = max(0, len(ids) - min(self.refill_tokens, self.window - num_extra))

    def extend(self, ids, extra=(), *, num_rows: int = 1) -> torch.Tensor:
        """Feed the uncached tail of ``ids`` plus ``extra`` in ONE cached pass; return the
        logits of its last ``num_rows`` positions, (num_rows, V) in the model's dtype on its
        device. Afterwards the cache holds ``ids[start:] + extra`` (``reserved`` rows more);
        ``commit`` rolls back what does not become history.

        Raises:
            ValueError: ``len(extra) >= max_seq_len`` (cannot fit after one context token),
                or nothing to feed (every token is cached: ``commit`` first).
        """
        ids, extra = _as_list(ids), _as_list(extra)
        if not 1 <= num_rows <= len(extra) + 1:
            raise ValueError(f"CachedScorer.extend: num_rows must be in [1, len(extra) + 1 = {len(extra) + 1}], "
                             f"got {num_rows}")
        if len(extra) >= self.window:
            raise ValueError(f"CachedScorer.extend: {len(extra)} extra tokens do not fit after a context token "
                             f"in max_seq_len={self.window}")
        if self.room(ids) < len(extra):                                      # window full: re-prefill
            self.refill(ids, len(extra))
        block = ids[self.start + self.cache.length:] + extra
        if not block:
            raise ValueError("CachedScorer.extend: every token is cached already; commit(ids) rolls back to the "
                             "pending token first")
        before = self.cache.length
        hidden = cached_hidden_states(self.model, _row(block, self.device), self.cache)[0]   # (T, D)
        self.reserved = self.cache.length - before
        self.last_states = hidden                   # the block's final states, for state-hungry drafters
        return unembed(self.model, hidden[-num_rows:])                                      # (num_rows, V)

    def draft(self, ids, k: int, choose: Callable[[torch.Tensor], tuple[int, torch.Tensor | None]] = _argmax,
              ) -> tuple[list[int], list[torch.Tensor | None]]:
        """k drafts after ``ids``, one cached row per step: ``choose(logits_row (V,))`` returns
        (token, q row or None) (default: the argmax, q None). Afterwards the cache holds
        ``ids`` + drafts[:-1] (the last draft is pending). Returns (tokens, q rows)."""
        ctx = _as_list(ids)
        tokens, rows = [], []
        for _ in range(k):
            token, q = choose(self.extend(ctx)[-1])
            tokens.append(token)
            rows.append(q)
            ctx.append(token)
        return tokens, rows

    def commit(self, ids) -> int:
        """Roll back to the committed ``ids``: keep the rows of ``ids[start:-1]`` (every committed
        token but the pending last one) by moving the pointer. Returns the bytes moved: 0.

        Rows that were never computed stay pending (a drafter's cache may hold fewer than
        that); when a re-prefill during drafting moved ``start`` past the committed context,
        the cache is emptied and the next ``extend`` re-prefills."""
        keep = len(ids) - 1 - self.start
        if keep < 0:                                   # the cache only held rejected drafts
            self.cache.reset()
            self.start = max(0, len(ids) - self.refill_tokens)
            return 0
        return self.cache.crop(min(self.cache.length, keep))


class LMDrafter(Drafter):
    """A smaller language model as drafter (StoryLM-1M drafting for StoryLM-30M). Provided.

    Args:
        model: ids (1, T) -> logits (1, T, V), with ``max_seq_len``, ``device``,
            ``vocab_size`` (a ``TransformerLM`` or a test mock; a ``TransformerLM`` when
            ``use_cache``).
        sample: False (default) drafts the greedy argmax chain (``draft_greedy``;
            ``draft_probs`` is None, q one-hot). True samples each draft token from the
            drafter's warped distribution q (the loop's ``Sampler``, same warpers as p) and
            returns the q rows, which is what the stochastic verifier needs to keep the
            output distributed as the target's (Leviathan et al. 2023, §2.3). At
            temperature 0 both modes draft the argmax chain.
        use_cache: False (default): each step scores the last ``model.max_seq_len`` tokens
            from scratch and ``commit`` has nothing to roll back. True: the drafter keeps its
            own module 16 ``KVCache`` (a ``CachedScorer``, above): ``start`` prefills
            the prompt, each draft step feeds ONE new row, and ``commit`` crops the cache to
            the committed context (rollback = moving a pointer); the target's correction or
            bonus token, which the drafter never saw, is fed at the next ``propose`` together
            with the first new draft step. Same drafts, same q rows, same generator draws as
            uncached while the context fits the drafter's window; past it the cache
            re-prefills its last ``max_seq_len // 2`` tokens (module 16's policy) where the
            uncached drafter slides.
        refill_tokens: with ``use_cache``, the tokens a re-prefill keeps, in [1, max_seq_len]
            (default ``max_seq_len // 2``).

    Attributes:
        cache: the live ``KVCache`` when ``use_cache`` (after ``start``), else None.

    Raises:
        TypeError: ``use_cache`` with a model that is not a ``TransformerLM`` (from
            ``CachedScorer``); ``sample`` or ``use_cache`` not a bool ("LMDrafter use_cache must be
            True or False": the string "False" is truthy).
        ValueError: ``refill_tokens`` out of range (from ``CachedScorer``).
    """

    def __init__(self, model, *, sample: bool = False, use_cache: bool = False,
                 refill_tokens: int | None = None) -> None:
        if not all(hasattr(model, name) for name in ("vocab_size", "max_seq_len")):
            if callable(getattr(model, "propose", None)):        # a drafter wrapping a model: "pass drafter.model"
                check_language_model(model, "drafter")
            raise TypeError(f"LMDrafter needs a language model (ids -> logits, with vocab_size and max_seq_len), "
                            f"got {type(model).__name__}; a head that lives on the target's states has its own "
                            "drafter (MTPDrafter, g2c.specdec.sampling.eagle.EagleDrafter)")
        self.model = model
        self.sample = check_flag(sample, "LMDrafter sample")
        self.use_cache = check_flag(use_cache, "LMDrafter use_cache")
        self.vocab_size = model.vocab_size
        self.sampler = Sampler(0.0)
        self.generator = None
        self._scorer = CachedScorer(model, refill_tokens=refill_tokens) if self.use_cache else None

    def __repr__(self) -> str:
        return f"LMDrafter({type(self.model).__name__}, sample={self.sample}, use_cache={self.use_cache})"

    @property
    def cache(self):
        return None if self._scorer is None else self._scorer.cache

    @torch.no_grad()
    def start(self, prompt_ids: torch.Tensor, *, sampler: Sampler, generator: torch.Generator | None) -> None:
        super().start(prompt_ids, sampler=sampler, generator=generator)
        if self._scorer is not None:
            self._scorer.prefill(prompt_ids)          # every prompt token but the pending last one

    @torch.no_grad()
    def propose(self, context_ids: torch.Tensor, k: int) -> Draft:
        if self._scorer is not None:
            tokens, rows = self._scorer.draft(context_ids, k, self._choose)    # one cached row per step
        elif not self.sample or self.sampler.greedy:
            return Draft(draft_greedy(self.model, context_ids, k))
        else:
            ids = as_token_ids(context_ids, "context_ids")
            tokens, rows = [], []
            for _ in range(k):
                window = ids[-self.model.max_seq_len:].unsqueeze(0).to(self.model.device)  # (1, T)
                token, q = self._choose(self.model(window)[0, -1])
                tokens.append(token)
                rows.append(q)
                ids = torch.cat([ids, torch.tensor([token])])
        return Draft(torch.tensor(tokens, dtype=torch.long),                      # (k,)
                     None if rows[0] is None else torch.stack(rows))              # (k, V) or None

    def commit(self, context_ids: torch.Tensor, num_accepted: int, *,
               target_hidden: torch.Tensor | None = None) -> None:
        if self._scorer is not None:
            self._scorer.commit(context_ids)          # crop to the committed context: a pointer move


def ngram_lookup(context_ids, k: int, *, min_n: int = 1, max_n: int = 3) -> torch.Tensor:
    """Prompt lookup: continue the context by copying what followed its last n tokens before.

    For n from ``max_n`` down to ``min_n``: take the last n tokens of the context (the
    suffix), find their most recent *earlier* occurrence (one that starts before the suffix
    itself), and return the up to k tokens that followed it. The first n that finds a match
    wins (longer matches are more specific). An earlier occurrence may overlap the suffix;
    its continuation then runs into the suffix and stops at the end of the context, so
    fewer than k tokens can come back.

    Args:
        context_ids: 1-D int tensor or list, the committed context (prompt + output).
        k: the most tokens to propose, >= 1.
        min_n, max_n: n-gram lengths to try, 1 <= min_n <= max_n (vLLM's
            ``prompt_lookup_min`` / ``prompt_lookup_max``). An n >= len(context) cannot
            have an earlier occurrence and is skipped.

    Returns:
        LongTensor (k',) on the CPU, 0 <= k' <= k; empty when no n-gram matches.

    Raises:
        TypeError: k, min_n or max_n not an int (a float, a bool, a string).
        ValueError: k < 1, min_n < 1 or min_n > max_n (message names the values), or an
            empty / non-1-D context.

    Choice of match, compared: we take the most recent occurrence (recency: the story's
    latest use of a phrase is the best guess for its next use). transformers'
    ``PromptLookupCandidateGenerator`` takes the earliest match whose continuation is
    non-empty; vLLM's ``NgramProposer`` the longest n in range, earliest position on ties.

    Example: context [5, 1, 2, 3, 9, 1, 2], max_n = 2: the suffix [1, 2] occurred at
    position 1, followed by [3, 9, 1, 2]; with k = 3 the draft is [3, 9, 1].

    Steps:
        1. Validate k, min_n, max_n (provided).
        2. For n = max_n, ..., min_n with n < T: the suffix is context[T-n:].
        3. Scan start positions i = T-n-1 down to 0 for context[i:i+n] == suffix
           (the most recent earlier occurrence first; ``test_ngram_lookup_prefers_most_recent``).
        4. On a match return context[i+n : i+n+k] (may be shorter than k:
           ``test_ngram_lookup_match_at_the_very_end``, ``test_ngram_lookup_overlapping_match``).
        5. No n matched: an empty LongTensor (``test_ngram_lookup_no_match``).
    """
    ids = as_token_ids(context_ids, "context_ids")
    k = check_whole(k, f"k must be an int >= 1 (the most tokens to propose), got {k!r}")
    min_n, max_n = check_count(min_n, "min_n", minimum=None), check_count(max_n, "max_n", minimum=None)
    if not 1 <= min_n <= max_n:
        raise ValueError(f"need 1 <= min_n <= max_n (prompt_lookup_min/max), got min_n={min_n}, max_n={max_n}")
    # BEGIN SOLUTION
    seq = ids.tolist()
    length = len(seq)
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = seq[length - n:]
        for i in range(length - n - 1, -1, -1):
            if seq[i:i + n] == suffix:
                return torch.tensor(seq[i + n:i + n + k], dtype=torch.long)
    return torch.zeros(0, dtype=torch.long)
    # END SOLUTION


class NGramDrafter(Drafter):
    """Prompt-lookup drafting: no model, drafts copied from the context (``ngram_lookup``). Provided.

    Deterministic: ``draft_probs`` is None (q is one-hot at each drafted token), so under
    sampling a draft x is accepted with probability p(x) and a rejection resamples from p
    with x removed (the residual of a one-hot q). Costs a scan of the context, no forward
    pass: c is about 0 in the speed-up law, so it pays whenever the text repeats itself.

    Args:
        prompt_lookup_max: longest n-gram to match (default 3).
        prompt_lookup_min: shortest n-gram to match (default 1).

    Raises:
        TypeError: a length that is not an int.
        ValueError: as ``ngram_lookup`` for bad n-gram lengths.
    """

    def __init__(self, *, prompt_lookup_max: int = 3, prompt_lookup_min: int = 1) -> None:
        prompt_lookup_max = check_count(prompt_lookup_max, "prompt_lookup_max", minimum=None)
        prompt_lookup_min = check_count(prompt_lookup_min, "prompt_lookup_min", minimum=None)
        if not 1 <= prompt_lookup_min <= prompt_lookup_max:
            raise ValueError(f"need 1 <= prompt_lookup_min <= prompt_lookup_max, got "
                             f"min={prompt_lookup_min}, max={prompt_lookup_max}")
        self.max_n = prompt_lookup_max
        self.min_n = prompt_lookup_min
        self.vocab_size = None

    def __repr__(self) -> str:
        return f"NGramDrafter(prompt_lookup_max={self.max_n}, prompt_lookup_min={self.min_n})"

    def propose(self, context_ids: torch.Tensor, k: int) -> Draft:
        return Draft(ngram_lookup(context_ids, k, min_n=self.min_n, max_n=self.max_n))
