"""Beyond (specdec-lineage): one cached loop for every drafter that reads the target's states. Provided.

Medusa heads, the EAGLE drafters and the block drafter have one thing in common: they draft from
what the target computed for the committed positions (its final state, or the states of a few
of its layers), not from tokens alone. So the loop here does three things per round:

1. ask the drafter for a ``DraftTree`` (a chain is a tree whose node i has parent i - 1);
2. run the target ONCE over the root and the tree on module 16's ``KVCache`` with tree
   attention (``g2c.specdec.trees``), keeping the states of the layers the drafter reads;
3. verify (greedy walk, or recursive rejection sampling at T > 0), commit the accepted path's
   keys/values (``commit_tree_kv``) and hand the drafter the states of the positions that
   were just committed.

The drafter protocol of this module (``TreeDrafter``)
-----------------------------------------------------
``vocab_size: int``
    Must equal the target's.
``base``
    The target the drafter was built on (its heads read that model's states): the loop refuses
    any other target.
``target_layers: tuple[int, ...]``
    Block indices (0-based) whose OUTPUTS (the residual stream after block i, before the final
    LayerNorm) the drafter reads, besides the final state. ``()`` for Medusa and EAGLE-1.
``start(context_ids, states)``
    A (re)start: ``context_ids`` (T,) int64 CPU is the target's visible context; ``states``
    (T - 1, len(target_layers) + 1, D) float32 CPU holds, for every position but the newest,
    the chosen layers' outputs then (last) the final state. Called before the first round and
    after each re-prefill past the window.
``draft(context_ids, *, max_nodes, max_depth) -> DraftTree``
    At most ``max_nodes`` nodes, none deeper than ``max_depth`` (>= 1). Proposals are the
    drafter's top ranks, deterministic: at T > 0 the tree verifier then accepts node x with
    the target's p(x) and resamples from the residual (lossless for any deterministic proposal).
    With ``draft_mode="sample"`` and T > 0 they are drawn from the drafter's q without
    replacement among siblings, and the tree carries those rows (lossless too).
``set_sampling(temperature, generator)`` (optional)
    Called once before the first round with the loop's temperature and generator.
``commit(context_ids, states)``
    After each pass: ``context_ids`` is the whole new context (ending with the correction or
    bonus token), ``states`` (m, len(target_layers) + 1, D) the rows of the m positions committed
    by this pass except the newest token (the root, then each accepted node).

Sources: tree verification and one-pass tree attention (Miao et al., "SpecInfer", ASPLOS 2024,
section 4; Cai et al., "Medusa", ICML 2024, section 2.1.2); the cached commit of an accepted path is
``g2c.specdec.trees.commit_tree_kv``.

Shape letters: T time, n tree nodes, L chosen layers (+1 for the final state), D width, V vocabulary.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from g2c.kvcache import KVCache, forward_rows, unwrap
from g2c.kvcache.forward import unembed
from g2c.nn import synchronize
from g2c.sampling.generate import as_token_ids
from g2c.sampling.model import check_count, check_eos_id, check_generator, check_temperature

from ..generate import SpecStats, draft_room
from ..trees import DraftTree, commit_tree_kv, greedy_tree_verify, tree_attention_mask, tree_speculative_verify
from .medusa import typical_tree_verify
from .protocol import TreeDrafter, chain_tree, masked_block

__all__ = ["LineageStats", "TreeDrafter", "chain_tree", "lineage_generate", "masked_block", "target_layer_pass"]


@torch.no_grad()
def target_layer_pass(model, cache: KVCache, ids: torch.Tensor, positions: torch.Tensor,
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
    h, kept = forward_rows(model, ids.view(1, -1), cache, positions=positions, allowed=allowed,
                           keep_layers=tuple(layers))                                          # (1, T, D), (1, T, L, D)
    states = h[0].unsqueeze(1) if kept is None else torch.cat([kept[0], h[0].unsqueeze(1)], dim=1)  # (T, L+1, D)
    return unembed(model, h)[0].float(), states.float().cpu()


@dataclass
class LineageStats(SpecStats):
    """``SpecStats`` plus the clock. Provided.

    Attributes (besides target_passes, drafted, accepted, generated):
        draft_seconds: time inside the drafter (``start``, ``draft``, ``commit``), synchronised.
        target_seconds: time inside the target's passes (prefill included) and verification.
        rounds_with_draft: passes that verified a non-empty tree.

    ``cost_ratio`` = (draft_seconds / target_passes) / (target_seconds / target_passes): the c of
    the speed-up law tau / (1 + c) (``g2c.specdec.theory``), measured on this run.
    """

    draft_seconds: float = 0.0
    target_seconds: float = 0.0
    rounds_with_draft: int = 0

    @property
    def cost_ratio(self) -> float:
        return self.draft_seconds / self.target_seconds if self.target_seconds > 0 else 0.0


def _is_transformer_lm(model) -> bool:
    return all(hasattr(model, name) for name in ("blocks", "token_embed", "pos_embed", "ln_final", "max_seq_len"))


@torch.no_grad()
def lineage_generate(target, drafter: TreeDrafter, prompt_ids, max_new_tokens: int, *, num_nodes: int = 8,
                     temperature: float = 0.0, generator: torch.Generator | None = None, eos_id: int | None = None,
                     acceptance: str = "exact", epsilon: float = 0.09, delta: float = 0.3,
                     on_pass: Callable[[list[int], int], None] | None = None) -> tuple[torch.Tensor, LineageStats]:
    """Speculative decoding with a drafter that reads the target's states, on module 16's KV cache. Provided.

    Args:
        target: the ``TransformerLM`` the drafter was built on (``drafter.base``), eval mode.
        drafter: a ``TreeDrafter`` (Medusa, EAGLE/EAGLE-2, EAGLE-3, block drafter).
        prompt_ids: 1-D ints in [0, V), length >= 1 (CPU).
        max_new_tokens: budget >= 0, never exceeded.
        num_nodes: the most draft nodes per target pass (chain length or tree budget), >= 1.
        temperature: 0 = greedy verification (output = ``cached_generate``'s greedy text, token
            for token); > 0 = the tree verifier's recursive rejection sampling of the target's
            softmax(logits / T) (output distributed as plain sampling at T).
        generator: CPU ``torch.Generator`` for sampled verification.
        eos_id: stop after emitting it.
            None, or an id in [0, V) (``check_eos_id``: ValueError outside it, TypeError for a non-int).
        acceptance: ``"exact"`` (default, lossless) or ``"typical"``: at T > 0, Medusa's typical
            acceptance with ``epsilon``/``delta`` (``medusa.typical_tree_verify``). Typical
            acceptance is NOT lossless: the output no longer follows the target's distribution.
        on_pass: ``on_pass(emitted, num_accepted)`` after each pass.

    Returns:
        (ids, stats): prompt + new tokens (CPU int64), and ``LineageStats``.

    The window edge follows ``g2c.specdec.draft_room`` (the rule every loop shares): a pass holds
    at most min(num_nodes, max_seq_len - visible context) nodes; past the window the cache
    re-prefills its last ``max_seq_len // 2`` tokens (``cached_generate``'s policy) and the drafter
    is restarted on the new states.

    Raises:
        ValueError: bad prompt (empty, not 1-D, ids outside the vocabulary), budget, num_nodes,
            temperature, generator or acceptance; a drafter of another vocabulary; a drafter built on another
            model ("built on another model: verify with drafter.base as the target"); a chosen
            layer outside the target.
        TypeError: a target that is not a ``TransformerLM``; a drafter that is not a ``TreeDrafter``
            (a bare head, an ``LMDrafter``: "wrap a head in its drafter").
    """
    if not _is_transformer_lm(target):
        raise TypeError(f"lineage_generate needs a TransformerLM target (it reads the states of its layers), "
                        f"got {type(target).__name__}")
    ids = as_token_ids(prompt_ids, "prompt_ids", vocab_size=target.vocab_size)
    eos_id = check_eos_id(eos_id, target.vocab_size)                # None, or an id the loop can emit
    max_new_tokens = check_count(max_new_tokens, "max_new_tokens")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int) or num_nodes < 1:
        raise ValueError(f"num_nodes must be an int >= 1 (the draft nodes per target pass), got {num_nodes!r}")
    temperature = check_temperature(temperature)
    check_generator(generator)
    if acceptance not in ("exact", "typical"):
        raise ValueError(f"acceptance must be 'exact' or 'typical', got {acceptance!r}")
    if acceptance == "typical" and not (0.0 < epsilon <= 1.0 and delta > 0.0):
        raise ValueError(f"typical acceptance needs epsilon in (0, 1] and delta > 0, got epsilon={epsilon}, "
                         f"delta={delta}")
    if not all(hasattr(drafter, name) for name in ("start", "draft", "commit", "vocab_size", "target_layers")):
        raise TypeError(f"lineage_generate needs a TreeDrafter (start/draft/commit, target_layers), got "
                        f"{type(drafter).__name__}; wrap a head in its drafter: MedusaDrafter(heads), "
                        "EagleTreeDrafter(head), Eagle3Drafter(head), BlockDrafter(head)")
    if drafter.vocab_size != target.vocab_size:
        raise ValueError(f"drafter vocab_size {drafter.vocab_size} differs from target vocab_size {target.vocab_size}")
    if drafter.base is not None and unwrap(drafter.base) is not unwrap(target):
        raise ValueError(f"{type(drafter).__name__} was built on another model: its heads read the states of "
                         "drafter.base; verify with drafter.base as the target")
    layers = tuple(int(i) for i in drafter.target_layers)
    bad = [i for i in layers if not 0 <= i < len(target.blocks)]
    if bad:
        raise ValueError(f"the drafter reads layers {layers}, but the target has blocks 0..{len(target.blocks) - 1}")
    device = target.token_embed.weight.device
    head = drafter.head
    modes = (target.training, None if head is None else head.training)
    target.eval()
    if head is not None:
        head.eval()
    if hasattr(drafter, "set_sampling"):                   # sampled drafting (issue 29): q at the loop's T
        drafter.set_sampling(temperature, generator)
    cache = KVCache.for_model(target)
    window = target.max_seq_len
    stats = LineageStats()
    clock = time.perf_counter

    def refill(first: int) -> None:
        """Prefill ids[first:] but its last token; restart the drafter on those states."""
        ctx = ids[first:]
        cache.reset()
        t0 = clock()
        if ctx.numel() > 1:
            n = ctx.numel() - 1
            allowed = torch.ones(n, n, dtype=torch.bool).tril()
            _, states = target_layer_pass(target, cache, ctx[:-1], torch.arange(n), allowed, layers)
            cache.advance(n)
        else:
            states = torch.zeros(0, len(layers) + 1, target.embedding_dim)
        synchronize(device)
        t1 = clock()
        drafter.start(ctx, states)
        synchronize(device)
        stats.target_seconds += t1 - t0
        stats.draft_seconds += clock() - t1

    num_new = 0
    try:
        start = max(0, ids.numel() - window)
        refill(start)
        while num_new < max_new_tokens:
            remaining = max_new_tokens - num_new
            if ids.numel() - start > window:                                     # past the window: re-prefill
                start = ids.numel() - max(1, window // 2)
                refill(start)
            room = draft_room(num_nodes, ids.numel() - start, window)
            max_depth = min(remaining - 1, room)
            t0 = clock()
            tree = drafter.draft(ids[start:], max_nodes=room, max_depth=max_depth) if max_depth >= 1 \
                else DraftTree.empty()
            tree = DraftTree.check(tree, target.vocab_size, source=f"{type(drafter).__name__}.draft()")
            if tree.num_nodes:
                tree = tree.truncate(max_depth)
                tree = tree.subtree(list(range(min(room, tree.num_nodes))))
            synchronize(device)
            t1 = clock()
            n, length = tree.num_nodes, cache.length
            block = tree_attention_mask(1, tree.parents) == 0                           # (1+n, 1+n) bool
            allowed = torch.cat([torch.ones(1 + n, length, dtype=torch.bool), block], dim=1)
            positions = length + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths])
            root = torch.cat([ids[-1:], tree.tokens])
            logits, states = target_layer_pass(target, cache, root, positions, allowed, layers)
            logits = logits.cpu()
            if temperature == 0.0:
                path, token = greedy_tree_verify(tree, logits)
            elif acceptance == "typical":
                path, token = typical_tree_verify(tree, torch.softmax(logits / temperature, dim=-1), epsilon=epsilon,
                                                  delta=delta, generator=generator)
            else:
                path, token = tree_speculative_verify(tree, torch.softmax(logits / temperature, dim=-1),
                                                      generator=generator)
            emitted = ([int(tree.tokens[i]) for i in path] + [token])[:remaining]
            hit_eos = eos_id is not None and eos_id in emitted
            if hit_eos:
                emitted = emitted[:emitted.index(eos_id) + 1]
            num_accepted = min(len(path), len(emitted))
            kept = path[:len(emitted) - 1]
            commit_tree_kv(cache, cache.length + 1, kept)
            synchronize(device)
            t2 = clock()
            stats.record(drafted=n, accepted=num_accepted, generated=len(emitted))
            stats.rounds_with_draft += int(n > 0)
            ids = torch.cat([ids, torch.tensor(emitted, dtype=torch.long)])
            num_new += len(emitted)
            drafter.commit(ids[start:], states[[0] + [1 + i for i in kept]])
            synchronize(device)
            stats.draft_seconds += (t1 - t0) + (clock() - t2)
            stats.target_seconds += t2 - t1
            if on_pass is not None:
                on_pass(emitted, num_accepted)
            if hit_eos:
                break
    finally:
        target.train(modes[0])
        if head is not None:
            head.train(modes[1])
    return ids, stats
