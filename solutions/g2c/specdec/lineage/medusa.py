"""Beyond (specdec-lineage): Medusa heads, their candidate tree, and typical acceptance (generation 2).

Medusa (Cai, Li, Geng, Peng, Lee, Chen, Dao, "Medusa: Simple LLM Inference Acceleration Framework
with Multiple Decoding Heads", ICML 2024) removes the separate draft model. K small heads sit on
the target's last hidden state h_t, the vector whose unembedding gives token t+1; head i
(1-based) guesses the token i + 1 positions further, t + 1 + i:

    head_i(h) = unembed(h + SiLU(W_i h + b_i))       (section 2.1.1: one residual SiLU block,
                                                      then the target's own (tied) unembedding)

Only W_i and b_i train, on the frozen target (Medusa-1). With W_i = 0 at the start, every head
begins as a copy of the target's next-token head, so training moves it from a sensible point.

The heads guess independently (head 2 does not know which token head 1 picked), so Medusa
hedges: it takes the top-s tokens of each head and verifies many combinations at once as a
TREE in one target pass (section 2.1.2). A rank path (r_1, ..., r_d) names the node whose
token at depth j is head j's rank-r_j token; a sparse set of such paths (``static_choices``)
is the tree.

Typical acceptance (section 2.3.1) is Medusa's opt-in alternative to exact verification:
accept a candidate x when p(x) > min(epsilon, delta * exp(-H(p))), with H the entropy of the
target's distribution p at that position. It accepts more plausible-but-not-exact tokens and
is NOT lossless: the output no longer follows p (``typical_tree_verify``; the lesson measures
the shift). vLLM's port used epsilon = 0.09 and delta = 0.3.

Shape letters: K heads, D width, V vocabulary, n tree nodes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from g2c.kvcache.fast import head_unembed
from g2c.kvcache.forward import unembed
from g2c.sampling.model import check_prob_rows, check_real, check_token_ids, check_whole

from ..trees import DraftTree, build_static_tree, static_choices
from ..trees.verify import _check_rows
from .protocol import HeadOnBase, TreeDrafter, check_draft_mode

__all__ = ["MedusaDrafter", "MedusaHeads", "medusa_loss", "medusa_tree", "typical_accept", "typical_tree_verify"]


class MedusaHeads(HeadOnBase):
    """K Medusa heads on a frozen base ``TransformerLM`` (Cai et al. 2024, section 2.1.1). Provided.

    Args:
        base: the frozen target; kept in a dict so ``parameters()``, ``state_dict()`` and ``to()``
            touch only the heads.
        num_heads: K >= 1.
        generator: unused (the heads start at W = 0); accepted for a uniform constructor.

    Attributes:
        weight: (K, D, D) float32, zeros at the start; bias: (K, D) float32.

    Raises:
        ValueError: num_heads < 1.
    """

    def __init__(self, base, num_heads: int = 4, *, generator: torch.Generator | None = None) -> None:
        super().__init__(base, generator=generator)
        num_heads = check_whole(num_heads, f"MedusaHeads: num_heads must be an int >= 1, got {num_heads!r}")
        dim = base.embedding_dim
        self.num_heads = num_heads
        self.weight = torch.zeros(num_heads, dim, dim, requires_grad=True)
        self.bias = torch.zeros(num_heads, dim, requires_grad=True)
        self.to(base.token_embed.weight.device, base.token_embed.weight.dtype)   # the base's device and dtype

    @classmethod
    def from_config(cls, base, config: dict) -> "MedusaHeads":
        """Rebuild from an artifact's ``config.json`` (``num_medusa_heads``)."""
        return cls(base, int(config["num_medusa_heads"]))

    def config(self) -> dict:
        """What ``from_config`` needs."""
        return {"num_medusa_heads": self.num_heads}

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Per-head features: (..., D) final states -> (..., K, D): h + SiLU(W_i h + b_i).

        Raises:
            ValueError: the last dimension is not the base's D.
        """
        if hidden.shape[-1] != self.base.embedding_dim:
            raise ValueError(f"MedusaHeads expects states (..., D={self.base.embedding_dim}), "
                             f"got {tuple(hidden.shape)}")
        h = hidden.unsqueeze(-2)                                                        # (..., 1, D)
        z = torch.einsum("...d,ked->...ke", hidden, self.weight) + self.bias             # (..., K, D)
        return h + torch.nn.functional.silu(z)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(..., D) final states -> (..., K, V): head i's scores for the token i + 1 beyond the next."""
        return head_unembed(self, self(hidden))


