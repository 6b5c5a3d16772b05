"""Module 16 (provided): speculative decoding that commits state like a serving stack.

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

Both models' side of the transaction is one provided class, ``CachedScorer`` (prefill, one
cached pass over pending + extra tokens, draft row by row, commit = pointer rollback,
re-prefill past the window). The specdec-sampling loop (``g2c.specdec.sampling.loop.speculative_sample
(..., use_cache=True)`` and ``LMDrafter(..., use_cache=True)``) uses the same class.

Source: Leviathan, Kalman, Matias (ICML 2023) and Chen et al. (2023) for draft-then-verify;
the cache rollback is what serving systems do (vLLM, Kwon et al., SOSP 2023; transformers'
``DynamicCache.crop`` in assisted generation). MTP self-speculation: Gloeckle et al.
(ICML 2024), section 3.2.

Shape letters: T time, V vocabulary, k draft length.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from g2c.kvcache.cache import KVCache
from g2c.kvcache.forward import cached_block, cached_hidden_states, unembed
from g2c.sampling.generate import as_token_ids
from g2c.sampling.model import check_count, check_language_model, eval_mode
from g2c.specdec.generate import SpecStats, draft_room
from g2c.specdec.verify import greedy_verify

__all__ = ["CachedScorer", "RoundRecord", "mtp_generate_cached", "speculative_generate_cached", "summarize_rounds"]


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


def _check_refill(refill_tokens: int | None, window: int, name: str) -> int:
    # cached_generate's range and default: drafts never need room kept free, because draft_room
    # shrinks them to what fits after the re-prefill (none at all when refill_tokens = window).
    refill = max(1, window // 2) if refill_tokens is None else refill_tokens
    if isinstance(refill, bool) or not isinstance(refill, int) or not 1 <= refill <= window:
        raise ValueError(f"refill_tokens must be an int in [1, {name}.max_seq_len = {window}], got {refill_tokens!r}")
    return refill


def _row(ids: list[int], device) -> torch.Tensor:
    return torch.tensor([ids], dtype=torch.long, device=device)                  # (1, T)


def _as_list(ids) -> list[int]:
    return ids.tolist() if isinstance(ids, torch.Tensor) else [int(t) for t in ids]


def _argmax(row: torch.Tensor) -> tuple[int, None]:
    return int(row.argmax()), None


class CachedScorer:
    """One model and its own ``KVCache`` over a growing committed context. Provided.

    Both sides of cached speculative decoding are one of these. The target scores its pending
    token(s) plus k' drafts in ONE cached pass (``extend``: k'+1 rows reserved) and then
    ``commit`` s; an LM drafter ``draft`` s one row at a time and ``commit`` s the same way.
    ``commit`` is the rollback: a pointer move (``KVCache.crop``), nothing is copied.

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
        if isinstance(refill, bool) or not isinstance(refill, int) or not 1 <= refill <= window:
            raise ValueError(f"refill_tokens must be an int in [1, max_seq_len={window}], got {refill_tokens!r}")
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


def _cut(emitted: list[int], remaining: int, eos_id: int | None) -> tuple[list[int], bool]:
    emitted = emitted[:remaining]
    hit_eos = eos_id is not None and eos_id in emitted
    if hit_eos:
        emitted = emitted[:emitted.index(eos_id) + 1]
    return emitted, hit_eos


