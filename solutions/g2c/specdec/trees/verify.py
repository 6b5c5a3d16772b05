"""Beyond (specdec-trees): verifying a draft tree, greedy and sampled, and the tree loop.

The target scored every node in one pass (``attention.py``): row 0 of the n + 1
verification rows is its prediction after the context (the root), row i + 1 its prediction
after node i. Verification walks down from the root: at the current node, does one of its
children hold the token the target would produce there? If yes, accept that child and
continue from it; if not, emit the target's own token (the correction token) and stop.
Reaching a leaf, the target's token after it is the bonus token. Every pass emits
accepted + 1 tokens, as for a chain; at most one node per depth can be accepted.

Greedy: the target's token is its argmax (SpecInfer, Miao et al., ASPLOS 2024, section 4.3,
VerifyGreedy in Algorithm 2). The output is the target's greedy text, whatever the tree.

Sampled: SpecInfer's multi-step speculative sampling (section 4.3, VerifyStochastic in
Algorithm 2, Theorem 4.2): at the current node with target distribution p, try the children
in order; child x drawn from q is accepted with probability min(1, p(x) / q(x)); after a
rejection p becomes the residual normalize(max(0, p - q)) and the next child is tried
against it; when every child is rejected, sample from the last residual. Each try is one
Leviathan-style step whose rejection branch, instead of sampling the residual at once,
hands it to the next sibling, so the emitted token follows p exactly. A deterministic
child (a top-rank pick, ``proposal_probs=None``) is the case q = one-hot: accepted with
probability p(x), and rejection removes x from p. Children drawn WITHOUT replacement
(``build_*_tree(..., sample=True)``) carry, as their q, the drafter's distribution with the
earlier siblings' tokens removed and renormalised: the rule is unchanged, only the rows are
(Jeon et al., "Recursive Speculative Decoding", ICML 2024, arXiv 2402.14160).

Shape letters: n nodes, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

from g2c.sampling.model import (
    check_count,
    check_flag,
    check_generator,
    check_language_model,
    check_prob_rows,
    check_score_rows,
    check_token_ids,
    check_whole,
)

from ..generate import SpecStats, draft_room
from ..sampling.drafters import Drafter
from ..sampling.loop import speculative_sample
from ..sampling.target import CachedTarget, RecomputeTarget, Target
from .builders import build_dynamic_tree, build_static_tree, check_choices
from .tree import DraftTree, chain_choices, expected_tokens_per_pass, node_acceptance_probs, static_choices

__all__ = ["LMTreeDrafter", "TreeStats", "expected_accepted", "greedy_tree_verify", "sampled_acceptance_probs",
           "tree_speculative_generate", "tree_speculative_verify", "tree_target"]


def _check_rows(tree: DraftTree, rows: torch.Tensor, name: str, *, generator=None) -> None:
    """Validate a (n+1, V) table for a tree: the flat verifiers' checks, in the same shared
    helpers. Provided.

    Raises:
        TypeError: tree is not a DraftTree; generator not None or a ``torch.Generator``.
        ValueError: rows not (n+1, V) or not floating point; a node token outside [0, V) ("tree.tokens holds token
            id ..."); logits (``name`` not ending in ``_probs``) holding NaN or a row of only -inf;
            probabilities (``target_probs``) or the tree's ``proposal_probs`` that are not
            distributions (``check_prob_rows``: finite, >= 0, rows summing to 1).
    """
    if not isinstance(tree, DraftTree):
        raise TypeError(f"tree must be a DraftTree, got {type(tree).__name__}")
    check_generator(generator)
    if not isinstance(rows, torch.Tensor) or rows.dim() != 2 or rows.shape[0] != tree.num_nodes + 1:
        shape = tuple(rows.shape) if isinstance(rows, torch.Tensor) else type(rows).__name__
        raise ValueError(f"{name} must have shape (n+1, V) = ({tree.num_nodes + 1}, V) for a tree of "
                         f"n={tree.num_nodes} nodes (row 0 = root, row i+1 = node i), got {shape}")
    check_token_ids(tree.tokens, rows.shape[1], "tree.tokens")
    if name.endswith("_probs"):
        check_prob_rows(rows, name)
        check_prob_rows(tree.proposal_probs, "tree.proposal_probs")
    else:
        check_score_rows(rows, name)


def greedy_tree_verify(tree: DraftTree, target_logits: torch.Tensor) -> tuple[list[int], int]:
    """Greedy tree verification: the longest path that agrees with the target's argmax.

    Args:
        tree: the draft tree (n >= 0 nodes).
        target_logits: (n+1, V) float: row 0 scores the position after the context, row
            i + 1 the position after node i.

    Returns:
        (path, token): ``path`` the accepted node indices from the root's child down (empty
        if nothing was accepted); ``token`` the target's argmax at the last accepted node (at
        the root if none): the correction token when no child matched, the bonus token
        when the walk ended at a leaf.

    Raises:
        TypeError: tree is not a DraftTree.
        ValueError: target_logits is not (n+1, V) (message names "target_logits").

    Steps:
        1. Validate with ``_check_rows(tree, target_logits, "target_logits")`` (provided).
        2. The target's choice at every row: argmax over V, (n+1,).
        3. Start at the root (-1). Look among the current node's children
           (``tree.children``) for one whose token equals the choice at the current row; if
           there is one, append it to the path and move to it; otherwise stop
           (``test_greedy_tree_verify_by_hand``).
        4. Return the path and the choice at the row of the node where you stopped
           (``test_greedy_tree_verify_bonus_at_leaf``).
    """
    _check_rows(tree, target_logits, "target_logits")
    # BEGIN SOLUTION
    choice = target_logits.argmax(dim=-1).tolist()                          # (n+1,)
    kids: dict[int, list[int]] = {}
    for i, p in enumerate(tree.parents.tolist()):
        kids.setdefault(p, []).append(i)
    tokens = tree.tokens.tolist()
    path: list[int] = []
    node = -1
    while True:
        want = choice[node + 1]
        nxt = next((c for c in kids.get(node, []) if tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt
    # END SOLUTION


def tree_speculative_verify(tree: DraftTree, target_probs: torch.Tensor, *,
                            generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """Sampled tree verification, lossless: SpecInfer's multi-step speculative sampling.

    At the current node (start: the root) let p be the target's distribution there. For each
    child v in flattened order, with x = its token and q = its proposal row
    (``tree.proposal_probs[v]``, or one-hot at x when the tree has none):

        draw u ~ U[0, 1); accept v when u * q(x) < p(x)   (i.e. with probability min(1, p(x)/q(x)));
        accepted: append v to the path, move to v, start again with p = target_probs[v + 1];
        rejected: p <- normalize(max(0, p - q)) and try the next sibling.

    If every child is rejected, emit a sample from the current p (the last residual); if the
    node is a leaf, emit a sample from its target row (the bonus token).

    Args:
        tree: the draft tree; its proposal rows must be the distributions the children were
            drawn from (given their parent and earlier siblings: for draws without replacement,
            q with the earlier siblings' tokens removed and renormalised) for the result to be
            exact.
        target_probs: (n+1, V) float, the target's (warped) probabilities: row 0 at the
            root, row i + 1 after node i.
        generator: a CPU ``torch.Generator`` for the uniforms and the final sample.

    Returns:
        (path, token): accepted node indices (root side first) and the emitted
        correction/bonus token.

    Raises:
        TypeError / ValueError: as ``greedy_tree_verify`` (the message names "target_probs");
            ValueError when proposal_probs has a different V from target_probs.

    Edge cases (our choice, as ``speculative_verify``): the division-free test accepts when
    q(x) = 0 < p(x) and never accepts p(x) = 0; a residual that sums to 0 (p <= q
    everywhere, a rejection of probability ~0 reached through rounding) falls back to the
    current p.

    Steps:
        1. Validate (provided). Work in float64 on the CPU.
        2. Walk from the root. At each node, loop over its children: one uniform per try
           (``test_tree_speculative_verify_matches_target_distribution``).
        3. After a rejection, replace p by the normalised positive residual (the step the
           planted wrong variant forgets; the same test catches it).
        4. Sample the final token from p with ``torch.multinomial(..., generator=generator)``
           (``test_tree_speculative_verify_bonus_at_leaf``).
    """
    _check_rows(tree, target_probs, "target_probs", generator=generator)
    if tree.proposal_probs is not None and tree.proposal_probs.shape[1] != target_probs.shape[1]:
        raise ValueError(f"proposal_probs has V={tree.proposal_probs.shape[1]} but target_probs has "
                         f"V={target_probs.shape[1]}; drafter and target must share one vocabulary")
    # BEGIN SOLUTION
    P = target_probs.detach().cpu().double()                                # (n+1, V): CPU first (MPS has no float64)
    Q = None if tree.proposal_probs is None else tree.proposal_probs.detach().cpu().double()
    kids: dict[int, list[int]] = {}
    for i, par in enumerate(tree.parents.tolist()):
        kids.setdefault(par, []).append(i)
    tokens = tree.tokens.tolist()
    path: list[int] = []
    node = -1
    while True:
        p = P[node + 1].clone()                                             # (V,)
        for child in kids.get(node, []):
            x = tokens[child]
            if Q is None:
                q = torch.zeros_like(p)
                q[x] = 1.0
            else:
                q = Q[child]
            u = float(torch.rand(1, generator=generator, dtype=torch.float64))
            if u * float(q[x]) < float(p[x]):
                path.append(child)
                node = child
                break
            residual = (p - q).clamp(min=0.0)
            if float(residual.sum()) > 0.0:
                p = residual / residual.sum()
        else:
            return path, int(torch.multinomial(p, 1, generator=generator))
    # END SOLUTION


@dataclass
class TreeStats(SpecStats):
    """``SpecStats`` plus what a tree run spends. Provided.

    Attributes (besides SpecStats'): ``drafter_passes`` (drafter tree passes to build the
    trees; ``drafted`` counts the verified nodes), ``expected_accepted`` (sum
    over passes of the tree formula's expected accepted drafts, sum_v prod a(u), computed
    from the target's own probabilities: ``expected_tokens_per_pass`` minus 1; comparable
    with ``accepted`` in expectation when no budget or EOS cut applies), and with the
    target's KV cache (``use_cache``): ``kv_bytes_moved`` (bytes the accepted-path gather
    copied, summed over passes; 0 for a chain) and ``kv_rows_dropped`` (tree rows written
    but not committed).
    """

    drafter_passes: int = 0
    expected_accepted: float = 0.0
    kv_bytes_moved: int = 0
    kv_rows_dropped: int = 0
    logprobs: list[float] | None = field(default=None, repr=False)   # with logprobs=True


class LMTreeDrafter(Drafter):
    """A language model that drafts trees (chain, static or EAGLE-2 dynamic shape), behind the
    engine's drafter protocol (``g2c.specdec.sampling.drafters``). Provided.

    ``propose(ids, k)`` builds a tree over the whole context with ``build_static_tree`` /
    ``build_dynamic_tree`` (the drafter recomputes) and returns a ``DraftTree``: at most
    ``draft_room(num_nodes, visible, window)`` nodes (the first ones, parents before children), none
    deeper than min(tokens left - 1, room, drafter window - 1) (a deeper node could never be
    emitted with its bonus); at depth 0 an empty tree (a plain step through the tree walk).

    Args:
        drafter: ids (1, T) -> logits (1, T, V) with ``max_seq_len`` and ``vocab_size``.
        target: the tree target it drafts for (``start_pos`` and ``window`` give its visible context).
        shape, choices, num_nodes, width, draft_mode: as ``tree_speculative_generate``'s ``tree``,
            ``choices``, ``num_nodes``, ``width`` and ``draft_mode``, checked here (the engine checks
            the run's own arguments once; these shape the drafter's trees).
        max_new_tokens: the run's budget: ``start`` sets the length at which it is spent
            (prompt + max_new_tokens), and the builders' sampled-drafting keywords from the
            engine's ``Sampler`` and generator (``draft_mode="sample"`` at T > 0).

    Attributes: ``drafter_passes`` (the builders' drafter passes), ``expected_accepted`` (sum over
    rounds of the tree formula's expected accepted drafts, from the target's own probabilities).

    Raises:
        TypeError: ``drafter`` not a language model ("drafts trees with a language model"; a drafter
            wrapping one: "pass drafter.model"), ``shape`` not a str, ``width`` or ``num_nodes`` of
            the wrong type.
        ValueError: as ``tree_speculative_generate`` for ``shape``, ``choices``, ``width``, ``num_nodes``
            and ``draft_mode``.
    """


    def __init__(self, drafter, target, *, shape: str = "dynamic", choices=None, num_nodes: int = 8,
                 width: int | None = None, max_new_tokens: int, draft_mode: str = "top") -> None:
        if not all(hasattr(drafter, name) for name in ("vocab_size", "max_seq_len", "eval", "train")):
            unwrap_hint = (": pass drafter.model, the model it wraps" if callable(getattr(drafter, "propose", None))
                           and hasattr(drafter, "model") else "")
            raise TypeError(f"tree_speculative_generate drafts trees with a language model (ids (1, T) -> logits, "
                            f"with vocab_size and max_seq_len), got {type(drafter).__name__}{unwrap_hint}")
        self.num_nodes = check_whole(num_nodes,                  # NumPy ints pass, as Python ints
                                     f"num_nodes must be an int >= 1 (the draft nodes per target pass), got "
                                     f"{num_nodes!r}")
        if not isinstance(shape, str) or shape not in ("chain", "static", "dynamic"):   # a wrong type: TypeError
            raise (ValueError if isinstance(shape, str) else TypeError)(
                f"tree must be 'chain', 'static' or 'dynamic', got {shape!r}")
        if choices is not None and shape != "static":           # never ignored in silence
            raise ValueError(f"choices shape a static tree only (tree='static'); with tree={shape!r} they would be "
                             "ignored: drop them or pass tree='static'")
        if width is not None and shape != "dynamic":            # never ignored in silence, as choices
            raise ValueError(f"width shapes a dynamic tree only (tree='dynamic'); with tree={shape!r} it would be "
                             "ignored: drop it or pass tree='dynamic'")
        width = 4 if width is None else width
        if shape == "dynamic" and check_count(width, "width", minimum=None) < 1:
            raise ValueError(f"width must be an int >= 1 (children per expanded node), got {width}")
        if draft_mode not in ("top", "sample"):
            raise ValueError(f"draft_mode must be 'top' (the drafter's top ranks) or 'sample' (drawn from its q), "
                             f"got {draft_mode!r}")
        if shape == "chain":
            choices = chain_choices(self.num_nodes)
        elif shape == "static":
            choices = check_choices(choices, "tree_speculative_generate") if choices is not None \
                else static_choices(self.num_nodes)                               # read once: reused every pass
            if not choices:
                raise ValueError("choices is empty: a static tree needs at least one rank path, e.g. [(0,)]; "
                                 "leave choices out for static_choices(num_nodes)")
        self.model, self.target = drafter, target         # the engine puts self.model in eval mode
        self.vocab_size = drafter.vocab_size
        self.reads = ("tokens",)
        self.shape, self.choices, self.width = shape, None if shape == "dynamic" else choices, width
        self.max_new_tokens, self.draft_mode = max_new_tokens, draft_mode
        self.end, self.sampling = None, {}
        self.drafter_passes, self.expected_accepted = 0, 0.0
        self._last: DraftTree | None = None

    def start(self, prompt_ids: torch.Tensor, *, sampler, generator: torch.Generator | None) -> None:
        self._last = None
        self.end = prompt_ids.numel() + int(self.max_new_tokens)      # the engine has checked both
        # sampled drafting: the builders draw children from q and the tree carries q rows
        self.sampling = {"sample": True, "temperature": float(sampler.temperature), "generator": generator} \
            if self.draft_mode == "sample" and not sampler.greedy else {}

    def propose(self, context_ids: torch.Tensor, k: int):
        t = self.target
        room = draft_room(self.num_nodes, context_ids.numel() - t.start_pos, t.window)
        max_depth = min(self.end - context_ids.numel() - 1, room, self.model.max_seq_len - 1)
        if max_depth < 1:
            tree, passes = DraftTree.empty(), 0
        elif self.shape == "dynamic":
            tree, passes = build_dynamic_tree(self.model, context_ids, room, width=self.width, max_depth=max_depth,
                                              **self.sampling)
        else:
            tree, passes = build_static_tree(self.model, context_ids,
                                             [c for c in self.choices if len(c) <= max_depth], **self.sampling)
        tree = tree.fit(room, max_depth)
        self.drafter_passes += passes
        tree.measure = True
        self._last = tree
        return self._last

    def commit(self, context_ids: torch.Tensor, num_accepted: int, *, target_hidden=None) -> None:
        draft = self.target.last_draft                       # the window edge's plain step: no expectation
        if draft is self._last and draft.expected is not None:
            self.expected_accepted += draft.expected


@torch.no_grad()
def tree_speculative_generate(target, drafter, prompt_ids, max_new_tokens: int, *, tree: str = "dynamic",
                              num_nodes: int = 8, width: int | None = None,
                              choices: list[tuple[int, ...]] | None = None, temperature: float = 0.0,
                              generator: torch.Generator | None = None, eos_id: int | None = None,
                              on_pass: Callable[[list[int], int], None] | None = None,
                              use_cache: bool = False, target_cache=None, draft_mode: str = "top",
                              top_k: int | None = None, top_p: float | None = None,
                              repetition_penalty: float = 1.0, stop_ids=None, stop_strings=None, decode=None,
                              logprobs: bool = False) -> tuple[torch.Tensor, TreeStats]:
    """Speculative decoding with draft trees: build, verify in one target pass, commit. Provided.

    A preset of the engine (specdec-sampling's ``speculative_sample``, your loop): an
    ``LMTreeDrafter`` proposes a ``DraftTree`` each round, a ``RecomputeTarget`` (or, with
    ``use_cache``, the chain's ``CachedTarget``) scores root + tree in one pass, the draft's own walk
    verifies it (``greedy_tree_verify`` / ``tree_speculative_verify``, yours), and the round cuts,
    counts and commits as for a chain. Its outputs, counters and ``on_pass`` streams are its former
    loop's (tests/test_specdec_engine.py, pinned).

    Args:
        target, drafter: language models with the same ``vocab_size`` (ids (1, T) -> logits).
        prompt_ids: 1-D ints, length >= 1.
        max_new_tokens: budget >= 0, never exceeded.
        tree: ``"chain"`` (k = num_nodes drafts in a row), ``"static"`` (``choices``, default
            ``static_choices(num_nodes)``) or ``"dynamic"`` (``build_dynamic_tree`` with
            ``width``).
        width: the dynamic tree's children per expanded node (EAGLE-2's top-k), an int >= 1; None
            (default) means 4. Only ``tree="dynamic"`` reads it: with another tree it is refused,
            as ``choices`` are outside a static tree, never ignored in silence.
        num_nodes: the node budget n >= 1 per target pass.
        temperature: 0 for greedy verification (output = the target's greedy text); > 0 for
            sampled verification of the target's softmax(logits / temperature) (output
            distributed as plain sampling at that temperature). Drafts are the drafter's top
            ranks (deterministic proposals) in both cases, unless ``draft_mode="sample"``.
        generator: CPU ``torch.Generator`` for sampled verification.
        eos_id: stop after emitting it.
            None, or an id in [0, V) (``check_eos_id``: ValueError outside it, TypeError for a non-int).
        on_pass: ``on_pass(emitted, num_accepted)`` after each target pass, once its tokens are
            cut (the engine's rule: before the commits).
        use_cache: keep the target's state in module 16's ``KVCache`` across passes: each
            pass runs the root and the tree only (``CachedTarget``: module 16's trunk with the
            tree's positions and mask, as ``cached_tree_forward``), then ``commit_rows``
            gathers the accepted path into contiguous committed rows and drops the rest. Needs a
            ``TransformerLM`` target. Past the window the cache re-prefills its last
            ``max_seq_len // 2`` tokens where ``cached_generate`` does. The drafter still recomputes.
        target_cache: a ``KVCache.for_model(target)`` to use (implies ``use_cache``; it is
            reset, and after each pass holds every emitted token but the last).
        draft_mode: ``"top"`` (default: the drafter's top ranks) or ``"sample"``: at T > 0 each
            node's children are drawn without replacement from the drafter's softmax(logits / T)
            and verified with those rows (``build_static_tree(..., sample=True)``; the dynamic
            shape is still chosen from top ranks, then filled by sampling). At T = 0 "sample"
            drafts top ranks (greedy verification ignores q).
        top_k, top_p: module 11's warpers after the temperature (the engine's ``Sampler``): at
            T > 0 the output follows plain sampling with the same warpers. Ignored at T = 0.
        repetition_penalty, stop_ids, stop_strings, decode, logprobs: the engine's controls
            (``speculative_sample``): the penalty goes on every tree row with its own path, the
            stops cut where plain decoding stops, ``stats.logprobs`` gives each new token's raw
            log-probability under the target. Lossless as for a chain.

    Returns:
        (ids, stats): prompt + new tokens (CPU LongTensor), and a ``TreeStats``. Greedy
        (temperature 0), ids equals module 11's greedy ``generate`` token for token at any
        length, or with ``use_cache`` module 16's greedy ``cached_generate`` (equal to
        ``generate`` while prompt + output <= max_seq_len + 1).

    The window edge (``g2c.specdec.draft_room``, the rule every loop shares): a pass holds
    at most n' = min(num_nodes, max_seq_len - visible context) nodes (the first n' of the
    tree, parents before children), so context + tree fit the window and no row loses
    context; at n' = 0 the pass is a plain step (an empty tree: the target's own token from
    the last ``max_seq_len`` tokens, or from the cache's context after a re-prefill).

    Raises:
        ValueError: bad prompt, budget, temperature, node budget, tree kind, draft_mode, ``eos_id``
            outside the vocabulary, bad ``choices`` (``check_choices``), ``choices`` with a tree other than
            ``"static"`` ("choices shape a static tree only"), ``width`` with a tree other than
            ``"dynamic"`` ("width shapes a dynamic tree only"), ``width`` < 1, empty ``choices`` ("choices is empty"),
            or different vocab sizes.
        TypeError: a target that is not a language model (a name, a ``Target``: "pass its
            .model"); ``use_cache`` not a bool or with a target that is not a ``TransformerLM``;
            choices that are not rank paths of ints; a generator that is not a ``torch.Generator``.
    """
    state = tree_target(target, use_cache=use_cache, cache=target_cache)
    lm_trees = LMTreeDrafter(drafter, state, shape=tree, choices=choices, num_nodes=num_nodes, width=width,
                             max_new_tokens=max_new_tokens, draft_mode=draft_mode)      # checks its own arguments
    out, spec = speculative_sample(state, lm_trees, prompt_ids, max_new_tokens, k=num_nodes, temperature=temperature,
                                   top_k=top_k, top_p=top_p, generator=generator, eos_id=eos_id,
                                   on_pass=on_pass, repetition_penalty=repetition_penalty, stop_ids=stop_ids,
                                   stop_strings=stop_strings, decode=decode, logprobs=logprobs)
    stats = TreeStats(**{f.name: getattr(spec, f.name) for f in fields(SpecStats)})
    stats.logprobs = getattr(spec, "logprobs", None)
    stats.drafter_passes, stats.expected_accepted = lm_trees.drafter_passes, lm_trees.expected_accepted
    if isinstance(state, CachedTarget):
        stats.kv_bytes_moved, stats.kv_rows_dropped = state.kv_bytes_moved, state.kv_rows_dropped
    return out, stats


def tree_target(model, *, use_cache: bool = False, cache=None) -> Target:
    """The target an ``LMTreeDrafter`` run scores with: a ``RecomputeTarget``, or with ``use_cache``
    (or a ``cache``) a ``CachedTarget`` (the one cached target, for chains and trees). Provided.

    Raises:
        TypeError: ``model`` is a ``Target`` already ("pass its .model") or not a language model;
            ``use_cache`` not a bool; a cache asked of a model that is not a ``TransformerLM``.
    """
    if isinstance(model, Target):
        raise TypeError(f"tree_speculative_generate takes the target model and builds its own tree target; got a "
                        f"{type(model).__name__}: pass its .model")
    check_language_model(model, "target")
    if check_flag(use_cache, "use_cache") or cache is not None:
        return CachedTarget(model, cache=cache)           # checks the model is a TransformerLM, and the cache
    return RecomputeTarget(model)


def sampled_acceptance_probs(tree: DraftTree, target_probs: torch.Tensor) -> torch.Tensor:
    """a(v) = P(node v accepted | its parent accepted) under ``tree_speculative_verify``. Provided.

    The residuals of the multi-draft rule do not depend on the uniforms, so for the i-th child
    x_i of a node, tried against p_i with proposal row q_i (one-hot when the tree has none):
    a(x_i) = prod_{j < i} (1 - r_j) * r_i with r_j = min(1, p_j(x_j) / q_j(x_j)) (1 when
    q_j(x_j) = 0 < p_j(x_j)), p_1 = the parent's target row, p_{j+1} = normalize(max(0, p_j - q_j)).
    With one-hot rows it equals ``node_acceptance_probs``.

    Args:
        tree: a DraftTree (n nodes, with or without proposal_probs).
        target_probs: (n+1, V) float, row 0 at the root, row i+1 at node i.

    Returns:
        (n,) float32 CPU.
    """
    P = target_probs.detach().cpu().double()
    Q = None if tree.proposal_probs is None else tree.proposal_probs.detach().cpu().double()
    tokens = tree.tokens.tolist()
    kids: dict[int, list[int]] = {}
    for i, par in enumerate(tree.parents.tolist()):
        kids.setdefault(par, []).append(i)
    a = torch.zeros(tree.num_nodes, dtype=torch.float64)
    for par, children in kids.items():
        p, reach = P[par + 1].clone(), 1.0
        for c in children:
            x = tokens[c]
            q = torch.zeros_like(p) if Q is None else Q[c]
            if Q is None:
                q[x] = 1.0
            px, qx = float(p[x]), float(q[x])
            r = 1.0 if qx <= 0.0 < px else (min(1.0, px / qx) if qx > 0.0 else 0.0)
            a[c] = reach * r
            reach *= 1.0 - r
            residual = (p - q).clamp(min=0.0)
            if float(residual.sum()) > 0.0:
                p = residual / residual.sum()
    return a.float()


def expected_accepted(tree: DraftTree, target_probs: torch.Tensor) -> float:
    """sum_v prod_{u in path(v)} a(u): a from ``node_acceptance_probs`` for deterministic drafts,
    ``sampled_acceptance_probs`` for a tree with proposal rows (the expectation over the
    verification's uniforms, given the drawn tree). Provided."""
    if tree.num_nodes == 0:
        return 0.0
    if tree.proposal_probs is not None:
        return expected_tokens_per_pass(tree, sampled_acceptance_probs(tree, target_probs)) - 1.0
    return expected_tokens_per_pass(tree, node_acceptance_probs(tree, target_probs)) - 1.0
