"""Feature-level drafting (EAGLE), and cached drafters that live on the target's states. Provided.

A small LM drafts from tokens alone. The target, though, has already computed something
richer than tokens for every committed position: its final state h_t, the vector its
unembedding turns into logits. EAGLE (Li, Wei, Zhang, Zhang, "EAGLE: Speculative Sampling
Requires Rethinking Feature Uncertainty", ICML 2024) drafts in that feature space:

    x_t   = fuse([h_t ; LN(E[token_{t+1}])])      Linear(2D, D)    (§4.1: the feature and the
    h'_t+1 = Block(x)_t                           one causal block   token one step ahead, so
    logits = h'_t+1 E^T                           the target's own  the sampled token settles
                                                  tied unembedding  the feature's uncertainty)

and then feeds its own predicted feature back in for the next step, k times (§4.1,
"autoregressively in feature space"). Only the fuse layer and the block are trained; the
embedding table E and the unembedding are the frozen target's. Training (§4.2): on the
frozen target's features, a regression loss SmoothL1(h'_t+1, h_t+1) plus w_cls = 0.1 times
the cross-entropy between the target's next-token distribution and the drafter's, with
uniform noise U(-0.1, 0.1) added to the input features (§4.2, "data augmentation") so that
the drafter learns to continue from its own slightly-off predictions.

This file holds:

``FeatureDrafter``
    The module above (``forward(features, next_ids) -> predicted features``, ``logits``).
``EagleDrafter``
    A ``FeatureDrafter`` behind the drafter protocol of ``g2c.specdec.sampling.drafters``, with its
    own one-layer ``KVCache``: after each target pass it appends the target's TRUE states of
    the newly committed positions (``commit``), drafts k tokens by feeding its predicted
    features (``propose``), and rolls its speculative rows back at the next ``commit``.
``MTPDrafter``
    The course's one MTP drafter: the same cache discipline for an ``MTPHead`` (one draft per
    round: its output is a token distribution, not a feature it could feed back). It also
    serves an uncached target, so there is no second, window-recomputing MTP drafter.

Both read ``("final_state",)``: they keep their own state and need only the states of positions
committed since their last ``commit``, so ``speculative_sample(..., use_cache=True)`` serves them
from a cached target pass (the states of the scored rows) instead of a full window recompute.

Shape letters: B batch, T time, D width, V vocabulary, k draft length.
"""

from __future__ import annotations

import torch

from g2c.kvcache import KVCache
from g2c.kvcache.fast import head_unembed
from g2c.kvcache.step import block_rows
from g2c.nn import LayerNorm, Linear, Module
from g2c.sampling.model import check_base_model, check_flag
from g2c.transformer import Block

from ..mtp import MTPHead
from .draft import Draft
from .drafters import Drafter, Sampler

__all__ = ["EagleDrafter", "FeatureDrafter", "MTPDrafter", "eagle_loss"]


def _embed_next(head, hidden: torch.Tensor, next_token_ids: torch.Tensor) -> torch.Tensor:
    """fuse([h ; LN(E[next])]) for a ``FeatureDrafter`` or an ``MTPHead`` (same input layers)."""
    table = head.base.token_embed.weight.detach()                               # (V, D)
    emb = head.ln_embed(table[next_token_ids.to(table.device)])                # (B, T, D)
    return head.fuse(torch.cat([hidden.detach(), emb], dim=-1))                 # (B, T, D)


