"""Beyond (specdec-trees): tree drafts and tree verification.

``tree`` holds the ``DraftTree`` (flattened nodes, parents before children) and the tree
formula for tau; ``builders`` fills a static or a dynamic shape with a drafter's tokens;
``attention`` scores every branch in one target pass (tree mask and positions, with or without
module 16's KV cache); ``verify`` walks the tree greedily or by recursive rejection sampling.
"""

from .attention import (
    cached_tree_forward,
    commit_tree_kv,
    target_layer_pass,
    tree_attention_mask,
    tree_forward,
    tree_logits,
    tree_rows,
)
from .builders import build_dynamic_tree, build_static_tree, sample_children, warp_probs
from .tree import DraftTree, chain_choices, chain_tree, expected_tokens_per_pass, node_acceptance_probs, static_choices
from .verify import (
    LMTreeDrafter,
    TreeStats,
    expected_accepted,
    greedy_tree_verify,
    sampled_acceptance_probs,
    tree_speculative_generate,
    tree_speculative_verify,
)

__all__ = sorted(["DraftTree", "LMTreeDrafter", "TreeStats",
                  "build_dynamic_tree", "build_static_tree", "cached_tree_forward", "chain_choices", "chain_tree",
                  "commit_tree_kv", "expected_accepted", "expected_tokens_per_pass", "greedy_tree_verify",
                  "node_acceptance_probs", "sample_children", "sampled_acceptance_probs", "static_choices",
                  "target_layer_pass", "tree_attention_mask", "tree_forward", "tree_logits", "tree_rows",
                  "tree_speculative_generate", "tree_speculative_verify", "warp_probs"])
