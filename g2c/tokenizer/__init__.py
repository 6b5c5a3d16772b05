"""Module 04: byte-level BPE. The shipped StoryTokenizer is loaded by the artifact tooling:
``from g2c.assets import load_story_tokenizer``."""

from .bpe import EOT, BPETokenizer, bytes_to_unicode

__all__ = sorted(["EOT", "BPETokenizer", "bytes_to_unicode"])
