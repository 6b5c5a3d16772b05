"""Beyond (specdec-lineage): EAGLE drafting as chains and EAGLE-2 dynamic trees (generation 3). Provided.

The EAGLE drafter of specdec-sampling (``FeatureDrafter``: fuse the target's state h_t with the
next token's embedding, one causal block, the target's unembedding) drafts a chain: feed its own
predicted feature back, k times. EAGLE-2 (Li, Wei, Zhang, Zhang, "EAGLE-2: Faster Inference of
Language Models with Dynamic Draft Trees", EMNLP 2024) keeps that drafter and changes the SHAPE of
the draft: the drafter's confidence tracks the chance that a token is accepted (section 3), so

    * value of a node = the product of the drafter's probabilities along its path (section 4.1);
    * expansion: at each depth, expand the ``width`` best nodes of the newest layer, ``width``
      children each, one drafter pass per depth;
    * re-ranking: keep the ``num_nodes`` highest values of everything drafted (section 4.2).

The search itself is specdec-trees' ``build_dynamic_tree``; this file teaches the feature drafter to
answer it (``tree_probs``): every tree node becomes one row of the drafter's own one-layer
``KVCache`` whose input is (its parent's predicted feature, its token) and which reads the
committed rows (true target states) plus its ancestors' rows. A chain is the same search with
width 1.

``FeatureTreeDrafter`` is written once for any head with that interface (``embed_next``, ``block``,
``logits``, and ``true_features``, which turns the target's states into the head's input
features); EAGLE-3 (``eagle3.py``) reuses it with fused low/middle/high layers.

Shape letters: m committed rows, n tree nodes, D width, V vocabulary.
"""

from __future__ import annotations

import torch

from g2c.kvcache import KVCache
from g2c.sampling.model import check_whole

from ..sampling.eagle import FeatureDrafter
from ..trees import DraftTree, build_dynamic_tree, build_static_tree, static_choices
from .protocol import TreeDrafter, check_draft_mode, masked_block

__all__ = ["MAX_WIDTH", "EagleTreeDrafter", "FeatureTreeDrafter"]

MAX_WIDTH = 32   # nodes expanded per depth; the drafter's cache holds max_seq_len * (1 + width) rows


