"""Beyond (specdec-trees): the tree builders, static (Medusa-style) and dynamic (EAGLE-2-style).

Both fill a ``DraftTree`` (``tree.py``) with a drafter's most probable tokens, one drafter pass
per depth; each pass scores the tree built so far with tree attention (``attention.py``).

    * static: a fixed shape given as rank paths, the same for every context (Cai et al.,
      "Medusa", ICML 2024, sections 2.1.2 and 2.3.3);
    * dynamic: expand the most probable nodes, then keep the n best of everything drafted
      (Li et al., "EAGLE-2", EMNLP 2024, sections 4.1-4.2).

Sampled drafting (``sample=True``, for sampled verification at T > 0): instead of the drafter's top
ranks, rank slot r of a node holds the r-th token drawn WITHOUT replacement from the drafter's own
q there (``sample_children``), and the tree carries, for every node, the distribution its token
was drawn from: q with the tokens of its earlier siblings removed, renormalised
(``DraftTree.proposal_probs``). ``tree_speculative_verify`` then runs SpecInfer's multi-draft
rule on those rows (Miao et al., "SpecInfer", ASPLOS 2024, section 4.3; the without-replacement
variant: Jeon et al., "Recursive Speculative Decoding", ICML 2024), and the output follows the target's
distribution exactly. For that the SHAPE (which rank slots exist) must not depend on the token
drawn into a slot: a static shape is fixed in advance; the dynamic builder first chooses its
shape with the deterministic search, then fills the shape by sampling.

Shape letters: n nodes, C context length, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from g2c.sampling.model import (
    check_count,
    check_generator,
    check_language_model,
    check_prob_rows,
    check_real,
    check_whole,
)

from .attention import tree_logits
from .tree import DraftTree

__all__ = ["build_dynamic_tree", "build_static_tree", "check_choices", "sample_children", "warp_probs"]


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


# -- sampled children -------------------------------------------------------------------------
def warp_probs(probs: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) from softmax(logits): normalize(probs ** (1 / T)) along the last dim. Provided.

    Computed as softmax(log(probs) / T), so a small T gives a (nearly) one-hot row, not 0 / 0;
    zero entries stay zero, negative entries count as zero, and a row with no positive entry has
    no warped law (NaN). At T = 1 the rows are returned as they are.

    Args:
        probs: (..., V) float probabilities (any device).
        temperature: T > 0 (1 returns the rows unchanged).

    Raises:
        TypeError: temperature not a real number; probs not a tensor.
        ValueError: temperature not a finite number > 0; probs not floating point, or (as a row or
            rows) not distributions (``check_prob_rows``: logits, NaN, a sum off 1).
    """
    try:
        t = check_real(temperature, "warp_probs: temperature")              # a wrong type: TypeError
    except ValueError:
        t = math.nan                                                         # NaN or inf: the message below
    if not 0.0 < t < math.inf:
        raise ValueError(f"warp_probs: temperature must be a finite number > 0 (sampled drafting), got {temperature!r}")
    temperature = t
    if not isinstance(probs, torch.Tensor):
        raise TypeError(f"warp_probs: probs must be a tensor (..., V) of probabilities, got {type(probs).__name__}")
    check_prob_rows(probs.reshape(-1, probs.shape[-1]) if probs.dim() else probs, "warp_probs: probs")
    if temperature == 1.0:
        return probs
    # in logs: p ** (1 / T) underflows to 0 everywhere at a small T (0 / 0); log 0 = -inf stays a 0
    return torch.softmax(probs.clamp(min=0.0).log() / temperature, dim=-1)


def sample_children(q: torch.Tensor, k: int, *, generator: torch.Generator | None = None
                    ) -> tuple[list[int], torch.Tensor]:
    """Draw up to k distinct tokens from q, one after another, without replacement. Provided.

    Args:
        q: (V,) float probabilities, the drafter's distribution at the parent (CPU).
        k: how many siblings, >= 0.
        generator: CPU ``torch.Generator`` (None: torch's global one).

    Raises:
        TypeError: q not a tensor, k not an int, a generator that is not one (``check_generator``).
        ValueError: q not 1-D, not floating point or not a distribution (NaN, a negative entry, a sum
            off 1, all zero: ``check_prob_rows``), or k below 0.

    Returns:
        (tokens, rows): the drawn tokens in draw order (fewer than k when q has fewer than k
        nonzero entries) and their proposal rows, (len(tokens), V) float32 CPU: row j is q with
        tokens[:j] removed and renormalised, the law tokens[j] was drawn from. SpecInfer's rule
        run on these rows is exact; verifying every sibling against the unmodified q is not
        (``tests/test_specdec_trees.py`` plants that mistake and catches it).
    """
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"sample_children: q must be a (V,) tensor of probabilities, got {type(q).__name__}")
    message = f"sample_children: q must be one row (V,) and k an int >= 0, got q of shape {tuple(q.shape)} and k={k!r}"
    if q.dim() != 1:
        raise ValueError(message)
    k = check_whole(k, message, low=0)
    check_prob_rows(q.unsqueeze(0), "sample_children: q")                  # logits or a dead row: never drawn from
    check_generator(generator)
    rest = q.detach().float().cpu().clamp(min=0.0).clone()                  # (V,)
    tokens: list[int] = []
    rows: list[torch.Tensor] = []
    for _ in range(k):
        total = float(rest.sum())
        if total <= 0.0:
            break
        row = rest / total
        x = int(torch.multinomial(row, 1, generator=generator))
        tokens.append(x)
        rows.append(row)
        rest[x] = 0.0                                                        # without replacement
    return tokens, (torch.stack(rows) if rows else torch.zeros(0, q.numel()))


