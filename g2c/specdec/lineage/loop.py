"""Beyond (specdec-lineage): every drafter that reads the target's states, through the one engine. Provided.

Medusa heads, the EAGLE drafters and the block drafter have one thing in common: they draft from
what the target computed for the committed positions (its final state, or the states of a few
of its layers), not from tokens alone. Their round is the engine's round, ``speculative_sample``
(specdec-sampling, your loop), with three pieces plugged in:

1. a drafter: a ``TreeDrafter`` is a drafter of the engine's one protocol (``start`` / ``propose`` /
   ``commit``, written once in its base class, ``protocol.py``), bound to its target; its ``propose``
   returns a ``g2c.specdec.trees.DraftTree`` (a subclass of ``Draft``: a chain is a tree whose node i has parent i - 1),
   which carries its tree attention and its acceptance walk (greedy walk, or recursive rejection
   sampling at T > 0, or Medusa's typical acceptance);
2. a target: the engine's ``CachedTarget`` (``g2c.specdec.sampling.target``, the one cached target
   for any ``Draft``) runs the target ONCE over the root and the tree on module 16's ``KVCache``
   (module 16's trunk ``forward_rows`` with the tree's positions and mask, keeping the states of the
   layers the drafter reads), and commits the accepted path's keys/values (``commit_rows``: a
   pointer move for a chain, a gather for a tree);
3. the hand-off: the drafter's ``commit`` reads the committed rows' states (root, then each accepted
   node) from the target it is bound to and passes them to its ``read_commit``.

``lineage_generate`` is that configuration with the checks of this module in front: a preset, no
round of its own (tests/tooling/test_layout.py). Its output, counters and ``on_pass`` stream are
the ones its former loop produced (tests/test_specdec_engine.py, pinned), on the teaching and the
fast path (``g2c.kvcache.fast_model`` target: the trunk runs fused).

What a state-reading drafter writes (``TreeDrafter``, the engine's protocol with its verbs filled in)
--------------------------------------------------------------------------------------------------
``vocab_size: int``
    Must equal the target's.
``base`` (optional, None or absent for a drafter built on no model)
    The target the drafter was built on (its heads read that model's states): the loop refuses
    any other target.
``head`` (optional)
    Its trainable module: put in eval mode for the run, its mode restored afterwards.
``target_layers: tuple[int, ...]``
    Block indices (0-based) whose OUTPUTS (the residual stream after block i, before the final
    LayerNorm) the drafter reads, besides the final state. ``()`` for Medusa and EAGLE-1. The
    declared capability ``reads`` is ``("layers", target_layers)``.
``read_prefill(context_ids, states)``
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
``read_commit(context_ids, states)``
    After each pass: ``context_ids`` is the whole new context (ending with the correction or
    bonus token), ``states`` (m, len(target_layers) + 1, D) the rows of the m positions committed
    by this pass except the newest token (the root, then each accepted node).

Sources: tree verification and one-pass tree attention (Miao et al., "SpecInfer", ASPLOS 2024,
section 4; Cai et al., "Medusa", ICML 2024, section 2.1.2); the cached commit of an accepted path is
``g2c.specdec.trees.commit_tree_kv``.

Shape letters: T time, n tree nodes, L chosen layers (+1 for the final state), D width, V vocabulary.
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass, field, fields

import torch

from g2c.kvcache import unwrap
from g2c.sampling.model import check_whole

from ..generate import SpecStats
from ..sampling.loop import speculative_sample
from ..sampling.target import CachedTarget
from ..trees import target_layer_pass
from .medusa import typical_tree_verify
from .protocol import TreeDrafter, chain_tree, masked_block

__all__ = ["LineageStats", "TreeDrafter", "bind_tree_drafter", "chain_tree", "lineage_generate", "masked_block",
           "target_layer_pass"]


@dataclass
class LineageStats(SpecStats):
    """``SpecStats`` plus the clock. Provided.

    Attributes (besides target_passes, drafted, accepted, generated):
        draft_seconds: time inside the drafter (``read_prefill``, ``draft``, ``read_commit``), synchronised.
        target_seconds: time inside the target's prefills, passes and commits (``CachedTarget``;
            the tree walk runs in the engine's round and is in neither clock).
        rounds_with_draft: passes that verified a non-empty tree.

    ``cost_ratio`` = (draft_seconds / target_passes) / (target_seconds / target_passes): the c of
    the speed-up law tau / (1 + c) (``g2c.specdec.theory``), measured on this run.
    """

    draft_seconds: float = field(default=0.0, repr=False)      # clocks vary run to run: out of the repr,
    target_seconds: float = field(default=0.0, repr=False)     # so a printed record is reproducible
    rounds_with_draft: int = 0
    logprobs: list[float] | None = field(default=None, repr=False)   # with logprobs=True

    @property
    def cost_ratio(self) -> float:
        return self.draft_seconds / self.target_seconds if self.target_seconds > 0 else 0.0


def _is_transformer_lm(model) -> bool:
    return all(hasattr(model, name) for name in ("blocks", "token_embed", "pos_embed", "ln_final", "max_seq_len"))


@torch.no_grad()
def lineage_generate(target, drafter: TreeDrafter, prompt_ids, max_new_tokens: int, *, num_nodes: int = 8,
                     temperature: float = 0.0, generator: torch.Generator | None = None, eos_id: int | None = None,
                     acceptance: str = "exact", epsilon: float = 0.09, delta: float = 0.3,
                     top_k: int | None = None, top_p: float | None = None,
                     on_pass: Callable[[list[int], int], None] | None = None, repetition_penalty: float = 1.0,
                     stop_ids=None, stop_strings=None, decode=None,
                     logprobs: bool = False) -> tuple[torch.Tensor, LineageStats]:
    """Speculative decoding with a drafter that reads the target's states, on module 16's KV cache. Provided.

    A preset of the engine: ``speculative_sample(CachedTarget(target, layers=...),
    drafter.bind(...), ...)`` (see the module docstring). ``on_pass`` is called,
    as everywhere in the engine, right after a round's tokens are cut, before the commits.

    Args:
        target: the ``TransformerLM`` the drafter was built on (``drafter.base``), eval mode, or
            its ``g2c.kvcache.fast_model`` (any dtype: bfloat16 is its own model, and the output is
            its own greedy text).
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
            At T = 0 both rules are greedy verification (typical acceptance's limit as T -> 0,
            Medusa section 2.3.1), so ``"typical"`` gives the exact greedy text there;
            ``epsilon``/``delta`` are read only by ``"typical"`` at T > 0.
        on_pass: ``on_pass(emitted, num_accepted)`` after each pass.
        top_k, top_p: module 11's warpers after the temperature (the engine's ``Sampler``): at
            T > 0 the output follows plain sampling with the same warpers (the tree walk verifies
            against the warped p; a sampled draft's q rows are the drafter's own, which keeps the
            rule exact). Ignored at T = 0.
        repetition_penalty, stop_ids, stop_strings, decode, logprobs: the engine's controls
            (``speculative_sample``): the penalty goes on every tree row with its own path, the
            stops cut where plain decoding stops, ``stats.logprobs`` gives each new token's raw
            log-probability under the target. Lossless as for a chain.

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
            (a bare head, an ``LMDrafter``: "wrap a head in its drafter"); a ``vocab_size`` that is not an
            int ("vocab_size must be an int"); ``target_layers`` that are not a tuple of ints
            ("target_layers must be a tuple").
    """
    target_state = bind_tree_drafter(target, drafter, num_nodes=num_nodes, max_new_tokens=max_new_tokens,
                                     acceptance=acceptance, epsilon=epsilon, delta=delta)   # checks the pair
    out, spec = speculative_sample(target_state, drafter, prompt_ids, max_new_tokens, k=num_nodes,   # modes: engine's
                                   temperature=temperature, top_k=top_k, top_p=top_p, generator=generator,
                                   eos_id=eos_id, on_pass=on_pass, repetition_penalty=repetition_penalty,
                                   stop_ids=stop_ids, stop_strings=stop_strings, decode=decode, logprobs=logprobs)
    stats = LineageStats(**{f.name: getattr(spec, f.name) for f in fields(SpecStats)})
    stats.draft_seconds, stats.target_seconds = drafter.draft_seconds, target_state.seconds
    stats.rounds_with_draft = drafter.rounds_with_draft
    stats.logprobs = getattr(spec, "logprobs", None)
    return out, stats


def bind_tree_drafter(target, drafter: TreeDrafter, *, num_nodes: int, max_new_tokens: int, acceptance: str = "exact",
                      epsilon: float = 0.09, delta: float = 0.3) -> CachedTarget:
    """``lineage_generate``'s pair: the drafter checked against its target, bound to a
    ``CachedTarget`` that keeps the layers it reads (``layers=``), with the acceptance rule. Provided.

    The engine checks the run's own arguments (prompt, budget, temperature, generator, EOS, vocabulary)
    once; this checks what only this pair has. Returns the target.

    Raises:
        as ``lineage_generate`` for the target, the drafter, ``num_nodes`` and the acceptance rule.
    """
    if not _is_transformer_lm(target):
        raise TypeError(f"lineage_generate needs a TransformerLM target (it reads the states of its layers), "
                        f"got {type(target).__name__}")
    num_nodes = check_whole(num_nodes,                              # NumPy ints pass, as Python ints
                            f"num_nodes must be an int >= 1 (the draft nodes per target pass), got {num_nodes!r}")
    if acceptance not in ("exact", "typical"):
        raise ValueError(f"acceptance must be 'exact' or 'typical', got {acceptance!r}")
    for knob, knob_name in ((epsilon, "epsilon"), (delta, "delta")):
        if isinstance(knob, bool) or not isinstance(knob, (int, float)):
            raise TypeError(f"{knob_name} must be a real number, got {type(knob).__name__} {knob!r}")
    if acceptance == "typical" and not (0.0 < epsilon <= 1.0 and delta > 0.0):
        raise ValueError(f"typical acceptance needs epsilon in (0, 1] and delta > 0, got epsilon={epsilon}, "
                         f"delta={delta}")
    if not isinstance(drafter, TreeDrafter):
        raise TypeError(f"lineage_generate needs a TreeDrafter (g2c.specdec.lineage.TreeDrafter: read_prefill/draft/"
                        f"read_commit, target_layers), got {type(drafter).__name__}; wrap a head in its drafter: "
                        "MedusaDrafter(heads), EagleTreeDrafter(head), Eagle3Drafter(head), BlockDrafter(head)")
    name = type(drafter).__name__
    vocab = drafter.vocab_size
    if isinstance(vocab, bool) or not isinstance(vocab, numbers.Integral):
        raise TypeError(f"{name}.vocab_size must be an int, the target's vocabulary ({target.vocab_size}), got "
                        f"{type(vocab).__name__} {vocab!r}: a TreeDrafter sets it (self.vocab_size = "
                        "head.base.vocab_size)")
    chosen = drafter.target_layers
    if not isinstance(chosen, (tuple, list)) or any(isinstance(i, bool) or not isinstance(i, numbers.Integral)
                                                    for i in chosen):
        raise TypeError(f"{name}.target_layers must be a tuple of block indices (ints), e.g. (2, 4, 6) or () for "
                        f"the final state only, got {type(chosen).__name__} {chosen!r}")
    base = getattr(drafter, "base", None)                   # optional: a drafter built on no model reads none
    if base is not None and unwrap(base) is not unwrap(target):
        raise ValueError(f"{name} was built on another model: its heads read the states of "
                         "drafter.base; verify with drafter.base as the target")
    layers = tuple(int(i) for i in chosen)
    bad = [i for i in layers if not 0 <= i < len(target.blocks)]
    if bad:
        raise ValueError(f"the drafter reads layers {layers}, but the target has blocks 0..{len(target.blocks) - 1}")
    rule = None
    if acceptance == "typical":
        def rule(tree, probs, gen):
            return typical_tree_verify(tree, probs, epsilon=epsilon, delta=delta, generator=gen)
    target_state = CachedTarget(target, layers=layers)
    drafter.bind(target_state, num_nodes=num_nodes, max_new_tokens=max_new_tokens, rule=rule)
    return target_state
