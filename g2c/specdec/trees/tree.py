"""Beyond (specdec-trees): the draft tree, its static shapes, and the tree formula for tau.

A chain spends its draft budget on one guess per position. A draft *tree* keeps several
candidates where the drafter is unsure, and the target verifies every root-to-node path in
one pass (``attention.py``); verification then walks the tree (``verify.py``). The builders
that fill a shape with a drafter's tokens are in ``builders.py``.

Representation (``DraftTree``). The root is implicit: it is the last committed token, the
end of the context. The n draft nodes are stored flattened, node i with

    tokens[i]   the drafted token id,
    parents[i]  the index of its parent node, or -1 when its parent is the root,
    depths[i]   the number of draft tokens on the root-to-i path, i included (1 for a
                child of the root); node i sits at position C + depths[i] - 1 after a
                context of C tokens (the "context length + depth" of the lecture, depth
                counted from 0 there).

Flattened order, the contract every function here keeps: parents come before their
children (``parents[i] < i``), so one left-to-right sweep sees every ancestor first; the
builders emit nodes level by level (breadth first), and siblings in the order verification
tries them, the drafter's most probable first.

Builders:
    * static (Medusa-style): a fixed shape given as rank paths ("choices"), the same for every
      context; node (r1, ..., rd) is the r_d-th most probable drafter token after node
      (r1, ..., r_{d-1}). Cai et al., "Medusa" (ICML 2024), section 2.1.2 (tree attention over
      the Cartesian product of the heads' top-k) and the sparse tree of section 2.3.3 (keep
      the nodes with the highest estimated accuracy). A chain is the static shape
      (0,), (0, 0), (0, 0, 0), ...
    * dynamic (EAGLE-2-style): Li et al., "EAGLE-2: Faster Inference of Language Models with
      Dynamic Draft Trees" (EMNLP 2024), section 4. A node's value is the product of the
      drafter's probabilities along its path (its "global acceptance probability" estimate).
      Expansion (4.1): at each depth expand the ``width`` highest-value nodes of the newest
      layer with their ``width`` most probable children. Reranking (4.2): keep the n
      highest-value nodes of everything drafted. A child's value never exceeds its parent's,
      so the kept set is a tree (ties go to the shallower node).

Expected tokens per pass (the lecture's "Draft Trees" section): with a(v) the probability
that node v is accepted given its parent was, at most one node per depth continues the
committed text, so E[tau] = 1 + sum over nodes v of prod_{u on path(root, v)} a(u).

Shape letters: n nodes, C context length, V vocabulary.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import torch

from g2c.sampling.model import check_real, check_whole

from ..sampling.draft import Draft, as_long_1d
from ..theory import tree_expected_tokens

__all__ = ["DraftTree", "chain_choices", "chain_tree", "expected_tokens_per_pass", "node_acceptance_probs",
           "static_choices"]


class DraftTree(Draft):
    """n draft nodes in the flattened order described in the module docstring: the tree case of
    ``g2c.specdec.sampling.Draft``, with its own attention and acceptance walk. Provided.

    Args:
        tokens: (n,) int64 drafted token ids (CPU), n >= 0.
        parents: (n,) int64, ``parents[i]`` in [-1, i); -1 is the root (the context end).
        proposal_probs: optional (n, V) float32: row i is the distribution node i's token was
            drawn from, given its parent and its earlier siblings (SpecInfer's q for sampled
            children). None means every node was chosen deterministically (a top-rank
            pick), i.e. one-hot rows; sampled verification then accepts node i with
            probability p(token_i) under the current residual.
        rule: None (exact, lossless) or ``rule(tree, target_probs (n+1, V), generator) -> (path,
            token)`` used by ``accept`` at temperature > 0 (``g2c.specdec.lineage.typical_tree_verify``
            with its epsilon and delta bound).
        measure: also compute ``expected`` at ``accept``: the tree formula's expected accepted
            drafts under the target's own probabilities (``expected_accepted``; one-hot at T = 0).

    Attributes (computed): ``depths`` (n,) int64, ``num_nodes``, ``max_depth``; after ``accept``,
    ``accepted_nodes`` (the accepted path) and, with ``measure``, ``expected``.
    Raises:
        TypeError: tokens or parents not readable as integers (None, text); proposal_probs not a
            tensor.
        ValueError: tokens/parents not 1-D integers of the same length; a negative token id; a
            parent index not in [-1, i) (the message names the node and says parents must come
            first); or proposal_probs not (n, V).
    Sources: Miao et al., "SpecInfer", ASPLOS 2024, section 4 (tree attention, VerifyGreedy and
    VerifyStochastic).
    """

    noun = "tree"
    chain = False

    def __init__(self, tokens, parents, proposal_probs: torch.Tensor | None = None, *, rule=None,
                 measure: bool = False) -> None:
        self._set(as_long_1d(tokens, "tokens", "DraftTree"), as_long_1d(parents, "parents", "DraftTree"),
                  proposal_probs)
        self.rule, self.measure = rule, measure
        self.expected: float | None = None

    def check(self, vocab_size: int, *, k: int | None = None, source: str = "tree") -> "DraftTree":
        """Validate a tree made outside the course's builders (a custom drafter's) before a target
        reads it; returns it unchanged. Also callable as ``DraftTree.check(tree, V, source=...)``.
        Args:
            vocab_size: the target's V.
            k: ignored: a tree's node budget is its drafter's own (``TreeDrafter.bind``).
            source: who made it, for the message ("EagleDrafter.draft()").
        Raises:
            TypeError: called on something that is not a ``DraftTree`` (names ``source`` and the type).
            ValueError: as ``Draft.check`` ("<source>: tree.tokens holds token id V, outside the
                vocabulary [0, V)"; proposal rows over another vocabulary, on the meta device, not
                distributions, or giving their own node's token probability 0).
        """
        if not isinstance(self, DraftTree):
            raise TypeError(f"{source} must return a DraftTree (g2c.specdec.trees.DraftTree), got "
                            f"{type(self).__name__}")
        return Draft.check(self, vocab_size, source=source)

    def children(self, node: int) -> list[int]:
        """Indices of the children of ``node`` (-1 = root), in flattened (try) order."""
        return [i for i, p in enumerate(self.parents.tolist()) if p == node]

    def path(self, node: int) -> list[int]:
        """Node indices from the root's child down to ``node`` (empty for the root, -1)."""
        out = []
        while node >= 0:
            out.append(node)
            node = int(self.parents[node])
        return out[::-1]

    def path_tokens(self, node: int) -> list[int]:
        """The draft tokens on the root-to-``node`` path."""
        return [int(self.tokens[i]) for i in self.path(node)]

    def subtree(self, keep: list[int]) -> "DraftTree":
        """The tree of the nodes in ``keep`` (which must contain every kept node's parent),
        in their flattened order, parents renumbered."""
        keep = sorted(set(keep))
        new_index = {old: new for new, old in enumerate(keep)}
        parents = []
        for old in keep:
            p = int(self.parents[old])
            if p >= 0 and p not in new_index:
                raise ValueError(f"DraftTree.subtree: node {old} kept without its parent {p}")
            parents.append(new_index[p] if p >= 0 else -1)
        q = None if self.proposal_probs is None else self.proposal_probs[keep]
        return DraftTree(self.tokens[keep], torch.tensor(parents, dtype=torch.long), q, rule=self.rule,
                         measure=self.measure)

    def truncate(self, max_depth: int) -> "DraftTree":
        """Drop every node deeper than ``max_depth`` (>= 0)."""
        return self.subtree([i for i in range(self.num_nodes) if int(self.depths[i]) <= max_depth])

    def fit(self, max_nodes: int, max_depth: int) -> "DraftTree":
        """The tree a pass can hold: no node deeper than ``max_depth``, then the first ``max_nodes``
        nodes (parents come first, so the kept nodes' parents are kept)."""
        tree = self.truncate(max_depth)
        return tree.subtree(list(range(min(max_nodes, tree.num_nodes))))

    @classmethod
    def empty(cls) -> "DraftTree":
        return DraftTree(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long))

    def allowed(self, length: int) -> torch.Tensor:
        """(1 + n, length + 1 + n) bool: every row reads the ``length`` cached rows, then the root
        and its own ancestors (itself included)."""
        from g2c.specdec import trees  # the package, at call time: attention.py imports this file

        return trees.tree_rows(self, length)[1]

    def rows(self, model, context_ids: torch.Tensor, *, want_hidden: bool = False):
        """The tree scored without a cache (``tree_logits``: one tree-attention pass for a
        ``TransformerLM``, path by path for any other model): ((1 + n, V) float32 on the CPU, None).

        Raises:
            ValueError: ``want_hidden``: a tree's states come from a ``CachedTarget`` with ``layers``.
        """
        from g2c.specdec import trees  # the package, at call time: attention.py imports this file

        if want_hidden:
            raise ValueError("a tree drafter reads the target's states from a CachedTarget(model, layers=...) "
                             "(g2c.specdec.sampling); a recomputing target scores trees without them")
        return trees.tree_logits(model, context_ids, self).cpu(), None

    def accept(self, target_logits: torch.Tensor, verify=None, *, sampler,
               generator: torch.Generator | None = None) -> tuple[int, int]:
        """Walk the tree against the target's rows; (accepted nodes, correction or bonus token).
        Args:
            target_logits: (1 + n, V) raw logits, row 0 after the root, row 1 + i after node i.
            verify: the chain's walk (``Draft.accept``), not used: a tree walks itself.
            sampler: the round's ``Sampler`` (greedy at temperature 0; else its warped p).
            generator: CPU generator of the sampled walk.
        At temperature 0 the greedy walk (``greedy_tree_verify``); else SpecInfer's recursive
        rejection sampling with the nodes' q rows (``tree_speculative_verify``), or ``rule``.
        """
        from g2c.specdec import trees  # the package, at call time: verify.py imports this file

        logits = target_logits.cpu()
        if sampler.greedy:
            path, token = trees.greedy_tree_verify(self, logits)
            probs = None
        else:
            probs = sampler.probs(logits)
            if self.rule is not None:
                path, token = self.rule(self, probs, generator)
            else:
                path, token = trees.tree_speculative_verify(self, probs, generator=generator)
        if self.measure:                      # the tree formula's expectation under the target's own p
            if probs is None:
                probs = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
            self.expected = trees.expected_accepted(self, probs)
        self.accepted_nodes = list(path)
        return len(self.accepted_nodes), int(token)