def medusa_loss(heads: MedusaHeads, states: torch.Tensor, *, decay: float = 0.8) -> dict[str, torch.Tensor]:
    """Medusa-1's training loss on the frozen target's states, distilled (section 2.2). Provided.

    Head i at position t is trained towards the target's own distribution for token t + 1 + i
    (the softmax of its unembedded state at t + i: what the target predicts there given the true
    prefix), with weight decay**(i-1) (the paper's lambda_i: later heads are harder and matter
    less, because a node is only reached when every earlier one was accepted).

    Args:
        heads: the ``MedusaHeads``.
        states: (B, T, D) float32, the target's final states over token windows, T > K + 1.
        decay: the per-head weight ratio (the paper uses 0.8).

    Returns:
        dict of scalars: ``loss`` (weighted mean cross-entropy), ``agree_i`` (i = 1..K) the
        fraction of positions where head i's argmax equals the target's.

    Raises:
        ValueError: states not (B, T, D) with T > K + 1.
    """
    K = heads.num_heads
    if states.dim() != 3 or states.shape[1] <= K + 1:
        raise ValueError(f"medusa_loss needs states (B, T, D) with T > K + 1 = {K + 1}, got {tuple(states.shape)}")
    T = states.shape[1]
    logits = heads.logits(states[:, :T - K])                                            # (B, T-K, K, V)
    out, total, weights = {}, 0.0, 0.0
    for i in range(1, K + 1):
        with torch.no_grad():
            teacher = unembed(heads.base, states[:, i:T - K + i]).float()              # (B, T-K, V): token t+1+i
        logq = torch.log_softmax(logits[:, :, i - 1].float(), dim=-1)
        ce = -(torch.softmax(teacher, -1) * logq).sum(-1).mean()
        total = total + decay ** (i - 1) * ce
        weights += decay ** (i - 1)
        out[f"agree_{i}"] = (logq.argmax(-1) == teacher.argmax(-1)).float().mean().detach()
    out["loss"] = total / weights
    return out


def _check_choices(choices, num_heads: int, vocab_size: int | None = None) -> list[tuple[int, ...]]:
    """Rank paths as tuples of ints, validated (the messages start with "medusa_tree:").

    ``choices`` may be any iterable (a generator too): it is read once, into a list, before
    anything is checked, so validation never consumes what the tree is built from."""
    if isinstance(choices, (str, bytes)) or not isinstance(choices, Iterable):          # a wrong type: TypeError
        raise TypeError(f"medusa_tree: choices must be a list of rank paths (tuples of ints such as (0,) or "
                        f"(0, 1)), got {choices!r:.80}")
    choices = list(choices)                                         # read a one-shot iterable once
    if not all(isinstance(c, (tuple, list)) for c in choices):
        raise TypeError(f"medusa_tree: choices must be a list of rank paths (tuples of ints such as (0,) or "
                        f"(0, 1)), got {choices!r:.80}")
    if any(isinstance(r, bool) or not isinstance(r, int) for c in choices for r in c):
        raise TypeError("medusa_tree: ranks must be ints (0 = the head's most probable token)")
    choices = [tuple(c) for c in choices]
    if vocab_size is not None and any(c and max(c) >= vocab_size for c in choices):
        raise ValueError(f"medusa_tree: a rank exceeds the vocabulary size {vocab_size}")
    known = set()
    for i, c in enumerate(choices):
        if not c or min(c) < 0:
            raise ValueError(f"medusa_tree: bad rank path {c}; ranks are ints >= 0")
        if len(c) > num_heads:
            raise ValueError(f"medusa_tree: rank path {c} is {len(c)} deep but there are only {num_heads} heads")
        if i and (len(c), c) <= (len(choices[i - 1]), choices[i - 1]):
            raise ValueError("medusa_tree: choices must be sorted by (depth, ranks) without repeats")
        if c[:-1] and c[:-1] not in known:
            raise ValueError(f"medusa_tree: {c} has no prefix {c[:-1]}; include every prefix")
        known.add(c)
    return choices


