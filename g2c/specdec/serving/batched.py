"""Beyond (specdec-serving): B rows through the engine's round, one target pass for all. Provided.

``speculative_sample`` (module specdec-sampling) serves one sequence; the serving lab's
``batched_speculative_generate`` (module specdec-lab) serves B at once but is greedy only, takes an
LM drafter only and drafts the same k for every row. ``batched_speculative_sample`` is the
engine's round run for B rows at once:

1. **Draft per row.** Each live row has its own drafter (any chain drafter of the protocol:
   ``LMDrafter``, ``NGramDrafter``, a sampled drafter with q rows, your own), its own k (0 = a
   plain step: no drafter call) and its own CPU generator. Row b asks for
   k'_b = ``draft_room(min(k_b, row b's budget left), longest live context, max_seq_len)``;
   its drafter may return fewer (an n-gram miss returns none).
2. **One target pass.** Every row's pending token and its drafts, right-padded to
   T = 1 + max_b k'_b columns, go through ``g2c.kvcache.ragged_forward`` on one
   ``RaggedKVCache`` (module 16): row b's token t sits at position ``lengths[b] + t`` and reads
   only its own keys, so a row's logits are the ones a one-row pass would give (up to float
   round-off of the masked batched attention).
3. **Verify per row, with the engine's own rule.** Row b's first 1 + k'_b logits rows go to
   ``draft.accept(rows, verify_round, sampler=..., generator=generators[b])``: the very function
   ``speculative_sample`` calls (greedy at temperature 0, Leviathan et al. 2023 §2.3 when
   sampled). Each row draws its uniforms and its residual or bonus sample from its own generator:
   a row's acceptance never depends on another row's draw.
4. **Commit per row.** Row b emits its accepted drafts and the target's token (cut by its budget
   and ``eos_id``), its drafter commits them, and its cache row is rolled back to what it holds
   (``crop`` with one length per row: a pointer move); finished rows leave the batch
   (``cache.keep``).

So each row has exactly the law of ``speculative_sample`` on that row alone, which is the law of
plain decoding (greedy: token for token). Per row the draws happen in the engine's order (the
drafter's, then the verifier's), so a row with a sampled or deterministic drafter and seed s emits
what ``speculative_sample(..., generator=seeded s)`` emits alone, as long as the longest row's
window room does not cut its k (``test_batched_rows_equal_the_engine_alone_with_the_same_seed``).

What is NOT batched: drafting. Each row's drafter runs on its own (B drafter calls per draft
step), where the lab's greedy loop steps one LM drafter over all rows in one ragged pass. That is
the measured reason the lab's loop stays a separate round (``bench/specdec_serving.py
--engine``): for an LM drafter at large B its drafting is cheaper. A tree drafter (a
``DraftTree``) or a drafter that reads the target's states (MTP, EAGLE) is refused here.

Shape letters: B batch, n live rows, T new tokens per row in the pass, V vocabulary.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Sequence

import torch

from g2c.kvcache.ragged import ragged_forward
from g2c.sampling.model import check_eos_id, check_generator, check_same_vocab, check_whole, eval_mode
from g2c.specdec.generate import draft_room
from g2c.specdec.lab.batched import BatchedResult, RaggedKV, _check, _controller_k, _pad, _prefill, _sync
from g2c.specdec.sampling.draft import Draft, check_draft
from g2c.specdec.sampling.drafters import Sampler, check_reads
from g2c.specdec.sampling.loop import _check_parts, verify_round
from g2c.specdec.sampling.target import RecomputeTarget
from g2c.transformer import TransformerLM

__all__ = ["batched_speculative_sample"]


def _per_row_k(k, batch: int) -> list[int]:
    """``k`` (an int, or one int per row) as B ints >= 0."""
    if isinstance(k, (list, tuple)):
        if len(k) != batch:
            raise ValueError(f"k has {len(k)} entries for {batch} prompts: give one k per row (or one int)")
        return [check_whole(x, f"k must be ints >= 0 (0: plain steps for that row), got {x!r}", low=0) for x in k]
    return [check_whole(k, f"k must be an int >= 0 (0: plain steps) or one per row, got {k!r}", low=0)] * batch


def _rows_of(items, batch: int, name: str, check) -> list:
    """B distinct objects (one per row), each passed through ``check``."""
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise TypeError(f"{name} must be a list with one entry per prompt, got {type(items).__name__}")
    if len(items) != batch:
        raise ValueError(f"{name} has {len(items)} entries for {batch} prompts: give one per row")
    for i, x in enumerate(items):
        try:
            check(x)
        except (TypeError, ValueError) as exc:                       # name the row: "drafters[1]: ..."
            raise type(exc)(f"{name}[{i}]: {exc}") from exc
        if any(x is y for y in items[:i]):
            raise ValueError(f"{name}[{i}] is the same object as an earlier row's: each row needs its own (a shared "
                             f"one makes a row's output depend on the other rows)")
    return list(items)


def _from_factory(drafters, batch: int):
    """``drafters`` as given, or B drafters from a zero-argument factory (called once per row)."""
    if isinstance(drafters, Sequence) or not callable(drafters):
        return drafters
    if all(callable(getattr(drafters, m, None)) for m in ("start", "propose", "commit")):
        raise TypeError(f"drafters is one {type(drafters).__name__}: pass one drafter per row (a list, distinct "
                        "objects) or a zero-argument factory (lambda: NGramDrafter())")
    try:
        inspect.signature(drafters).bind()
    except TypeError:
        raise TypeError(f"drafters factory {getattr(drafters, '__qualname__', type(drafters).__name__)} must take no "
                        "arguments (it is called once per row: lambda: NGramDrafter())") from None
    except ValueError:                                                # no signature to read (a builtin): just call it
        pass
    return [drafters() for _ in range(batch)]


@torch.no_grad()
def batched_speculative_sample(target, drafters, prompts, max_new_tokens: int, *, k=4, controller=None,
                               temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                               generators=None, eos_id: int | None = None,
                               on_round: Callable[[list[int], list[list[int]], list[int]], None] | None = None
                               ) -> BatchedResult:
    """Speculative decoding of B prompts through the engine's round: one target pass per round.

    Args:
        target: a ``TransformerLM`` (its keys and values live in one ``RaggedKVCache``).
        drafters: one chain drafter per row (distinct objects: a drafter keeps per-sequence state), or
            a zero-argument factory called once per row (``lambda: NGramDrafter()``).
        prompts: B 1-D token id sequences, lengths may differ; prompt + ``max_new_tokens`` at most
            ``max_seq_len + 1`` (no sliding window, as the lab's loop).
        max_new_tokens: per-row budget, >= 0; never exceeded.
        k: drafts per round, an int >= 0 for every row or one int >= 0 per row (0: that row takes
            plain steps, its drafter is never asked).
        controller: optional ``next_k(n)`` / ``update(drafted=, accepted=[...])`` (the lab's hook,
            e.g. ``LoadAwareK``): its k for the n live rows replaces ``k`` each round.
        temperature, top_k, top_p: module 11's warpers (``Sampler``); temperature 0 is greedy.
        generators: None (every draw from torch's global generator), or one distinct CPU
            ``torch.Generator`` per row: row b's drafter and verifier draw from ``generators[b]`` only.
        eos_id: a row stops right after emitting it (None, or an id in [0, V)).
        on_round: optional ``on_round(rows, emitted, accepted)`` after each pass (as the lab's loop).

    Returns:
        ``g2c.specdec.lab.BatchedResult``: outputs[b] (prompt + new tokens), per row its rounds
        (drafts emitted, tokens emitted), token times, and the number of target passes.

    Raises:
        ValueError: as the lab's loop (no prompts, an empty prompt, one flat prompt instead of a list, an id
            outside [0, V) or a non-integer dtype ("prompts[i]"), max_new_tokens < 0, a budget past the
            window); k < 0 or a k list of the wrong length ("k"), or a k list with a controller ("k per row
            with a controller"); ``drafters`` or ``generators`` of the wrong length, or one object shared by
            two rows ("generators", "drafters", "same object"); a
            generator not on the CPU ("generators[i]"); a drafter of another vocabulary ("vocab_size"); a
            drafter that reads the target's states, or a tree draft ("chain drafters"); a draft that breaks
            the protocol (too long, ids outside [0, V)); bad warpers (temperature < 0 or not finite, top_k
            < 1, top_p outside (0, 1]); eos_id outside [0, V); ``controller.next_k`` returning k < 0.
        TypeError: target not a ``TransformerLM``; ``drafters`` neither a list nor a zero-argument factory
            (one drafter object, a factory that takes arguments); a drafter that does not meet the protocol
            ("drafters[i]", a factory returning None included) or a propose that returns no ``Draft``;
            ``generators`` not a list, or an entry that is not a ``torch.Generator`` (None included); a
            controller without next_k/update, or a next_k that returns no whole number; on_round not
            callable; a wrong-typed k, max_new_tokens, temperature, top_k, top_p or eos_id (a float for an
            int, a bool, a string).

    Errors raised by your own code (the drafter factory, a drafter, ``on_round``) pass through unchanged;
    the target's and the drafters' models are back in their train/eval mode whatever is raised.
    """
    if not isinstance(target, TransformerLM):
        raise TypeError(f"batched_speculative_sample needs a TransformerLM target (its rows share one "
                        f"RaggedKVCache), got {type(target).__name__}")
    if controller is not None and not all(callable(getattr(controller, m, None)) for m in ("next_k", "update")):
        raise TypeError(f"controller must have next_k(batch) and update(drafted=, accepted=), got "
                        f"{type(controller).__name__}")
    if controller is not None and isinstance(k, (list, tuple)):       # never ignored in silence
        raise ValueError("k per row with a controller: the controller's next_k(n) replaces k every round, so "
                         "the per-row k would be ignored; pass one or the other")
    prompts = _check([target], prompts, max_new_tokens)              # as_token_ids per row, budget vs window
    B = len(prompts)
    ks = _per_row_k(k, B)
    if on_round is not None and not callable(on_round):
        raise TypeError(f"on_round must be a callable on_round(rows, emitted, accepted) or None, got "
                        f"{type(on_round).__name__}")
    drafters = _from_factory(drafters, B)

    seam = RecomputeTarget(target)                                   # the target checked once

    def check_drafter(d):
        _check_parts(seam, d, None)                                   # the engine's drafter protocol checks
        check_same_vocab(getattr(d, "vocab_size", None), target.vocab_size)
        if check_reads(d) != ("tokens",):
            raise ValueError(f"{type(d).__name__} reads {check_reads(d)!r} of the target: the batched round takes "
                             "chain drafters that read tokens only (LMDrafter, NGramDrafter, your own)")

    drafters = _rows_of(drafters, B, "drafters", check_drafter)
    if generators is None:
        generators = [None] * B
    else:
        def check_row_generator(g):
            if g is None:
                raise TypeError("generators must hold one CPU torch.Generator per row (None only as a whole: "
                                "generators=None draws every row from torch's global generator)")
            check_generator(g)

        generators = _rows_of(generators, B, "generators", check_row_generator)
    sampler = Sampler(temperature, top_k, top_p)
    eos_id = check_eos_id(eos_id, target.vocab_size)
    window = target.max_seq_len
    models = list({id(m): m for m in (getattr(d, "model", None) for d in drafters) if m is not None}.values())
    with eval_mode(target, *models):
        ids = [p.clone() for p in prompts]                            # (T_b,) int64 CPU per row
        for d, p, g in zip(drafters, prompts, generators):
            d.start(p, sampler=sampler, generator=g)
        res = BatchedResult(outputs=[], rounds=[[] for _ in range(B)], token_times=[[] for _ in range(B)])
        cache = RaggedKV(target, B)
        _prefill(target, cache, prompts)                              # every prompt token but the pending last
        active = [b for b in range(B) if max_new_tokens > 0]
        cache.keep(torch.tensor(active, dtype=torch.long))
        _sync(target)
        res.start_time = time.perf_counter()
        new = [0] * B
        while active:
            n = len(active)
            want = [ks[b] for b in active] if controller is None else [_controller_k(controller, n)] * n
            longest = max(ids[b].numel() for b in active)             # one block: the longest row's room caps all
            # 1. Draft per row (k' = 0: a plain step, no drafter call).
            drafts = []
            for i, b in enumerate(active):
                kr = draft_room(min(want[i], max_new_tokens - new[b]), longest, window)
                draft = Draft.empty() if kr == 0 else check_draft(drafters[b].propose(ids[b], kr), drafters[b],
                                                                  k=kr, vocab_size=target.vocab_size)
                if not draft.chain:
                    raise ValueError(f"{type(drafters[b]).__name__} proposed a {draft.noun}: the batched round takes "
                                     "chain drafters")
                drafts.append(draft)
            # 2. One target pass: pending token + drafts per row, right-padded to T columns.
            block = _pad([[int(ids[b][-1])] + d.tokens.tolist() for b, d in zip(active, drafts)])   # (n, T)
            before = cache.lengths.clone()                            # (n,) committed rows before the pass
            logits = ragged_forward(target, block, cache).float().cpu()                         # (n, T, V)
            _sync(target)
            now = time.perf_counter()
            res.target_passes += 1
            # 3.-4. Verify and commit per row, each with its own generator.
            emitted_all, acc_all, kept, keep = [], [], [], []
            for i, b in enumerate(active):
                d = drafts[i]
                m, token = d.accept(logits[i, :d.numel() + 1], verify_round, sampler=sampler, generator=generators[b])
                emitted = (d.accepted(m) + [token])[:max_new_tokens - new[b]]
                if eos_id is not None and eos_id in emitted:
                    emitted = emitted[:emitted.index(eos_id) + 1]
                a = min(m, len(emitted))                              # drafts among the emitted tokens
                ids[b] = torch.cat([ids[b], torch.tensor(emitted, dtype=torch.long)])
                new[b] += len(emitted)
                drafters[b].commit(ids[b], a)
                res.rounds[b].append((a, len(emitted)))
                res.token_times[b].extend([now] * len(emitted))
                emitted_all.append(emitted)
                acc_all.append(a)
                kept.append(int(before[i]) + len(emitted))            # pending + accepted drafts stay cached
                if new[b] < max_new_tokens and emitted[-1] != eos_id:
                    keep.append(i)
            cache.crop(torch.tensor(kept, dtype=torch.long))          # per-row rollback: a pointer move
            if controller is not None:
                controller.update(drafted=block.shape[1] - 1, accepted=acc_all)
            if on_round is not None:
                on_round(list(active), emitted_all, acc_all)
            if len(keep) < n:
                cache.keep(torch.tensor(keep, dtype=torch.long))
                active = [active[i] for i in keep]
        res.outputs = [t.clone() for t in ids]
        return res
