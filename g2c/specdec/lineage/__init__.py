"""Beyond (specdec-lineage): the lecture's draft lineage on one target.

``loop`` runs any drafter that reads the target's states through the engine (``speculative_sample``
with a ``CachedTarget`` keeping the layers it reads and the drafter bound to it: one cached tree pass per round);
``medusa`` holds Medusa's heads, candidate tree and typical acceptance (generation 2); ``eagle2``
the EAGLE drafter as chains and EAGLE-2 dynamic trees, ``eagle3`` the fused-layer drafter with
training-time test (generation 3); ``block`` a DFlash-style block drafter (one pass per draft).
"""

from .block import BlockDrafter, BlockHead, block_loss, block_loss_weights
from .eagle2 import EagleTreeDrafter, FeatureTreeDrafter
from .eagle3 import Eagle3Drafter, Eagle3Head, check_fusion_layers, eagle3_loss, fusion_layers, ttt_attention_mask
from .loop import LineageStats, lineage_generate, target_layer_pass
from .medusa import MedusaDrafter, MedusaHeads, medusa_loss, medusa_tree, typical_accept, typical_tree_verify
from .protocol import HeadOnBase, TreeDrafter, chain_tree, masked_block, masked_block_past

__all__ = sorted(["BlockDrafter", "BlockHead", "HeadOnBase",
                  "Eagle3Drafter", "Eagle3Head", "EagleTreeDrafter",
                  "FeatureTreeDrafter", "LineageStats", "MedusaDrafter", "MedusaHeads", "TreeDrafter",
                  "block_loss", "block_loss_weights", "chain_tree", "check_fusion_layers", "eagle3_loss",
                  "fusion_layers", "lineage_generate", "masked_block", "masked_block_past", "medusa_loss",
                  "medusa_tree", "target_layer_pass", "ttt_attention_mask", "typical_accept", "typical_tree_verify"])
