"""Beyond (specdec-trees): tree attention, one target pass over every branch of a draft tree.

A chain's k drafts are scored by a plain causal pass over context + draft. A tree cannot be
laid out as one sequence: two branches share a prefix and then diverge, and a node must not
see its cousins. So we flatten the n nodes after the C context tokens and change two things
(SpecInfer, Miao et al., ASPLOS 2024, sections 4.1-4.2, "topology-aware causal mask";
Medusa, Cai et al., ICML 2024, section 2.1.2, "tree attention"):

    * the mask: a node attends to every context token, to its ancestors and to itself,
      nothing else; context rows keep the causal mask;
    * the positions: node i gets position C + depth(i) - 1, the position it would have in a
      plain sequence holding its root-to-node path.

Then row C + i of the pass is exactly what a plain causal pass over context + path(i) gives
at its last row (tested to 1e-4 in float32).

``TransformerLM.forward`` has no mask argument, and the earlier modules stay as they are. But
module 16's one pass over the blocks, ``g2c.kvcache.forward_rows``, already takes positions
and a mask: a tree pass IS the cached pass with ``positions`` = the nodes' depths and
``allowed`` = the tree mask (the mask's False entries get zero weight). ``tree_forward`` runs
it over context + tree on a fresh cache (recomputing the whole context every pass).

With module 16's ``KVCache`` the context is not recomputed: ``cached_tree_forward`` runs the
root and the n nodes only, reading the committed cache rows plus the tree's own rows under
the tree mask (the same ``forward_rows``), and ``commit_tree_kv`` (module 16's ``commit_rows``)
then gathers the accepted path's rows into contiguous committed rows of the cache's buffers (a
copy; the bytes are returned) and drops the rest. A fast target (``g2c.kvcache.fast_model``)
runs both passes fused: its ``forward_rows`` takes the same mask.

Shape letters: C context length, n nodes, T = C + n, D width, H heads, d = D / H,
L layers, V vocabulary.
"""

from __future__ import annotations

import torch

from g2c.sampling.model import check_count, check_whole

from .tree import DraftTree

KV = tuple[torch.Tensor, torch.Tensor]                                      # one layer's (K, V)

__all__ = ["cached_tree_forward", "commit_tree_kv", "target_layer_pass", "tree_attention_mask", "tree_forward",
           "tree_logits", "tree_rows"]


def _check_parents(ctx_len: int, parents: torch.Tensor) -> torch.Tensor:
    """Validate (C, parents); return parents as a CPU LongTensor (n,). Provided."""
    ctx_len = check_whole(ctx_len, f"tree_attention_mask: ctx_len must be an int >= 1 (the root is the last context "
                                   f"token), got {ctx_len!r}")
    parents = torch.as_tensor(parents)
    if parents.dim() != 1 or parents.dtype.is_floating_point:
        raise ValueError(f"tree_attention_mask: parents must be a 1-D integer tensor (n,), got shape "
                         f"{tuple(parents.shape)} dtype {parents.dtype}")
    parents = parents.long().cpu()
    for i, p in enumerate(parents.tolist()):
        if not -1 <= p < i:
            raise ValueError(f"tree_attention_mask: node {i} has parent {p}; parents must be -1 (the root) or an "
                             "earlier node (flattened order: parents before children)")
    return parents


