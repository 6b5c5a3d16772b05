"""Beyond (specdec-lab): batched speculative decoding with ragged per-row commits. Provided.

Serving runs B requests at once. Every round each row drafts k tokens, the target verifies
all B x (k+1) positions in ONE forward, and each row keeps its own accepted prefix: row 0
may commit 5 tokens while row 1 commits 1. The rows' committed lengths drift apart, so the
KV cache is ragged: row b's keys and values sit in rows 0 .. lengths[b] - 1 of its buffer.

The cache is module 16's, extended per row: ``g2c.kvcache.RaggedKVCache`` (the same
per-layer K/V buffers (B, H, T_max, d) as ``KVCache``, with a (B,) ``lengths`` tensor in place
of the one ``length`` pointer), and ``g2c.kvcache.ragged_forward`` (module 16's cached
forward with per-row positions and a key-padding mask). What this loop does with it:

- New tokens are right-padded: a row with fewer real tokens than T (ragged prompts in the
  prefill, a drafter that lags one token behind) carries pad ids after its real ones. Row b's
  token t sits at position ``lengths[b] + t`` and reads keys ``0 .. lengths[b] + t`` only
  (``key_padding_mask``: causal within the new block, blind to other rows' extra length).
  ``ragged_forward`` advances every row by T; ``cache.crop(lengths)`` then rolls each row
  back to what it really holds, so pads sit past the pointer, unread, and are overwritten.
- Rollback is per row: after verification, row b keeps ``1 + accepted[b]`` of the k + 1
  rows it wrote (the pending token and its accepted drafts): ``crop`` with a (B,) tensor,
  the ragged form of module 16's pointer rollback (no bytes move).
- Finished rows (budget used up, or end-of-sequence) leave the batch: ``cache.keep(rows)``
  index-selects every buffer down to the active rows.

The window edge (``g2c.specdec.draft_room``, the rule every loop shares): a round drafts
k' = min(k, max_seq_len - longest active context) tokens for every row (the smaller of the
two models' windows), so no row's context is ever cropped; at k' = 0 the round is a plain
step (pending token only, no drafter call). There is no sliding window (like
``batched_greedy``, the plain counterpart): prompt + max_new_tokens may be at most
``max_seq_len + 1`` (the last token's context fills the window), and both loops refuse more.

Output per row is exactly the target's greedy continuation (greedy verification; Leviathan,
Kalman, Matias, ICML 2023, section 2.3), up to float32 round-off in the masked batched
attention (a near-tie between two logits could flip an argmax; the tests check equality).

Shape letters: B batch, T new tokens per row, H heads, d head width, D width, V vocabulary,
k draft length, L layers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from g2c.kvcache.ragged import RaggedKVCache, ragged_forward
from g2c.sampling.generate import as_token_ids
from g2c.sampling.model import (
    as_whole,
    check_count,
    check_eos_id,
    check_language_model,
    check_same_vocab,
    check_whole,
    eval_mode,
)
from g2c.specdec.generate import draft_room

__all__ = ["BatchedResult", "RaggedKV", "batched_greedy", "batched_speculative_generate", "ragged_forward"]


def RaggedKV(model, batch_size: int) -> RaggedKVCache:  # noqa: N802 -- kept public name
    """Kept name of this loop's cache, now module 16's: an empty ``RaggedKVCache`` (the
    ``KVCache`` buffers with per-row lengths) for ``model`` with ``batch_size`` rows."""
    return RaggedKVCache.for_model(model, batch_size)


@dataclass
class BatchedResult:
    """Output of a batched run.

    Attributes:
        outputs: per row, LongTensor (N_b,) on the CPU: the prompt followed by the new tokens.
        rounds: per row, list of (num_accepted, num_emitted) per target pass (speculative)
            or (0, 1) per step (plain).
        token_times: per row, list of ``time.perf_counter()`` stamps, one per emitted
            token (all tokens of one round share the round's stamp).
        start_time: perf_counter stamp taken after the prefill (the first decode step starts).
        target_passes: target forwards after the prefill.
    """

    outputs: list[torch.Tensor]
    rounds: list[list[tuple[int, int]]] = field(default_factory=list)
    token_times: list[list[float]] = field(default_factory=list)
    start_time: float = 0.0
    target_passes: int = 0


def _check(model_list, prompts, max_new_tokens: int) -> list[torch.Tensor]:
    """The checks every other loop makes, per prompt: ``as_token_ids`` (1-D, non-empty,
    integer ids in [0, V): a float prompt is refused, never truncated; -1 is refused, never
    read as the last token), the shared budget check, and one vocabulary for all models."""
    for m in model_list:
        check_language_model(m, "model")
    vocab = model_list[0].vocab_size
    for m in model_list[1:]:
        check_same_vocab(m.vocab_size, vocab)
    max_new_tokens = check_count(max_new_tokens, "max_new_tokens")
    if isinstance(prompts, torch.Tensor) and prompts.dim() == 2:
        prompts = list(prompts)
    if isinstance(prompts, torch.Tensor) and prompts.dim() == 1 or (
            isinstance(prompts, Sequence) and len(prompts) > 0 and all(as_whole(p) is not None for p in prompts)):
        raise ValueError("prompts is one flat sequence of token ids: pass a list of 1-D prompts ([prompt]) or a "
                         "2-D (B, T) tensor")
    if not isinstance(prompts, Sequence) or isinstance(prompts, str) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of 1-D token id sequences")
    out = [as_token_ids(p, f"prompts[{i}]", vocab_size=vocab) for i, p in enumerate(prompts)]
    longest = max(t.numel() for t in out)
    for m in model_list:
        if longest + max_new_tokens > m.max_seq_len + 1:
            raise ValueError(f"longest prompt {longest} + max_new_tokens {max_new_tokens} exceed max_seq_len + 1 = "
                             f"{m.max_seq_len + 1} (the last token's context must fit the window); the batched loop "
                             "has no sliding window: generate fewer tokens")
    return out


def _pad(seqs: list[list[int]], pad: int = 0) -> torch.Tensor:
    width = max(len(s) for s in seqs)
    return torch.tensor([s + [pad] * (width - len(s)) for s in seqs], dtype=torch.long)   # (B, T)


def _sync(model) -> None:
    dev = model.token_embed.weight.device
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    elif dev.type == "mps":
        torch.mps.synchronize()


def _prefill(model, cache: RaggedKVCache, prompts: list[torch.Tensor]) -> None:
    """Cache every prompt token but the last (the last is the first round's input)."""
    body = [p[:-1].tolist() for p in prompts]
    if max(len(b) for b in body) > 0:
        ragged_forward(model, _pad([b or [0] for b in body]), cache)     # every row advances by the width
    cache.crop(torch.tensor([len(b) for b in body], dtype=torch.long))   # per row: drop the pads


@torch.no_grad()
def batched_greedy(model, prompts, max_new_tokens: int, *, eos_id: int | None = None) -> BatchedResult:
    """Plain batched greedy decoding on the ragged cache: one token per row per target step.

    Args:
        model: a ``TransformerLM``.
        prompts: list of B 1-D token id sequences (lists or tensors), lengths may differ.
        max_new_tokens: per-row budget, >= 0.
        eos_id: a row stops right after emitting it.
            None, or an id in [0, V) (``check_eos_id``: ValueError outside it, TypeError for a non-int).

    Returns:
        ``BatchedResult``; outputs[b] equals greedy decoding of prompts[b] alone.

    Raises:
        ValueError: empty prompts, a prompt not 1-D, max_new_tokens < 0, or a prompt +
            budget longer than ``max_seq_len + 1``.
    """
    prompts = _check([model], prompts, max_new_tokens)
    eos_id = check_eos_id(eos_id, model.vocab_size)                # None, or an id the loop can emit
    with eval_mode(model):
        B = len(prompts)
        seqs = [p.tolist() for p in prompts]
        res = BatchedResult(outputs=[], rounds=[[] for _ in range(B)], token_times=[[] for _ in range(B)])
        cache = RaggedKV(model, B)
        _prefill(model, cache, prompts)
        active = [b for b in range(B) if max_new_tokens > 0]
        cache.keep(torch.tensor(active, dtype=torch.long))
        _sync(model)
        res.start_time = time.perf_counter()
        new = [0] * B
        while active:
            last = torch.tensor([[seqs[b][-1]] for b in active], dtype=torch.long)            # (B, 1)
            nxt = ragged_forward(model, last, cache)[:, -1].argmax(dim=-1).cpu()            # (B,)
            _sync(model)
            now = time.perf_counter()
            res.target_passes += 1
            keep = []
            for i, b in enumerate(active):
                tok = int(nxt[i])
                seqs[b].append(tok)
                new[b] += 1
                res.rounds[b].append((0, 1))
                res.token_times[b].append(now)
                if new[b] < max_new_tokens and tok != eos_id:
                    keep.append(i)
            if len(keep) < len(active):
                cache.keep(torch.tensor(keep, dtype=torch.long))
                active = [active[i] for i in keep]
        res.outputs = [torch.tensor(s, dtype=torch.long) for s in seqs]
        return res


@torch.no_grad()
def _controller_k(controller, n: int) -> int:
    """The hook's k for a round of n rows: an int >= 0 from ``controller.next_k(n)`` (a NumPy integer or a 0-d
    integer tensor passes; another type is a TypeError, a negative k a ValueError)."""
    k = controller.next_k(n)
    return check_whole(k, f"controller.next_k({n}) must return an int >= 0 (0 = a plain round), got {k!r}", low=0)


def batched_speculative_generate(target, drafter, prompts, max_new_tokens: int, *, k: int = 4,
                                 eos_id: int | None = None,
                                 on_round: Callable[[list[int], list[list[int]], list[int]], None] | None = None,
                                 controller=None) -> BatchedResult:
    """Greedy speculative decoding of B prompts at once, each row committing its own prefix.

    Each round: the drafter proposes k' tokens for every active row (k' batched drafter
    steps on its own ragged cache), the target scores every row's pending token + draft in
    one (B, k'+1) forward, and row b keeps its accepted prefix plus the target's correction
    or bonus token. Rows finish independently (budget or ``eos_id``) and leave the batch.
    k' = ``g2c.specdec.draft_room(k, longest active context, max_seq_len)``: k until the
    window edge, then less, 0 (a plain step) when a context fills the window.

    Args:
        target, drafter: ``TransformerLM`` models with the same vocabulary.
        prompts: list of B 1-D token id sequences; lengths may differ (ragged).
        max_new_tokens: per-row budget, >= 0; never exceeded.
        k: draft length, int >= 1.
        eos_id: a row stops right after emitting it.
            None, or an id in [0, V) (``check_eos_id``: ValueError outside it, TypeError for a non-int).
        on_round: optional ``on_round(rows, emitted, accepted)`` after each target pass:
            the original indices of the active rows, their emitted ids, and how many of
            those are accepted drafts.
        controller: optional (module specdec-serving's hook): ``controller.next_k(n)`` picks each
            round's k from the n active rows (an int >= 0; 0 = a plain round, no drafter call)
            in place of ``k``, and ``controller.update(drafted=k', accepted=[...])`` hears each
            round's verified acceptances per active row (e.g. ``g2c.specdec.serving.LoadAwareK``).

    Returns:
        ``BatchedResult``: outputs[b] equals greedy decoding of prompts[b] with the target
        alone (``test_batched_speculative_equals_independent_greedy_runs``), for every k up
        to prompt + max_new_tokens = max_seq_len + 1.

    Raises:
        ValueError: k not an int >= 1; vocabularies differ ("vocab_size"); and as
            ``batched_greedy`` (for either model's window).
        TypeError: ``target`` or ``drafter`` is not a language model ("target (...) does not
            satisfy g2c.sampling.LanguageModel", the same for "drafter"; a wrapped
            ``LMDrafter`` is told to pass its ``.model``).
    """
    k = check_whole(k, f"k must be an int >= 1 (draft tokens per round), got {k!r}")
    if controller is not None and not all(callable(getattr(controller, m, None)) for m in ("next_k", "update")):
        raise TypeError(f"controller must have next_k(batch) and update(drafted=, accepted=), got "
                        f"{type(controller).__name__}")
    check_language_model(target, "target")
    check_language_model(drafter, "drafter")
    prompts = _check([target, drafter], prompts, max_new_tokens)       # one vocabulary: check_same_vocab
    eos_id = check_eos_id(eos_id, target.vocab_size)                # None, or an id the loop can emit
    window = min(target.max_seq_len, drafter.max_seq_len)
    with eval_mode(target, drafter):
        B = len(prompts)
        seqs = [p.tolist() for p in prompts]
        res = BatchedResult(outputs=[], rounds=[[] for _ in range(B)], token_times=[[] for _ in range(B)])
        tcache, dcache = RaggedKV(target, B), RaggedKV(drafter, B)
        _prefill(target, tcache, prompts)
        _prefill(drafter, dcache, prompts)
        active = [b for b in range(B) if max_new_tokens > 0]
        rows = torch.tensor(active, dtype=torch.long)
        tcache.keep(rows)
        dcache.keep(rows)
        _sync(target)
        res.start_time = time.perf_counter()
        new = [0] * B
        while active:
            n = len(active)
            k_want = k if controller is None else _controller_k(controller, n)
            kr = draft_room(k_want, max(len(seqs[b]) for b in active), window)               # what fits
            draft = torch.empty(n, kr, dtype=torch.long)                                     # (n, k')
            if kr > 0:
                # 1. Draft: the drafter's cache may lag behind (after a full match its last
                #    draft was never fed back); feed every uncached token, right-padded.
                behind = [seqs[b][int(dcache.lengths[i]):] for i, b in enumerate(active)]  # 1 or 2 ids each
                fed = torch.tensor([len(x) for x in behind])
                logits = ragged_forward(drafter, _pad(behind), dcache)                       # (n, T, V)
                dcache.crop(dcache.lengths - logits.shape[1] + fed)                          # drop the pads
                last_col = fed - 1
                draft[:, 0] = logits[torch.arange(n), last_col.to(logits.device)].argmax(-1).cpu()
                for j in range(1, kr):
                    step = ragged_forward(drafter, draft[:, j - 1:j], dcache)                # (n, 1, V)
                    draft[:, j] = step[:, -1].argmax(-1).cpu()
            # 2. Verify: pending token + k' drafts per row, one target pass.
            block = torch.cat([torch.tensor([[seqs[b][-1]] for b in active]), draft], dim=1)  # (n, k'+1)
            greedy = ragged_forward(target, block, tcache).argmax(-1).cpu()                   # (n, k'+1)
            _sync(target)
            now = time.perf_counter()
            res.target_passes += 1
            # 3. Accept per row: the longest prefix where draft == target's argmax.
            match = (draft == greedy[:, :kr]).long().cumprod(dim=1)                          # (n, k')
            accepted = match.sum(dim=1)                                                      # (n,)
            emitted_all, acc_all, keep = [], [], []
            for i, b in enumerate(active):
                a = int(accepted[i])
                emitted = draft[i, :a].tolist() + [int(greedy[i, a])]
                emitted = emitted[:max_new_tokens - new[b]]
                if eos_id is not None and eos_id in emitted:
                    emitted = emitted[:emitted.index(eos_id) + 1]
                a_emitted = min(a, len(emitted))
                seqs[b].extend(emitted)
                new[b] += len(emitted)
                res.rounds[b].append((a_emitted, len(emitted)))
                res.token_times[b].extend([now] * len(emitted))
                emitted_all.append(emitted)
                acc_all.append(a_emitted)
                if new[b] < max_new_tokens and not (eos_id is not None and emitted[-1] == eos_id):
                    keep.append(i)
            # 4. Ragged commit = per-row pointer rollback (module 16's crop, one length per
            #    row): the target cached pending + k drafts and keeps pending + accepted; the
            #    drafter cached pending + k-1 drafts and keeps what of that is accepted.
            tcache.crop(tcache.lengths - kr + accepted)
            if kr > 0:
                dcache.crop(dcache.lengths - (kr - 1) + torch.clamp(accepted, max=kr - 1))
            if controller is not None:
                controller.update(drafted=kr, accepted=accepted.tolist())
            if on_round is not None:
                on_round(list(active), emitted_all, acc_all)
            if len(keep) < n:
                idx = torch.tensor(keep, dtype=torch.long)
                tcache.keep(idx)
                dcache.keep(idx)
                active = [active[i] for i in keep]
        res.outputs = [torch.tensor(s, dtype=torch.long) for s in seqs]
        return res
