"""Beyond (specdec-lab): batched speculative decoding with ragged per-row commits. Provided.

Serving runs B requests at once. Every round each row drafts k tokens, the target verifies
all B x (k+1) positions in ONE forward, and each row keeps its own accepted prefix: row 0
may commit 5 tokens while row 1 commits 1. The rows' committed lengths drift apart, so the
KV cache is ragged: row b's keys and values sit in rows 0 .. lengths[b] - 1 of its buffer.

Layout and masks (what this file does instead of one shared length pointer):

- ``RaggedKV`` holds per layer K and V buffers (B, H, T_max, d) and ``lengths`` (B,) int64:
  the committed rows of each batch row. A forward over T new tokens per row writes them at
  rows lengths[b] .. lengths[b] + T - 1 of row b (positions are per row, so the learned
  position of new token t in row b is lengths[b] + t).
- New tokens are right-padded: a row with fewer real tokens than T (ragged prompts in the
  prefill, a drafter that lags one token behind) carries pad ids after its real ones. Pads
  are written into the cache too, but past what the caller commits, so they are never
  attended to: query t of row b sees exactly keys 0 .. lengths[b] + t (a key-padding mask
  ``j <= lengths[b] + t`` that is causal within the new block), and the next write overwrites them.
- Rollback is per row: after verification, row b commits ``1 + accepted[b]`` of the k + 1
  rows it wrote (the pending token and its accepted drafts); the rejected rows are simply
  left past ``lengths[b]`` (the ragged form of module 16's pointer crop).
- Finished rows (budget used up, or end-of-sequence) leave the batch: every buffer is
  index-selected down to the active rows.

The loop runs on a course ``TransformerLM`` and calls its own sub-modules (LayerNorm, the
attention's ``qkv``/``proj`` Linears, the MLP); only the masked attention over the ragged
cache is written here. No sliding window: prompt + max_new_tokens + k + 1 must fit in the
target's and drafter's ``max_seq_len``.

Output per row is exactly the target's greedy continuation (greedy verification; Leviathan,
Kalman, Matias, ICML 2023, section 2.3), up to float32 round-off in the masked batched
attention (a near-tie between two logits could flip an argmax; the tests check equality).

Shape letters: B batch, T new tokens per row, H heads, d head width, D width, V vocabulary,
k draft length, L layers.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from g2c.attention import merge_heads, split_heads

__all__ = ["BatchedResult", "RaggedKV", "batched_greedy", "batched_speculative_generate", "ragged_forward"]


class RaggedKV:
    """Per-layer K/V buffers (B, H, T_max, d) with a committed length per batch row.

    Attributes:
        keys, values: lists of L float tensors (B, H, T_max, d) on the model's device.
        lengths: (B,) int64 on the CPU, committed rows per batch row.
    """

    def __init__(self, model, batch_size: int) -> None:
        d = model.embedding_dim // model.num_heads
        w = model.token_embed.weight
        shape = (batch_size, model.num_heads, model.max_seq_len, d)
        self.keys = [torch.zeros(shape, dtype=w.dtype, device=w.device) for _ in model.blocks]
        self.values = [torch.zeros(shape, dtype=w.dtype, device=w.device) for _ in model.blocks]
        self.lengths = torch.zeros(batch_size, dtype=torch.long)
        self.max_seq_len = model.max_seq_len

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only the batch rows ``rows`` (LongTensor of indices), in that order."""
        dev = self.keys[0].device
        idx = rows.to(dev)
        self.keys = [t.index_select(0, idx) for t in self.keys]
        self.values = [t.index_select(0, idx) for t in self.values]
        self.lengths = self.lengths.index_select(0, rows.cpu())