class FeatureTreeDrafter(TreeDrafter):
    """A feature-level drafter with its own KV cache, drafting chains or EAGLE-2 dynamic trees.

    Args:
        head: a head with ``base``, ``block``, ``embed_next(features (1, m, D), ids (1, m))``,
            ``logits(features (..., D)) -> (..., V)`` and ``true_features(states (m, L+1, D)) -> (m, D)``.
        width: EAGLE-2's expansion width (nodes expanded per depth and children per node), in
            [1, ``MAX_WIDTH``]; 1 drafts a chain.
        target_layers: the target blocks whose outputs ``true_features`` reads.
        shape: ``"dynamic"`` (default: EAGLE-2's search, ``width`` per depth) or ``"static"`` (the
            ``static_choices`` shape of the same node budget, filled by ``build_static_tree``: the
            baseline EAGLE-2 is measured against).
        draft_mode: ``"top"`` (default: top ranks) or ``"sample"``: at the loop's T > 0, children
            drawn without replacement from the drafter's softmax(logits / T), the tree carrying
            their rows (``build_static_tree(..., sample=True)``; EAGLE-2's shape is still searched
            on top ranks, then filled by sampling).

    Attributes:
        cache: the head's one-layer ``KVCache``: the committed rows (inputs from the target's true
            states), then during ``draft`` one row per tree node, cropped at the next ``read_commit``.

    Raises:
        ValueError: width not an int in [1, ``MAX_WIDTH``] (32); shape not "dynamic" or "static";
            draft_mode not "top" or "sample".
    """

    def __init__(self, head, *, width: int = 1, target_layers: tuple[int, ...] = (), shape: str = "dynamic",
                 draft_mode: str = "top") -> None:
        self.draft_mode = check_draft_mode(draft_mode, type(self).__name__)
        if shape not in ("dynamic", "static"):
            raise ValueError(f"{type(self).__name__}: shape must be 'dynamic' (EAGLE-2) or 'static' (Medusa-style "
                             f"rank paths, static_choices), got {shape!r}")
        self.shape = shape
        width = check_whole(width, f"{type(self).__name__}: width must be an int in [1, {MAX_WIDTH}] (1 = a chain; "
                                   f"EAGLE-2 expands 10 per depth on 7B models), got {width!r}", high=MAX_WIDTH)
        self.head = head
        self.base = head.base
        self.vocab_size = head.base.vocab_size
        self.width = width
        self.target_layers = tuple(target_layers)
        base, w = head.base, head.base.token_embed.weight
        capacity = base.max_seq_len * (1 + width)              # committed rows + every node a search can add
        self.cache = KVCache(1, 1, base.num_heads, base.embedding_dim // base.num_heads, capacity,
                             dtype=w.dtype, device=w.device)
        self._true = 0
        self._out = None
        self._memo: dict[tuple[int, ...], tuple[int, torch.Tensor, torch.Tensor]] = {}   # path -> (row, feature, probs)
        self._root_probs = None

    def __repr__(self) -> str:
        return f"{type(self).__name__}(width={self.width})"

    def true_features(self, states: torch.Tensor) -> torch.Tensor:
        return self.head.true_features(states)

    def read_prefill(self, context_ids: torch.Tensor, states: torch.Tensor) -> None:
        self.cache.reset()
        self._true, self._out, self._memo = 0, None, {}
        self.read_commit(context_ids, states)

    @torch.no_grad()
    def read_commit(self, context_ids: torch.Tensor, states: torch.Tensor) -> None:
        self.cache.crop(self._true)                            # roll back the last search's rows
        self._memo, self._root_probs = {}, None           # a new context: new rows, new root
        m = states.shape[0]
        if m == 0:
            return
        w = self.base.token_embed.weight
        feats = self.true_features(states.to(w.device, w.dtype))                       # (m, D)
        following = context_ids[-m:].to(w.device)                                      # token t+1 for each row
        x = self.head.embed_next(feats.unsqueeze(0), following.unsqueeze(0))           # (1, m, D)
        allowed = torch.cat([torch.ones(m, self._true, dtype=torch.bool),
                             torch.ones(m, m, dtype=torch.bool).tril()], dim=1).to(w.device)
        y = masked_block(self.head.block, x, allowed, self.cache)
        self.cache.advance(m)
        self._true += m
        self._out = y[0, -1]                                   # predicts the token after the context

    @torch.no_grad()
    def tree_probs(self, context_ids: torch.Tensor, tree: DraftTree) -> torch.Tensor:
        """(n+1, V) drafter probabilities: row 0 after the context, row i + 1 after node i.

        Nodes met in an earlier call of the same search are looked up by their path (feature and
        probability row alike); new nodes (their parents already known) are fed in one cached pass
        per depth.
        """
        w = self.base.token_embed.weight
        keys = [tuple(tree.path_tokens(i)) for i in range(tree.num_nodes)]
        new = [i for i in range(tree.num_nodes) if keys[i] not in self._memo]
        for depth in sorted({len(keys[i]) for i in new}):
            group = [i for i in new if len(keys[i]) == depth]
            parents = torch.stack([self._out if depth == 1 else self._memo[keys[i][:-1]][1] for i in group])
            tokens = torch.tensor([keys[i][-1] for i in group], device=w.device)
            x = self.head.embed_next(parents.unsqueeze(0), tokens.unsqueeze(0))       # (1, g, D)
            length = self.cache.length
            allowed = torch.zeros(len(group), length + len(group), dtype=torch.bool)
            allowed[:, :self._true] = True
            for j, i in enumerate(group):
                for d in range(1, depth):
                    allowed[j, self._memo[keys[i][:d]][0]] = True                      # its ancestors' rows
                allowed[j, length + j] = True                                          # and itself
            y = masked_block(self.head.block, x, allowed.to(w.device), self.cache)
            self.cache.advance(len(group))
            probs = torch.softmax(self.head.logits(y[0]).float(), dim=-1)              # (g, V): once per node
            for j, i in enumerate(group):
                self._memo[keys[i]] = (length + j, y[0, j], probs[j])
        if self._root_probs is None:
            self._root_probs = torch.softmax(self.head.logits(self._out).float(), dim=-1)
        return torch.stack([self._root_probs] + [self._memo[k][2] for k in keys])    # (n+1, V)

    def draft(self, context_ids: torch.Tensor, *, max_nodes: int, max_depth: int) -> DraftTree:
        if self._out is None or max_nodes < 1 or max_depth < 1:
            return DraftTree.empty()
        self.cache.crop(self._true)
        self._memo = {}
        if self.shape == "static":                        # the same budget in a fixed shape, for comparison
            choices = [c for c in static_choices(max_nodes) if len(c) <= max_depth]
            return build_static_tree(self, context_ids, choices, **self.sampling)[0]
        tree, _ = build_dynamic_tree(self, context_ids, max_nodes, width=self.width, max_depth=max_depth,
                                     **self.sampling)
        return tree


class EagleTreeDrafter(FeatureTreeDrafter):
    """The specdec-sampling ``FeatureDrafter`` (EAGLE-1) as a chain (width 1) or EAGLE-2 tree drafter.

    Args:
        head: a trained ``FeatureDrafter`` (``load_model("StoryLM-30M-EAGLE")``).
        width: 1 = EAGLE's chain; > 1 = EAGLE-2's dynamic tree (the paper's top-k is 10 on 7B
            models; 4 suits the course's small vocabulary).
        shape: ``"static"`` drafts a fixed ``static_choices`` tree of the same budget instead.
        draft_mode: ``"top"`` or ``"sample"`` (see ``FeatureTreeDrafter``).

    Raises:
        TypeError: head is not a ``FeatureDrafter``.
    """

    def __init__(self, head: FeatureDrafter, *, width: int = 1, shape: str = "dynamic",
                 draft_mode: str = "top") -> None:
        if not isinstance(head, FeatureDrafter):
            raise TypeError(f"EagleTreeDrafter needs a FeatureDrafter (load_model('StoryLM-30M-EAGLE')), "
                            f"got {type(head).__name__}")
        super().__init__(head, width=width, shape=shape, draft_mode=draft_mode)

    def true_features(self, states: torch.Tensor) -> torch.Tensor:
        """EAGLE-1 reads the target's final states as they are: (m, 1, D) -> (m, D)."""
        return states[:, -1]
