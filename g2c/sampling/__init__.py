"""Module 11: sampling — logit warpers and the ``generate`` loop."""

from .generate import as_token_ids, generate, next_token_logits, sample_from_logits
from .warpers import apply_repetition_penalty, apply_temperature, top_k_filter, top_p_filter

__all__ = sorted(["apply_repetition_penalty", "apply_temperature", "as_token_ids", "generate", "next_token_logits",
                  "sample_from_logits", "top_k_filter", "top_p_filter"])
