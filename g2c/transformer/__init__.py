"""Module 09: the transformer block and ``TransformerLM``."""

from .block import MLP, Block
from .config import LADDER, StoryLMConfig
from .model import TransformerLM

__all__ = sorted(["LADDER", "MLP", "Block", "StoryLMConfig", "TransformerLM"])