class FeatureDrafter(Module):
    """EAGLE's draft head on a frozen base ``TransformerLM`` (Li et al. 2024, §4.1).

    Args:
        base: the frozen target (its ``token_embed.weight`` is both the embedding and the
            tied unembedding). Kept in a dict, like ``MTPHead``'s base, so ``parameters()``,
            ``state_dict()``, ``to()`` and ``train()`` touch only the head.
        generator: optional ``torch.Generator`` for the initialisation.

    Attributes:
        ln_embed: ``LayerNorm(D)`` on the next token's embedding (the target's states are
            already normalised by its ``ln_final``; the raw embeddings are not).
        fuse: ``Linear(2D, D)``; block: one causal ``Block(D, H, hidden_dim=base.hidden_dim)``.
    """

    def __init__(self, base, *, generator: torch.Generator | None = None) -> None:
        check_base_model(base, type(self).__name__, generator)   # a TypeError naming what is missing
        super().__init__()
        self._frozen = {"base": base}
        dim = base.embedding_dim
        self.ln_embed = LayerNorm(dim)
        self.fuse = Linear(2 * dim, dim, generator=generator)
        self.block = Block(dim, base.num_heads, hidden_dim=base.hidden_dim, causal=True, generator=generator)
        self.to(base.token_embed.weight.device, base.token_embed.weight.dtype)   # the base's device and dtype

    @property
    def base(self):
        """The frozen target."""
        return self._frozen["base"]

    def embed_next(self, hidden: torch.Tensor, next_token_ids: torch.Tensor) -> torch.Tensor:
        """The block's input: fuse([h ; LN(E[next])]), (B, T, D) from hidden (B, T, D) and ids (B, T)."""
        return _embed_next(self, hidden, next_token_ids)

    def forward(self, hidden: torch.Tensor, next_token_ids: torch.Tensor) -> torch.Tensor:
        """Predicted next features.

        Args:
            hidden: (B, T, D) float32, the target's final states h_t (or earlier predictions).
            next_token_ids: (B, T) int64, token t+1 for each position t.

        Returns:
            (B, T, D) float32 on the head's device: row t predicts h_{t+1}; ``logits`` of it
            scores token t+2.

        Raises:
            ValueError: hidden is not (B, T, D) with the base's D, or ids not (B, T) integers in
                [0, V).
        """
        if hidden.dim() != 3 or hidden.shape[-1] != self.base.embedding_dim \
                or tuple(next_token_ids.shape) != tuple(hidden.shape[:2]):
            raise ValueError(f"FeatureDrafter expects hidden (B, T, D={self.base.embedding_dim}) and "
                             f"next_token_ids (B, T); got {tuple(hidden.shape)} and {tuple(next_token_ids.shape)}")
        if next_token_ids.dtype.is_floating_point or next_token_ids.dtype == torch.bool or (
                next_token_ids.numel() and not 0 <= int(next_token_ids.min()) <= int(next_token_ids.max())
                < self.base.vocab_size):
            raise ValueError(f"FeatureDrafter: next_token_ids must be integer ids in [0, {self.base.vocab_size})")
        return self.block(self.embed_next(hidden, next_token_ids))

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """(..., D) features -> (..., V) logits through the target's tied unembedding."""
        return head_unembed(self, features)


