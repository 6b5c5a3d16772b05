"""Beyond (specdec-lineage): the drafter protocol of ``lineage_generate`` and two helpers. Provided.

``TreeDrafter`` is documented in ``loop.py`` (the loop that calls it); ``chain_tree`` (specdec-trees,
re-exported) turns a chain into a ``DraftTree``; ``masked_block`` runs a module 09 block under any
attention mask (tree rows, the training-time-test mask of EAGLE-3, the block drafter's
context-plus-slots mask).

Shape letters: B batch, T time, S keys, D width.
"""

from __future__ import annotations

import torch

from g2c.attention.multihead import merge_heads, split_heads
from g2c.kvcache import KVCache
from g2c.kvcache.ragged import masked_cached_attention
from g2c.nn import Module

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
    if cache is None:
        return masked_block_past(blk, x, allowed)[0]
    x = x + masked_cached_attention(blk.attn, blk.ln_1(x), cache, 0, allowed.to(x.device))
    return x + blk.mlp(blk.ln_2(x))


DRAFT_MODES = ("top", "sample")


def check_draft_mode(draft_mode, who: str) -> str:
    """``draft_mode`` must be "top" (the drafter's top ranks) or "sample" (drawn from its q). Provided."""
    if draft_mode not in DRAFT_MODES:
        raise ValueError(f"{who}: draft_mode must be 'top' (the drafter's top ranks, deterministic) or 'sample' "
                         f"(children drawn without replacement from its q at T > 0), got {draft_mode!r}")
    return draft_mode


class TreeDrafter:
    """Base class of this module's drafter protocol (see the module docstring). Provided.

    Sampled drafting: a drafter built with ``draft_mode="sample"`` draws its nodes from
    its own q at the loop's temperature and puts the rows on the tree (``DraftTree.proposal_probs``);
    ``lineage_generate`` tells it the temperature and generator through ``set_sampling`` before the
    first round. At T = 0 (or ``draft_mode="top"``) it drafts its top ranks.
    """

    vocab_size: int | None = None
    target_layers: tuple[int, ...] = ()
    base = None
    head = None
    draft_mode: str = "top"
    sample_temperature: float = 0.0
    sample_generator: torch.Generator | None = None

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

    def start(self, context_ids: torch.Tensor, states: torch.Tensor) -> None:
        return None

    def draft(self, context_ids: torch.Tensor, *, max_nodes: int, max_depth: int) -> DraftTree:
        raise NotImplementedError(f"{type(self).__name__} must implement draft(context_ids, max_nodes=, max_depth=)")

    def commit(self, context_ids: torch.Tensor, states: torch.Tensor) -> None:
        return None


class HeadOnBase(Module):
    """A draft head that lives on a frozen target. Provided.

    The target is kept in a dict, so ``parameters()``, ``state_dict()``, ``to()`` and ``train()`` touch
    only the head's own layers; ``base`` returns it. Subclasses define ``config()`` (what
    ``config.json`` records) and ``from_config(base, config)`` (what ``load_model`` calls).
    """

    def __init__(self, base) -> None:
        super().__init__()
        self._frozen = {"base": base}

    @property
    def base(self):
        """The frozen target."""
        return self._frozen["base"]