def chain_tree(tokens) -> DraftTree:
    """A chain as a ``DraftTree``: node i is ``tokens[i]`` with parent i - 1. Provided.
    Raises:
        ValueError: ``tokens`` not 1-D integer ids (floats, bools and 2-D rows are refused, never cast
            or flattened) or on the meta device. TypeError: not readable as one tensor (text, None).
    """
    tokens = as_long_1d(tokens, "tokens", "chain_tree")
    return DraftTree(tokens, torch.arange(tokens.numel(), dtype=torch.long) - 1)


# -- shapes ---------------------------------------------------------------------------------
def chain_choices(k: int) -> list[tuple[int, ...]]:
    """The chain of k drafts as a static shape: (0,), (0, 0), ..., k zeros."""
    k = check_whole(k, f"chain_choices: k must be an int >= 0, got {k!r}", low=0)
    return [(0,) * d for d in range(1, k + 1)]


def static_choices(num_nodes: int, rank_accept: tuple[float, ...] = (0.6, 0.2, 0.1, 0.05)) -> list[tuple[int, ...]]:
    """A fixed tree shape of ``num_nodes`` rank paths, best first (Medusa section 2.3.3 style).

    Each rank r of the drafter is assumed accepted with probability ``rank_accept[r]``
    independently of the context (a static prior; Medusa estimates it on calibration data),
    so a path's estimated acceptance is the product over its ranks; we keep the
    ``num_nodes`` best paths (closed under prefixes), ties to the shorter path.

    Returns:
        rank paths sorted by (depth, ranks): the order ``build_static_tree`` expects.

    Raises:
        ValueError: num_nodes < 0, or rank_accept empty or not in (0, 1].
        TypeError: rank_accept not an iterable of real numbers (read once: a generator works).
    """
    num_nodes = check_whole(num_nodes, f"static_choices: num_nodes must be an int >= 0, got {num_nodes!r}", low=0)
    if isinstance(rank_accept, (str, bytes)) or not isinstance(rank_accept, Iterable):
        raise TypeError(f"static_choices: rank_accept must be a sequence of probabilities, got "
                        f"{type(rank_accept).__name__}")
    rank_accept = tuple(check_real(a, "static_choices: rank_accept entry") for a in rank_accept)   # read once
    if not rank_accept or not all(0.0 < a <= 1.0 for a in rank_accept):
        raise ValueError(f"static_choices: rank_accept must be probabilities in (0, 1], got {rank_accept}")
    heap = [(-a, 1, (r,)) for r, a in enumerate(rank_accept)]
    heapq.heapify(heap)
    chosen = []
    while heap and len(chosen) < num_nodes:
        neg, depth, path = heapq.heappop(heap)
        chosen.append(path)
        for r, a in enumerate(rank_accept):
            heapq.heappush(heap, (neg * a, depth + 1, path + (r,)))
    return sorted(chosen, key=lambda c: (len(c), c))


