"""Beyond (specdec-lineage): the base class of the state-reading drafters, and two helpers. Provided.

``TreeDrafter`` is the engine's drafter protocol (``g2c.specdec.sampling.drafters``) for every drafter
that reads the target's states: its three verbs are written once, here, and a drafter writes
``read_prefill`` / ``draft`` / ``read_commit``. ``chain_tree`` (specdec-trees, re-exported) turns a
chain into a ``DraftTree``; ``masked_block`` runs a module 09 block under any attention mask (tree
rows, the training-time-test mask of EAGLE-3, the block drafter's context-plus-slots mask).

Shape letters: B batch, T time, S keys, D width.
"""

from __future__ import annotations

import time

import torch

from g2c.attention.multihead import merge_heads, split_heads
from g2c.kvcache import KVCache
from g2c.kvcache.ragged import masked_cached_attention
from g2c.kvcache.step import block_rows, block_step
from g2c.nn import Module, synchronize
from g2c.sampling.model import check_base_model

from ..generate import draft_room
from ..sampling.drafters import Drafter
from ..trees import DraftTree, chain_tree

__all__ = ["DRAFT_MODES", "HeadOnBase", "TreeDrafter", "chain_tree", "check_draft_mode", "masked_block",
           "masked_block_past"]


def masked_block_past(blk, x: torch.Tensor, allowed: torch.Tensor,
                      past: tuple[torch.Tensor, torch.Tensor] | None = None
                      ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """``masked_block`` whose new rows also read earlier rows' keys/values, kept with gradients. Provided.

    For unrolled training (EAGLE-3's training-time test): each step adds rows that attend to every
    earlier step's rows without recomputing them.

    Args:
        blk: a ``g2c.transformer.Block``.
        x: (B, T, D) new rows.
        allowed: bool broadcastable to (B, H, T, P + T): P earlier rows (``past``) first.
        past: (keys, values), each (B, H, P, d), from an earlier call, or None.

    Returns:
        (y (B, T, D), (keys, values) (B, H, P + T, d)) to pass to the next call.
    """
    attn = blk.attn
    q, k, v = (split_heads(t, attn.num_heads) for t in attn.qkv(blk.ln_1(x)).split(attn.dim, dim=-1))  # (B, H, T, d)
    if past is not None:
        k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
    a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed.to(x.device))
    x = x + attn.proj(merge_heads(a))
    return x + blk.mlp(blk.ln_2(x)), (k, v)


def masked_block(blk, x: torch.Tensor, allowed: torch.Tensor, cache: KVCache | None = None) -> torch.Tensor:
    """A module 09 pre-norm ``Block`` with an explicit attention mask. Provided.

    Args:
        blk: a ``g2c.transformer.Block``.
        x: (B, T, D) new rows.
        allowed: bool, broadcastable to (B, H, T, S): True where query row t may read key s (moved to
            x's device).
            Without a cache S = T (the rows attend among themselves); with a cache
            S = ``cache.length + T`` (the cached rows first) and the new keys/values are written
            at rows ``length ..`` (layer 0) without moving the pointer.
        cache: optional one-layer ``KVCache`` of the block.

    Returns:
        (B, T, D) on x's device. Every query row needs at least one allowed key.
    """
    if block_step(blk) is not None:                # a fast head's block: module 16's fused step
        return block_rows(blk, x, cache, allowed=allowed)
    if cache is None:
        return masked_block_past(blk, x, allowed)[0]
    x = x + masked_cached_attention(blk.attn, blk.ln_1(x), cache, 0, allowed.to(x.device))
    return x + blk.mlp(blk.ln_2(x))


DRAFT_MODES = ("top", "sample")


def check_draft_mode(draft_mode, who: str) -> str:
    """``draft_mode`` must be "top" (the drafter's top ranks) or "sample" (drawn from its q). Provided."""
    if not isinstance(draft_mode, str) or draft_mode not in DRAFT_MODES:             # a wrong type: TypeError
        raise (ValueError if isinstance(draft_mode, str) else TypeError)(
            f"{who}: draft_mode must be 'top' (the drafter's top ranks, deterministic) or 'sample' (children drawn "
            f"without replacement from its q at T > 0), got {draft_mode!r}")
    return draft_mode


