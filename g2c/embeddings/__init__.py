"""Module 05: token embeddings and learned positions."""

from .embeddings import embed_tokens_and_positions

__all__ = ["embed_tokens_and_positions"]
