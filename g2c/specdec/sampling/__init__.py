"""Beyond (specdec-sampling): the sampled speculative loop, its drafters and dynamic k.

``speculative_sample`` runs draft -> verify -> commit with any ``Drafter`` (another LM, an
n-gram table, an MTP head, an EAGLE feature drafter), greedy or sampled, with a static or a
dynamic draft length (``controllers``), and with module 11's repetition penalty, stop ids, stop
strings and per-token logprobs (``controls``, each lossless). ``cached`` holds the greedy loop on
module 16's KV cache, where rollback is a pointer move (``speculative_generate_cached``,
``CachedScorer``).
"""

from .cached import CachedScorer, RoundRecord, mtp_generate_cached, speculative_generate_cached, summarize_rounds
from .controllers import CostModelK, HeuristicK, StaticK, expected_tokens_per_round, optimal_k, speedup
from .controls import ControlledTarget, StopRule
from .draft import Draft
from .drafters import Drafter, LMDrafter, NGramDrafter, Sampler, ngram_lookup
from .eagle import EagleDrafter, FeatureDrafter, MTPDrafter, eagle_loss
from .loop import CachedTarget, FullContextTarget, RecomputeTarget, speculative_sample, verify_round

__all__ = sorted(["CachedScorer", "CachedTarget", "ControlledTarget", "CostModelK", "Draft",
                  "Drafter", "EagleDrafter", "FeatureDrafter", "FullContextTarget", "HeuristicK", "LMDrafter",
                  "MTPDrafter", "NGramDrafter", "RecomputeTarget", "RoundRecord", "Sampler", "StaticK", "StopRule",
                  "eagle_loss",
                  "expected_tokens_per_round", "mtp_generate_cached", "ngram_lookup", "optimal_k",
                  "speculative_generate_cached", "speculative_sample", "speedup", "summarize_rounds",
                  "verify_round"])
