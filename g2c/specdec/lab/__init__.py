"""Beyond (specdec-lab): Be the Verifier, the round simulator, and batched speculation.

``simulate`` draws verification rounds from an acceptance rate and fits one back from
records (the calculator's formulas are ``g2c.specdec.theory``); ``batched`` runs greedy and
speculative decoding for several prompts at once on module 16's ragged cache (the serving lab).
"""

from .batched import BatchedResult, RaggedKV, batched_greedy, batched_speculative_generate
from .simulate import PassRecorder, Rounds, draw_rounds, fit_alpha, per_position_acceptance, simulate_rounds

__all__ = sorted(["BatchedResult", "PassRecorder", "RaggedKV", "Rounds", "batched_greedy",
                  "batched_speculative_generate", "draw_rounds", "fit_alpha", "per_position_acceptance",
                  "simulate_rounds"])
