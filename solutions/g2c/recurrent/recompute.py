"""Beyond (specdec-state): the recompute strategy.

Never overwrite the checkpoint (the last committed state); on a partial accept, rerun the
model over the accepted tokens from it. No copies and no stored inputs, paid in a second
target pass per round that rejects. See ``transaction.py`` for the interface and
docs/beyond/specdec-state.md for the costs.

Shape letters: B batch, H heads, d head width, T block length.
"""

from __future__ import annotations

import torch

from .model import RecurrenceInputs, RecurrentLM
from .scan import gla_chunk
from .transaction import StateTransaction

__all__ = ["RecomputeTransaction"]


class RecomputeTransaction(StateTransaction):
    """Recompute: never overwrite the checkpoint; on a partial accept, rerun the accepted tokens.

    The checkpoint is the committed state. ``advance`` writes the state after the whole
    block into a scratch slot (out of place). A full accept swaps the scratch in; anything
    less reruns the model over the accepted positions from the checkpoint: a second (shorter)
    target pass, no stored inputs, no copies.
    """

    name = "recompute"

    def __init__(self, model: RecurrentLM, *, batch: int = 1) -> None:
        super().__init__(model, batch=batch)
        self.checkpoint = {i: self._zero_state() for i in model.recurrent_layers}
        self._scratch: dict[int, torch.Tensor] = {}

    def recurrent(self, layer: int, inp: RecurrenceInputs) -> torch.Tensor:
        o, self._scratch[layer] = gla_chunk(inp.q, inp.k, inp.v, inp.log_a, self.checkpoint[layer])
        T = inp.k.shape[2]
        self.costs.update_flops += self._update_flops(T)
        self.costs.readout_flops += self._readout_flops(T, T)
        return o

    @torch.no_grad()
    def _rerun(self, ids: torch.Tensor) -> None:
        """One model pass over ``ids`` (B, n) from the checkpoint; the new states land in the scratch slots
        and attention layers append their rows at the current K/V pointer (and move it). Provided."""
        self._run(ids)

    def commit(self, num_accepted: int) -> None:
        """Keep num_accepted + 1 positions.

        Steps:
            1. ``n = self._check_commit(num_accepted)`` (provided).
            2. Partial accept (n < block length): move the K/V pointers back to
               ``self._start`` and ``self._rerun`` the first n block tokens (it refills the
               scratch states and re-appends those K/V rows).
            3. The scratch states become the checkpoint (a swap of references).
            4. Pointers to ``self._start + n``; ``self._close(n)``.
        """
        n = self._check_commit(num_accepted)
        # BEGIN SOLUTION
        if n < self._block.shape[1]:
            self._truncate_kv(self._start)
            self._rerun(self._block[:, :n])
        self.checkpoint, self._scratch = dict(self._scratch), {}
        self._truncate_kv(self._start + n)
        self._close(n)
        # END SOLUTION

    def rollback(self) -> None:
        """Drop the block: forget the scratch states, pointers back to ``self._start``, close."""
        self._check_rollback()
        # BEGIN SOLUTION
        self._scratch = {}
        self._truncate_kv(self._start)
        self._close(0)
        # END SOLUTION

    def committed_state(self) -> dict[int, torch.Tensor]:
        if self._open:
            raise RuntimeError(f"{self.name}: committed_state() inside an open round; commit or roll back first")
        return {i: s.clone() for i, s in self.checkpoint.items()}