# -- the tree formula -----------------------------------------------------------------------
def node_acceptance_probs(tree: DraftTree, target_probs: torch.Tensor) -> torch.Tensor:
    """a(v) for deterministic drafts: P(node v accepted | its parent accepted). Provided.

    With one-hot proposals (``tree.proposal_probs is None``), sampled tree verification
    (``tree_speculative_verify``) emits a sample of the target's distribution p at the
    parent and follows the child holding that token, so a(v) = p_parent(token_v) for the
    first sibling holding a token and 0 for a repeated one. Greedy verification is the case
    where p is one-hot at the argmax.

    Args:
        tree: a DraftTree without proposal_probs.
        target_probs: (n+1, V) float, row 0 at the root, row i+1 at node i.

    Returns:
        (n,) float32 CPU.

    Raises:
        ValueError: the tree carries proposal_probs (no closed form here), or target_probs
            is not (n+1, V).
    """
    n = tree.num_nodes
    if tree.proposal_probs is not None:
        raise ValueError("node_acceptance_probs: only for deterministic drafts (proposal_probs=None)")
    if target_probs.dim() != 2 or target_probs.shape[0] != n + 1:
        raise ValueError(f"node_acceptance_probs: target_probs must be (n+1, V) = ({n + 1}, V), "
                         f"got {tuple(target_probs.shape)}")
    p = target_probs.detach().float().cpu()
    a = torch.zeros(n)
    seen: set[tuple[int, int]] = set()
    for i in range(n):
        parent, tok = int(tree.parents[i]), int(tree.tokens[i])
        if (parent, tok) not in seen:
            a[i] = p[parent + 1, tok]
            seen.add((parent, tok))
    return a


