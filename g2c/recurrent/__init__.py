"""Beyond (specdec-state): recurrent state under speculation.

A small gated linear-attention LM (pure recurrent or hybrid with the course's attention
blocks), and three ways to commit its state after a speculative round: snapshot,
checkpoint + input replay, recompute. Lesson: docs/beyond/specdec-state.md.
"""

from .generate import (
    FunctionDrafter,
    TransactionTarget,
    greedy_drafter,
    make_transaction,
    plain_greedy,
    speculative_generate_stateful,
)
from .model import (
    DecodeState,
    GatedLinearAttention,
    RecurrenceInputs,
    RecurrentBlock,
    RecurrentLM,
    fan_in_init_,
    new_kv_cache,
    perturbed_twin,
)
from .recompute import RecomputeTransaction
from .replay import ReplayTransaction
from .scan import gla_chunk, gla_fold, gla_recurrent, readout_flops, update_flops
from .snapshot import SnapshotTransaction
from .transaction import StateCosts, StateTransaction

__all__ = sorted([
    "DecodeState", "FunctionDrafter", "GatedLinearAttention", "RecomputeTransaction", "RecurrenceInputs",
    "RecurrentBlock", "RecurrentLM", "ReplayTransaction", "SnapshotTransaction", "StateCosts", "StateTransaction",
    "TransactionTarget", "new_kv_cache", "fan_in_init_", "gla_chunk", "gla_fold", "gla_recurrent", "greedy_drafter",
    "make_transaction", "perturbed_twin", "plain_greedy", "readout_flops", "speculative_generate_stateful",
    "update_flops",
])