@torch.no_grad()
def speculative_generate_cached(target, drafter, prompt_ids, max_new_tokens: int, *, k: int = 4,
                                eos_id: int | None = None,
                                on_pass: Callable[[list[int], int], None] | None = None,
                                on_round: Callable[[RoundRecord], None] | None = None,
                                refill_tokens: int | None = None) -> tuple[torch.Tensor, SpecStats]:
    """Greedy speculative decoding with a KV cache on both models and pointer rollback.

    Args:
        target, drafter: ``TransformerLM`` s with the same ``vocab_size`` (put in eval mode for
            the call, modes restored).
        prompt_ids: 1-D int tensor or list, length >= 1 (cropped to the target's window).
        max_new_tokens: budget, >= 0; never exceeded.
        k: drafts per target pass, >= 1 (fewer near the end of the budget or the window:
            ``g2c.specdec.draft_room``).
        eos_id: stop right after emitting this id (included).
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
            target window < k + 2 ("max_seq_len"); refill_tokens out of range ("refill_tokens").
    """
    check_language_model(target, "target")
    check_language_model(drafter, "drafter")
    ids_t = as_token_ids(prompt_ids, "prompt_ids", vocab_size=target.vocab_size)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be >= 1 draft tokens per target pass (an int), got {k!r}")
    max_new_tokens = check_count(max_new_tokens, "max_new_tokens")
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(f"drafter vocab_size {drafter.vocab_size} differs from target vocab_size "
                         f"{target.vocab_size}; both must use the same tokenizer")
    window = target.max_seq_len
    if window < k + 2:
        raise ValueError(f"target max_seq_len={window} must be >= k + 2 = {k + 2} to verify k drafts after "
                         "a pending token; lower k")
    t_refill = _check_refill(refill_tokens, window, "target")
    d_refill = _check_refill(refill_tokens, drafter.max_seq_len, "drafter") if refill_tokens is not None \
        else max(1, drafter.max_seq_len // 2)
    # the preset: the engine with both models cached, greedy (no round here)
    from .drafters import LMDrafter
    from .loop import speculative_sample
    from .target import CachedTarget
    lm_drafter = LMDrafter(drafter, use_cache=True, refill_tokens=d_refill)
    return speculative_sample(CachedTarget(target, drafter=lm_drafter, on_round=on_round, refill_tokens=t_refill),
                              lm_drafter, ids_t, max_new_tokens, k=k, temperature=0.0, eos_id=eos_id, on_pass=on_pass)


def _head_logits(head, base, hidden: torch.Tensor, following: list[int], cache: KVCache) -> torch.Tensor:
    """The ``MTPHead`` forward on T new positions with the head's own one-layer cache.

    hidden (1, T, D), following: token t+1 for each new position t -> logits (1, T, V) for t+2.
    Same maths as ``MTPHead.forward`` (a test checks it), with the block cached.
    """
    table = base.token_embed.weight                                                # (V, D)
    emb = head.ln_embed(table[torch.tensor([following], device=table.device)])     # (1, T, D)
    x = head.fuse(torch.cat([hidden, emb], dim=-1))                                # (1, T, D)
    y = head.ln_final(cached_block(head.block, x, cache, 0))                       # (1, T, D)
    cache.advance(x.shape[1])
    return y @ table.t() + head.bias                                               # (1, T, V)


@torch.no_grad()
def mtp_generate_cached(base, head, prompt_ids, max_new_tokens: int, *, eos_id: int | None = None,
                        on_pass: Callable[[list[int], int], None] | None = None,
                        on_round: Callable[[RoundRecord], None] | None = None,
                        refill_tokens: int | None = None) -> tuple[torch.Tensor, SpecStats]:
    """MTP self-speculation (k = 1) with caches: one trunk pass per round.

    A round feeds [pending token, the head's guess] (2 rows) through the base's cached trunk.
    From that ONE pass: row 0's argmax verifies the guess (``greedy_verify``), the emitted
    tokens are the accepted guess + the base's correction/bonus token, the head (with its own
    one-layer cache over the same positions) guesses the token after the last emitted one,
    and the rows of committed positions stay in both caches (the guess's row is cropped when
    it was rejected). The first pass (and a re-prefill past the window) runs the context and
    emits the base's next token with no draft; so does a pass whose guess does not fit the
    window (``g2c.specdec.draft_room``: the context fills it), which runs the context it
    has again. Past the window the base re-prefills its last ``refill_tokens`` tokens where
    ``cached_generate`` does.

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
            window < 3).
    """
    check_language_model(base, "base")
    ids_t = as_token_ids(prompt_ids, "prompt_ids", vocab_size=base.vocab_size)
    max_new_tokens = check_count(max_new_tokens, "max_new_tokens")
    window = base.max_seq_len
    if window < 3:
        raise ValueError(f"base max_seq_len={window} must be >= 3 for MTP self-speculation")
    refill = _check_refill(refill_tokens, window, "base")
    with eval_mode(base, head):  # modes restored on exit, also when a model raises
        prompt = ids_t.tolist()
        ids = prompt[-window:]
        cropped = len(prompt) - len(ids)
        stats = SpecStats()
        cache = KVCache.for_model(base)
        hcache = KVCache(1, 1, base.num_heads, base.embedding_dim // base.num_heads, window,
                         dtype=cache.dtype, device=cache.device)
        device = base.token_embed.weight.device
        start, guess, num_new = 0, None, 0
        while num_new < max_new_tokens:
            remaining = max_new_tokens - num_new
            if guess is not None and len(ids) - start > window:            # past the window: re-prefill
                start, guess = len(ids) - refill, None
            if guess is None or draft_room(1, len(ids) - start, window) == 0:  # (re-)prefill pass
                cache.reset()
                hcache.reset()
                before = 0
                ctx = ids[start:]
                hidden = cached_hidden_states(base, _row(ctx, device), cache)             # (1, T, D)
                nxt = int(unembed(base, hidden[0, -1]).argmax())
                guess = int(_head_logits(head, base, hidden, ctx[1:] + [nxt], hcache)[0, -1].argmax())
                draft, num_accepted, emitted = [], 0, [nxt]
            else:
                draft = [guess]
                before = cache.length
                hidden = cached_hidden_states(base, _row([ids[-1], guess], device), cache)  # (1, 2, D)
                logits = unembed(base, hidden[0]).float()                                   # (2, V)
                num_accepted, token = greedy_verify(torch.tensor(draft), logits)
                following = logits.argmax(dim=-1).tolist()                                  # [a0, a1]
                head_rows = _head_logits(head, base, hidden, following, hcache)[0]           # (2, V)
                guess = int(head_rows[num_accepted].argmax())
                emitted = draft[:num_accepted] + [token]
            reserved = cache.length - before
            emitted, hit_eos = _cut(emitted, remaining, eos_id)
            num_emitted_drafts = min(num_accepted, len(emitted))
            ids = ids + emitted
            length_before_crop = cache.length
            moved = cache.crop(len(ids) - 1 - start)
            moved += hcache.crop(min(hcache.length, len(ids) - 1 - start))
            stats.record(drafted=len(draft), accepted=num_emitted_drafts, generated=len(emitted))
            if on_pass is not None:
                on_pass(emitted, num_emitted_drafts)
            if on_round is not None:
                on_round(RoundRecord(draft=draft, accepted=num_emitted_drafts, emitted=emitted,
                                     kv_rows_reserved=reserved, kv_rows_rolled_back=length_before_crop - cache.length,
                                     rollback_bytes_moved=moved, committed_length=cache.length,
                                     ids=torch.tensor(prompt[:cropped] + ids), target_cache=cache,
                                     drafter_cache=hcache, target_start=start + cropped))
            num_new += len(emitted)
            if hit_eos:
                break
    return torch.tensor(prompt[:cropped] + ids, dtype=torch.long), stats