def medusa_tree(head_probs: torch.Tensor, choices) -> DraftTree:
    """Medusa's candidate tree: node (r_1, ..., r_d) holds head d's rank-r_d token.

    Args:
        head_probs: (K, V) float, row i the distribution of head i + 1 (any device).
        choices: rank paths, sorted by (depth, ranks) and closed under prefixes (as
            ``static_choices`` returns them), none deeper than K.

    Returns:
        A ``DraftTree`` with one node per rank path, in the order of ``choices``: node j's token
        is the ``c[-1]``-th most probable token of head ``len(c)`` (rank 0 = the argmax), its
        parent the node of ``c[:-1]`` (-1 for a path of length 1). Ties between equal
        probabilities go to the smaller token id.

    Raises:
        ValueError: head_probs not (K, V) or not float distributions (``check_prob_rows``); a path
            deeper than K, unsorted, without its prefix, or with a negative rank (validated for
            you); a rank >= V.
        TypeError: head_probs not a tensor; choices not a list of rank paths (a string); a rank that
            is not an int (validated for you).

    ``choices`` may be any iterable, a generator too: the provided check reads it once.

    Example: head 1 ranks tokens [7, 3, ...], head 2 ranks [5, 9, ...]; choices
    [(0,), (1,), (0, 0), (0, 1)] give tokens [7, 3, 5, 9] with parents [-1, -1, 0, 0].

    Steps:
        1. Validate (provided).
        2. Rank each head's tokens once: a stable descending sort of each row
           (``test_medusa_tree_ties_go_to_the_smaller_id``).
        3. For each path c: the token is ``order[len(c) - 1, c[-1]]``; the parent is the index of
           ``c[:-1]`` among the paths already placed, or -1 (``test_medusa_tree_by_hand``).
    """
    if not isinstance(head_probs, torch.Tensor):
        raise TypeError(f"medusa_tree: head_probs must be a tensor (K, V), got {type(head_probs).__name__}")
    check_prob_rows(head_probs, "medusa_tree: head_probs")             # float distributions (counts are not ranked)
    if head_probs.dim() != 2:
        raise ValueError(f"medusa_tree: head_probs must be (K, V), got {tuple(head_probs.shape)}")
    choices = _check_choices(choices, head_probs.shape[0])
    if choices and max(c[-1] for c in choices) >= head_probs.shape[1]:
        raise ValueError(f"medusa_tree: a rank exceeds the vocabulary size {head_probs.shape[1]}")
    # BEGIN SOLUTION
    order = torch.sort(head_probs.detach().float().cpu(), dim=-1, descending=True, stable=True).indices   # (K, V)
    index: dict[tuple[int, ...], int] = {}
    tokens, parents = [], []
    for c in choices:
        index[c] = len(tokens)
        tokens.append(int(order[len(c) - 1, c[-1]]))
        parents.append(index[c[:-1]] if c[:-1] else -1)
    return DraftTree(torch.tensor(tokens, dtype=torch.long), torch.tensor(parents, dtype=torch.long))
    # END SOLUTION