def _attend_ragged(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """q (B, H, T, d) over keys/values (B, H, S, d); query t of row b sees keys j <= starts[b] + t."""
    B, _, T, d = q.shape
    S = keys.shape[2]
    limit = starts.to(q.device).view(B, 1) + torch.arange(T, device=q.device).view(1, T)      # (B, T)
    visible = torch.arange(S, device=q.device).view(1, 1, S) <= limit.unsqueeze(-1)          # (B, T, S)
    scores = (q @ keys.transpose(-2, -1)) / math.sqrt(d)                                     # (B, H, T, S)
    scores = scores.masked_fill(~visible.unsqueeze(1), float("-inf"))
    return scores.softmax(dim=-1) @ values                                                   # (B, H, T, d)


@torch.no_grad()
def ragged_forward(model, ids: torch.Tensor, cache: RaggedKV) -> torch.Tensor:
    """Score T new tokens per row after each row's committed cache rows; write their K/V.

    Args:
        model: a ``g2c.transformer.TransformerLM`` in eval mode.
        ids: (B, T) int64 on any device, row b's new tokens (right-padded where ragged).
        cache: the rows' ``RaggedKV``; ``lengths`` is NOT advanced (the caller commits).

    Returns:
        logits (B, T, V) float32 on the model's device: row t scores the token after new token t.

    Raises:
        ValueError: B differs from the cache's, or lengths[b] + T passes ``max_seq_len``
            (no sliding window here: shorten the prompt or the budget).
    """
    B, T = ids.shape
    if B != cache.lengths.numel():
        raise ValueError(f"ragged_forward: ids has {B} rows but the cache {cache.lengths.numel()}")
    starts = cache.lengths
    if int(starts.max()) + T > cache.max_seq_len:
        raise ValueError(f"ragged_forward: {int(starts.max())} cached + {T} new positions exceed "
                         f"max_seq_len={cache.max_seq_len}; shorten the prompt or max_new_tokens")
    dev = model.token_embed.weight.device
    ids = ids.to(dev)
    pos = starts.to(dev).view(B, 1) + torch.arange(T, device=dev).view(1, T)                # (B, T)
    x = model.token_embed.weight[ids] + model.pos_embed.weight[pos]                          # (B, T, D)
    S = int(starts.max()) + T
    rows = torch.arange(B, device=dev).view(B, 1)                                            # (B, 1)
    for layer, blk in enumerate(model.blocks):
        h = blk.ln_1(x)
        q, k, v = blk.attn.qkv(h).split(model.embedding_dim, dim=-1)                         # (B, T, D) each
        q, k, v = (split_heads(t, model.num_heads) for t in (q, k, v))                       # (B, H, T, d)
        kb, vb = cache.keys[layer], cache.values[layer]
        kb[rows, :, pos] = k.transpose(1, 2)                                                 # (B, T, H, d) rows
        vb[rows, :, pos] = v.transpose(1, 2)
        y = _attend_ragged(q, kb[:, :, :S], vb[:, :, :S], starts)                           # (B, H, T, d)
        x = x + blk.attn.proj(merge_heads(y))
        x = x + blk.mlp(blk.ln_2(x))
    return model.unembed(model.ln_final(x))                                                  # (B, T, V)


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


def _check(model_list, prompts, max_new_tokens: int, extra: int) -> list[torch.Tensor]:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if not isinstance(prompts, Sequence) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of 1-D token id sequences")
    out = []
    for i, p in enumerate(prompts):
        t = torch.as_tensor(p, dtype=torch.long).cpu()
        if t.dim() != 1 or t.numel() == 0:
            raise ValueError(f"prompts[{i}] must be a non-empty 1-D sequence of token ids, got shape {tuple(t.shape)}")
        out.append(t)
    longest = max(t.numel() for t in out)
    for m in model_list:
        if longest + max_new_tokens + extra > m.max_seq_len:
            raise ValueError(f"longest prompt {longest} + max_new_tokens {max_new_tokens} + {extra} verify rows "
                             f"exceed max_seq_len={m.max_seq_len}; the batched loop has no sliding window")
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


def _prefill(model, cache: RaggedKV, prompts: list[torch.Tensor]) -> None:
    """Cache every prompt token but the last (the last is the first round's input)."""
    body = [p[:-1].tolist() for p in prompts]
    if max(len(b) for b in body) > 0:
        ragged_forward(model, _pad([b or [0] for b in body]), cache)
    cache.lengths = torch.tensor([len(b) for b in body], dtype=torch.long)


@torch.no_grad()
def batched_greedy(model, prompts, max_new_tokens: int, *, eos_id: int | None = None) -> BatchedResult:
    """Plain batched greedy decoding on the ragged cache: one token per row per target step.

    Args:
        model: a ``TransformerLM``.
        prompts: list of B 1-D token id sequences (lists or tensors), lengths may differ.
        max_new_tokens: per-row budget, >= 0.
        eos_id: a row stops right after emitting it.

    Returns:
        ``BatchedResult``; outputs[b] equals greedy decoding of prompts[b] alone.

    Raises:
        ValueError: empty prompts, a prompt not 1-D, max_new_tokens < 0, or a prompt +
            budget longer than ``max_seq_len``.
    """
    prompts = _check([model], prompts, max_new_tokens, 1)
    mode = model.training
    model.eval()
    try:
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
            cache.lengths += 1
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
    finally:
        model.train(mode)


@torch.no_grad()
def batched_speculative_generate(target, drafter, prompts, max_new_tokens: int, *, k: int = 4,
                                 eos_id: int | None = None,
                                 on_round: Callable[[list[int], list[list[int]], list[int]], None] | None = None,
                                 ) -> BatchedResult:
    """Greedy speculative decoding of B prompts at once, each row committing its own prefix.

    Each round: the drafter proposes k tokens for every active row (k batched drafter
    steps on its own ragged cache), the target scores every row's pending token + draft in
    one (B, k+1) forward, and row b keeps its accepted prefix plus the target's correction
    or bonus token. Rows finish independently (budget or ``eos_id``) and leave the batch.

    Args:
        target, drafter: ``TransformerLM`` models with the same vocabulary.
        prompts: list of B 1-D token id sequences; lengths may differ (ragged).
        max_new_tokens: per-row budget, >= 0; never exceeded.
        k: draft length, int >= 1.
        eos_id: a row stops right after emitting it.
        on_round: optional ``on_round(rows, emitted, accepted)`` after each target pass:
            the original indices of the active rows, their emitted ids, and how many of
            those are accepted drafts.

    Returns:
        ``BatchedResult``: outputs[b] equals greedy decoding of prompts[b] with the target
        alone (``test_batched_speculative_equals_independent_greedy_runs``).

    Raises:
        ValueError: k not an int >= 1; vocabularies differ ("vocab_size"); and as
            ``batched_greedy``.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1 (draft tokens per round), got {k!r}")
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(f"drafter vocab_size {drafter.vocab_size} differs from target vocab_size "
                         f"{target.vocab_size}; both must use the same tokenizer")
    prompts = _check([target, drafter], prompts, max_new_tokens, k + 1)
    modes = (target.training, drafter.training)
    target.eval()
    drafter.eval()
    try:
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
            # 1. Draft: the drafter's cache may lag one token behind (after a full match its
            #    last draft was never fed back); feed every uncached token, right-padded.
            behind = [seqs[b][int(dcache.lengths[i]):] for i, b in enumerate(active)]     # 1 or 2 ids each
            logits = ragged_forward(drafter, _pad(behind), dcache)                           # (n, T, V)
            last_col = torch.tensor([len(x) - 1 for x in behind])
            dcache.lengths += torch.tensor([len(x) for x in behind])
            draft = torch.empty(n, k, dtype=torch.long)                                      # (n, k)
            draft[:, 0] = logits[torch.arange(n), last_col.to(logits.device)].argmax(-1).cpu()
            for j in range(1, k):
                step = ragged_forward(drafter, draft[:, j - 1:j], dcache)                    # (n, 1, V)
                dcache.lengths += 1
                draft[:, j] = step[:, -1].argmax(-1).cpu()
            # 2. Verify: pending token + k drafts per row, one target pass.
            block = torch.cat([torch.tensor([[seqs[b][-1]] for b in active]), draft], dim=1)  # (n, k+1)
            greedy = ragged_forward(target, block, tcache).argmax(-1).cpu()                   # (n, k+1)
            _sync(target)
            now = time.perf_counter()
            res.target_passes += 1
            # 3. Accept per row: the longest prefix where draft == target's argmax.
            match = (draft == greedy[:, :k]).long().cumprod(dim=1)                           # (n, k)
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
            # 4. Ragged commit (rollback of the rejected rows is just not committing them):
            #    the target cached pending + k drafts, keeps pending + accepted; the drafter
            #    cached pending + k-1 drafts, keeps what of that is accepted.
            tcache.lengths += 1 + accepted
            dcache.lengths -= (k - 1) - torch.clamp(accepted, max=k - 1)
            if on_round is not None:
                on_round(list(active), emitted_all, acc_all)
            if len(keep) < n:
                idx = torch.tensor(keep, dtype=torch.long)
                tcache.keep(idx)
                dcache.keep(idx)
                active = [active[i] for i in keep]
        res.outputs = [torch.tensor(s, dtype=torch.long) for s in seqs]
        return res
    finally:
        target.train(modes[0])
        drafter.train(modes[1])