def tree_attention_mask(ctx_len: int, parents: torch.Tensor, *, device: str | torch.device = "cpu") -> torch.Tensor:
    """The additive attention mask of a context followed by a flattened draft tree.

    Args:
        ctx_len: C >= 1 context tokens (the last one is the tree's root).
        parents: (n,) int, ``parents[i]`` in [-1, i) (-1 = the root), as ``DraftTree.parents``.
        device: where to build the mask.

    Returns:
        (T, T) float32 with T = C + n: 0.0 where query row r may attend to key column c,
        ``-inf`` elsewhere. Rows/columns 0..C-1 are the context, C + i is node i.
        Context row r sees columns 0..r (causal). Node row C + i sees every context column,
        column C + j for every ancestor j of i, and itself.

    Raises:
        ValueError: ctx_len not an int >= 1, or parents not 1-D integers with
            ``-1 <= parents[i] < i`` (message: "parents must be -1 (the root) or an earlier node").

    Steps:
        1. Validate with ``_check_parents`` (provided; ``test_tree_attention_mask_rejects_bad_input``).
        2. Build an (n, n) boolean "ancestor-or-self" matrix in one sweep over the nodes:
           node i's row is its parent's row (nothing for the root) plus i itself. The
           flattened order guarantees the parent's row is finished first.
        3. Allowed (T, T) booleans: causal lower triangle over the context block; node rows
           see all C context columns and their ancestor-or-self node columns; context rows
           never see nodes (``test_tree_attention_mask_by_hand``).
        4. Turn it into 0.0 / -inf float32 on ``device``.
    """
    parents = _check_parents(ctx_len, parents)
    # BEGIN SOLUTION
    n = parents.numel()
    T = ctx_len + n
    anc = torch.zeros(n, n, dtype=torch.bool)                               # (n, n) ancestor-or-self
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            anc[i] = anc[p]
        anc[i, i] = True
    allowed = torch.zeros(T, T, dtype=torch.bool)                           # (T, T)
    allowed[:ctx_len, :ctx_len] = torch.ones(ctx_len, ctx_len, dtype=torch.bool).tril()
    allowed[ctx_len:, :ctx_len] = True
    allowed[ctx_len:, ctx_len:] = anc
    mask = torch.zeros(T, T, dtype=torch.float32)
    mask.masked_fill_(~allowed, float("-inf"))
    return mask.to(device)
    # END SOLUTION


@torch.no_grad()
def tree_forward(model, ctx_ids, tree: DraftTree | None = None, *,
                 return_kv: bool = False) -> torch.Tensor | tuple[torch.Tensor, list[KV]]:
    """One target pass over context + tree with the tree mask and tree positions. Provided.

    Args:
        model: a ``TransformerLM`` (module 09) in eval mode, or its ``g2c.kvcache.fast_model``:
            one call of module 16's ``forward_rows`` with the tree's positions and mask, on a
            fresh cache of C + n rows (dropout is skipped: inference only).
        ctx_ids: 1-D int tensor or list, C >= 1 tokens.
        tree: the draft tree (None or empty: a plain causal pass over the context).
        return_kv: also return every layer's keys and values.

    Returns:
        logits (T, V) float32 on the model's device, T = C + n: row C - 1 scores the token
        after the context (the root), row C + i the token after node i. With ``return_kv``,
        also a list of L pairs (K, V), each (H, T, d), the rows a KV cache would hold.

    Raises:
        ValueError: empty or non-1-D context, a bad tree (see ``tree_attention_mask``), or
            C + max depth > ``model.max_seq_len`` (crop the context).
    """
    from g2c.kvcache import KVCache, forward_rows, unembed
    from g2c.sampling.generate import as_token_ids

    ctx = as_token_ids(ctx_ids, "ctx_ids")
    tree = tree if tree is not None else DraftTree.empty()
    C, n = ctx.numel(), tree.num_nodes
    if C + tree.max_depth > model.max_seq_len:
        raise ValueError(f"tree_forward: context {C} + tree depth {tree.max_depth} exceeds max_seq_len="
                         f"{model.max_seq_len}; crop the context to its last "
                         f"{model.max_seq_len - tree.max_depth} tokens")
    weight = model.token_embed.weight
    ids = torch.cat([ctx, tree.tokens]).view(1, C + n)                     # (1, T)
    pos = torch.cat([torch.arange(C), C - 1 + tree.depths])                # (T,)
    allowed = tree_attention_mask(C, tree.parents, device=weight.device) == 0   # (T, T) bool
    # A fresh cache holding exactly the T rows (a tree may have more rows than positions).
    cache = KVCache(model.num_layers, 1, model.num_heads, model.embedding_dim // model.num_heads, C + n,
                    dtype=weight.dtype, device=weight.device)
    h, _ = forward_rows(model, ids, cache, positions=pos, allowed=allowed)  # (1, T, D)
    logits = unembed(model, h)[0].float()                                  # (T, V)
    if not return_kv:
        return logits
    return logits, [(k[0], v[0]) for k, v in zip(cache.keys_buffer, cache.values_buffer)]   # (H, T, d) each