def typical_accept(probs: torch.Tensor, tokens: torch.Tensor, *, epsilon: float = 0.09,
                   delta: float = 0.3) -> torch.Tensor:
    """Medusa's typical-acceptance test (Cai et al. 2024, section 2.3.1): which candidates pass.

    Accept x at a position with target distribution p when

        p(x) > min(epsilon, delta * exp(-H(p))),   H(p) = -sum_v p(v) log p(v)  (nats; 0 log 0 = 0).

    A confident p (low entropy) raises the bar towards epsilon; a flat p lowers it, so more
    varied text passes. NOT the lossless rule: see ``typical_tree_verify``.

    Args:
        probs: (n, V) float, the target's (temperature-warped) probabilities, rows sum to 1.
        tokens: (n,) int64 candidate ids in [0, V).
        epsilon: the hard threshold, in (0, 1].
        delta: the entropy-scaled threshold's factor, > 0.

    Returns:
        (n,) bool on probs' device.

    Raises:
        ValueError: probs not floating point, not finite, negative or rows not summing to 1
            (``check_prob_rows``); shapes disagree, tokens not integer ids or outside [0, V),
            epsilon outside (0, 1], delta <= 0.
        TypeError: probs not a tensor; epsilon or delta not a real number.

    Steps:
        1. Validate (provided).
        2. The entropy of each row, with 0 log 0 counted as 0 (``torch.xlogy``)
           (``test_typical_accept_zero_probabilities``).
        3. The threshold per row, and compare p(x) strictly (``test_typical_accept_by_hand``).
    """
    if not isinstance(probs, torch.Tensor):
        raise TypeError(f"typical_accept: probs must be a tensor (n, V), got {type(probs).__name__}")
    check_prob_rows(probs, "probs")                   # float, finite, >= 0, rows summing to 1 (the shared check)
    tokens = torch.as_tensor(tokens)
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise ValueError(f"typical_accept: tokens must be integer ids, got dtype {tokens.dtype}")
    if probs.dim() != 2 or tokens.dim() != 1 or tokens.shape[0] != probs.shape[0]:
        raise ValueError(f"typical_accept: probs (n, V) and tokens (n,), got {tuple(probs.shape)} and "
                         f"{tuple(tokens.shape)}")
    check_token_ids(tokens, probs.shape[1], "typical_accept: tokens")
    epsilon = check_real(epsilon, "typical_accept: epsilon", low=0.0, high=1.0, low_open=True)
    delta = check_real(delta, "typical_accept: delta", low=0.0, low_open=True)
    # BEGIN SOLUTION
    p = probs.float()
    entropy = -torch.xlogy(p, p).sum(-1)                                                # (n,)
    threshold = torch.clamp(delta * torch.exp(-entropy), max=epsilon)
    chosen = p.gather(1, tokens.to(p.device).view(-1, 1)).squeeze(1)
    return chosen > threshold
    # END SOLUTION


