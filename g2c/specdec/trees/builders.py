"""Beyond (specdec-trees): the tree builders, static (Medusa-style) and dynamic (EAGLE-2-style).

Both fill a ``DraftTree`` (``tree.py``) with a drafter's most probable tokens, one drafter pass
per depth; each pass scores the tree built so far with tree attention (``attention.py``).

    * static: a fixed shape given as rank paths, the same for every context (Cai et al.,
      "Medusa", ICML 2024, sections 2.1.2 and 2.3.3);
    * dynamic: expand the most probable nodes, then keep the n best of everything drafted
      (Li et al., "EAGLE-2", EMNLP 2024, sections 4.1-4.2).

Shape letters: n nodes, C context length, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from g2c.sampling.model import check_count

from .attention import tree_logits
from .tree import DraftTree

__all__ = ["build_dynamic_tree", "build_static_tree", "check_choices"]


def check_choices(choices, name: str = "choices") -> list[tuple[int, ...]]:
    """Rank paths as a list of int tuples, read once (a generator too) and validated. Provided.

    Args:
        choices: an iterable of rank paths (tuples or lists of ints >= 0), sorted by (depth,
            ranks) and closed under prefixes, as ``static_choices`` and ``chain_choices`` return.
        name: the caller, for the message.

    Raises:
        TypeError: choices or a path not iterable (a string is not a path), a rank not an int (a
            float is never truncated: 0.7 would silently be rank 0).
        ValueError: an empty path, a negative rank, unsorted or repeated paths, a missing prefix.
    """
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Iterable):
        raise TypeError(f"{name}: choices must be a list of rank paths such as [(0,), (1,), (0, 0)], got "
                        f"{type(choices).__name__}")
    paths = []
    for c in choices:                                                      # read once
        if isinstance(c, (str, bytes)) or not isinstance(c, Iterable):
            raise TypeError(f"{name}: each choice must be a rank path (a tuple of ints such as (0, 1)), got {c!r:.40}")
        paths.append(tuple(check_count(r, f"{name}: rank in {tuple(c)!r:.40}", minimum=None) for r in c))
    for i, c in enumerate(paths):
        if not c or min(c) < 0:
            raise ValueError(f"{name}: bad rank path {c}; ranks are ints >= 0")
        if i and (len(c), c) <= (len(paths[i - 1]), paths[i - 1]):
            raise ValueError(f"{name}: choices must be sorted by (depth, ranks) without repeats")
    known = set(paths)
    for c in paths:
        if c[:-1] and c[:-1] not in known:
            raise ValueError(f"{name}: {c} has no prefix {c[:-1]}; include every prefix")
    return paths


# -- builders -------------------------------------------------------------------------------
def _drafter_probs(drafter, ctx_ids: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """(n+1, V) float32 CPU drafter probabilities: row 0 after the context, row i+1 after node i.

    A drafter that is not a token LM (EAGLE's feature drafter, ``g2c.specdec.lineage``) provides
    ``tree_probs(ctx_ids, tree)`` with the same rows and is asked instead."""
    if hasattr(drafter, "tree_probs"):
        return drafter.tree_probs(ctx_ids, tree).float().cpu()
    return torch.softmax(tree_logits(drafter, ctx_ids, tree).float().cpu(), dim=-1)


@torch.no_grad()
def build_static_tree(drafter, ctx_ids, choices: list[tuple[int, ...]]) -> tuple[DraftTree, int]:
    """Fill a static shape with the drafter's top-ranked tokens. Provided.

    Args:
        drafter: a language model (ids (1, T) -> logits (1, T, V), ``max_seq_len``, ``device``).
        ctx_ids: 1-D LongTensor, the committed context.
        choices: rank paths, sorted by (depth, ranks) and closed under prefixes (as
            ``static_choices`` and ``chain_choices`` return them).

    Returns:
        (tree, drafter_passes): the tree in the choices' order (breadth first), one drafter
        pass per depth (each pass scores the tree built so far with tree attention).

    Raises:
        ValueError: choices unsorted, not closed under prefixes, or with a negative rank, or a
            rank >= V (``check_choices``).
        TypeError: choices not an iterable of rank paths of ints.
    """
    choices = check_choices(choices, "build_static_tree")
    index: dict[tuple[int, ...], int] = {}
    tokens: list[int] = []
    parents: list[int] = []
    passes = 0
    for depth in sorted({len(c) for c in choices}):
        # one drafter pass scores the tree built so far (the root and every shallower node)
        probs = _drafter_probs(drafter, ctx_ids, DraftTree(torch.tensor(tokens, dtype=torch.long),
                                                           torch.tensor(parents, dtype=torch.long)))
        passes += 1
        for c in (c for c in choices if len(c) == depth):
            parent = index[c[:-1]] if c[:-1] else -1
            row = probs[parent + 1]                                         # (V,)
            if c[-1] >= row.numel():
                raise ValueError(f"build_static_tree: rank {c[-1]} exceeds the vocabulary size {row.numel()}")
            index[c] = len(tokens)
            tokens.append(int(torch.topk(row, c[-1] + 1).indices[c[-1]]))
            parents.append(parent)
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long)), passes


@torch.no_grad()
def build_dynamic_tree(drafter, ctx_ids, num_nodes: int, *, width: int = 4,
                       max_depth: int | None = None) -> tuple[DraftTree, int]:
    """EAGLE-2's context-aware dynamic tree under a node budget (section 4). Provided.

    Args:
        drafter: a language model, as ``build_static_tree``, or any object with
            ``tree_probs(ctx_ids, tree) -> (n+1, V)`` probabilities (EAGLE-2 over a feature drafter).
        ctx_ids: 1-D LongTensor, the committed context.
        num_nodes: the budget n >= 0 of draft nodes the target will verify.
        width: EAGLE-2's top-k: nodes expanded per depth, and children per expanded node.
        max_depth: deepest level drafted (default n: a chain's worth).

    Returns:
        (tree, drafter_passes): the n highest-value nodes, breadth first, siblings by
        descending drafter probability; one drafter pass per expanded depth.

    Expansion stops early once no frontier node can beat the n-th best value found so far
    (every descendant's value is at most its ancestor's): in a peaked context the drafter
    runs a few passes and the budget goes deep; in an entropic one it spreads wide.

    Raises:
        ValueError: num_nodes < 0, width < 1 or max_depth < 1.
    """
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 0:
        raise ValueError(f"build_dynamic_tree: num_nodes must be an int >= 0, got {num_nodes!r}")
    if width < 1:
        raise ValueError(f"build_dynamic_tree: width must be >= 1, got {width}")
    max_depth = num_nodes if max_depth is None else max_depth
    if max_depth < 1 and num_nodes:
        raise ValueError(f"build_dynamic_tree: max_depth must be >= 1, got {max_depth}")
    # candidates: (value, depth, parent candidate index, token); parents precede children
    values: list[float] = []
    depths: list[int] = []
    parents: list[int] = []
    tokens: list[int] = []
    frontier = [-1]                                                          # the root
    frontier_values = [1.0]
    passes = 0
    for depth in range(1, max_depth + 1):
        if not frontier or num_nodes == 0:
            break
        if len(values) >= num_nodes:
            nth_best = sorted(values, reverse=True)[num_nodes - 1]
            if max(frontier_values) <= nth_best:
                break                                                        # nothing deeper can enter the top n
        # one drafter pass over the frontier and its ancestors
        keep = set()
        for f in frontier:
            while f >= 0 and f not in keep:
                keep.add(f)
                f = parents[f]
        keep = sorted(keep)
        sub_index = {old: new for new, old in enumerate(keep)}
        sub = DraftTree(torch.tensor([tokens[i] for i in keep], dtype=torch.long),
                        torch.tensor([sub_index[parents[i]] if parents[i] >= 0 else -1 for i in keep],
                                     dtype=torch.long))
        probs = _drafter_probs(drafter, ctx_ids, sub)                       # (|keep|+1, V)
        passes += 1
        new_layer = []
        for f, fv in zip(frontier, frontier_values):
            row = probs[0 if f < 0 else sub_index[f] + 1]                  # (V,)
            top = torch.topk(row, min(width, row.numel()))
            for pr, tok in zip(top.values.tolist(), top.indices.tolist()):
                values.append(fv * pr)
                depths.append(depth)
                parents.append(f)
                tokens.append(tok)
                new_layer.append(len(values) - 1)
        best = sorted(new_layer, key=lambda i: -values[i])[:width]
        frontier, frontier_values = best, [values[i] for i in best]
    # reranking: the n best by value, ties to the shallower (then earlier) node
    order = sorted(range(len(values)), key=lambda i: (-values[i], depths[i], i))[:num_nodes]
    keep = sorted(order, key=lambda i: (depths[i], i))                      # breadth first
    new_index = {old: new for new, old in enumerate(keep)}
    tree_parents = []
    for i in keep:
        p = parents[i]
        assert p < 0 or p in new_index, "reranking kept a node without its parent"
        tree_parents.append(new_index[p] if p >= 0 else -1)
    return DraftTree(torch.tensor([tokens[i] for i in keep], dtype=torch.long),
                     torch.tensor(tree_parents, dtype=torch.long)), passes