@torch.no_grad()
def tree_logits(model, ctx_ids, tree: DraftTree) -> torch.Tensor:
    """The n + 1 verification rows of a tree: row 0 after the context, row i + 1 after node i. Provided.

    For a ``TransformerLM`` (anything with ``blocks`` and ``token_embed``) this is one
    ``tree_forward`` over the context cropped to its last ``max_seq_len - depth`` tokens. Any
    other model (the tests' table-lookup LMs) is scored path by path with plain causal
    passes, which is what the tree pass must reproduce.

    Returns:
        (n+1, V) float32 on the model's device.
    """
    from g2c.sampling.generate import as_token_ids

    ctx = as_token_ids(ctx_ids, "ctx_ids")
    ctx = ctx[-(model.max_seq_len - tree.max_depth):]
    C = ctx.numel()
    if hasattr(model, "blocks") and hasattr(model, "token_embed"):
        return tree_forward(model, ctx, tree)[C - 1:]                        # (n+1, V)
    rows = [model(ctx.unsqueeze(0).to(model.device))[0, -1]]
    for i in range(tree.num_nodes):
        path = torch.tensor(tree.path_tokens(i), dtype=torch.long)
        rows.append(model(torch.cat([ctx, path]).unsqueeze(0).to(model.device))[0, -1])
    return torch.stack(rows).float()


def commit_tree_kv(kv, ctx_len: int, path: list[int]) -> tuple[int, int]:
    """After verification, move the accepted path's K/V rows into contiguous committed rows. Provided.

    The tree lesson's name for module 16's ``commit_rows(kv, ctx_len, path)``, returning the
    committed length too.

    A chain's accepted drafts already sit right after the context, so committing is a
    pointer move. In a tree the accepted path (node indices ``path``, root side first) is
    scattered over the flattened rows: row C + path[j] must move to row C + j. We copy in
    place, in order j = 0, 1, ... (safe: path[j] >= j, so a source row is never overwritten
    before it is read); every row at or beyond C + len(path) is dropped (the committed
    length becomes C + len(path), and later appends overwrite the rest).

    On module 16's ``KVCache`` (pass the cache itself) the gather runs on its buffers
    (B, H, T_max, d) and the pointer moves to C + len(path): after ``cached_tree_forward``
    (which writes the root at row ``length`` and node i at ``length + 1 + i`` without
    advancing), ``commit_tree_kv(cache, cache.length + 1, path)`` commits the root and the
    accepted path.

    Args:
        kv: a ``KVCache``, or L pairs (K, V), each (..., T, d) with T >= C + n: the (H, T, d)
            rows of ``tree_forward(..., return_kv=True)`` or cache-shaped (B, H, T_max, d) buffers.
        ctx_len: C, rows before the tree (never touched); for a ``KVCache``,
            ``cache.length <= C``.
        path: accepted node indices, strictly increasing (a root-to-node path in flattened order).

    Returns:
        (committed_len, bytes_moved): C + len(path), and the bytes copied (0 when every
        accepted node already sits in its slot, e.g. a chain).

    Raises:
        TypeError: a path entry that is not an int (0.7 is never truncated to node 0).
        ValueError: path not strictly increasing, a row index beyond the tensors, or a
            ``KVCache`` whose length is past C (nothing to commit after it).
    """
    from g2c.kvcache import commit_rows

    path = [check_count(i, "commit_tree_kv: a path node", minimum=None) for i in path]   # a float is refused
    moved = commit_rows(kv, ctx_len, path)
    return ctx_len + len(path), moved


def tree_rows(tree: DraftTree, length: int, *, device: str | torch.device = "cpu"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """Where a tree's rows sit after ``length`` cached rows, and what they read. Provided.

    Returns:
        (positions (1 + n,) int64 on the CPU: the root at ``length``, node i at length + depth_i;
        allowed (1 + n, length + 1 + n) bool on ``device``: every row reads the cached rows, then
        the root and its own ancestors, itself included, from your ``tree_attention_mask``).

    Raises:
        TypeError: tree not a ``DraftTree``; length not an int.
        ValueError: length below 0.
    """
    if not isinstance(tree, DraftTree):
        raise TypeError(f"tree_rows: tree must be a DraftTree, got {type(tree).__name__}")
    length = check_count(length, "tree_rows: length")
    positions = length + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths])
    block = tree_attention_mask(1, tree.parents, device=device) == 0                       # (1+n, 1+n)
    cached = torch.ones(1 + tree.num_nodes, length, dtype=torch.bool, device=device)
    return positions, torch.cat([cached, block], dim=1)


