"""Module 06: next-token prediction (cross-entropy, perplexity)."""

from .loss import cross_entropy, log_softmax, perplexity

__all__ = ["cross_entropy", "log_softmax", "perplexity"]
