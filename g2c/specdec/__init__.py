"""Beyond: speculative decoding and multi-token prediction.

A cheap drafter proposes k tokens, the target scores them all in one pass, and
verification keeps the agreeing prefix plus one token of the target's own. Greedy
verification reproduces the target's greedy output exactly; stochastic verification
(``speculative_verify``) preserves its sampling distribution. ``MTPHead`` trains a drafter
inside a frozen target (``train_mtp_head``) and ``mtp_generate`` lets it draft for its own
base. Run ``python -m g2c.specdec "Once upon a time"`` to watch it work.
"""

from .generate import SpecStats, draft_greedy, draft_room, speculative_generate
from .mtp import MTPHead, hidden_states, mtp_generate, mtp_loss, mtp_metrics, mtp_propose, train_mtp_head
from .verify import greedy_verify, speculative_verify

__all__ = sorted(["MTPHead", "SpecStats", "draft_greedy", "draft_room", "greedy_verify", "hidden_states",
                  "mtp_generate", "mtp_loss", "mtp_metrics", "mtp_propose", "speculative_generate",
                  "speculative_verify", "train_mtp_head"])