def typical_tree_verify(tree: DraftTree, target_probs: torch.Tensor, *, epsilon: float = 0.09, delta: float = 0.3,
                        generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Walk the tree with typical acceptance instead of the exact rule. Provided. NOT lossless.

    From the root, move to the first child (in node order) that ``typical_accept`` passes at the
    current row; stop when none does, and emit a sample from the current row's p (the
    correction or bonus token). Because an accepted child is taken whatever its probability,
    the emitted text over-represents the drafts: a top-1 draft x with p(x) = 0.3 that passes
    comes out with probability 1 instead of 0.3.

    Args:
        tree: the draft tree (n >= 0 nodes).
        target_probs: (n+1, V) float rows: row 0 at the root, row i + 1 after node i.
        epsilon, delta: as ``typical_accept``.
        generator: CPU ``torch.Generator`` for the final sample.

    Returns:
        (path, token) as ``tree_speculative_verify``.

    Raises:
        TypeError / ValueError: as ``greedy_tree_verify`` (the message names "target_probs").
    """
    _check_rows(tree, target_probs, "target_probs", generator=generator)
    probs = target_probs.detach().float().cpu()
    path, row = [], 0
    children = [tree.children(-1)]
    while children[-1]:
        kids = children[-1]
        ok = typical_accept(probs[[row] * len(kids)], tree.tokens[kids], epsilon=epsilon, delta=delta)
        hits = [kid for kid, good in zip(kids, ok.tolist()) if good]
        if not hits:
            break
        path.append(hits[0])
        row = hits[0] + 1
        children.append(tree.children(hits[0]))
    token = int(torch.multinomial(probs[row], 1, generator=generator))
    return path, token


class MedusaDrafter(TreeDrafter):
    """Medusa heads behind ``lineage_generate``'s drafter protocol. Provided.

    After each pass the loop hands over the committed positions' final states; the newest one,
    h_t, is all Medusa needs: its K heads give the candidates for tokens t + 2 .. t + 1 + K, and
    ``medusa_tree`` arranges their top ranks as a tree. No drafter pass over tokens at all: c is
    K small matrix products and K unembeddings.

    Args:
        heads: trained ``MedusaHeads`` (``heads, tokenizer = load_model("StoryLM-30M-Medusa")``).
        choices: rank paths (default: ``static_choices`` of 64 paths, cut to depth K); each
            round keeps the first ``max_nodes`` that fit.
        draft_mode: ``"top"`` (default: ``medusa_tree``'s top ranks) or ``"sample"``: at the loop's
            T > 0 the children of every node are drawn without replacement from head d's
            softmax(logits / T) (the same q for every parent at depth d: the heads do not see the
            drafted tokens), the tree carrying their rows (``build_static_tree(..., sample=True)``).

    Raises:
        TypeError: heads is not ``MedusaHeads``; choices not rank paths (a string); a rank that is not
            an int; draft_mode not a string. ValueError: choices empty, deeper than K, unsorted,
            missing a prefix, or with a rank >= V; draft_mode not "top" or "sample".
    """

    def __init__(self, heads: MedusaHeads, choices=None, *, draft_mode: str = "top") -> None:
        if not isinstance(heads, MedusaHeads):
            raise TypeError(f"MedusaDrafter needs MedusaHeads, got {type(heads).__name__}")
        self.draft_mode = check_draft_mode(draft_mode, "MedusaDrafter")
        self.head = heads
        self.base = heads.base
        self.vocab_size = heads.base.vocab_size
        if choices is None:
            choices = [c for c in static_choices(64) if len(c) <= heads.num_heads]
        self.choices = _check_choices(choices, heads.num_heads, heads.base.vocab_size)
        if not self.choices:
            raise ValueError("MedusaDrafter: choices is empty; give at least one rank path, e.g. [(0,)]")
        self._h = None

    def __repr__(self) -> str:
        return f"MedusaDrafter(K={self.head.num_heads}, {len(self.choices)} paths)"

    def read_prefill(self, context_ids: torch.Tensor, states: torch.Tensor) -> None:
        self._h = states[-1, -1] if states.shape[0] else None

    def read_commit(self, context_ids: torch.Tensor, states: torch.Tensor) -> None:
        if states.shape[0]:
            self._h = states[-1, -1]

    @torch.no_grad()
    def draft(self, context_ids: torch.Tensor, *, max_nodes: int, max_depth: int) -> DraftTree:
        if self._h is None:
            return DraftTree.empty()
        weight = self.base.token_embed.weight
        probs = torch.softmax(self.head.logits(self._h.to(weight.device, weight.dtype)).float(), dim=-1)   # (K, V)
        choices = [c for c in self.choices if len(c) <= max_depth][:max_nodes]
        if self.sampling:                                  # sampled drafting: head d's q at depth d
            self._head_probs = probs.cpu()
            return build_static_tree(self, context_ids, choices, **self.sampling)[0]
        return medusa_tree(probs, choices)

    def tree_probs(self, context_ids: torch.Tensor, tree: DraftTree) -> torch.Tensor:
        """(n+1, V): row 0 is head 1's q, the row after a node at depth d head d + 1's (the
        builders' hook; the last head's row repeats past depth K, never drawn from)."""
        rows = torch.cat([torch.zeros(1, dtype=torch.long), tree.depths]).clamp(max=self.head.num_heads - 1)
        return self._head_probs[rows]