# -- builders -------------------------------------------------------------------------------
def _check_builder(drafter, sample, temperature, generator, who: str) -> None:
    """A builder's collaborators: a language model (or an object with ``tree_probs``), a bool ``sample``, a real
    temperature (> 0 when sampling), a generator or None; TypeError / ValueError naming the argument."""
    if not callable(getattr(drafter, "tree_probs", None)):
        check_language_model(drafter, f"{who}: drafter")
    if not isinstance(sample, bool):
        raise TypeError(f"{who}: sample must be True or False, got {type(sample).__name__} {sample!r}")
    temperature = check_real(temperature, f"{who}: temperature")
    if sample and not temperature > 0.0:
        raise ValueError(f"{who}: sampled drafting needs temperature > 0, got {temperature!r}")
    check_generator(generator)


def _drafter_probs(drafter, ctx_ids: torch.Tensor, tree: DraftTree) -> torch.Tensor:
    """(n+1, V) float32 CPU drafter probabilities: row 0 after the context, row i+1 after node i.

    A drafter that is not a token LM (EAGLE's feature drafter, ``g2c.specdec.lineage``) provides
    ``tree_probs(ctx_ids, tree)`` with the same rows and is asked instead."""
    if hasattr(drafter, "tree_probs"):
        return drafter.tree_probs(ctx_ids, tree).float().cpu()
    return torch.softmax(tree_logits(drafter, ctx_ids, tree).float().cpu(), dim=-1)


@torch.no_grad()
def build_static_tree(drafter, ctx_ids, choices: list[tuple[int, ...]], *, sample: bool = False,
                      temperature: float = 1.0, generator: torch.Generator | None = None) -> tuple[DraftTree, int]:
    """Fill a static shape with the drafter's top-ranked tokens, or with sampled ones. Provided.

    Args:
        drafter: a language model (ids (1, T) -> logits (1, T, V), ``max_seq_len``, ``device``).
        ctx_ids: 1-D LongTensor, the committed context.
        choices: rank paths, sorted by (depth, ranks) and closed under prefixes (as
            ``static_choices`` and ``chain_choices`` return them).
        sample: False (default): slot r holds the drafter's rank-r token (deterministic,
            ``proposal_probs`` None). True: the children of a node are drawn without
            replacement from the drafter's q warped to ``temperature`` (``sample_children``),
            slot r holding the r-th draw, and the tree carries their proposal rows; a slot past
            the number of tokens q can give (its nonzero entries) is dropped with its subtree.
        temperature: T > 0 of the sampled q (the verification temperature); sample only.
        generator: CPU ``torch.Generator`` for the draws; sample only.

    Returns:
        (tree, drafter_passes): the tree in the choices' order (breadth first), one drafter
        pass per depth (each pass scores the tree built so far with tree attention).

    Raises:
        ValueError: choices unsorted, not closed under prefixes, or with a negative rank, or a
            rank >= V (``check_choices``); temperature not finite, or not > 0 when sampling.
        TypeError: choices not an iterable of rank paths of ints; drafter not a language model (and
            without ``tree_probs``); sample not a bool; temperature not a real number; a generator
            that is not one.
    """
    choices = check_choices(choices, "build_static_tree")
    _check_builder(drafter, sample, temperature, generator, "build_static_tree")
    index: dict[tuple[int, ...], int] = {}
    tokens: list[int] = []
    parents: list[int] = []
    rows: list[torch.Tensor] = []                                           # proposal rows (sample only)
    passes = 0
    for depth in sorted({len(c) for c in choices}):
        layer = [c for c in choices if len(c) == depth and (len(c) == 1 or c[:-1] in index)]
        if not layer:
            break                                                           # sampled slots ran out
        # one drafter pass scores the tree built so far (the root and every shallower node)
        probs = _drafter_probs(drafter, ctx_ids, DraftTree(torch.tensor(tokens, dtype=torch.long),
                                                           torch.tensor(parents, dtype=torch.long)))
        passes += 1
        drawn: dict[int, tuple[list[int], torch.Tensor]] = {}               # parent -> its draws (sample)
        for c in layer:
            parent = index[c[:-1]] if c[:-1] else -1
            row = probs[parent + 1]                                         # (V,)
            if c[-1] >= row.numel():
                raise ValueError(f"build_static_tree: rank {c[-1]} exceeds the vocabulary size {row.numel()}")
            if sample:
                if parent not in drawn:                                     # every slot of this parent at once
                    need = 1 + max(d[-1] for d in layer if d[:-1] == c[:-1])
                    drawn[parent] = sample_children(warp_probs(row, temperature), need, generator=generator)
                got, q_rows = drawn[parent]
                if c[-1] >= len(got):
                    continue                                                # q has fewer tokens than slots
                token = got[c[-1]]
                rows.append(q_rows[c[-1]])
            else:
                token = int(torch.topk(row, c[-1] + 1).indices[c[-1]])
            index[c] = len(tokens)
            tokens.append(token)
            parents.append(parent)
    q = torch.stack(rows) if sample and rows else None                      # (n, V) proposal rows
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long), q), passes


