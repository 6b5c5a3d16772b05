"""Tooling for the shipped assets: verified artifacts (models, tokenizer, corpus), corpus
preparation (``./datasets.sh``), install/repair (``./checkpoints.sh``) and the ladder's
training recipes. Not course material; course packages never import it.

    from g2c.assets import load_model
    model, tok = load_model("StoryLM-30M")
"""

from .artifacts import (
    ArtifactError,
    ArtifactMissingError,
    ChecksumError,
    load_model,
    load_story_tokenizer,
    load_tokenizer,
    verify_artifact,
)

__all__ = sorted(["ArtifactError", "ArtifactMissingError", "ChecksumError", "load_model", "load_story_tokenizer",
                  "load_tokenizer", "verify_artifact"])