class TreeDrafter(Drafter):
    """The base class of every drafter that reads the target's states (Medusa, EAGLE/EAGLE-2, EAGLE-3, the
    block drafter): the engine's ONE drafter protocol (``g2c.specdec.sampling.drafters.Drafter``), with
    its three verbs written here once for all of them. Provided.

    A subclass has no ``__init__`` to call; it sets ``vocab_size`` (an int, the target's: required),
    ``target_layers`` (a tuple of block indices, ``()`` for the final state only), and, if it has
    weights, ``base`` (the model they were trained on: any other target is refused) and ``head`` (put
    in eval mode for a run). It writes what differs between drafters, three hooks (only ``draft`` is
    required; the other two do nothing by default):

    ``read_prefill(context_ids, states)``
        A (re)start on the target's prefill: ``context_ids`` (T,) int64 CPU is the target's visible
        context (the committed text from ``start_pos``, the first position in the target's window);
        ``states`` (T - 1, len(target_layers) + 1, D) float32 holds, for every position but the
        newest, the chosen blocks' outputs (the residual stream after block i, before the final
        LayerNorm) then, last, the final state (after the final LayerNorm: what the target's
        unembedding reads, ``hidden_states``). Row t belongs to token t and predicts token t + 1, so
        the last row predicts the newest token, which is already committed: the state that predicts
        the NEXT token does not exist until the next pass scores the newest token (Medusa's heads
        therefore guess from one position back, EAGLE feeds the newest token with the last state).
    ``draft(context_ids, *, max_nodes, max_depth) -> DraftTree``
        ``context_ids`` as above. At most ``max_nodes`` nodes, none deeper than ``max_depth`` (>= 1);
        a larger tree is trimmed to them (``DraftTree.fit``: every node deeper than ``max_depth``, then
        every node past the first ``max_nodes`` in flattened order), so drafting more is wasted work,
        not an error.
    ``read_commit(context_ids, states)``
        After each pass: ``context_ids`` the whole new visible context (ending with the correction or
        bonus token), ``states`` (m, len(target_layers) + 1, D) the rows of the m positions the pass
        committed except the newest token (the root, then each accepted node).

    The engine's verbs (``start`` / ``propose`` / ``commit``) are provided: ``bind(target, ...)`` ties the
    drafter to the ``g2c.specdec.sampling.CachedTarget`` it drafts for (``lineage_generate`` does it),
    then ``start`` hands ``read_prefill`` the target's prefill states (again after every re-prefill past
    the window: a new ``generation``), ``propose(ids, k)`` returns a ``DraftTree`` (a tree carries
    its own q rows) of at most ``draft_room(num_nodes, visible, window)`` nodes, none deeper than
    ``min(tokens left - 1, room)`` (a deeper node could never be emitted with its bonus), and ``commit``
    hands ``read_commit`` the root and accepted path's rows. ``reads`` declares the capability:
    ``("layers", target_layers)``.

    Sampled drafting: a drafter built with ``draft_mode="sample"`` draws its nodes from its own q at the
    loop's temperature and puts the rows on the tree (``DraftTree.proposal_probs``); ``start`` passes the
    temperature and generator to ``set_sampling``. At T = 0 (or ``draft_mode="top"``) it drafts its top
    ranks.

    The hooks get a copy of the visible context (a few hundred ids, under a microsecond): a drafter that
    writes into it cannot change the committed text.

    Attributes (after a run): ``draft_seconds`` (time inside the three hooks, synchronised),
    ``rounds_with_draft`` (passes that verified a non-empty tree).

    Raises:
        RuntimeError: ``start`` before ``bind`` ("bind the drafter to its tree target first").
    """

    vocab_size: int | None = None
    target_layers: tuple[int, ...] = ()
    base = None
    head = None
    draft_mode: str = "top"
    sample_temperature: float = 0.0
    sample_generator: torch.Generator | None = None
    _bound: dict | None = None

    @property
    def reads(self) -> tuple:
        """The declared capability: ("layers", the chosen blocks); the final state always comes too."""
        return ("layers", tuple(int(i) for i in self.target_layers))

    # -- what a subclass writes ------------------------------------------------------------------------
    def read_prefill(self, context_ids: torch.Tensor, states: torch.Tensor) -> None:
        return None

    def draft(self, context_ids: torch.Tensor, *, max_nodes: int, max_depth: int) -> DraftTree:
        raise NotImplementedError(f"{type(self).__name__} must implement draft(context_ids, max_nodes=, max_depth=)")

    def read_commit(self, context_ids: torch.Tensor, states: torch.Tensor) -> None:
        return None

    # -- sampling ------------------------------------------------------------------------------------------
    def set_sampling(self, temperature: float, generator: torch.Generator | None) -> None:
        """The loop's verification temperature and generator, for sampled drafting."""
        self.sample_temperature, self.sample_generator = float(temperature), generator

    @property
    def sampling(self) -> dict:
        """Keyword arguments for ``build_static_tree``/``build_dynamic_tree``: sampled drafting when
        ``draft_mode == "sample"`` and the loop's temperature is > 0, else none (top ranks)."""
        if self.draft_mode == "sample" and self.sample_temperature > 0.0:
            return {"sample": True, "temperature": self.sample_temperature, "generator": self.sample_generator}
        return {}

    # -- the engine's verbs, provided once ---------------------------------------------------------------
    def bind(self, target, *, num_nodes: int, max_new_tokens: int, rule=None) -> "TreeDrafter":
        """Tie the drafter to its tree target for one run; returns the drafter.

        Args:
            target: the ``CachedTarget`` it drafts for (built with ``layers=target_layers``).
            num_nodes: the node budget per pass, >= 1.
            max_new_tokens: the run's budget: ``start`` sets the context length at which it is
                spent (prompt + max_new_tokens; the engine has checked both by then).
            rule: the ``DraftTree`` acceptance rule at T > 0 (None: exact).
        """
        self._bound = {"target": target, "num_nodes": num_nodes, "max_new_tokens": max_new_tokens, "end": None,
                       "rule": rule, "generation": None}
        self.draft_seconds, self.rounds_with_draft = 0.0, 0
        return self

    def _target(self):
        if self._bound is None:
            raise RuntimeError(f"{type(self).__name__} is not bound: bind the drafter to its tree target first "
                               "(drafter.bind(CachedTarget(model, layers=drafter.target_layers), num_nodes=..., "
                               "max_new_tokens=...)); lineage_generate does it for you")
        return self._bound["target"]

    def _timed(self, fn, *args, **kw):
        t0 = time.perf_counter()
        out = fn(*args, **kw)
        synchronize(self._target().device)
        self.draft_seconds += time.perf_counter() - t0
        return out

    def _sync(self, ids: torch.Tensor) -> None:
        """(Re)start on the target's prefill when the target prefilled since."""
        t = self._target()
        if self._bound["generation"] != t.generation:
            self._timed(self.read_prefill, ids[t.start_pos:].clone(), t.prefill_states)
            self._bound["generation"] = t.generation

    def start(self, prompt_ids: torch.Tensor, *, sampler, generator: torch.Generator | None) -> None:
        self._target()
        super().start(prompt_ids, sampler=sampler, generator=generator)
        self.set_sampling(sampler.temperature, generator)      # sampled drafting: q at the loop's T
        self._bound["generation"] = None
        self._bound["end"] = prompt_ids.numel() + int(self._bound["max_new_tokens"])
        self._sync(prompt_ids)

    def propose(self, context_ids: torch.Tensor, k: int) -> DraftTree:
        self._sync(context_ids)                           # the target re-prefilled past the window
        t, b = self._target(), self._bound
        room = draft_room(b["num_nodes"], context_ids.numel() - t.start_pos, t.window)
        max_depth = min(b["end"] - context_ids.numel() - 1, room)
        t0 = time.perf_counter()
        if max_depth >= 1:
            tree = self.draft(context_ids[t.start_pos:].clone(), max_nodes=room, max_depth=max_depth)
        else:
            tree = DraftTree.empty()
        tree = DraftTree.check(tree, self.vocab_size, source=f"{type(self).__name__}.draft()")
        tree = tree.fit(room, max_depth)
        synchronize(t.device)
        self.draft_seconds += time.perf_counter() - t0
        self.rounds_with_draft += int(tree.num_nodes > 0)
        tree.rule = b["rule"]
        return tree

    def commit(self, context_ids: torch.Tensor, num_accepted: int, *, target_hidden=None) -> None:
        t = self._target()
        rows = t.committed_rows(context_ids)
        self._timed(self.read_commit, context_ids[t.start_pos:].clone(), t.last_states[rows])


class HeadOnBase(Module):
    """A draft head that lives on a frozen target. Provided.

    The target is kept in a dict, so ``parameters()``, ``state_dict()``, ``to()`` and ``train()`` touch
    only the head's own layers; ``base`` returns it. Subclasses define ``config()`` (what
    ``config.json`` records) and ``from_config(base, config)`` (what ``load_model`` calls).
    """

    def __init__(self, base, *, generator=None) -> None:
        check_base_model(base, type(self).__name__, generator)   # TypeError before a head reads an attribute
        super().__init__()
        self._frozen = {"base": base}

    @property
    def base(self):
        """The frozen target."""
        return self._frozen["base"]

