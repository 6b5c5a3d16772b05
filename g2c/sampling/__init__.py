"""Module 11: sampling — logit warpers, the ``generate`` loop, and the model protocol every
decoding loop shares (``LanguageModel``, ``eval_mode``)."""

from .generate import (
    as_token_ids,
    check_generation_args,
    generate,
    next_token_logits,
    sample_from_logits,
)
from .model import LanguageModel, check_language_model, check_token_ids, eval_mode
from .warpers import apply_repetition_penalty, apply_temperature, top_k_filter, top_p_filter

__all__ = sorted(["LanguageModel", "apply_repetition_penalty", "apply_temperature", "as_token_ids",
                  "check_generation_args", "check_language_model", "check_token_ids", "eval_mode", "generate",
                  "next_token_logits", "sample_from_logits", "top_k_filter", "top_p_filter"])