def eagle_loss(head: FeatureDrafter, states: torch.Tensor, ids: torch.Tensor, *, w_cls: float = 0.1,
               noise: float = 0.1, generator: torch.Generator | None = None,
               feature_inputs: bool = True) -> dict[str, torch.Tensor]:
    """EAGLE's training loss on a batch of the frozen target's states (Li et al. 2024, §4.2).

    Args:
        head: the ``FeatureDrafter``.
        states: (B, T, D) float32, the target's final states over windows ``ids``.
        ids: (B, T) int64, the windows' tokens, T >= 3.
        w_cls: weight of the classification term (the paper's 0.1).
        noise: half-width of the uniform noise added to the input states (the paper's 0.1);
            0 turns it off (evaluation).
        generator: for the noise.
        feature_inputs: False trains the same head on TOKENS ONLY (the lineage ablation of EAGLE's
            feature conditioning): zeros stand in for the input states h_t, so the head is a
            one-block causal LM over the token embeddings; its targets (h_{t+1} and the target's
            next-token distribution) are unchanged. Such a head is measured by its agreement, not
            served (``load_model`` refuses it).

    Raises:
        ValueError: ids not (B, T) with T >= 3, or states not (B, T, D).
        TypeError: feature_inputs not a bool.

    Returns:
        dict of scalars: ``loss`` = ``reg`` + w_cls * ``cls``; ``reg`` SmoothL1 between the
        predicted and true h_{t+1}; ``cls`` cross-entropy of the drafter's next-token
        distribution against the target's (soft labels); ``agree`` the fraction of
        positions where the drafter's argmax equals the target's (greedy acceptance of the
        first draft).
    """
    if ids.dim() != 2 or ids.shape[1] < 3 or tuple(states.shape[:2]) != tuple(ids.shape):
        raise ValueError(f"eagle_loss needs ids (B, T) with T >= 3 (a state two ahead) and states (B, T, D); "
                         f"got ids {tuple(ids.shape)} and states {tuple(states.shape)}")
    if not isinstance(feature_inputs, bool):              # "False" or [False] would be true: never guess
        raise TypeError(f"eagle_loss: feature_inputs must be True or False, got {feature_inputs!r}")
    inputs = states[:, :-2]                                                       # h_t, t = 0..T-3
    if not feature_inputs:                                                        # the tokens-only ablation
        inputs = torch.zeros_like(inputs)
    elif noise > 0:
        u = torch.rand(inputs.shape, generator=generator, device="cpu").to(inputs.device)
        inputs = inputs + (2 * u - 1) * noise
    pred = head(inputs, ids[:, 1:-1])                                            # (B, T-2, D): predicts h_{t+1}
    true = states[:, 1:-1]                                                        # (B, T-2, D)
    reg = torch.nn.functional.smooth_l1_loss(pred, true)
    draft_logp = torch.log_softmax(head.logits(pred).float(), dim=-1)            # (B, T-2, V)
    with torch.no_grad():
        target_logits = head.logits(true).float()
        target_p = torch.softmax(target_logits, dim=-1)
    cls = -(target_p * draft_logp).sum(-1).mean()
    agree = (draft_logp.argmax(-1) == target_logits.argmax(-1)).float().mean()
    return {"loss": reg + w_cls * cls, "reg": reg, "cls": cls, "agree": agree}


