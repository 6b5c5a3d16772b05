"""Beyond: speculation under load and under a grammar (module specdec-serving).

- ``regex``: a small regex compiled to a token-level automaton (``TokenConstraint``). Provided.
- ``constrain``: structured output inside speculation (the exercise ``mask_verify_rows``).
- ``metrics``: acceptance as the serving engines report it, and the collapse alarm. Provided.
- ``controller``: k from load and acceptance (cost calibration, the decision rule). Provided.
- ``batched``: B rows through the engine's round, one target pass, per-row verify and commit. Provided.
"""

from .batched import batched_speculative_sample
from .constrain import (
    ConstrainedDrafter,
    ConstrainedTarget,
    constrained_generate,
    constrained_speculative_sample,
    mask_verify_rows,
)
from .controller import (
    LoadAwareK,
    PassCosts,
    StaticBatchK,
    best_k,
    break_even_batch,
    expected_tokens,
    measure_costs,
    measure_round_costs,
)
from .metrics import AcceptanceAlarm, AcceptanceCollapse, RoundLog, acceptance_metrics
from .regex import DEAD, DONE, ByteDFA, TokenConstraint, parse, token_bytes_of

__all__ = ["DEAD", "DONE", "AcceptanceAlarm", "AcceptanceCollapse", "ByteDFA", "ConstrainedDrafter",
           "ConstrainedTarget", "LoadAwareK", "PassCosts", "RoundLog", "StaticBatchK", "TokenConstraint",
           "acceptance_metrics", "batched_speculative_sample",
           "best_k", "break_even_batch", "constrained_generate", "constrained_speculative_sample",
           "expected_tokens", "mask_verify_rows", "measure_costs", "measure_round_costs", "parse", "token_bytes_of"]
