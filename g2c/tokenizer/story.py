"""Module 04: the shipped StoryTokenizer (byte-level BPE, vocab 4096, trained on TinyStories)."""

from __future__ import annotations

from .bpe import BPETokenizer

__all__ = ["load_story_tokenizer"]


def load_story_tokenizer() -> BPETokenizer:
    """Load ``artifacts/tokenizers/StoryTokenizer/tokenizer.json`` after checking its sha256.

    Raises:
        FileNotFoundError: the artifact is missing (run ``./checkpoints.sh``).
        ValueError: its checksum does not match the manifest (run ``./checkpoints.sh --force``).
    """
    from g2c.artifacts import load_tokenizer

    return load_tokenizer("StoryTokenizer")