class _CachedHeadDrafter(Drafter):
    """Shared machinery: a one-block head over the target's committed states, with its own
    one-layer KV cache. Row j of the cache holds position ``start + j``'s input
    (h_t, token t+1): TRUE states for the committed rows, then (during ``propose``)
    speculative rows that the next ``commit`` crops away."""

    reads = ("final_state",)
    max_draft: int | None = None

    head_type: type | None = None     # the head class a subclass serves (checked at construction)
    head_kind = ""                    # "a FeatureDrafter": how the TypeError names it
    head_hint = ""                    # which drafter serves the other kinds of model

    def __init__(self, head=None, *extra, sample: bool = False) -> None:
        if extra:
            raise TypeError(f"{type(self).__name__}(head, sample=...) takes one model, the head; sample is "
                            f"keyword-only (got {1 + len(extra)} positional arguments)")
        if self.head_type is not None and not isinstance(head, self.head_type):
            raise TypeError(f"{type(self).__name__} needs {self.head_kind} (e.g. from load_model), "
                            f"got {type(head).__name__}; {self.head_hint}")
        self.head = head
        self.sample = check_flag(sample, f"{type(self).__name__} sample")
        base = head.base
        self.vocab_size = base.vocab_size
        self.window = base.max_seq_len
        self.sampler = Sampler(0.0)
        self.generator = None
        weight = base.token_embed.weight
        self.cache = KVCache(1, 1, base.num_heads, base.embedding_dim // base.num_heads, self.window,
                             dtype=weight.dtype, device=weight.device)
        self._reset()

    def _reset(self) -> None:
        self.cache.reset()
        self._states = torch.zeros(0, self.head.base.embedding_dim)   # recent TRUE states, on the CPU
        self._fed = 0           # positions 0.._fed-1 have their true state in _states / the cache
        self._start = 0         # position of cache row 0
        self._true_rows = 0     # cache rows holding true states (the rest are speculative)
        self._out = None        # (context length, last block output (D,)) ready for propose

    def start(self, prompt_ids: torch.Tensor, *, sampler: Sampler, generator: torch.Generator | None) -> None:
        super().start(prompt_ids, sampler=sampler, generator=generator)
        self._reset()

    def _run(self, hidden: torch.Tensor, next_ids: torch.Tensor) -> torch.Tensor:
        """Feed rows (L, D) + (L,) through the cached block; the block's outputs (L, D)."""
        device = self.cache.device
        hidden = hidden.to(device=device, dtype=self.cache.dtype).unsqueeze(0)                     # (1, L, D)
        x = _embed_next(self.head, hidden, next_ids.to(device).unsqueeze(0))                        # (1, L, D)
        y = block_rows(self.head.block, x, self.cache, 0)          # fused on a fast head, else cached_block
        self.cache.advance(x.shape[1])
        return y[0]

    def _refill(self, context_ids: torch.Tensor, keep: int) -> torch.Tensor:
        """Empty the cache and re-feed the last ``keep`` true rows; the last output (D,)."""
        keep = max(1, min(keep, self._states.shape[0]))
        self.cache.reset()
        self._start = self._fed - keep
        out = self._run(self._states[-keep:], context_ids[self._start + 1:self._fed + 1])
        self._true_rows = keep
        return out[-1]

    @torch.no_grad()
    def commit(self, context_ids: torch.Tensor, num_accepted: int, *,
               target_hidden: torch.Tensor | None = None) -> None:
        self._out = None
        length = len(context_ids)
        new = length - 1 - self._fed                           # positions whose true state arrived
        if target_hidden is None or new < 1:
            return
        if target_hidden.dim() != 2 or target_hidden.shape[-1] != self.head.base.embedding_dim:
            raise ValueError(f"{type(self).__name__}: the target's states have shape {tuple(target_hidden.shape)}, "
                             f"but the head reads (L, D={self.head.base.embedding_dim}) states of its own base; "
                             "verify with the head's base (head.base) as the target")
        rows = target_hidden.float().cpu()
        if rows.shape[0] < new:                                 # older states lost: restart from these rows
            self._reset()
            self._fed = length - 1 - rows.shape[0]
            self._start = self._fed
            new = rows.shape[0]
        fresh = rows[-new:]                                      # (new, D)
        self._states = torch.cat([self._states, fresh])[-self.window:]
        first = self._fed
        self._fed = length - 1
        self.cache.crop(self._true_rows)                        # roll back the speculative rows
        if self._true_rows + new > self.window - 8:             # keep room for drafting: re-prefill
            out = self._refill(context_ids, self.window // 2)
        else:
            out = self._run(fresh, context_ids[first + 1:length])[-1]
            self._true_rows += new
        self._out = (length, out)

    @torch.no_grad()
    def propose(self, context_ids: torch.Tensor, k: int) -> Draft:
        if self._out is None or self._out[0] != len(context_ids):
            return Draft.empty()
        k = min(k, self.window // 2) if self.max_draft is None else min(k, self.max_draft)   # room after a refill
        if self._true_rows + k > self.window:
            self._out = (len(context_ids), self._refill(context_ids, self.window // 2))
        return self._draft(self._out[1], k)

    def _draft(self, out: torch.Tensor, k: int) -> Draft:
        raise NotImplementedError


class EagleDrafter(_CachedHeadDrafter):
    """EAGLE drafting: k tokens per round, autoregressive in the target's feature space.

    Drafts at most ``max_seq_len // 2`` tokens per round (128 on the ladder): its cache must
    hold the re-prefilled half window plus the k - 1 speculative rows.

    Args:
        head: a trained ``FeatureDrafter`` whose base is the target the loop verifies with
            (``load_model("StoryLM-30M-EAGLE")`` returns one).
        sample: False drafts the argmax of each step (q one-hot); True samples from the
            warped drafter distribution and returns the q rows (the loop's ``Sampler``).

    Protocol (``g2c.specdec.sampling.drafters``): ``reads = ("final_state",)``, so the loop hands
    ``commit`` the target's states of the positions committed
    in that round (cached target) or of the whole window (uncached target); either way the
    drafter appends only the rows it has not seen. The first ``propose`` of a sequence, before
    any target pass, returns an empty draft.
    """

    head_type = FeatureDrafter
    head_kind = "a FeatureDrafter"
    head_hint = "an MTPHead drafts with MTPDrafter, a language model with LMDrafter"

    def __repr__(self) -> str:
        return f"EagleDrafter(sample={self.sample})"

    def _draft(self, out: torch.Tensor, k: int) -> Draft:
        tokens, rows = [], []
        feature = out                                                            # (D,) predicted h
        for step in range(k):
            token, q = self._choose(self.head.logits(feature).float())
            tokens.append(token)
            rows.append(q)
            if step < k - 1:                                                     # feed (h', token): next feature
                feature = self._run(feature.unsqueeze(0), torch.tensor([token]))[-1]
        return Draft(torch.tensor(tokens, dtype=torch.long), None if rows[0] is None else torch.stack(rows))


class MTPDrafter(_CachedHeadDrafter):
    """Self-speculation: an ``MTPHead`` on the target drafts one token per round. Provided.

    The head predicts token t+2 from the target's state h_t and token t+1 (Gloeckle et al.
    2024, §3.2). The loop hands this drafter the target's states from each verification pass
    (``reads = ("final_state",)``), so after a pass that committed context ... x_t, x_{t+1} the head
    already has h_t and x_{t+1}: its guess for the next position costs one head block over the
    newly committed rows (its own one-layer KV cache holds the earlier ones), no trunk pass.
    Before the first target pass there are no states yet, so the first ``propose`` returns an
    empty draft (k' = 0) and the target makes that token alone. k is capped at 1: the head's
    output is a token distribution, not a feature it could feed back.

    It serves a cached target (``speculative_sample(..., use_cache=True)``, which hands it the
    states of the rows each pass committed) and a recomputing one (the whole window's states;
    it reads only the rows it has not seen). Its guesses are those of ``g2c.specdec.mtp_propose``
    on the committed context until its own cache fills: 8 rows before the window's end it
    re-prefills the last half window of states it was given, and from then on the head sees that
    half (its q rows may then differ slightly from a full-window ``mtp_propose``; the output
    stays the target's, as for any drafter).

    Args:
        head: an ``MTPHead`` whose base is the target the loop verifies with
            (``load_model("StoryLM-30M-MTP")`` returns one).
        sample: False drafts the head's argmax (q one-hot); True samples from the head's
            warped distribution and returns that q row (the loop's ``Sampler``).

    Raises:
        TypeError: ``head`` is not an ``MTPHead`` ("MTPDrafter needs an MTPHead"), e.g. an EAGLE
            ``FeatureDrafter`` (use ``EagleDrafter``) or a plain LM (use ``LMDrafter``); ``sample``
            is not a bool ("MTPDrafter sample must be True or False").
    """

    max_draft = 1
    head_type = MTPHead
    head_kind = "an MTPHead"
    head_hint = "an EAGLE FeatureDrafter drafts with EagleDrafter, a language model with LMDrafter"

    def __repr__(self) -> str:
        return f"MTPDrafter(sample={self.sample})"

    def _draft(self, out: torch.Tensor, k: int) -> Draft:
        logits = (head_unembed(self.head, self.head.ln_final(out)) + self.head.bias).float()   # (V,)
        token, q = self._choose(logits)
        return Draft(torch.tensor([token]), None if q is None else q.view(1, -1))