def expected_tokens_per_pass(tree: DraftTree, accept_probs: torch.Tensor) -> float:
    """E[tau] = 1 + sum_v prod_{u in path(root, v)} a(u): the lecture's tree formula. Provided.

    Args:
        tree: the draft tree.
        accept_probs: (n,) a(v) in [0, 1], node v's acceptance probability given its parent.

    Returns:
        Expected tokens emitted per target pass (accepted drafts + the correction/bonus
        token), before budget and end-of-sequence cuts. For a chain of k with a = alpha
        everywhere it is (1 - alpha^(k+1)) / (1 - alpha).

    Raises:
        ValueError: accept_probs not (n,) or outside [0, 1].
    """
    a = torch.as_tensor(accept_probs).detach().cpu().float()
    if a.shape != (tree.num_nodes,):
        raise ValueError(f"expected_tokens_per_pass: accept_probs must be ({tree.num_nodes},) values in [0, 1], "
                         f"got shape {tuple(a.shape)}")
    try:   # the formula lives once, in theory.py; this adapts a DraftTree to it
        return tree_expected_tokens([int(x) for x in tree.parents], a.tolist())
    except ValueError as exc:
        raise ValueError(f"expected_tokens_per_pass: accept_probs must be ({tree.num_nodes},) values in [0, 1]: "
                         f"{exc}") from exc
