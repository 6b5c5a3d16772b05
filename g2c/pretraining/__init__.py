"""Modules 09b and 10: the pretraining objective and the trainer loop."""

from .objective import get_lm_batch, lm_cross_entropy, split_stream
from .trainer import TrainConfig, Trainer, no_decay_params, stream_loss

__all__ = sorted(["TrainConfig", "Trainer", "get_lm_batch", "lm_cross_entropy", "no_decay_params", "split_stream",
                  "stream_loss"])
