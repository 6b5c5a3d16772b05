"""Beyond (specdec-sampling): ``Draft``, the one value a drafter proposes. Provided.

A round's draft is n tokens, each with a parent (-1 = the pending context token, the root), and
optionally the q rows they were sampled from. A chain is the draft whose node i has parent i - 1;
a tree (``g2c.specdec.trees.DraftTree``) subclasses this value with its own attention and walk.
Whatever the shape, the engine (``speculative_sample``) does the same four things with it:

* the target scores it in one pass: node i at ``positions(length)[1 + i]`` = length + depth_i,
  reading the context and its ancestors (``allowed(length)``: None for a chain, the causal fast
  case; a boolean mask for a tree);
* ``accept(target_logits, verify_round, sampler=..., generator=...)`` walks it against the
  target's 1 + n rows (row 0 after the root, row 1 + i after node i) and returns (accepted nodes,
  the target's own token): a chain with the flat verifier it is given (the engine's
  ``verify_round``); a tree with the tree verifiers of specdec-trees;
* ``accepted(m)`` is the tokens of the first m accepted nodes (what the round emits before its
  own token);
* ``committed_rows(e)`` the scored block's rows (root = 0, node i = 1 + i) that become history
  when e tokens are emitted: the root and the first e - 1 accepted nodes (the newest emitted
  token is pending: the next pass computes its row).

Sources: Leviathan, Kalman, Matias (ICML 2023) for the chain; Miao et al., "SpecInfer" (ASPLOS
2024), section 4, for the tree as a flattened list of (token, parent) nodes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from g2c.sampling.model import check_prob_rows, check_token_ids, zero_prob_draws

from .target import _target_pass

__all__ = ["Draft", "check_draft"]


def as_long_1d(x, name: str, who: str) -> torch.Tensor:
    """``x`` as a 1-D int64 CPU tensor; an empty list is an empty int64 tensor.

    Raises:
        TypeError: not readable as one tensor (text, None, ragged rows).
        ValueError: not 1-D integers (floats, bools and 2-D rows are refused, never cast or
            flattened) or on the meta device.
    """
    if isinstance(x, (list, tuple)) and len(x) == 0:
        return torch.zeros(0, dtype=torch.long)            # torch.as_tensor([]) would be float32
    try:
        t = torch.as_tensor(x)
    except (TypeError, ValueError, RuntimeError, OverflowError):           # "abc", None, ragged rows
        raise TypeError(f"{who}: {name} must be a 1-D integer tensor or list of ints, got {type(x).__name__} "
                        f"{x!r:.40}") from None
    if t.dim() != 1 or t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
        hint = ("; an empty draft is Draft.empty() (torch.tensor([]) is float32)"
                if t.numel() == 0 and t.dtype.is_floating_point else "")
        raise ValueError(f"{who}: {name} must be a 1-D integer tensor, got shape {tuple(t.shape)} "
                         f"dtype {t.dtype}{hint}")
    if t.is_meta:
        raise ValueError(f"{who}: {name} is on the meta device (a shape without values): build it on the CPU")
    return t.long().cpu()


class Draft:
    """A chain of n draft tokens, node i with parent i - 1: the width-1 case of every draft. Provided.

    Args:
        tokens: (n,) integer ids (tensor or list), n >= 0; kept as int64 on the CPU.
        proposal_probs: None (a deterministic draft: q one-hot at each token) or (n, V) floating
            rows, row i the distribution token i was sampled from; kept as float32 on the CPU.

    Attributes:
        tokens (n,) int64, parents (n,) int64 (i - 1), depths (n,) int64 (i + 1),
        proposal_probs (n, V) float32 or None, ``num_nodes`` = n, ``max_depth``,
        ``accepted_nodes``: the node indices ``accept`` accepted (None before it walked).

    Raises:
        TypeError / ValueError: ``tokens`` not 1-D integer ids; ``proposal_probs`` not a tensor,
            not (n, V), or not floating point (an integer table is refused, never converted).
    """

    noun = "draft"                      # how messages name it ("tree" for a DraftTree)
    chain = True                        # a target that scores chains only (a recurrent one) reads this

    def __init__(self, tokens, proposal_probs: torch.Tensor | None = None) -> None:
        tokens = as_long_1d(tokens, "tokens", type(self).__name__)
        self._set(tokens, torch.arange(tokens.numel(), dtype=torch.long) - 1, proposal_probs)
        q = self.proposal_probs
        if q is not None and not q.dtype.is_floating_point:       # the shared rule: refused, never converted
            raise ValueError(f"Draft: proposal_probs must be floating-point probabilities, got dtype {q.dtype}: an "
                             "integer or bool table is refused, never converted (counts or a one-hot of the draft "
                             "are not the rows it was sampled from; pass None for a deterministic draft)")
        if q is not None and not q.is_meta:
            self.proposal_probs = self.proposal_probs.float().cpu()

    def _set(self, tokens: torch.Tensor, parents: torch.Tensor, q) -> None:
        """Store the nodes; a parent-before-child order and q's shape are checked here."""
        who = type(self).__name__
        if tokens.numel() != parents.numel():
            raise ValueError(f"{who}: tokens has {tokens.numel()} entries but parents has {parents.numel()}; "
                             "give one parent per node")
        if tokens.numel() and int(tokens.min()) < 0:        # an index from the end of every table it meets
            raise ValueError(f"{who}: tokens holds the id {int(tokens.min())}; token ids are >= 0")
        depths = torch.zeros_like(parents)
        for i, p in enumerate(parents.tolist()):
            if not -1 <= p < i:
                raise ValueError(f"{who}: node {i} has parent {p}; parents must be -1 (the root) or an "
                                 "earlier node (flattened order: parents before children)")
            depths[i] = 1 if p < 0 else depths[p] + 1
        if q is not None:
            if not isinstance(q, torch.Tensor):
                raise TypeError(f"{who}: proposal_probs must be an (n, V) tensor or None, got {type(q).__name__}")
            if q.dim() != 2 or q.shape[0] != tokens.numel():
                raise ValueError(f"{who}: proposal_probs must be (n, V) = ({tokens.numel()}, V), got "
                                 f"{tuple(q.shape)}")
        self.tokens, self.parents, self.depths, self.proposal_probs = tokens, parents, depths, q
        self.accepted_nodes: list[int] | None = None

    @classmethod
    def empty(cls) -> "Draft":
        """A draft of no node: the window edge's plain step."""
        return Draft(torch.zeros(0, dtype=torch.long))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.num_nodes} nodes, depth {self.max_depth}, "
                f"q={'None' if self.proposal_probs is None else 'rows'}, accepted={self.accepted_nodes})")

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())

    @property
    def max_depth(self) -> int:
        return int(self.depths.max()) if self.num_nodes else 0

    def numel(self) -> int:
        """n, the drafted nodes (the ``drafted`` counter of ``SpecStats``)."""
        return self.num_nodes

    def __len__(self) -> int:
        return self.num_nodes

    def check(self, vocab_size: int, *, k: int | None = None, source: str = "draft") -> "Draft":
        """Refuse a draft a target must not read; returns self.

        Raises:
            ValueError: more than ``k`` nodes; a token outside [0, V); proposal rows over another
                vocabulary, on the meta device, or not distributions (``check_prob_rows``); a node
                whose own row gives its token probability 0 (a token cannot be sampled from a row that
                excludes it, and the verifier's ratio p/q would divide by zero).
        """
        if k is not None and self.num_nodes > k:
            raise ValueError(f"{source} must return a draft of at most k={k} tokens, got {self.num_nodes}")
        noun = self.noun
        check_token_ids(self.tokens, vocab_size, f"{source}: {noun}.tokens")
        q = self.proposal_probs
        if q is not None:
            if q.shape[1] != vocab_size:
                raise ValueError(f"{source}: {noun}.proposal_probs has V={q.shape[1]} but the target has "
                                 f"V={vocab_size}; drafter and target must share one vocabulary")
            if q.is_meta:
                raise ValueError(f"{source}: {noun}.proposal_probs is on the meta device (a shape without values)")
            check_prob_rows(q, f"{source}: {noun}.proposal_probs")
            zero = zero_prob_draws(q, self.tokens)             # check_prob_rows has refused NaN rows
            if zero:
                i = zero[0]
                raise ValueError(f"{source}: node {i} (token {int(self.tokens[i])}) gives probability 0 to its "
                                 f"own token in {noun}.proposal_probs: each row must be the distribution its node was "
                                 "sampled from (None for a deterministic draft)")
        return self

    def positions(self, length: int) -> torch.Tensor:
        """(1 + n,) int64 on the CPU: the root (the pending token) at ``length``, node i at
        length + depth_i."""
        return torch.cat([torch.tensor([length]), length + self.depths])

    def allowed(self, length: int) -> torch.Tensor | None:
        """What each scored row reads: None for a chain (causal attention, the fast case)."""
        return None

    def rows(self, model, context_ids: torch.Tensor, *, want_hidden: bool = False):
        """The draft scored by a model without a cache, in ONE pass over the context cropped to
        ``max_seq_len - max_depth`` tokens + the nodes: (logits (1 + n, V), the block's final states
        (T, D) when ``want_hidden``, else None). A chain is one causal pass of the model (module 09's
        forward, or ``hidden_states`` and the unembedding for the states)."""
        block = torch.cat([context_ids[-(model.max_seq_len - self.num_nodes):], self.tokens])     # (T + k',)
        return _target_pass(model, block, self.num_nodes + 1, want_hidden=want_hidden)

    def accept(self, target_logits: torch.Tensor, verify: Callable, *, sampler,
               generator: torch.Generator | None = None) -> tuple[int, int]:
        """Walk the draft against the target's rows; (accepted nodes m, correction or bonus token).

        Args:
            target_logits: (1 + n, V) raw logits, row 0 after the root, row 1 + i after node i.
            verify: the chain's walk, ``verify(tokens, q rows or None, target_logits, sampler=...,
                generator=...) -> (m, token)``: the engine passes ``verify_round`` (the seed's
                ``greedy_verify`` / ``speculative_verify``). A tree ignores it and walks itself.
            sampler: the round's ``Sampler``; generator: CPU generator of the sampled walk.
        Afterwards ``accepted_nodes`` is [0, ..., m - 1].
        """
        num_accepted, token = verify(self.tokens, self.proposal_probs, target_logits, sampler=sampler,
                                     generator=generator)
        self.accepted_nodes = list(range(num_accepted))
        return num_accepted, token

    def _accepted(self) -> list[int]:
        if self.accepted_nodes is None:
            raise RuntimeError(f"{type(self).__name__}: no accepted nodes yet: walk the draft (accept) first")
        return self.accepted_nodes

    def accepted(self, num: int) -> list[int]:
        """The tokens of the first ``num`` accepted nodes, as Python ints."""
        return self.tokens[self._accepted()[:num]].tolist()

    def committed_rows(self, num_emitted: int) -> list[int]:
        """Rows of the scored block (root = 0, node i = 1 + i) that become history when
        ``num_emitted`` tokens were emitted: the root and the first num_emitted - 1 accepted nodes
        (the newest emitted token is pending: its row is computed by the next pass). A draft that
        was never walked (the window edge's plain step) keeps the root alone."""
        accepted = self.accepted_nodes or []
        return [0] + [1 + i for i in accepted[:max(0, num_emitted - 1)]]


def check_draft(proposal, drafter, *, k: int, vocab_size: int) -> Draft:
    """What ``drafter.propose(ids, k)`` returned, refused unless it is a ``Draft`` that fits. Provided.

    Raises:
        TypeError: the proposal is not a ``Draft`` (a tuple of ids and q rows, a bare tensor: wrap
            them as ``Draft(ids, q)``).
        ValueError: as ``Draft.check`` (more than k nodes, ids outside the vocabulary, q rows that
            are not distributions or give a drafted token probability 0).
    """
    name = type(drafter).__name__
    if not isinstance(proposal, Draft):
        hint = (": return Draft(draft_ids, draft_probs) (g2c.specdec.sampling.Draft)"
                if isinstance(proposal, (tuple, list, torch.Tensor)) else "")
        raise TypeError(f"{name}.propose must return a Draft (g2c.specdec.sampling.Draft), got "
                        f"{type(proposal).__name__}{hint}")
    return proposal.check(vocab_size, k=k, source=f"{name}.propose")