@torch.no_grad()
def cached_tree_forward(model, cache, root_id: int, tree: DraftTree) -> torch.Tensor:
    """The tree pass on module 16's ``KVCache``: root + n nodes over the committed rows. Provided.

    The cache holds the context without its last token (``length`` = C - 1 rows); the
    root (that last token) and the n nodes are the 1 + n new rows: the root at position
    ``length``, node i at ``length + depth(i)``. The root reads every committed row and
    itself; node i every committed row, the root, and its ancestors and itself
    (``tree_attention_mask(1, parents)`` for the new block). Their keys/values are written
    at rows ``length .. length + n`` (``append``) but NOT committed: verify, then
    ``commit_tree_kv(cache, cache.length + 1, path)``.

    Args:
        model: a ``TransformerLM`` in eval mode.
        cache: a ``KVCache`` for this model with B = 1.
        root_id: the last context token.
        tree: the draft tree (may be empty).

    Returns:
        (n+1, V) float32 on the model's device: row 0 after the root, row i + 1 after node i
        (equal to ``tree_logits`` within float round-off).

    Raises:
        ValueError: B != 1, or ``length + 1 + n`` rows pass ``max_seq_len`` (the tree's rows
            do not fit the window: crop the context or shrink the tree).
    """
    from g2c.kvcache import forward_rows, unembed

    if cache.batch_size != 1:
        raise ValueError(f"cached_tree_forward: one sequence per tree, the cache has B={cache.batch_size}")
    L, n = cache.length, tree.num_nodes
    window = min(cache.max_seq_len, model.max_seq_len)
    if L + 1 + n > window:
        raise ValueError(f"cached_tree_forward: {L} cached rows + root + {n} tree rows exceed max_seq_len={window}; "
                         "crop the context or shrink the tree")
    ids = torch.cat([torch.tensor([int(root_id)]), tree.tokens]).view(1, 1 + n)             # (1, 1+n)
    positions, allowed = tree_rows(tree, L, device=cache.device)                            # (1+n,), (1+n, L+1+n)
    h, _ = forward_rows(model, ids, cache, positions=positions, allowed=allowed)            # (1, 1+n, D)
    return unembed(model, h)[0].float()                                                     # (n+1, V)


@torch.no_grad()
def target_layer_pass(model, cache, ids: torch.Tensor, positions: torch.Tensor,
                      allowed: torch.Tensor | None, layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target on T new rows over its cache, keeping chosen layers' outputs. Provided.

    One call of module 16's trunk, ``forward_rows(model, ids, cache, positions=positions,
    allowed=allowed, keep_layers=layers)`` (fused on a ``fast_model`` target), reshaped for the
    drafters.

    Args:
        model: a ``TransformerLM`` in eval mode, or its ``fast_model``.
        cache: its ``KVCache`` (B = 1); rows are written at ``length ..``, the pointer does not move.
        ids: (T,) int64 new tokens; positions: (T,) int64 their learned positions.
        allowed: bool (T, length + T): what each new row reads; None = causal (a chain).
        layers: block indices whose outputs to keep.

    Returns:
        (logits (T, V) float32 on the model's device, states (T, len(layers) + 1, D) float32 on
        the CPU: the chosen blocks' outputs in the order given, then the final (LayerNorm) state).

    Raises:
        ValueError: as ``forward_rows`` (bad positions or mask, a layer outside the model, rows
            past the window).
    """
    from g2c.kvcache import forward_rows, unembed

    h, kept = forward_rows(model, ids.view(1, -1), cache, positions=positions, allowed=allowed,
                           keep_layers=tuple(layers))                                          # (1, T, D), (1, T, L, D)
    states = h[0].unsqueeze(1) if kept is None else torch.cat([kept[0], h[0].unsqueeze(1)], dim=1)  # (T, L+1, D)
    return unembed(model, h)[0].float(), states.float().cpu()