@torch.no_grad()
def build_dynamic_tree(drafter, ctx_ids, num_nodes: int, *, width: int = 4,
                       max_depth: int | None = None, sample: bool = False, temperature: float = 1.0,
                       generator: torch.Generator | None = None) -> tuple[DraftTree, int]:
    """EAGLE-2's context-aware dynamic tree under a node budget (section 4). Provided.

    Args:
        drafter: a language model, as ``build_static_tree``, or any object with
            ``tree_probs(ctx_ids, tree) -> (n+1, V)`` probabilities (EAGLE-2 over a feature drafter).
        ctx_ids: 1-D LongTensor, the committed context.
        num_nodes: the budget n >= 0 of draft nodes the target will verify.
        width: EAGLE-2's top-k: nodes expanded per depth, and children per expanded node.
        max_depth: deepest level drafted (default n: a chain's worth).
        sample, temperature, generator: sampled drafting (see ``build_static_tree``). The search
            above chooses the SHAPE (the kept nodes' rank paths) from the drafter's top ranks,
            valued with the q the fill draws from (the drafter's probabilities warped to
            ``temperature``: at T < 1 a sharper q, which favours depth over siblings);
            ``build_static_tree(..., sample=True)`` then fills that shape with drawn tokens and
            their proposal rows. Choosing the shape from the drawn tokens' own probabilities
            would make a slot's existence depend on its token, and the verification would no
            longer be exact. Costs the fill's drafter passes on top of the search's.

    Returns:
        (tree, drafter_passes): the n highest-value nodes, breadth first, siblings by
        descending drafter probability (sample: by draw order); one drafter pass per expanded
        depth (sample: plus one per depth of the fill).

    Expansion stops early once no frontier node can beat the n-th best value found so far
    (every descendant's value is at most its ancestor's): in a peaked context the drafter
    runs a few passes and the budget goes deep; in an entropic one it spreads wide.

    Raises:
        TypeError: num_nodes, width or max_depth not a whole number (a Python or NumPy int); the
            collaborators as ``build_static_tree``.
        ValueError: num_nodes < 0, width < 1 or max_depth < 1; temperature not > 0 when sampling.
    """
    _check_builder(drafter, sample, temperature, generator, "build_dynamic_tree")
    num_nodes = check_whole(num_nodes, f"build_dynamic_tree: num_nodes must be an int >= 0, got {num_nodes!r}", low=0)
    width = check_whole(width, f"build_dynamic_tree: width must be >= 1, got {width!r}")
    max_depth = num_nodes if max_depth is None else check_whole(
        max_depth, f"build_dynamic_tree: max_depth must be an int >= 0, got {max_depth!r}", low=0)
    if max_depth < 1 and num_nodes:
        raise ValueError(f"build_dynamic_tree: max_depth must be >= 1, got {max_depth}")
    # candidates: (value, depth, parent candidate index, token); parents precede children
    values: list[float] = []
    depths: list[int] = []
    parents: list[int] = []
    tokens: list[int] = []
    ranks: list[int] = []                                                    # rank among its parent's children
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
        if sample:                  # value paths with the q the fill draws from: softmax(logits / T)
            probs = warp_probs(probs, temperature)
        passes += 1
        new_layer = []
        for f, fv in zip(frontier, frontier_values):
            row = probs[0 if f < 0 else sub_index[f] + 1]                  # (V,)
            top = torch.topk(row, min(width, row.numel()))
            for rank, (pr, tok) in enumerate(zip(top.values.tolist(), top.indices.tolist())):
                ranks.append(rank)
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
    if sample:                                                               # fill the chosen shape by sampling
        paths: dict[int, tuple[int, ...]] = {}
        for i in keep:
            paths[i] = (paths[parents[i]] if parents[i] >= 0 else ()) + (ranks[i],)
        shape = sorted(paths.values(), key=lambda c: (len(c), c))
        tree, fill_passes = build_static_tree(drafter, ctx_ids, shape, sample=True, temperature=temperature,
                                              generator=generator)
        return tree, passes + fill_passes
    return DraftTree(torch.tensor([tokens[i] for i in keep], dtype=torch.long),
                     torch.tensor(tree_parents, dtype=torch.long)), passes


