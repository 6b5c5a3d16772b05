"""Module 04: byte-level BPE and the course's StoryTokenizer."""

from .bpe import EOT, BPETokenizer, bytes_to_unicode
from .story import load_story_tokenizer

__all__ = sorted(["EOT", "BPETokenizer", "bytes_to_unicode", "load_story_tokenizer"])
